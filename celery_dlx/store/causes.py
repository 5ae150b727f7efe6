"""Cause records: what a worker knows about a burial that the dead letter itself cannot carry.

A Celery task buried by reject reaches the DLX service as the original message: the exception,
traceback and attempt history live only in the worker. The worker stashes them here, keyed by
message id, before it rejects; the DLX service takes them when it writes the obituary.
"""

from __future__ import annotations

import json
from typing import Any

from celery_dlx.message.names import Keys


def stash_cause(
    client: Any, keys: Keys, message_id: str, record: dict[str, Any], ttl_seconds: float
) -> None:
    """Store ``record`` (JSON-safe) for ``message_id`` for ``ttl_seconds``."""
    client.set(
        keys.cause(message_id),
        json.dumps(record, separators=(",", ":"), default=str),
        px=int(ttl_seconds * 1000),
    )


def read_cause(client: Any, keys: Keys, message_id: str) -> dict[str, Any] | None:
    """The stashed record for ``message_id``, or None. Unreadable records read as None."""
    raw = client.get(keys.cause(message_id))
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def drop_cause(client: Any, keys: Keys, message_id: str) -> None:
    """Forget the record once the obituary holding it is written."""
    client.delete(keys.cause(message_id))
