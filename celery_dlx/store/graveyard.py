"""The graveyard: obituaries of buried messages in Redis, listed and grouped without consuming them.

Each shard (:mod:`celery_dlx.store.shards`: the app's tag, or a bucket of one queue) has these
keys, under ``{prefix}:graveyard:`` or ``{prefix:q:QUEUE:BUCKET}:graveyard:`` (one Redis Cluster
slot per shard):

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

An obituary is written by one Lua script, idempotently by id; an obituary leaves (purge,
retention) by one Lua script, with its history entry, so nothing leaves silently. The replay
ledger (``keys.replay_ledger``, or the bucket's ``replay:ledger``) maps an obituary id to the
times it was replayed (and, under ``to``, the queue of each replay that went elsewhere than the
queue it died in).
"""

from __future__ import annotations

import heapq
import json
import logging
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any, cast

from celery_dlx.fates import FateEvent
from celery_dlx.message.graveyard import CHUNK, DEFAULT_SHARE, RESERVE, CausePage, Filters, Group
from celery_dlx.message.names import Keys
from celery_dlx.message.obituary import Obituary
from celery_dlx.store import status
from celery_dlx.store.client import (
    MemoryInfo,
    NotReplicated,
    RedisClient,
    Replicas,
    batched_script,
    execute_replicated,
    is_cluster,
    memory_info,
    run_script_batch,
    run_script_many,
    text,
)
from celery_dlx.store.errors import GraveyardFull
from celery_dlx.store.history import History, history_args
from celery_dlx.store.shards import Layout, ShardSet, grouped

logger = logging.getLogger(__name__)

__all__ = ["Budget", "Filters", "Graveyard", "GraveyardFull", "GraveyardShard"]

#: Replies per cause of :meth:`GraveyardShard.queue_group_reads`.
GROUP_READS = 5

#: Buckets of one queue's graveyard in the per-queue layout: an obituary's bucket is the CRC-32
#: of its id modulo this. Fixed: changing it would strand obituaries in buckets nothing reads.
BUCKETS = 4

#: Most ids of a cause examined for one console page under a queue or task filter.
SCAN_CAP = 10000

# KEYS: records payloads time queue task cause message group groups queues tasks history causerec
# cause-versions versions bytes
# ARGV: id score record payload facts version home limit cap; facts = JSON [queue, task, cause,
# exc_type, exc_message, history field, value, ...] (one argument, not thirty: packing costs the
# client); version "" = unknown; home "1" or "2" in the single-tag layout: the script appends the
# ``buried`` entry, and with "1" deletes the cause record; "0": the caller does (KEYS[12] and
# KEYS[13] are then any key of the slot, never touched).
# Writes nothing and returns 0 when the id is there already (a redelivered dead letter), -1 when
# the shard's byte count (KEYS[16]) would pass ARGV[8] (-1: no limit), -2 when the cause holds
# ARGV[9] already: checked before the first write, which a Redis at maxmemory refuses too.
_WRITE = """
local home, drop = ARGV[7] ~= '0', ARGV[7] == '1'
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  if drop then redis.call('DEL', KEYS[13]) end
  return 0
end
local size = string.len(ARGV[3]) + string.len(ARGV[4]) + OVERHEAD
local limit = tonumber(ARGV[8])
if limit >= 0 and tonumber(redis.call('GET', KEYS[16]) or '0') + size > limit then return -1 end
local cap = tonumber(ARGV[9])
if cap > 0 and redis.call('ZCARD', KEYS[6]) >= cap then return -2 end
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
redis.call('INCRBY', KEYS[16], size)
if home then redis.call('XADD', KEYS[12], '*', unpack(f, 6)) end
if drop then redis.call('DEL', KEYS[13]) end
return 1
"""

# KEYS: records payloads time queue task cause message group groups queues tasks history ledger
# cause-versions bytes status replayed resolved
# ARGV: id queue task cause version [history field pairs...]
# Deletes the obituary and its index entries, then appends the history entry when one is given
# (the single-tag layout: the stream shares the slot; else the caller appends it first); 0 if
# already gone. It deletes first, so it runs on a Redis at maxmemory.
_REMOVE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
local size = redis.call('HSTRLEN', KEYS[1], ARGV[1]) + redis.call('HSTRLEN', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[13], ARGV[1])
for i = 3, 7 do redis.call('ZREM', KEYS[i], ARGV[1]) end
FORGET_STATUS
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
if redis.call('DECRBY', KEYS[15], size + OVERHEAD) <= 0 then redis.call('DEL', KEYS[15]) end
if #ARGV > 5 then redis.call('XADD', KEYS[12], '*', unpack(ARGV, 6)) end
return 1
"""

#: Bytes an obituary's indexes, group and version entries add to its record and payload, as
#: counted against ``dlx_graveyard_max_bytes`` (measured: ``tests/integration/test_graveyard_budget.py``).
OBITUARY_OVERHEAD = 900
_WRITE = _WRITE.replace("OVERHEAD", str(OBITUARY_OVERHEAD))
_REMOVE = _REMOVE.replace("OVERHEAD", str(OBITUARY_OVERHEAD)).replace(
    "FORGET_STATUS\n", status.FORGET_STATUS.lstrip("\n")
)


class GraveyardShard:
    """The obituaries under one hash tag (``tag``): the app's or one bucket of a queue, with
    their replay ledger; ``cap``: ``dlx_graveyard_max_per_cause`` (0: no cap)."""

    def __init__(
        self, client: RedisClient, keys: Keys, tag: str, scripts: _Scripts, cap: int = 0
    ) -> None:
        self.client = client
        self.keys = keys
        self.tag = tag
        self.cap = cap
        #: The app's tag, where the history stream and the cause records live too.
        self.home = tag == keys.home_tag
        self.scripts = scripts
        self._base = keys.graveyard_prefix if self.home else f"{tag}:graveyard:"
        self.ledger = keys.replay_ledger if self.home else f"{tag}:replay:ledger"
        self.records = self.key("records")
        self.payloads = self.key("payloads")
        self.by_time = self.key("time")
        self.groups_key = self.key("groups")
        self.queues_key = self.key("queues")
        self.tasks_key = self.key("tasks")
        self.versions_key = self.key("versions")
        #: String: the bytes of this shard's obituaries, as the budget counts them.
        self.bytes_key = self.key("bytes")
        #: What became of replayed obituaries (:mod:`celery_dlx.store.status`).
        self.status_key = self.key("status")
        self.replayed_key = self.key("replayed")
        self.resolved_key = self.key("resolved")
        self.status_keys = [self.status_key, self.replayed_key, self.resolved_key]

    def key(self, suffix: str) -> str:
        return f"{self._base}{suffix}"

    def by_queue(self, queue: str) -> str:
        return self.key(f"queue:{queue}")

    def by_task(self, task: str) -> str:
        return self.key(f"task:{task}")

    def by_cause(self, cause: str) -> str:
        return self.key(f"cause:{cause}")

    def by_message(self, message_id: str) -> str:
        return self.key(f"message:{message_id}")

    def group_key(self, cause: str) -> str:
        return self.key(f"group:{cause}")

    def cause_versions(self, cause: str) -> str:
        return self.key(f"versions:{cause}")

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
            self.keys.history if self.home else self.records,
        ]

    def write_calls(
        self,
        items: Sequence[tuple[Obituary, FateEvent]],
        limit: int = -1,
        *,
        drop_causes: bool = True,
    ) -> list[tuple[list[str], list[Any]]]:
        """The ``(keys, args)`` of the burial script per item (``limit``: bytes, -1 none)."""
        return [
            self._write_call(ob, ob.record_json(), ob.payload or b"", event, limit, drop_causes)
            for ob, event in items
        ]

    def _write_call(
        self,
        ob: Obituary,
        record: Any,
        payload: Any,
        event: FateEvent | None,
        limit: int = -1,
        drop_cause: bool = True,
        cap: int | None = None,
    ) -> tuple[list[str], list[Any]]:
        facts: list[Any] = [ob.queue, ob.task or "", ob.cause, ob.exc_type, ob.exc_message[:500]]
        if event is not None:
            facts.extend(history_args(event))
        home = self.home and event is not None
        args = [ob.id, ob.buried_ms, record, payload, json.dumps(facts), ob.code_version or ""]
        args += ["0" if not home else "1" if drop_cause else "2", limit]
        args.append(self.cap if cap is None else cap)
        keys = [
            *self._index_keys(ob),
            self.keys.cause(ob.message_id) if self.home else self.records,
            self.cause_versions(ob.cause),
            self.versions_key,
            self.bytes_key,
        ]
        return keys, args

    def write(self, calls: Sequence[tuple[list[str], list[Any]]]) -> list[int]:
        """Run the burial ``calls`` in one round trip; the script's replies."""
        if is_cluster(self.client):  # a call each, as redis-py runs scripts on a Cluster
            return [int(r) for r in run_script_many(self.client, self.scripts.write, calls)]
        return [int(r) for r in run_script_batch(self.scripts.write_batch, calls)]

    def copy_in(self, ob: Obituary, record: Any, payload: Any, ledger: Any) -> bool:
        """Copy a stored obituary here, with its ledger entry and no history entry (a move
        between layouts); False if it is here already."""
        keys, args = self._write_call(ob, record, payload, None, cap=0)
        (copied,) = self.write([(keys, args)])
        if ledger is not None:
            self.client.hset(self.ledger, ob.id, ledger)
        return copied == 1

    def remove(self, ob: Obituary, event: FateEvent | None) -> bool:
        """Delete ``ob``, with ``event`` appended by the script in the app-tag shard; False if
        it was gone."""
        keys = [*self._index_keys(ob), self.ledger, self.cause_versions(ob.cause), self.bytes_key]
        keys += self.status_keys
        args = [ob.id, ob.queue, ob.task or "", ob.cause, ob.code_version or ""]
        if event is not None and self.home:
            args += history_args(event)
        return bool(self.scripts.remove(keys=keys, args=args))

    def load(self, ids: Sequence[str], *, with_payload: bool = False) -> list[Obituary | None]:
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.records, list(ids))
        pipe.hmget(self.ledger, list(ids))
        pipe.hmget(self.status_key, list(ids))
        if with_payload:
            pipe.hmget(self.payloads, list(ids))
        results = pipe.execute()
        payloads = results[3] if with_payload else [None] * len(ids)
        out: list[Obituary | None] = []
        rows = zip(ids, results[0], results[1], results[2], payloads, strict=True)
        for oid, raw, ledger, state, body in rows:
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
            ob.status = status.parse(state)
            out.append(ob)
        return out

    def count(self) -> int:
        return int(self.client.zcard(self.by_time))

    def stored_page(self, skip: int, count: int) -> list[tuple[str, Any, Any, Any]]:
        """``(id, record, payload, ledger entry)`` as stored, from rank ``skip``, oldest first."""
        ids = [text(i) for i in self.client.zrange(self.by_time, skip, skip + count - 1)]
        if not ids:
            return []
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.records, ids)
        pipe.hmget(self.payloads, ids)
        pipe.hmget(self.ledger, ids)
        records, payloads, ledgers = pipe.execute()
        return list(zip(ids, records, payloads, ledgers, strict=True))

    def driving_index(self, filters: Filters) -> str:
        """The narrowest index ``filters`` name."""
        if filters.message_id is not None:
            return self.by_message(filters.message_id)
        if filters.cause is not None:
            return self.by_cause(filters.cause)
        if filters.task is not None:
            return self.by_task(filters.task)
        if filters.queue is not None:
            return self.by_queue(filters.queue)
        return self.by_time

    def queue_group_reads(self, pipe: Any, causes: list[str]) -> None:
        """Queue the reads :meth:`groups_from` takes (:data:`GROUP_READS` per cause)."""
        for cause in causes:
            index = self.by_cause(cause)
            pipe.hgetall(self.group_key(cause))
            pipe.zcard(index)
            pipe.zrange(index, 0, 0, withscores=True)
            pipe.zrevrange(index, 0, 0, withscores=True)
            pipe.hgetall(self.cause_versions(cause))

    def groups_from(self, causes: list[str], results: list[Any]) -> list[Group]:
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
                    statuses={
                        s: int(meta[f"n_{s}"])
                        for s in status.COUNTED
                        if int(meta.get(f"n_{s}") or 0) > 0
                    },
                )
            )
        return out

    def scan_cause(self, cause: str, filters: Filters, offset: int, limit: int) -> CausePage:
        """One page of a cause's ids, newest first, by this shard's indexes alone. With a queue,
        task or status filter the cause's ids are checked against that index (``ZMSCORE``) or
        the status hash, no record read: at most :data:`SCAN_CAP` ids per page (``capped``),
        ``offset`` then counting the cause's ids, not matches."""
        client, index = self.client, self.by_cause(cause)
        high = "+inf" if filters.until_ms is None else filters.until_ms
        low = "-inf" if filters.since_ms is None else filters.since_ms
        members = [self.by_queue(filters.queue)] if filters.queue else []
        members += [self.by_task(filters.task)] if filters.task else []
        wanted = filters.status
        page = CausePage()
        if not members and wanted is None:
            raw = client.zrevrangebyscore(index, high, low, start=offset, num=limit + 1)
            ids = [text(r) for r in raw]
            page.matching = int(client.zcount(index, low, high))
            page.next_offset = offset + limit if len(ids) > limit else None
            page.scanned = min(len(ids), limit)
            page.ids = ids[:limit]
            return page
        position, chunk = offset, 1000
        while len(page.ids) < limit and page.scanned < SCAN_CAP:
            found = [
                text(r)
                for r in client.zrevrangebyscore(index, high, low, start=position, num=chunk)
            ]
            if not found:
                return page
            pipe = client.pipeline(transaction=False)
            for key in members:
                pipe.zmscore(key, found)
            if wanted is not None:
                pipe.hmget(self.status_key, found)
            scores = pipe.execute()
            docs = [status.parse(raw) for raw in scores.pop()] if wanted is not None else []
            for i, oid in enumerate(found):
                position += 1
                page.scanned += 1
                if all(s[i] is not None for s in scores) and (
                    wanted is None or status.status_of(docs[i]) == wanted
                ):
                    page.ids.append(oid)
                    if len(page.ids) >= limit:
                        break
            else:
                if len(found) < chunk:
                    return page
        page.next_offset = position
        page.capped = len(page.ids) < limit
        return page


class Budget:
    """How many bytes the graveyard may hold.

    Args:
        max_bytes: ``dlx_graveyard_max_bytes``: a number of bytes; 0, a share of Redis'
            ``maxmemory`` (:data:`DEFAULT_SHARE`), or no limit where it has none; None, no limit.
        reserve: the share of ``maxmemory`` kept for everything but new obituaries (parked
            retries, the history): a burial is refused once ``used_memory`` passes the rest.
        ttl: seconds a reading of ``INFO memory`` is reused.
    """

    def __init__(
        self, max_bytes: int | None = None, *, reserve: float = RESERVE, ttl: float = 1.0
    ) -> None:
        self.max_bytes = max_bytes
        self.reserve = reserve
        self.ttl = ttl
        self._memory: tuple[float, MemoryInfo] | None = None

    def memory(self, client: RedisClient) -> MemoryInfo:
        now = time.monotonic()
        if self._memory is None or now - self._memory[0] > self.ttl:
            self._memory = (now, memory_info(client))
        return self._memory[1]

    def limit(self, memory: MemoryInfo | None = None) -> int:
        """The budget in bytes, or -1 for none."""
        if self.max_bytes is None:
            return -1
        if self.max_bytes > 0:
            return self.max_bytes
        if memory is None and self._memory is not None:
            memory = self._memory[1]
        if memory is None or not memory.maxmemory:
            return -1
        return int(memory.maxmemory * DEFAULT_SHARE)

    def check(self, client: RedisClient) -> int:
        """The budget for a burial now (-1: none).

        Raises:
            GraveyardFull: ``used_memory`` is past ``maxmemory`` less the reserve.
        """
        if self.max_bytes is None:
            return -1
        memory = self.memory(client)
        if memory.maxmemory and memory.used > memory.maxmemory * (1 - self.reserve):
            raise GraveyardFull(
                f"Redis uses {memory.used:,} of its {memory.maxmemory:,}-byte maxmemory: "
                f"burials stop at {1 - self.reserve:.0%} so parked retries keep their room; the "
                "dead letters wait in the DLX service queue until `dlx purge` or the retention "
                "makes room"
            )
        return self.limit(memory)


class _Scripts:
    """The graveyard scripts, registered once per graveyard for all its shards."""

    def __init__(self, client: RedisClient) -> None:
        self.write = client.register_script(_WRITE)
        self.write_batch = client.register_script(batched_script(_WRITE))
        self.remove = client.register_script(_REMOVE)
        self.set_status = client.register_script(status.SET_STATUS)


class Graveyard:
    """Obituaries in Redis, in the single-tag layout or sharded by queue (same methods).

    Reads go over every shard: listings merge the shards' indexes a page at a time by burial
    time; counts, names, versions and groups are summed. An obituary id tells its bucket, not
    its queue, so a load asks that bucket of every queue (one pipelined ``HMGET`` each).

    In the single-tag layout a burial, its ``buried`` history entry and the deletion of the
    worker's cause record are one script. Per queue, the history and the cause records live in
    another slot: a burial appends its entry right after its script (a crash between leaves the
    obituary without its entry), a removal before its script (a crash between leaves it in
    place with an extra entry: nothing leaves without its record in the history).

    Past its budget (:class:`Budget`), or with Redis near its ``maxmemory``, a burial raises
    :class:`GraveyardFull` before it writes anything and the dead letter waits in RabbitMQ, so a
    storm of burials never takes the memory parked retries need.

    Args:
        replicas: the replicas a burial in a queue's bucket must reach.
        per_queue: keys per queue (``dlx_redis_shards``).
        budget: the bytes the graveyard may hold (default: none).
        max_per_cause: ``dlx_graveyard_max_per_cause`` (0: no cap).
    """

    def __init__(
        self,
        client: RedisClient,
        keys: Keys,
        replicas: Replicas | None = None,
        *,
        per_queue: bool = False,
        budget: Budget | None = None,
        max_per_cause: int = 0,
    ) -> None:
        self.client = client
        self.keys = keys
        self.replicas = replicas or Replicas()
        self.budget = budget or Budget()
        self.scripts = _Scripts(client)
        self.shards: ShardSet[GraveyardShard] = ShardSet(
            client,
            Layout(keys, per_queue=per_queue, buckets=BUCKETS),
            keys.graveyard("shards"),
            "graveyard",
            lambda tag: GraveyardShard(client, keys, tag, self.scripts, max_per_cause),
            self.replicas,
        )

    def shard(self, queue: str, obituary_id: str) -> GraveyardShard:
        return self.shards.shard(queue, obituary_id)

    def queues(self) -> list[str]:
        return self.shards.queues()

    def write_many(
        self,
        items: Sequence[tuple[Obituary, FateEvent]],
        *,
        drop_causes: bool = True,
        over_cap: list[int] | None = None,
    ) -> list[bool]:
        """Write obituaries with their ``buried`` history entries, and delete the workers'
        cause records of their messages (unless ``drop_causes`` is False: the DLX service drops
        them with its seen markers, :meth:`~celery_dlx.store.seen.Letters.mark`).

        Returns:
            Per obituary, True if written now; False if there already or (its index appended
            to ``over_cap``) its cause holds ``dlx_graveyard_max_per_cause`` obituaries.

        Raises:
            GraveyardFull: past the budget, or Redis near its ``maxmemory``.
            NotReplicated: written in a queue's bucket, but too few replicas confirmed it (its
                history entry is appended: the retry finds the obituary and writes nothing).
            redis.RedisError: not written (or not known to be); the caller retries.
        """
        if not items:
            return []
        self.shards.add_queues(ob.queue for ob, _ in items)
        out = [False] * len(items)
        unconfirmed: NotReplicated | None = None
        refused_at: set[int] = set()
        groups = grouped((self.shard(ob.queue, ob.id), i) for i, (ob, _) in enumerate(items))
        limits = self._limits([shard for shard, _ in groups])
        for (shard, where), limit in zip(groups, limits, strict=True):
            try:
                written = self._write(shard, [items[i] for i in where], limit, drop_causes)
            except NotReplicated as exc:
                written, unconfirmed = [1] * len(where), unconfirmed or exc
            for i, done in zip(where, written, strict=True):
                out[i] = done == 1
                if done == -1:
                    refused_at.add(i)
                elif done == -2 and over_cap is not None:
                    over_cap.append(i)
        if self.shards.layout.per_queue:
            pipe = self.client.pipeline(transaction=False)
            new = (event for (_, event), ok in zip(items, out, strict=True) if ok)
            History(self.client, self.keys).append_many(new, pipe=pipe)
            for i, (ob, _) in enumerate(items):
                if drop_causes and i not in refused_at:  # one DEL each, as a cluster pipeline asks
                    pipe.delete(self.keys.cause(ob.message_id))
            pipe.execute()
        if unconfirmed is not None:
            raise unconfirmed
        if refused_at:
            full = GraveyardFull(
                f"{len(refused_at)} of {len(items)} burial(s) refused: the graveyard holds "
                f"{self.used_bytes():,} bytes of its {self.budget.limit():,}-byte budget "
                "(dlx_graveyard_max_bytes); the dead letters wait in the DLX service queue until "
                "`dlx purge` or the retention makes room"
            )
            full.settled = [i not in refused_at for i in range(len(items))]
            raise full
        return out

    def used_bytes(self) -> int:
        """The bytes of every obituary, as the budget counts them."""
        return sum(int(n or 0) for n in self.shards.ask(lambda pipe, s: pipe.get(s.bytes_key)))

    def _limits(self, shards: Sequence[GraveyardShard]) -> list[int]:
        """The byte limit each of ``shards`` gets for one batch (-1: none): one shard compares
        the budget with its own count; several share what the budget has left."""
        limit = self.budget.check(self.client)
        if limit < 0:
            return [-1] * len(shards)
        every = self.shards.every()
        if len(every) == 1:
            return [limit] * len(shards)
        found = self.shards.ask(lambda pipe, s: pipe.get(s.bytes_key), [*every, *shards])
        counts = [int(n or 0) for n in found]
        left = limit - sum(counts[: len(every)])
        return [own + left for own in counts[len(every) :]]

    def _write(
        self,
        shard: GraveyardShard,
        items: Sequence[tuple[Obituary, FateEvent]],
        limit: int,
        drop_causes: bool,
    ) -> list[int]:
        """One shard's burials; a queue bucket's wait for its master's replicas."""
        calls = shard.write_calls(items, limit, drop_causes=drop_causes)
        wanted = 0 if shard.home else self.replicas.wanted(self.client, shard.records)
        if not wanted:
            return shard.write(calls)

        def queue(pipe: Any) -> None:
            for keys, args in calls:
                self.scripts.write(keys=keys, args=args, client=pipe)

        done = execute_replicated(
            self.client,
            shard.records,
            queue,
            wanted,
            self.replicas.timeout,
            what=f"{len(calls)} obituaries of {shard.tag}",
        )
        return [int(r) for r in done]

    def remove(self, ob: Obituary, event: FateEvent | None) -> bool:
        """Delete ``ob`` with ``event`` in the history (None: no entry, a burial taken back
        before anyone saw it); False if it was gone."""
        found = self._by_shard([ob.id])
        if not found:
            return False
        holder = found[0][0]
        if not holder.home and event is not None:
            History(self.client, self.keys).append_many([event])
        return holder.remove(ob, event)

    def _by_shard(self, ids: Sequence[str]) -> list[tuple[GraveyardShard, list[int]]]:
        """The positions of ``ids`` grouped by the shard holding each (missing ones left out)."""
        if not ids or not self.shards.layout.per_queue:  # one shard: no lookup first
            return [(self.shards.home, list(range(len(ids))))] if ids else []
        queues = self.queues()
        asks = grouped(
            (s, i) for i, oid in enumerate(ids) for s in self.shards.holders(oid, queues)
        )
        pipe = self.client.pipeline(transaction=False)
        for shard, where in asks:
            pipe.hmget(shard.records, [ids[i] for i in where])
        holders: list[GraveyardShard | None] = [None] * len(ids)
        for (shard, where), raws in zip(asks, pipe.execute(), strict=True):
            for i, raw in zip(where, raws, strict=True):
                if raw is not None and holders[i] is None:
                    holders[i] = shard
        return grouped((s, i) for i, s in enumerate(holders) if s is not None)

    def load(self, ids: Sequence[str], *, with_payload: bool = False) -> list[Obituary | None]:
        """The obituaries of ``ids`` (None where missing or unreadable), in order."""
        out: list[Obituary | None] = [None] * len(ids)
        for shard, where in self._by_shard(ids):
            found = shard.load([ids[i] for i in where], with_payload=with_payload)
            for i, ob in zip(where, found, strict=True):
                out[i] = ob
        return out

    def add_replays(self, replayed: Sequence[tuple[str, int]], *, to_queue: str = "") -> None:
        """Add replay times to the ledger (read-modify-write: an operator's record, not a lock);
        ``to_queue``: where these replays went, kept per time under ``to``."""
        for shard, where in self._by_shard([oid for oid, _ in replayed]):
            mine = [replayed[i] for i in where]
            current = self.client.hmget(shard.ledger, [oid for oid, _ in mine])
            mapping: dict[Any, Any] = {}
            for (oid, at), raw in zip(mine, current, strict=True):
                entry: dict[str, Any] = {"replays": [*_ledger_times(raw), at]}
                to = {**_ledger_redirects(raw), **({str(at): to_queue} if to_queue else {})}
                if to:
                    entry["to"] = to
                mapping[oid] = json.dumps(entry)
            self.client.hset(shard.ledger, mapping=mapping)

    def mark_replayed(self, ids: Sequence[str], at: int) -> list[str]:
        """Mark ``ids`` ``replayed`` before their copies go out (a copy that runs at once finds
        its obituary waiting); the ids changed, for :meth:`unmark_replayed` if they do not."""
        return self.set_status(ids, status.REPLAYED, at, {"next": None})

    def unmark_replayed(self, ids: Sequence[str], at: int) -> None:
        """The copies of ``ids`` did not go out: unresolved again."""
        self.set_status(ids, status.UNRESOLVED, at, allowed_from=[status.REPLAYED])

    def resolve(self, ids: Sequence[str], at: int, by: str) -> list[str]:
        """Mark the replayed ``ids`` ``resolved`` (``by``: ``success``, a DLX task ran the copy;
        ``quiet``, nothing dead-lettered it within ``dlx_resolve_after``); the ids changed."""
        return self.set_status(ids, status.RESOLVED, at, {"by": by}, allowed_from=[status.REPLAYED])

    def note_failed_again(self, buried: Sequence[Obituary], at: int) -> None:
        """Each new obituary of a replayed message (``replayed_from``) makes the old one
        ``failed-again``, naming it, and counts the ``repeats`` before it."""
        for ob in buried:
            old_id = ob.replayed_from
            if not old_id:
                continue
            (old,) = self.load([old_id])
            repeats = 1 + int((old.status.get("repeats") or 0) if old is not None else 0)
            self.set_status([old_id], status.FAILED_AGAIN, at, {"next": ob.id})
            self.set_status([ob.id], status.UNRESOLVED, at, {"repeats": repeats, "prev": old_id})

    def redirects(self, ids: Sequence[str]) -> list[dict[int, str]]:
        """Per id, the ledger's redirected replays: replay time (ms) -> the queue it went to."""
        out: list[dict[int, str]] = [{} for _ in ids]
        for shard, where in self._by_shard(ids):
            raws = self.client.hmget(shard.ledger, [ids[i] for i in where])
            for i, raw in zip(where, raws, strict=True):
                out[i] = {int(at): q for at, q in _ledger_redirects(raw).items()}
        return out

    def latest_of_message(self, message_id: str) -> str | None:
        """The id of the latest obituary of ``message_id``, or None."""
        best: tuple[float, str] | None = None
        for rows in self.shards.ask(
            lambda pipe, s: pipe.zrevrange(s.by_message(message_id), 0, 0, withscores=True)
        ):
            for oid, score in rows:
                if best is None or score > best[0]:
                    best = (score, text(oid))
        return None if best is None else best[1]

    def ids(self, filters: Filters, *, limit: int | None, oldest_first: bool = False) -> list[str]:
        """Obituary ids matching ``filters``, newest first unless ``oldest_first``."""
        shards = self.shards.every(filters.queue)
        page = CHUNK if limit is None else max(CHUNK, limit)
        sign = 1 if oldest_first else -1
        # Every shard's first page in one round trip; later pages as the merge reaches them.
        pipe = self.client.pipeline(transaction=False)
        for shard in shards:
            _read_page(pipe, shard.driving_index(filters), filters, 0, page, oldest_first)
        firsts = pipe.execute()
        rows = (
            _pages(s, filters, page, oldest_first, first)
            for s, first in zip(shards, firsts, strict=True)
        )
        out: list[str] = []
        for _, oid in heapq.merge(*rows, key=lambda r: sign * r[0]):
            out.append(oid)
            if limit is not None and len(out) >= limit:
                break
        return out

    def count(self) -> int:
        return sum(int(n) for n in self.shards.ask(lambda pipe, s: pipe.zcard(s.by_time)))

    def set_status(
        self,
        ids: Sequence[str],
        new: str,
        at: int,
        extra: dict[str, Any] | None = None,
        *,
        allowed_from: Sequence[str] = (),
    ) -> list[str]:
        """Move ``ids`` whose status is one of ``allowed_from`` (empty: any) to ``new``, merging
        ``extra`` into their status documents; the ids changed."""
        changed: list[str] = []
        allowed = ",".join(allowed_from)
        for shard, where in self._by_shard(ids):
            for ob in shard.load([ids[i] for i in where]):
                if ob is None:
                    continue
                keys = [*shard.status_keys, shard.group_key(ob.cause), shard.records]
                args: list[Any] = [ob.id, new, at, json.dumps(extra or {}), allowed]
                if self.scripts.set_status(keys=keys, args=args):
                    changed.append(ob.id)
        return changed

    def since(self, kind: str, cutoff_ms: int, limit: int) -> list[str]:
        """Up to ``limit`` ids ``replayed`` or ``resolved`` (``kind``) by ``cutoff_ms``."""
        found: list[str] = []
        for shard in self.shards.every():
            key = shard.replayed_key if kind == status.REPLAYED else shard.resolved_key
            rows = self.client.zrangebyscore(key, "-inf", cutoff_ms, 0, limit - len(found))
            found += [text(i) for i in rows]
            if len(found) >= limit:
                break
        return found

    def older_than(self, cutoff_ms: int, limit: int) -> list[str]:
        """Up to ``limit`` ids buried by ``cutoff_ms``, oldest first."""
        replies = self.shards.ask(
            lambda pipe, s: pipe.zrangebyscore(
                s.by_time, "-inf", cutoff_ms, 0, limit, withscores=True
            )
        )
        rows = [(s, text(i)) for found in replies for i, s in found]
        return [oid for _, oid in sorted(rows)[:limit]]

    def _latest(self, key: str, limit: int | None) -> list[tuple[str, int]]:
        """``(member, latest score)`` of every shard's ``key`` zset, latest first."""
        stop = -1 if limit is None else limit - 1
        best: dict[str, int] = {}
        for rows in self.shards.ask(
            lambda pipe, s: pipe.zrevrange(s.key(key), 0, stop, withscores=True)
        ):
            for member, score in rows:
                name = text(member)
                best[name] = max(best.get(name, 0), int(score))
        ordered = sorted(best.items(), key=lambda ms: (-ms[1], ms[0]))
        return ordered if limit is None else ordered[:limit]

    def top_causes(self, limit: int) -> list[str]:
        """The ``limit`` most recently seen causes, latest first."""
        return [c for c, _ in self._latest("groups", limit)]

    def cause_names(self, offset: int, limit: int) -> tuple[int, list[str]]:
        """How many causes there are, and a page of them, most recently seen first."""
        every = self._latest("groups", None)
        return len(every), [c for c, _ in every[offset : offset + limit]]

    def groups(self) -> list[Group]:
        """Every cause still in the graveyard, most recently seen first."""
        return self.groups_of([c for c, _ in self._latest("groups", None)])

    def groups_of(self, causes: list[str]) -> list[Group]:
        """The :class:`Group` of each of ``causes`` still in the graveyard, in their order
        (one round trip)."""
        if not causes:
            return []
        shards = self.shards.every()
        results = self.shards.ask(lambda pipe, s: s.queue_group_reads(pipe, causes), shards)
        step = GROUP_READS * len(causes)
        parts: dict[str, list[Group]] = {}
        for i, shard in enumerate(shards):
            for group in shard.groups_from(causes, results[i * step : (i + 1) * step]):
                parts.setdefault(group.cause, []).append(group)
        return [_summed(parts[c]) for c in causes if c in parts]

    def cause_page(self, cause: str, filters: Filters, offset: int, limit: int) -> CausePage:
        """One page of a cause's obituary ids under ``filters``, newest first (the console's
        cause page). Over several shards ``matching`` is None with a queue, task or status
        filter."""
        shards = self.shards.every()
        if len(shards) == 1:
            return shards[0].scan_cause(cause, filters, offset, limit)
        ids = self.ids(replace(filters, cause=cause, message_id=None), limit=offset + limit + 1)
        page = CausePage(ids=ids[offset : offset + limit])
        page.next_offset = offset + limit if len(ids) > offset + limit else None
        page.scanned = len(page.ids)
        if filters.queue is not None or filters.task is not None or filters.status is not None:
            return page
        low = "-inf" if filters.since_ms is None else filters.since_ms
        high = "+inf" if filters.until_ms is None else filters.until_ms
        counts = self.shards.ask(lambda pipe, s: pipe.zcount(s.by_cause(cause), low, high), shards)
        page.matching = sum(int(n) for n in counts)
        return page

    def version_times(self) -> dict[str, int]:
        """Code version -> when the graveyard first saw it (ms)."""
        out: dict[str, int] = {}
        for shard in self.shards.every():
            scored: Any = self.client.zrange(shard.versions_key, 0, -1, withscores=True)
            for raw, ms in scored:
                version = text(raw)
                out[version] = min(out.get(version, int(ms)), int(ms))
        return out

    def names(self, kind: str) -> list[tuple[str, int, int]]:
        """``(name, obituaries, last burial ms)`` per queue (``kind="queue"``) or task."""
        counts: dict[str, list[int]] = {}
        for s in self.shards.every():
            key, index = (s.queues_key, s.by_queue) if kind == "queue" else (s.tasks_key, s.by_task)
            scored: Any = self.client.zrevrange(key, 0, -1, withscores=True)
            rows = [(text(n), int(last)) for n, last in scored]
            pipe = self.client.pipeline(transaction=False)
            for name, _ in rows:
                pipe.zcard(index(name))
            for (name, last), n in zip(rows, pipe.execute() if rows else [], strict=True):
                if n:
                    seen = counts.setdefault(name, [0, 0])
                    seen[0] += int(n)
                    seen[1] = max(seen[1], last)
        found = [(name, n, last) for name, (n, last) in counts.items()]
        return sorted(found, key=lambda r: (-r[2], r[0]))


def _read_page(
    client: Any, index: str, filters: Filters, offset: int, page: int, oldest_first: bool
) -> Any:
    """One page of ``index`` within the filters' time bounds, with scores."""
    low = "-inf" if filters.since_ms is None else filters.since_ms
    high = "+inf" if filters.until_ms is None else filters.until_ms
    if oldest_first:
        return client.zrangebyscore(index, low, high, offset, page, withscores=True)
    return client.zrevrangebyscore(index, high, low, offset, page, withscores=True)


def _pages(
    shard: GraveyardShard, filters: Filters, page: int, oldest_first: bool, first: Any
) -> Iterator[tuple[float, str]]:
    """``(burial ms, id)`` of one shard's matches, a page at a time (``first``: read already)."""
    index = shard.driving_index(filters)
    check = _needs_post_filter(filters)
    offset = 0
    raw = first
    while True:
        if raw is None:
            raw = _read_page(shard.client, index, filters, offset, page, oldest_first)
        rows = [(float(s), text(i)) for i, s in raw]
        offset += len(rows)
        if check and rows:
            obits = shard.load([oid for _, oid in rows])
            keep = {ob.id for ob in obits if ob is not None and filters.matches(ob)}
            rows = [r for r in rows if r[1] in keep]
        if filters.status is not None and rows:
            docs = shard.client.hmget(shard.status_key, [oid for _, oid in rows])
            rows = [
                r
                for r, doc in zip(rows, docs, strict=True)
                if status.status_of(status.parse(doc)) == filters.status
            ]
        yield from rows
        if len(raw) < page:
            return
        raw = None


def _summed(parts: list[Group]) -> Group:
    if len(parts) == 1:
        return parts[0]
    latest = max(parts, key=lambda g: g.last_ms)
    started = [g for g in parts if g.first_seen_ms is not None]
    first = min(started, key=lambda g: cast("int", g.first_seen_ms)) if started else None
    versions: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    for g in parts:
        versions.update(g.versions)
        statuses.update(g.statuses)
    return Group(
        cause=latest.cause,
        count=sum(g.count for g in parts),
        total=sum(g.total for g in parts),
        first_ms=min(g.first_ms for g in parts),
        last_ms=latest.last_ms,
        example_id=latest.example_id,
        exc_type=latest.exc_type,
        exc_message=latest.exc_message,
        task=latest.task,
        queue=latest.queue,
        first_seen_ms=first.first_seen_ms if first is not None else None,
        first_version=first.first_version if first is not None else None,
        last_version=latest.last_version,
        versions=dict(versions),
        statuses=dict(statuses),
    )


def _ledger_redirects(raw: Any) -> dict[str, str]:
    try:
        to = json.loads(raw).get("to", {}) if raw is not None else {}
        return {str(int(at)): text(q) for at, q in to.items()}
    except (ValueError, TypeError, AttributeError):
        return {}


def _ledger_times(raw: Any) -> list[int]:
    try:
        return [int(t) for t in json.loads(raw).get("replays", [])] if raw is not None else []
    except (ValueError, TypeError, AttributeError):
        return []


def _needs_post_filter(filters: Filters) -> bool:
    given = [f for f in (filters.message_id, filters.cause, filters.task, filters.queue) if f]
    return len(given) > 1
