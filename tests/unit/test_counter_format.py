"""The fate counters' one format (store/counters.py): the write side and the read side agree."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.fates import FateEvent
from celery_dlx.message.names import Keys
from celery_dlx.store import counters

PACKAGE = Path(__file__).resolve().parents[2] / "celery_dlx"


class FakeRedisPipe:
    """Just enough of a Redis pipeline and client to run add_counts then read_minutes."""

    def __init__(self) -> None:
        self.hashes: dict[str, dict[str, int]] = defaultdict(dict)
        self.expires: dict[str, int] = {}
        self._reads: list[str] = []

    def hincrby(self, key: str, name: str, n: int) -> None:
        self.hashes[key][name] = self.hashes[key].get(name, 0) + n

    def expire(self, key: str, seconds: int) -> None:
        self.expires[key] = seconds

    def hgetall(self, key: str) -> None:
        self._reads.append(key)

    def pipeline(self, transaction: bool = True) -> FakeRedisPipe:
        return self

    def execute(self) -> list[Any]:
        out = [
            {k.encode(): str(v).encode() for k, v in self.hashes.get(key, {}).items()}
            for key in self._reads
        ]
        self._reads = []
        return out


def at(minute: int, second: int = 0) -> int:
    return minute * 60_000 + second * 1000


@pytest.mark.parametrize(
    ("queue", "fate", "field"),
    [
        ("orders", "parked", "orders|parked"),
        ("a|b", "buried", "a|b|buried"),  # a queue name may hold the separator
        ("orders.eu", "requeued", "orders.eu|requeued"),
    ],
)
def test_field_names_parse_back(queue: str, fate: str, field: str) -> None:
    assert counters.field_name(queue, fate) == field
    assert counters.parse_field(field) == (queue, fate)


@pytest.mark.parametrize("bad", ["", "orders", "|parked", "orders|"])
def test_fields_not_written_by_field_name_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        counters.parse_field(bad)


def test_what_add_counts_writes_read_minutes_reads() -> None:
    keys = Keys("t")
    pipe = FakeRedisPipe()
    events = [
        FateEvent.from_fields(
            "parked", queue="orders", message_id="m1", attempt=1, at_ms=at(100, 5)
        ),
        FateEvent.from_fields(
            "parked", queue="orders", message_id="m2", attempt=1, at_ms=at(100, 59)
        ),
        FateEvent.from_fields("buried", queue="a|b", message_id="m3", attempt=6, at_ms=at(100, 1)),
        FateEvent.from_fields("parked", queue="orders", message_id="m4", attempt=2, at_ms=at(101)),
    ]
    counters.add_counts(pipe, keys, events)
    assert set(pipe.hashes) == {keys.counter(100), keys.counter(101)}
    assert pipe.expires == {
        keys.counter(100): counters.COUNTER_TTL,
        keys.counter(101): counters.COUNTER_TTL,
    }
    read = counters.read_minutes(pipe, keys, 99, 101)
    assert not read.malformed
    assert {(r.minute, r.queue, r.fate, r.count) for r in read.rows} == {
        (100, "orders", "parked", 2),
        (100, "a|b", "buried", 1),
        (101, "orders", "parked", 1),
    }


def test_the_read_window_is_the_counters_retention() -> None:
    assert counters.MAX_MINUTES * 60 == counters.COUNTER_TTL


def test_no_other_module_formats_counter_keys_or_fields() -> None:
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        text = path.read_text(encoding="utf-8")
        if name not in {"store/counters.py", "message/names.py"}:
            assert "counter_prefix" not in text, name
        # store/refusals.py counts refused copies in a hash of its own (no per-minute counter).
        if name not in {"store/counters.py", "message/names.py", "store/refusals.py"}:
            assert "hincrby" not in text, name
