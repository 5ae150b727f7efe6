"""celery_dlx's details of a task's last run, as the result backend stores them.

A DLX task puts them in the result meta beside Celery's own fields (under ``"dlx"``), so the
result's state and value stay exactly Celery's (``RETRY`` with the original exception,
``FAILURE`` with the task's own exception) while code that wants to know more can ask:

- ``fate``: ``requeued``, ``parked``, ``buried`` or ``recovered`` (a later run succeeded);
- ``attempt``: failed runs so far, this one included (for ``recovered``: before this run);
- ``queue``, ``reason`` (the decision's), ``cause`` (the fingerprint the graveyard groups by),
  ``exc_type``, ``first_failure_ms`` and ``at_ms`` (epoch milliseconds);
- for ``parked``: ``delay`` (seconds) and ``due_ms``; for ``recovered``: ``replayed``.

Stored by the backends that keep the whole meta dict: the key-value ones (Redis, Memcached, file
system, ...) and MongoDB. The RPC and database backends store a fixed set of fields and drop it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery.result import AsyncResult

from celery_dlx.compat import RESULT_META_KEY


def dlx_details(result: AsyncResult[Any]) -> dict[str, Any] | None:
    """celery_dlx's details of ``result``'s last stored state, or None (none stored)."""
    meta = result.backend.get_task_meta(result.id)
    details = meta.get(RESULT_META_KEY) if isinstance(meta, Mapping) else None
    return dict(details) if isinstance(details, Mapping) else None
