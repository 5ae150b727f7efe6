"""The console's audit log: who did what, when, and with which result, written by
:func:`celery_dlx.ops.audit.record_audit` (the audit stream and an ``audit`` history entry)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from celery_dlx import Runtime
from celery_dlx.ops import now_ms
from celery_dlx.ops.audit import audit_entries, record_audit
from celery_dlx.ops.render import iso


@dataclass
class AuditEntry:
    """One operator action: who, when, what (action and target), with which parameters, result."""

    user: str
    role: str
    action: str
    target: str
    params: dict[str, Any]
    status: str
    result: dict[str, Any]
    summary: str
    at_ms: int = 0
    job: str = ""

    def fields(self) -> dict[str, str]:
        return {
            "at_ms": str(self.at_ms),
            "user": self.user,
            "role": self.role,
            "action": self.action,
            "target": self.target,
            "params": json.dumps(self.params, sort_keys=True, default=str),
            "status": self.status,
            "summary": self.summary,
            "result": _result_json(self.result),
            "job": self.job,
        }


#: Characters of an action's result kept in the audit stream; a longer one keeps its counts.
RESULT_LIMIT = 100_000


def _result_json(result: dict[str, Any]) -> str:
    text = json.dumps(result, sort_keys=True, default=str)
    if len(text) <= RESULT_LIMIT:
        return text
    counts = {k: len(v) if isinstance(v, (list, dict)) else v for k, v in result.items()}
    return json.dumps({"truncated": True, **counts}, sort_keys=True, default=str)


#: An entry's fields in the order read_audit gives them (``params`` and ``result`` decoded).
_TEXTS = ("user", "role", "action", "target", "params", "status", "summary", "result", "job")


def record_action(runtime: Runtime, entry: AuditEntry) -> str:
    """Append ``entry`` to the audit stream and an ``audit`` entry to the failure history."""
    entry.at_ms = entry.at_ms or now_ms()
    return record_audit(
        runtime,
        entry.fields(),
        queue=entry.params.get("queue") or "*",
        cause=entry.params.get("cause") or "",
        message_id=f"audit:{entry.job}",
        reason=f"{entry.user} ({entry.role}) {entry.action} {entry.target}: {entry.summary}",
        at_ms=entry.at_ms,
    )


def read_audit(runtime: Runtime, *, limit: int = 100) -> list[dict[str, object]]:
    """The latest audit entries, newest first."""
    out: list[dict[str, object]] = []
    for entry_id, fields in audit_entries(runtime, limit):
        at_ms = int(fields.get("at_ms") or 0)
        row: dict[str, object] = {"id": entry_id, "at_ms": at_ms, "at": iso(at_ms)}
        row.update((name, fields.get(name, "")) for name in _TEXTS)
        out.append(row)
    return out
