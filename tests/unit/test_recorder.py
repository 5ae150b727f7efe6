"""FateRecorder.park_recorded_many composing a park and its record in one transaction (fakes)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

import pytest
import redis

from celery_dlx.fates import PARKED, FateEvent
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.wiring.recorder import FateRecorder


class FakePipe:
    def __init__(self) -> None:
        self.queued: list[str] = []


class FakeParking:
    """``replies`` for the transaction (None: none possible); ``refused`` parks raise."""

    def __init__(self, replies: list[Any] | None, refused: Collection[str] = ()) -> None:
        self.replies, self.refused = replies, refused
        self.parked: list[str] = []
        self.sent: list[str] = []

    def park(self, message: ParkedMessage) -> bool:
        if message.message_id in self.refused:
            raise redis.ConnectionError("refused")
        self.parked.append(message.message_id)
        return True

    def park_many(self, messages: Sequence[ParkedMessage], *, pipeline: Any = None) -> list[bool]:
        pipeline.queued.append("park")
        return []

    def transaction(self, queue: Callable[[Any], None], what: str) -> list[Any] | None:
        if self.replies is None:
            return None
        pipe = FakePipe()
        queue(pipe)
        self.sent = pipe.queued
        return self.replies


class FakeHistory:
    def __init__(self) -> None:
        self.written: list[str] = []
        self.forgotten: list[str] = []

    def write(
        self, events: Sequence[FateEvent], *, history: bool = True, pipeline: Any = None
    ) -> bool:
        if pipeline is not None:
            pipeline.queued.append("history")
        else:
            self.written += [e.message_id for e in events]
        return True

    def forget_copies(self, events: Sequence[FateEvent]) -> None:
        self.forgotten += [e.message_id for e in events]


def _recorder(parking: FakeParking, history: FakeHistory, heard: list[str]) -> FateRecorder:
    return FateRecorder(
        parking=lambda: parking,  # type: ignore[arg-type,return-value]
        history=lambda: history,  # type: ignore[arg-type,return-value]
        publisher=lambda: None,  # type: ignore[arg-type,return-value]
        reset_publisher=lambda: None,
        listeners=[lambda event: heard.append(event.message_id)],
        history_optional=lambda: False,
    )


def _parks(*ids: str) -> list[tuple[ParkedMessage, FateEvent]]:
    return [
        (
            ParkedMessage(message_id=i, attempt=1, queue="orders", body=b"", due_ms=1),
            FateEvent.from_fields(PARKED, queue="orders", message_id=i, attempt=1, delay=1.0),
        )
        for i in ids
    ]


def test_the_park_and_its_record_are_queued_in_one_transaction() -> None:
    parking, history, heard = FakeParking([[1, 0], 1, 1]), FakeHistory(), list[str]()
    outcomes = _recorder(parking, history, heard).park_recorded_many(_parks("a", "b"))
    assert outcomes == [None, None]
    assert parking.sent == ["park", "history"]
    assert heard == ["a", "b"] and history.written == []


def test_parked_but_not_recorded_is_reported_once_and_the_parks_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    refused = redis.ResponseError("WRONGTYPE history")
    parking, history, heard = FakeParking([[1], refused, 1]), FakeHistory(), list[str]()
    with caplog.at_level(logging.INFO, logger="celery_dlx"):
        outcomes = _recorder(parking, history, heard).park_recorded_many(_parks("a"))
    assert outcomes == [None]
    assert heard == ["a"]
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("parked") for line in lines)
    assert [line for line in lines if "not recorded" in line and "WRONGTYPE" in line]


def test_a_refused_park_takes_its_markers_back_and_tells_no_one() -> None:
    refused = redis.ResponseError("OOM")
    parking, history, heard = FakeParking([refused, 1, 1]), FakeHistory(), list[str]()
    outcomes = _recorder(parking, history, heard).park_recorded_many(_parks("a", "b"))
    assert outcomes == [refused, refused]
    assert history.forgotten == ["a", "b"] and heard == []


def test_without_a_transaction_each_is_parked_then_recorded() -> None:
    parking, history, heard = FakeParking(None, refused={"b"}), FakeHistory(), list[str]()
    outcomes = _recorder(parking, history, heard).park_recorded_many(_parks("a", "b"))
    assert outcomes[0] is None and isinstance(outcomes[1], redis.ConnectionError)
    assert parking.parked == ["a"] and history.written == ["a"] and heard == ["a"]


def test_park_recorded_raises_what_kept_the_park_out() -> None:
    parking, history, heard = FakeParking(None, refused={"a"}), FakeHistory(), list[str]()
    message, event = _parks("a")[0]
    with pytest.raises(redis.ConnectionError):
        _recorder(parking, history, heard).park_recorded(message, event)
    assert heard == [] and history.written == []
