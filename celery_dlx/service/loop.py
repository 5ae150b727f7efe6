"""The DLX service's consume loop: dead letters of any origin in batches, settled, then acked.

Runs standalone (``celery -A proj dlx service``) or inside a worker (``dlx_service_in_worker``),
on its own broker connections. Batches from ``dlx_service_queue`` go to settling threads
(:class:`~celery_dlx.service.settle.BatchSettler`) and are acked only once settled, so a kill -9
at any point loses nothing. Nothing is rejected from the service queue (it has no dead-letter
exchange): what cannot be handled for now (Redis or the broker down) stays unacked and is
retried, with one log line per outage.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from celery import Celery

from celery_dlx.broker.consume import Delivery, QueueConsumer, ack_all
from celery_dlx.broker.errors import BROKER_ERRORS
from celery_dlx.broker.management import management_for, other_services
from celery_dlx.broker.topology import overflow_queue, service_queue
from celery_dlx.docs_url import doc_url
from celery_dlx.message.names import service_consumer_tag
from celery_dlx.service.outage import RETRY_DELAYS, TRANSIENT_ERRORS, Outage
from celery_dlx.service.settle import BatchSettler
from celery_dlx.service.stats import ServiceStats
from celery_dlx.wiring.errors import STORE_ERRORS
from celery_dlx.wiring.retention import sweep_retention
from celery_dlx.wiring.runtime import Runtime

logger = logging.getLogger(__name__)

#: Seconds one wait for dead letters lasts before the idle work (heartbeats, retention sweep).
IDLE_POLL = 1.0
#: Seconds to wait for more dead letters once one arrived, to handle them as one batch.
BATCH_WAIT = 0.005
#: Most dead letters handled as one batch (at most a third of the prefetch, so that while two
#: batches settle, the next one is being received).
BATCH_LIMIT = 500
#: Batches settled at once (threads; the broker connection stays on the receiving thread).
SETTLERS = 2
#: Seconds between retention sweeps of the graveyard.
SWEEP_INTERVAL = 60.0


class DLXService(BatchSettler):
    """The DLX service of one app; ``prefetch`` defaults to ``dlx_service_prefetch``, the rest
    as for :class:`~celery_dlx.service.settle.BatchSettler`."""

    def __init__(
        self,
        app: Celery,
        *,
        prefetch: int | None = None,
        hostname: str | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        super().__init__(app, hostname=hostname, runtime=runtime)
        self.prefetch = prefetch or int(self.config.service_prefetch)
        self.batch_limit = max(1, min(BATCH_LIMIT, self.prefetch // (SETTLERS + 1)))
        self._stop = threading.Event()
        self._settle_outage = Outage("Redis (dlx_redis_url) or the broker (broker_url)")
        self._inbox: list[Delivery] = []
        self._last_sweep = 0.0
        self._sweep_failing = False
        self._idle_since = time.monotonic()

    def stop(self) -> None:
        """Ask the service to stop after the batch in hand (acked first). Thread-safe."""
        self._stop.set()

    def run(self, *, idle_timeout: float | None = None) -> ServiceStats:
        """Consume dead letters until :meth:`stop` (or ``idle_timeout`` seconds without any);
        broker connection losses are retried forever (one log line per outage).

        Raises:
            TopologyError: the service queue exists with other arguments.
        """
        outage = Outage("broker")
        self._idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    self._consume(idle_timeout, outage)
                except BROKER_ERRORS as exc:
                    self._wait(outage.begin(exc, len(self._inbox), self.stats))
                finally:
                    self._inbox.clear()
        finally:
            self._close_publisher(every=True)
        return self.stats

    def _consume(self, idle_timeout: float | None, outage: Outage) -> None:
        config = self.config
        queue = service_queue(config.service_queue, config.exchange, quorum=config.quorum)
        mismatch = (
            f"the DLX service queue {config.service_queue!r} exists with other arguments "
            "(dlx_service_queue, dlx_quorum)"
        )
        overflow = overflow_queue(config.service_queue, quorum=config.quorum)

        def declare(channel: Any) -> Any:
            overflow(channel).declare()  # where a cause past its cap waits (see settle)
            return queue(channel).declare()

        with QueueConsumer(
            self.app,
            config.service_queue,
            declare,
            self.prefetch,
            self._inbox,
            mismatch=mismatch,
            tag=service_consumer_tag(config.key_prefix, socket.gethostname(), os.getpid()),
        ) as consumer:
            outage.end()
            logger.info(
                "DLX service consuming %s (prefetch %d)", config.service_queue, self.prefetch
            )
            self._warn_shared_exchange()
            self._loop(consumer, idle_timeout)

    def _warn_shared_exchange(self) -> None:
        """Log an ERROR when a DLX service of another app (another key prefix) consumes a queue
        bound to this app's dead-letter exchange: both then park and bury every dead letter.
        Best effort, over the management API (without it, ``dlx check`` says the same)."""
        config = self.config
        try:
            conn = self.app.connection_for_write()
            try:
                api = management_for(conn)
            finally:
                conn.release()
            others = other_services(api, config.exchange, config.service_queue, config.key_prefix)
        except Exception:  # no management API: nothing to say
            logger.debug("could not look for other apps' DLX services", exc_info=True)
            return
        for queue, prefix in others.items():
            logger.error(
                "the DLX service of another app (dlx_key_prefix %r) consumes %r, bound to this "
                "app's dead-letter exchange %r too: both services park and bury every dead "
                "letter, each in its own Redis, and each failure runs past its budget. Give "
                "each app its own dlx_exchange and dlx_service_queue (unset, they derive from "
                "dlx_key_prefix); see %s",
                prefix,
                queue,
                config.exchange,
                doc_url("configuration", "names-on-the-broker-and-in-redis"),
            )

    def _loop(self, consumer: QueueConsumer, idle_timeout: float | None) -> None:
        """Receive and ack on this thread (the connection is not thread-safe) while helper
        threads settle the batches in hand (mostly Redis and publisher I/O: two at once, one
        waiting for Redis while the other runs). Batches are acked in arrival order, each with
        one ``basic.ack(multiple)``, only once every earlier batch is acked."""
        pending: deque[tuple[list[Delivery], Future[bool]]] = deque()
        # True once a wait for more dead letters came back empty: the inbox is all there is for
        # now. A backlog arrives one delivery per drain, so handing the inbox to a free settler at
        # once would settle it a few messages at a time; it waits for a full batch or a pause.
        quiet = False
        with ThreadPoolExecutor(SETTLERS, thread_name_prefix="celery_dlx-settle") as helpers:
            while True:
                while pending and (pending[0][1].done() or self._stop.is_set()):
                    batch, settled = pending.popleft()
                    if not settled.result():  # at a stop, the batches in hand finish first
                        return  # stopped mid-outage: this and later batches stay unacked
                    ack_all(batch)
                    self._idle_since = time.monotonic()
                    self._maybe_sweep()
                if self._stop.is_set():
                    return
                while (
                    len(pending) < SETTLERS
                    and self._inbox
                    and (quiet or len(self._inbox) >= self.batch_limit)
                ):
                    batch = self._inbox[: self.batch_limit]
                    del self._inbox[: self.batch_limit]
                    pending.append((batch, helpers.submit(self._process, batch)))
                busy = bool(pending) or bool(self._inbox)
                quiet = not consumer.wait(BATCH_WAIT if busy else IDLE_POLL)
                if quiet and not busy and self._idle(idle_timeout):
                    return

    def _idle(self, idle_timeout: float | None) -> bool:
        """Idle work; True when the service has been idle for ``idle_timeout`` (and stops)."""
        self._maybe_sweep()
        if idle_timeout is not None and time.monotonic() - self._idle_since > idle_timeout:
            logger.info("DLX service idle for %ss: stopping", idle_timeout)
            self.stop()
            return True
        return False

    def _process(self, batch: list[Delivery]) -> bool:
        """Settle ``batch``, retrying while Redis or the publisher is down; True once settled
        (it may be acked), False if the service stopped first."""
        outage = self._settle_outage
        while True:
            try:
                self.settle(batch)
            except Exception as exc:  # Redis or broker down, or a bug: hold the batch, retry
                if isinstance(exc, BROKER_ERRORS):
                    self._close_publisher()
                delay = outage.begin(exc, len(batch), self.stats)
                if not isinstance(exc, TRANSIENT_ERRORS):
                    delay = max(delay, RETRY_DELAYS[-1])
                if not self._wait(delay):
                    return False  # stopping: the unacked batch goes back to the queue
                continue
            outage.end()
            return True

    def _wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; False if the service is stopping."""
        return not self._stop.wait(seconds)

    def _maybe_sweep(self) -> None:
        """Run the graveyard's retention sweep if it is due (every ``SWEEP_INTERVAL``)."""
        if time.monotonic() - self._last_sweep < SWEEP_INTERVAL:
            return
        self._last_sweep = time.monotonic()
        try:
            self.stats.add(archived=sweep_retention(self.runtime))
        except STORE_ERRORS as exc:
            if not self._sweep_failing:  # once per outage, not once a minute
                logger.warning(
                    "DLX service: graveyard retention sweep failed (%s); retried every %ds",
                    exc,
                    int(SWEEP_INTERVAL),
                )
            self._sweep_failing = True
        else:
            self._sweep_failing = False
