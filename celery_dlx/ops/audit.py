"""The operators' audit log: one entry per finished action, from the console or the command line,
in the audit stream (``{prefix}:web:audit``) and as an ``audit`` entry of the failure history.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from celery_dlx.fates import AUDIT, FateEvent
from celery_dlx.message.failure import Failure
from celery_dlx.wiring.runtime import Runtime

#: Entries kept in the audit stream (approximately).
AUDIT_MAXLEN = 10000


def record_audit(
    runtime: Runtime,
    fields: Mapping[str, str],
    *,
    queue: str,
    cause: str,
    message_id: str,
    reason: str,
    at_ms: int,
) -> str:
    """Append ``fields`` to the audit stream and an ``audit`` entry to the failure history, in
    one round trip; returns the audit stream entry's id.

    Args:
        fields: the audit stream entry (``at_ms``, ``user``, ``role``, ``action``, ``target``,
            ``params``, ``status``, ``summary``, ``result``, ``job``).
        queue, cause, message_id, reason: the history entry's (``*`` for an action on several
            queues, "" for no cause, ``audit:<action>:...``, one line saying who did what).
        at_ms: when the action finished (epoch ms).
    """
    failure = Failure(
        queue=queue,
        message_id=message_id,
        attempt=0,
        cause=cause,
        reason=reason,
        importance="notify",
        at_ms=at_ms,
    )
    return runtime.history.append_audit(fields, FateEvent.of(AUDIT, failure), maxlen=AUDIT_MAXLEN)


def audit_entries(runtime: Runtime, limit: int) -> list[tuple[str, dict[str, Any]]]:
    """The latest ``limit`` audit entries, newest first: ``(entry id, fields)``, with ``params``
    and ``result`` decoded (``{}`` when absent or not a JSON object)."""
    out: list[tuple[str, dict[str, Any]]] = []
    for entry_id, fields in runtime.history.audit(limit):
        decoded: dict[str, Any] = dict(fields)
        decoded["params"] = _json_object(fields.get("params"))
        decoded["result"] = _json_object(fields.get("result"))
        out.append((entry_id, decoded))
    return out


def _json_object(raw: str | None) -> dict[str, Any]:
    try:
        value = json.loads(raw or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
