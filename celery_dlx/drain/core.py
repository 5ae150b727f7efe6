"""The drain: republishes due parked retries to the queue that failed.

The drainer bootstep (:mod:`celery_dlx.worker.drainer`) runs it in the workers every
``dlx_drain_interval`` seconds, under a Redis lease; the same code is a Celery task
(:func:`register_drain_task`) for tools and an opt-in beat entry (:func:`beat_entry`). It claims
due entries from the :class:`~celery_dlx.store.parking.ParkingStore` (atomically, under a lease
of ``dlx_drain_lease``), publishes them through the default exchange (routing key = queue name,
so a retry never goes through a fanout exchange to the failed queue's siblings) with pipelined
publisher confirms, and deletes each entry only after its confirm. A publish the broker nacked or
returned (its queue is gone) is released back to the store; an entry whose drain died is claimed
again once its lease runs out. Several drains may run at once: the lease makes them claim
disjoint entries, so a duplicate can only follow a lease expiry, and nothing is ever lost.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from celery import Celery

from celery_dlx import faults
from celery_dlx.broker.errors import BROKER_ERRORS
from celery_dlx.fates import DRAINED, FateEvent
from celery_dlx.fates import now_ms as wall_ms
from celery_dlx.message.failure import Failure
from celery_dlx.message.names import FIRST_FAILURE_HEADER
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.config import DLXConfig
from celery_dlx.wiring.errors import STORE_ERRORS
from celery_dlx.wiring.runtime import Runtime, get_runtime

if TYPE_CHECKING:
    from celery import Task

logger = logging.getLogger(__name__)

#: Name of the drain task beat schedules.
DRAIN_TASK_NAME = "celery_dlx.worker.drain"

#: Seconds an entry whose publish was nacked or returned waits before the next try: soon enough
#: for a queue that is being redeclared, slow enough not to spin on a queue that is gone.
RELEASE_DELAY = 5.0

#: Share of ``dlx_drain_interval`` one drain run may spend, so a run ends before the next tick.
BUDGET_SHARE = 0.8


@dataclass
class DrainResult:
    """What one or more drain cycles did."""

    #: entries claimed from the store
    claimed: int = 0
    #: entries the broker confirmed (and that were then deleted, unless ``stale``)
    published: int = 0
    #: entries the broker nacked or returned, made due again in ``RELEASE_DELAY``
    released: int = 0
    #: per published entry, publish time minus due time, in milliseconds
    lateness_ms: list[int] = field(default_factory=list)
    #: confirmed entries another drain had claimed again after our lease ran out (published twice)
    stale: int = 0
    #: a cycle stopped on a broker or Redis error (already logged once)
    failed: bool = False
    #: drain cycles that claimed at least one entry
    batches: int = 0

    def add(self, other: DrainResult) -> None:
        """Fold ``other`` into this result."""
        self.claimed += other.claimed
        self.published += other.published
        self.released += other.released
        self.lateness_ms.extend(other.lateness_ms)
        self.stale += other.stale
        self.failed = self.failed or other.failed
        self.batches += other.batches


def drained_event(runtime: Runtime, message: ParkedMessage, published_ms: int) -> FateEvent:
    """The ``drained`` fate event of a republished retry, its lateness in ``extra``."""
    first = message.headers.get(FIRST_FAILURE_HEADER)
    failure = Failure(
        task=message.task,
        queue=message.queue,
        message_id=message.message_id,
        attempt=message.attempt,
        cause=message.cause,
        importance=runtime.config.importance(message.queue),
        first_failure_ms=first if isinstance(first, int) and not isinstance(first, bool) else None,
        at_ms=published_ms,
    )
    return FateEvent.of(DRAINED, failure, extra={"lateness_ms": published_ms - message.due_ms})


@dataclass
class _Published:
    """One batch after its publish: what the broker confirmed and what it refused."""

    sent: list[ParkedMessage]
    refused: list[ParkedMessage]
    published_ms: int

    def result(self, claimed: int) -> DrainResult:
        return DrainResult(
            claimed=claimed,
            published=len(self.sent),
            released=len(self.refused),
            lateness_ms=[self.published_ms - m.due_ms for m in self.sent],
            batches=1,
        )


def drain_once(runtime: Runtime, *, now_ms: int | None = None) -> DrainResult:
    """Claim up to ``dlx_drain_batch`` due entries, publish them with confirms, delete the
    confirmed ones, release the refused ones and record the drained fates.

    Broker and Redis errors do not propagate: each is logged as one warning, the publisher is
    reset after a broker error, and the claimed entries come back when their lease runs out.
    ``now_ms``: the claim time (default: now); an entry is due when its due time is at or before.
    """
    claimed = _claim(runtime, now_ms)
    if claimed is None:
        return DrainResult(failed=True)
    if not claimed:
        return DrainResult()
    published = _publish(runtime, claimed)
    if published is None:
        return DrainResult(claimed=len(claimed), failed=True, batches=1)
    result = published.result(len(claimed))
    result.stale, result.failed = _settle(runtime, published)
    _record(runtime, published)
    return result


def run_drain(runtime: Runtime, *, budget_seconds: float) -> DrainResult:
    """Drain in cycles while full batches keep coming and ``budget_seconds`` lasts.

    A backlog drains at full speed instead of one batch per tick: after a full first batch, the
    next batch is claimed (and the previous one deleted) in a helper thread while the current one
    is published, so Redis and the broker work in parallel. The budget keeps one run shorter than
    the beat interval. Stops at the first cycle that failed (already logged).
    """
    deadline = time.monotonic() + budget_seconds
    total = drain_once(runtime)
    batch = runtime.config.drain_batch
    if total.failed or total.claimed < batch or time.monotonic() >= deadline:
        return total
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="celery_dlx-drain") as io:
        _pipelined(runtime, io, deadline, total)
    return total


def _pipelined(runtime: Runtime, io: Executor, deadline: float, total: DrainResult) -> None:
    batch = runtime.config.drain_batch
    settles: list[Future[tuple[int, bool]]] = []
    claiming: Future[list[ParkedMessage] | None] | None = io.submit(_claim, runtime, None)
    while claiming is not None:
        claimed = claiming.result()
        claiming = None
        if claimed is None:
            total.failed = True
            break
        if len(claimed) >= batch and time.monotonic() < deadline:
            claiming = io.submit(_claim, runtime, None)
        if not claimed:
            break
        published = _publish(runtime, claimed)
        if published is None:
            total.add(DrainResult(claimed=len(claimed), failed=True, batches=1))
            break
        settles.append(io.submit(_settle, runtime, published))
        _record(runtime, published)
        total.add(published.result(len(claimed)))
    if claiming is not None:
        _give_back(runtime, claiming.result())
    for settle in settles:
        stale, failed = settle.result()
        total.stale += stale
        total.failed = total.failed or failed


def _give_back(runtime: Runtime, claimed: list[ParkedMessage] | None) -> None:
    """Release a batch claimed ahead that a failure kept from being published: nothing of it
    reached the broker, so it may be due again now rather than at the end of its lease."""
    if not claimed:
        return
    try:
        runtime.parking.release(claimed)
    except STORE_ERRORS as exc:
        logger.warning("drain could not release %d unpublished retries: %s", len(claimed), exc)


def _claim(runtime: Runtime, now_ms: int | None) -> list[ParkedMessage] | None:
    """Claim a batch, or None after a Redis error (logged)."""
    config = runtime.config
    try:
        claimed = runtime.parking.claim(
            config.drain_batch, int(config.drain_lease * 1000), now=now_ms
        )
    except STORE_ERRORS as exc:
        # One line per outage, not one per beat tick.
        if not runtime.drain_failing:
            logger.warning(
                "drain could not claim parked retries from Redis (dlx_redis_url): %s", exc
            )
        runtime.drain_failing = True
        return None
    if runtime.drain_failing:
        logger.warning("drain reaches Redis again")
        runtime.drain_failing = False
    return claimed


def _publish(runtime: Runtime, claimed: list[ParkedMessage]) -> _Published | None:
    """Publish a claimed batch with confirms, or None after a broker error (logged)."""
    # The fate changes when the copies leave, not when their confirms come back: by then a
    # worker may already be running a retry.
    published_ms = wall_ms()
    faults.point("drain.claimed")
    try:
        flags = runtime.publisher.publish_many([m.outgoing() for m in claimed])
    except BROKER_ERRORS as exc:
        runtime.reset_publisher()
        logger.warning(
            "drain lost the broker while publishing %d parked retries (%s: %s); they are "
            "claimed again when their lease (dlx_drain_lease=%ss) runs out",
            len(claimed),
            type(exc).__name__,
            exc,
            runtime.config.drain_lease,
        )
        return None
    faults.point("drain.published")
    sent = [m for m, ok in zip(claimed, flags, strict=True) if ok]
    refused = [m for m, ok in zip(claimed, flags, strict=True) if not ok]
    return _Published(sent, refused, published_ms)


def _settle(runtime: Runtime, published: _Published) -> tuple[int, bool]:
    """Delete confirmed entries and release refused ones; how many confirmed entries another
    drain had claimed again (stale), and whether Redis failed (the unsettled entries come back
    after their lease: duplicates, never a loss)."""
    store = runtime.parking
    sent, refused = published.sent, published.refused
    stale, failed = 0, False
    try:
        if sent:
            stale = len(sent) - store.ack(sent)
        if refused:
            store.release(refused, due_ms=published.published_ms + int(RELEASE_DELAY * 1000))
    except STORE_ERRORS as exc:
        logger.warning(
            "drain could not settle %d parked retries in Redis (dlx_redis_url): %s", len(sent), exc
        )
        failed = True
    if stale:
        logger.warning(
            "%d parked retries were claimed again by another drain before their confirm "
            "(dlx_drain_lease=%ss too short?): they are published twice",
            stale,
            runtime.config.drain_lease,
        )
    if refused:
        queues = sorted({m.queue for m in refused})
        named = ", ".join(queues[:5]) + (f" and {len(queues) - 5} more" if len(queues) > 5 else "")
        logger.warning(
            "broker refused %d parked retries for %s (nacked, or queue deleted); kept, "
            "retried in %ss",
            len(refused),
            named,
            RELEASE_DELAY,
        )
    return stale, failed


def _record(runtime: Runtime, published: _Published) -> None:
    """Record the drained fates (log, history, counters, listeners); failures are logged."""
    events = [drained_event(runtime, m, published.published_ms) for m in published.sent]
    try:
        runtime.record_many(events)
    except STORE_ERRORS as exc:
        logger.warning("drain could not record %d drained retries in history: %s", len(events), exc)


def register_drain_task(app: Celery) -> Task[[], None]:
    """Register the drain task (named :data:`DRAIN_TASK_NAME`) on ``app``; harmless twice.

    The task ignores its result, never retries, and acks early (the store, not the tick message,
    is the source of truth). Within one worker process only one drain runs at a time: an
    overlapping tick (thread or green pools) returns at once, since the running drain covers it.

    Returns:
        The task (a lazy proxy until the app is finalized); the same one on every call.
    """
    existing: Task[[], None] | None = app.__dict__.get("_celery_dlx_drain_task")
    if existing is not None:
        return existing
    lock = threading.Lock()

    def drain() -> None:
        if not lock.acquire(blocking=False):
            return
        try:
            runtime = get_runtime(app)
            run_drain(runtime, budget_seconds=BUDGET_SHARE * runtime.config.drain_interval)
        finally:
            lock.release()

    drain.__doc__ = "Republish due parked retries (celery_dlx)."
    task = app.task(
        name=DRAIN_TASK_NAME,
        ignore_result=True,
        acks_late=False,
        max_retries=0,
        autoretry_for=(),
        shared=False,
    )(drain)
    app.__dict__["_celery_dlx_drain_task"] = task
    return task


def beat_entry(config: DLXConfig) -> dict[str, dict[str, str | float]]:
    """A ``beat_schedule`` entry running the drain task every ``dlx_drain_interval`` seconds.

    Not installed by default (the drainer bootstep drains in the workers, with no tick messages):
    add it to ``beat_schedule`` yourself only to drain from workers of an app without celery_dlx.

    Ticks carry no ``expires``: Celery turns it into an AMQP expiration, and a tick expiring in a
    queue with a dead-letter exchange would become a dead letter. Ticks that piled up while no
    worker ran cost one Redis call each (the per-process lock makes overlapping ones return).
    """
    interval = float(config.drain_interval)
    return {DRAIN_TASK_NAME: {"task": DRAIN_TASK_NAME, "schedule": interval}}
