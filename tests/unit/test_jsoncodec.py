"""The one JSON codec of stored records (celery_dlx.message.jsoncodec): tags, escaping, old records."""

from __future__ import annotations

import json
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import pytest

from celery_dlx.message import jsoncodec
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.parked import ParkedMessage

WHEN = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone(timedelta(hours=2)))


def stable_id(value: object) -> str:
    """A test id that is the same in every process (a memoryview's repr names its address, and
    pytest-xdist's processes must collect the same ids)."""
    if isinstance(value, memoryview):
        return f"memoryview({bytes(value)!r})"
    return repr(value)


@pytest.mark.parametrize(
    ("value", "tagged"),
    [
        (b"\x00\xff", {"__bytes__": "00ff"}),
        (bytearray(b"\x01"), {"__bytes__": "01"}),
        (memoryview(b"\x02"), {"__bytes__": "02"}),
        (b"", {"__bytes__": ""}),
        (WHEN, {"__datetime__": "2024-05-06T07:08:09.123456+02:00"}),
        (datetime(2024, 5, 6), {"__datetime__": "2024-05-06T00:00:00"}),
        (date(2024, 5, 6), {"__datetime__": "2024-05-06"}),
        (Decimal("12.50"), {"__decimal__": "12.50"}),
        (Decimal("-1E+3"), {"__decimal__": "-1E+3"}),
        ({1, 2}, {"__repr__": "{1, 2}"}),
        ("x" * 3000, "x" * 3000),
        (None, None),
        (True, True),
        (2**64, 2**64),
        (1.5, 1.5),
    ],
    ids=stable_id,
)
def test_each_value_has_one_tagged_form(value: Any, tagged: Any) -> None:
    assert jsoncodec.to_jsonable(value) == tagged
    assert json.loads(jsoncodec.dumps({"v": value})) == {"v": tagged}


@pytest.mark.parametrize(
    ("value", "back"),
    [
        (b"\x00\xff", b"\x00\xff"),
        (bytearray(b"\x01"), b"\x01"),
        (memoryview(b"\x02"), b"\x02"),
        (WHEN, WHEN),
        (datetime(2024, 5, 6), datetime(2024, 5, 6)),
        (date(2024, 5, 6), date(2024, 5, 6)),
        (Decimal("12.50"), Decimal("12.50")),
        ({1, 2}, "{1, 2}"),
        ((1, b"a"), [1, b"a"]),
        ({1: "one"}, {"1": "one"}),
    ],
    ids=stable_id,
)
def test_values_come_back_by_both_decoders(value: Any, back: Any) -> None:
    doc = {"h": {"v": value, "deep": [{"v": value}]}}
    want = {"h": {"v": back, "deep": [{"v": back}]}}
    assert jsoncodec.loads(jsoncodec.dumps(doc)) == want
    assert jsoncodec.from_jsonable(jsoncodec.to_jsonable(doc)) == want
    assert type(jsoncodec.loads(jsoncodec.dumps(doc))["h"]["v"]) is type(back)


def test_a_repr_is_cut_at_the_limit() -> None:
    class Long:
        def __repr__(self) -> str:
            return "r" * 5000

    assert jsoncodec.to_jsonable(Long()) == {"__repr__": "r" * jsoncodec.REPR_LIMIT}


@pytest.mark.parametrize(
    "table",
    [
        {"__bytes__": None},
        {"__bytes__": "00ff"},
        {"__datetime__": ""},
        {"__decimal__": "1.5"},
        {"__repr__": None},
        {"__escaped__": 1},
        {"__escaped____bytes__": b"\x00"},
        {"__bytes__": b"\x00", "raw": b"\xff"},
        {"t": {"__decimal__": Decimal(1)}},
    ],
    ids=stable_id,
)
def test_tables_shaped_like_tags_are_escaped_and_come_back(table: dict[str, Any]) -> None:
    doc = {"headers": table}
    text = jsoncodec.dumps(doc)
    assert text == json.dumps(jsoncodec.to_jsonable(doc), separators=(",", ":"))
    assert jsoncodec.loads(text) == doc
    assert jsoncodec.from_jsonable(json.loads(text)) == doc


@pytest.mark.parametrize(
    "doc",
    [
        {"a": 1, "b": [b"x", WHEN, Decimal("2")], "c": {"d": None}},
        {"k": {1: b"\x01"}},  # a non-text key
        {"k": {(1, 2): "tuple key"}},  # json cannot: the slow path
        {"k": {"__repr__": "x"}, "b": b"\x00"},
        {"plain": 'text with "__bytes__": inside'},
    ],
    ids=stable_id,
)
def test_fast_path_writes_what_the_slow_path_writes(doc: dict[str, Any]) -> None:
    assert jsoncodec.dumps(doc) == json.dumps(jsoncodec.to_jsonable(doc), separators=(",", ":"))


@pytest.mark.parametrize(
    "text",
    [
        '{"h": {"__bytes__": "not hex"}}',
        '{"h": {"__datetime__": "yesterday"}}',
        '{"h": {"__datetime__": "2024-13-01"}}',
        "not json",
    ],
)
def test_broken_tags_raise_value_error(text: str) -> None:
    # ParkingStore.claim keeps an unreadable entry on ValueError; the graveyard skips the record.
    with pytest.raises(ValueError):
        jsoncodec.loads(text)


# --- records stored by the two codecs this one replaced ------------------------------------

#: meta JSON as the parking store's own codec wrote it (no decimal or date tags: reprs).
OLD_PARKED_META = (
    '{"message_id":"m","attempt":2,"queue":"orders","headers":{"b":{"__bytes__":"00ff"},'
    '"t":{"__datetime__":"2024-02-29T23:59:58+00:00"},"amount":{"__repr__":"Decimal(\'12.50\')"},'
    '"day":{"__repr__":"datetime.date(2024, 1, 1)"},"user":{"__decimal__":"not a number"},'
    '"esc":{"__escaped____bytes__":null,"__escaped__":1}},"properties":{},"due_ms":5,'
    '"parked_ms":1,"task":"t","cause":"c"}'
)


def test_a_retry_parked_by_the_old_parking_codec_reads_back() -> None:
    message = ParkedMessage.from_stored(OLD_PARKED_META, b"body")
    assert message.headers == {
        "b": b"\x00\xff",
        "t": datetime(2024, 2, 29, 23, 59, 58, tzinfo=timezone.utc),
        "amount": "Decimal('12.50')",
        "day": "datetime.date(2024, 1, 1)",
        # The old codec did not know this tag, so did not escape a user table using it.
        "user": {"__decimal__": "not a number"},
        "esc": {"__bytes__": None},
    }
    assert (message.message_id, message.attempt, message.due_ms) == ("m", 2, 5)


#: A record as the graveyard's own codec wrote it (dates tagged as datetimes).
OLD_OBITUARY_RECORD = (
    '{"id":"o","message_id":"m","queue":"q","reason":"r","buried_ms":1,'
    '"attempts":[{"at_ms":1,"fate":"buried","cause":""}],'
    '"headers":{"d":{"__decimal__":"1.5"},"day":{"__datetime__":"2024-01-01"},'
    '"b":{"__bytes__":"ff"},"esc":{"__escaped____repr__":1,"__escaped__":1}},'
    '"properties":{"content_type":"application/json"},'
    '"x_death":[{"queue":"q","time":{"__datetime__":"2024-01-01T00:00:00+00:00"}}]}'
)


@pytest.mark.parametrize("as_text", [True, False], ids=["text", "mapping"])
def test_an_obituary_written_by_the_old_graveyard_codec_reads_back(as_text: bool) -> None:
    record = OLD_OBITUARY_RECORD if as_text else json.loads(OLD_OBITUARY_RECORD)
    ob = Obituary.from_record(record)
    assert ob.headers == {
        "d": Decimal("1.5"),
        "day": date(2024, 1, 1),
        "b": b"\xff",
        "esc": {"__repr__": 1},
    }
    assert ob.x_death == [{"queue": "q", "time": datetime(2024, 1, 1, tzinfo=timezone.utc)}]
    assert ob.properties == {"content_type": "application/json"}


def test_parked_and_obituary_records_tag_alike() -> None:
    headers = {"b": b"\x01", "t": WHEN, "d": Decimal("3"), "day": date(2020, 1, 2)}
    parked = ParkedMessage("m", 1, "q", b"", headers=headers, due_ms=1)
    ob = Obituary.from_fields(
        id="o", message_id="m", queue="q", reason="r", buried_ms=1, headers=headers
    )
    assert json.loads(parked.meta_json())["headers"] == json.loads(ob.record_json())["headers"]
    assert ParkedMessage.from_stored(parked.meta_json(), b"").headers == headers
    assert Obituary.from_record(ob.record_json()).headers == headers
