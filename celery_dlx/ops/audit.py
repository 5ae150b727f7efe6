"""The operators' audit log: one entry per finished action, from the console or the command line.

An entry is a set of text fields (when, who, what, on what, with which result) in the audit
stream (``{prefix}:web:audit``, capped at about :data:`AUDIT_MAXLEN`) and one ``audit`` entry of
the failure history, written in one round trip. The messages an action touched have their own
``replayed``/``purged``/... history entries.
"""

from __future__ import annotations

from collections.abc import Mapping

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
    """Append ``fields`` to the audit stream and an ``audit`` entry to the failure history.

    Args:
        fields: the audit stream entry (``at_ms``, ``user``, ``role``, ``action``, ``target``,
            ``params``, ``status``, ``summary``, ``result``, ``job``).
        queue, cause, message_id, reason: the history entry's (``*`` for an action on several
            queues, "" for no cause, ``audit:<action>:...``, one line saying who did what).
        at_ms: when the action finished (epoch ms).

    Returns:
        The audit stream entry's id.
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
