"""The cause record: what a worker knows about a burial that the dead letter cannot carry (the
exception, traceback and history), stashed in Redis before it rejects, for the obituary."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from celery_dlx.message.dictinit import dict_init
from celery_dlx.message.failure import Failure, MaybeAttempt
from celery_dlx.message.headers import HistoryEntry

#: Longest exception message kept in a cause record.
EXC_MESSAGE_LIMIT = 2000


@dict_init
@dataclass(frozen=True)
class CauseRecord(MaybeAttempt):
    """The worker's account of one burial: its :class:`Failure` (unknown fields left at their
    defaults; ``at_ms`` the decision's time) and ``history``, every failed run with its fate,
    ending with the burial."""

    failure: Failure = field(default_factory=Failure)
    history: tuple[HistoryEntry, ...] = ()

    @classmethod
    def from_fields(cls, *, history: tuple[HistoryEntry, ...] = (), **facts: Any) -> CauseRecord:
        return cls(Failure(**facts), history)

    def to_json(self) -> str:
        """The stored JSON text (``exc_message`` cut at :data:`EXC_MESSAGE_LIMIT`)."""
        data: dict[str, object] = {name: getattr(self, name) for name in _JSON_FIELDS}
        data["exc_message"] = self.exc_message[:EXC_MESSAGE_LIMIT]
        data["history"] = [e.to_json() for e in self.history]
        if self.code_version is not None:
            data["code_version"] = self.code_version
        return json.dumps(data, separators=(",", ":"), default=str)

    @classmethod
    def from_json(cls, raw: str | bytes | None) -> CauseRecord | None:
        """The record stashed as ``raw``, or None when there is none or it is not a JSON object.
        A field of the wrong type reads as unknown (a record of another version yields what it
        can)."""
        try:
            data = json.loads(raw or "")
        except ValueError:
            return None
        if not isinstance(data, Mapping):
            return None
        facts = {name: _READERS[name](data.get(name)) for name in _JSON_FIELDS if name != "history"}
        facts["code_version"] = _optional_str(data.get("code_version"))
        return cls(Failure(**facts), _history(data.get("history")))


#: The stored JSON's keys, in order; ``code_version`` follows only when known (as older versions
#: stored it; the DLX service prefers the worker's, whose code failed).
_JSON_FIELDS = (
    "task",
    "queue",
    "message_id",
    "attempt",
    "cause",
    "exc_type",
    "exc_message",
    "reason",
    "importance",
    "traceback",
    "history",
    "first_failure_ms",
    "at_ms",
    "hostname",
)


def _int(value: Any) -> int | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return int(value)
    except (OverflowError, ValueError):  # inf, nan
        return None


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _history(raw: Any) -> tuple[HistoryEntry, ...]:
    out = []
    for item in raw if isinstance(raw, list) else ():
        if (
            isinstance(item, list)
            and len(item) == 3
            and isinstance(item[0], int)
            and not isinstance(item[0], bool)
        ):
            fate = item[1] if isinstance(item[1], str) else "?"
            out.append(HistoryEntry(item[0], fate, _str(item[2])))
    return tuple(out)


def _optional_str(value: Any) -> str | None:
    return _str(value) or None


#: How each failure field is read from a stored object, by its declared type.
_READERS: dict[str, Callable[[Any], Any]] = {
    f.name: {
        "str": _str,
        "str | None": _optional_str,
        "int | None": _int,
    }[str(f.type)]
    for f in fields(Failure)
}
