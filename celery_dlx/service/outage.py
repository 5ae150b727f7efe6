"""Outages of Redis or the broker, as the DLX service sees them: retried, logged once.

A dead letter the service cannot handle for now stays unacked and is retried after a growing
delay; the start and the end of the outage are each logged once, however many retries and
settling threads see it.
"""

from __future__ import annotations

import logging
import threading
import time

from celery_dlx.broker.errors import BROKER_ERRORS
from celery_dlx.service.stats import ServiceStats
from celery_dlx.store.errors import STORE_ERRORS

logger = logging.getLogger(__name__)

#: Waits (seconds) between retries while Redis or the broker is unavailable; the last repeats.
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)

#: Errors that mean "not now": the batch stays unacked and is retried.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (*STORE_ERRORS, *BROKER_ERRORS)


class Outage:
    """Logs the start and the end of an outage once, however many retries (and threads) see it."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.since: float | None = None
        self.tries = 0
        self._lock = threading.Lock()

    def begin(self, exc: BaseException, held: int, stats: ServiceStats) -> float:
        """Note a failure; returns the seconds to wait before the next try."""
        with self._lock:
            first = self.since is None
            if first:
                self.since = time.monotonic()
            delay = RETRY_DELAYS[min(self.tries, len(RETRY_DELAYS) - 1)]
            self.tries += 1
        stats.add(retries=1, outages=1 if first else 0)
        if first:
            logger.warning(
                "DLX service: %s unavailable (%s: %s); holding %d dead letter(s) unacked until it "
                "returns",
                self.what,
                type(exc).__name__,
                exc,
                held,
                exc_info=not isinstance(exc, TRANSIENT_ERRORS),
            )
        return delay

    def end(self) -> None:
        with self._lock:
            since, self.since, self.tries = self.since, None, 0
        if since is not None:
            logger.warning("DLX service: %s back after %.1fs", self.what, time.monotonic() - since)
