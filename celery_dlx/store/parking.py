"""Redis parking store: delayed retries wait in a sorted set scored by due time.

Layout (see :class:`celery_dlx.message.names.Keys`): ``parked:due`` (zset id -> due ms), ``parked:meta``
(hash id -> JSON) and ``parked:body`` (hash id -> raw bytes). Claiming is atomic (Lua): due entries
are re-scored to ``now + lease`` and returned, so a drain that dies after claiming leaves them to be
claimed again when the lease runs out. An entry is deleted only after its publish is confirmed.
Parking is idempotent per message id and attempt.

A park counts as done (the caller may ack the original) only once the replicas
``dlx_redis_min_replicas`` asks for hold it: each park's write is followed by ``WAIT`` on the same
connection (:func:`~celery_dlx.store.client.execute_replicated`), and raises
:class:`~celery_dlx.store.client.NotReplicated` when fewer replicas confirmed it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, cast

from redis.exceptions import NoScriptError

from celery_dlx.fates import FateEvent, now_ms
from celery_dlx.message.names import Keys, ParkedKeys
from celery_dlx.message.parked import ParkedMessage, park_each
from celery_dlx.store.client import (
    RedisClient,
    Replicas,
    execute_replicated,
    is_cluster,
)
from celery_dlx.store.counters import add_counts

logger = logging.getLogger(__name__)

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

# Park one entry unless it exists, so a second park of the same id and attempt changes nothing.
# Returns 1 if stored, 0 if it was already there. An entry already there is written back as it is:
# that write is replicated, so the caller's WAIT also covers an entry another client parked and
# had not seen replicated (a worker whose WAIT failed, then the DLX service parking its letter).
_PARK = """
local held = redis.call('HGET', KEYS[2], ARGV[1])
if held then
  redis.call('HSET', KEYS[2], ARGV[1], held)
  return 0
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
redis.call('HSET', KEYS[3], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[1])
return 1
"""

# _PARK for a batch (ARGV: id, due, meta, body of each entry in turn), in one call: a script call
# per entry costs the client a command to pack and a reply to parse, and the server a script run.
# Returns 1 or 0 per entry, as _PARK would.
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


def _park_args(messages: Sequence[ParkedMessage]) -> list[Any]:
    """The park scripts' arguments for ``messages``: id, due time, metadata JSON, body each."""
    args: list[Any] = []
    for m in messages:
        args += (m.entry_id, m.due_ms, m.meta_json(), m.body)
    return args


class ParkingStore:
    """Parked retries in Redis.

    Args:
        client: a ``redis.Redis`` (or ``RedisCluster``) client; bytes responses.
        keys: the key layout (prefix).
        replicas: the replicas a park must reach before it counts (default none).
    """

    def __init__(
        self,
        client: RedisClient,
        keys: Keys | None = None,
        replicas: Replicas | None = None,
        *,
        parked: ParkedKeys | None = None,
    ) -> None:
        self.client = client
        self.keys = keys or Keys()
        self.replicas = replicas or Replicas()
        #: The three keys this store reads and writes: the app's single-tag ones by default, or
        #: one queue's (:class:`~celery_dlx.store.sharded.ShardedParking`).
        self.parked = parked or self.keys.parked_legacy
        self._claim = client.register_script(_CLAIM)
        self._park = client.register_script(_PARK)
        self._park_many = client.register_script(_PARK_MANY)
        self._ack = client.register_script(_ACK)

    def load_scripts(self) -> None:
        """Load the Lua scripts into Redis now (the first call otherwise pays for it)."""
        for script in (self._claim, self._park, self._park_many, self._ack):
            self.client.script_load(script.script)  # redis-py computed script.sha already

    @property
    def _kk(self) -> list[str]:
        return [self.parked.due, self.parked.meta, self.parked.body]

    def _wanted(self) -> int:
        """How many replicas a park must reach (``dlx_redis_min_replicas``, resolved)."""
        return self.replicas.wanted(self.client, self.parked.due)

    def _replicated(
        self, queue: Any, wanted: int, what: str, *, transaction: bool = False
    ) -> list[Any]:
        return execute_replicated(
            self.client,
            self.parked.due,
            queue,
            wanted,
            self.replicas.timeout,
            what=what,
            transaction=transaction,
            raise_on_error=not transaction,
        )

    def park(self, message: ParkedMessage) -> bool:
        """Store ``message`` until ``message.due_ms``. Returns False if that id+attempt is parked.

        Raises:
            NotReplicated: stored on the master, but fewer replicas than
                ``dlx_redis_min_replicas`` confirmed it: not a park to ack on.
            redis.RedisError: not stored (or not known to be).
        """
        args = _park_args([message])
        wanted = self._wanted()
        if not wanted:
            return bool(self._park(keys=self._kk, args=args))
        (stored,) = self._replicated(
            lambda pipe: self._park(keys=self._kk, args=args, client=pipe),
            wanted,
            f"the park of {message.entry_id}",
        )
        return bool(stored)

    def park_many(self, messages: Sequence[ParkedMessage]) -> list[bool]:
        """Park a batch in one Redis round trip (one script call); per message, False if
        already parked.

        Raises:
            NotReplicated: stored on the master, but fewer replicas than
                ``dlx_redis_min_replicas`` confirmed the batch: none of it counts as parked.
            redis.RedisError: not stored (or not known to be).
        """
        if not messages:
            return []
        args = _park_args(messages)
        wanted = self._wanted()
        if not wanted:
            return [bool(r) for r in self._park_many(keys=self._kk, args=args)]
        what = f"a batch of {len(messages)} park(s)"
        (stored,) = self._replicated(
            lambda pipe: self._park_many(keys=self._kk, args=args, client=pipe), wanted, what
        )
        return [bool(r) for r in stored]

    def claim(self, limit: int, lease_ms: int, now: int | None = None) -> list[ParkedMessage]:
        """Claim up to ``limit`` due entries for ``lease_ms``; they are hidden from other claims."""
        now = now_ms() if now is None else now
        lease_end = now + lease_ms
        raw = self._claim(keys=self._kk, args=[now, lease_end, limit])
        out = []
        for i in range(0, len(raw), 3):
            try:
                out.append(ParkedMessage.from_stored(raw[i + 1], raw[i + 2], lease_score=lease_end))
            except (ValueError, KeyError, TypeError):
                # A corrupt entry is left leased, not deleted: it stays visible to `dlx parked`.
                logger.error("parked entry %r has unreadable metadata; left in place", raw[i])
        return out

    def ack(self, messages: Iterable[ParkedMessage]) -> int:
        """Delete claimed entries whose publish was confirmed. Returns how many were deleted."""
        args: list[Any] = []
        for m in messages:
            args.extend((m.entry_id, m.lease_score))
        if not args:
            return 0
        return int(self._ack(keys=self._kk, args=args))

    def release(self, messages: Iterable[ParkedMessage], due_ms: int | None = None) -> None:
        """Make claimed entries due again (at ``due_ms``, default now) after a failed publish."""
        when = now_ms() if due_ms is None else due_ms
        pipe = self.client.pipeline(transaction=False)
        for m in messages:
            pipe.zadd(self.parked.due, {m.entry_id: when}, xx=True)
        pipe.execute()

    def count(self) -> int:
        """How many retries are parked (claimed ones included)."""
        return int(self.client.zcard(self.parked.due))

    def due_count(self, now: int | None = None) -> int:
        return int(self.client.zcount(self.parked.due, "-inf", now_ms() if now is None else now))

    def peek(self, limit: int = 100, offset: int = 0) -> list[ParkedMessage]:
        """Parked retries by due time, without claiming them."""
        ids = cast(
            "list[tuple[bytes, float]]",
            self.client.zrange(self.parked.due, offset, offset + limit - 1, withscores=True),
        )
        if not ids:
            return []
        metas = self.client.hmget(self.parked.meta, [i for i, _ in ids])
        out = []
        for (_, score), meta in zip(ids, metas, strict=True):
            if meta is None:
                continue
            msg = ParkedMessage.from_stored(meta, b"", lease_score=int(score))
            out.append(msg)
        return out

    def remove(self, entry_ids: Sequence[str]) -> int:
        """Delete parked entries by id (an operator's purge)."""
        if not entry_ids:
            return 0
        pipe = self.client.pipeline(transaction=False)
        pipe.zrem(self.parked.due, *entry_ids)
        pipe.hdel(self.parked.meta, *entry_ids)
        pipe.hdel(self.parked.body, *entry_ids)
        return int(pipe.execute()[0])

    def entry(self, entry_id: str) -> ParkedMessage | None:
        """The parked retry ``entry_id`` with its body, or None (gone, or unreadable)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hget(self.parked.meta, entry_id)
        pipe.hget(self.parked.body, entry_id)
        meta, body = pipe.execute()
        if meta is None:
            return None
        try:
            return ParkedMessage.from_stored(meta, bytes(body or b""))
        except (ValueError, TypeError, KeyError):
            return None

    def soonest(self, limit: int, batch: int = 1000) -> Iterator[ParkedMessage]:
        """The ``limit`` soonest-due retries (without bodies), in due order; entries gone or
        unreadable are skipped. ``lease_score`` is each one's due (or lease end) in ms."""
        read = 0
        while read < limit:
            rows = cast(
                "list[tuple[bytes, float]]",
                self.client.zrange(
                    self.parked.due, read, min(limit, read + batch) - 1, withscores=True
                ),
            )
            if not rows:
                return
            metas = self.client.hmget(self.parked.meta, [r for r, _ in rows])
            for (_, score), meta in zip(rows, metas, strict=True):
                if meta is None:
                    continue
                try:
                    yield ParkedMessage.from_stored(meta, b"", lease_score=int(score))
                except (ValueError, TypeError, KeyError):
                    continue
            read += len(rows)
            if len(rows) < batch:
                return

    def park_recorded(
        self, message: ParkedMessage, events: Sequence[FateEvent]
    ) -> bool | BaseException:
        """Park ``message`` and append ``events`` to the history and counters, in one
        ``MULTI``/``EXEC`` where the client allows it.

        Returns:
            True when the park and the record went in; the history's error when the park went in
            and its record did not; False when the record was not attempted (a Redis Cluster:
            the caller records the events itself).

        Raises:
            NotReplicated: the park and its record went to the master, but fewer replicas than
                ``dlx_redis_min_replicas`` confirmed them: not a park to ack on (the history
                holds the entry; the dead-letter path that follows records the fate again).
            redis.RedisError, ...: the message is not parked (and nothing was recorded).
        """
        (outcome,), recorded = self.park_recorded_many([message], events)
        if outcome is not None:
            raise outcome
        return recorded

    def park_recorded_many(
        self, messages: Sequence[ParkedMessage], events: Sequence[FateEvent]
    ) -> tuple[list[BaseException | None], bool | BaseException]:
        """Park ``messages`` and append ``events`` (their fates) to the history and counters,
        all in one ``MULTI``/``EXEC`` (one round trip, one ``WAIT`` where replicas are wanted).

        Returns:
            Per message, None when it is parked (or was already) or the error that kept it out;
            and, as :meth:`park_recorded` returns it, whether the record went in.

        Raises:
            NotReplicated: the batch went to the master, but fewer replicas than
                ``dlx_redis_min_replicas`` confirmed it: none of it counts as parked.
            redis.RedisError, ...: the transaction failed (nothing is parked or recorded).
        """
        if is_cluster(self.client):
            outcomes: list[BaseException | None] = []
            for message in messages:
                try:
                    self.park(message)
                    outcomes.append(None)
                except Exception as err:
                    outcomes.append(err)
            return outcomes, False
        from celery_dlx.store.history import History

        history = History(self.client, self.keys)
        payload = ""

        def queue(pipe: Any) -> None:
            # One script call parks the batch and one appends its fates (bare EVALSHAs: no
            # SCRIPT EXISTS round trip), then the counters: packing arguments is most of what a
            # write costs the client, and this runs on the worker's main process.
            nonlocal payload
            args = _park_args(messages)
            pipe.evalsha(self._park_many.sha, len(self._kk), *self._kk, *args)
            payload = history.queue_batch(pipe, events) if events else ""
            add_counts(pipe, self.keys, events)

        wanted = self._wanted()
        if wanted:
            what = (
                f"the park of {messages[0].entry_id}"
                if len(messages) == 1
                else f"the parks of {len(messages)} messages"
            )
            results = self._replicated(queue, wanted, what, transaction=True)
        else:
            pipe = self.client.pipeline(transaction=True)
            queue(pipe)
            results = pipe.execute(raise_on_error=False)
        parked, rest = results[0], list(results[1:])
        if isinstance(parked, NoScriptError):  # Redis restarted: the rest went in
            outcomes = park_each(self.park, messages)
        elif isinstance(parked, Exception):
            outcomes = [parked] * len(messages)
        else:
            outcomes = [None] * len(messages)  # 1 parked now, 0 parked before
        if payload and rest and isinstance(rest[0], NoScriptError):
            rest[0] = history.append_loading(payload)
        failed = next((r for r in rest if isinstance(r, Exception)), None)
        return outcomes, True if failed is None else failed
