"""Obituary records, their JSON-safe form and the hook task sending (no I/O)."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest

from celery_dlx.broker.hook import send_to_hook
from celery_dlx.message.jsoncodec import from_jsonable
from celery_dlx.message.jsoncodec import to_jsonable as jsonable
from celery_dlx.message.obituary import (
    HOOK_PAYLOAD_LIMIT,
    Attempt,
    Obituary,
    payload_from_json_safe,
)


def obituary(**overrides: Any) -> Obituary:
    data: dict[str, Any] = {
        "id": "ob1",
        "message_id": "m-1",
        "queue": "billing",
        "reason": "retry budget spent",
        "buried_ms": 3000,
        "cause": "c0ffee",
        "exc_type": "rejected",
        "attempt": 3,
        "attempts": [Attempt(1000, "parked", "c0ffee"), Attempt(3000, "buried", "c0ffee")],
        "first_failure_ms": 1000,
        "last_failure_ms": 3000,
        "death_reason": "rejected",
        "x_death": [
            {"queue": "billing", "count": 1, "time": datetime(2024, 1, 1, tzinfo=timezone.utc)}
        ],
        "headers": {"bin": b"\xff\x00", "n": 7, "nested": {"d": Decimal("1.5")}},
        "properties": {"content_type": "application/x-protobuf", "message_id": "m-1"},
        "payload": b"\x08\x96\x01",
        "payload_size": 3,
    }
    data.update(overrides)
    return Obituary.from_fields(**data)


def test_jsonable_round_trips_amqp_values() -> None:
    value = {
        "b": b"\x00\xff",
        "t": datetime(2024, 5, 6, 7, 8, 9, tzinfo=timezone.utc),
        "d": Decimal("3.25"),
        "l": [1, "x", None, True, 2.5, {"inner": b"z"}],
    }
    encoded = jsonable(value)
    assert json.loads(json.dumps(encoded)) == encoded
    assert from_jsonable(encoded) == value


def test_unknown_values_become_their_repr() -> None:
    assert jsonable({"o": object})["o"]["__repr__"].startswith("<class")


def test_record_round_trip_keeps_everything_but_the_payload() -> None:
    ob = obituary()
    text = ob.record_json()
    assert 'payload"' not in text.replace("payload_size", "")
    back = Obituary.from_record(text, ob.payload)
    assert back == ob
    assert Obituary.from_record(text).payload is None


@pytest.mark.parametrize("missing", ["id", "message_id", "queue", "reason", "buried_ms"])
def test_record_without_a_required_field_is_refused(missing: str) -> None:
    data = obituary().record()
    del data[missing]
    with pytest.raises(ValueError, match=missing):
        Obituary.from_record(data)


def test_record_ignores_unknown_fields_from_a_newer_version() -> None:
    data = obituary().record()
    data["added_later"] = 1
    assert Obituary.from_record(data).id == "ob1"


def test_json_safe_carries_the_payload_as_base64_with_its_content_type() -> None:
    data = obituary().json_safe()
    json.dumps(data)
    assert data["payload"] == {
        "base64": base64.b64encode(b"\x08\x96\x01").decode(),
        "size": 3,
        "content_type": "application/x-protobuf",
        "content_encoding": None,
        "truncated": False,
    }
    assert payload_from_json_safe(data) == b"\x08\x96\x01"
    assert data["attempts"] == [
        {"at_ms": 1000, "fate": "parked", "cause": "c0ffee"},
        {"at_ms": 3000, "fate": "buried", "cause": "c0ffee"},
    ]


def test_json_safe_leaves_out_a_payload_over_the_limit() -> None:
    data = obituary(payload=b"x" * 11, payload_size=11).json_safe(payload_limit=10)
    assert data["payload"]["truncated"] is True and data["payload"]["base64"] is None
    assert data["payload"]["size"] == 11
    assert payload_from_json_safe(data) is None


def test_summary_is_small_and_json_safe() -> None:
    summary = obituary().summary()
    json.dumps(summary)
    assert "headers" not in summary and "payload" not in summary
    assert summary["content_type"] == "application/x-protobuf"


class RecordingApp:
    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.sent: list[tuple[str, list[Any], dict[str, Any]]] = []

    def send_task(self, name: str, args: list[Any], **options: Any) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((name, args, options))


def test_hook_gets_the_json_safe_obituary() -> None:
    app = RecordingApp()
    assert send_to_hook(app, "proj.tasks.on_dead", obituary())
    [(name, args, options)] = app.sent
    assert name == "proj.tasks.on_dead" and options["serializer"] == "json"
    assert json.loads(json.dumps(args[0]))["id"] == "ob1"
    assert payload_from_json_safe(args[0]) == b"\x08\x96\x01"


def test_hook_payload_is_capped() -> None:
    app = RecordingApp()
    big = b"x" * (HOOK_PAYLOAD_LIMIT + 1)
    send_to_hook(app, "hook", obituary(payload=big, payload_size=len(big)))
    assert app.sent[0][1][0]["payload"]["truncated"] is True


def test_hook_failure_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    assert send_to_hook(RecordingApp(fail=True), "hook", obituary()) is False
    assert "obituary hook hook could not be sent for obituary ob1" in caplog.text


def test_no_hook_configured_or_hook_task_buried_sends_nothing() -> None:
    app = RecordingApp()
    assert send_to_hook(app, None, obituary()) is False
    assert send_to_hook(app, "hook", obituary(task="hook")) is False
    assert app.sent == []


def test_fast_json_record_equals_the_slow_one() -> None:
    ob = obituary(
        headers={
            "b": b"\x01",
            "t": datetime(2024, 1, 1, tzinfo=timezone.utc),
            "l": (1, [b"x"]),
            7: "int key",
        }
    )
    assert json.loads(ob.record_json()) == json.loads(json.dumps(ob.record()))
    odd = obituary(headers={b"bytes-key": 1})  # not JSON-encodable directly: the slow path
    assert json.loads(odd.record_json())["headers"] == {"b'bytes-key'": 1}


@pytest.mark.parametrize(
    ("fate", "kwargs", "reason", "traceback"),
    [
        ("buried", {"traceback": "Traceback..."}, "retry budget spent", "Traceback..."),
        ("purged", {"reason": "purged by ops"}, "purged by ops", ""),
        ("archived", {"reason": ""}, "", ""),
    ],
)
def test_fate_events_of_an_obituary_carry_its_facts(
    fate: str, kwargs: dict[str, Any], reason: str, traceback: str
) -> None:
    ob = obituary(task="proj.charge", importance="page")
    event = ob.fate_event(fate, 9000, extra={"obituary_id": ob.id}, **kwargs)
    assert (event.fate, event.at_ms, event.reason, event.traceback) == (
        fate,
        9000,
        reason,
        traceback,
    )
    assert (event.queue, event.message_id, event.attempt, event.task) == (
        "billing",
        "m-1",
        3,
        "proj.charge",
    )
    assert (event.cause, event.exc_type, event.importance, event.first_failure_ms) == (
        "c0ffee",
        "rejected",
        "page",
        1000,
    )
    assert event.extra == {"obituary_id": "ob1"}
