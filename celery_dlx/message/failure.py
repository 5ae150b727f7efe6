"""The facts of one failure, declared once: fate events, cause records, verdicts and obituaries
carry a :class:`Failure` as ``failure`` and read its fields through :class:`FailureFacts`
(``event.cause``). A field at its default is unknown; each holder says what that means for it."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Generic, TypeVar

from celery_dlx.message.dictinit import dict_init

T = TypeVar("T")


@dict_init
@dataclass(frozen=True)
class Failure:
    """The facts of one failure of one message.

    ``task`` is None for a foreign message; ``message_id`` is ``headers.message_identity``;
    ``attempt`` counts failed runs, this one included; ``cause`` is the fingerprint; ``reason``
    why this fate; ``importance`` page, notify or ignore ("": the queue's); ``at_ms`` the time of
    this failure or fate change (of a burial: its last failure); ``hostname`` who decided it.
    """

    task: str | None = None
    queue: str = ""
    message_id: str = ""
    attempt: int | None = None
    cause: str = ""
    exc_type: str = ""
    exc_message: str = ""
    reason: str = ""
    importance: str = ""
    traceback: str = ""
    first_failure_ms: int | None = None
    at_ms: int | None = None
    hostname: str | None = None
    code_version: str | None = None

    def but(self, **change: Any) -> Failure:
        """A copy with ``change``.

        Raises:
            TypeError: ``change`` names something that is not a field.
        """
        unknown = change.keys() - FAILURE_FIELDS
        if unknown:
            raise TypeError(f"Failure has no field {', '.join(sorted(unknown))}")
        return replace(self, **change)


FAILURE_FIELDS = frozenset(f.name for f in fields(Failure))


class _Fact(Generic[T]):
    """A field of the holder's ``failure``; setting it replaces the failure with a copy."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, holder: FailureFacts | None, owner: type | None = None) -> T:
        if holder is None:
            return self  # type: ignore[return-value]
        return getattr(holder.failure, self.name)  # type: ignore[no-any-return]

    def __set__(self, holder: FailureFacts, value: T) -> None:
        holder.failure = holder.failure.but(**{self.name: value})


class FailureFacts:
    """Read (and, on a mutable holder, replace) the fields of the ``failure`` a holder carries."""

    failure: Failure

    def _set(self, **change: Any) -> None:
        self.failure = self.failure.but(**change)

    task: _Fact[str | None] = _Fact()
    queue: _Fact[str] = _Fact()
    message_id: _Fact[str] = _Fact()
    cause: _Fact[str] = _Fact()
    exc_type: _Fact[str] = _Fact()
    exc_message: _Fact[str] = _Fact()
    reason: _Fact[str] = _Fact()
    importance: _Fact[str] = _Fact()
    traceback: _Fact[str] = _Fact()
    first_failure_ms: _Fact[int | None] = _Fact()
    hostname: _Fact[str | None] = _Fact()
    code_version: _Fact[str | None] = _Fact()


class KnownAttempt(FailureFacts):
    """:class:`FailureFacts` of a holder whose failure's ``attempt`` is always known (an int)."""

    @property
    def attempt(self) -> int:
        return self.failure.attempt or 0


class MaybeAttempt(FailureFacts):
    """:class:`FailureFacts` of a holder whose ``attempt`` and ``at_ms`` may be unknown (None)."""

    @property
    def attempt(self) -> int | None:
        return self.failure.attempt

    @property
    def at_ms(self) -> int | None:
        return self.failure.at_ms
