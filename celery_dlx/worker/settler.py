"""The pool's parent writes its runs' parks and requeues in batches, then acks each original.

A run failing into a park or requeue builds the copy in the pool process and ends with a
handover (:class:`ParkHandover`, :class:`RequeueHandover`, carried by
:class:`celery_dlx.compat.HandedOver`), which the main process's
:class:`~celery_dlx.worker.request.DLXRequest` gives to the :class:`Settler` instead of acking.
Its thread waits up to :data:`LINGER` for others, then writes parks in one ``MULTI``/``EXEC``
(``WAIT`` for ``dlx_redis_min_replicas``) and requeued copies with pipelined confirms: a burst of
failures costs one Redis round trip and one confirm wait per batch while the pool runs on.

The original is acked only once its park is in Redis (and the replicas) or its copy is
confirmed; a copy that cannot be written goes to the DLX service (:func:`send_to_service`). A
worker that dies in between acks nothing: the broker redelivers the original (a park is
idempotent per message id and attempt; a requeued copy may run twice, as when a pool process
dies before its ack). Used with the Redis delay backend on the prefork and threads pools
(``dlx_parent_parks``); elsewhere (the solo pool's runs block its loop anyway) the run writes
its copy itself.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from celery import bootsteps

from celery_dlx import faults
from celery_dlx.compat.celery import acknowledge_from_thread, reject_from_thread, worker_pool_name
from celery_dlx.fates import PARKED, REQUEUED, FateEvent
from celery_dlx.message.fate_copy import fate_copy
from celery_dlx.message.outgoing import Outgoing
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.outages import OutageLog, outage_log
from celery_dlx.wiring.runtime import Runtime, get_runtime
from celery_dlx.worker.marks import mark_made, mark_pending

if TYPE_CHECKING:
    from celery import Celery
    from celery.worker import WorkController
    from celery.worker.request import Request

logger = logging.getLogger(__name__)

#: Most parks written in one transaction.
BATCH_LIMIT = 500
#: How long the first park of a batch waits for others (seconds): a pool hands over about one
#: failure per millisecond; without the wait nearly every transaction carries one park.
#: Counted gain (``benchmarks/tricks_io.py --part linger``, Redis ``EXEC`` calls per failure,
#: medians of 3 rounds, prefork, prefetch 10): a flood of 5,000 parks (P10) takes 0.50
#: transactions per failure with the wait against 0.96 without at ``-c 1`` (-48%), 0.52 against
#: 0.79 at ``-c 2`` (-35%); P1 (100 poison ahead of 1,000 good) 0.71 against 1.00 and 0.57
#: against 0.77 (-29%, -26%). The original's ack waits as long; a batch of
#: :data:`BATCH_EARLY` parks is written at once.
LINGER = 0.003
#: Parks that end the wait early.
BATCH_EARLY = 16
#: Pools (by module name) whose parks the settler writes.
POOLS = ("prefork", "thread")


@dataclass(frozen=True)
class ParkHandover:
    """A park left to the parent: the copy and its fate."""

    message: ParkedMessage
    event: FateEvent


@dataclass(frozen=True)
class RequeueHandover:
    """A requeue left to the parent: the copy and its fate."""

    copy: Outgoing
    event: FateEvent


#: What a pool process hands over to its parent.
Handover = ParkHandover | RequeueHandover


#: Attribute of an app holding its worker's :class:`Settler`: set before the pool forks, so its
#: processes know that their parent settles parks.
_SETTLER_ATTR = "_celery_dlx_settler"


def hands_over(app: Celery) -> bool:
    """True in a worker (and its pool processes) whose main process settles parks."""
    return app.__dict__.get(_SETTLER_ATTR) is not None


def settler_of(app: Celery) -> Settler | None:
    """The settler of ``app``'s worker, if it has one."""
    settler: Settler | None = app.__dict__.get(_SETTLER_ATTR)
    return settler


class Settler:
    """Writes handed-over copies in batches on a thread of its own, then acks each original.

    From this thread an ack wakes the loop
    (:func:`~celery_dlx.compat.celery.acknowledge_from_thread`); from inside a loop callback it
    would wait for the loop's next event: up to a second, with a prefetch slot held (seen at
    prefetch 1)."""

    def __init__(self, app: Celery, hostname: str | None = None) -> None:
        self.app = app
        #: the worker's node name, named by the fate events it writes
        self.hostname = hostname
        self._pending: deque[tuple[Request, Handover]] = deque()
        self._wake = threading.Event()
        self._running = False
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._running = True
        self._thread = threading.Thread(target=self._run, name="celery_dlx-settler", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Write what was handed over, ack it here, and settle later handovers synchronously."""
        self._running = False
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        self._settle(self._take(len(self._pending)))

    def submit(self, request: Request, handover: Handover) -> None:
        """Write ``handover``'s copy, then ack ``request``'s message (any thread)."""
        if not self._running:  # stopping: the pool's last results
            self._settle([(request, handover)])
            return
        self._pending.append((request, handover))
        pending = len(self._pending)
        if pending == 1 or pending >= BATCH_EARLY:  # the batch's first park, or a full one
            self._wake.set()

    def _take(self, limit: int) -> list[tuple[Request, Handover]]:
        batch: list[tuple[Request, Handover]] = []
        while self._pending and len(batch) < limit:
            batch.append(self._pending.popleft())
        return batch

    def _run(self) -> None:
        while self._running:
            self._wake.wait()
            self._wake.clear()
            if self._running and len(self._pending) < BATCH_EARLY:
                self._wake.wait(LINGER)  # the others of this batch
                self._wake.clear()
            while self._pending:
                self._settle(self._take(BATCH_LIMIT))

    def _settle(self, batch: list[tuple[Request, Handover]]) -> None:
        """Write ``batch``'s copies, then ack each original whose copy went in."""
        if not batch:
            return
        runtime = get_runtime(self.app)
        parks = [(i, h) for i, (_, h) in enumerate(batch) if isinstance(h, ParkHandover)]
        requeues = [(i, h) for i, (_, h) in enumerate(batch) if isinstance(h, RequeueHandover)]
        outcomes: list[BaseException | None] = [None] * len(batch)
        with runtime.acting_for(self.hostname):
            if parks:
                _fill(
                    outcomes,
                    parks,
                    lambda: runtime.park_recorded_many([(h.message, h.event) for _, h in parks]),
                )
            if requeues:
                mark_pending(runtime, [h.event for _, h in requeues])
                _fill(
                    outcomes,
                    requeues,
                    lambda: runtime.requeue_recorded_many(
                        [(h.copy, h.event) for _, h in requeues],
                        unrecorded=lambda events: mark_made(runtime, events),
                    ),
                )
        if any(outcomes[i] is None for i, _ in parks):
            faults.point("worker.parked")
            _refusals(self.app, PARKED).succeeded()
        if any(outcomes[i] is None for i, _ in requeues):
            faults.point("worker.requeued")
            _refusals(self.app, REQUEUED).succeeded()
        for (request, handover), outcome in zip(batch, outcomes, strict=True):
            try:
                if outcome is None:
                    acknowledge_from_thread(request)
                else:
                    self._fall_back(request, handover, outcome)
            except Exception:  # one message's ack must not keep the others waiting
                logger.exception("celery_dlx could not settle %s", handover.event.message_id)

    def _fall_back(self, request: Request, handover: Handover, err: BaseException) -> None:
        """The copy could not be written: it goes to the DLX service (:func:`send_to_service`)
        and the original is acked, or back to its queue if the broker refuses that copy too."""
        runtime = get_runtime(self.app)
        if isinstance(handover, ParkHandover):
            parked = handover.message
            copy = parked.outgoing()
            fate, delay = PARKED, max(0.0, (parked.due_ms - parked.parked_ms) / 1000)
        else:
            copy, fate, delay = handover.copy, REQUEUED, None
        queue = handover.event.queue or copy.routing_key
        refused = send_to_service(
            runtime, copy, fate, queue, delay, handover.event, _refusals(self.app, fate), err
        )
        if refused is not None:
            reject_from_thread(request, requeue=True)
            return
        acknowledge_from_thread(request)


def send_to_service(
    runtime: Runtime,
    copy: Outgoing,
    fate: str,
    queue: str,
    delay: float | None,
    event: FateEvent,
    refusals: OutageLog,
    err: BaseException,
) -> Exception | None:
    """Send a copy that could not be written to the DLX service naming its ``fate``, which
    writes it once Redis and the broker answer (nothing lost, nothing decided twice), marked
    pending first (:mod:`celery_dlx.worker.marks`). The caller then acks the original (a DLX
    task's rejection means a burial); the broker's error when it refused this copy too (the
    original then goes back to its queue: its redelivery counts as a crash)."""
    routed = fate_copy(copy, fate=fate, exchange=runtime.config.exchange, queue=queue, delay=delay)
    mark_pending(runtime, [event])
    try:
        runtime.publisher.publish(routed)
    except Exception as again:
        runtime.reset_publisher()
        refusals.failed(err, "the broker refused the copy for the DLX service too")
        return again
    refusals.failed(err, "sent to the DLX service, which writes it once it can")
    mark_made(runtime, [event])
    return None


def _refusals(app: Celery, fate: str) -> OutageLog:
    return outage_log(app, f"_celery_dlx_settler_refused_{fate}", logger, f"{fate} copies")


def _fill(
    outcomes: list[BaseException | None],
    indexed: Sequence[tuple[int, object]],
    write: Callable[[], list[BaseException | None]],
) -> None:
    """Put ``write()``'s outcome for each ``(place, handover)`` of ``indexed`` in ``outcomes``; its
    error for each if it raises (the thread must not die; each message falls back)."""
    try:
        written = write()
    except Exception as err:
        written = [err] * len(indexed)
    for (i, _), outcome in zip(indexed, written, strict=True):
        outcomes[i] = outcome


class SettlerStep(bootsteps.StartStopStep):
    """Worker bootstep running the :class:`Settler` of handed-over parks."""

    name = "celery_dlx.worker.settler"
    requires = ("celery.worker.components:Hub", "celery.worker.components:Pool")

    def include_if(self, parent: WorkController) -> bool:
        config = get_runtime(parent.app).config
        pool_name = worker_pool_name(parent)
        return bool(
            config.enabled
            and config.parent_parks
            and config.delay_backend == "redis"
            and getattr(parent, "use_eventloop", False)
            and pool_name in POOLS
        )

    def create(self, parent: WorkController) -> Settler:  # type: ignore[override]  # celery-stubs say None; Celery keeps what create returns as the step's obj
        settler = Settler(parent.app, getattr(parent, "hostname", None))
        parent.app.__dict__[_SETTLER_ATTR] = settler
        return settler
