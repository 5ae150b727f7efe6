"""Sentry: one event per burial, grouped by cause, leveled by importance, rate-limited per cause.

Uses the app's own ``sentry_sdk.init``: nothing is sent unless a Sentry client is active in the
process. What is reported:

* a burial (fate ``buried``) is one Sentry event whose ``fingerprint`` is the cause fingerprint,
  so any number of poison messages with one cause make one Sentry issue; tags ``queue``,
  ``task``, ``attempts``, ``importance``, ``fate``; level ``fatal`` for importance ``page``,
  ``warning`` for ``notify``; nothing for ``ignore``. The message's attempt history comes along
  as breadcrumbs, the payload only when ``dlx_sentry_include_payload`` is on;
* at most ``dlx_sentry_rate_limit`` events per cause per ``dlx_sentry_rate_window`` seconds,
  counted in Redis so the budget holds across workers and DLX services;
* every other fate change (requeued, parked, drained, replayed...) is a breadcrumb, never an
  event.

Double reports are prevented: celery_dlx's own fate-line logger (``celery_dlx``) is kept out of
Sentry's logging integration (its burial line would be a second event), and a global event
processor drops any event about an exception celery_dlx marked as handled (see
:func:`mark_handled`). sentry-sdk's CeleryIntegration wraps ``DLXTask.__call__`` from outside,
so it only sees the ``Ignore``/``Reject`` that end a handled run, which it treats as control flow.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone
from typing import Any

from ..fates import BURIED, FateEvent
from ..runtime import Runtime
from .ratelimit import WindowBudget
from .tracebacks import exception_values

logger = logging.getLogger(__name__)

#: Sentry level per importance; ``ignore`` sends nothing.
LEVELS = {"page": "fatal", "notify": "warning"}
#: Breadcrumb level per fate (anything not listed is ``info``).
BREADCRUMB_LEVELS = {"parked": "warning", "requeued": "info", "buried": "error"}
#: The logger :meth:`celery_dlx.runtime.Runtime.record` writes fate lines to.
FATE_LOGGER = "celery_dlx"
#: Attribute set on an exception whose failure celery_dlx turned into a fate.
HANDLED_ATTR = "__celery_dlx_fate__"
#: Longest exception message sent (Sentry truncates values itself, later and silently).
MESSAGE_LIMIT = 8192
#: Breadcrumbs of attempt history sent with one burial at most (the most recent are kept).
HISTORY_BREADCRUMBS = 50


def mark_handled(exc: BaseException, fate: str) -> None:
    """Mark ``exc`` as turned into ``fate`` by celery_dlx, so no Sentry event reports it again.

    Call it on the exception a task raised when its failure became a fate; any event sentry-sdk
    builds later from that exception (a wrapping integration, ``capture_exception`` in user code
    around the run) is dropped by :func:`drop_handled`.
    """
    try:
        setattr(exc, HANDLED_ATTR, fate)
    except (AttributeError, TypeError):  # exceptions with __slots__ cannot carry the mark
        logger.debug("cannot mark %r as handled", exc)


def handled_fate(exc: BaseException | None) -> str | None:
    """The fate ``exc`` (or the exception it was raised from) was marked with, else None."""
    seen = 0
    while exc is not None and seen < 10:
        fate = getattr(exc, HANDLED_ATTR, None)
        if isinstance(fate, str):
            return fate
        exc = exc.__cause__
        seen += 1
    return None


def drop_handled(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any] | None:
    """Sentry event processor: drop events about exceptions celery_dlx already handled."""
    exc_info = hint.get("exc_info") if isinstance(hint, dict) else None
    if exc_info and len(exc_info) > 1 and handled_fate(exc_info[1]):
        return None
    return event


def _sentry() -> Any:
    import sentry_sdk

    return sentry_sdk


def sentry_active() -> bool:
    """True when sentry-sdk is installed and initialised with somewhere to send (a DSN)."""
    try:
        sdk = _sentry()
    except ImportError:
        return False
    client = sdk.get_client()
    return bool(client.is_active() and getattr(client, "transport", None) is not None)


def install_sentry_hooks() -> None:
    """Keep celery_dlx's fate lines out of Sentry's logging integration; drop handled failures.

    Idempotent; safe to call before or after ``sentry_sdk.init``.
    """
    from sentry_sdk.integrations.logging import ignore_logger
    from sentry_sdk.scope import add_global_event_processor, global_event_processors

    ignore_logger(FATE_LOGGER)
    if drop_handled not in global_event_processors:
        add_global_event_processor(drop_handled)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()


def _history(event: FateEvent) -> list[Any]:
    history = event.extra.get("history")
    obituary = event.extra.get("obituary")
    if history is None and isinstance(obituary, dict):
        history = obituary.get("history")
    return history if isinstance(history, list) else []


def history_breadcrumbs(event: FateEvent) -> list[dict[str, Any]]:
    """Breadcrumbs from the message's attempt history (``[ms, fate, cause]`` entries)."""
    crumbs = []
    for entry in _history(event)[-HISTORY_BREADCRUMBS:]:
        if not isinstance(entry, (list, tuple)) or len(entry) < 2:
            continue
        ms, fate = entry[0], str(entry[1])
        cause = str(entry[2]) if len(entry) > 2 and entry[2] is not None else ""
        crumb: dict[str, Any] = {
            "type": "default",
            "category": "celery_dlx",
            "level": BREADCRUMB_LEVELS.get(fate, "info"),
            "message": f"{fate} {event.task or event.queue}[{event.message_id}]",
            "data": {"fate": fate, "cause": cause, "queue": event.queue},
        }
        if isinstance(ms, (int, float)):
            crumb["timestamp"] = ms / 1000
        crumbs.append(crumb)
    return crumbs


def fate_breadcrumb(event: FateEvent) -> dict[str, Any]:
    """The breadcrumb of one fate change that is not a burial."""
    data: dict[str, Any] = {
        "fate": event.fate,
        "queue": event.queue,
        "message_id": event.message_id,
        "attempt": event.attempt,
        "cause": event.cause,
    }
    if event.delay is not None:
        data["delay"] = round(event.delay, 3)
    if event.exc_type:
        data["exc_type"] = event.exc_type
    if event.reason:
        data["reason"] = event.reason[:500]
    return {
        "type": "default",
        "category": "celery_dlx",
        "level": BREADCRUMB_LEVELS.get(event.fate, "info"),
        "message": f"{event.fate} {event.task or '-'}[{event.message_id}] attempt={event.attempt}",
        "data": data,
        "timestamp": event.at_ms / 1000,
    }


def burial_event(event: FateEvent, level: str) -> dict[str, Any]:
    """The Sentry event of one burial, without payload or breadcrumbs."""
    fingerprint = event.cause or f"{event.task or event.queue}:{event.exc_type or event.reason}"
    message = event.exc_message[:MESSAGE_LIMIT] or event.reason[:MESSAGE_LIMIT]
    values = exception_values(event.exc_type or "Buried", message, event.traceback)
    values[-1]["mechanism"] = {"type": "celery_dlx", "handled": True}
    obituary = event.extra.get("obituary")
    obituary_id = event.extra.get("obituary_id") or (
        obituary.get("id") if isinstance(obituary, dict) else None
    )
    context = {
        "message_id": event.message_id,
        "queue": event.queue,
        "task": event.task,
        "cause": event.cause,
        "attempts": event.attempt,
        "reason": event.reason[:2000],
        "exc_type": event.exc_type,
        "first_failure": _iso(event.first_failure_ms),
        "buried_at": _iso(event.at_ms),
        "obituary_id": obituary_id,
    }
    return {
        "level": level,
        "logger": FATE_LOGGER,
        "transaction": event.task or f"queue:{event.queue}",
        "fingerprint": [fingerprint],
        "exception": {"values": values},
        "tags": {
            "queue": event.queue,
            "task": event.task or "",
            "attempts": str(event.attempt),
            "importance": event.importance,
            "fate": event.fate,
        },
        "contexts": {"celery_dlx": {k: v for k, v in context.items() if v not in (None, "")}},
    }


def _payload(event: FateEvent) -> tuple[bytes | None, str | None, str | None]:
    extra = event.extra
    obituary = extra.get("obituary") if isinstance(extra.get("obituary"), dict) else {}
    body = extra.get("payload", obituary.get("payload") if obituary else None)
    if isinstance(body, str):
        body = body.encode("utf-8", "surrogateescape")
    if not isinstance(body, (bytes, bytearray, memoryview)):
        return None, None, None
    ctype = extra.get("content_type") or (obituary.get("content_type") if obituary else None)
    cenc = extra.get("content_encoding") or (obituary.get("content_encoding") if obituary else None)
    return bytes(body), ctype, cenc


def _decode(body: bytes, content_type: str | None, content_encoding: str | None) -> Any:
    """The codecs' JSON-safe view of ``body``; None when the codecs are not available."""
    try:
        from ..codecs import decode_payload  # type: ignore[attr-defined]
    except ImportError:
        return None
    decoded = decode_payload(body, content_type=content_type, content_encoding=content_encoding)
    to_json = getattr(decoded, "to_json", None)
    return to_json() if callable(to_json) else decoded


def payload_text(
    body: bytes, content_type: str | None, content_encoding: str | None, limit: int
) -> tuple[str, bool]:
    """``(text, truncated)``: the decoded payload (or a repr of the bytes) in ``limit`` bytes."""
    try:
        decoded = _decode(body, content_type, content_encoding)
    except Exception as exc:  # a payload that breaks a codec is shown raw, with the reason
        logger.debug("payload decoding failed: %r", exc)
        decoded = None
    if decoded is None:
        text = repr(body[: limit + 1])
    else:
        text = json.dumps(decoded, ensure_ascii=False, default=str, indent=1)
    raw = text.encode("utf-8")
    truncated = len(raw) > limit
    if len(raw) > limit:
        text = raw[:limit].decode("utf-8", "ignore")
    return text, truncated


class SentryReporter:
    """Fate listener sending burials to Sentry and other fate changes as breadcrumbs.

    Args:
        runtime: the app's runtime (settings, Redis for the shared rate limit).
    """

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        config = runtime.config
        self.include_payload: bool = config.sentry_include_payload
        self.payload_limit: int = config.sentry_payload_limit
        self.budget = WindowBudget(
            runtime.keys, "sentry", config.sentry_rate_limit, config.sentry_rate_window
        )

    def __call__(self, event: FateEvent) -> None:
        if not sentry_active():
            return
        if event.fate == BURIED:
            self.report(event)
        else:
            _sentry().add_breadcrumb(fate_breadcrumb(event))

    def report(self, event: FateEvent) -> str | None:
        """Send the burial ``event``, unless its importance or its cause's budget says no.

        Returns:
            the Sentry event id, or None when nothing was sent.
        """
        level = LEVELS.get(event.importance)
        if level is None:
            return None
        fingerprint = event.cause or f"{event.task or event.queue}:{event.exc_type}"
        allowed, used = self.budget.spend(self.runtime.redis, fingerprint)
        if not allowed:
            return None
        data = burial_event(event, level)
        data["contexts"]["celery_dlx"]["events_of_cause_in_window"] = used
        if self.include_payload:
            body, ctype, cenc = _payload(event)
            if body is not None:
                text, truncated = payload_text(body, ctype, cenc, self.payload_limit)
                data["extra"] = {
                    "payload": text,
                    "payload_content_type": ctype,
                    "payload_bytes": len(body),
                    "payload_truncated": truncated,
                }
        sdk = _sentry()
        with sdk.isolation_scope() as scope:
            scope.clear_breadcrumbs()
            for crumb in history_breadcrumbs(event):
                scope.add_breadcrumb(crumb)
            event_id: str | None = sdk.capture_event(data)
        return event_id


def install_sentry(runtime: Runtime) -> SentryReporter | None:
    """The Sentry listener for ``runtime``, or None when ``dlx_sentry`` is off or sentry-sdk is
    not installed. Installs the hooks that prevent double reports.
    """
    if not runtime.config.sentry:
        return None
    try:
        install_sentry_hooks()
    except ImportError:
        return None
    return SentryReporter(runtime)
