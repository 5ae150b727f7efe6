"""Pure functions over message headers: celery_dlx's own attempt headers and broker ``x-death``.

Nothing here does I/O. Parsing is defensive: malformed input raises :class:`MalformedHeader` with a
reason a consumer can store, never any other exception.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery_dlx.errors import MalformedHeader
from celery_dlx.message.dictinit import dict_init
from celery_dlx.message.names import (
    ATTEMPT_HEADER,
    BROKER_HEADER_PREFIXES,
    BROKER_HEADERS,
    CAUSE_HEADER,
    DELIVERY_QUEUE_HEADER,
    EXC_MESSAGE_HEADER,
    EXC_MESSAGE_LIMIT,
    EXC_TYPE_HEADER,
    FIRST_FAILURE_HEADER,
    HISTORY_HEADER,
    HISTORY_LIMIT,
    IDENTITY_HEADER,
    PARKS_HEADER,
    QUEUE_HEADER,
    REQUEUES_HEADER,
    STATE_HEADERS,
)

#: Reasons RabbitMQ gives in ``x-death``.
DEATH_REASONS = frozenset({"rejected", "expired", "maxlen", "delivery_limit"})


@dict_init
@dataclass(frozen=True)
class HistoryEntry:
    """One failed attempt: when (epoch ms), which fate followed, and the cause fingerprint."""

    at_ms: int
    fate: str
    cause: str = ""

    def to_json(self) -> list[int | str]:
        return [self.at_ms, self.fate, self.cause]


@dict_init
@dataclass(frozen=True)
class DLXState:
    """What celery_dlx's own headers say about a message."""

    attempt: int = 0
    requeues: int = 0
    parks: int = 0
    history: tuple[HistoryEntry, ...] = ()
    queue: str | None = None
    first_failure_ms: int | None = None
    cause: str | None = None
    exc_type: str | None = None
    exc_message: str | None = None

    def after_failure(
        self,
        *,
        fate: str,
        at_ms: int,
        cause: str,
        queue: str | None,
        exc_type: str | None = None,
        exc_message: str | None = None,
    ) -> DLXState:
        """The state a copy carries after a failure that led to ``fate`` (requeued or parked)."""
        history = (*self.history, HistoryEntry(at_ms, fate, cause))[-HISTORY_LIMIT:]
        return DLXState(
            attempt=self.attempt + 1,
            requeues=self.requeues + (1 if fate == "requeued" else 0),
            parks=self.parks + (1 if fate == "parked" else 0),
            history=history,
            queue=queue or self.queue,
            first_failure_ms=self.first_failure_ms if self.first_failure_ms is not None else at_ms,
            cause=cause,
            exc_type=exc_type,
            exc_message=(exc_message or "")[:EXC_MESSAGE_LIMIT] if exc_message else None,
        )


def _text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _optional_text(value: Any) -> str | None:
    return None if value is None else _text(value)


def _count(headers: Mapping[str, Any], name: str) -> int:
    value = headers.get(name)
    if value is None:
        return 0
    if isinstance(value, bytes):
        value = value.decode("ascii", errors="replace")
    if isinstance(value, bool):
        raise MalformedHeader(f"header {name} must be a non-negative integer, got a boolean")
    try:
        number = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a float infinity
        raise MalformedHeader(
            f"header {name} must be a non-negative integer, got {value!r:.80}"
        ) from None
    if number < 0:
        raise MalformedHeader(f"header {name} must be a non-negative integer, got {number}")
    return number


def _ms(headers: Mapping[str, Any], name: str) -> int:
    """An epoch-milliseconds header in any form celery_dlx ever wrote: an integer (py-amqp
    ``L``, old messages), a decimal string (new ones), or a double (other publishers)."""
    value = headers.get(name)
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return int(value)
    if isinstance(value, (str, bytes)):
        text = _text(value).strip()
        if _DECIMAL_MS.fullmatch(text):
            return int(float(text)) if "." in text else int(text)
    return _count(headers, name)


_DECIMAL_MS = re.compile(r"[0-9]{1,19}(\.[0-9]*)?")


def _history(raw: Any) -> tuple[HistoryEntry, ...]:
    if raw is None:
        return ()
    try:
        items = json.loads(_text(raw))
    except (ValueError, RecursionError):  # RecursionError: arrays nested past the parser's stack
        raise MalformedHeader(f"header {HISTORY_HEADER} is not JSON: {_text(raw)!r:.80}") from None
    if not isinstance(items, list):
        raise MalformedHeader(f"header {HISTORY_HEADER} must be a JSON list")
    entries = []
    for item in items:
        if (
            not isinstance(item, list)
            or len(item) != 3
            or not isinstance(item[0], int)
            or not isinstance(item[1], str)
            or not isinstance(item[2], str)
        ):
            raise MalformedHeader(f"header {HISTORY_HEADER} has a bad entry: {item!r:.80}")
        entries.append(HistoryEntry(item[0], item[1], item[2]))
    return tuple(entries)


_NO_STATE = DLXState()


def read_state(headers: Mapping[str, object] | None) -> DLXState:
    """celery_dlx's own headers, read.

    Raises:
        MalformedHeader: a celery_dlx header is present with a value of the wrong type or shape.
    """
    if not headers or headers.keys().isdisjoint(STATE_HEADERS):
        return _NO_STATE
    first = headers.get(FIRST_FAILURE_HEADER)
    return DLXState(
        attempt=_count(headers, ATTEMPT_HEADER),
        requeues=_count(headers, REQUEUES_HEADER),
        parks=_count(headers, PARKS_HEADER),
        history=_history(headers.get(HISTORY_HEADER)),
        queue=_optional_text(headers.get(QUEUE_HEADER)),
        first_failure_ms=_ms(headers, FIRST_FAILURE_HEADER) if first is not None else None,
        cause=_optional_text(headers.get(CAUSE_HEADER)),
        exc_type=_optional_text(headers.get(EXC_TYPE_HEADER)),
        exc_message=_optional_text(headers.get(EXC_MESSAGE_HEADER)),
    )


_compact_json = json.JSONEncoder(separators=(",", ":")).encode


def state_headers(state: DLXState) -> dict[str, object]:
    """celery_dlx's headers for ``state``: strings and integers (the first-failure time as
    epoch ms; 64-bit ints go on the wire as text, RabbitMQ's clients cannot read py-amqp's ``L``)."""
    out: dict[str, object] = {
        ATTEMPT_HEADER: state.attempt,
        REQUEUES_HEADER: state.requeues,
        PARKS_HEADER: state.parks,
        HISTORY_HEADER: _compact_json([e.to_json() for e in state.history]),
    }
    if state.queue is not None:
        out[QUEUE_HEADER] = state.queue
    if state.first_failure_ms is not None:
        out[FIRST_FAILURE_HEADER] = state.first_failure_ms
    if state.cause is not None:
        out[CAUSE_HEADER] = state.cause
    if state.exc_type is not None:
        out[EXC_TYPE_HEADER] = state.exc_type
    if state.exc_message is not None:
        out[EXC_MESSAGE_HEADER] = state.exc_message
    return out


def is_broker_header(name: str) -> bool:
    """True for headers the broker owns (and transient ones) that a republished copy must not carry."""
    return name in _NOT_COPIED or name.startswith(BROKER_HEADER_PREFIXES)


_NOT_COPIED = frozenset({*BROKER_HEADERS, DELIVERY_QUEUE_HEADER})


def clean_headers(
    headers: Mapping[str, object] | None, state: DLXState | None = None
) -> dict[str, object]:
    """Headers for a republished copy: broker ``x-death*`` headers stripped, ``state`` written."""
    out = {k: v for k, v in (headers or {}).items() if not is_broker_header(str(k))}
    if state is not None:
        out.update(state_headers(state))
    return out


@dict_init
@dataclass(frozen=True)
class Death:
    """One ``x-death`` table, as RabbitMQ writes it."""

    queue: str
    reason: str
    count: int
    exchange: str = ""
    routing_keys: tuple[str, ...] = ()
    time: datetime | None = None
    extra: Mapping[str, object] = field(default_factory=dict)


def parse_x_death(headers: Mapping[str, object] | None) -> list[Death]:
    """Parse ``x-death`` (newest death first, as RabbitMQ orders it); [] when absent.

    Raises:
        MalformedHeader: the header is not a list of tables with a queue, a known reason and a count.
    """
    if not headers or "x-death" not in headers:
        return []
    raw = headers["x-death"]
    if not isinstance(raw, (list, tuple)):
        raise MalformedHeader(f"x-death must be a list of tables, got {type(raw).__name__}")
    deaths = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise MalformedHeader(f"x-death[{i}] must be a table, got {type(item).__name__}")
        queue = item.get("queue")
        reason = item.get("reason")
        if not isinstance(queue, (str, bytes)) or not queue:
            raise MalformedHeader(f"x-death[{i}] has no queue")
        reason_text = _text(reason) if isinstance(reason, (str, bytes)) else ""
        if reason_text not in DEATH_REASONS:
            raise MalformedHeader(f"x-death[{i}] has an unknown reason {reason!r:.40}")
        count = item.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise MalformedHeader(
                f"x-death[{i}] count must be a non-negative integer, got {count!r:.40}"
            )
        keys = item.get("routing-keys") or []
        if not isinstance(keys, (list, tuple)):
            raise MalformedHeader(f"x-death[{i}] routing-keys must be a list")
        when = item.get("time")
        deaths.append(
            Death(
                queue=_text(queue),
                reason=reason_text,
                count=count,
                exchange=_text(item.get("exchange") or ""),
                routing_keys=tuple(_text(k) for k in keys),
                time=when if isinstance(when, datetime) else None,
                extra={k: v for k, v in item.items() if k not in {"queue", "reason", "count"}},
            )
        )
    return deaths


def x_death_problem(headers: Mapping[str, object] | None) -> str | None:
    """The reason ``x-death`` is malformed, or None when it is absent or well formed."""
    try:
        parse_x_death(headers)
    except MalformedHeader as exc:
        return str(exc)
    return None


def dead_letter_refusal(headers: Mapping[str, object] | None) -> str | None:
    """Why a message must never be rejected into a dead-letter exchange (``"malformed x-death:
    <what is wrong>"``, the reason its burial records), or None when it may be.

    Decided here and nowhere else: RabbitMQ 3.10 crashes the queue process when it dead-letters a
    message whose ``x-death`` is malformed. Such a message is buried by publishing a clean copy
    (quarantine); when that fails it goes back to its queue, never ``reject(requeue=False)``.
    """
    problem = x_death_problem(headers)
    return None if problem is None else f"malformed x-death: {problem}"


def _id_value(value: Any) -> str | None:
    return _text(value) if isinstance(value, (str, bytes)) and value else None


def provable_identity(
    properties: Mapping[str, object] | None, headers: Mapping[str, object] | None
) -> str | None:
    """An id that names one message and no other, or None when the message carries none.

    In order: the ``message_id`` property (the publisher's word that it names one message),
    Celery's task id (the ``id`` header, trusted only beside Celery's ``task`` header: a foreign
    ``id`` header is often an entity id shared by many messages), celery_dlx's own ``x-dlx-id``
    (stamped on the copies of a message that had neither). Never ``correlation_id``: many
    messages share one by design (replies to one request).
    """
    props = properties or {}
    hdrs = headers or {}
    found = _id_value(props.get("message_id"))
    if found is None and _id_value(hdrs.get("task")) is not None:
        found = _id_value(hdrs.get("id"))
    return found or _id_value(hdrs.get(IDENTITY_HEADER))


def message_identity(
    properties: Mapping[str, object] | None, headers: Mapping[str, object] | None, body: bytes
) -> str:
    """:func:`provable_identity`, else a digest of the body and a few properties: it describes a
    message, look-alikes share it; never deduplicate on it."""
    found = provable_identity(properties, headers)
    if found is not None:
        return found
    props = properties or {}
    digest = hashlib.sha1(body, usedforsecurity=False)
    for name in ("type", "app_id", "timestamp"):
        if props.get(name) is not None:
            digest.update(_text(props[name]).encode("utf-8", errors="replace"))
    return "sha1-" + digest.hexdigest()


_NORMALIZE = (
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.I), "<uuid>"),
    (re.compile(r"0x[0-9a-f]+", re.I), "<hex>"),
    (re.compile(r"\b[0-9a-f]{16,}\b", re.I), "<hex>"),
    (re.compile(r"'[^']*'|\"[^\"]*\""), "<str>"),
    (re.compile(r"\d+(\.\d+)?"), "<n>"),
)


def normalize_message(message: str) -> str:
    """An exception message with ids, numbers and quoted values replaced, so one cause groups."""
    text = message.strip()[:EXC_MESSAGE_LIMIT]
    for pattern, repl in _NORMALIZE:
        text = pattern.sub(repl, text)
    return text


def fingerprint(scope: str, exc_type: str, message: str) -> str:
    """The cause fingerprint: ``scope`` (task or queue) + exception type + normalized message."""
    raw = "\x1f".join((scope, exc_type, normalize_message(message)))
    return hashlib.sha1(raw.encode("utf-8"), usedforsecurity=False).hexdigest()[:16]


def exception_type_name(exc: BaseException) -> str:
    """``module.QualName`` of an exception's class (builtins without the module)."""
    cls = type(exc)
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )
