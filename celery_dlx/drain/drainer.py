"""The drainer: the drain running in every worker (and DLX service), one at a time per prefix.

Workers (:mod:`celery_dlx.worker.drainer`) and the standalone DLX service each run a
:class:`DrainerThread` that republishes due parked retries
(:func:`~celery_dlx.drain.core.run_drain`) every ``dlx_drain_interval`` seconds, and at once
again while full batches come: no beat, no task message, no log line per tick, whatever queues
the worker consumes.

Only the holder of the drain lease drains: a Redis key (``{prefix}:drain:lease``) holding its
token for :func:`lease_seconds`, renewed before every run. The others check it every interval
(one Redis call) and take it when it expires, so a process killed with ``-9`` is replaced within
one lease; one that stops cleanly hands it on at once. Two drainers overlapping for a moment (a
holder stalled past its lease) is safe: entries are claimed atomically under ``dlx_drain_lease``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from typing import TYPE_CHECKING

from celery_dlx.drain.core import BUDGET_SHARE, run_drain
from celery_dlx.wiring.errors import STORE_ERRORS
from celery_dlx.wiring.runtime import Runtime, get_runtime

if TYPE_CHECKING:
    from celery import Celery

logger = logging.getLogger(__name__)

#: Least seconds a drain lease lasts without renewal (the takeover time after a worker died).
MIN_LEASE = 10.0
#: Seconds a worker or DLX service waits at shutdown for the drain in hand to finish.
STOP_TIMEOUT = 30.0


def lease_seconds(interval: float) -> float:
    """How long the drain lease lasts: five drain intervals, at least :data:`MIN_LEASE`."""
    return max(MIN_LEASE, 5.0 * interval)


class Drainer:
    """The drain loop of one process: drains while it holds the lease, else waits for it.

    It gets a runtime of its own (its own Redis client and confirming publisher, so it never
    shares a channel with the tasks of a thread pool), with the app's fate listeners.
    """

    def __init__(self, app: Celery, *, name: str | None = None) -> None:
        shared = get_runtime(app)
        self.runtime = Runtime(app, shared.config)
        self.runtime.listeners = shared.listeners
        self.interval = float(shared.config.drain_interval)
        token = f"{name or socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.lease = self.runtime.drain_lease(lease_seconds(self.interval), token)
        self.held = False
        self._stop = threading.Event()
        self._redis_failing = False

    def run(self) -> None:
        """Drain until :meth:`stop`; returns after giving the lease up."""
        try:
            while not self._stop.is_set():
                if self.step():
                    continue  # a full batch: more is due now
                self._stop.wait(self.interval)
        finally:
            self._give_up()
            self.runtime.reset_publisher()

    def step(self) -> bool:
        """One turn: renew or take the lease, drain if held. True when a full batch was drained
        (the caller goes on at once)."""
        try:
            held = self.lease.acquire()
        except STORE_ERRORS as exc:
            if not self._redis_failing:
                logger.warning("drainer cannot reach Redis (dlx_redis_url) for its lease: %s", exc)
            self._redis_failing = True
            self.held = False
            return False
        if self._redis_failing:
            logger.warning("drainer reaches Redis again")
            self._redis_failing = False
        if held != self.held:
            logger.debug("drainer %s the drain lease", "took" if held else "lost")
            self.held = held
        if not held:
            return False
        result = run_drain(self.runtime, budget_seconds=BUDGET_SHARE * self.interval)
        return not result.failed and result.claimed >= self.runtime.config.drain_batch

    def stop(self) -> None:
        self._stop.set()

    def _give_up(self) -> None:
        if not self.held:
            return
        with contextlib.suppress(*STORE_ERRORS):  # else it expires by itself
            self.lease.release()
        self.held = False


class DrainerThread(threading.Thread):
    """A :class:`Drainer` in a daemon thread, started and stopped by its owner: the worker's
    :class:`DrainerStep` or the standalone DLX service. ``name``: the process's name in the lease
    token (default: the host name)."""

    def __init__(self, app: Celery, *, name: str | None = None) -> None:
        super().__init__(name="celery_dlx-drainer", daemon=True)
        self.drainer = Drainer(app, name=name)

    def stop(self, timeout: float = STOP_TIMEOUT) -> bool:
        """Stop after the drain in hand (the lease is released); True once the thread ended."""
        self.drainer.stop()
        self.join(timeout)
        if self.is_alive():
            logger.warning("the drainer did not stop within %ss", timeout)
            return False
        return True

    def run(self) -> None:
        try:
            self.drainer.run()
        except Exception:  # its owner keeps running; the failure must be visible
            logger.exception("the drainer thread stopped on an error")
