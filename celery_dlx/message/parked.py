"""A parked retry as a record: the message, where it goes back to, when, and its JSON form.

The record is what the parking store keeps (meta JSON plus the raw body) and what the drain and
the TTL ladder republish; it carries no I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from celery_dlx.fates import now_ms


@dataclass
class ParkedMessage:
    """A message waiting for its retry.

    ``entry_id`` is ``"<message id>:<attempt>"``; ``queue`` is where the retry goes (through the
    default exchange); ``due_ms`` is when.
    """

    message_id: str
    attempt: int
    queue: str
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    due_ms: int = 0
    parked_ms: int = field(default_factory=now_ms)
    task: str | None = None
    cause: str = ""
    lease_score: int = 0

    @property
    def entry_id(self) -> str:
        return f"{self.message_id}:{self.attempt}"

    def meta_json(self) -> str:
        doc = {
            "message_id": self.message_id,
            "attempt": self.attempt,
            "queue": self.queue,
            "headers": self.headers,
            "properties": self.properties,
            "due_ms": self.due_ms,
            "parked_ms": self.parked_ms,
            "task": self.task,
            "cause": self.cause,
        }
        tagged = [0]

        def tag(value: Any) -> Any:
            tagged[0] += 1
            return _tag(value)

        try:
            # Fast path: only bytes, datetimes and odd values need a tag (``default``), unless a
            # header table uses a tag's key itself (then it is escaped on the slow path).
            text = json.dumps(doc, separators=(",", ":"), default=tag)
            if not _tag_keys_in_data(text, tagged[0]):
                return text
        except (TypeError, ValueError):  # e.g. a non-string key deep in a header table
            pass
        doc["headers"] = _jsonable(self.headers)
        doc["properties"] = _jsonable(self.properties)
        return json.dumps(doc, separators=(",", ":"))

    @classmethod
    def from_stored(cls, meta: bytes | str, body: bytes, lease_score: int = 0) -> ParkedMessage:
        # The hook decodes tagged values inside json's C loop: a drain decodes every claimed entry.
        data = json.loads(meta, object_hook=_untag)
        return cls(
            message_id=data["message_id"],
            attempt=int(data["attempt"]),
            queue=data["queue"],
            body=body,
            headers=data.get("headers") or {},
            properties=data.get("properties") or {},
            due_ms=int(data["due_ms"]),
            parked_ms=int(data.get("parked_ms") or 0),
            task=data.get("task"),
            cause=data.get("cause") or "",
            lease_score=lease_score,
        )


#: Keys of the codec's tagged objects (``{"__bytes__": "00ff"}``...).
_TAG_KEYS = ("__bytes__", "__datetime__", "__decimal__", "__repr__")
#: Marks a table whose keys were escaped, and prefixes each escaped key: a header table of user
#: data whose only key is a tag's key must not come back as a tagged value.
_ESCAPED = "__escaped__"


def _tag_keys_in_data(text: str, tags: int) -> bool:
    """Whether JSON ``text``, in which ``tags`` values were tagged, uses a codec key elsewhere."""
    if '"__' not in text:  # one scan settles the common case
        return False
    found = sum(text.count(f'"{key}":') for key in _TAG_KEYS)
    return found > tags or f'"{_ESCAPED}' in text


def _needs_escape(key: str) -> bool:
    return key in _TAG_KEYS or key.startswith(_ESCAPED)


def _escaped(table: dict[str, Any]) -> dict[str, Any]:
    if not any(_needs_escape(k) for k in table):
        return table
    out = {(_ESCAPED + k if _needs_escape(k) else k): v for k, v in table.items()}
    out[_ESCAPED] = 1
    return out


def _jsonable(value: Any) -> Any:
    """Header values as JSON: bytes and datetimes tagged so they come back as they were."""
    from datetime import datetime

    if isinstance(value, Mapping):
        return _escaped({str(k): _jsonable(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, bytes):
        return {"__bytes__": value.hex()}
    if isinstance(value, datetime):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, Decimal):  # a decimal header (D) stays one after a park
        return {"__decimal__": str(value)}
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return {"__repr__": repr(value)}


def _tag(value: Any) -> Any:
    """``json.dumps`` default: the tagged form :func:`_jsonable` gives a non-JSON value."""
    from datetime import datetime

    if isinstance(value, (bytes, bytearray)):
        return {"__bytes__": bytes(value).hex()}
    if isinstance(value, datetime):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, Decimal):
        return {"__decimal__": str(value)}
    return {"__repr__": repr(value)}


def _untag(obj: dict[str, Any]) -> Any:
    """``json.loads`` object hook: one tagged object of :func:`_jsonable` back to its value."""
    if len(obj) == 1:
        if "__bytes__" in obj:
            return bytes.fromhex(obj["__bytes__"])
        if "__datetime__" in obj:
            from datetime import datetime

            return datetime.fromisoformat(obj["__datetime__"])
        if "__decimal__" in obj:
            return Decimal(obj["__decimal__"])
        if "__repr__" in obj:
            return obj["__repr__"]
    elif _ESCAPED in obj:
        cut = len(_ESCAPED)
        return {
            (k[cut:] if k.startswith(_ESCAPED) else k): v for k, v in obj.items() if k != _ESCAPED
        }
    return obj
