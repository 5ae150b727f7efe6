"""Counts of the copies workers could not write (Redis refused their park, or the broker their
requeued copy) and sent to the DLX service, which wrote them (``celery dlx check``, ``/metrics``).

Counted by the service once it has written them, so the count survives the outage that made
them (a counter a worker kept in Redis would be refused in the very outage it counts); during
the outage the copies wait in the service queue (``check``'s backlog) and each worker logs the
refusals once per outage (:mod:`celery_dlx.outages`).
"""

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
        """Add ``counts`` (fate -> copies) in one round trip."""
        counts = {fate: n for fate, n in counts.items() if n}
        if not counts:
            return
        pipe = self.client.pipeline(transaction=False)
        for fate, n in counts.items():
            pipe.hincrby(self.key, fate, n)
        pipe.execute()

    def read(self) -> dict[str, int]:
        """Fate -> copies, since the key was made."""
        stored = self.client.hgetall(self.key) or {}
        return {text(k): int(v) for k, v in stored.items()}
