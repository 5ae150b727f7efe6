"""The DLX service: consumes dead letters of any origin and parks, requeues or buries them.

Runs standalone (``celery -A proj dlx service``) or inside a worker (a bootstep, when
``dlx_service_in_worker`` is on), on its own broker connections. Dead letters arrive on
``dlx_service_queue``; each batch is read (:mod:`celery_dlx.policy.deadletter`, pure), looked up in Redis
in one round trip (already handled? worker's cause record?), decided, then written: requeued
copies published with confirms, parked retries stored, obituaries written with their history
entries. Only then is a dead letter acked, so a kill -9 at any point loses nothing. A redelivered
dead letter is recognised by its key (queue, message id, attempt, history) and acked without a
second fate, but only when its message id is provable (``message_id``, Celery's task id, or the
``x-dlx-id`` celery_dlx stamps on copies): look-alike messages without one are never merged, and
a redelivery of one after a crash may get a second fate (counted, both kept). Nothing is ever
rejected from the service queue (it has no dead-letter exchange): a dead letter the service
cannot handle for now (Redis or the broker is down) stays unacked and is retried, with one log
line per outage.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid
import weakref
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from typing import Any, cast

import amqp
from amqp.exceptions import PreconditionFailed
from celery import Celery
from kombu import Connection
from kombu.transport.pyamqp import Channel as AMQPChannel
from redis.exceptions import RedisError

from celery_dlx import faults
from celery_dlx.broker.errors import BROKER_ERRORS
from celery_dlx.broker.publish import ConfirmingPublisher
from celery_dlx.broker.topology import service_queue
from celery_dlx.compat import install_tolerant_properties
from celery_dlx.errors import DLXError, TopologyError
from celery_dlx.fates import BURIED, PARKED, REQUEUED, FateEvent, now_ms
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.headers import read_state
from celery_dlx.message.names import HISTORY_HEADER
from celery_dlx.message.obituary import Obituary, send_to_hook
from celery_dlx.message.outgoing import Outgoing, copy_properties
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.deadletter import (
    BuryVerdict,
    DeadLetter,
    ParkVerdict,
    RequeueVerdict,
    Verdict,
    build_obituary,
    bury_verdict,
    decide_letter,
    read_dead_letter,
)
from celery_dlx.store.graveyard import Graveyard, sweep_retention
from celery_dlx.store.parking import ParkingStore, mget_many, run_script_many
from celery_dlx.worker.runtime import Runtime, get_runtime

logger = logging.getLogger(__name__)

#: How long a handled dead letter's key is remembered, to ack a redelivery without a second fate.
SEEN_TTL_MS = 24 * 3600 * 1000
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
#: Waits (seconds) between retries while Redis or the broker is unavailable; the last repeats.
RETRY_DELAYS = (0.2, 0.5, 1.0, 2.0, 5.0)

#: Errors that mean "not now": the batch stays unacked and is retried.
TRANSIENT_ERRORS: tuple[type[BaseException], ...] = (RedisError, *BROKER_ERRORS)


# Set every key of KEYS with a time to live of ARGV[1] ms: the batch's "handled" markers.
_MARK_SEEN = """
for _, key in ipairs(KEYS) do redis.call('SET', key, '1', 'PX', ARGV[1]) end
return #KEYS
"""


@dataclass
class ServiceStats:
    """Counts of what one service run did."""

    received: int = 0
    buried: int = 0
    parked: int = 0
    requeued: int = 0
    duplicates: int = 0
    #: Redelivered dead letters without a provable identity, given a fate again (maybe twice).
    unproven_redeliveries: int = 0
    batches: int = 0
    archived: int = 0
    outages: int = 0
    retries: int = 0
    processes: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        """Add to counts (settling threads share the stats)."""
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}


@dataclass
class _Work:
    """One dead letter in a batch, from delivery to ack."""

    message: amqp.Message
    letter: DeadLetter
    verdict: Verdict | None = None
    record: CauseRecord | None = None
    duplicate: bool = False


class _Outage:
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


def buried_event(ob: Obituary) -> FateEvent:
    """The one ``buried`` fate event of an obituary (history, log with traceback, listeners)."""
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
        },
    )


def _retry_event(work: _Work, now: int) -> FateEvent:
    verdict = work.verdict
    assert isinstance(verdict, (ParkVerdict, RequeueVerdict))
    letter = work.letter
    parked = isinstance(verdict, ParkVerdict)
    return FateEvent(
        fate=PARKED if parked else REQUEUED,
        queue=letter.queue,
        message_id=letter.identity,
        attempt=verdict.state.attempt,
        task=letter.task,
        cause=verdict.cause,
        exc_type=verdict.exc_type,
        exc_message=verdict.exc_message,
        reason=verdict.reason,
        delay=verdict.delay if isinstance(verdict, ParkVerdict) else None,
        importance=verdict.importance,
        first_failure_ms=verdict.state.first_failure_ms,
        at_ms=now,
        extra={
            "source": "dlx-service",
            "death_reason": letter.death_reason,
            "counted": verdict.counted if isinstance(verdict, ParkVerdict) else True,
        },
    )


def _body_bytes(body: str, encoding: Any) -> bytes:
    """The bytes of a body a transport decoded to text (py-amqp also leaves an empty body as "").

    The property may be absent (py-amqp then raises on attribute access) or name no codec.
    """
    try:
        return body.encode(str(encoding or "utf-8"), errors="surrogateescape")
    except LookupError:
        return body.encode("utf-8", errors="surrogateescape")


def _ack_all(messages: Sequence[Any]) -> None:
    """Ack a batch with one ``basic.ack(multiple)`` per channel (a batch holds every delivery
    received before it, so nothing outside it is acked)."""
    last: dict[Any, int] = {}
    for m in messages:
        last[m.channel] = max(last.get(m.channel, 0), int(m.delivery_tag))
    for channel, tag in last.items():
        channel.basic_ack(tag, multiple=True)


class BatchParkingStore(ParkingStore):
    """The parking store, parking a batch in one Redis round trip (same script as ``park``)."""

    def park_many(self, messages: Sequence[ParkedMessage]) -> list[bool]:
        """Park every message; per message, False if that id+attempt was parked already."""
        if not messages:
            return []
        calls = [(self._kk, [m.entry_id, m.due_ms, m.meta_json(), m.body]) for m in messages]
        return [bool(r) for r in run_script_many(self.client, self._park, calls)]


class DLXService:
    """The DLX service of one app.

    Args:
        app: the Celery app (its ``dlx_*`` settings and broker are used).
        prefetch: consumer prefetch (default ``dlx_service_prefetch``).
        hostname: written into obituaries of foreign messages (default: this host).
        runtime: the app's runtime (default ``get_runtime(app)``).
    """

    def __init__(
        self,
        app: Celery,
        *,
        prefetch: int | None = None,
        hostname: str | None = None,
        runtime: Runtime | None = None,
    ) -> None:
        self.app = app
        self.runtime = runtime or get_runtime(app)
        self.config = self.runtime.config
        self.prefetch = prefetch or int(self.config.service_prefetch)
        self.batch_limit = max(1, min(BATCH_LIMIT, self.prefetch // (SETTLERS + 1)))
        self.hostname = hostname or socket.gethostname()
        self.stats = ServiceStats()
        self._stop = threading.Event()
        self._settle_outage = _Outage("Redis or the broker")
        self._local = threading.local()  # each settling thread has its own publisher
        self._publishers: list[tuple[ConfirmingPublisher, Connection]] = []
        self._publishers_lock = threading.Lock()
        self._inbox: list[amqp.Message] = []
        self._last_sweep = 0.0
        self._sweep_failing = False
        self._idle_since = time.monotonic()
        # One random name per channel: with a delivery tag it names one delivery for good.
        self._channel_names: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()

    # -- lifecycle ---------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the service to stop after the batch in hand (acked first). Thread-safe."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(self, *, idle_timeout: float | None = None) -> ServiceStats:
        """Consume dead letters until :meth:`stop` (or ``idle_timeout`` seconds without any).

        Broker connection losses are retried forever (one log line per outage).

        Raises:
            TopologyError: the service queue exists with other arguments.
        """
        outage = _Outage("broker")
        self._idle_since = time.monotonic()
        try:
            while not self._stop.is_set():
                try:
                    self._consume(idle_timeout, outage)
                except TopologyError:
                    raise
                except BROKER_ERRORS as exc:
                    self._wait(outage.begin(exc, len(self._inbox), self.stats))
                finally:
                    self._inbox.clear()
        finally:
            self._close_publisher(every=True)
        return self.stats

    def _consume(self, idle_timeout: float | None, outage: _Outage) -> None:
        with self.app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            # The service consumes raw py-amqp deliveries: amqp:// brokers only.
            channel = cast(AMQPChannel, conn.channel())
            # py-amqp decodes a body with a content_encoding to text; the graveyard keeps bytes.
            channel.auto_decode = False
            queue = service_queue(
                self.config.service_queue, self.config.exchange, quorum=self.config.quorum
            )
            try:
                queue(channel).declare()
            except PreconditionFailed as exc:
                raise TopologyError(
                    f"the DLX service queue {self.config.service_queue!r} exists with other "
                    f"arguments (dlx_service_queue, dlx_quorum): {exc}"
                ) from exc
            # A dead letter whose message_id or header names are not UTF-8 must not kill us.
            install_tolerant_properties()
            # Raw deliveries (amqp.Message): nothing is decoded, and no per-message wrapper.
            channel.basic_qos(0, self.prefetch, False)
            channel.basic_consume(self.config.service_queue, callback=self._inbox.append)
            outage.end()
            logger.info(
                "DLX service consuming %s (prefetch %d)", self.config.service_queue, self.prefetch
            )
            self._loop(conn, idle_timeout)

    def _loop(self, conn: Connection, idle_timeout: float | None) -> None:
        """Receive and ack on this thread while helper threads settle the batches in hand.

        The connection stays on this thread (it is not thread-safe). Settling is mostly Redis
        and publisher I/O, so receiving overlaps it, and two batches settle at once (one waits
        for Redis while the other runs). Batches are acked in the order they arrived, each with
        one ``basic.ack(multiple)``, and only once every earlier batch is acked too.
        """
        pending: deque[tuple[list[amqp.Message], Future[bool]]] = deque()
        with ThreadPoolExecutor(SETTLERS, thread_name_prefix="celery_dlx-settle") as helpers:
            while True:
                while pending and (pending[0][1].done() or self._stop.is_set()):
                    batch, settled = pending.popleft()
                    if not settled.result():  # at a stop, the batches in hand finish first
                        return  # stopped mid-outage: this and later batches stay unacked
                    _ack_all(batch)
                    self._idle_since = time.monotonic()
                    self._maybe_sweep()
                if self._stop.is_set():
                    return
                while len(pending) < SETTLERS and self._inbox:
                    batch = self._inbox[: self.batch_limit]
                    del self._inbox[: self.batch_limit]
                    pending.append((batch, helpers.submit(self._process, batch)))
                busy = bool(pending) or bool(self._inbox)
                try:
                    conn.drain_events(timeout=BATCH_WAIT if busy else IDLE_POLL)
                except TimeoutError:
                    conn.heartbeat_check()
                    if not busy and self._idle(idle_timeout):
                        return

    def _idle(self, idle_timeout: float | None) -> bool:
        """Idle work; True when the service has been idle for ``idle_timeout`` (and stops)."""
        self._maybe_sweep()
        if idle_timeout is not None and time.monotonic() - self._idle_since > idle_timeout:
            logger.info("DLX service idle for %ss: stopping", idle_timeout)
            self.stop()
            return True
        return False

    def _process(self, batch: list[amqp.Message]) -> bool:
        """Settle ``batch``, retrying while Redis or the publisher is down.

        Returns:
            True once settled (it may be acked); False if the service stopped first.
        """
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
        except RedisError as exc:
            if not self._sweep_failing:  # once per outage, not once a minute
                logger.warning(
                    "DLX service: graveyard retention sweep failed (%s); retried every %ds",
                    exc,
                    int(SWEEP_INTERVAL),
                )
            self._sweep_failing = True
        else:
            self._sweep_failing = False

    # -- one batch ---------------------------------------------------------------------------

    def handle(self, messages: Sequence[amqp.Message]) -> None:
        """Give every dead letter of ``messages`` (kombu messages) its fate, then ack them.

        Raises:
            redis.RedisError, PublishError, OSError...: a write failed; nothing was acked.
        """
        self.settle(messages)
        _ack_all(messages)

    def settle(self, messages: Sequence[amqp.Message]) -> None:
        """Give every dead letter of ``messages`` its fate (everything but the ack).

        Idempotent: run again on the same messages after a failure, it gives no second fate.
        Touches no broker channel of the messages, so it may run on another thread.

        Raises:
            redis.RedisError, PublishError, OSError...: a write failed; ack none of them.
        """
        now = now_ms()
        works = [_Work(m, self._read(m)) for m in messages]
        self._lookup(works)
        live = [w for w in works if not w.duplicate]
        for w in live:
            w.verdict = self._decide(w, now)
        requeues = [w for w in live if isinstance(w.verdict, RequeueVerdict)]
        self._requeue(requeues, now)
        if requeues:
            faults.point("service.published")
        self._park([w for w in live if isinstance(w.verdict, ParkVerdict)], now)
        retried = [_retry_event(w, now) for w in live if not isinstance(w.verdict, BuryVerdict)]
        self.runtime.record_many(retried)
        burials = self._bury([w for w in live if isinstance(w.verdict, BuryVerdict)], now)
        if burials:
            faults.point("service.buried")
        # The buried entries went to the history with the obituaries, atomically.
        self.runtime.record_many([event for _, event in burials], history=False)
        for ob, _ in burials:
            send_to_hook(self.app, self.config.obituary_task, ob)
        self._mark_seen(live)
        self._count(live, len(works) - len(live))

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
            buried=kinds[BuryVerdict],
            parked=kinds[ParkVerdict],
            requeued=kinds[RequeueVerdict],
        )
        if duplicates:
            logger.info(
                "DLX service acked %d redelivered dead letter(s) handled before", duplicates
            )

    def _read(self, message: amqp.Message) -> DeadLetter:
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
            name = self._channel_names.setdefault(message.channel, uuid.uuid4().hex)
        except TypeError:  # no channel, or one that takes no weak reference
            return uuid.uuid4().hex
        return f"{name}:{tag}" if tag is not None else uuid.uuid4().hex

    def _seen_key(self, letter: DeadLetter) -> str:
        return self.runtime.keys.seen(letter.key)

    def _lookup(self, works: list[_Work]) -> None:
        """Which letters were handled before, and the worker's cause records: two MGETs."""
        seen, records = mget_many(
            self.runtime.redis,
            [self._seen_key(w.letter) for w in works],
            [self.runtime.keys.cause(w.letter.identity) for w in works],
        )
        for w, marker, record in zip(works, seen, records, strict=True):
            w.duplicate = marker is not None
            w.record = CauseRecord.from_json(record)

    def _decide(self, work: _Work, now: int) -> Verdict:
        try:
            return decide_letter(work.letter, self.config, work.record, now)
        except Exception as exc:  # a letter nobody foresaw is buried with the reason, never lost
            logger.exception("DLX service could not decide dead letter %s", work.letter.identity)
            why = f"undecodable: {type(exc).__name__}: {exc}"
            return bury_verdict(work.letter, self.config, why, now, failed=False)

    @property
    def publisher(self) -> ConfirmingPublisher:
        """This thread's confirm-mode publisher, on its own connection."""
        found: ConfirmingPublisher | None = getattr(self._local, "publisher", None)
        if found is None:
            conn = self.app.connection_for_write()
            found = ConfirmingPublisher(conn)
            self._local.publisher = found
            with self._publishers_lock:
                self._publishers.append((found, conn))
        return found

    def _close_publisher(self, *, every: bool = False) -> None:
        """Close this thread's publisher (after an error), or every thread's (at the end)."""
        with self._publishers_lock:
            mine = getattr(self._local, "publisher", None)
            closing = [p for p in self._publishers if every or p[0] is mine]
            self._publishers = [p for p in self._publishers if p not in closing]
        self._local.publisher = None
        for publisher, conn in closing:
            publisher.close()
            try:
                conn.release()
            except Exception:  # a dead connection may fail to close
                logger.debug("releasing a DLX service publisher connection failed", exc_info=True)

    def _requeue(self, works: list[_Work], now: int) -> None:
        if not works:
            return
        copies = []
        for w in works:
            assert isinstance(w.verdict, RequeueVerdict)
            copies.append(
                Outgoing(
                    body=w.letter.body,
                    routing_key=w.letter.queue,
                    exchange="",
                    headers=w.letter.copy_headers(w.verdict.state),
                    properties=copy_properties(w.letter.properties),
                )
            )
        for w, ok in zip(works, self.publisher.publish_many(copies), strict=True):
            if not ok:
                why = f"requeue to {w.letter.queue!r} refused by the broker (queue missing?)"
                w.verdict = bury_verdict(w.letter, self.config, why, now, failed=True)

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
        if self.runtime.broker_delays:
            self._park_in_ladder(entries)
            return
        store = BatchParkingStore(self.runtime.redis, self.runtime.keys)
        for w, entry, stored in zip(works, entries, store.park_many(entries), strict=True):
            if not stored:
                self._park_taken(store, entry, w.letter, now)

    def _park_in_ladder(self, entries: list[ParkedMessage]) -> None:
        """``dlx_delay_backend = "ttl"``: publish the retries to their delay queues (confirmed).

        No entry id to dedup against: a batch settled twice (a crash before its ack) parks its
        retries twice, the at-least-once the seen markers otherwise narrow.
        """
        self.runtime.ladder.park_many(self.publisher, entries)

    def _park_taken(
        self, store: ParkingStore, parked: ParkedMessage, letter: DeadLetter, now: int
    ) -> None:
        """Park, idempotently, a letter whose entry id was taken; maybe under a more specific id.

        The store's entry id is message id + attempt. It may already be held by this very dead
        letter (a redelivery after a crash: done), by the same message dead in another queue (a
        fanout copy), or by the entry this letter was drained from, not yet deleted (an expired
        message keeps its attempt). The last two must not swallow this letter.
        """
        if self._parked_by_this_letter(parked.entry_id, letter):
            return
        base = parked.message_id
        for candidate in (f"{base}@{letter.queue}", f"{base}@{letter.queue}~{now}"):
            parked.message_id = candidate
            if store.park(parked) or self._parked_by_this_letter(parked.entry_id, letter):
                return
        raise RuntimeError(f"parking {parked.entry_id} failed: every entry id is taken")

    def _parked_by_this_letter(self, entry_id: str, letter: DeadLetter) -> bool:
        raw = self.runtime.redis.hget(self.runtime.keys.parked_meta, entry_id)
        if raw is None:
            return False  # the entry left meanwhile (drained): park under the next id
        try:
            existing = ParkedMessage.from_stored(raw, b"")
            history = read_state({HISTORY_HEADER: existing.headers.get(HISTORY_HEADER)}).history
        except Exception:  # an unreadable entry is not ours
            return False
        # The entry this letter was drained from carries exactly the letter's history.
        return existing.queue == letter.queue and history != letter.state.history

    def _bury(self, works: list[_Work], now: int) -> list[tuple[Obituary, FateEvent]]:
        items = []
        for w in works:
            verdict = w.verdict
            assert isinstance(verdict, BuryVerdict)
            ob = build_obituary(
                w.letter,
                verdict,
                buried_ms=now,
                code_version=self.config.code_version,
                hostname=self.hostname,
            )
            items.append((ob, buried_event(ob)))
        written = Graveyard(self.runtime.redis, self.runtime.keys).write_many(items)
        # An obituary already there (a redelivery, or a second copy of the message a crash left
        # behind) is neither written nor announced again.
        return [item for item, new in zip(items, written, strict=True) if new]

    def _mark_seen(self, works: list[_Work]) -> None:
        if works:
            script = self.runtime.redis.register_script(_MARK_SEEN)
            script(keys=[self._seen_key(w.letter) for w in works], args=[SEEN_TTL_MS])


def run_service(
    app: Celery,
    *,
    prefetch: int | None = None,
    idle_timeout: float | None = None,
    processes: int = 1,
    install_signals: bool = True,
    on_start: Callable[[DLXService], None] | None = None,
) -> ServiceStats:
    """Run the DLX service until SIGTERM/SIGINT (or ``idle_timeout``), in ``processes`` processes.

    One process runs in this thread. More are forked children (one Python process handles a few
    thousand dead letters a second; instances share the queue and dedup each other's
    redeliveries); the parent forwards the signal and returns their summed counts. A signal lets
    every process finish and ack the batches in hand.

    Raises:
        DLXError: ``processes`` above 1 where ``fork`` is unavailable, or below 1.
    """
    if processes < 1:
        raise DLXError(f"the DLX service needs at least one process (--processes), got {processes}")
    if processes > 1:
        return _run_processes(app, processes, prefetch=prefetch, idle_timeout=idle_timeout)
    service = DLXService(app, prefetch=prefetch)
    if install_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: service.stop())
    if on_start is not None:
        on_start(service)
    stats = service.run(idle_timeout=idle_timeout)
    logger.info("DLX service stopped: %s", stats.as_dict())
    return stats


def _child(app: Celery, prefetch: int | None, idle_timeout: float | None, out: Any) -> None:
    stats = run_service(app, prefetch=prefetch, idle_timeout=idle_timeout)
    out.put(stats.as_dict())


def _run_processes(
    app: Celery, processes: int, *, prefetch: int | None, idle_timeout: float | None
) -> ServiceStats:
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        raise DLXError("--processes above 1 needs fork; run several `celery dlx service` instead")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = [
        ctx.Process(target=_child, args=(app, prefetch, idle_timeout, out), daemon=False)
        for _ in range(processes)
    ]
    for child in children:
        child.start()

    def forward(signum: int, _: Any) -> None:
        for child in children:
            if child.pid is not None and child.is_alive():
                os.kill(child.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    total = ServiceStats(processes=0)
    try:
        for child in children:
            child.join()
        while not out.empty():
            total.add(**out.get())
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    failed = [c.exitcode for c in children if c.exitcode != 0]
    if failed:
        raise DLXError(f"DLX service processes failed (exit codes {failed}); see their logs")
    return total
