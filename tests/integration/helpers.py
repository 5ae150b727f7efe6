"""Small waiting and inspection helpers for integration tests (no sleeps where an event exists)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from celery_dlx.message.names import Keys
from celery_dlx.store.history import History


def wait_until(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05, what: str = ""
) -> Any:
    """Poll ``predicate`` until it is truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def queue_depth(channel: Any, name: str) -> int:
    """Ready messages in queue ``name`` (passive declare)."""
    return int(channel.queue_declare(name, passive=True).message_count)


def fates_of(client: Any, keys: Keys, message_id: str) -> list[str]:
    """The fates recorded in the history for one message, by time of the fate change.

    Appends from different processes can land out of order (the drain records ``drained`` after
    the confirm, by when the worker may already have run the retry), so sort by ``at_ms``.
    """
    rows = [f for _, f in History(client, keys).read() if f["message_id"] == message_id]
    # Within one millisecond, a republish precedes the run it causes.
    rank = {"drained": 0, "replayed": 0}
    return [
        f["fate"] for f in sorted(rows, key=lambda f: (int(f["at_ms"]), rank.get(f["fate"], 1)))
    ]


def get_all(channel: Any, queue: str) -> list[Any]:
    """Take every ready message from ``queue`` (acked), for inspection."""
    out = []
    while True:
        msg = channel.basic_get(queue, no_ack=True)
        if msg is None:
            return out
        out.append(msg)
