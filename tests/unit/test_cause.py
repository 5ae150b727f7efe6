"""The cause record (message/cause.py) a worker stashes and the DLX service reads, and the one
malformed-x-death rule (message/headers.py: dead_letter_refusal)."""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.message.cause import EXC_MESSAGE_LIMIT, CauseRecord
from celery_dlx.message.headers import HistoryEntry, dead_letter_refusal

PACKAGE = Path(__file__).resolve().parents[2] / "celery_dlx"

FULL = CauseRecord.from_fields(
    task="proj.tasks.charge",
    queue="celery",
    message_id="t-1",
    attempt=3,
    cause="abc123",
    exc_type="ValueError",
    exc_message="bad card 42",
    reason="permanent failure: ValueError",
    importance="page",
    traceback="Traceback (most recent call last):\n  ...\nValueError: bad card 42",
    history=(HistoryEntry(1, "requeued", "abc123"), HistoryEntry(3, "buried", "abc123")),
    first_failure_ms=1,
    at_ms=3,
    hostname="worker@a",
)

#: A record exactly as workers stashed it before the record was a dataclass (a dict's JSON).
OLD_STASHED = json.dumps(
    {
        "task": "proj.tasks.charge",
        "queue": "celery",
        "message_id": "t-1",
        "attempt": 3,
        "cause": "abc123",
        "exc_type": "ValueError",
        "exc_message": "bad card 42",
        "reason": "permanent failure: ValueError",
        "importance": "page",
        "traceback": "Traceback (most recent call last):\n  ...\nValueError: bad card 42",
        "history": [[1, "requeued", "abc123"], [3, "buried", "abc123"]],
        "first_failure_ms": 1,
        "at_ms": 3,
        "hostname": "worker@a",
    },
    separators=(",", ":"),
)


def test_a_record_round_trips() -> None:
    assert CauseRecord.from_json(FULL.to_json()) == FULL
    assert CauseRecord.from_json(FULL.to_json().encode()) == FULL


def test_the_stored_form_is_what_workers_stashed_before() -> None:
    assert FULL.to_json() == OLD_STASHED
    assert CauseRecord.from_json(OLD_STASHED) == FULL


def test_a_long_exception_message_is_cut() -> None:
    record = CauseRecord.from_fields(exc_message="x" * (EXC_MESSAGE_LIMIT + 10))
    back = CauseRecord.from_json(record.to_json())
    assert back is not None and back.exc_message == "x" * EXC_MESSAGE_LIMIT


@pytest.mark.parametrize("raw", [None, b"not json", "[]", "5", '"text"', "null", b"\xff"])
def test_what_is_not_a_stored_object_reads_as_none(raw: Any) -> None:
    assert CauseRecord.from_json(raw) is None


@pytest.mark.parametrize(
    ("stored", "expected"),
    [
        ({}, CauseRecord.from_fields()),
        ({"attempt": "x", "reason": 5, "cause": None}, CauseRecord.from_fields()),
        ({"attempt": True, "at_ms": False}, CauseRecord.from_fields()),
        (
            {"attempt": 2.0, "first_failure_ms": 7},
            CauseRecord.from_fields(attempt=2, first_failure_ms=7),
        ),
        ({"at_ms": float("inf")}, CauseRecord.from_fields()),
        ({"task": "", "hostname": ""}, CauseRecord.from_fields(task=None, hostname=None)),
        ({"task": 5, "queue": ["q"]}, CauseRecord.from_fields()),
        ({"history": "nope"}, CauseRecord.from_fields()),
        (
            {
                "history": [
                    [1, "parked", "c"],
                    [1, "p"],
                    ["a", "b", "c"],
                    [True, "x", ""],
                    [2, 3, 4],
                ]
            },
            CauseRecord.from_fields(
                history=(HistoryEntry(1, "parked", "c"), HistoryEntry(2, "?", ""))
            ),
        ),
        ({"added_later": 1, "exc_type": "E"}, CauseRecord.from_fields(exc_type="E")),
    ],
    ids=repr,
)
def test_fields_are_read_one_by_one(stored: dict[str, Any], expected: CauseRecord) -> None:
    assert CauseRecord.from_json(json.dumps(stored)) == expected


def rabbit_death(**overrides: Any) -> dict[str, Any]:
    death = {"queue": "orders", "reason": "rejected", "count": 1, "time": datetime(2024, 1, 1)}
    death.update(overrides)
    return death


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        (None, False),
        ({}, False),
        ({"x-death": [rabbit_death()]}, False),
        ({"x-death": []}, False),
        ({"x-death": "not a list"}, True),
        ({"x-death": [5]}, True),
        ({"x-death": [rabbit_death(reason="nonsense")]}, True),
        ({"x-death": [rabbit_death(count=-1)]}, True),
        ({"x-death": [rabbit_death(queue=None)]}, True),
    ],
    ids=repr,
)
def test_which_messages_must_never_be_dead_lettered(headers: Any, refused: bool) -> None:
    why = dead_letter_refusal(headers)
    assert (why is not None) is refused
    if why is not None:
        assert why.startswith("malformed x-death: ")


def test_only_the_rule_reads_x_death_problems_on_the_worker_side() -> None:
    """Every reject path of the worker asks dead_letter_refusal, nobody re-derives the rule."""
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        text = path.read_text(encoding="utf-8")
        if name != "message/headers.py":
            assert not re.search(r"\bx_death_problem\(", text), name
    for name in ("worker/delivery.py", "worker/consumer.py"):
        assert "dead_letter_refusal(" in (PACKAGE / name).read_text(encoding="utf-8"), name
