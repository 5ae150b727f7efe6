"""Fuzzing: decoding and header parsing never fail on hostile input (bounded hypothesis runs)."""

from __future__ import annotations

import base64
import bz2
import gzip
import json
import math
import pickle
import zlib
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from celery_dlx.codecs import KINDS, ProtobufRegistry, decode_payload
from celery_dlx.errors import MalformedHeader
from celery_dlx.message import names
from celery_dlx.message.headers import parse_x_death, read_state, x_death_problem
from tests.fixtures.codecs.protos import compile_descriptor_set

FUZZ = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> ProtobufRegistry:
    registry = ProtobufRegistry()
    registry.add_descriptor_set(compile_descriptor_set(tmp_path_factory.mktemp("fuzz-protos")))
    return registry


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


@st.composite
def wire_messages(draw: st.DrawFn, depth: int = 0) -> bytes:
    """Plausible protobuf: valid fields, sometimes nested, sometimes cut or corrupted after."""
    out = bytearray()
    for _ in range(draw(st.integers(0, 6))):
        number = draw(st.integers(1, 40))
        kind = draw(st.sampled_from(["varint", "fixed32", "fixed64", "len", "nested"]))
        if kind == "varint":
            out += _varint(number << 3) + _varint(draw(st.integers(0, (1 << 64) - 1)))
        elif kind == "fixed32":
            out += _varint(number << 3 | 5) + draw(st.binary(min_size=4, max_size=4))
        elif kind == "fixed64":
            out += _varint(number << 3 | 1) + draw(st.binary(min_size=8, max_size=8))
        else:
            value = (
                draw(wire_messages(depth + 1))
                if kind == "nested" and depth < 3
                else draw(st.binary(max_size=20))
            )
            out += _varint(number << 3 | 2) + _varint(len(value)) + value
    return bytes(out)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)


@st.composite
def bodies(draw: st.DrawFn) -> bytes:
    shape = draw(
        st.sampled_from(
            [
                "bytes",
                "text",
                "json",
                "celery",
                "wire",
                "base64",
                "gzip",
                "zlib",
                "bz2",
                "pickle",
                "cut",
            ]
        )
    )
    if shape == "bytes":
        return draw(st.binary(max_size=300))
    if shape == "text":
        return draw(st.text(max_size=200)).encode("utf-8", "surrogatepass")
    if shape == "json":
        return json.dumps(draw(JSON_VALUES)).encode()
    if shape == "celery":
        return json.dumps(
            [draw(st.lists(JSON_VALUES, max_size=3)), {"k": draw(JSON_VALUES)}, {}]
        ).encode()
    if shape == "wire":
        return draw(wire_messages())
    if shape == "pickle":
        return pickle.dumps(
            draw(JSON_VALUES), protocol=draw(st.integers(0, pickle.HIGHEST_PROTOCOL))
        )
    inner = draw(bodies())
    if shape == "base64":
        encode = draw(st.sampled_from([base64.b64encode, base64.urlsafe_b64encode]))
        return encode(inner).rstrip(b"=" if draw(st.booleans()) else b"")
    if shape == "gzip":
        return gzip.compress(inner)
    if shape == "zlib":
        return zlib.compress(inner)
    if shape == "bz2":
        return bz2.compress(inner)
    cut = draw(st.integers(0, max(len(inner) - 1, 0)))
    return inner[:cut] + draw(st.binary(max_size=4))


CONTENT_TYPES = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "application/json",
            "application/x-protobuf",
            "application/x-protobuf; messageType=shop.events.v1.OrderPlaced",
            "application/x-protobuf; messageType=nope.Nope",
            "application/x-python-serialize",
            "application/x-yaml",
            "application/x-msgpack",
            "application/octet-stream",
            "text/plain; charset=utf-8",
            "",
            ";;;=",
        ]
    ),
    st.text(max_size=40),
)
ENCODINGS = st.one_of(
    st.none(),
    st.sampled_from(
        [
            "utf-8",
            "binary",
            "gzip",
            "deflate",
            "zlib",
            "bzip2",
            "xz",
            "base64",
            "br",
            "latin-1",
            "utf-16",
            "hex",
            "rot13",
            "",
        ]
    ),
    st.text(max_size=20),
)
HEADER_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=30)
    | st.binary(max_size=30)
    | st.datetimes(timezones=st.just(timezone.utc)),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4)
    ),
    max_leaves=12,
)
HEADERS = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(["task", "id", "compression", "lang", "argsrepr"]) | st.text(max_size=10),
        HEADER_VALUES,
        max_size=5,
    ),
)


def _check(decoded: Any) -> None:
    assert decoded.kind in KINDS
    text = json.dumps(decoded.to_json(), allow_nan=False)
    assert isinstance(json.loads(text), dict)
    assert all(isinstance(note, str) for note in decoded.notes)
    assert not any(note.startswith("internal error") for note in decoded.notes), decoded.notes


@FUZZ
@given(body=bodies(), content_type=CONTENT_TYPES, content_encoding=ENCODINGS, headers=HEADERS)
def test_decode_payload_never_raises_and_returns_json_safe_data(
    body: bytes, content_type: Any, content_encoding: Any, headers: Any
) -> None:
    _check(
        decode_payload(
            body, content_type=content_type, content_encoding=content_encoding, headers=headers
        )
    )


@FUZZ
@given(
    body=bodies(),
    content_type=CONTENT_TYPES,
    content_encoding=ENCODINGS,
    headers=HEADERS,
    limit=st.integers(-10, 4096),
)
def test_decode_payload_with_a_registry_and_small_limits_never_raises(
    registry: ProtobufRegistry,
    body: bytes,
    content_type: Any,
    content_encoding: Any,
    headers: Any,
    limit: int,
) -> None:
    decoded = decode_payload(
        body,
        content_type=content_type,
        content_encoding=content_encoding,
        headers=headers,
        registry=registry,
        limit=limit,
    )
    _check(decoded)
    assert decoded.size == len(body)


X_DEATH_ENTRIES = st.dictionaries(
    st.sampled_from(
        ["queue", "reason", "count", "exchange", "routing-keys", "time", "original-expiration"]
    )
    | st.text(max_size=8),
    HEADER_VALUES,
    max_size=7,
)
STATE_HEADERS = st.dictionaries(
    st.sampled_from(
        [
            names.ATTEMPT_HEADER,
            names.REQUEUES_HEADER,
            names.PARKS_HEADER,
            names.HISTORY_HEADER,
            names.QUEUE_HEADER,
            names.FIRST_FAILURE_HEADER,
            names.CAUSE_HEADER,
            names.EXC_TYPE_HEADER,
            names.EXC_MESSAGE_HEADER,
            "x-death",
        ]
    )
    | st.text(max_size=10),
    HEADER_VALUES
    | st.lists(X_DEATH_ENTRIES, max_size=3)
    | st.sampled_from(['[[1, "parked", "c"]]', "[" * 5000, "1e999", "-1", "Infinity"])
    | st.just(math.inf)
    | st.just(math.nan),
    max_size=6,
)


@FUZZ
@given(headers=st.one_of(st.none(), STATE_HEADERS))
def test_header_parsing_raises_nothing_but_malformed_header(headers: Any) -> None:
    for parse in (read_state, parse_x_death):
        try:
            parse(headers)
        except MalformedHeader as exc:
            assert str(exc)
    problem = x_death_problem(headers)
    assert problem is None or isinstance(problem, str)


def test_header_fuzz_reaches_the_edge_cases_it_claims_to() -> None:
    # The strategies above must produce these; each once raised something else than MalformedHeader.
    with pytest.raises(MalformedHeader):
        read_state({names.ATTEMPT_HEADER: math.inf})
    with pytest.raises(MalformedHeader):
        read_state({names.HISTORY_HEADER: "[" * 5000})
    assert (
        parse_x_death(
            {"x-death": [{"queue": "q", "reason": "rejected", "count": 2, "time": datetime.now()}]}
        )[0].count
        == 2
    )


def test_pathological_json_and_bombs_do_not_trip_the_fuzzed_properties(tmp_path: Path) -> None:
    bomb = gzip.compress(b"\0" * (20 * 1024 * 1024))
    for body, content_type, encoding in (
        (bomb, None, "gzip"),
        (b"[" * 100_000, "application/json", None),
        (b"\x80\x05" + b"\x00" * 100, "application/json", None),
        (b"\x0a\xff\xff\xff\xff\x0f", "application/x-protobuf", None),
    ):
        _check(
            decode_payload(body, content_type=content_type, content_encoding=encoding, headers=None)
        )
