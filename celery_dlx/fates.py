"""The fates a message can meet, the exceptions task code raises to choose one, and fate events."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from celery_dlx.message.failure import Failure, KnownAttempt

#: The message was handled (acked).
DONE = "done"
#: A copy went to the tail of the same queue.
REQUEUED = "requeued"
#: The message waits in the parking store until its due time.
PARKED = "parked"
#: The drain republished a due parked message to its queue.
DRAINED = "drained"
#: The message went to the graveyard with an obituary.
BURIED = "buried"
#: An obituary's message was put back on its queue.
REPLAYED = "replayed"
#: An obituary was deleted from the graveyard.
PURGED = "purged"
#: A message that had failed before succeeded.
RECOVERED = "recovered"
#: An obituary past the graveyard's retention left the graveyard; the history keeps it whole.
ARCHIVED = "archived"

#: Every fate change celery_dlx records in the failure history.
FATE_CHANGES = (REQUEUED, PARKED, DRAINED, BURIED, REPLAYED, PURGED, RECOVERED, ARCHIVED)
#: An operator's action in the web console (who replayed or purged what): a history entry that is
#: not the fate of one message.
AUDIT = "audit"
#: Every kind of failure-history entry (what the Spark exporter accepts).
HISTORY_KINDS = (*FATE_CHANGES, AUDIT)


class FateRequest(Exception):
    """Base of the exceptions task code raises to choose a fate explicitly."""


class Requeue(FateRequest):
    """Put the message at the tail of its queue (uses the requeue budget, then escalates)."""


class Park(FateRequest):
    """Retry the message later (uses the park budget, then buries).

    Args:
        countdown: seconds until the retry; None uses the task's backoff schedule.
    """

    def __init__(self, countdown: float | str | None = None, message: str = "") -> None:
        if isinstance(countdown, str):
            # Rebuilt from its message alone (a result backend stores an exception's args).
            message = message or countdown
            countdown = None
        if countdown is not None and countdown < 0:
            raise ValueError(f"Park(countdown=...) must be >= 0, got {countdown}")
        super().__init__(message or (f"park for {countdown}s" if countdown is not None else "park"))
        self.countdown = countdown

    #: False for a park whose budget is checked elsewhere (``self.retry()``: Celery's max_retries).
    budgeted = True

    def __reduce__(self) -> tuple[type[Park], tuple[object, ...]]:
        # Exception pickles its args (the message) only; the worker's main process unpickles it.
        return (type(self), (self.countdown, str(self)))


class Bury(FateRequest):
    """Send the message to the graveyard now, with ``reason`` as its cause."""

    def __init__(self, reason: str = "buried by task") -> None:
        super().__init__(reason)
        self.reason = reason

    def __reduce__(self) -> tuple[type[Bury], tuple[str]]:
        return (type(self), (self.reason,))


def now_ms() -> int:
    """Wall-clock time in epoch milliseconds (Redis scores and history use it)."""
    return int(time.time() * 1000)


@dataclass
class FateEvent(KnownAttempt):
    """One fate change of one message, as logged, counted, recorded and sent to integrations.

    It carries the :class:`~celery_dlx.message.failure.Failure` its origin built, read as
    ``event.cause``, ``event.attempt``...; an unknown ``at_ms`` is stamped now, an unknown
    ``attempt`` reads 0. Build one with :meth:`of` (or :meth:`from_fields`).
    """

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
        """The event of ``fate`` with the :class:`Failure` fields ``facts`` (``importance``
        defaults to ``notify``, as a fate event's always has)."""
        return cls.of(fate, Failure(**{"importance": "notify", **facts}), delay=delay, extra=extra)

    @property
    def at_ms(self) -> int:
        return self.failure.at_ms or 0

    @at_ms.setter
    def at_ms(self, value: int) -> None:
        self._set(at_ms=value)

    def as_dict(self) -> dict[str, object]:
        """The flat dict of the event (events, Sentry, logs): its own and its failure's fields."""
        own = asdict(self)
        merged = {**own.pop("failure"), **own}
        return {name: merged[name] for name in _EVENT_KEYS}


#: The keys of :meth:`FateEvent.as_dict`, in their order (the flat form the event always had).
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
