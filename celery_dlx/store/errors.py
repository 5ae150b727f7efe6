"""The errors of the Redis store, for callers that must tell a store outage from a bug: the one
module of ``store/`` the layers above the composition root import (an import contract)."""

from __future__ import annotations

from redis.exceptions import RedisError

from celery_dlx.errors import StoreError

#: What a store call raises when Redis is unreachable or refuses a command.
STORE_ERRORS: tuple[type[BaseException], ...] = (RedisError,)


def is_full(exc: BaseException) -> bool:
    """True when ``exc`` says Redis refused a write at its ``maxmemory`` (``OOM command not
    allowed``; redis-py raises ``OutOfMemoryError`` for it, with the ``OOM`` cut off) or the
    graveyard refused a burial past its budget."""
    names = {type(e).__name__ for e in (exc, exc.__cause__) if e is not None}
    return bool(names & {"OutOfMemoryError", "GraveyardFull"}) or "OOM command" in str(exc)


class RetryPending(StoreError):
    """A redelivered message's retry may exist: its copy went to the DLX service unconfirmed and
    is not written yet. The original waits until it is, or the mark expires (the copy was lost:
    the redelivery then counts as a crash)."""


class GraveyardFull(StoreError, RedisError):
    """A burial refused before it wrote anything: the graveyard is at its budget, or Redis is
    near its ``maxmemory``; the dead letter stays in RabbitMQ and is retried. ``settled``: per
    item of the refused batch, whether its obituary is there all the same."""

    settled: list[bool] = []
