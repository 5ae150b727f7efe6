"""A per-key event budget per time window, kept in Redis so every process shares it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient

# INCR the key; start its window (PEXPIRE) on the first hit, or when it has no TTL (a key written
# by hand), so a budget is never spent forever; return the count so far.
_SPEND = """
local n = redis.call('INCR', KEYS[1])
if n == 1 or redis.call('PTTL', KEYS[1]) < 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return n
"""


class WindowBudget:
    """At most ``limit`` uses per key within ``window`` seconds of the key's first use, across
    every process sharing the Redis. ``client`` is asked for at each use (a pool process has its
    own); ``name`` (what is budgeted) is part of the key."""

    def __init__(
        self,
        client: Callable[[], RedisClient],
        keys: Keys,
        name: str,
        limit: int,
        window: float,
    ) -> None:
        if limit < 1:
            raise ValueError(f"budget limit must be >= 1, got {limit}")
        if window <= 0:
            raise ValueError(f"budget window must be > 0 seconds, got {window}")
        self.client = client
        self.base = keys.budget(name)
        self.limit = limit
        self.window_ms = max(1, int(window * 1000))
        self._script: Any = None

    def spend(self, what: str) -> tuple[bool, int]:
        """Use one unit for ``what``: ``(allowed, uses in this window including this one)``."""
        client = self.client()
        if self._script is None:
            self._script = client.register_script(_SPEND)
        used = int(self._script(keys=[self.base + what], args=[self.window_ms], client=client))
        return used <= self.limit, used
