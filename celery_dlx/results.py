"""celery_dlx's details of a task's last run, stored beside its result (under the result's key
followed by ``:dlx``) just before Celery stores the state they describe, so the result stays
exactly Celery's. Only key-value backends (Redis, Memcached, file system, S3...) hold them.
"""

from __future__ import annotations

from collections.abc import Mapping

from celery.backends.base import BaseKeyValueStoreBackend
from celery.result import AsyncResult


def _details_key(backend: BaseKeyValueStoreBackend, task_id: str) -> str:
    return backend.get_key_for_task(task_id, ":dlx")


def store_details(backend: object, task_id: str, details: Mapping[str, object]) -> bool:
    """Store ``details`` of task ``task_id``'s run with its result ``backend``; False, storing
    nothing, for a backend that is not a key-value store. Raises what the backend raises."""
    if not isinstance(backend, BaseKeyValueStoreBackend):
        return False
    backend.set(_details_key(backend, task_id), backend.encode(dict(details)))
    return True


def dlx_details(result: AsyncResult[object]) -> dict[str, object] | None:
    """celery_dlx's details of ``result``'s last requeue, park, burial or recovery, or None (also
    with the RPC, database and MongoDB backends).

    ``fate`` (``requeued``, ``parked``, ``buried`` or ``recovered``), ``attempt`` (failed runs so
    far, this one included; for ``recovered``: before this run), ``queue``, ``reason``, ``cause``,
    ``exc_type``, ``first_failure_ms`` and ``at_ms``; for ``parked`` ``delay`` (seconds) and
    ``due_ms``; for ``recovered`` ``replayed``.
    """
    backend = result.backend
    if not isinstance(backend, BaseKeyValueStoreBackend):
        return None
    stored = backend.get(_details_key(backend, result.id))
    details = None if stored is None else backend.decode(stored)
    return dict(details) if isinstance(details, Mapping) else None
