"""celery_dlx's details of a task's last run, stored with the app's result backend.

A DLX task stores them beside its result (under the result's key followed by ``:dlx``), just
before Celery stores the state they describe, so the result's state and value stay exactly
Celery's (``RETRY`` with the original exception, ``FAILURE`` with the task's own exception) while
code that wants to know more can ask:

- ``fate``: ``requeued``, ``parked``, ``buried`` or ``recovered`` (a later run succeeded);
- ``attempt``: failed runs so far, this one included (for ``recovered``: before this run);
- ``queue``, ``reason`` (the decision's), ``cause`` (the fingerprint the graveyard groups by),
  ``exc_type``, ``first_failure_ms`` and ``at_ms`` (epoch milliseconds);
- for ``parked``: ``delay`` (seconds) and ``due_ms``; for ``recovered``: ``replayed``.

Stored by the key-value backends (Redis, Memcached, file system, S3...) through their public
``set``/``get``; with the RPC, database and MongoDB backends ``dlx_details`` returns None.
"""

from __future__ import annotations

from collections.abc import Mapping

from celery.backends.base import BaseKeyValueStoreBackend
from celery.result import AsyncResult

#: What follows a result's key in the key of its details.
DETAILS_KEY_SUFFIX = ":dlx"


def _details_key(backend: BaseKeyValueStoreBackend, task_id: str) -> str:
    return backend.get_key_for_task(task_id, DETAILS_KEY_SUFFIX)


def store_details(backend: object, task_id: str, details: Mapping[str, object]) -> bool:
    """Store ``details`` of task ``task_id``'s run with its result ``backend``; False, storing
    nothing, for a backend that is not a key-value store. Raises what the backend raises."""
    if not isinstance(backend, BaseKeyValueStoreBackend):
        return False
    backend.set(_details_key(backend, task_id), backend.encode(dict(details)))
    return True


def dlx_details(result: AsyncResult[object]) -> dict[str, object] | None:
    """celery_dlx's details of ``result``'s last requeue, park, burial or recovery, or None."""
    backend = result.backend
    if not isinstance(backend, BaseKeyValueStoreBackend):
        return None
    stored = backend.get(_details_key(backend, result.id))
    details = None if stored is None else backend.decode(stored)
    return dict(details) if isinstance(details, Mapping) else None
