"""The drain lease: which one drainer of a key prefix drains now (a Redis key with a TTL)."""

from __future__ import annotations

from celery_dlx.store.client import RedisClient

# Take the lease when free, renew it when ours: 1 if held by the caller afterwards, else 0.
_ACQUIRE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
if not holder then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
"""
# Delete the lease only if ours.
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""


class DrainLease:
    """The drain lease ``key`` (``Keys.drain_lease``) of one key prefix, as held (or not) by the
    drainer ``token``, for ``seconds`` at a time."""

    def __init__(self, client: RedisClient, key: str, seconds: float, token: str) -> None:
        self.key = key
        self.ttl_ms = max(1, int(seconds * 1000))
        self.token = token
        self._acquire = client.register_script(_ACQUIRE)
        self._release = client.register_script(_RELEASE)

    def acquire(self) -> bool:
        """Take the lease if it is free, renew it if ours; True when we hold it."""
        return bool(self._acquire(keys=[self.key], args=[self.token, self.ttl_ms]))

    def release(self) -> bool:
        """Give the lease up if ours (another drainer takes it at its next check)."""
        return bool(self._release(keys=[self.key], args=[self.token]))
