"""Where a store's keys live: under the app's one hash tag, or a few tags per queue.

``dlx_redis_shards`` picks the layout once per app. In the single-tag layout every key of a role
sits under ``{prefix}``, one Redis Cluster slot, so a park and its history entry, or an obituary
and its ``buried`` entry, go in one transaction. In the per-queue layout each queue's keys sit
under ``{prefix:q:QUEUE:BUCKET}`` in a fixed number of buckets (by the CRC-32 of the entry id),
so a Redis Cluster spreads even one busy queue over its masters.

A :class:`ShardSet` holds the app-tag shard always (in the per-queue layout: what an older
version wrote, until ``dlx migrate-keys`` moves it) and each queue's buckets. A set under the
app's tag names the queues that have keys; a queue is added before its first write.
"""

from __future__ import annotations

import threading
import zlib
from collections.abc import Callable, Iterable
from typing import Any, Generic, TypeVar, cast

from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient, Replicas, execute_replicated

S = TypeVar("S")


class Layout:
    """The hash tag an entry's keys live under: the app's, or with ``per_queue`` one of
    ``buckets`` tags per queue (fixed for a role: changing it would strand entries)."""

    def __init__(self, keys: Keys, *, per_queue: bool, buckets: int) -> None:
        self.keys = keys
        self.per_queue = per_queue
        self.buckets = buckets

    def bucket(self, entry_id: str) -> int:
        return zlib.crc32(entry_id.encode()) % self.buckets


class ShardSet(Generic[S]):
    """The shards of one store: the app-tag shard and, in the per-queue layout, each queue's
    buckets (made on first use by ``make(tag)``, one per process).

    Args:
        index: the set (under the app's tag) naming the queues that have keys.
        kind: what the shards hold, for messages (``parked``, ``graveyard``).
        replicas: the replicas the index must reach before a queue's first write.
    """

    def __init__(
        self,
        client: RedisClient,
        layout: Layout,
        index: str,
        kind: str,
        make: Callable[[str], S],
        replicas: Replicas | None = None,
    ) -> None:
        self.client = client
        self.layout = layout
        self.index_key = index
        self.kind = kind
        self.replicas = replicas or Replicas()
        self._make = make
        #: The app-tag shard.
        self.home = make(layout.keys.home_tag)
        self._shards: dict[tuple[str, int], S] = {}
        self._indexed: set[str] = set()
        self._lock = threading.RLock()

    def shard(self, queue: str, entry_id: str) -> S:
        """The shard ``queue``'s entry ``entry_id`` is written to."""
        if not self.layout.per_queue:
            return self.home
        return self.bucket(queue, self.layout.bucket(entry_id))

    def bucket(self, queue: str, bucket: int) -> S:
        with self._lock:
            shard = self._shards.get((queue, bucket))
            if shard is None:
                shard = self._make(self.layout.keys.queue_tag(queue, bucket))
                self._shards[(queue, bucket)] = shard
            return shard

    def queues(self) -> list[str]:
        """The queues that have keys of their own, sorted (none in the single-tag layout)."""
        if not self.layout.per_queue:
            return []
        members = cast("set[Any]", self.client.smembers(self.index_key))
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in members)

    def every(self, queue: str | None = None) -> list[S]:
        """Every bucket of ``queue`` (default: of every queue), bucket-major so a walk that
        stops early has visited every queue, then the app-tag shard."""
        queues = self.queues() if queue is None else [queue] if self.layout.per_queue else []
        buckets = range(self.layout.buckets)
        return [*(self.bucket(q, b) for b in buckets for q in queues), self.home]

    def ask(self, ask: Callable[[Any, S], object], shards: Iterable[S] | None = None) -> list[Any]:
        """The replies of ``ask(pipe, shard)`` for ``shards`` (default: :meth:`every`), pipelined."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.every() if shards is None else shards:
            ask(pipe, shard)
        return list(pipe.execute())

    def holders(self, entry_id: str, queues: Iterable[str]) -> list[S]:
        """The shards that may hold ``entry_id``: its bucket in each of ``queues``, and home."""
        bucket = self.layout.bucket(entry_id)
        return [*(self.bucket(q, bucket) for q in queues), self.home]

    def add_queues(self, queues: Iterable[str]) -> None:
        """Name ``queues`` in the index before their first write (once per process: it only
        grows), on as many replicas as a write waits for, so a failover cannot keep an entry and
        lose its queue's name."""
        if not self.layout.per_queue:
            return
        new = sorted(set(queues) - self._indexed)
        if not new:
            return
        index = self.index_key
        wanted = self.replicas.wanted(self.client, index)
        if wanted:
            execute_replicated(
                self.client,
                index,
                lambda pipe: pipe.sadd(index, *new),
                wanted,
                self.replicas.timeout,
                what=f"the index of {len(new)} {self.kind} queue(s)",
            )
        else:
            self.client.sadd(index, *new)
        with self._lock:
            self._indexed.update(new)


def grouped(items: Iterable[tuple[S, int]]) -> list[tuple[S, list[int]]]:
    """``(shard, position)`` pairs grouped by shard, in first-seen order."""
    groups: dict[int, tuple[S, list[int]]] = {}
    for shard, i in items:
        groups.setdefault(id(shard), (shard, []))[1].append(i)
    return list(groups.values())
