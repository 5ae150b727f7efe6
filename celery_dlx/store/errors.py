"""The errors of the Redis store, for callers that must tell a store outage from a bug without
importing the Redis client library."""

from __future__ import annotations

from redis.exceptions import RedisError

#: What a store call raises when Redis is unreachable or refuses a command.
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError,)


def is_full(exc: BaseException) -> bool:
    """True when ``exc`` says Redis refused a write at its ``maxmemory`` (``OOM command not
    allowed``; redis-py raises ``OutOfMemoryError`` for it, with the ``OOM`` cut off) or the
    graveyard refused a burial past its budget."""
    names = {type(e).__name__ for e in (exc, exc.__cause__) if e is not None}
    return bool(names & {"OutOfMemoryError", "GraveyardFull"}) or "OOM command" in str(exc)
