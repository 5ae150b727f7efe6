"""The errors of the Redis store, for callers that must tell a store outage from a bug without
importing the Redis client library."""

from __future__ import annotations

from redis.exceptions import RedisError

#: What a store call raises when Redis is unreachable or refuses a command.
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError,)
