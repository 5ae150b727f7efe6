"""When each queue was first seen with messages and no consumer (``dlx check``'s orphans)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient, text


class Consumerless:
    """Queues seen with messages and no consumer, and since when."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        #: Hash: queue -> epoch ms a ``check`` first saw it with messages and no consumer.
        self.key = keys.consumerless

    def remember(self, queues: Iterable[Mapping[str, object]], now: int) -> dict[str, int]:
        """Record which queues have messages and no consumer now; returns the first-seen times."""
        waiting = [
            str(q["name"]) for q in queues if not q.get("consumers") and q.get("messages_ready")
        ]
        busy = [str(q["name"]) for q in queues if q.get("consumers") or not q.get("messages_ready")]
        pipe = self.client.pipeline(transaction=False)
        for name in waiting:
            pipe.hsetnx(self.key, name, now)
        if busy:
            pipe.hdel(self.key, *busy)
        pipe.hgetall(self.key)
        stored = pipe.execute()[-1] or {}
        seen = {text(k): int(v) for k, v in stored.items()}
        return {name: seen[name] for name in waiting if name in seen}
