"""celery_dlx's fast property reader against py-amqp's own decoder, which it must equal.

``read_basic_properties`` runs first in celery_dlx's frame reader; whatever it leaves aside goes
to py-amqp's ``decode_properties_basic``. So for any property list: when py-amqp reads it, the
fast reader either gives exactly py-amqp's dict or raises; and for every well-formed list py-amqp
reads, it does not raise (else it would never be used).
"""

from __future__ import annotations

import struct

import amqp
import pytest
from amqp.serialization import decode_properties_basic
from hypothesis import event, given
from hypothesis import strategies as st

from celery_dlx.broker.frames import decode_content_header
from celery_dlx.message.fieldtable import header_table_span
from celery_dlx.message.names import WIRE_HEADERS_PROPERTY
from celery_dlx.message.properties import PropertiesError, read_basic_properties
from tests.unit.test_fieldtable import FUZZ, INTS, TABLES, long, short

TEXT = st.text(max_size=20).map(lambda v: v.encode("utf-8", "surrogatepass"))
#: Short strings that are not always UTF-8: py-amqp raises on them, so must the fast reader.
ANY_BYTES = st.one_of(TEXT, st.binary(max_size=20))


@st.composite
def property_lists(draw: st.DrawFn, texts: st.SearchStrategy[bytes] = TEXT) -> bytes:
    """A basic property list: each property present or not, in wire order."""
    shorts = texts.map(short)
    octets = st.integers(0, 255).map(lambda v: bytes((v,)))
    values = {
        0x2000: TABLES.map(lambda t: struct.pack(">I", len(t)) + t),
        0x1000: octets,
        0x0800: octets,
        0x0040: st.integers(0, 2**64 - 1).map(lambda v: struct.pack(">Q", v)),
    }
    flags, out = 0, b""
    for bit in (1 << n for n in range(15, 1, -1)):
        if draw(st.booleans()):
            flags |= bit
            out += draw(values.get(bit, shorts))
    return struct.pack(">H", flags) + out


def py_amqp(buf: bytes, offset: int = 0) -> dict[str, object] | None:
    try:
        return dict(decode_properties_basic(buf, offset)[0])
    except Exception:
        return None


@FUZZ
@given(property_lists())
def test_every_list_py_amqp_reads_is_read_alike_and_not_left_aside(buf: bytes) -> None:
    expected = py_amqp(buf)
    event("py-amqp reads it" if expected is not None else "py-amqp raises")
    try:
        got, span = read_basic_properties(buf, 0)
    except (PropertiesError, UnicodeDecodeError):
        assert expected is None, "a list py-amqp reads was left aside"
        return
    assert expected is not None
    assert repr(got) == repr(expected)  # types too: 1 is not True, Decimal("1.0") not "1.00"
    assert span == header_table_span(buf, 0)


@FUZZ
@given(property_lists(ANY_BYTES), st.integers(0, 400), st.binary(min_size=1, max_size=3))
def test_a_cut_or_damaged_list_is_read_alike_or_left_aside(
    buf: bytes, at: int, junk: bytes
) -> None:
    """Never a dict py-amqp would not give: a field running past its table, a cut list..."""
    for damaged in (buf[:at], buf[:at] + junk + buf[at + len(junk) :]):
        try:
            got, _ = read_basic_properties(damaged, 0)
        except (PropertiesError, UnicodeDecodeError):
            continue
        assert repr(got) == repr(py_amqp(damaged))


#: One field of every type at its bounds (and the values producers write most), each in a table
#: and in an array: what random tables reach only now and then.
BOUNDS = [
    *(tag + struct.pack(fmt, v) for tag, (fmt, low, high) in INTS.items() for v in (low, high, 0)),
    b"f" + struct.pack(">f", -1.5),
    b"d" + struct.pack(">d", 2.0**-1074),
    b"D" + struct.pack(">Bi", 2, -12345),
    b"D" + struct.pack(">Bi", 255, 2**31 - 1),
    b"T" + struct.pack(">Q", 0),
    b"T" + struct.pack(">Q", 1_700_000_000),
    b"t\x00",
    b"t\x02",
    b"V",
    long(b"S", "é\U0001f600".encode()),
    long(b"S", b"\xff\xfe"),
    long(b"x", b"\x00\xff"),
    long(b"F", b""),
    long(b"A", b"V" + b"V"),
]


@pytest.mark.parametrize("field", BOUNDS, ids=lambda f: f"{chr(f[0])}:{f[1:].hex()[:16]}")
def test_each_field_type_at_its_bounds_reads_as_py_amqp_reads_it(field: bytes) -> None:
    table = short(b"k") + field + short(b"\xff") + long(b"A", field + field)
    buf = struct.pack(">HI", 0x2000, len(table)) + table
    got, _ = read_basic_properties(buf, 0)
    assert repr(got) == repr(py_amqp(buf))


def test_celery_task_headers_are_read_by_the_fast_reader_with_their_raw_table() -> None:
    headers = {
        "lang": "py",
        "task": "proj.tasks.charge",
        "id": "c9f1e3a0",
        "eta": None,
        "retries": 0,
        "timelimit": [None, None],
        "ignore_result": False,
        "stamps": {},
    }
    props = bytes(
        amqp.Message(b"", application_headers=headers, delivery_mode=2)._serialize_properties()
    )
    got, span = read_basic_properties(props, 0)
    assert got["application_headers"] == headers
    assert span is not None and props[span[0] : span[1]].startswith(b"\x04langS")
    # In the frame reader: the same properties and the raw table as py-amqp's path gave them.
    frame = struct.pack(">HHQ", amqp.spec.Basic.CLASS_ID, 0, 0) + props
    _, _, decoded = decode_content_header(frame)
    assert decoded[WIRE_HEADERS_PROPERTY] == props[span[0] : span[1]]
    assert {k: v for k, v in decoded.items() if k != WIRE_HEADERS_PROPERTY} == py_amqp(props)


@pytest.mark.parametrize(
    ("buf", "why"),
    [
        (b"\x00", "past"),
        (struct.pack(">H", 0x0001), "more than one word"),
        (struct.pack(">HI", 0x2000, 9) + short(b"k") + b"S" + struct.pack(">I", 50), "past"),
        (struct.pack(">HI", 0x2000, 3) + short(b"k") + b"Z", "unknown field type"),
        (struct.pack(">HI", 0x2000, 11) + short(b"t") + b"T" + b"\xff" * 8, "out of range"),
    ],
)
def test_what_is_left_to_py_amqp_says_why(buf: bytes, why: str) -> None:
    with pytest.raises(PropertiesError, match=why):
        read_basic_properties(buf, 0)


def test_timestamps_read_again_are_the_same_and_a_bad_one_is_refused_every_time() -> None:
    """The reader remembers timestamp values (a backlog's x-death times repeat): a remembered
    value is the one py-amqp reads, and an out-of-range one is refused each time, not kept."""
    for seconds in (0, 1_700_000_000, 1_700_000_000, 253_402_300_799):
        table = short(b"t") + b"T" + struct.pack(">Q", seconds)
        buf = struct.pack(">HI", 0x2000, len(table)) + table
        got, _ = read_basic_properties(buf, 0)
        assert repr(got) == repr(py_amqp(buf))
    bad = short(b"t") + b"T" + struct.pack(">Q", 2**63)
    for _ in range(2):
        with pytest.raises(PropertiesError, match="out of range"):
            read_basic_properties(struct.pack(">HI", 0x2000, len(bad)) + bad, 0)
