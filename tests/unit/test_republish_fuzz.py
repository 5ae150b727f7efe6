"""Fuzzing the JSON codecs of parked retries and obituaries (bounded hypothesis runs).

Any header table a foreign producer can send must come back from the parking store's JSON codec
as it went in, and its republished copy must encode as an AMQP message without broker-owned
headers. The header names include the codec's own tags, so user data can never pass for them.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import amqp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_dlx.broker.publish import amqp_message
from celery_dlx.message.names import BROKER_HEADERS
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.parked import ParkedMessage

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NAMES = st.one_of(
    st.text(min_size=1, max_size=12),
    st.sampled_from(
        [
            "__bytes__",
            "__datetime__",
            "__repr__",
            "__plain__",
            "x-death",
            "x-first-death-queue",
            "x-delivery-count",
            "x-dlx-attempt",
        ]
    ),
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.binary(max_size=20),
    st.datetimes(min_value=datetime(1971, 1, 1), max_value=datetime(2100, 1, 1)),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(NAMES, inner, max_size=4)),
    max_leaves=12,
)
HEADERS = st.dictionaries(NAMES, VALUES, max_size=6)


def parked(headers: dict[str, Any], body: bytes) -> ParkedMessage:
    return ParkedMessage(
        message_id="m-1",
        attempt=2,
        queue="orders",
        body=body,
        headers=headers,
        properties={"content_type": "application/json", "delivery_mode": 2},
        due_ms=1_700_000_000_000,
    )


@FUZZ
@given(headers=HEADERS, body=st.binary(max_size=64))
def test_parked_headers_come_back_exactly(headers: dict[str, Any], body: bytes) -> None:
    message = parked(headers, body)
    back = ParkedMessage.from_stored(message.meta_json(), body)
    assert back.headers == headers
    assert back.body == body


@FUZZ
@given(headers=HEADERS, body=st.binary(max_size=64))
def test_every_parked_message_republishes_without_broker_headers(
    headers: dict[str, Any], body: bytes
) -> None:
    message = parked(headers, body)
    back = ParkedMessage.from_stored(message.meta_json(), body)
    message = amqp_message(back.outgoing(), 1)
    frame = bytes(message._serialize_properties())
    decoded, _ = amqp.serialization.decode_properties_basic(frame, 0)
    sent = decoded["application_headers"]
    assert not any(
        name.startswith(("x-death", "x-first-death-", "x-last-death-")) or name in BROKER_HEADERS
        for name in sent
    )
    assert message.body == body


def test_tables_using_the_codecs_own_keys_come_back_as_they_were() -> None:
    """Found by the fuzz test: ``{"__bytes__": None}`` came back as a failed bytes tag (the entry
    could never be claimed again) and ``{"__repr__": None}`` as None."""
    for headers in (
        {"__bytes__": None},
        {"__datetime__": ""},
        {"__repr__": None},
        {"t": {"__bytes__": "00ff"}},
        {"__escaped__": 1},
        {"__escaped____bytes__": b"\x00"},
        {"__bytes__": b"\x00", "raw": b"\xff"},
    ):
        message = parked(headers, b"")
        assert ParkedMessage.from_stored(message.meta_json(), b"").headers == headers


@FUZZ
@given(headers=HEADERS, properties=st.dictionaries(st.sampled_from(["type", "app_id"]), VALUES))
def test_obituary_records_keep_any_header_table(
    headers: dict[str, Any], properties: dict[str, Any]
) -> None:
    """The graveyard's record codec: an obituary comes back with the tables it was written with
    (a table shaped like a codec tag once made the obituary unreadable, hence invisible)."""
    ob = Obituary.from_fields(
        id="o",
        message_id="m",
        queue="q",
        reason="r",
        buried_ms=1,
        headers=headers,
        properties=properties,
    )
    back = Obituary.from_record(ob.record_json(), None)
    assert back.headers == headers and back.properties == properties
    assert json.loads(ob.record_json()) == ob.record()
