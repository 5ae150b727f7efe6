"""Parked retries sharded by queue: a few hash tags per queue, so a Redis Cluster spreads them.

With ``dlx_redis_shards = "queue"`` (or ``"auto"`` on a ``?cluster=true`` URL) each queue's parked
retries live under keys of their own, in :data:`~celery_dlx.message.names.PARKED_BUCKETS` buckets
(the CRC-32 of the entry id picks one): ``{prefix:q:QUEUE:BUCKET}:parked:due|meta|body``
(:meth:`~celery_dlx.message.names.Keys.parked_shard`). A Redis Cluster puts the buckets on
different masters, those of one busy queue too, where the single-tag layout
(``{prefix}:parked:...``) kept every retry of an app on one. Each bucket is a
:class:`~celery_dlx.store.parking.ParkingStore` of its own, so every Lua script still touches one
slot.

A small set under the app's tag (``{prefix}:parked:queues``) names the queues that have keys; a
queue is added to it before its first park, so no parked retry is ever outside it. Cross-queue
reads (``dlx parked``, the console) read that set, then each bucket's sorted set a page at a
time, merged lazily by due time (:func:`heapq.merge`): the first page of ``dlx parked`` reads one
page per bucket, never every retry. The drain (one per app, under the drain lease) counts what is
due in every bucket in one pipelined round trip per master, then claims from the buckets that
have due entries, each claim an atomic Lua script on that bucket's master.

The single-tag keys stay readable (a read-both window): what an older version parked there is
listed, counted, drained and purged with the rest until ``celery -A proj dlx migrate-keys``
(:meth:`ShardedParking.migrate_legacy`) has moved it; nothing new is parked there.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, cast

from celery_dlx.fates import FateEvent, now_ms
from celery_dlx.message.names import PARKED_BUCKETS, Keys
from celery_dlx.message.parked import ParkedMessage, park_each
from celery_dlx.store.client import RedisClient, Replicas, execute_replicated
from celery_dlx.store.parking import ParkingStore

logger = logging.getLogger(__name__)

#: Entries read per queue and round trip by the merged reads (``peek``, ``soonest``).
PAGE = 200

# Copy one entry (meta, body, score) into a queue's keys unless it is there: 1 if copied, 0 if
# it was there already (a migration run again after an interruption).
_COPY = """
if redis.call('HEXISTS', KEYS[2], ARGV[1]) == 1 then return 0 end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
"""

# Delete one entry of the single-tag keys if its score is still the one read (an entry a drain
# claimed meanwhile is left to that drain): 1 if deleted.
_DROP = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) == tonumber(ARGV[2]) then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
  return 1
end
return 0
"""


@dataclass
class Migration:
    """What :meth:`ShardedParking.migrate_legacy` did (or, dry, would do).

    Attributes:
        found: entries read from the single-tag keys.
        copied: entries written to their queue's keys now (0 on a dry run).
        present: entries their queue's keys held already (an interrupted run's copies).
        moved: entries deleted from the single-tag keys after their copy.
        left: entries left in place (unreadable, or claimed by a drain while being moved).
        queues: parked retries found per queue.
    """

    found: int = 0
    copied: int = 0
    present: int = 0
    moved: int = 0
    left: int = 0
    queues: dict[str, int] | None = None


class ShardedParking:
    """The :class:`~celery_dlx.roles.Parking` role over one :class:`ParkingStore` per queue.

    Args:
        client: the client of ``dlx_redis_url`` (a ``RedisCluster`` on a cluster URL).
        keys: the app's key layout.
        replicas: the replicas a park must reach (each queue's park waits on its own master).
    """

    def __init__(self, client: RedisClient, keys: Keys, replicas: Replicas | None = None) -> None:
        self.client = client
        self.keys = keys
        self.replicas = replicas or Replicas()
        self.legacy = ParkingStore(client, keys, self.replicas)
        self._shards: dict[tuple[str, int], ParkingStore] = {}
        self._indexed: set[str] = set()
        self._lock = threading.RLock()
        # Entries claimed from the single-tag keys (entry id, lease score): acked and released
        # there. Only what this process claimed and has not settled yet.
        self._from_legacy: set[tuple[str, int]] = set()
        self._turn = itertools.count()
        self._copy = client.register_script(_COPY)
        self._drop = client.register_script(_DROP)

    # -- shards ---------------------------------------------------------------------------------

    def shard(self, queue: str, entry_id: str) -> ParkingStore:
        """The store of the keys ``queue``'s entry ``entry_id`` lives under."""
        return self._bucket(queue, zlib.crc32(entry_id.encode()) % PARKED_BUCKETS)

    def _bucket(self, queue: str, bucket: int) -> ParkingStore:
        with self._lock:
            store = self._shards.get((queue, bucket))
            if store is None:
                parked = self.keys.parked_shard(queue, bucket)
                store = ParkingStore(self.client, self.keys, self.replicas, parked=parked)
                self._shards[(queue, bucket)] = store
            return store

    def queues(self) -> list[str]:
        """The queues that have parked-retry keys (the index), sorted."""
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in self._members())

    def _members(self) -> set[Any]:
        return cast("set[Any]", self.client.smembers(self.keys.parked_queues))

    def stores(self) -> list[ParkingStore]:
        """Every queue's store, then the single-tag keys' (read and drained, never parked to)."""
        queues = self.queues()
        # Bucket-major, so a claim whose limit ends its round early has taken from every queue.
        return [*(self._bucket(q, b) for b in range(PARKED_BUCKETS) for q in queues), self.legacy]

    def _index(self, queues: Iterable[str]) -> None:
        """Add ``queues`` to the index before anything is parked under their keys (once per
        process and queue: the index only grows). Waits for the replicas a park waits for, so a
        failover cannot keep a park and lose its queue's name."""
        new = sorted(set(queues) - self._indexed)
        if not new:
            return
        index = self.keys.parked_queues
        wanted = self.replicas.wanted(self.client, index)
        if wanted:

            def add(pipe: Any) -> None:
                pipe.sadd(index, *new)

            execute_replicated(
                self.client,
                index,
                add,
                wanted,
                self.replicas.timeout,
                what=f"the index of {len(new)} parked queue(s)",
            )
        else:
            self.client.sadd(index, *new)
        with self._lock:
            self._indexed.update(new)

    # -- writes ---------------------------------------------------------------------------------

    def load_scripts(self) -> None:
        """Load the Lua scripts now. Every bucket runs the same scripts, and ``SCRIPT LOAD`` goes
        to every master of a cluster, so one store's load serves them all."""
        self.legacy.load_scripts()
        for script in (self._copy, self._drop):
            self.client.script_load(script.script)

    def park(self, message: ParkedMessage) -> bool:
        """Park ``message`` under its queue's keys; False if that id and attempt are there.

        Raises:
            NotReplicated: stored, but fewer replicas than ``dlx_redis_min_replicas`` confirmed.
            redis.RedisError: not stored (or not known to be).
        """
        self._index([message.queue])
        return self.shard(message.queue, message.entry_id).park(message)

    def park_many(self, messages: Sequence[ParkedMessage]) -> list[bool]:
        """Park a batch: one batch per queue (each on its own master, with its own ``WAIT``).

        Raises:
            NotReplicated, redis.RedisError: as :meth:`ParkingStore.park_many`, for the first
                queue that failed (the others may have gone in: a park is idempotent).
        """
        if not messages:
            return []
        self._index(m.queue for m in messages)
        by_shard: dict[int, tuple[ParkingStore, list[int]]] = {}
        for i, m in enumerate(messages):
            store = self.shard(m.queue, m.entry_id)
            by_shard.setdefault(id(store), (store, []))[1].append(i)
        out = [False] * len(messages)
        for store, where in by_shard.values():
            stored = store.park_many([messages[i] for i in where])
            for i, ok in zip(where, stored, strict=True):
                out[i] = ok
        return out

    def park_recorded(
        self, message: ParkedMessage, events: Sequence[FateEvent]
    ) -> bool | BaseException:
        """Park only: the history lives under the app's tag, another slot than the queue's, so
        the caller records ``events`` itself (returns False)."""
        self.park(message)
        return False

    def park_recorded_many(
        self, messages: Sequence[ParkedMessage], events: Sequence[FateEvent]
    ) -> tuple[list[BaseException | None], bool | BaseException]:
        """Park each (its queue's slot); the caller records ``events`` (False)."""
        return park_each(self.park, messages), False

    # -- the drain ------------------------------------------------------------------------------

    def claim(self, limit: int, lease_ms: int, now: int | None = None) -> list[ParkedMessage]:
        """Claim up to ``limit`` due entries over every queue, a share per queue first (so one
        queue with a backlog does not starve the others), the rest from queues that had more.
        The queue the round starts from turns from call to call."""
        now = now_ms() if now is None else now
        every = self.stores()
        # One pipelined count first (a round trip per master), so a claim runs only where
        # something is due, not once per bucket of every queue.
        pipe = self.client.pipeline(transaction=False)
        for store in every:
            pipe.zcount(store.parked.due, "-inf", now)
        stores = [s for s, due in zip(every, pipe.execute(), strict=True) if int(due)]
        if not stores:
            return []
        start = next(self._turn) % len(stores)
        stores = stores[start:] + stores[:start]
        share = max(1, -(-limit // len(stores)))
        out: list[ParkedMessage] = []
        full: list[ParkingStore] = []
        for store in stores:
            if len(out) >= limit:
                break
            got = self._claim_from(store, min(share, limit - len(out)), lease_ms, now)
            out.extend(got)
            if len(got) == share:
                full.append(store)
        for store in full:
            if len(out) >= limit:
                break
            out.extend(self._claim_from(store, limit - len(out), lease_ms, now))
        return out

    def _claim_from(
        self, store: ParkingStore, limit: int, lease_ms: int, now: int
    ) -> list[ParkedMessage]:
        got = store.claim(limit, lease_ms, now=now)
        if store is self.legacy and got:
            with self._lock:
                self._from_legacy.update((m.entry_id, m.lease_score) for m in got)
        return got

    def _by_store(self, messages: Iterable[ParkedMessage]) -> list[tuple[ParkingStore, list[Any]]]:
        groups: dict[int, tuple[ParkingStore, list[ParkedMessage]]] = {}
        with self._lock:
            for m in messages:
                mark = (m.entry_id, m.lease_score)
                if mark in self._from_legacy:
                    self._from_legacy.discard(mark)
                    store = self.legacy
                else:
                    store = self.shard(m.queue, m.entry_id)
                groups.setdefault(id(store), (store, []))[1].append(m)
        return list(groups.values())

    def ack(self, messages: Iterable[ParkedMessage]) -> int:
        """Delete claimed entries whose republish was confirmed, queue by queue."""
        return sum(store.ack(group) for store, group in self._by_store(messages))

    def release(self, messages: Iterable[ParkedMessage], due_ms: int | None = None) -> None:
        """Make claimed entries due again (at ``due_ms``, default now), queue by queue."""
        for store, group in self._by_store(messages):
            store.release(group, due_ms)

    # -- reads ----------------------------------------------------------------------------------

    def count(self) -> int:
        """Parked retries over every queue (one ``ZCARD`` per queue, pipelined)."""
        pipe = self.client.pipeline(transaction=False)
        for store in self.stores():
            pipe.zcard(store.parked.due)
        return sum(int(n) for n in pipe.execute())

    def due_count(self, now: int | None = None) -> int:
        now = now_ms() if now is None else now
        pipe = self.client.pipeline(transaction=False)
        for store in self.stores():
            pipe.zcount(store.parked.due, "-inf", now)
        return sum(int(n) for n in pipe.execute())

    def _rows(self, store: ParkingStore, page: int) -> Iterator[tuple[float, str, ParkingStore]]:
        """``(score, entry id, store)`` of one queue in due order, read a page at a time."""
        start = 0
        while True:
            rows = cast(
                "list[tuple[bytes, float]]",
                self.client.zrange(store.parked.due, start, start + page - 1, withscores=True),
            )
            for entry, score in rows:
                yield score, entry.decode() if isinstance(entry, bytes) else str(entry), store
            if len(rows) < page:
                return
            start += len(rows)

    def _merged(self, page: int) -> Iterator[tuple[float, str, ParkingStore]]:
        return heapq.merge(*(self._rows(s, page) for s in self.stores()), key=lambda r: r[0])

    def _metas(self, rows: list[tuple[float, str, ParkingStore]]) -> Iterator[ParkedMessage]:
        """The stored entries of ``rows`` (without bodies), in order; gone or unreadable ones
        are skipped."""
        by_store: dict[int, list[int]] = {}
        for i, (_, _, store) in enumerate(rows):
            by_store.setdefault(id(store), []).append(i)
        metas: list[Any] = [None] * len(rows)
        for where in by_store.values():
            store = rows[where[0]][2]
            found = self.client.hmget(store.parked.meta, [rows[i][1] for i in where])
            for i, meta in zip(where, found, strict=True):
                metas[i] = meta
        for (score, _, _), meta in zip(rows, metas, strict=True):
            if meta is None:
                continue
            try:
                yield ParkedMessage.from_stored(meta, b"", lease_score=int(score))
            except (ValueError, TypeError, KeyError):
                continue

    def peek(self, limit: int = 100, offset: int = 0) -> list[ParkedMessage]:
        """Parked retries of every queue by due time, without claiming them (merged lazily)."""
        page = max(1, min(PAGE, limit + offset))
        rows = list(itertools.islice(self._merged(page), offset, offset + limit))
        return list(self._metas(rows))

    def soonest(self, limit: int, batch: int = 1000) -> Iterator[ParkedMessage]:
        """The ``limit`` soonest-due retries of every queue (without bodies), in due order."""
        merged = self._merged(min(PAGE, batch, max(limit, 1)))
        read = 0
        while read < limit:
            rows = list(itertools.islice(merged, min(batch, limit - read)))
            if not rows:
                return
            yield from self._metas(rows)
            read += len(rows)

    def _holders(self, entry_id: str, queues: Sequence[str]) -> list[ParkingStore]:
        """The stores that may hold ``entry_id``: its bucket in each queue, and the old keys."""
        return [*(self.shard(q, entry_id) for q in queues), self.legacy]

    def entry(self, entry_id: str) -> ParkedMessage | None:
        """The parked retry ``entry_id`` with its body, from whichever queue holds it."""
        for store in self._holders(entry_id, self.queues()):
            found = store.entry(entry_id)
            if found is not None:
                return found
        return None

    def remove(self, entry_ids: Sequence[str]) -> int:
        """Delete parked entries by id, wherever they are (an operator's purge)."""
        if not entry_ids:
            return 0
        queues = self.queues()
        groups: dict[int, tuple[ParkingStore, list[str]]] = {}
        for entry_id in entry_ids:
            for store in self._holders(entry_id, queues):
                groups.setdefault(id(store), (store, []))[1].append(entry_id)
        return sum(store.remove(ids) for store, ids in groups.values())

    # -- migration ------------------------------------------------------------------------------

    def migrate_legacy(self, *, dry_run: bool = False, batch: int = 500) -> Migration:
        """Move what the single-tag layout holds to each queue's keys: per entry, copy (meta,
        body and score, unless the queue's keys hold it already) then delete the original if its
        score is unchanged. Interrupted anywhere, a run again finishes the job and loses nothing;
        an entry a drain claims between the copy and the delete stays where it is and is drained
        from there, its copy later too (a duplicate: at-least-once).

        Args:
            dry_run: count what would move, per queue; change nothing.
            batch: entries read per round trip.
        """
        result = Migration(queues={})
        legacy = self.legacy.parked
        start = 0
        while True:
            rows = cast(
                "list[tuple[bytes, float]]",
                self.client.zrange(legacy.due, start, start + batch - 1, withscores=True),
            )
            if not rows:
                break
            ids = [r for r, _ in rows]
            metas = self.client.hmget(legacy.meta, ids)
            bodies = self.client.hmget(legacy.body, ids)
            kept = 0
            for (entry, score), meta, body in zip(rows, metas, bodies, strict=True):
                result.found += 1
                moved = self._move_one(entry, int(score), meta, body, result, dry_run=dry_run)
                kept += 0 if moved else 1
            # Deleted entries shift the ranks: read on after the ones left in place.
            start += kept
            if len(rows) < batch:
                break
        return result

    def _move_one(
        self,
        entry: bytes,
        score: int,
        meta: Any,
        body: Any,
        result: Migration,
        *,
        dry_run: bool,
    ) -> bool:
        """Copy then delete one entry; True when it left the single-tag keys."""
        try:
            queue = ParkedMessage.from_stored(meta, b"").queue if meta is not None else None
        except (ValueError, TypeError, KeyError):
            queue = None
        if queue is None:
            logger.error("parked entry %r has unreadable metadata; left in place", entry)
            result.left += 1
            return False
        assert result.queues is not None
        result.queues[queue] = result.queues.get(queue, 0) + 1
        if dry_run:
            return False
        self._index([queue])
        name = entry.decode() if isinstance(entry, bytes) else str(entry)
        target = self.shard(queue, name).parked
        keys = [target.due, target.meta, target.body]
        args = [entry, score, meta, body or b""]
        wanted = self.replicas.wanted(self.client, target.due)
        if wanted:  # the copy must outlive a failover before the original goes

            def copy(pipe: Any) -> None:
                self._copy(keys=keys, args=args, client=pipe)

            (copied,) = execute_replicated(
                self.client,
                target.due,
                copy,
                wanted,
                self.replicas.timeout,
                what=f"the copy of parked entry {entry!r}",
            )
        else:
            copied = self._copy(keys=keys, args=args)
        if copied:
            result.copied += 1
        else:
            result.present += 1
        legacy = self.legacy.parked
        if self._drop(keys=[legacy.due, legacy.meta, legacy.body], args=[entry, score]):
            result.moved += 1
            return True
        result.left += 1
        return False
