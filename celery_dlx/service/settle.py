"""Settling a batch of dead letters: read, look up, decide, write; the ack is the caller's.

A batch is read (pure), looked up in Redis in one round trip (already handled? the worker's
cause record?), decided, then written: parks and obituaries with their history entries first,
then requeued copies published with confirms, the seen markers last (``settle`` says why). A
redelivery is recognised by its key (queue, message id, attempt, history) and given no second
fate, but only when its message id is provable (``message_id``, Celery's task id, or the
``x-dlx-id`` stamped on copies): look-alikes without one are never merged.

A batch is settled (and acked) only once ``dlx_redis_min_replicas`` replicas hold its writes:
the whole settle runs in :meth:`Runtime.replicated <celery_dlx.wiring.runtime.Runtime.replicated>`
(one connection, ``WAIT`` at the end), so a failover cannot take back a fate whose letter was acked.

A batch failing after its copies were published (Redis refuses writes, or too few replicas
confirm) is settled again and must not publish them again (each would run the task once more).
Until the batch is settled, the settler remembers by letter key each copy the broker confirmed
and each letter whose fate a try wrote; a retry gives it the same verdict, publishes no copy
again, and counts writes it finds as its own, not a redelivery. Memory, not Redis, because Redis
is what is failing: a marker written before the publish cannot say whether it happened (skipping
could lose the requeue), one written after it fails in the very outage. An unconfirmed copy is
not remembered, so a retry publishes it (at-least-once); a crash forgets everything, and the
redelivery publishes once more (a duplicate, counted like any other).
"""

from __future__ import annotations

import logging
import socket
import threading
import uuid
import weakref
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from celery import Celery

from celery_dlx import faults
from celery_dlx.broker.consume import Delivery, ack_all
from celery_dlx.broker.hook import send_to_hook
from celery_dlx.broker.topology import overflow_name
from celery_dlx.errors import PublishError
from celery_dlx.fates import BURIED, PARKED, REQUEUED, FateEvent, now_ms
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.headers import read_state
from celery_dlx.message.names import HISTORY_HEADER, QUEUE_HEADER, REASON_HEADER
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.outgoing import Outgoing, copy_properties
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.deadletter import DeadLetter, read_dead_letter
from celery_dlx.policy.verdicts import (
    BuryVerdict,
    ParkVerdict,
    RequeueVerdict,
    Verdict,
    build_obituary,
    bury_verdict,
    decide_letter,
)
from celery_dlx.roles import Parking, Publisher
from celery_dlx.service.stats import ServiceStats
from celery_dlx.wiring.errors import GraveyardFull
from celery_dlx.wiring.runtime import Runtime, get_runtime

logger = logging.getLogger(__name__)

#: Most letters a settler remembers from the tries of batches not settled yet (a batch the
#: service gave up, at a stop, leaves its entries; the oldest are forgotten first, at worst
#: costing a duplicate copy).
TRIED_MEMORY = 100_000
#: Most task names whose kind (DLX task or not) a settler remembers (foreign producers may name
#: any number of tasks).
TASK_MEMORY = 10_000


@dataclass
class _Work:
    """One dead letter in a batch, from delivery to ack."""

    message: Delivery
    letter: DeadLetter
    verdict: Verdict | None = None
    record: CauseRecord | None = None
    duplicate: bool = False
    #: Moved to the overflow queue: its cause holds dlx_graveyard_max_per_cause obituaries.
    overflowed: bool = False


def buried_event(ob: Obituary, *, traceback_logged: bool = False) -> FateEvent:
    """The one ``buried`` fate event of an obituary (history, log with traceback, listeners).

    ``traceback_logged``: Celery's tracer already logged the traceback (a DLX task failed with
    its own exception), so the burial line names the cause without it; listeners keep it.
    """
    return ob.fate_event(
        BURIED,
        ob.buried_ms,
        traceback=ob.traceback,
        extra={
            "obituary_id": ob.id,
            "obituary_summary": ob.summary(),
            "history": [[a.at_ms, a.fate, a.cause] for a in ob.attempts],
            "payload": ob.payload,
            "content_type": ob.content_type,
            "content_encoding": ob.content_encoding,
            "source": "dlx-service",
            "traceback_logged": traceback_logged,
        },
    )


def _retry_event(work: _Work, now: int) -> FateEvent:
    verdict = work.verdict
    assert isinstance(verdict, (ParkVerdict, RequeueVerdict))
    parked = isinstance(verdict, ParkVerdict)
    return FateEvent.of(
        PARKED if parked else REQUEUED,
        verdict.failure.but(at_ms=now),
        delay=verdict.delay if isinstance(verdict, ParkVerdict) else None,
        extra={
            "source": "dlx-service",
            "death_reason": work.letter.death_reason,
            "counted": verdict.counted if isinstance(verdict, ParkVerdict) else True,
        },
    )


def _body_bytes(body: str, encoding: Any) -> bytes:
    """The bytes of a body a transport decoded to text (py-amqp also leaves an empty body as "");
    the encoding may be absent or name no codec."""
    try:
        return body.encode(str(encoding or "utf-8"), errors="surrogateescape")
    except LookupError:
        return body.encode("utf-8", errors="surrogateescape")


class BatchSettler:
    """Gives each dead letter of a batch its fate: requeue, park or bury, and everything but the ack.

    ``hostname`` is written into obituaries of foreign messages (default: this host).
    """

    def __init__(
        self, app: Celery, *, hostname: str | None = None, runtime: Runtime | None = None
    ) -> None:
        self.app = app
        self.runtime = runtime or get_runtime(app)
        self.config = self.runtime.config
        self.hostname = hostname or socket.gethostname()
        self.stats = ServiceStats()
        self._local = threading.local()  # each settling thread has its own publisher
        self._publishers: list[Publisher] = []
        self._publishers_lock = threading.Lock()
        # One random name per channel: with a delivery tag it names one delivery for good.
        self._channel_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        # By letter key, until its batch is settled: the verdict of a letter whose requeued copy
        # the broker confirmed, or whose fate a try wrote (then failed, and is being retried).
        self._tried: OrderedDict[str, Verdict] = OrderedDict()
        self._tried_lock = threading.Lock()
        self._dlx_tasks: dict[str, bool] = {}

    def handle(self, messages: Sequence[Delivery]) -> None:
        """Give every dead letter of ``messages`` (kombu messages) its fate, then ack them.

        Raises:
            redis.RedisError, PublishError, OSError...: a write failed; nothing was acked.
        """
        self.settle(messages)
        ack_all(messages)

    def settle(self, messages: Sequence[Delivery]) -> None:
        """Give every dead letter of ``messages`` its fate (everything but the ack).

        Idempotent: run again after a failure, it gives no second fate and publishes no second
        copy. Touches no channel of the messages, so it may run on another thread.

        Raises:
            NotReplicated: written, but fewer Redis replicas than ``dlx_redis_min_replicas``
                confirmed it: ack none of them (a retry publishes no copy twice).
            redis.RedisError, PublishError, OSError...: a write failed; ack none of them.
        """
        what = f"a batch of {len(messages)} dead letter(s)"
        with self.runtime.replicated(what):
            now = now_ms()
            works = [_Work(m, self._read(m)) for m in messages]
            self._lookup(works)
            tried = self._tried_verdicts(works)
            # Settled by an earlier try of this batch whose replication wait failed: ours.
            ours = [w for w in works if w.duplicate and w.letter.key in tried]
            live = [w for w in works if not w.duplicate]
            for w in [*ours, *live]:
                verdict = tried.get(w.letter.key)
                w.verdict = self._decide(w, now) if verdict is None else verdict
            # The writes that make the batch's fates durable come first: a requeued copy runs its
            # task at once, so one published before a write Redis then refuses would run again
            # when the batch (held unacked) is settled again.
            parks = [w for w in live if isinstance(w.verdict, ParkVerdict)]
            self._park(parks, now)
            retried = [_retry_event(w, now) for w in parks]
            self.runtime.record_many(retried, log=False)
            if parks:
                faults.point("service.parked")
            burials = self._bury([w for w in live if isinstance(w.verdict, BuryVerdict)], now)
            requeues = [w for w in live if isinstance(w.verdict, RequeueVerdict)]
            self._requeue(requeues, now)
            if requeues:
                faults.point("service.published")
            requeued = [
                _retry_event(w, now) for w in requeues if isinstance(w.verdict, RequeueVerdict)
            ]
            self.runtime.record_many(requeued, log=False)
            retried += requeued
            # A copy the broker refused (its queue is gone) is buried after all.
            burials += self._bury([w for w in requeues if isinstance(w.verdict, BuryVerdict)], now)
            if burials:
                faults.point("service.buried")
            # The buried entries went to the history with the obituaries, atomically.
            buried = [event for _, event in burials]
            self.runtime.record_many(buried, history=False, log=False)
            for ob, _ in burials:
                send_to_hook(self.app, self.config.obituary_task, ob)
            # Every letter's marker, a redelivery's too: the batch's last write, so the replicas'
            # confirmation covers it and every write before it (an earlier try's included).
            self._mark_seen(works)
            self._remember(live)
        # Written (and replicated): now one line per fate change, not before (a retried batch
        # would log its fates twice).
        self.runtime.log_fates([*retried, *buried])
        self._forget(works)
        self._count([*ours, *live], len(works) - len(live) - len(ours))
        # The copies workers could not write themselves (x-dlx-fate), now written.
        refused = Counter(w.letter.worker_fate for w in live if w.letter.worker_fate)
        if refused:
            self.stats.add(refused_copies=refused.total())
            try:
                self.runtime.refusals.add({str(fate): n for fate, n in refused.items()})
            except Exception:  # a count; the fates are written
                logger.debug("could not count %d refused copies", refused.total(), exc_info=True)

    def _count(self, live: list[_Work], duplicates: int) -> None:
        kinds = Counter(type(w.verdict) for w in live)
        unproven = sum(1 for w in live if w.letter.redelivered and not w.letter.provable)
        if unproven:
            logger.warning(
                "DLX service: %d redelivered dead letter(s) without a message_id given a fate "
                "again (a look-alike may have been handled before: both are kept)",
                unproven,
            )
        self.stats.add(
            received=len(live) + duplicates,
            batches=1,
            duplicates=duplicates,
            unproven_redeliveries=unproven,
            buried=kinds[BuryVerdict] - sum(1 for w in live if w.overflowed),
            parked=kinds[ParkVerdict],
            requeued=kinds[RequeueVerdict],
        )
        if duplicates:
            logger.info(
                "DLX service acked %d redelivered dead letter(s) handled before", duplicates
            )

    def _read(self, message: Delivery) -> DeadLetter:
        info = message.delivery_info or {}
        body = message.body
        if isinstance(body, str):
            body = _body_bytes(body, (message.properties or {}).get("content_encoding"))
        return read_dead_letter(
            body,
            message.headers,
            message.properties,
            exchange=str(info.get("exchange") or ""),
            routing_key=str(info.get("routing_key") or ""),
            redelivered=bool(info.get("redelivered")),
            delivery=self._delivery_name(message, info),
        )

    def _delivery_name(self, message: Any, info: Any) -> str:
        """A name of this delivery no other delivery has: its channel's random name and tag.

        The same on a settle retried in this process (no second fate), new on a redelivery
        after a crash (the redelivered flag cannot tell a look-alike from a redelivery).
        """
        tag = info.get("delivery_tag") or getattr(message, "delivery_tag", None)
        try:
            name = self._channel_names.get(message.channel)
            if name is None:
                name = self._channel_names.setdefault(message.channel, uuid.uuid4().hex)
        except TypeError:  # no channel, or one that takes no weak reference
            return uuid.uuid4().hex
        return f"{name}:{tag}" if tag is not None else uuid.uuid4().hex

    def _lookup(self, works: list[_Work]) -> None:
        """Which letters were handled before, and the worker's cause records: one round trip."""
        seen, records = self.runtime.letters.lookup(
            [w.letter.key for w in works], [w.letter.identity for w in works]
        )
        for w, marker, record in zip(works, seen, records, strict=True):
            w.duplicate = marker
            w.record = record

    def _decide(self, work: _Work, now: int) -> Verdict:
        try:
            return decide_letter(
                work.letter,
                self.config,
                work.record,
                now,
                dlx_task=self._dlx_task(work.letter.task),
            )
        except Exception as exc:  # a letter nobody foresaw is buried with the reason, never lost
            logger.exception("DLX service could not decide dead letter %s", work.letter.identity)
            why = f"undecodable: {type(exc).__name__}: {exc}"
            return bury_verdict(work.letter, self.config, why, now, failed=False)

    def _dlx_task(self, name: str | None) -> bool:
        """True when ``name`` is a task this app runs as a DLX task (its worker rejects a message
        into the dead-letter exchange only to bury it)."""
        if not name:
            return False
        found = self._dlx_tasks.get(name)
        if found is None:
            try:
                task = self.app.tasks.get(name)
            except Exception:  # an app that cannot load its tasks: decide as for a foreign one
                logger.debug("DLX service could not look up task %s", name, exc_info=True)
                task = None
            handles = getattr(task, "fates_enabled_for", None)
            found = bool(handles(self.app)) if callable(handles) else False
            if len(self._dlx_tasks) < TASK_MEMORY:
                self._dlx_tasks[name] = found
        return found

    @property
    def publisher(self) -> Publisher:
        """This thread's confirm-mode publisher, on its own connection."""
        found: Publisher | None = getattr(self._local, "publisher", None)
        if found is None:
            found = self.runtime.open_publisher()
            self._local.publisher = found
            with self._publishers_lock:
                self._publishers.append(found)
        return found

    def _close_publisher(self, *, every: bool = False) -> None:
        """Close this thread's publisher (after an error), or every thread's (at the end)."""
        with self._publishers_lock:
            mine = getattr(self._local, "publisher", None)
            closing = [p for p in self._publishers if every or p is mine]
            self._publishers = [p for p in self._publishers if p not in closing]
        self._local.publisher = None
        for publisher in closing:
            publisher.close()  # and its connection

    def _tried_verdicts(self, works: list[_Work]) -> dict[str, Verdict]:
        """The verdicts earlier tries gave these letters (copy published, or fate written)."""
        keys = [w.letter.key for w in works]
        with self._tried_lock:
            return {key: self._tried[key] for key in keys if key in self._tried}

    def _remember(self, works: list[_Work]) -> None:
        with self._tried_lock:
            for w in works:
                assert w.verdict is not None
                self._tried[w.letter.key] = w.verdict
            while len(self._tried) > TRIED_MEMORY:
                self._tried.popitem(last=False)

    def _forget(self, works: list[_Work]) -> None:
        with self._tried_lock:
            for w in works:
                self._tried.pop(w.letter.key, None)

    def _requeue(self, works: list[_Work], now: int) -> None:
        with self._tried_lock:  # a copy confirmed in an earlier try is not published again
            works = [w for w in works if w.letter.key not in self._tried]
        if not works:
            return
        copies = []
        for w in works:
            assert isinstance(w.verdict, RequeueVerdict)
            headers = w.letter.copy_headers(w.verdict.state)
            props = copy_properties(w.letter.properties)
            copies.append(Outgoing(w.letter.body, w.letter.queue, "", headers, props))
        for w, ok in zip(works, self.publisher.publish_many(copies), strict=True):
            if not ok:
                why = f"requeue to {w.letter.queue!r} refused by the broker (queue missing?)"
                w.verdict = bury_verdict(w.letter, self.config, why, now, failed=True)
        self._remember([w for w in works if isinstance(w.verdict, RequeueVerdict)])

    def _park(self, works: list[_Work], now: int) -> None:
        if not works:
            return
        entries = []
        for w in works:
            verdict = w.verdict
            assert isinstance(verdict, ParkVerdict)
            letter = w.letter
            entries.append(
                ParkedMessage(
                    message_id=letter.identity,
                    attempt=verdict.state.attempt,
                    queue=letter.queue,
                    body=letter.body,
                    headers=letter.copy_headers(verdict.state),
                    properties=copy_properties(letter.properties),
                    due_ms=now + int(verdict.delay * 1000),
                    parked_ms=now,
                    task=letter.task,
                    cause=verdict.cause,
                )
            )
        # With the TTL ladder (dlx_delay_backend = "ttl") there is no entry id to dedup against:
        # a batch settled twice (a crash before its ack) parks its retries twice, the
        # at-least-once the seen markers otherwise narrow.
        parking = self.runtime.parking
        for w, entry, stored in zip(works, entries, parking.park_many(entries), strict=True):
            if not stored:
                self._park_taken(parking, entry, w.letter, now)

    def _park_taken(
        self, parking: Parking, parked: ParkedMessage, letter: DeadLetter, now: int
    ) -> None:
        """Park, idempotently, a letter whose entry id was taken; maybe under a more specific id.

        The store's entry id is message id + attempt. It may already be held by this very dead
        letter (a redelivery after a crash: done), by the same message dead in another queue (a
        fanout copy), or by the entry this letter was drained from, not yet deleted (an expired
        message keeps its attempt). The last two must not swallow this letter.
        """
        if self._parked_by_this_letter(parking, parked.entry_id, letter):
            return
        base = parked.message_id
        for candidate in (f"{base}@{letter.queue}", f"{base}@{letter.queue}~{now}"):
            parked.message_id = candidate
            if parking.park(parked) or self._parked_by_this_letter(
                parking, parked.entry_id, letter
            ):
                return
        raise RuntimeError(f"parking {parked.entry_id} failed: every entry id is taken")

    def _parked_by_this_letter(self, parking: Parking, entry_id: str, letter: DeadLetter) -> bool:
        existing = parking.entry(entry_id)
        if existing is None:
            return False  # the entry left meanwhile (drained), or is unreadable: not ours
        try:
            history = read_state({HISTORY_HEADER: existing.headers.get(HISTORY_HEADER)}).history
        except Exception:  # an unreadable entry is not ours
            return False
        if existing.queue != letter.queue:
            return False
        if letter.worker_fate == PARKED:
            # A park the worker sent because its write seemed to fail (a reply lost as Redis
            # went down): an entry with the copy's own history is that write, which did land.
            return history == letter.state.history
        # The entry this letter was drained from carries exactly the letter's history.
        return history != letter.state.history

    def _bury(self, works: list[_Work], now: int) -> list[tuple[Obituary, FateEvent]]:
        items = []
        code_version = self.config.code_version  # read from the environment: once per batch
        for w in works:
            verdict = w.verdict
            assert isinstance(verdict, BuryVerdict)
            ob = build_obituary(
                w.letter, verdict, buried_ms=now, code_version=code_version, hostname=self.hostname
            )
            items.append((ob, buried_event(ob, traceback_logged=verdict.from_worker)))
        # The workers' cause records go with the seen markers (_mark_seen), in one step: a
        # settle retried after a failure between the two finds the record and the obituary.
        yard = self.runtime.graveyard
        over: list[int] = []
        try:
            written = yard.write_many(items, drop_causes=False, over_cap=over)
        except GraveyardFull as full:
            # The obituaries written before the refusal are those letters' fates: marked now,
            # so a purge before the batch is tried again cannot make them buried twice.
            self._mark_seen([w for w, done in zip(works, full.settled, strict=False) if done])
            raise
        if over:
            self._overflow([works[i] for i in over])
        # A replayed message buried again: its old obituary failed again (a retried settle
        # notes it again, idempotently, so a crash between the two loses nothing).
        yard.note_failed_again([ob for ob, _ in items if ob.replayed_from], now)
        # An obituary already there (a redelivery, or a second copy of the message a crash left
        # behind) is neither written nor announced again.
        return [item for item, new in zip(items, written, strict=True) if new]

    def _overflow(self, works: list[_Work]) -> None:
        """Move dead letters whose cause holds ``dlx_graveyard_max_per_cause`` obituaries to
        the overflow queue, whole, with their burial decided (``x-dlx-reason``): nothing is
        dropped, and the other causes' burials go on. ``dlx overflow --requeue`` hands them back.

        Raises:
            PublishError: the broker did not confirm every copy: the batch is tried again.
        """
        queue = overflow_name(self.config.service_queue)
        copies = []
        for w in works:
            verdict = w.verdict
            assert isinstance(verdict, BuryVerdict)
            headers = {k: v for k, v in w.letter.headers.items() if not k.startswith("x-death")}
            headers.update({QUEUE_HEADER: w.letter.queue, REASON_HEADER: verdict.reason})
            props = copy_properties(w.letter.properties)
            copies.append(Outgoing(w.letter.body, queue, "", headers, props))
        if not all(self.publisher.publish_many(copies)):
            raise PublishError(f"the overflow queue {queue!r} did not take every dead letter")
        for w in works:
            w.overflowed = True
        self.stats.add(overflowed=len(works))
        logger.warning(
            "DLX service: %d dead letter(s) of a cause at dlx_graveyard_max_per_cause (%d) moved "
            "to %s; `dlx overflow --requeue` hands them back once the cause has room",
            len(works),
            self.config.graveyard_max_per_cause,
            queue,
        )

    def _mark_seen(self, works: list[_Work]) -> None:
        # A letter moved to the overflow queue is not marked: its copy comes back with the same
        # key (and its cause record kept for it); a redelivery of it moves it there again, a
        # duplicate its burial's obituary id makes harmless.
        settled = [w for w in works if not w.overflowed]
        buried = [w.letter.identity for w in settled if isinstance(w.verdict, BuryVerdict)]
        self.runtime.letters.mark([w.letter.key for w in settled], drop_causes=buried)
