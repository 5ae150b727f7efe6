"""Outages of Redis or the broker, as the DLX service sees them: held unacked, retried after a
growing delay, the start and the end logged once however many retries and threads see it."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from celery_dlx.broker.errors import BROKER_ERRORS
from celery_dlx.outages import later
from celery_dlx.service.stats import ServiceStats
from celery_dlx.wiring.errors import STORE_ERRORS

logger = logging.getLogger(__name__)

#: Waits (seconds) between retries while Redis or the broker is unavailable; the last repeats.
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)

#: Seconds without a failure before a success ends an outage: a Redis at its ``maxmemory`` takes
#: a batch now and then (a refusal frees a little) and refuses the next; that is one outage.
QUIET = 10.0

#: Errors that mean "not now": the batch stays unacked and is retried.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (*STORE_ERRORS, *BROKER_ERRORS)


def _refusal(exc: BaseException) -> bool:
    """True for Redis refusing a write for memory (``OOM command not allowed ...``)."""
    return type(exc).__name__ == "OutOfMemoryError" or "maxmemory" in str(exc)


class Outage:
    """Logs the start and the end of an outage once, however many retries (and threads) see it."""

    def __init__(
        self,
        what: str,
        *,
        quiet: float = QUIET,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[float, Callable[[], None]], None] | None = later,
    ) -> None:
        self.what = what
        self.quiet = quiet
        self.clock = clock
        self.timer = timer
        self._looking = False
        self.since: float | None = None
        self.last_failure = 0.0
        self.failures = 0
        self.tries = 0
        self._lock = threading.Lock()

    def begin(self, exc: BaseException, held: int, stats: ServiceStats) -> float:
        """Note a failure; returns the seconds to wait before the next try."""
        with self._lock:
            first = self.since is None
            now = self.clock()
            if first:
                self.since = now
                self.failures = 0
            # Only a full Redis flaps (a refusal frees a little): a server that is down is back
            # at the first success.
            self.last_failure = now if _refusal(exc) else 0.0
            self.failures += 1
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
        """Note a success: the outage ends (one line) once nothing failed for ``quiet`` seconds;
        a batch slipping through mid-outage only resets the retry delay (and the outage is
        looked at again after the quiet time, so its end is logged though no batch follows)."""
        now = self.clock()
        with self._lock:
            since, failures = self.since, self.failures
            self.tries = 0
            if since is None:
                return
            wait = self.quiet - (now - self.last_failure)
            if wait > 0:
                look = self.timer is not None and not self._looking
                self._looking = self._looking or look
            else:
                self.since = None
        if wait > 0:
            if look and self.timer is not None:
                self.timer(wait + 0.1, self._look_again)
            return
        logger.warning(
            "DLX service: %s back after %.1fs (%d failed tries)", self.what, now - since, failures
        )

    def _look_again(self) -> None:
        with self._lock:
            self._looking = False
        self.end()
