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
                            first and last seen, lifetime total, first and last code version)
``versions:<fingerprint>``  hash: code version -> obituaries of the cause still here ("" = unknown)
``versions``                zset: code version -> when it was first seen in this graveyard (ms);
                            kept when its obituaries leave (it orders versions for ``--new-since``)
``groups`` / ``queues`` /   zsets: fingerprints / queue names / task names -> last burial (ms)
``tasks``
==========================  ================================================================

An obituary and its ``buried`` history entry are written by one Lua script, idempotently by id;
an obituary leaves (purge, retention) by one Lua script that appends its whole JSON to the failure
history first, so nothing is evicted silently. The replay ledger (``keys.replay_ledger``) maps an
obituary id to the times it was replayed (and, under ``to``, the queue of each replay that went
elsewhere than the queue it died in).

The plain functions at the bottom (``list_obituaries``, ``get_obituary``, ``groups``, ``replay``,
``purge``, ``sweep_retention``) take a :class:`~celery_dlx.wiring.runtime.Runtime` and return data; the
command line sits on them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from celery_dlx.fates import FateEvent
from celery_dlx.message.names import Keys
from celery_dlx.message.obituary import Obituary
from celery_dlx.store.client import (
    RedisClient,
    batched_script,
    is_cluster,
    run_script_batch,
    run_script_many,
)
from celery_dlx.store.history import history_args

logger = logging.getLogger(__name__)

#: Obituaries loaded per round trip when listing, replaying, purging or sweeping.
CHUNK = 100

#: Replies per cause of :meth:`Graveyard.queue_group_reads`.
GROUP_READS = 5

# KEYS: records payloads time queue task cause message group groups queues tasks history causerec
# cause-versions versions
# ARGV: id score record payload facts version ("" = unknown), facts = JSON [queue, task, cause, exc_type, exc_message,
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
local version = ARGV[6]
-- first_version only for a group this write starts: a group older than version stats has none
if redis.call('HSETNX', KEYS[8], 'first_ms', at) == 1 then
  redis.call('HSET', KEYS[8], 'first_version', version)
end
redis.call('HSET', KEYS[8], 'cause', cause, 'queue', queue, 'task', task,
  'exc_type', f[4], 'exc_message', f[5], 'example', id, 'last_ms', at, 'last_version', version)
redis.call('HINCRBY', KEYS[14], version, 1)
redis.call('ZADD', KEYS[15], 'LT', at, version)
redis.call('HINCRBY', KEYS[8], 'total', 1)
redis.call('ZADD', KEYS[9], 'GT', at, cause)
redis.call('XADD', KEYS[12], '*', unpack(f, 6))
return 1
"""

# KEYS: records payloads time queue task cause message group groups queues tasks history ledger
# cause-versions
# ARGV: id queue task cause version <history field pairs...>
# Appends the history entry and deletes the obituary and its index entries; 0 if already gone.
_REMOVE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[12], '*', unpack(ARGV, 6))
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[13], ARGV[1])
for i = 3, 7 do redis.call('ZREM', KEYS[i], ARGV[1]) end
if redis.call('HEXISTS', KEYS[14], ARGV[5]) == 1 then
  if redis.call('HINCRBY', KEYS[14], ARGV[5], -1) <= 0 then redis.call('HDEL', KEYS[14], ARGV[5]) end
end
if redis.call('ZCARD', KEYS[6]) == 0 then
  redis.call('DEL', KEYS[8], KEYS[14])
  redis.call('ZREM', KEYS[9], ARGV[4])
end
if redis.call('ZCARD', KEYS[4]) == 0 then redis.call('ZREM', KEYS[10], ARGV[2]) end
if ARGV[3] ~= '' and redis.call('ZCARD', KEYS[5]) == 0 then
  redis.call('ZREM', KEYS[11], ARGV[3])
end
return 1
"""

# The same scripts for one queue's shard (:mod:`celery_dlx.store.sharded_graveyard`): the history
# stream and the worker's cause record live under the app's tag, another slot, so these leave
# them to the caller (KEYS[12] and KEYS[13] are then any key of the shard's slot, never touched).
_WRITE_SHARD = _WRITE.replace("redis.call('DEL', KEYS[13])\n", "").replace(
    "redis.call('XADD', KEYS[12], '*', unpack(f, 6))\n", ""
)
_REMOVE_SHARD = _REMOVE.replace("redis.call('XADD', KEYS[12], '*', unpack(ARGV, 6))\n", "")


def text(value: object) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


@dataclass
class Group:
    """The obituaries of one cause fingerprint still in the graveyard.

    ``count`` is how many are there now, ``total`` how many were ever buried with this cause
    since the group was last empty; ``example_id`` is the latest obituary.

    ``first_seen_ms``, ``first_version`` and ``last_version`` are the time and code versions of
    the first and latest burial since the group was last empty (None for a group started before
    version stats were kept); ``versions`` counts the obituaries still here per code version,
    ``""`` for those buried without one.
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
    first_seen_ms: int | None = None
    first_version: str | None = None
    last_version: str | None = None
    versions: dict[str, int] = field(default_factory=dict)


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
        tag: the hash tag of one queue's bucket (``{prefix:q:QUEUE:BUCKET}``,
            :mod:`celery_dlx.store.sharded_graveyard`): the graveyard keys and the replay
            ledger go under it, and the scripts leave the history and the worker's cause record
            (under the app's tag) to the caller. None: the single-tag layout above.
    """

    def __init__(self, client: RedisClient, keys: Keys, *, tag: str | None = None) -> None:
        self.client = client
        self.keys = keys
        self.tag = tag
        self._base = keys.graveyard_prefix if tag is None else f"{tag}:graveyard:"
        self.ledger = keys.replay_ledger if tag is None else f"{tag}:replay:ledger"
        self.records = self._key("records")
        self.payloads = self._key("payloads")
        self.by_time = self._key("time")
        self.groups_key = self._key("groups")
        self.queues_key = self._key("queues")
        self.tasks_key = self._key("tasks")
        self.versions_key = self._key("versions")
        self._write = client.register_script(_WRITE if tag is None else _WRITE_SHARD)
        self._write_batch = client.register_script(
            batched_script(_WRITE if tag is None else _WRITE_SHARD)
        )
        self._remove = client.register_script(_REMOVE if tag is None else _REMOVE_SHARD)

    def _key(self, suffix: str) -> str:
        return f"{self._base}{suffix}"

    def by_queue(self, queue: str) -> str:
        return self._key(f"queue:{queue}")

    def by_task(self, task: str) -> str:
        return self._key(f"task:{task}")

    def by_cause(self, cause: str) -> str:
        return self._key(f"cause:{cause}")

    def by_message(self, message_id: str) -> str:
        return self._key(f"message:{message_id}")

    def group_key(self, cause: str) -> str:
        return self._key(f"group:{cause}")

    def cause_versions(self, cause: str) -> str:
        return self._key(f"versions:{cause}")

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
            self.keys.history if self.tag is None else self.records,
        ]

    def write_many(self, items: Sequence[tuple[Obituary, FateEvent]]) -> list[bool]:
        """Write obituaries with their ``buried`` history entries, in one round trip.

        The worker's cause record of each message is deleted in the same script.

        Returns:
            Per obituary, True if it was written now, False if it was there already.
        """
        if not items:
            return []
        calls = self.write_calls(items)
        if is_cluster(self.client):  # a call each, as redis-py runs scripts on a Cluster
            return [bool(r) for r in run_script_many(self.client, self._write, calls)]
        return [bool(r) for r in run_script_batch(self._write_batch, calls)]

    def write_calls(
        self, items: Sequence[tuple[Obituary, FateEvent]]
    ) -> list[tuple[list[str], list[Any]]]:
        """The ``(keys, args)`` of the burial script for each of ``items``."""
        calls = []
        for ob, event in items:
            facts = [ob.queue, ob.task or "", ob.cause, ob.exc_type, ob.exc_message[:500]]
            facts.extend(history_args(event))
            args = [
                ob.id,
                ob.buried_ms,
                ob.record_json(),
                ob.payload or b"",
                json.dumps(facts),
                ob.code_version or "",
            ]
            keys = [
                *self._index_keys(ob),
                self.keys.cause(ob.message_id) if self.tag is None else self.records,
                self.cause_versions(ob.cause),
                self.versions_key,
            ]
            calls.append((keys, args))
        return calls

    def remove(self, ob: Obituary, event: FateEvent) -> bool:
        """Append ``event`` to the history and delete ``ob``, atomically; False if it was gone."""
        keys = [*self._index_keys(ob), self.ledger, self.cause_versions(ob.cause)]
        args = [
            ob.id,
            ob.queue,
            ob.task or "",
            ob.cause,
            ob.code_version or "",
            *history_args(event),
        ]
        return bool(self._remove(keys=keys, args=args))

    def load(self, ids: Sequence[str], *, with_payload: bool = False) -> list[Obituary | None]:
        """The obituaries of ``ids`` (None where missing or unreadable), in order."""
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.records, list(ids))
        pipe.hmget(self.ledger, list(ids))
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
        index = self.driving_index(filters)
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
            found = [text(r) for r in raw]
            if needs_check:
                obits = self.load(found)
                found = [ob.id for ob in obits if ob is not None and filters.matches(ob)]
            out.extend(found)
            if len(raw) < page:
                break
        return out if limit is None else out[:limit]

    def name_key(self, kind: str) -> str:
        """The zset of ``kind`` (``groups``, ``queues`` or ``tasks``) -> last burial (ms)."""
        return self._key(kind)

    def driving_index(self, filters: Filters) -> str:
        """The index a listing under ``filters`` reads (the narrowest given)."""
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

    def older_than(self, cutoff_ms: int, limit: int) -> list[str]:
        """Ids of up to ``limit`` obituaries buried at or before ``cutoff_ms``, oldest first."""
        return [
            text(i) for i in self.client.zrangebyscore(self.by_time, "-inf", cutoff_ms, 0, limit)
        ]

    def latest_of_message(self, message_id: str) -> str | None:
        """The id of the latest obituary of ``message_id``, or None."""
        latest = self.client.zrevrange(self.by_message(message_id), 0, 0)
        return text(latest[0]) if latest else None

    def cause_names(self, offset: int, limit: int) -> tuple[int, list[str]]:
        """How many causes there are, and a page of them, most recently seen first."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.groups_key)
        pipe.zrevrange(self.groups_key, offset, offset + limit - 1)
        total, page = pipe.execute()
        return int(total), [text(c) for c in page]

    def top_causes(self, limit: int) -> list[str]:
        """The ``limit`` most recently seen causes, latest first (``groups`` is scored by each
        cause's last burial)."""
        return [text(c) for c in self.client.zrevrange(self.groups_key, 0, limit - 1)]

    def groups(self) -> list[Group]:
        """Every cause still in the graveyard, most recently seen first."""
        return self.groups_of([text(c) for c in self.client.zrevrange(self.groups_key, 0, -1)])

    def groups_of(self, causes: list[str]) -> list[Group]:
        """The :class:`Group` of each of ``causes`` still in the graveyard, in their order (one
        round trip: a page of causes never loads the others)."""
        if not causes:
            return []
        pipe = self.client.pipeline(transaction=False)
        self.queue_group_reads(pipe, causes)
        return self.groups_from(causes, pipe.execute())

    def queue_group_reads(self, pipe: Any, causes: list[str]) -> None:
        """Queue on ``pipe`` the reads :meth:`groups_from` takes (:data:`GROUP_READS` per cause)."""
        for cause in causes:
            index = self.by_cause(cause)
            pipe.hgetall(self.group_key(cause))
            pipe.zcard(index)
            pipe.zrange(index, 0, 0, withscores=True)
            pipe.zrevrange(index, 0, 0, withscores=True)
            pipe.hgetall(self.cause_versions(cause))

    def groups_from(self, causes: list[str], results: list[Any]) -> list[Group]:
        """The groups of ``causes`` from the replies of :meth:`queue_group_reads`."""
        out = []
        for i, cause in enumerate(causes):
            info, count, first, last, versions = results[GROUP_READS * i : GROUP_READS * (i + 1)]
            if not count or not first or not last:
                continue
            meta = {text(k): text(v) for k, v in info.items()}
            out.append(
                Group(
                    cause=cause,
                    count=int(count),
                    total=int(meta.get("total") or count),
                    first_ms=int(first[0][1]),
                    last_ms=int(last[0][1]),
                    example_id=text(last[0][0]),
                    exc_type=meta.get("exc_type", ""),
                    exc_message=meta.get("exc_message", ""),
                    task=meta.get("task") or None,
                    queue=meta.get("queue", ""),
                    first_seen_ms=int(meta["first_ms"]) if meta.get("first_ms") else None,
                    first_version=meta.get("first_version"),
                    last_version=meta.get("last_version"),
                    versions={text(v): int(n) for v, n in versions.items() if int(n) > 0},
                )
            )
        return out

    def version_times(self) -> dict[str, int]:
        """Every code version seen in this graveyard -> when it was first seen (ms)."""
        scored = cast(
            "list[tuple[bytes, float]]",
            self.client.zrange(self.versions_key, 0, -1, withscores=True),
        )
        return {text(v): int(ms) for v, ms in scored}

    def names(self, kind: str) -> list[tuple[str, int, int]]:
        """``(name, obituaries, last burial ms)`` per queue (``kind="queue"``) or task."""
        key, index = (
            (self.queues_key, self.by_queue) if kind == "queue" else (self.tasks_key, self.by_task)
        )
        scored = cast(
            "list[tuple[bytes, float]]", self.client.zrevrange(key, 0, -1, withscores=True)
        )
        rows = [(text(n), int(s)) for n, s in scored]
        pipe = self.client.pipeline(transaction=False)
        for name, _ in rows:
            pipe.zcard(index(name))
        counts = pipe.execute() if rows else []
        return [(n, int(c), s) for (n, s), c in zip(rows, counts, strict=True) if c]

    def add_replays(self, replayed: Sequence[tuple[str, int]], *, to_queue: str = "") -> None:
        """Add replay times to the ledger (read-modify-write: an operator's record, not a lock);
        ``to_queue``: the queue these replays were redirected to (kept per time, under ``to``)."""
        if not replayed:
            return
        ids = [oid for oid, _ in replayed]
        current = self.client.hmget(self.ledger, ids)
        mapping: dict[Any, Any] = {}
        for (oid, at), raw in zip(replayed, current, strict=True):
            entry: dict[str, Any] = {"replays": [*_ledger_times(raw), at]}
            to = {**_ledger_redirects(raw), **({str(at): to_queue} if to_queue else {})}
            if to:
                entry["to"] = to
            mapping[oid] = json.dumps(entry)
        self.client.hset(self.ledger, mapping=mapping)

    def redirects(self, ids: Sequence[str]) -> list[dict[int, str]]:
        """Per id, the ledger's redirected replays: replay time (ms) -> the queue it went to."""
        if not ids:
            return []
        raws = self.client.hmget(self.ledger, list(ids))
        return [{int(at): q for at, q in _ledger_redirects(raw).items()} for raw in raws]


def _ledger_redirects(raw: Any) -> dict[str, str]:
    try:
        to = json.loads(raw).get("to", {}) if raw is not None else {}
        return {str(int(at)): text(q) for at, q in to.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


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


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


#: What ``since`` and ``until`` accept: a datetime, a timedelta (that long ago), or epoch seconds.
When = datetime | timedelta | float | int
