"""The graveyard sharded by queue: each queue's obituaries under a hash tag of their own.

Each queue's obituaries, payloads, indexes (time, queue, task, cause, message), cause groups
with their per-version stats, the replay ledger of its obituaries, and the names it knows live
under ``{prefix:q:QUEUE:BUCKET}:graveyard:*`` (the hash tag of the queue's parked-retry bucket of
the same number), in :data:`BUCKETS` buckets per queue (the CRC-32 of the
obituary id picks one; each a :class:`~celery_dlx.store.graveyard.Graveyard` with that ``tag``),
so a burial's Lua script still touches one slot and a Redis Cluster spreads the buckets over its
masters, those of one busy queue too. A set under the app's tag (``{prefix}:graveyard:shards``) names the queues that have
keys; a queue is added before its first burial, so no obituary is ever outside it.

Cross-queue reads read that set, then each queue's indexes:

- ``ids`` (``dlx list``): one page of each queue's driving index at a time, merged lazily by
  burial time (:func:`heapq.merge`): a first page of ``dlx list`` never reads every obituary.
- ``count``, ``names``, ``version_times``: one pipelined command per queue, summed or merged
  (a version's first sighting is the earliest over the queues).
- ``groups`` / ``groups_of``: a cause fingerprint is scoped by task (or by queue for foreign
  messages), so one cause may have obituaries in several queues: its group is the sum of its
  per-queue groups (count, lifetime total, versions), first and last seen the min and max, the
  example, queue, task and exception of the latest burial, the first version that of the
  earliest group start.
- ``load(ids)`` and the replay ledger: an obituary id does not tell its queue (ids are stable
  and derived from the message, never re-minted), and a lookup hash id -> queue under the app's
  tag would be written outside the burial's script (another slot) and could disagree with it.
  The id does tell its bucket, so a load asks that bucket of every queue for the ids (one
  ``HMGET`` per queue and bucket asked, pipelined: a round trip per master) and keeps what it
  finds. Its cost grows with the number of queues, not with
  the graveyard.

The ``buried``, ``purged`` and ``archived`` history entries stay in the app's one history
stream (another slot than the queue's), so they are no longer written by the obituary's own
script: a burial appends its entry right after its script wrote the obituary (a crash between
the two leaves the obituary without its ``buried`` entry), a removal appends its entry before
its script deletes the obituary (a crash between the two leaves the obituary in place, with an
extra entry: nothing is ever evicted without its record in the history).

A burial waits for ``dlx_redis_min_replicas`` on its own bucket's master (``WAIT`` on that
connection; the DLX service's :meth:`~celery_dlx.wiring.runtime.Runtime.replicated` block waits
only on the app's master). Written but not confirmed, it raises
:class:`~celery_dlx.store.client.NotReplicated` after appending its history entry, since the
caller's retry will find the obituary there and write nothing.
"""

from __future__ import annotations

import heapq
import json
import logging
import threading
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from celery_dlx.fates import FateEvent
from celery_dlx.message.names import Keys
from celery_dlx.message.obituary import Obituary
from celery_dlx.store.client import NotReplicated, RedisClient, Replicas, execute_replicated
from celery_dlx.store.graveyard import (
    _REMOVE_SHARD,
    CHUNK,
    GROUP_READS,
    Filters,
    Graveyard,
    Group,
    _needs_post_filter,
    text,
)
from celery_dlx.store.history import History

logger = logging.getLogger(__name__)


#: Buckets of one queue's graveyard: an obituary's bucket is the CRC-32 of its id modulo this, so
#: the obituaries of one queue (and of a few queues) spread over as many hash slots. Fixed:
#: changing it would strand obituaries in buckets nothing reads.
BUCKETS = 4


def shard_tag(keys: Keys, queue: str, bucket: int) -> str:
    """The hash tag of one bucket of ``queue``'s graveyard keys: that of the queue's parked-retry
    bucket of the same number (``{prefix:q:QUEUE:BUCKET}``), so the key names keep one builder."""
    return keys.parked_shard(queue, bucket).base


def bucket_of(obituary_id: str) -> int:
    return zlib.crc32(obituary_id.encode()) % BUCKETS


class ShardedGraveyard:
    """The graveyard role over one :class:`Graveyard` per queue (same methods as it).

    Args:
        client: the client of ``dlx_redis_url`` (a ``RedisCluster`` on a cluster URL).
        keys: the app's key layout.
        replicas: the replicas a burial must reach: each bucket's burials wait on their own
            master (``WAIT``), since a queue's keys need not be on the master a caller's
            :meth:`~celery_dlx.wiring.runtime.Runtime.replicated` block waits on.
    """

    def __init__(self, client: RedisClient, keys: Keys, replicas: Replicas | None = None) -> None:
        self.client = client
        self.keys = keys
        self.replicas = replicas or Replicas()
        self.history = History(client, keys)
        self.index = keys.graveyard("shards")
        #: The single-tag graveyard (what an older version buried; moved by :func:`migrate`).
        self.legacy = Graveyard(client, keys)
        self._shards: dict[tuple[str, int], Graveyard] = {}
        self._indexed: set[str] = set()
        self._lock = threading.RLock()

    # -- shards ---------------------------------------------------------------------------------

    def shard(self, queue: str, obituary_id: str) -> Graveyard:
        """The graveyard (bucket) ``queue``'s obituary ``obituary_id`` lives in."""
        return self._bucket(queue, bucket_of(obituary_id))

    def _bucket(self, queue: str, bucket: int) -> Graveyard:
        with self._lock:
            yard = self._shards.get((queue, bucket))
            if yard is None:
                tag = shard_tag(self.keys, queue, bucket)
                yard = Graveyard(self.client, self.keys, tag=tag)
                self._shards[(queue, bucket)] = yard
            return yard

    def queues(self) -> list[str]:
        """The queues that have graveyard keys (the index), sorted."""
        members = cast("set[Any]", self.client.smembers(self.index))
        return sorted(text(m) for m in members)

    def shards(self, queue: str | None = None) -> list[Graveyard]:
        """Every bucket of ``queue`` (default: of every queue)."""
        queues = self.queues() if queue is None else [queue]
        return [self._bucket(q, b) for q in queues for b in range(BUCKETS)]

    def _index(self, queues: Iterable[str]) -> None:
        """Add ``queues`` to the index before anything is buried under their keys (once per
        process and queue), on as many replicas as a burial waits for."""
        new = sorted(set(queues) - self._indexed)
        if not new:
            return
        wanted = self.replicas.wanted(self.client, self.index)
        if wanted:

            def add(pipe: Any) -> None:
                pipe.sadd(self.index, *new)

            execute_replicated(
                self.client,
                self.index,
                add,
                wanted,
                self.replicas.timeout,
                what=f"the index of {len(new)} graveyard queue(s)",
            )
        else:
            self.client.sadd(self.index, *new)
        with self._lock:
            self._indexed.update(new)

    def _write(self, yard: Graveyard, items: Sequence[tuple[Obituary, FateEvent]]) -> list[bool]:
        """One bucket's burials, confirmed by its master's replicas when any are wanted."""
        wanted = self.replicas.wanted(self.client, yard.records)
        if not wanted:
            return yard.write_many(items)
        calls = yard.write_calls(items)

        def write(pipe: Any) -> None:
            for keys, args in calls:
                yard._write(keys=keys, args=args, client=pipe)

        done = execute_replicated(
            self.client,
            yard.records,
            write,
            wanted,
            self.replicas.timeout,
            what=f"{len(calls)} obituaries of {yard.tag}",
        )
        return [bool(r) for r in done]

    # -- writes ---------------------------------------------------------------------------------

    def write_many(self, items: Sequence[tuple[Obituary, FateEvent]]) -> list[bool]:
        """Write obituaries (each in its queue's slot), then their ``buried`` history entries
        and the deletion of the workers' cause records (under the app's tag).

        Returns:
            Per obituary, True if it was written now, False if it was there already.

        Raises:
            NotReplicated: written, but fewer replicas than ``dlx_redis_min_replicas`` confirmed.
            redis.RedisError: not written (or not known to be); the caller retries.
        """
        if not items:
            return []
        self._index(ob.queue for ob, _ in items)
        by_shard: dict[int, tuple[Graveyard, list[int]]] = {}
        for i, (ob, _) in enumerate(items):
            yard = self.shard(ob.queue, ob.id)
            by_shard.setdefault(id(yard), (yard, []))[1].append(i)
        out = [False] * len(items)
        unconfirmed: NotReplicated | None = None
        for yard, where in by_shard.values():
            try:
                written = self._write(yard, [items[i] for i in where])
            except NotReplicated as exc:
                # Written, not confirmed: the retry will find them there and write nothing,
                # so their history entries go now (a redelivery among them: one entry more).
                written, unconfirmed = [True] * len(where), unconfirmed or exc
            for i, ok in zip(where, written, strict=True):
                out[i] = ok
        pipe = self.client.pipeline(transaction=False)
        written_events = (event for (_, event), ok in zip(items, out, strict=True) if ok)
        self.history.append_many(written_events, pipe=pipe)
        for ob, _ in items:  # one DEL each: a cluster pipeline takes one key per DEL
            pipe.delete(self.keys.cause(ob.message_id))
        pipe.execute()
        if unconfirmed is not None:
            raise unconfirmed
        return out

    def remove(self, ob: Obituary, event: FateEvent) -> bool:
        """Append ``event`` to the history, then delete ``ob``; False if it was gone."""
        yard = self.shard(ob.queue, ob.id)
        if not self.client.hexists(yard.records, ob.id):
            return self.legacy.remove(ob, event)
        self.history.append_many([event])
        return yard.remove(ob, event)

    # -- where an id lives -------------------------------------------------------------------------

    def locate(self, ids: Sequence[str]) -> list[Graveyard | None]:
        """Per id, the graveyard (a queue's, or the single-tag one) that holds it, or None."""
        if not ids:
            return []
        # An id's bucket is known (its CRC-32); its queue is not: ask that bucket of every queue.
        by_bucket: dict[int, list[int]] = {}
        for i, oid in enumerate(ids):
            by_bucket.setdefault(bucket_of(oid), []).append(i)
        asks = [
            (self._bucket(q, b), where) for q in self.queues() for b, where in by_bucket.items()
        ]
        asks.append((self.legacy, list(range(len(ids)))))
        pipe = self.client.pipeline(transaction=False)
        for yard, where in asks:
            pipe.hmget(yard.records, [ids[i] for i in where])
        found: list[Graveyard | None] = [None] * len(ids)
        for (yard, where), raws in zip(asks, pipe.execute(), strict=True):
            for i, raw in zip(where, raws, strict=True):
                if raw is not None and found[i] is None:
                    found[i] = yard
        return found

    def _by_yard(self, ids: Sequence[str]) -> list[tuple[Graveyard, list[int]]]:
        groups: dict[int, tuple[Graveyard, list[int]]] = {}
        for i, yard in enumerate(self.locate(ids)):
            if yard is not None:
                groups.setdefault(id(yard), (yard, []))[1].append(i)
        return list(groups.values())

    def load(self, ids: Sequence[str], *, with_payload: bool = False) -> list[Obituary | None]:
        """The obituaries of ``ids`` (None where missing or unreadable), in order."""
        out: list[Obituary | None] = [None] * len(ids)
        for yard, where in self._by_yard(ids):
            found = yard.load([ids[i] for i in where], with_payload=with_payload)
            for i, ob in zip(where, found, strict=True):
                out[i] = ob
        return out

    def add_replays(self, replayed: Sequence[tuple[str, int]], *, to_queue: str = "") -> None:
        """Add replay times to the ledger of each obituary's queue."""
        for yard, where in self._by_yard([oid for oid, _ in replayed]):
            yard.add_replays([replayed[i] for i in where], to_queue=to_queue)

    def redirects(self, ids: Sequence[str]) -> list[dict[int, str]]:
        out: list[dict[int, str]] = [{} for _ in ids]
        for yard, where in self._by_yard(ids):
            for i, found in zip(where, yard.redirects([ids[i] for i in where]), strict=True):
                out[i] = found
        return out

    def latest_of_message(self, message_id: str) -> str | None:
        """The id of the latest obituary of ``message_id``, over every queue."""
        best: tuple[float, str] | None = None
        yards = [*self.shards(), self.legacy]
        pipe = self.client.pipeline(transaction=False)
        for yard in yards:
            pipe.zrevrange(yard.by_message(message_id), 0, 0, withscores=True)
        for rows in pipe.execute():
            for oid, score in rows:
                if best is None or score > best[0]:
                    best = (score, text(oid))
        return None if best is None else best[1]

    # -- merged reads ---------------------------------------------------------------------------

    def ids(self, filters: Filters, *, limit: int | None, oldest_first: bool = False) -> list[str]:
        """Obituary ids matching ``filters`` over every queue, newest first unless
        ``oldest_first`` (each queue's index read a page at a time, merged lazily)."""
        if filters.queue is not None:
            yards = [*self.shards(filters.queue), self.legacy]
        else:
            yards = [*self.shards(), self.legacy]
        page = CHUNK if limit is None else max(1, min(CHUNK, limit))
        sign = 1 if oldest_first else -1
        # Every bucket's first page in one pipelined round trip (per master); later pages as
        # the merge reaches them.
        pipe = self.client.pipeline(transaction=False)
        for yard in yards:
            _read_page(pipe, yard.driving_index(filters), filters, 0, page, oldest_first)
        firsts = pipe.execute()
        rows = (
            _pages(y, filters, page, oldest_first, first)
            for y, first in zip(yards, firsts, strict=True)
        )
        merged = heapq.merge(*rows, key=lambda r: sign * r[0])
        out: list[str] = []
        for _, oid in merged:
            out.append(oid)
            if limit is not None and len(out) >= limit:
                break
        return out

    def count(self) -> int:
        pipe = self.client.pipeline(transaction=False)
        for yard in [*self.shards(), self.legacy]:
            pipe.zcard(yard.by_time)
        return sum(int(n) for n in pipe.execute())

    def older_than(self, cutoff_ms: int, limit: int) -> list[str]:
        """Ids of up to ``limit`` obituaries buried at or before ``cutoff_ms``, oldest first."""
        yards = [*self.shards(), self.legacy]
        pipe = self.client.pipeline(transaction=False)
        for yard in yards:
            pipe.zrangebyscore(yard.by_time, "-inf", cutoff_ms, 0, limit, withscores=True)
        rows = [(s, text(i)) for found in pipe.execute() for i, s in found]
        return [oid for _, oid in sorted(rows)[:limit]]

    def _latest(self, key: str, limit: int | None) -> list[tuple[str, int]]:
        """``(member, score)`` of ``key`` in every graveyard, max score per member, latest
        first (the per-queue ``groups``, ``queues``, ``tasks`` zsets)."""
        yards = [*self.shards(), self.legacy]
        stop = -1 if limit is None else limit - 1
        pipe = self.client.pipeline(transaction=False)
        for yard in yards:
            pipe.zrevrange(yard.name_key(key), 0, stop, withscores=True)
        best: dict[str, int] = {}
        for rows in pipe.execute():
            for member, score in rows:
                name = text(member)
                best[name] = max(best.get(name, 0), int(score))
        ordered = sorted(best.items(), key=lambda ms: (-ms[1], ms[0]))
        return ordered if limit is None else ordered[:limit]

    def top_causes(self, limit: int) -> list[str]:
        """The ``limit`` most recently seen causes."""
        return [c for c, _ in self._latest("groups", limit)]

    def cause_names(self, offset: int, limit: int) -> tuple[int, list[str]]:
        """How many causes there are, and a page of them, most recently seen first."""
        every = self._latest("groups", None)
        return len(every), [c for c, _ in every[offset : offset + limit]]

    def groups(self) -> list[Group]:
        """Every cause still in the graveyard, most recently seen first."""
        return self.groups_of([c for c, _ in self._latest("groups", None)])

    def groups_of(self, causes: list[str]) -> list[Group]:
        """The :class:`Group` of each of ``causes``, summed over the queues, in their order."""
        if not causes:
            return []
        yards = [*self.shards(), self.legacy]
        pipe = self.client.pipeline(transaction=False)
        for yard in yards:
            yard.queue_group_reads(pipe, causes)
        results = pipe.execute()
        step = GROUP_READS * len(causes)
        parts: dict[str, list[Group]] = {}
        for i, yard in enumerate(yards):
            for group in yard.groups_from(causes, results[i * step : (i + 1) * step]):
                parts.setdefault(group.cause, []).append(group)
        return [_summed(parts[c]) for c in causes if c in parts]

    def cause_page(
        self, cause: str, filters: Filters, offset: int, limit: int
    ) -> tuple[list[str], int | None, int | None]:
        """One page of a cause's obituary ids over every queue, newest first (the console's
        cause page): ``(ids, next offset or None, matching)``. ``filters`` may add a queue, a
        task and time bounds; ``matching`` is exact without a queue or task filter, else None.
        """
        wanted = Filters(
            queue=filters.queue,
            task=filters.task,
            cause=cause,
            since_ms=filters.since_ms,
            until_ms=filters.until_ms,
        )
        ids = self.ids(wanted, limit=offset + limit + 1)
        chosen = ids[offset : offset + limit]
        next_offset = offset + limit if len(ids) > offset + limit else None
        if filters.queue is not None or filters.task is not None:
            return chosen, next_offset, None
        low = "-inf" if filters.since_ms is None else filters.since_ms
        high = "+inf" if filters.until_ms is None else filters.until_ms
        pipe = self.client.pipeline(transaction=False)
        for yard in [*self.shards(), self.legacy]:
            pipe.zcount(yard.by_cause(cause), low, high)
        return chosen, next_offset, sum(int(n) for n in pipe.execute())

    def version_times(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for yard in [*self.shards(), self.legacy]:
            for version, ms in yard.version_times().items():
                out[version] = min(out.get(version, ms), ms)
        return out

    def names(self, kind: str) -> list[tuple[str, int, int]]:
        """``(name, obituaries, last burial ms)`` per queue or task, over every queue."""
        counts: dict[str, list[int]] = {}
        for yard in [*self.shards(), self.legacy]:
            for name, n, last in yard.names(kind):
                seen = counts.setdefault(name, [0, 0])
                seen[0] += n
                seen[1] = max(seen[1], last)
        rows = [(n, c, last) for n, (c, last) in counts.items()]
        return sorted(rows, key=lambda r: (-r[2], r[0]))


#: The graveyard role: the single-tag graveyard, or the one sharded by queue
#: (``dlx_redis_shards``, :attr:`~celery_dlx.wiring.runtime.Runtime.graveyard`).
AnyGraveyard = Graveyard | ShardedGraveyard


def _read_page(
    client: Any, index: str, filters: Filters, offset: int, page: int, oldest_first: bool
) -> Any:
    """One page of ``index`` within the filters' time bounds, with scores (on ``client``, or
    queued on a pipeline)."""
    low = "-inf" if filters.since_ms is None else filters.since_ms
    high = "+inf" if filters.until_ms is None else filters.until_ms
    if oldest_first:
        return client.zrangebyscore(index, low, high, offset, page, withscores=True)
    return client.zrevrangebyscore(index, high, low, offset, page, withscores=True)


def _pages(
    yard: Graveyard, filters: Filters, page: int, oldest_first: bool, first: Any
) -> Iterator[tuple[float, str]]:
    """``(burial ms, id)`` of one graveyard's matches in order, read a page at a time
    (``first``: its first page, read already)."""
    index = yard.driving_index(filters)
    check = _needs_post_filter(filters)
    offset = 0
    raw = first
    while True:
        if raw is None:
            raw = _read_page(yard.client, index, filters, offset, page, oldest_first)
        scored = cast("list[tuple[bytes, float]]", raw)
        rows = [(float(s), text(i)) for i, s in scored]
        offset += len(rows)
        if check and rows:
            obits = yard.load([oid for _, oid in rows])
            keep = {ob.id for ob in obits if ob is not None and filters.matches(ob)}
            rows = [r for r in rows if r[1] in keep]
        yield from rows
        if len(raw) < page:
            return
        raw = None


def _summed(parts: list[Group]) -> Group:
    """One cause's group from its per-queue groups."""
    latest = max(parts, key=lambda g: g.last_ms)
    started = [g for g in parts if g.first_seen_ms is not None]
    first = min(started, key=lambda g: cast("int", g.first_seen_ms)) if started else None
    versions: dict[str, int] = {}
    for g in parts:
        for version, n in g.versions.items():
            versions[version] = versions.get(version, 0) + n
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
        versions=versions,
    )


@dataclass
class GraveyardMigration:
    """What :func:`migrate` did (or, dry, would do): obituaries found in the single-tag
    graveyard, copied to their queue's, already there (an interrupted run's), removed from the
    single-tag graveyard, left in place (unreadable), gone (purged or swept while being moved:
    the copy is deleted too); found per queue."""

    found: int = 0
    copied: int = 0
    present: int = 0
    moved: int = 0
    left: int = 0
    gone: int = 0
    queues: dict[str, int] = field(default_factory=dict)


def migrate(
    yard: ShardedGraveyard, *, dry_run: bool = False, batch: int = CHUNK
) -> GraveyardMigration:
    """Move the single-tag graveyard's obituaries to their queues' keys, oldest first: per
    obituary, copy (record, payload, indexes, group and version stats, ledger entry; nothing if
    the queue's keys hold it already) then delete the original (no history entry: nothing left
    the graveyard). Interrupted anywhere, a run again finishes the job and loses nothing; until
    then every read reads both layouts.

    A moved cause's lifetime ``total`` restarts at the obituaries moved (the single-tag group's
    count of earlier burials is not carried over); its first-seen time is its oldest obituary's.
    """
    result = GraveyardMigration()
    legacy = yard.legacy
    drop = yard.client.register_script(_REMOVE_SHARD)
    skip = 0
    while True:
        ids = [text(i) for i in yard.client.zrange(legacy.by_time, skip, skip + batch - 1)]
        if not ids:
            return result
        pipe = yard.client.pipeline(transaction=False)
        pipe.hmget(legacy.records, ids)
        pipe.hmget(legacy.payloads, ids)
        pipe.hmget(legacy.ledger, ids)
        records, payloads, ledgers = pipe.execute()
        for oid, raw, payload, ledger in zip(ids, records, payloads, ledgers, strict=True):
            result.found += 1
            try:
                ob = Obituary.from_record(raw, None) if raw is not None else None
            except (ValueError, TypeError):
                ob = None
            if ob is None:
                logger.error("obituary %s has an unreadable record; left in place", oid)
                result.left += 1
                skip += 1
                continue
            result.queues[ob.queue] = result.queues.get(ob.queue, 0) + 1
            if dry_run:
                skip += 1
                continue
            yard._index([ob.queue])
            target = yard.shard(ob.queue, ob.id)
            if _copy(target, ob, raw, payload or b"", ledger, yard.replicas):
                result.copied += 1
            else:
                result.present += 1
            keys = [*legacy._index_keys(ob), legacy.ledger, legacy.cause_versions(ob.cause)]
            keys[11] = legacy.records  # the history slot: this script never touches it
            args = [ob.id, ob.queue, ob.task or "", ob.cause, ob.code_version or ""]
            if drop(keys=keys, args=args):
                result.moved += 1
            else:  # purged or swept meanwhile (with its history entry): it stays gone
                shard_keys = [*target._index_keys(ob), target.ledger]
                drop(keys=[*shard_keys, target.cause_versions(ob.cause)], args=args)
                result.gone += 1
        if len(ids) < batch:
            return result


def _copy(
    target: Graveyard,
    ob: Obituary,
    record: Any,
    payload: Any,
    ledger: Any,
    replicas: Replicas | None = None,
) -> bool:
    """Write one obituary's stored record into ``target`` (its queue's keys); False if there.
    With ``replicas`` wanted, the copy is on them before this returns (before the original goes).
    """
    facts = [ob.queue, ob.task or "", ob.cause, ob.exc_type, ob.exc_message[:500]]
    keys = [*target._index_keys(ob), target.records, target.cause_versions(ob.cause)]
    keys.append(target.versions_key)
    args = [ob.id, ob.buried_ms, record, payload, json.dumps(facts), ob.code_version or ""]

    def copy(pipe: Any) -> None:
        target._write(keys=keys, args=args, client=pipe)
        if ledger is not None:
            pipe.hset(target.ledger, ob.id, ledger)

    replicas = replicas or Replicas()
    wanted = replicas.wanted(target.client, target.records)
    if wanted:
        done = execute_replicated(
            target.client,
            target.records,
            copy,
            wanted,
            replicas.timeout,
            what=f"the copy of obituary {ob.id}",
        )
        return bool(done[0])
    copied = bool(target._write(keys=keys, args=args))
    if ledger is not None:
        target.client.hset(target.ledger, ob.id, ledger)
    return copied
