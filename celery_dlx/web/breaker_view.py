"""The console's open breakers (``dlx_breaker``): the overview's table, the cause page's notice
and the operators' *Close* button (what ``celery dlx breakers close CAUSE --queue QUEUE`` does,
written to the audit log)."""

from __future__ import annotations

import logging
from typing import Any

from celery_dlx import Runtime
from celery_dlx.ops import now_ms
from celery_dlx.ops.breakers import close_breakers, open_breakers
from celery_dlx.web.audit import AuditEntry, record_action
from celery_dlx.web.auth import User

logger = logging.getLogger(__name__)

#: The audit log's action name of a breaker closed from the console.
CLOSE_ACTION = "close breaker"


def overview_breakers(runtime: Runtime) -> list[dict[str, Any]]:
    """The open breakers, each with ``has_group``: whether its cause has obituaries (a held
    cause usually has none and its cause page would be a 404: the overview links it only then)."""
    rows = open_breakers(runtime)
    if not rows:
        return rows
    buried = {g.cause for g in runtime.graveyard.groups_of(sorted({r["cause"] for r in rows}))}
    return [{**r, "has_group": r["cause"] in buried} for r in rows]


def cause_breakers(runtime: Runtime, cause: str) -> list[dict[str, Any]]:
    """The open breakers of ``cause`` (one per queue it burns on)."""
    return [r for r in open_breakers(runtime) if r["cause"] == cause]


def close_audited(runtime: Runtime, user: User, cause: str, queue: str) -> str:
    """Close the breaker of ``cause`` on ``queue`` (its held messages released at the queue's
    ``release_rate``) and write the audit entry; the entry's summary."""
    closed = close_breakers(runtime, cause, queue)
    released = sum(int(c["released"]) for c in closed)
    summary = f"closed, {released} held messages released" if closed else "was not open"
    entry = AuditEntry(
        user=user.name,
        role=user.role,
        action=CLOSE_ACTION,
        target=f"cause {cause} on {queue}",
        params={"cause": cause, "queue": queue},
        status="done" if closed else "noop",
        result={"closed": closed, "released": released},
        summary=summary,
        at_ms=now_ms(),
    )
    try:
        record_action(runtime, entry)
    except Exception:  # the breaker is closed; a lost audit line is logged, not hidden
        logger.exception("console %s by %s not written to the audit log", CLOSE_ACTION, user.name)
    logger.info("console %s by %s of %s on %s: %s", CLOSE_ACTION, user.name, cause, queue, summary)
    return summary
