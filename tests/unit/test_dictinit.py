"""dict_init: the same __init__ as the frozen dataclass's, filled in one step."""

from __future__ import annotations

import dataclasses
from dataclasses import FrozenInstanceError, InitVar, dataclass, field

import pytest

from celery_dlx.message.dictinit import dict_init
from celery_dlx.message.failure import Failure
from celery_dlx.message.headers import DLXState, HistoryEntry
from celery_dlx.policy.deadletter import DeadLetter


def _shape() -> type:
    @dataclass(frozen=True)
    class Shape:
        a: int
        b: str = "b"
        c: list[int] = field(default_factory=list)
        d: tuple[int, ...] = ()
        e: int | None = field(default=None, kw_only=True)

    return Shape


def test_same_instances_as_the_dataclass_init() -> None:
    plain, fast = _shape(), dict_init(_shape())
    for args, kwargs in [
        ((1,), {}),
        ((1, "x"), {}),
        ((1, "x", [2], (3,)), {"e": 4}),
        ((), {"a": 5, "c": [6], "e": None}),
    ]:
        want, got = plain(*args, **kwargs), fast(*args, **kwargs)
        assert dataclasses.asdict(got) == dataclasses.asdict(want)
        assert repr(got).replace("Shape", "") == repr(want).replace("Shape", "")
        assert hash(got.d) == hash(want.d)


def test_same_errors_for_wrong_calls() -> None:
    plain, fast = _shape(), dict_init(_shape())
    for args, kwargs in [((), {}), ((1, 2, 3, 4, 5), {}), ((1,), {"z": 1}), ((1,), {"a": 2})]:
        with pytest.raises(TypeError):
            plain(*args, **kwargs)
        with pytest.raises(TypeError):
            fast(*args, **kwargs)


def test_each_instance_gets_its_own_default_from_a_factory() -> None:
    fast = dict_init(_shape())
    one, two = fast(1), fast(2)
    one.c.append(1)
    assert two.c == []


def test_still_frozen_and_hashable() -> None:
    fast = dict_init(_shape())
    item = fast(1)
    with pytest.raises(FrozenInstanceError):
        item.a = 2
    assert fast(1, d=(1,)) == fast(1, d=(1,))
    entry = HistoryEntry(1, "parked", "c")
    assert hash(entry) == hash(HistoryEntry(1, "parked", "c"))
    with pytest.raises(FrozenInstanceError):
        entry.fate = "buried"  # type: ignore[misc]


def test_refuses_what_it_would_not_do_alike() -> None:
    @dataclass
    class Mutable:
        a: int

    @dataclass(frozen=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclass(frozen=True)
    class Hidden:
        a: int
        b: int = field(default=0, init=False)

    @dataclass(frozen=True)
    class Var:
        a: int
        b: InitVar[int] = 0

    for cls in (Mutable, Post, Hidden, Var, int):
        with pytest.raises(TypeError, match="dict_init"):
            dict_init(cls)


def test_the_package_records_read_as_before() -> None:
    failure = Failure(queue="q", attempt=2, cause="c")
    assert failure.task is None and failure.queue == "q" and failure.attempt == 2
    assert failure.but(attempt=3) == Failure(queue="q", attempt=3, cause="c")
    state = DLXState(attempt=1, history=(HistoryEntry(5, "parked"),))
    assert state.after_failure(fate="parked", at_ms=6, cause="c", queue="q").parks == 1
    letter = DeadLetter(b"", {}, {}, "id", "q", "rejected", "k")
    assert letter.state == DLXState() and letter.x_death == [] and letter.provable
    assert DeadLetter(b"", {}, {}, "id", "q", "rejected", "k").x_death is not letter.x_death
