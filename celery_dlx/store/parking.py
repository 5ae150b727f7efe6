"""Redis parking store: delayed retries wait in sorted sets scored by due time.

Each shard (:mod:`celery_dlx.store.shards`: the app's tag, or a bucket of one queue) has three
keys (:class:`~celery_dlx.message.names.ParkedKeys`): ``parked:due`` (zset id -> due ms),
``parked:meta`` (hash id -> JSON) and ``parked:body`` (hash id -> raw bytes). Claiming is atomic
(Lua): due entries are re-scored to ``now + lease`` and returned, so a drain that dies after
claiming leaves them to be claimed again when the lease runs out. An entry is deleted only after
its publish is confirmed. Parking is idempotent per message id and attempt.

A park counts as done (the caller may ack the original) only once the replicas
``dlx_redis_min_replicas`` asks for hold it (:func:`~celery_dlx.store.client.execute_replicated`).
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from celery_dlx.fates import now_ms
from celery_dlx.message.names import PARKED_BUCKETS, Keys, ParkedKeys
from celery_dlx.message.parked import ParkedMessage, parks_named
from celery_dlx.store.client import (
    OneConnection,
    RedisClient,
    Replicas,
    execute_loading,
    execute_replicated,
    is_cluster,
    text,
)
from celery_dlx.store.shards import Layout, ShardSet, grouped

if TYPE_CHECKING:
    from redis.client import Pipeline

logger = logging.getLogger(__name__)

#: Entries read per shard and round trip by the merged reads (``peek``, ``soonest``).
PAGE = 200

# Claim up to ARGV[3] entries due at ARGV[1] (ms): move their score to ARGV[2] (lease end) and
# return [id, claimed-score, meta, body, ...]. Entries whose meta vanished are dropped from the zset.
_CLAIM = """
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, id in ipairs(ids) do
  local meta = redis.call('HGET', KEYS[2], id)
  if meta then
    redis.call('ZADD', KEYS[1], 'XX', ARGV[2], id)
    table.insert(out, id)
    table.insert(out, meta)
    table.insert(out, redis.call('HGET', KEYS[3], id) or '')
  else
    redis.call('ZREM', KEYS[1], id)
  end
end
return out
"""

# Park each entry (ARGV: id, due, meta, body of each in turn) unless it exists; returns 1 (stored)
# or 0 (there already) per entry. An entry already there is written back as it is: that write is
# replicated, so the caller's WAIT also covers an entry another client parked and had not seen
# replicated (a worker whose WAIT failed, then the DLX service parking its letter).
_PARK_MANY = """
local out = {}
for i = 1, #ARGV, 4 do
  local id = ARGV[i]
  local held = redis.call('HGET', KEYS[2], id)
  if held then
    redis.call('HSET', KEYS[2], id, held)
    out[#out + 1] = 0
  else
    redis.call('HSET', KEYS[2], id, ARGV[i + 2])
    redis.call('HSET', KEYS[3], id, ARGV[i + 3])
    redis.call('ZADD', KEYS[1], ARGV[i + 1], id)
    out[#out + 1] = 1
  end
end
return out
"""

# Delete entries only if still leased with the score this claim gave them (ARGV pairs id, score):
# an entry re-claimed by another drain after our lease ran out is left to that drain.
_ACK = """
local n = 0
for i = 1, #ARGV, 2 do
  local score = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if score and tonumber(score) == tonumber(ARGV[i + 1]) then
    redis.call('ZREM', KEYS[1], ARGV[i])
    redis.call('HDEL', KEYS[2], ARGV[i])
    redis.call('HDEL', KEYS[3], ARGV[i])
    n = n + 1
  end
end
return n
"""


# An operator's action on one entry (ARGV: id, due, new due, new metadata) unless a drain holds
# it (a claim re-scores an entry from its due time to its lease end). New metadata: due at the
# new time (retry now: score and metadata change together, so a score still tells a claimed
# entry); "": deleted (bury now). Returns 1 if done, 0 if gone or claimed.
_OPERATE = """
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not score or tonumber(score) ~= tonumber(ARGV[2]) then return 0 end
if ARGV[4] == '' then
  redis.call('ZREM', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[2], ARGV[1])
  redis.call('HDEL', KEYS[3], ARGV[1])
else
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
  redis.call('ZADD', KEYS[1], 'XX', ARGV[3], ARGV[1])
end
return 1
"""


def _park_args(messages: Sequence[ParkedMessage]) -> list[Any]:
    args: list[Any] = []
    for m in messages:
        args += (m.entry_id, m.due_ms, m.meta_json(), m.body)
    return args


class _Scripts:
    """The parking scripts, registered once per store for all its shards."""

    def __init__(self, client: RedisClient) -> None:
        self.claim = client.register_script(_CLAIM)
        self.park_many = client.register_script(_PARK_MANY)
        self.ack = client.register_script(_ACK)
        self.operate = client.register_script(_OPERATE)


class ParkedShard:
    """The parked retries under one hash tag: three keys and the scripts over them."""

    def __init__(
        self, client: RedisClient, parked: ParkedKeys, scripts: _Scripts, replicas: Replicas
    ) -> None:
        self.client = client
        self.parked = parked
        self.scripts = scripts
        self.replicas = replicas
        self.keys = [parked.due, parked.meta, parked.body]

    def wanted(self) -> int:
        return self.replicas.wanted(self.client, self.parked.due)

    def put(self, args: Sequence[Any], what: str) -> list[bool]:
        """Store entries as stored (id, score, metadata, body each) unless there, confirmed by
        the replicas wanted; per entry, False if it was there already."""
        script = self.scripts.park_many
        wanted = self.wanted()
        if not wanted:
            return [bool(r) for r in script(keys=self.keys, args=list(args))]
        (stored,) = execute_replicated(
            self.client,
            self.parked.due,
            lambda pipe: script(keys=self.keys, args=list(args), client=pipe),
            wanted,
            self.replicas.timeout,
            what=what,
        )
        return [bool(r) for r in stored]

    def page(self, start: int, count: int) -> list[tuple[str, int, Any, Any]]:
        """``(entry id, score, metadata, body)`` as stored from rank ``start``, in due order."""
        rows: Any = self.client.zrange(self.parked.due, start, start + count - 1, withscores=True)
        if not rows:
            return []
        ids = [r for r, _ in rows]
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.parked.meta, ids)
        pipe.hmget(self.parked.body, ids)
        metas, bodies = pipe.execute()
        return [
            (text(i), int(score), meta, body)
            for (i, score), meta, body in zip(rows, metas, bodies, strict=True)
        ]

    def claim(self, limit: int, lease_ms: int, now: int) -> list[ParkedMessage]:
        lease_end = now + lease_ms
        raw = self.scripts.claim(keys=self.keys, args=[now, lease_end, limit])
        out = []
        for i in range(0, len(raw), 3):
            try:
                out.append(ParkedMessage.from_stored(raw[i + 1], raw[i + 2], lease_score=lease_end))
            except (ValueError, KeyError, TypeError):
                # A corrupt entry is left leased, not deleted: it stays visible to `dlx parked`.
                logger.error("parked entry %r has unreadable metadata; left in place", raw[i])
        return out

    def ack(self, messages: Iterable[ParkedMessage]) -> int:
        return self.delete_if_scored([(m.entry_id, m.lease_score) for m in messages])

    def delete_if_scored(self, entries: Sequence[tuple[str, int]]) -> int:
        """Delete each ``(entry id, score)`` still scored so (not claimed since); how many."""
        args = [x for pair in entries for x in pair]
        return int(self.scripts.ack(keys=self.keys, args=args)) if args else 0

    def remove(self, entry_ids: Sequence[str]) -> int:
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.parked.due, *entry_ids)
        pipe.hdel(self.parked.meta, *entry_ids)
        pipe.hdel(self.parked.body, *entry_ids)
        return int(pipe.execute()[0])

    def rows(self, page: int) -> Iterator[tuple[float, str, ParkedShard]]:
        start = 0
        while True:
            rows: Any = self.client.zrange(
                self.parked.due, start, start + page - 1, withscores=True
            )
            for entry, score in rows:
                yield score, text(entry), self
            if len(rows) < page:
                return
            start += len(rows)


class ParkingStore:
    """Parked retries in Redis, in the single-tag layout or sharded by queue.

    Args:
        replicas: the replicas a park must reach before it counts (default none).
        per_queue: keys per queue (``dlx_redis_shards``).
    """

    def __init__(
        self,
        client: RedisClient,
        keys: Keys | None = None,
        replicas: Replicas | None = None,
        *,
        per_queue: bool = False,
    ) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.replicas = replicas or Replicas()
        self.scripts = _Scripts(client)
        layout = Layout(self.keys, per_queue=per_queue, buckets=PARKED_BUCKETS)
        self.shards: ShardSet[ParkedShard] = ShardSet(
            client,
            layout,
            self.keys.parked_queues,
            "parked",
            lambda tag: ParkedShard(client, ParkedKeys(tag), self.scripts, self.replicas),
            self.replicas,
        )
        self._lock = threading.Lock()
        # In the per-queue layout, entries this process claimed from the app-tag shard (what an
        # older version parked there), by (entry id, lease score): acked and released there.
        self._from_home: set[tuple[str, int]] = set()
        self._turn = itertools.count()

    @property
    def per_queue(self) -> bool:
        return self.shards.layout.per_queue

    def load_scripts(self) -> None:
        """Load the Lua scripts into Redis (every master of a cluster) now, not at first use."""
        s = self.scripts
        for script in (s.claim, s.park_many, s.ack, s.operate):
            self.client.script_load(script.script)  # redis-py computed script.sha already

    def queues(self) -> list[str]:
        return self.shards.queues()

    def shard(self, queue: str, entry_id: str) -> ParkedShard:
        return self.shards.shard(queue, entry_id)

    def park(self, message: ParkedMessage) -> bool:
        """Store ``message`` until ``message.due_ms``. Returns False if that id+attempt is parked.

        Raises:
            NotReplicated: stored on the master, but fewer replicas than
                ``dlx_redis_min_replicas`` confirmed it: not a park to ack on.
            redis.RedisError: not stored (or not known to be).
        """
        (stored,) = self.park_many([message])
        return stored

    def park_many(
        self, messages: Sequence[ParkedMessage], *, pipeline: Pipeline | None = None
    ) -> list[bool]:
        """Park a batch, one script call per shard; per message, False if already parked.
        In ``pipeline`` (from :meth:`transaction`) it is queued, its reply that list of 1 and
        0, and [] is returned.

        Raises:
            NotReplicated: as :meth:`park`.
            redis.RedisError: not stored (or not known to be); with several shards, the first
                that failed (the others may have gone in: a park is idempotent).
        """
        if not messages:
            return []
        if pipeline is not None:  # a bare EVALSHA: no SCRIPT EXISTS round trip
            keys = self.shards.home.keys
            pipeline.evalsha(self.scripts.park_many.sha, len(keys), *keys, *_park_args(messages))
            return []
        self.shards.add_queues(m.queue for m in messages)
        out = [False] * len(messages)
        for shard, where in grouped(
            (self.shard(m.queue, m.entry_id), i) for i, m in enumerate(messages)
        ):
            batch = [messages[i] for i in where]
            stored = shard.put(_park_args(batch), parks_named(batch))
            for i, ok in zip(where, stored, strict=True):
                out[i] = ok
        return out

    def transaction(self, queue: Callable[[Pipeline], None], what: str) -> list[Any] | None:
        """Run the writes ``queue`` adds to a pipeline (:meth:`park_many`, the history's) in one
        ``MULTI``/``EXEC`` confirmed by the replicas wanted (``what`` names them): the replies,
        an error in place of a command Redis refused (those after it went in). None, without
        calling ``queue``, in the per-queue layout (the history is in another slot) or on a
        Redis Cluster (its pipeline takes no script).

        Raises:
            NotReplicated: the transaction went to the master, but fewer replicas confirmed it.
            redis.RedisError: it was not sent, or discarded (nothing was written).
        """
        if self.per_queue or is_cluster(self.client):
            return None
        home = self.shards.home
        wanted = home.wanted()
        if not wanted:
            return self._transaction(self.client, queue)
        with OneConnection(self.client, home.parked.due) as one:
            replies = self._transaction(one.client, queue)
            one.wait(wanted, self.replicas.timeout, what)
        return replies

    def _transaction(self, client: RedisClient, queue: Callable[[Pipeline], None]) -> list[Any]:
        pipe = client.pipeline(transaction=True)
        queue(pipe)
        scripts = {self.scripts.park_many.sha: _PARK_MANY}
        return execute_loading(pipe, client, scripts)

    def claim(self, limit: int, lease_ms: int, now: int | None = None) -> list[ParkedMessage]:
        """Claim up to ``limit`` due entries for ``lease_ms``, hidden from other claims. Over
        several shards, a share per shard first (a backlog starves no other queue), the rest
        from shards that had more; the first shard turns from call to call."""
        now = now_ms() if now is None else now
        every = self.shards.every()
        if len(every) == 1:
            return every[0].claim(limit, lease_ms, now)
        # One pipelined count first, so a claim runs only where something is due.
        counts = self.shards.ask(lambda pipe, s: pipe.zcount(s.parked.due, "-inf", now), every)
        due = [s for s, n in zip(every, counts, strict=True) if int(n)]
        if not due:
            return []
        start = next(self._turn) % len(due)
        due = due[start:] + due[:start]
        share = max(1, -(-limit // len(due)))
        out: list[ParkedMessage] = []
        full: list[ParkedShard] = []
        for shard in due:
            if len(out) >= limit:
                break
            got = self._claim_from(shard, min(share, limit - len(out)), lease_ms, now)
            out.extend(got)
            if len(got) == share:
                full.append(shard)
        for shard in full:
            if len(out) >= limit:
                break
            out.extend(self._claim_from(shard, limit - len(out), lease_ms, now))
        return out

    def _claim_from(
        self, shard: ParkedShard, limit: int, lease_ms: int, now: int
    ) -> list[ParkedMessage]:
        got = shard.claim(limit, lease_ms, now)
        if shard is self.shards.home and self.per_queue and got:
            with self._lock:
                self._from_home.update((m.entry_id, m.lease_score) for m in got)
        return got

    def ack(self, messages: Iterable[ParkedMessage]) -> int:
        """Delete claimed entries whose publish was confirmed. Returns how many were deleted."""
        listed = list(messages)
        return sum(shard.ack([listed[i] for i in where]) for shard, where in self._grouped(listed))

    def release(self, messages: Iterable[ParkedMessage], due_ms: int | None = None) -> None:
        """Make claimed entries due again (at ``due_ms``, default now) after a failed publish."""
        when = now_ms() if due_ms is None else due_ms
        listed = list(messages)
        for shard, where in self._grouped(listed):
            pipe = self.client.pipeline(transaction=False)
            for i in where:
                pipe.zadd(shard.parked.due, {listed[i].entry_id: when}, xx=True)
            pipe.execute()

    def _grouped(self, listed: list[ParkedMessage]) -> list[tuple[ParkedShard, list[int]]]:
        pairs = []
        with self._lock:
            for i, m in enumerate(listed):
                mark = (m.entry_id, m.lease_score)
                if mark in self._from_home:
                    self._from_home.discard(mark)
                    pairs.append((self.shards.home, i))
                else:
                    pairs.append((self.shard(m.queue, m.entry_id), i))
        return grouped(pairs)

    def count(self) -> int:
        """How many retries are parked (claimed ones included), over every shard."""
        return sum(int(n) for n in self.shards.ask(lambda pipe, s: pipe.zcard(s.parked.due)))

    def due_count(self, now: int | None = None) -> int:
        now = now_ms() if now is None else now
        counts = self.shards.ask(lambda pipe, s: pipe.zcount(s.parked.due, "-inf", now))
        return sum(int(n) for n in counts)

    def _merged(self, page: int) -> Iterator[tuple[float, str, ParkedShard]]:
        return heapq.merge(*(s.rows(page) for s in self.shards.every()), key=lambda r: r[0])

    def _metas(self, rows: list[tuple[float, str, ParkedShard]]) -> Iterator[ParkedMessage]:
        """The entries of ``rows`` without bodies, in order; gone or unreadable ones skipped."""
        metas: list[Any] = [None] * len(rows)
        for shard, where in grouped((shard, i) for i, (_, _, shard) in enumerate(rows)):
            found = self.client.hmget(shard.parked.meta, [rows[i][1] for i in where])
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
        """Parked retries by due time, without claiming them."""
        page = max(1, min(PAGE, limit + offset))
        rows = list(itertools.islice(self._merged(page), offset, offset + limit))
        return list(self._metas(rows))

    def soonest(self, limit: int, batch: int = 1000) -> Iterator[ParkedMessage]:
        """The ``limit`` soonest-due retries without bodies (unreadable ones skipped);
        ``lease_score`` is each one's due time (or lease end), ms."""
        merged = self._merged(min(PAGE, batch, max(limit, 1)))
        read = 0
        while read < limit:
            rows = list(itertools.islice(merged, min(batch, limit - read)))
            if not rows:
                return
            yield from self._metas(rows)
            read += len(rows)

    def entry(self, entry_id: str) -> ParkedMessage | None:
        """The parked retry ``entry_id`` with its body, or None (gone, or unreadable)."""
        for shard in self.shards.holders(entry_id, self.queues()):
            pipe = self.client.pipeline(transaction=False)
            pipe.hget(shard.parked.meta, entry_id)
            pipe.hget(shard.parked.body, entry_id)
            meta, body = pipe.execute()
            if meta is None:
                continue
            try:
                return ParkedMessage.from_stored(meta, bytes(body or b""))
            except (ValueError, TypeError, KeyError):
                continue
        return None

    def make_due(self, message: ParkedMessage, now: int | None = None) -> bool:
        """Make the parked retry ``message`` due now (an operator's "retry now"); False when it
        is gone or a drain holds it."""
        at = now_ms() if now is None else now
        return self._operate(message, at, replace(message, due_ms=at).meta_json())

    def take(self, message: ParkedMessage) -> bool:
        """Delete the parked retry ``message`` (an operator's "bury now"); False when it is gone
        or a drain holds it."""
        return self._operate(message, 0, "")

    def _operate(self, message: ParkedMessage, due: int, meta: str) -> bool:
        args: list[Any] = [message.entry_id, message.due_ms, due, meta]
        return any(
            int(self.scripts.operate(keys=shard.keys, args=args))
            for shard in self.shards.holders(message.entry_id, self.queues())
        )

    def remove(self, entry_ids: Sequence[str]) -> int:
        """Delete parked entries by id, wherever they are (an operator's purge)."""
        if not entry_ids:
            return 0
        queues = self.queues()
        pairs = [
            (shard, i)
            for i, entry_id in enumerate(entry_ids)
            for shard in self.shards.holders(entry_id, queues)
        ]
        return sum(shard.remove([entry_ids[i] for i in where]) for shard, where in grouped(pairs))
