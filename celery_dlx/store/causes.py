"""Cause records in Redis: what a worker knows about a burial that the dead letter cannot carry.

A Celery task buried by reject reaches the DLX service as the original message: the exception,
traceback and attempt history live only in the worker. The worker stashes a
:class:`~celery_dlx.message.cause.CauseRecord` here, keyed by message id, before it rejects; the
DLX service takes it (in its batch ``MGET``) when it writes the obituary.
"""

from __future__ import annotations

from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient


def stash_cause(
    client: RedisClient, keys: Keys, message_id: str, record: CauseRecord, ttl_seconds: float
) -> None:
    """Store ``record`` for ``message_id`` for ``ttl_seconds``."""
    client.set(keys.cause(message_id), record.to_json(), px=int(ttl_seconds * 1000))


def read_cause(client: RedisClient, keys: Keys, message_id: str) -> CauseRecord | None:
    """The stashed record for ``message_id``, or None. Unreadable records read as None."""
    return CauseRecord.from_json(client.get(keys.cause(message_id)))


def drop_cause(client: RedisClient, keys: Keys, message_id: str) -> None:
    """Forget the record once the obituary holding it is written."""
    client.delete(keys.cause(message_id))
