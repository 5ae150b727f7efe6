"""The fates a message can meet, the exceptions task code raises to choose one, and fate events."""

from __future__ import annotations

from celery_dlx.message.event import FateEvent as FateEvent
from celery_dlx.message.event import now_ms as now_ms

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
    """Retry the message later (uses the park budget, then buries). ``countdown``: seconds
    until the retry; None uses the task's backoff schedule."""

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
