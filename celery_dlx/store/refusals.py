"""Counts of the copies workers could not write (Redis refused their park, or the broker their
requeued copy) and sent to the DLX service, counted by the service once it wrote them (a worker's
counter in Redis would be refused in the very outage it counts)."""

from __future__ import annotations

from collections.abc import Mapping

from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient, text


class Refusals:
    """Fate -> copies a worker could not write, written by the DLX service."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.key = keys.refused

    def add(self, counts: Mapping[str, int]) -> None:
        counts = {fate: n for fate, n in counts.items() if n}
        if not counts:
            return
        pipe = self.client.pipeline(transaction=False)
        for fate, n in counts.items():
            pipe.hincrby(self.key, fate, n)
        pipe.execute()

    def read(self) -> dict[str, int]:
        stored = self.client.hgetall(self.key) or {}
        return {text(k): int(v) for k, v in stored.items()}
