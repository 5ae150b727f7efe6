"""One log line per outage and cause, with counts, instead of one per failed write (a storm
against a full Redis buried the worker's log under megabytes of the same WARNING).

An :class:`OutageLog` logs an outage's first failure at once, then at most one line per
:data:`WINDOW` seconds and cause, and one line with the total when writes succeed again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

#: Seconds between two summary lines of one ongoing outage.
WINDOW = 60.0
#: Seconds without a failure before a success ends an outage: a Redis at its ``maxmemory`` takes
#: a write now and then (a refusal frees a little) and refuses the next; that is one outage.
QUIET = 10.0
#: Longest cause text kept in a line.
CAUSE_LIMIT = 200


def cause_of(exc: BaseException) -> str:
    """The cause an outage is keyed by: the exception's type and its message's first line."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    name = type(exc).__name__
    return f"{name}: {text}"[:CAUSE_LIMIT] if text else name


def later(delay: float, call: Callable[[], None]) -> None:
    """Call ``call`` in ``delay`` seconds on a daemon timer thread."""
    timer = threading.Timer(delay, call)
    timer.daemon = True
    timer.start()


@dataclass
class _Cause:
    count: int = 0
    total: int = 0
    reported_at: float = 0.0


class OutageLog:
    """Rate-limited WARNINGs for one kind of write (``what``, a plural noun phrase: "parks")
    failing for one or more causes; thread-safe, one per process and kind of write.

    ``timer`` runs a callable after a delay: a success inside the quiet time looks again once it
    is over, so the end is logged though no write follows (None: no second look).
    """

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        window: float = WINDOW,
        quiet: float = QUIET,
        clock: Callable[[], float] = time.monotonic,
        timer: Callable[[float, Callable[[], None]], None] | None = later,
    ) -> None:
        self.logger = logger
        self.timer = timer
        self._looking = False
        self.what = what
        self.window = window
        self.quiet = quiet
        self.clock = clock
        self.since: float | None = None
        self.last_failure = 0.0
        self._causes: dict[str, _Cause] = {}
        self._lock = threading.Lock()

    @property
    def failing(self) -> bool:
        """True between the first failure of an outage and the next success."""
        return self.since is not None

    def total(self) -> int:
        """Failures counted in the current outage, all causes."""
        with self._lock:
            return sum(c.total for c in self._causes.values())

    def failed(self, exc: BaseException, consequence: str = "") -> None:
        """Count one failure; log the first of its cause at once, later ones once per window.
        ``consequence`` says what was done instead ("buried by publishing")."""
        cause = cause_of(exc)
        now = self.clock()
        with self._lock:
            if self.since is None:
                self.since = now
            self.last_failure = now
            entry = self._causes.get(cause)
            first = entry is None
            if entry is None:  # logged at once: counted from the next
                entry = self._causes[cause] = _Cause(reported_at=now)
            else:
                entry.count += 1
            entry.total += 1
            due = not first and now - entry.reported_at >= self.window
            if due:
                count, entry.count, entry.reported_at = entry.count, 0, now
        tail = f"; {consequence}" if consequence else ""
        if first:
            self.logger.warning(
                "celery_dlx: %s failing (%s)%s; further failures are counted and logged once "
                "per %.0f s until it succeeds again",
                self.what,
                cause,
                tail,
                self.window,
            )
        elif due:
            self.logger.warning(
                "celery_dlx: %s failed %s times in the last %.0f s (%s)%s",
                self.what,
                f"{count:,}",
                self.window,
                cause,
                tail,
            )

    def succeeded(self) -> None:
        """End the outage if nothing failed for ``quiet`` seconds (one line with how long and how
        many failures); inside the quiet time, look again once it is over."""
        if self.since is None:  # the common case, without the lock
            return
        now = self.clock()
        with self._lock:
            since = self.since
            wait = self.quiet - (now - self.last_failure)
            if since is None:
                return
            if wait > 0:
                look = self.timer is not None and not self._looking
                self._looking = self._looking or look
            else:
                self.since = None
                causes, self._causes = self._causes, {}
        if wait > 0:
            if look and self.timer is not None:
                self.timer(wait + 0.1, self._look_again)
            return
        total = sum(c.total for c in causes.values())
        self.logger.warning(
            "celery_dlx: %s succeeding again after %.1f s (%s failures: %s)",
            self.what,
            now - since,
            f"{total:,}",
            "; ".join(f"{c.total:,} x {name}" for name, c in causes.items()),
        )

    def _look_again(self) -> None:
        with self._lock:
            self._looking = False
        self.succeeded()


def outage_log(owner: object, attr: str, logger: logging.Logger, what: str) -> OutageLog:
    """The :class:`OutageLog` kept on ``owner`` (an app, a runtime) under ``attr``; made once."""
    found = owner.__dict__.get(attr)
    if isinstance(found, OutageLog):
        return found
    made = OutageLog(logger, what)
    return owner.__dict__.setdefault(attr, made)  # type: ignore[no-any-return]
