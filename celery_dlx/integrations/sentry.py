"""Sentry: one event per burial, fingerprinted by cause, leveled by importance, rate-limited per
cause in Redis; other fate changes are breadcrumbs (see docs/monitoring.md).

No double reports: the ``celery_dlx`` loggers are kept out of Sentry's logging integration, and
an event processor drops events about exceptions marked by :func:`mark_handled`. sentry-sdk's
CeleryIntegration wraps ``DLXTask.__call__`` from outside, so it only sees the ``Ignore``/``Reject``
ending a handled run, which it treats as control flow.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from datetime import datetime, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any, Literal

from celery_dlx.compat import add_sentry_event_processor_once
from celery_dlx.errors import ConfigurationError
from celery_dlx.fates import BURIED, FateEvent
from celery_dlx.integrations.events import obituary_id
from celery_dlx.integrations.tracebacks import exception_values
from celery_dlx.policy.settings import SENTRY_SETTINGS, sentry_missing
from celery_dlx.wiring.runtime import Runtime

if TYPE_CHECKING:
    from sentry_sdk.types import Event, Hint

    from celery_dlx.codecs import ProtobufRegistry

logger = logging.getLogger(__name__)

Level = Literal["fatal", "critical", "error", "warning", "info", "debug"]
#: Sentry level per importance; ``ignore`` sends nothing.
LEVELS: dict[str, Level] = {"page": "fatal", "notify": "warning"}
#: Breadcrumb level per fate (anything not listed is ``info``).
BREADCRUMB_LEVELS = {"parked": "warning", "requeued": "info", "buried": "error"}
#: The logger :meth:`celery_dlx.wiring.runtime.Runtime.record` writes fate lines to.
FATE_LOGGER = "celery_dlx"
#: Attribute set on an exception whose failure celery_dlx turned into a fate.
HANDLED_ATTR = "__celery_dlx_fate__"
#: Longest exception message sent (Sentry truncates values itself, later and silently).
MESSAGE_LIMIT = 8192
#: Breadcrumbs of attempt history sent with one burial at most (the most recent are kept).
HISTORY_BREADCRUMBS = 50


def mark_handled(exc: BaseException, fate: str) -> None:
    """Mark ``exc`` as turned into ``fate`` by celery_dlx: any Sentry event later built from it
    (a wrapping integration, the user's ``capture_exception``) is dropped by :func:`drop_handled`."""
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


def drop_handled(event: Event, hint: Hint) -> Event | None:
    """Sentry event processor: drop events about exceptions celery_dlx already handled."""
    exc_info = hint.get("exc_info") if isinstance(hint, dict) else None
    if exc_info and len(exc_info) > 1 and handled_fate(exc_info[1]):
        return None
    return event


def sentry_active() -> bool:
    """True when sentry-sdk is installed and initialised with somewhere to send (a DSN)."""
    try:
        import sentry_sdk
    except ImportError:
        return False
    client = sentry_sdk.get_client()
    return bool(client.is_active() and getattr(client, "transport", None) is not None)


def _iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).isoformat()


def _entry(entry: Any) -> tuple[Any, str, str] | None:
    """``(ms, fate, cause)`` of a history entry: ``[ms, fate, cause]`` or an Attempt's dict."""
    if isinstance(entry, dict):
        entry = [entry.get("at_ms"), entry.get("fate"), entry.get("cause")]
    if not isinstance(entry, (list, tuple)) or len(entry) < 2 or not entry[1]:
        return None
    cause = entry[2] if len(entry) > 2 and entry[2] is not None else ""
    return entry[0], str(entry[1]), str(cause)


def event_history(event: FateEvent) -> list[object] | None:
    """The attempt history a fate event carries (``extra`` history or obituary), if any."""
    history = event.extra.get("history")
    obituary = event.extra.get("obituary")
    if history is None and isinstance(obituary, dict):
        history = obituary.get("attempts") or obituary.get("history")
    return history if isinstance(history, list) else None


def history_breadcrumbs(
    event: FateEvent, history: Sequence[object] | None = None
) -> list[dict[str, object]]:
    """Breadcrumbs of the burial ``event``'s attempt ``history`` (entries ``[ms, fate, cause]``
    or ``{"at_ms", "fate", "cause"}``; default: the event's own), oldest first."""
    crumbs = []
    entries = event_history(event) if history is None else history
    for raw in (entries or [])[-HISTORY_BREADCRUMBS:]:
        entry = _entry(raw)
        if entry is None:
            continue
        ms, fate, cause = entry
        crumb = _crumb(
            fate,
            f"{fate} {event.task or event.queue}[{event.message_id}]",
            {"fate": fate, "cause": cause, "queue": event.queue},
        )
        if isinstance(ms, (int, float)) and not isinstance(ms, bool):
            crumb["timestamp"] = ms / 1000
        crumbs.append(crumb)
    return crumbs


def fate_breadcrumb(event: FateEvent) -> dict[str, object]:
    """The breadcrumb of one fate change that is not a burial."""
    data: dict[str, object] = {
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
    message = f"{event.fate} {event.task or '-'}[{event.message_id}] attempt={event.attempt}"
    return {**_crumb(event.fate, message, data), "timestamp": event.at_ms / 1000}


def _crumb(fate: str, message: str, data: dict[str, object]) -> dict[str, object]:
    return {
        "type": "default",
        "category": "celery_dlx",
        "level": BREADCRUMB_LEVELS.get(fate, "info"),
        "message": message,
        "data": data,
    }


def burial_event(event: FateEvent, level: Level) -> Event:
    """The Sentry event of one burial, without payload or breadcrumbs."""
    fingerprint = event.cause or f"{event.task or event.queue}:{event.exc_type or event.reason}"
    message = event.exc_message[:MESSAGE_LIMIT] or event.reason[:MESSAGE_LIMIT]
    values = exception_values(event.exc_type or "Buried", message, event.traceback)
    values[-1]["mechanism"] = {"type": "celery_dlx", "handled": True}
    context: dict[str, object] = {
        "message_id": event.message_id,
        "queue": event.queue,
        "task": event.task,
        "cause": event.cause,
        "attempts": event.attempt,
        "reason": event.reason[:2000],
        "exc_type": event.exc_type,
        "first_failure": _iso(event.first_failure_ms),
        "buried_at": _iso(event.at_ms),
        "obituary_id": obituary_id(event),
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


def burial_release(event: FateEvent, client_release: str | None) -> str | None:
    """The release of a burial's Sentry event: the client's own (``sentry_sdk.init(release=)``)
    when it has one, else the code version the message was buried with (``dlx_code_version``,
    ``$DLX_CODE_VERSION`` or ``$GIT_COMMIT``); None when neither is known."""
    return client_release or event.failure.code_version or None


def payload_view(
    body: bytes,
    content_type: str | None,
    content_encoding: str | None,
    limit: int,
    registry: ProtobufRegistry | None = None,
) -> dict[str, object]:
    """The payload as Sentry ``extra``, decoded, in at most ``limit`` bytes: ``payload`` (text),
    ``payload_kind``, ``payload_bytes``, ``payload_truncated``, maybe ``payload_notes`` and
    ``payload_type``."""
    view: dict[str, object] = {"payload_bytes": len(body), "payload_content_type": content_type}
    try:
        from celery_dlx.codecs import decode_payload

        decoded = decode_payload(
            body,
            content_type=content_type,
            content_encoding=content_encoding,
            registry=registry,
            limit=max(limit * 4, 65536),
        )
        text = json.dumps(decoded.data, ensure_ascii=False, default=str, indent=1)
        view.update(payload_kind=decoded.kind, payload_truncated=decoded.truncated)
        if decoded.notes:
            view["payload_notes"] = list(decoded.notes)
        if decoded.type_name:
            view["payload_type"] = decoded.type_name
    except Exception as exc:  # a payload that breaks a codec is shown raw, with the reason
        text = repr(body[: limit + 1])
        view.update(payload_kind="repr", payload_truncated=len(body) > limit)
        view["payload_notes"] = [f"not decoded: {exc!r}"[:300]]
    raw = text.encode("utf-8")
    if len(raw) > limit:
        text = raw[:limit].decode("utf-8", "ignore")
        view["payload_truncated"] = True
    view["payload"] = text
    return view


class SentryReporter:
    """Fate listener sending burials to Sentry and other fate changes as breadcrumbs."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        config = runtime.config
        self.include_payload: bool = config.sentry_include_payload
        self.payload_limit: int = config.sentry_payload_limit
        self.budget = runtime.budget("sentry", config.sentry_rate_limit, config.sentry_rate_window)

    def __call__(self, event: FateEvent) -> None:
        if not sentry_active():
            return
        if event.fate == BURIED:
            self.report(event)
        else:
            import sentry_sdk

            sentry_sdk.add_breadcrumb(fate_breadcrumb(event))

    @cached_property
    def _registry(self) -> ProtobufRegistry | None:
        """The protobuf registry of ``dlx_protobuf_*`` settings, made once; None if unusable."""
        try:
            from celery_dlx.codecs import registry_from_config

            return registry_from_config(self.runtime.config)
        except Exception as exc:  # the payload is still shown, decoded without schemas
            logger.warning("Sentry payloads decoded without protobuf types: %s", exc)
            return None

    def _history(self, event: FateEvent) -> list[Any] | None:
        """The event's attempt history, else the attempts of its obituary in the graveyard."""
        history = event_history(event)
        found = obituary_id(event)
        if history is not None or found is None:
            return history
        try:
            (ob,) = self.runtime.graveyard.load([found])
        except Exception as exc:  # breadcrumbs are a nicety; the event goes without them
            logger.debug("could not read obituary %s for breadcrumbs: %r", found, exc)
            return None
        if ob is None:
            return None
        return [[a.at_ms, a.fate, a.cause] for a in ob.attempts]

    def report(self, event: FateEvent) -> str | None:
        """Send the burial ``event`` unless its importance or its cause's budget says no; the
        Sentry event id, or None when nothing was sent."""
        level = LEVELS.get(event.importance)
        if level is None:
            return None
        fingerprint = event.cause or f"{event.task or event.queue}:{event.exc_type}"
        allowed, used = self.budget.spend(fingerprint)
        if not allowed:
            return None
        data = burial_event(event, level)
        data["contexts"]["celery_dlx"]["events_of_cause_in_window"] = used
        import sentry_sdk

        release = burial_release(event, sentry_sdk.get_client().options.get("release"))
        if release:
            data["release"] = release
        body = event.extra.get("payload")
        if self.include_payload and isinstance(body, (bytes, bytearray, memoryview)):
            ctype, cenc = event.extra.get("content_type"), event.extra.get("content_encoding")
            data["extra"] = payload_view(
                bytes(body),
                str(ctype) if ctype else None,
                str(cenc) if cenc else None,
                self.payload_limit,
                self._registry,
            )
        with sentry_sdk.isolation_scope() as scope:
            scope.clear_breadcrumbs()
            for crumb in history_breadcrumbs(event, self._history(event)):
                scope.add_breadcrumb(crumb)
            event_id: str | None = sentry_sdk.capture_event(data)
        return event_id


def install_sentry(runtime: Runtime) -> SentryReporter | None:
    """The Sentry listener for ``runtime``, or None when ``dlx_sentry`` is off, or on by default
    while sentry-sdk is not installed. Keeps the fate lines out of Sentry's logging integration
    and drops events about handled failures (no double reports).

    Raises:
        ConfigurationError: a ``dlx_sentry*`` setting is set explicitly but sentry-sdk cannot be
            imported (install the ``sentry`` extra).
    """
    config = runtime.config
    if not config.sentry:
        return None
    try:
        from sentry_sdk.integrations.logging import ignore_logger
    except ImportError as exc:
        if config.explicit & SENTRY_SETTINGS:
            raise ConfigurationError(sentry_missing(config.explicit, str(exc))) from exc
        return None  # on by default; without sentry-sdk there is nothing to report to
    # Idempotent, and safe before or after ``sentry_sdk.init``.
    ignore_logger(FATE_LOGGER)
    ignore_logger(f"{FATE_LOGGER}.*")  # the worker's quarantine lines: the service reports burials
    add_sentry_event_processor_once(drop_handled)
    return SentryReporter(runtime)
