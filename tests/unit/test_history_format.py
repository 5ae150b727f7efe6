"""The failure history's one field encoding (store/history.py), for Python appends and Lua XADDs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.fates import FateEvent
from celery_dlx.message.names import Keys
from celery_dlx.store.history import HISTORY_FIELDS, History, history_args, history_fields

PACKAGE = Path(__file__).resolve().parents[2] / "celery_dlx"


def event(**overrides: Any) -> FateEvent:
    data: dict[str, Any] = {
        "fate": "parked",
        "queue": "orders",
        "message_id": "m-1",
        "attempt": 3,
        "at_ms": 1_700_000_000_123,
    }
    data.update(overrides)
    return FateEvent.from_fields(**data)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({}, {"task": "", "delay": "", "first_failure_ms": "", "cause": "", "reason": ""}),
        ({"task": "proj.charge"}, {"task": "proj.charge"}),
        ({"delay": 1.23456}, {"delay": "1.235"}),
        ({"delay": 0.0}, {"delay": "0.000"}),
        ({"first_failure_ms": 17}, {"first_failure_ms": "17"}),
        ({"reason": "r" * 900}, {"reason": "r" * 500}),
        (
            {"importance": "page", "exc_type": "KeyError"},
            {"importance": "page", "exc_type": "KeyError"},
        ),
        ({"extra": {"obituary": {"id": "o", "n": 1}}}, {"obituary": '{"id":"o","n":1}'}),
    ],
    ids=repr,
)
def test_history_fields_are_flat_strings(
    overrides: dict[str, Any], expected: dict[str, str]
) -> None:
    fields = history_fields(event(**overrides))
    assert tuple(fields)[: len(HISTORY_FIELDS)] == HISTORY_FIELDS
    assert all(isinstance(v, str) for v in fields.values())
    assert fields["at_ms"] == "1700000000123" and fields["attempt"] == "3"
    for name, value in expected.items():
        assert fields[name] == value, name


@pytest.mark.parametrize(
    "overrides", [{}, {"delay": 2.5, "task": "t"}, {"extra": {"obituary": {}}}]
)
def test_lua_arguments_are_the_same_fields_flat(overrides: dict[str, Any]) -> None:
    fields = history_fields(event(**overrides))
    args = history_args(event(**overrides))
    assert dict(zip(args[::2], args[1::2], strict=True)) == fields
    assert args[::2] == list(fields)


class RecordingPipe:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any, Any]] = []
        self.executed = 0

    def xadd(self, key: str, fields: dict[str, str]) -> None:
        self.calls.append(("xadd", key, fields))

    def execute(self) -> list[Any]:
        self.executed += 1
        return []


class RecordingClient:
    def __init__(self) -> None:
        self.pipe = RecordingPipe()

    def pipeline(self, transaction: bool = True) -> RecordingPipe:
        assert transaction is False
        return self.pipe


@pytest.mark.parametrize("own_pipeline", [True, False])
def test_append_many_queues_one_xadd_per_event_in_order(own_pipeline: bool) -> None:
    client = RecordingClient()
    keys = Keys("t")
    events = [event(message_id="a"), event(message_id="b", fate="buried")]
    pipe = None if own_pipeline else RecordingPipe()
    queued = History(client, keys).append_many(events, pipe)
    used = client.pipe if pipe is None else pipe
    assert queued == 2
    assert used.calls == [("xadd", keys.history, history_fields(e)) for e in events]
    assert used.executed == (1 if own_pipeline else 0)


def test_history_is_appended_only_through_store_history() -> None:
    """Python appends go through History.append_many; Lua XADDs take history_args (graveyard)."""
    py_writers, lua_writers = [], []
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(PACKAGE).as_posix()
        if re.search(r"\.xadd\(", text):
            py_writers.append(name)
        if "'XADD'" in text or '"XADD"' in text:
            lua_writers.append(name)
    assert py_writers == ["store/history.py"]
    assert lua_writers == ["store/graveyard.py"]
    graveyard = (PACKAGE / "store" / "graveyard.py").read_text(encoding="utf-8")
    assert "history_fields" not in graveyard and graveyard.count("history_args(event)") == 2
