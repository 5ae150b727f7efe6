"""Open per-cause breakers (``dlx_breaker``): list them, close one by hand."""

from __future__ import annotations

from typing import Any

from celery_dlx.policy.breaker import BREAKER_DEFAULTS
from celery_dlx.wiring.runtime import Runtime
from celery_dlx.worker.breaker import close_breaker


def open_breakers(runtime: Runtime) -> list[dict[str, Any]]:
    """The open breakers, oldest first: queue, cause, task, exc_type, opened_ms, probe_ms
    (the next canary's due time) and held (messages held since it opened)."""
    return [b.as_dict() for b in runtime.breakers.list_open()]


def close_breakers(runtime: Runtime, cause: str, queue: str | None = None) -> list[dict[str, Any]]:
    """Close the open breakers of ``cause`` (on ``queue`` only, if given) and release the
    messages they held at the queue's ``release_rate``; one ``{queue, cause, released}`` per
    breaker closed (none when no such breaker is open)."""
    closed = []
    for breaker in runtime.breakers.list_open():
        if breaker.cause != cause or (queue is not None and breaker.queue != queue):
            continue
        settings = runtime.config.breaker_for(breaker.queue)
        rate = settings.release_rate if settings else int(BREAKER_DEFAULTS["release_rate"])
        released = close_breaker(runtime, breaker.queue, breaker.cause, rate)
        closed.append({"queue": breaker.queue, "cause": breaker.cause, "released": released})
    return closed
