"""The graveyard: obituaries of buried messages in Redis, listed and grouped without consuming them.

Layout, every key under ``keys.graveyard(...)`` (so under the ``{prefix}`` hash tag, one Redis
Cluster slot):

==========================  ================================================================
key                         content
==========================  ================================================================
``records``                 hash: obituary id -> JSON record (:meth:`Obituary.record`)
``payloads``                hash: obituary id -> raw payload bytes
``time``                    zset: obituary id -> burial time (ms)
``queue:<queue>``           zset: ids of one queue, by burial time
``task:<task>``             zset: ids of one Celery task, by burial time
``cause:<fingerprint>``     zset: ids of one cause, by burial time
``message:<message id>``    zset: ids of one message (it may be buried again after a replay)
``group:<fingerprint>``     hash: cause summary (queue, task, exc type and message, example id,
                            first and last seen, lifetime total)
``groups`` / ``queues`` /   zsets: fingerprints / queue names / task names -> last burial (ms)
``tasks``
==========================  ================================================================

An obituary and its ``buried`` history entry are written by one Lua script, idempotently by id;
an obituary leaves (purge, retention) by one Lua script that appends its whole JSON to the failure
history first, so nothing is evicted silently. The replay ledger (``keys.replay_ledger``) maps an
obituary id to the times it was replayed.

The plain functions at the bottom (``list_obituaries``, ``get_obituary``, ``groups``, ``replay``,
``purge``, ``sweep_retention``) take a :class:`~celery_dlx.worker.runtime.Runtime` and return data; the
command line sits on them.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery_dlx.broker.publish import Outgoing, copy_properties
from celery_dlx.errors import DLXError, PublishError
from celery_dlx.fates import ARCHIVED, PURGED, REPLAYED, FateEvent, now_ms
from celery_dlx.message.headers import clean_headers
from celery_dlx.message.names import OWN_HEADERS, REPLAYED_HEADER, Keys
from celery_dlx.message.obituary import Obituary
from celery_dlx.store.history import history_fields
from celery_dlx.store.parking import run_script_many

logger = logging.getLogger(__name__)

#: Obituaries loaded per round trip when listing, replaying, purging or sweeping.
CHUNK = 100

# KEYS: records payloads time queue task cause message group groups queues tasks history causerec
# ARGV: id score record payload facts, facts = JSON [queue, task, cause, exc_type, exc_message,
# history field, value, ...] (one argument instead of thirty: packing arguments costs the client).
# Writes nothing and returns 0 when the id is there already (a redelivered dead letter).
_WRITE = """
redis.call('DEL', KEYS[13])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
local f = cjson.decode(ARGV[5])
local id, at, queue, task, cause = ARGV[1], ARGV[2], f[1], f[2], f[3]
redis.call('HSET', KEYS[1], id, ARGV[3])
redis.call('HSET', KEYS[2], id, ARGV[4])
redis.call('ZADD', KEYS[3], at, id)
redis.call('ZADD', KEYS[4], at, id)
redis.call('ZADD', KEYS[10], 'GT', at, queue)
if task ~= '' then
  redis.call('ZADD', KEYS[5], at, id)
  redis.call('ZADD', KEYS[11], 'GT', at, task)
end
redis.call('ZADD', KEYS[6], at, id)
redis.call('ZADD', KEYS[7], at, id)
redis.call('HSET', KEYS[8], 'cause', cause, 'queue', queue, 'task', task,
  'exc_type', f[4], 'exc_message', f[5], 'example', id, 'last_ms', at)
redis.call('HSETNX', KEYS[8], 'first_ms', at)
redis.call('HINCRBY', KEYS[8], 'total', 1)
redis.call('ZADD', KEYS[9], 'GT', at, cause)
redis.call('XADD', KEYS[12], '*', unpack(f, 6))
return 1
"""

# KEYS: records payloads time queue task cause message group groups queues tasks history ledger
# ARGV: id queue task cause <history field pairs...>
# Appends the history entry and deletes the obituary and its index entries; 0 if already gone.
_REMOVE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[12], '*', unpack(ARGV, 5))
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[13], ARGV[1])
for i = 3, 7 do redis.call('ZREM', KEYS[i], ARGV[1]) end
if redis.call('ZCARD', KEYS[6]) == 0 then
  redis.call('DEL', KEYS[8])
  redis.call('ZREM', KEYS[9], ARGV[4])
end
if redis.call('ZCARD', KEYS[4]) == 0 then redis.call('ZREM', KEYS[10], ARGV[2]) end
if ARGV[3] ~= '' and redis.call('ZCARD', KEYS[5]) == 0 then
  redis.call('ZREM', KEYS[11], ARGV[3])
end
return 1
"""


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _flat(fields: dict[str, str]) -> list[str]:
    return [item for pair in fields.items() for item in pair]


@dataclass
class Group:
    """The obituaries of one cause fingerprint still in the graveyard.

    ``count`` is how many are there now, ``total`` how many were ever buried with this cause
    since the group was last empty; ``example_id`` is the latest obituary.
    """

    cause: str
    count: int
    total: int
    first_ms: int
    last_ms: int
    example_id: str
    exc_type: str
    exc_message: str
    task: str | None
    queue: str


@dataclass
class Filters:
    """Which obituaries an operation applies to; every given filter must match."""

    queue: str | None = None
    task: str | None = None
    cause: str | None = None
    message_id: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None

    def empty(self) -> bool:
        given = (self.queue, self.task, self.cause, self.message_id, self.since_ms, self.until_ms)
        return all(v is None for v in given)

    def matches(self, ob: Obituary) -> bool:
        return (
            (self.queue is None or ob.queue == self.queue)
            and (self.task is None or ob.task == self.task)
            and (self.cause is None or ob.cause == self.cause)
            and (self.message_id is None or ob.message_id == self.message_id)
        )


class Graveyard:
    """Obituary storage over a Redis client (bytes responses) and a key layout.

    Args:
        client: ``redis.Redis`` or ``RedisCluster``.
        keys: the key layout (prefix).
    """

    def __init__(self, client: Any, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        self.records = keys.graveyard("records")
        self.payloads = keys.graveyard("payloads")
        self.by_time = keys.graveyard("time")
        self.groups_key = keys.graveyard("groups")
        self.queues_key = keys.graveyard("queues")
        self.tasks_key = keys.graveyard("tasks")
        self._write = client.register_script(_WRITE)
        self._remove = client.register_script(_REMOVE)

    def by_queue(self, queue: str) -> str:
        return self.keys.graveyard(f"queue:{queue}")

    def by_task(self, task: str) -> str:
        return self.keys.graveyard(f"task:{task}")

    def by_cause(self, cause: str) -> str:
        return self.keys.graveyard(f"cause:{cause}")

    def by_message(self, message_id: str) -> str:
        return self.keys.graveyard(f"message:{message_id}")

    def group_key(self, cause: str) -> str:
        return self.keys.graveyard(f"group:{cause}")

    def _index_keys(self, ob: Obituary) -> list[str]:
        return [
            self.records,
            self.payloads,
            self.by_time,
            self.by_queue(ob.queue),
            self.by_task(ob.task or ""),
            self.by_cause(ob.cause),
            self.by_message(ob.message_id),
            self.group_key(ob.cause),
            self.groups_key,
            self.queues_key,
            self.tasks_key,
            self.keys.history,
        ]

    def write_many(self, items: Sequence[tuple[Obituary, FateEvent]]) -> list[bool]:
        """Write obituaries with their ``buried`` history entries, in one round trip.

        The worker's cause record of each message is deleted in the same script.

        Returns:
            Per obituary, True if it was written now, False if it was there already.
        """
        if not items:
            return []
        calls = []
        for ob, event in items:
            facts = [ob.queue, ob.task or "", ob.cause, ob.exc_type, ob.exc_message[:500]]
            facts.extend(_flat(history_fields(event)))
            args = [ob.id, ob.buried_ms, ob.record_json(), ob.payload or b"", json.dumps(facts)]
            calls.append(([*self._index_keys(ob), self.keys.cause(ob.message_id)], args))
        return [bool(r) for r in run_script_many(self.client, self._write, calls)]

    def remove(self, ob: Obituary, event: FateEvent) -> bool:
        """Append ``event`` to the history and delete ``ob``, atomically; False if it was gone."""
        keys = [*self._index_keys(ob), self.keys.replay_ledger]
        args = [ob.id, ob.queue, ob.task or "", ob.cause, *_flat(history_fields(event))]
        return bool(self._remove(keys=keys, args=args))

    def load(self, ids: Sequence[str], *, with_payload: bool = False) -> list[Obituary | None]:
        """The obituaries of ``ids`` (None where missing or unreadable), in order."""
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.records, list(ids))
        pipe.hmget(self.keys.replay_ledger, list(ids))
        if with_payload:
            pipe.hmget(self.payloads, list(ids))
        results = pipe.execute()
        payloads = results[2] if with_payload else [None] * len(ids)
        out: list[Obituary | None] = []
        for oid, raw, ledger, body in zip(ids, results[0], results[1], payloads, strict=True):
            if raw is None:
                out.append(None)
                continue
            try:
                ob = Obituary.from_record(raw, body if with_payload else None)
            except (ValueError, TypeError):
                logger.error("obituary %s has an unreadable record; left in place", oid)
                out.append(None)
                continue
            ob.replays = _ledger_times(ledger)
            out.append(ob)
        return out

    def ids(self, filters: Filters, *, limit: int | None, oldest_first: bool = False) -> list[str]:
        """Obituary ids matching ``filters``, newest first unless ``oldest_first``."""
        index = self._driving_index(filters)
        low = "-inf" if filters.since_ms is None else filters.since_ms
        high = "+inf" if filters.until_ms is None else filters.until_ms
        needs_check = _needs_post_filter(filters)
        out: list[str] = []
        offset = 0
        page = CHUNK if limit is None else max(CHUNK, limit)
        while limit is None or len(out) < limit:
            if oldest_first:
                raw = self.client.zrangebyscore(index, low, high, start=offset, num=page)
            else:
                raw = self.client.zrevrangebyscore(index, high, low, start=offset, num=page)
            if not raw:
                break
            offset += len(raw)
            found = [_text(r) for r in raw]
            if needs_check:
                obits = self.load(found)
                found = [ob.id for ob in obits if ob is not None and filters.matches(ob)]
            out.extend(found)
            if len(raw) < page:
                break
        return out if limit is None else out[:limit]

    def _driving_index(self, filters: Filters) -> str:
        if filters.message_id is not None:
            return self.by_message(filters.message_id)
        if filters.cause is not None:
            return self.by_cause(filters.cause)
        if filters.task is not None:
            return self.by_task(filters.task)
        if filters.queue is not None:
            return self.by_queue(filters.queue)
        return self.by_time

    def count(self) -> int:
        return int(self.client.zcard(self.by_time))

    def groups(self) -> list[Group]:
        """Every cause still in the graveyard, most recently seen first."""
        causes = [_text(c) for c in self.client.zrevrange(self.groups_key, 0, -1)]
        if not causes:
            return []
        pipe = self.client.pipeline(transaction=False)
        for cause in causes:
            index = self.by_cause(cause)
            pipe.hgetall(self.group_key(cause))
            pipe.zcard(index)
            pipe.zrange(index, 0, 0, withscores=True)
            pipe.zrevrange(index, 0, 0, withscores=True)
        results = pipe.execute()
        out = []
        for i, cause in enumerate(causes):
            info, count, first, last = results[4 * i : 4 * i + 4]
            if not count or not first or not last:
                continue
            meta = {_text(k): _text(v) for k, v in info.items()}
            out.append(
                Group(
                    cause=cause,
                    count=int(count),
                    total=int(meta.get("total") or count),
                    first_ms=int(first[0][1]),
                    last_ms=int(last[0][1]),
                    example_id=_text(last[0][0]),
                    exc_type=meta.get("exc_type", ""),
                    exc_message=meta.get("exc_message", ""),
                    task=meta.get("task") or None,
                    queue=meta.get("queue", ""),
                )
            )
        return out

    def names(self, kind: str) -> list[tuple[str, int, int]]:
        """``(name, obituaries, last burial ms)`` per queue (``kind="queue"``) or task."""
        key, index = (
            (self.queues_key, self.by_queue) if kind == "queue" else (self.tasks_key, self.by_task)
        )
        rows = [(_text(n), int(s)) for n, s in self.client.zrevrange(key, 0, -1, withscores=True)]
        pipe = self.client.pipeline(transaction=False)
        for name, _ in rows:
            pipe.zcard(index(name))
        counts = pipe.execute() if rows else []
        return [(n, int(c), s) for (n, s), c in zip(rows, counts, strict=True) if c]

    def add_replays(self, replayed: Sequence[tuple[str, int]]) -> None:
        """Add replay times to the ledger (read-modify-write: an operator's record, not a lock)."""
        if not replayed:
            return
        ids = [oid for oid, _ in replayed]
        current = self.client.hmget(self.keys.replay_ledger, ids)
        mapping = {}
        for (oid, at), raw in zip(replayed, current, strict=True):
            mapping[oid] = json.dumps({"replays": [*_ledger_times(raw), at]})
        self.client.hset(self.keys.replay_ledger, mapping=mapping)


def _ledger_times(raw: Any) -> list[int]:
    if raw is None:
        return []
    try:
        data = json.loads(raw)
        return [int(t) for t in data.get("replays", [])]
    except (ValueError, TypeError, AttributeError):
        return []


def _needs_post_filter(filters: Filters) -> bool:
    given = [f for f in (filters.message_id, filters.cause, filters.task, filters.queue) if f]
    return len(given) > 1


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


#: What ``since`` and ``until`` accept: a datetime, a timedelta (that long ago), or epoch seconds.
When = datetime | timedelta | float | int


def to_ms(value: When | None, *, now: int | None = None) -> int | None:
    """Epoch milliseconds of a ``since``/``until`` value.

    Raises:
        DLXError: the value is none of datetime, timedelta or epoch seconds.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, timedelta):
        return (now_ms() if now is None else now) - int(value.total_seconds() * 1000)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value * 1000)
    raise DLXError(f"since/until must be a datetime, a timedelta or epoch seconds, got {value!r}")


def make_filters(
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    message_id: str | None = None,
    since: When | None = None,
    until: When | None = None,
) -> Filters:
    """A :class:`Filters` from the keyword filters every function here accepts."""
    return Filters(queue, task, cause, message_id, to_ms(since), to_ms(until))


def _graveyard(runtime: Any) -> Graveyard:
    return Graveyard(runtime.redis, runtime.keys)


def list_obituaries(
    runtime: Any,
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    message_id: str | None = None,
    since: When | None = None,
    until: When | None = None,
    limit: int | None = 100,
    oldest_first: bool = False,
    with_payload: bool = False,
) -> list[Obituary]:
    """Obituaries matching every given filter, newest first, without consuming anything.

    Args:
        runtime: the app's :class:`~celery_dlx.worker.runtime.Runtime`.
        queue, task, cause, message_id: exact matches.
        since, until: burial time bounds (datetime, timedelta ago, or epoch seconds).
        limit: most obituaries returned (None: all).
        with_payload: load the payload bytes too (the listing leaves them out by default).
    """
    filters = make_filters(
        queue=queue, task=task, cause=cause, message_id=message_id, since=since, until=until
    )
    yard = _graveyard(runtime)
    ids = yard.ids(filters, limit=limit, oldest_first=oldest_first)
    out: list[Obituary] = []
    for chunk in _chunks(ids, CHUNK):
        out.extend(ob for ob in yard.load(chunk, with_payload=with_payload) if ob is not None)
    return out


def get_obituary(runtime: Any, ident: str, *, with_payload: bool = True) -> Obituary | None:
    """One obituary by its id, or the latest obituary of a message id; None if there is none."""
    yard = _graveyard(runtime)
    found = yard.load([ident], with_payload=with_payload)[0]
    if found is not None:
        return found
    latest = yard.client.zrevrange(yard.by_message(ident), 0, 0)
    if not latest:
        return None
    return yard.load([_text(latest[0])], with_payload=with_payload)[0]


def groups(runtime: Any) -> list[Group]:
    """The graveyard grouped by cause fingerprint, most recently seen first."""
    return _graveyard(runtime).groups()


def queues(runtime: Any) -> list[tuple[str, int, int]]:
    """``(queue, obituaries, last burial ms)`` for every queue with obituaries."""
    return _graveyard(runtime).names("queue")


def count(runtime: Any) -> int:
    """How many obituaries the graveyard holds."""
    return _graveyard(runtime).count()


def _targets(
    runtime: Any, ids: Sequence[str] | None, filters: Filters, everything: bool, what: str
) -> list[str]:
    if ids:
        return list(dict.fromkeys(ids))
    if filters.empty() and not everything:
        raise DLXError(f"{what} needs obituary ids or a filter (queue, task, cause, since...)")
    return _graveyard(runtime).ids(filters, limit=None, oldest_first=True)


@dataclass
class ReplayReport:
    """What :func:`replay` did (or would do, on a dry run)."""

    replayed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dry_run: bool = False


def replay_copy(ob: Obituary, *, keep_attempts: bool = False) -> Outgoing:
    """The message to publish for a replay of ``ob``: its payload to its queue, default exchange.

    celery_dlx's attempt headers are dropped (a fresh budget) unless ``keep_attempts``; broker
    ``x-death*`` headers always are. ``x-dlx-replayed`` names the obituary.
    """
    headers = clean_headers(ob.headers)
    if not keep_attempts:
        headers = {k: v for k, v in headers.items() if k not in OWN_HEADERS}
    headers[REPLAYED_HEADER] = ob.id
    return Outgoing(
        body=ob.payload or b"",
        routing_key=ob.queue,
        exchange="",
        headers=headers,
        properties=copy_properties(ob.properties),
    )


def _replayed_event(ob: Obituary, keep_attempts: bool, force: bool, at: int) -> FateEvent:
    return FateEvent(
        fate=REPLAYED,
        queue=ob.queue,
        message_id=ob.message_id,
        attempt=ob.attempt if keep_attempts else 0,
        task=ob.task,
        cause=ob.cause,
        exc_type=ob.exc_type,
        reason=f"replayed from obituary {ob.id}",
        importance=ob.importance,
        first_failure_ms=ob.first_failure_ms,
        at_ms=at,
        extra={"obituary_id": ob.id, "keep_attempts": keep_attempts, "forced": force},
    )


class _Pacer:
    """Spaces operations to at most ``rate`` per second (None: no limit)."""

    def __init__(self, rate: float | None, sleep: Callable[[float], None] = time.sleep) -> None:
        if rate is not None and rate <= 0:
            raise DLXError(f"replay rate must be a positive number per second, got {rate}")
        self.rate = rate
        self.sleep = sleep
        self.start = time.monotonic()
        self.done = 0

    def wait(self, n: int) -> None:
        if self.rate is not None:
            ahead = self.start + self.done / self.rate - time.monotonic()
            if ahead > 0:
                self.sleep(ahead)
        self.done += n

    def chunk(self) -> int:
        return CHUNK if self.rate is None else max(1, min(CHUNK, int(self.rate / 10) or 1))


def replay(
    runtime: Any,
    ids: Sequence[str] | None = None,
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    since: When | None = None,
    until: When | None = None,
    everything: bool = False,
    rate: float | None = None,
    keep_attempts: bool = False,
    force: bool = False,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
) -> ReplayReport:
    """Put buried messages back on their queues (default exchange, publisher confirms).

    Each obituary is replayed once: one already in the replay ledger is skipped unless
    ``force``. The obituary stays in the graveyard; a ``replayed`` fate is recorded.

    Args:
        runtime: the app's runtime (its publisher and Redis are used).
        ids: obituary ids; otherwise the filters (``cause`` replays one group) select them.
        everything: allow replaying the whole graveyard when neither ids nor filters are given.
        rate: most replays per second (None: as fast as the broker confirms).
        keep_attempts: keep celery_dlx's attempt headers instead of a fresh budget.
        force: replay obituaries already replayed.
        dry_run: report what would be replayed, publish and record nothing.
        progress: called with the number of obituaries handled after each chunk.

    Raises:
        DLXError: neither ids nor a filter (without ``everything``), or a bad ``rate``.
    """
    filters = make_filters(queue=queue, task=task, cause=cause, since=since, until=until)
    targets = _targets(runtime, ids, filters, everything, "replay")
    yard = _graveyard(runtime)
    pacer = _Pacer(rate)
    report = ReplayReport(dry_run=dry_run)
    for chunk in _chunks(targets, pacer.chunk()):
        todo: list[Obituary] = []
        for oid, ob in zip(chunk, yard.load(chunk, with_payload=True), strict=True):
            if ob is None:
                report.missing.append(oid)
            elif ob.replays and not force:
                report.skipped.append((oid, f"already replayed at {ob.replays[-1]} ms (use force)"))
            else:
                todo.append(ob)
        if dry_run:
            report.replayed.extend(ob.id for ob in todo)
        elif todo:
            pacer.wait(len(todo))
            _replay_chunk(runtime, yard, todo, keep_attempts, force, report)
        if progress is not None:
            progress(len(chunk))
    return report


def _replay_chunk(
    runtime: Any,
    yard: Graveyard,
    todo: list[Obituary],
    keep_attempts: bool,
    force: bool,
    report: ReplayReport,
) -> None:
    copies = [replay_copy(ob, keep_attempts=keep_attempts) for ob in todo]
    try:
        results = runtime.publisher.publish_many(copies)
    except (PublishError, OSError) as exc:
        runtime.reset_publisher()
        report.failed.extend((ob.id, f"not confirmed: {exc}") for ob in todo)
        return
    at = now_ms()
    done = [ob for ob, ok in zip(todo, results, strict=True) if ok]
    report.failed.extend(
        (ob.id, f"broker refused it: queue {ob.queue!r} missing?")
        for ob, ok in zip(todo, results, strict=True)
        if not ok
    )
    yard.add_replays([(ob.id, at) for ob in done])
    for ob in done:
        runtime.record(_replayed_event(ob, keep_attempts, force, at))
        report.replayed.append(ob.id)


@dataclass
class PurgeReport:
    """What :func:`purge` did (or would do, on a dry run)."""

    purged: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dry_run: bool = False


def _leaving_event(fate: str, ob: Obituary, reason: str, at: int) -> FateEvent:
    return FateEvent(
        fate=fate,
        queue=ob.queue,
        message_id=ob.message_id,
        attempt=ob.attempt,
        task=ob.task,
        cause=ob.cause,
        exc_type=ob.exc_type,
        exc_message=ob.exc_message,
        reason=reason,
        importance=ob.importance,
        first_failure_ms=ob.first_failure_ms,
        at_ms=at,
        extra={"obituary_id": ob.id, "obituary": ob.json_safe()},
    )


def _remove_all(
    runtime: Any, ids: Iterable[str], fate: str, reason: str, dry_run: bool
) -> tuple[list[str], list[str]]:
    yard = _graveyard(runtime)
    removed: list[str] = []
    missing: list[str] = []
    for chunk in _chunks(list(ids), CHUNK):
        for oid, ob in zip(chunk, yard.load(chunk, with_payload=not dry_run), strict=True):
            if ob is None:
                missing.append(oid)
                continue
            if dry_run:
                removed.append(oid)
                continue
            event = _leaving_event(fate, ob, reason, now_ms())
            if yard.remove(ob, event):
                runtime.record(event, history=False)
                removed.append(oid)
            else:
                missing.append(oid)
    return removed, missing


def purge(
    runtime: Any,
    ids: Sequence[str] | None = None,
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    since: When | None = None,
    until: When | None = None,
    everything: bool = False,
    dry_run: bool = False,
) -> PurgeReport:
    """Delete obituaries; each leaves a ``purged`` history entry holding its whole JSON.

    Raises:
        DLXError: neither ids nor a filter (without ``everything``).
    """
    filters = make_filters(queue=queue, task=task, cause=cause, since=since, until=until)
    targets = _targets(runtime, ids, filters, everything, "purge")
    removed, missing = _remove_all(runtime, targets, PURGED, "purged by operator", dry_run)
    return PurgeReport(purged=removed, missing=missing, dry_run=dry_run)


def sweep_retention(runtime: Any, *, now: int | None = None, limit: int = 1000) -> int:
    """Move obituaries older than ``dlx_graveyard_retention`` to the history (``archived``).

    Safe to run from several processes at once: each obituary is archived exactly once.

    Returns:
        How many obituaries were archived (at most ``limit``).
    """
    retention_ms = int(runtime.config.graveyard_retention * 1000)
    cutoff = (now_ms() if now is None else now) - retention_ms
    yard = _graveyard(runtime)
    old = [_text(i) for i in yard.client.zrangebyscore(yard.by_time, "-inf", cutoff, 0, limit)]
    reason = f"older than dlx_graveyard_retention ({runtime.config.graveyard_retention:g}s)"
    removed, _ = _remove_all(runtime, old, ARCHIVED, reason, dry_run=False)
    return len(removed)
