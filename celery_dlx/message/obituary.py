"""The obituary: everything known about one buried message. Its record is JSON (tagged by
:mod:`celery_dlx.message.jsoncodec`); the payload stays raw bytes, never decoded or unpickled."""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery_dlx.message import jsoncodec
from celery_dlx.message.event import FateEvent
from celery_dlx.message.failure import FAILURE_FIELDS, Failure, KnownAttempt
from celery_dlx.message.headers import HistoryEntry
from celery_dlx.message.status import status_of

#: Payloads larger than this are left out of the hook task's message (it can fetch them by the
#: obituary id), so a 10 MB body does not become a 13 MB task.
HOOK_PAYLOAD_LIMIT = 1024 * 1024

#: Obituary origins: a Celery task message, or a message of any other producer or consumer.
ORIGIN_CELERY = "celery"
ORIGIN_FOREIGN = "foreign"


#: One failed run of the message: when (epoch ms), which fate followed, and its cause.
Attempt = HistoryEntry


@dataclass
class Obituary(KnownAttempt):
    """The record of one buried message.

    Its :class:`Failure` holds the burial's facts, read as the obituary's attributes (``ob.cause``;
    ``ob.traceback = ...`` replaces the failure); its ``at_ms`` is ``last_failure_ms``.

    Attributes:
        id: from queue, message id, attempt and replay (a redelivered dead letter writes the same).
        buried_ms: when the graveyard received it (epoch ms).
        origin: ``celery`` or ``foreign``.
        attempts: every failed run with its time and fate, ending with the burial.
        death_reason: the broker's x-death reason, or ``published`` when a worker buried the
            message by publishing a clean copy.
        x_death, headers, properties: the dead letter's, JSON-safe.
        exchange, routing_key: where the dead letter was published.
        payload: the raw body; None when listed without it.
        replayed_from: the obituary this message was replayed from, if any.
        replays: epoch ms of every replay of this obituary (from the replay ledger).
        status: what became of it after a replay (:mod:`celery_dlx.store.status`): ``{}`` while
            never replayed, else ``s`` (the status), ``at`` (ms) and ``next`` (the obituary of a
            failure again) or ``repeats`` (failures before this one).
    """

    id: str
    buried_ms: int
    failure: Failure
    origin: str = ORIGIN_FOREIGN
    attempts: list[Attempt] = field(default_factory=list)
    death_reason: str = ""
    x_death: list[Any] = field(default_factory=list)
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    exchange: str = ""
    routing_key: str = ""
    payload: bytes | None = None
    payload_size: int = 0
    replayed_from: str | None = None
    replays: list[int] = field(default_factory=list)
    status: dict[str, Any] = field(default_factory=dict)

    @property
    def status_name(self) -> str:
        """``unresolved``, ``replayed``, ``resolved`` or ``failed-again``."""
        return status_of(self.status)

    @classmethod
    def from_fields(cls, **values: Any) -> Obituary:
        """An obituary of its flat fields (those of :meth:`record`, ``payload``, ``replays``); the
        failure's go into its :class:`Failure` (``importance`` ``notify``, ``attempt`` 0 by default).
        """
        if "last_failure_ms" in values:
            values["at_ms"] = values.pop("last_failure_ms")
        facts = {k: values.pop(k) for k in FAILURE_FIELDS & values.keys()}
        return cls(failure=Failure(**{"importance": "notify", "attempt": 0, **facts}), **values)

    @property
    def last_failure_ms(self) -> int | None:
        return self.failure.at_ms

    @last_failure_ms.setter
    def last_failure_ms(self, value: int | None) -> None:
        self._set(at_ms=value)

    @property
    def content_type(self) -> str | None:
        value = self.properties.get("content_type")
        return value if isinstance(value, str) else None

    @property
    def content_encoding(self) -> str | None:
        value = self.properties.get("content_encoding")
        return value if isinstance(value, str) else None

    def record(self) -> dict[str, object]:
        """The stored JSON record: everything but the payload bytes and the replays."""
        return self._stored(jsoncodec.to_jsonable)

    def record_json(self) -> str:
        """:meth:`record` as JSON text (the same tagging, done by the encoder: faster)."""
        return jsoncodec.dumps(self._stored(_as_decoded))

    def _stored(self, tables: Callable[[object], object]) -> dict[str, object]:
        # Built by hand: dataclasses.asdict deep-copies every header value, 5x slower.
        data: dict[str, object] = {name: getattr(self, name) for name in _PLAIN_FIELDS}
        data["attempts"] = [
            {"at_ms": a.at_ms, "fate": a.fate, "cause": a.cause} for a in self.attempts
        ]
        data["headers"] = tables(self.headers)
        data["properties"] = tables(self.properties)
        data["x_death"] = tables(self.x_death)
        return data

    @classmethod
    def from_record(
        cls, record: Mapping[str, object] | str | bytes, payload: bytes | None = None
    ) -> Obituary:
        """Rebuild an obituary from its stored record (JSON text or a mapping) and payload.

        Raises:
            ValueError: not JSON, or lacking id, message_id, queue, reason or buried_ms.
        """
        if isinstance(record, (str, bytes)):
            data = jsoncodec.loads(record)  # tags decoded while parsing
            tables: Callable[[object], object] = _as_decoded
        else:
            data, tables = dict(record), jsoncodec.from_jsonable
        if not isinstance(data, dict):
            raise ValueError("an obituary record must be a JSON object")
        missing = [k for k in ("id", "message_id", "queue", "reason", "buried_ms") if k not in data]
        if missing:
            raise ValueError(f"obituary record lacks {', '.join(missing)}")
        kwargs = {k: v for k, v in data.items() if k in _KNOWN}
        kwargs["attempts"] = [Attempt(**a) for a in data.get("attempts") or []]
        kwargs["headers"] = tables(data.get("headers") or {})
        kwargs["properties"] = tables(data.get("properties") or {})
        kwargs["x_death"] = tables(data.get("x_death") or [])
        kwargs["payload"] = payload
        return cls.from_fields(**kwargs)

    def fate_event(
        self,
        fate: str,
        at_ms: int,
        *,
        reason: str | None = None,
        traceback: str = "",
        extra: dict[str, object] | None = None,
    ) -> FateEvent:
        """A fate change of the buried message with this obituary's facts (``reason`` defaults to
        the burial's)."""
        failure = self.failure.but(
            reason=self.reason if reason is None else reason,
            traceback=traceback,
            at_ms=at_ms,
        )
        return FateEvent.of(fate, failure, extra=extra)

    def leaving_note(self) -> dict[str, object]:
        """What a removed obituary leaves in its history entry beside the entry's own fields."""
        return {
            "id": self.id,
            "exc_message": self.exc_message[:200],
            "buried_ms": self.buried_ms,
            "payload_size": self.payload_size,
            "code_version": self.code_version,
        }

    def summary(self) -> dict[str, object]:
        """A small JSON-safe view for logs, events and integrations (no payload, no headers)."""
        return {
            "id": self.id,
            "message_id": self.message_id,
            "queue": self.queue,
            "task": self.task,
            "origin": self.origin,
            "reason": self.reason,
            "cause": self.cause,
            "exc_type": self.exc_type,
            "exc_message": self.exc_message,
            "importance": self.importance,
            "attempt": self.attempt,
            "death_reason": self.death_reason,
            "buried_ms": self.buried_ms,
            "first_failure_ms": self.first_failure_ms,
            "last_failure_ms": self.last_failure_ms,
            "payload_size": self.payload_size,
            "content_type": self.content_type,
            "code_version": self.code_version,
            "hostname": self.hostname,
        }

    def json_safe(self, payload_limit: int | None = None) -> dict[str, object]:
        """The whole obituary as JSON-safe data, the payload as base64 with its content type,
        left out (``truncated``) when larger than ``payload_limit`` bytes."""
        data = self.record()
        data["replays"] = list(self.replays)
        body = self.payload
        left_out = body is None or (payload_limit is not None and len(body) > payload_limit)
        data["payload"] = {
            "base64": None if left_out or body is None else base64.b64encode(body).decode("ascii"),
            "size": self.payload_size,
            "content_type": self.content_type,
            "content_encoding": self.content_encoding,
            "truncated": left_out,
        }
        return data


def _as_decoded(value: object) -> object:
    return value


#: Obituary fields stored as they are, in order (converted ``attempts``, ``headers``,
#: ``properties`` and ``x_death`` follow).
_PLAIN_FIELDS = (
    "id",
    "message_id",
    "queue",
    "reason",
    "buried_ms",
    "task",
    "origin",
    "cause",
    "exc_type",
    "exc_message",
    "traceback",
    "importance",
    "attempt",
    "first_failure_ms",
    "last_failure_ms",
    "death_reason",
    "exchange",
    "routing_key",
    "payload_size",
    "code_version",
    "hostname",
    "replayed_from",
)

#: The keys :meth:`Obituary.from_record` reads.
_KNOWN = frozenset(
    {*_PLAIN_FIELDS, "attempts", "headers", "properties", "x_death", "payload", "replays"}
)


def payload_from_json_safe(data: Mapping[str, object]) -> bytes | None:
    """The payload bytes of a :meth:`Obituary.json_safe` dict, or None when it was left out."""
    payload = data.get("payload") or {}
    encoded = payload.get("base64") if isinstance(payload, Mapping) else None
    return base64.b64decode(encoded) if isinstance(encoded, str) else None
