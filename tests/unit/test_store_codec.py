"""The parking store's JSON codec: parked headers and properties come back as they were."""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from celery_dlx.message.parked import ParkedMessage


def _round_trip(message: ParkedMessage, lease_score: int = 0) -> ParkedMessage:
    return ParkedMessage.from_stored(message.meta_json(), message.body, lease_score=lease_score)


def _message(**overrides: object) -> ParkedMessage:
    fields: dict[str, object] = {
        "message_id": "c0ffee-1",
        "attempt": 3,
        "queue": "orders",
        "body": b"[[1], {}, {}]",
        "headers": {},
        "properties": {},
        "due_ms": 1_700_000_005_000,
        "parked_ms": 1_700_000_000_000,
        "task": "proj.tasks.charge",
        "cause": "3f2a9c0d",
    }
    fields.update(overrides)
    return ParkedMessage(**fields)  # type: ignore[arg-type]


def test_plain_fields_round_trip() -> None:
    message = _message()
    back = _round_trip(message, lease_score=42)
    assert back == ParkedMessage(**{**message.__dict__, "lease_score": 42})
    assert back.entry_id == "c0ffee-1:3"


@pytest.mark.parametrize(
    "value",
    [
        b"\x00\xffraw bytes\x80",
        b"",
        datetime(2024, 2, 29, 23, 59, 58, 123456),
        datetime(2024, 2, 29, 23, 59, 58, tzinfo=timezone.utc),
        datetime(2024, 2, 29, 1, 2, 3, tzinfo=timezone(timedelta(hours=-5, minutes=-30))),
        "text with \u00e9 and \u2603",
        0,
        -(2**63),
        2**64,
        1.5,
        True,
        False,
        None,
    ],
    ids=repr,
)
def test_scalar_header_values_round_trip(value: object) -> None:
    back = _round_trip(_message(headers={"h": value}, properties={"correlation_id": value}))
    assert back.headers == {"h": value}
    assert type(back.headers["h"]) is type(value)
    assert back.properties == {"correlation_id": value}


def test_nested_values_round_trip() -> None:
    when = datetime(2023, 11, 14, 22, 13, 20)
    headers = {
        "x-death": [
            {
                "queue": b"orders",
                "reason": "rejected",
                "count": 2,
                "time": when,
                "routing-keys": [b"orders", "orders.eu"],
            }
        ],
        "table": {"inner": {"deeper": [1, [2, b"\x01"], {"t": when}]}},
        "empty": {},
        "empty-list": [],
    }
    back = _round_trip(_message(headers=headers))
    assert back.headers == headers


def test_tuples_come_back_as_lists() -> None:
    back = _round_trip(_message(headers={"timelimit": (None, 30), "nested": {"t": (b"a",)}}))
    assert back.headers == {"timelimit": [None, 30], "nested": {"t": [b"a"]}}


def test_non_string_keys_become_strings() -> None:
    back = _round_trip(_message(headers={1: "one", "t": {2: b"two"}}))
    assert back.headers == {"1": "one", "t": {"2": b"two"}}


def test_unknown_types_are_kept_as_their_repr() -> None:
    back = _round_trip(_message(headers={"amount": Decimal("12.50"), "set": {1}}))
    # A decimal (AMQP D, as Go's amqp.Decimal sends it) comes back a decimal (issue 12).
    assert back.headers == {"amount": Decimal("12.50"), "set": "{1}"}
    assert isinstance(back.headers["amount"], Decimal)


def test_body_is_stored_apart_from_the_json() -> None:
    message = _message(body=b"\xff" * 10)
    meta = json.loads(message.meta_json())
    assert "body" not in meta
    assert _round_trip(message).body == b"\xff" * 10


def test_metadata_is_compact_json() -> None:
    meta = _message(headers={"a": 1}).meta_json()
    assert ", " not in meta and ": " not in meta
    assert json.loads(meta)["headers"] == {"a": 1}


@pytest.mark.parametrize(
    "meta",
    [
        b"not json",
        b'{"attempt": 1, "queue": "q", "due_ms": 1}',
        b'{"message_id": "m", "attempt": "one", "queue": "q", "due_ms": 1}',
        b'{"message_id": "m", "attempt": 1, "queue": "q", "due_ms": 1, '
        b'"headers": {"h": {"__bytes__": "not hex"}}}',
    ],
)
def test_unreadable_metadata_raises_what_claim_catches(meta: bytes) -> None:
    # ParkingStore.claim keeps such an entry (leased, visible) on exactly these exception types.
    with pytest.raises((ValueError, KeyError, TypeError)):
        ParkedMessage.from_stored(meta, b"")
