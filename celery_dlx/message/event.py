"""Fate events: one fate change of one message, as logged, counted, recorded and sent to
integrations (the fate names live in :mod:`celery_dlx.fates`, which re-exports these)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from celery_dlx.message.failure import Failure, KnownAttempt


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (Redis scores and history use it)."""
    return int(time.time() * 1000)


@dataclass
class FateEvent(KnownAttempt):
    """One fate change of one message, with the :class:`~celery_dlx.message.failure.Failure` its
    origin built (an unknown ``at_ms`` is stamped now, an unknown ``attempt`` reads 0)."""

    fate: str
    failure: Failure
    delay: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.failure.at_ms is None or self.failure.attempt is None:
            self.failure = self.failure.but(
                at_ms=now_ms() if self.failure.at_ms is None else self.failure.at_ms,
                attempt=self.failure.attempt or 0,
            )

    @classmethod
    def of(
        cls,
        fate: str,
        failure: Failure,
        *,
        delay: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> FateEvent:
        """The fate change ``fate`` of the message that met ``failure``."""
        return cls(fate, failure, delay, {} if extra is None else extra)

    @classmethod
    def from_fields(
        cls,
        fate: str,
        *,
        delay: float | None = None,
        extra: dict[str, Any] | None = None,
        **facts: Any,
    ) -> FateEvent:
        """The event of ``fate`` with the :class:`Failure` fields ``facts`` (importance
        ``notify`` by default)."""
        return cls.of(fate, Failure(**{"importance": "notify", **facts}), delay=delay, extra=extra)

    @property
    def at_ms(self) -> int:
        return self.failure.at_ms or 0

    def as_dict(self) -> dict[str, object]:
        """The flat dict of the event (events, Sentry, logs): its own and its failure's fields."""
        own = asdict(self)
        merged = {**own.pop("failure"), **own}
        return {name: merged[name] for name in _EVENT_KEYS}


#: The keys of :meth:`FateEvent.as_dict`, in order.
_EVENT_KEYS = (
    "fate",
    "queue",
    "message_id",
    "attempt",
    "task",
    "cause",
    "exc_type",
    "exc_message",
    "reason",
    "delay",
    "importance",
    "traceback",
    "first_failure_ms",
    "at_ms",
    "extra",
)
