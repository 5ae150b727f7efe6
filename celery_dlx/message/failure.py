"""The failure record: the facts of one failure, declared once.

A :class:`Failure` is what a worker, the DLX service, the drain or an operator's action knows about
one failed (or replayed, purged, drained...) message: which task or queue, which message and
attempt, the cause and exception, why, how much it matters, and when. Each origin builds one
:class:`Failure` and derives what it needs from it: the fate event
(:class:`celery_dlx.message.event.FateEvent`), the worker's cause record
(:class:`celery_dlx.message.cause.CauseRecord`), the DLX service's verdicts and the obituary
(:class:`celery_dlx.message.obituary.Obituary`). They carry it as ``failure`` and read its fields
through :class:`FailureFacts`, so ``event.cause`` or ``ob.traceback`` read as before.

A field left at its default is unknown (``attempt``, ``at_ms`` None; ``importance`` ""): each
holder says what an unknown field means for it (a fate event is stamped now, a cause record lets
the DLX service fill it in).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from celery_dlx.message.dictinit import dict_init


@dict_init
@dataclass(frozen=True)
class Failure:
    """The facts of one failure of one message.

    Attributes:
        task: the Celery task name; None for a foreign message.
        queue: the queue the message failed in.
        message_id: the message's stable id (``headers.message_identity``).
        attempt: failed runs, this one included; None when unknown.
        cause: the cause fingerprint (task or queue + exception type + normalized message).
        exc_type, exc_message, traceback: the failure, as far as it is known.
        reason: why this fate (burial reason, ``undecodable: ...``, x-death reason...).
        importance: page, notify or ignore ("" when unknown: the queue's).
        first_failure_ms: epoch ms of the message's first failure; None when unknown.
        at_ms: epoch ms of this failure or fate change (of a burial: its last failure); None when
            unknown.
        hostname: the host that decided the fate.
        code_version: ``dlx_code_version`` or the environment's, when known.
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
        """A copy with ``change`` (as :func:`dataclasses.replace`, without its cost: a burial's
        event and every assignment to a holder's field make one).

        Raises:
            TypeError: ``change`` names something that is not a field.
        """
        unknown = change.keys() - FAILURE_FIELDS
        if unknown:
            raise TypeError(f"Failure has no field {', '.join(sorted(unknown))}")
        copy = object.__new__(Failure)
        copy.__dict__.update(self.__dict__, **change)
        return copy


#: The names of a :class:`Failure`'s fields.
FAILURE_FIELDS = frozenset(f.name for f in fields(Failure))


def split_facts(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``values`` split into a :class:`Failure`'s fields and the others (the holder's own)."""
    facts = {k: v for k, v in values.items() if k in FAILURE_FIELDS}
    rest = {k: v for k, v in values.items() if k not in FAILURE_FIELDS}
    return facts, rest


class FailureFacts:
    """Read (and, on a mutable holder, replace) the fields of the ``failure`` a holder carries.

    The holder declares ``failure: Failure``; setting a field replaces the frozen failure with a
    copy (a frozen holder, being frozen, cannot be assigned to).
    """

    failure: Failure

    def _set(self, **change: Any) -> None:
        self.failure = self.failure.but(**change)

    @property
    def task(self) -> str | None:
        return self.failure.task

    @task.setter
    def task(self, value: str | None) -> None:
        self._set(task=value)

    @property
    def queue(self) -> str:
        return self.failure.queue

    @queue.setter
    def queue(self, value: str) -> None:
        self._set(queue=value)

    @property
    def message_id(self) -> str:
        return self.failure.message_id

    @message_id.setter
    def message_id(self, value: str) -> None:
        self._set(message_id=value)

    @property
    def cause(self) -> str:
        return self.failure.cause

    @cause.setter
    def cause(self, value: str) -> None:
        self._set(cause=value)

    @property
    def exc_type(self) -> str:
        return self.failure.exc_type

    @exc_type.setter
    def exc_type(self, value: str) -> None:
        self._set(exc_type=value)

    @property
    def exc_message(self) -> str:
        return self.failure.exc_message

    @exc_message.setter
    def exc_message(self, value: str) -> None:
        self._set(exc_message=value)

    @property
    def reason(self) -> str:
        return self.failure.reason

    @reason.setter
    def reason(self, value: str) -> None:
        self._set(reason=value)

    @property
    def importance(self) -> str:
        return self.failure.importance

    @importance.setter
    def importance(self, value: str) -> None:
        self._set(importance=value)

    @property
    def traceback(self) -> str:
        return self.failure.traceback

    @traceback.setter
    def traceback(self, value: str) -> None:
        self._set(traceback=value)

    @property
    def first_failure_ms(self) -> int | None:
        return self.failure.first_failure_ms

    @first_failure_ms.setter
    def first_failure_ms(self, value: int | None) -> None:
        self._set(first_failure_ms=value)

    @property
    def hostname(self) -> str | None:
        return self.failure.hostname

    @hostname.setter
    def hostname(self, value: str | None) -> None:
        self._set(hostname=value)

    @property
    def code_version(self) -> str | None:
        return self.failure.code_version

    @code_version.setter
    def code_version(self, value: str | None) -> None:
        self._set(code_version=value)


class KnownAttempt(FailureFacts):
    """:class:`FailureFacts` of a holder whose failure's ``attempt`` is always known (an int)."""

    @property
    def attempt(self) -> int:
        return self.failure.attempt or 0

    @attempt.setter
    def attempt(self, value: int) -> None:
        self._set(attempt=value)


class MaybeAttempt(FailureFacts):
    """:class:`FailureFacts` of a holder whose ``attempt`` and ``at_ms`` may be unknown (None)."""

    @property
    def attempt(self) -> int | None:
        return self.failure.attempt

    @property
    def at_ms(self) -> int | None:
        return self.failure.at_ms
