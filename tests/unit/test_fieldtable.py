"""celery_dlx's own AMQP field-table reader and writer, fuzzed against encoders it did not write.

Three independent sources of frames: pika's encoder (``pika.data.encode_table``), a generator of
raw fields built here from ``struct`` (every type tag RabbitMQ passes on, at its boundaries, the
hostile timestamps amqp091-go writes included), and random bytes. The properties:

* reading never raises anything but :class:`FieldTableError`, and a property list is always read
  (or marked undecodable with its raw bytes), whatever the bytes;
* where py-amqp decodes a table, celery_dlx's reader gives the same values;
* a copy written from the raw table keeps every entry byte for byte;
* the whole DLX service path (read the dead letter, decide, build the copy, encode it) never raises
  and keeps every user header's bytes.
"""

from __future__ import annotations

import contextlib
import struct
from datetime import datetime
from decimal import Decimal
from typing import Any

import amqp
import pytest
from amqp import serialization
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pika import data as pika_data

from celery_dlx.broker.frames import decode_content_header
from celery_dlx.broker.publish import amqp_message
from celery_dlx.message.fieldtable import (
    MAX_DEPTH,
    FieldTableError,
    read_properties,
    read_table,
    read_value,
    same_value,
    table_entries,
    timestamp_value,
    write_properties,
    write_table,
)
from celery_dlx.message.names import (
    RAW_PROPERTIES_PROPERTY,
    UNDECODABLE_PROPERTY,
    WIRE_HEADERS_PROPERTY,
)
from celery_dlx.message.outgoing import Outgoing, copy_properties
from celery_dlx.policy.config import load_config
from celery_dlx.policy.deadletter import read_dead_letter
from celery_dlx.policy.verdicts import BuryVerdict, decide_letter

FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def short(raw: bytes) -> bytes:
    return bytes((len(raw),)) + raw


def long(tag: bytes, raw: bytes) -> bytes:
    return tag + struct.pack(">I", len(raw)) + raw


# -- raw fields, built without celery_dlx's writer -----------------------------------------------

INTS = {
    b"b": (">b", -(2**7), 2**7 - 1),
    b"B": (">B", 0, 2**8 - 1),
    b"s": (">h", -(2**15), 2**15 - 1),
    b"U": (">h", -(2**15), 2**15 - 1),
    b"u": (">H", 0, 2**16 - 1),
    b"I": (">i", -(2**31), 2**31 - 1),
    b"i": (">I", 0, 2**32 - 1),
    b"l": (">q", -(2**63), 2**63 - 1),
    b"L": (">q", -(2**63), 2**63 - 1),
}


def int_field(tag: bytes) -> st.SearchStrategy[bytes]:
    fmt, low, high = INTS[tag]
    values = st.one_of(
        st.sampled_from([low, high, 0, -1 if low < 0 else 1]), st.integers(low, high)
    )
    return values.map(lambda v: tag + struct.pack(fmt, v))


#: Timestamps: ordinary, epoch 0, 1969 as amqp091-go writes it (2**64 - 86400), year 10000, max.
TIMESTAMPS = st.one_of(
    st.sampled_from([0, 1_700_000_000, 2**64 - 86400, 253_402_300_800 + 86_400, 2**64 - 1]),
    st.integers(0, 2**64 - 1),
)

SCALARS: st.SearchStrategy[bytes] = st.one_of(
    *(int_field(tag) for tag in INTS),
    st.floats(width=32, allow_nan=False).map(lambda v: b"f" + struct.pack(">f", v)),
    st.floats(allow_nan=False).map(lambda v: b"d" + struct.pack(">d", v)),
    st.tuples(st.integers(0, 255), st.integers(-(2**31), 2**31 - 1)).map(
        lambda t: b"D" + struct.pack(">Bi", *t)
    ),
    TIMESTAMPS.map(lambda v: b"T" + struct.pack(">Q", v)),
    st.booleans().map(lambda v: b"t" + bytes((v,))),
    st.integers(2, 255).map(lambda v: b"t" + bytes((v,))),  # any non-zero octet is true
    st.just(b"V"),
    st.text(max_size=20).map(lambda v: long(b"S", v.encode())),
    st.binary(max_size=20).map(lambda v: long(b"S", v)),  # a long string that is not UTF-8
    st.binary(max_size=20).map(lambda v: long(b"x", v)),
)
NAMES = st.one_of(st.text(max_size=12).map(str.encode), st.binary(max_size=12)).filter(
    lambda k: len(k) <= 255
)
FIELDS: st.SearchStrategy[bytes] = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(st.tuples(NAMES, inner), max_size=4).map(
            lambda items: long(b"F", b"".join(short(k) + v for k, v in items))
        ),
        st.lists(inner, max_size=4).map(lambda items: long(b"A", b"".join(items))),
    ),
    max_leaves=20,
)
#: The content of a header table: distinct names (a table is a map).
TABLES = st.dictionaries(NAMES, FIELDS, max_size=8).map(
    lambda d: b"".join(short(k) + v for k, v in d.items())
)


def py_amqp(content: bytes) -> Any:
    (table,), _ = serialization.loads("F", struct.pack(">I", len(content)) + content, 0)
    return table


@FUZZ
@given(TABLES)
def test_a_raw_table_reads_as_py_amqp_reads_it_or_without_its_exception(content: bytes) -> None:
    ours = read_table(content)  # any well-formed table: never raises
    try:
        theirs = py_amqp(content)
    except (OverflowError, OSError, ValueError):
        return  # a timestamp py-amqp cannot hold: celery_dlx reads it anyway (checked below)
    assert same_value(ours, theirs)


def test_an_encoded_lone_surrogate_reads_and_writes_as_py_amqp_does() -> None:
    """A key and a long string holding an encoded lone surrogate (CESU-style bytes, found by the
    fuzz test above) read as py-amqp reads them (``surrogatepass``) and are written back to the
    same bytes."""
    content = b"\x00F\x00\x00\x00\x00" + b"\x03\xed\xa0\x80S\x00\x00\x00\x03\xed\xb2\x80"
    ours = read_table(content)
    assert same_value(ours, py_amqp(content)) and ours == {"": {}, "\ud800": "\udc80"}
    assert write_table(ours) == content


@FUZZ
@given(TABLES)
def test_a_copy_written_from_the_raw_table_keeps_every_entry_byte_for_byte(content: bytes) -> None:
    headers = read_table(content)
    assert write_table(headers, origin=content) == _last_wins(content)


def _last_wins(content: bytes) -> bytes:
    """The table as a map holds it: a name's last entry, at its first place."""
    entries: dict[Any, tuple[bytes, bytes]] = {}
    for key, value in table_entries(content):
        view = read_table(short(key) + value)
        (name,) = view
        entries[name] = (key, value) if name not in entries else (entries[name][0], value)
    return b"".join(short(k) + v for k, v in entries.values())


@FUZZ
@given(TABLES, st.data())
def test_a_copy_changes_only_what_celery_dlx_sets(content: bytes, data: st.DataObject) -> None:
    headers = read_table(content)
    names = sorted(headers, key=repr)
    dropped = set(data.draw(st.lists(st.sampled_from(names), unique=True))) if names else set()
    changed = {k: v for k, v in headers.items() if k not in dropped}
    changed["x-dlx-attempt"] = 3
    written = dict(table_entries(write_table(changed, origin=content)))
    original = dict(table_entries(content))
    for key, value in original.items():
        name = next(iter(read_table(short(key) + value)))
        if name in dropped or name == "x-dlx-attempt":
            continue
        assert key in written
        assert same_value(read_value(written[key]), headers[name])
    assert written[b"x-dlx-attempt"] == b"I" + struct.pack(">i", 3)


# -- pika's encoder ------------------------------------------------------------------------------

PIKA_DECIMAL_MIN = Decimal(-(2**31)).scaleb(-3)
PIKA_DECIMAL_MAX = Decimal(2**31 - 1).scaleb(-3)
PIKA_SCALARS = st.one_of(
    st.text(max_size=20),
    st.binary(max_size=20),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    # pika writes a decimal as a signed 32-bit integer scaled by 10**places: the bounds are exact
    # Decimals (a float bound such as 2**31 / 1000 lets 2147483.648 through, which pika refuses)
    st.decimals(min_value=PIKA_DECIMAL_MIN, max_value=PIKA_DECIMAL_MAX, places=3),
    st.datetimes(min_value=datetime(1970, 1, 1), max_value=datetime(9999, 12, 31)),
    st.none(),
)
PIKA_TABLES = st.dictionaries(
    st.text(max_size=10),
    st.recursive(
        PIKA_SCALARS,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)
        ),
        max_leaves=10,
    ),
    max_size=8,
)


def pika_table(table: dict[str, Any]) -> bytes:
    pieces: list[bytes] = []
    pika_data.encode_table(pieces, table)
    return b"".join(pieces)[4:]


@FUZZ
@given(PIKA_TABLES)
@example({"max": PIKA_DECIMAL_MAX, "min": PIKA_DECIMAL_MIN, "nested": [PIKA_DECIMAL_MAX]})
def test_pika_tables_read_as_py_amqp_reads_them_and_copy_exactly(table: dict[str, Any]) -> None:
    content = pika_table(table)
    ours = read_table(content)
    assert same_value(ours, py_amqp(content))
    assert write_table(ours, origin=content) == content


# -- random bytes and broken tables --------------------------------------------------------------


@FUZZ
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_but_a_clear_error(raw: bytes) -> None:
    try:
        read_table(raw)
    except FieldTableError as exc:
        assert str(exc)
    props = read_properties(raw)
    if UNDECODABLE_PROPERTY in props:
        assert props[RAW_PROPERTIES_PROPERTY] == raw
        assert "application_headers" not in props


@FUZZ
@given(TABLES, st.data())
def test_a_truncated_table_is_an_error_or_a_shorter_table(
    content: bytes, data: st.DataObject
) -> None:
    cut = data.draw(st.integers(0, max(0, len(content) - 1)))
    with contextlib.suppress(FieldTableError):  # anything else fails the test
        read_table(content[:cut])


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        (short(b"k") + b"Z", "unknown field type 'Z'"),
        (short(b"k") + b"S" + struct.pack(">I", 99) + b"ab", "past its table"),
        (short(b"k") + b"I\x00", "past its table"),
        (b"\x05ab", "past its table"),
        (
            short(b"k") + b"A" * 1 + struct.pack(">I", 5 * 200) + (b"A" + struct.pack(">I", 0)),
            "past",
        ),
    ],
)
def test_malformed_tables_name_their_problem(content: bytes, reason: str) -> None:
    with pytest.raises(FieldTableError, match=reason):
        read_table(content)


def nested(depth: int) -> bytes:
    value = b"V"
    for _ in range(depth):
        value = long(b"A", value)
    return short(b"deep") + value


def test_nesting_is_read_up_to_a_limit_then_an_error_not_a_recursion_error() -> None:
    assert read_table(nested(MAX_DEPTH - 1))
    with pytest.raises(FieldTableError, match="nested deeper"):
        read_table(nested(5000))
    with pytest.raises(RecursionError):  # what py-amqp does with it
        py_amqp(nested(5000))


@pytest.mark.parametrize(
    ("seconds", "expected"),
    [
        (0, datetime(1970, 1, 1)),
        (2**64 - 86400, datetime(1969, 12, 31)),  # amqp091-go's time.Unix(-86400, 0)
        (253_402_300_800 + 86_400, 253_402_300_800 + 86_400),  # year 10000: no datetime holds it
        (2**63, -(2**63)),
    ],
)
def test_timestamps_outside_datetime_are_read_not_raised(seconds: int, expected: Any) -> None:
    assert timestamp_value(seconds) == expected
    content = short(b"t") + b"T" + struct.pack(">Q", seconds)
    assert read_table(content) == {"t": expected}
    assert write_table(read_table(content), origin=content) == content


# -- a whole content header, and the DLX service's path -----------------------------------------

PROPERTIES = st.fixed_dictionaries(
    {},
    optional={
        "content_type": st.sampled_from(["application/json", "text/plain"]),
        "delivery_mode": st.sampled_from([1, 2]),
        "message_id": st.text(max_size=20),
        "timestamp": st.integers(0, 2**40),
        "priority": st.integers(0, 9),
    },
)


def content_header(properties: bytes, body_size: int = 2) -> bytes:
    return struct.pack(">HHQ", 60, 0, body_size) + properties


@FUZZ
@given(TABLES, PROPERTIES)
def test_a_content_header_decodes_as_py_amqp_decodes_it_plus_the_raw_table(
    content: bytes, props: dict[str, Any]
) -> None:
    frame = content_header(write_properties(props, content))
    class_id, size, decoded = decode_content_header(frame)
    assert (class_id, size) == (60, 2)
    assert decoded[WIRE_HEADERS_PROPERTY] == content
    assert UNDECODABLE_PROPERTY not in decoded
    for name, value in props.items():
        assert decoded[name] == value
    try:
        theirs, _ = serialization.decode_properties_basic(frame, 12)
    except (OverflowError, OSError, ValueError):
        return
    assert {k: v for k, v in decoded.items() if k != WIRE_HEADERS_PROPERTY}.keys() == theirs.keys()


@FUZZ
@given(st.binary(max_size=120))
def test_a_content_header_of_random_properties_never_raises(raw: bytes) -> None:
    _, _, decoded = decode_content_header(content_header(raw))
    assert isinstance(decoded, dict)


def test_an_undecodable_table_is_marked_with_its_bytes_and_the_rest_is_read() -> None:
    table = short(b"k") + b"Z"
    raw = write_properties({"message_id": "m-1", "delivery_mode": 2}, table)
    _, _, decoded = decode_content_header(content_header(raw))
    assert decoded["message_id"] == "m-1"
    assert decoded["delivery_mode"] == 2
    assert "application_headers" not in decoded
    assert "unknown field type 'Z'" in decoded[UNDECODABLE_PROPERTY]
    assert decoded[RAW_PROPERTIES_PROPERTY] == raw


X_DEATH = long(
    b"A",
    long(
        b"F",
        short(b"queue")
        + long(b"S", b"work")
        + short(b"reason")
        + long(b"S", b"rejected")
        + short(b"count")
        + b"l"
        + struct.pack(">q", 1)
        + short(b"time")
        + b"T"
        + struct.pack(">Q", 1_700_000_000),
    ),
)
OWNED = ("x-dlx-", "x-death", "x-first-death-", "x-last-death-")
SERVICE = load_config({"dlx_queues": {"work": {"max_requeues": 1, "max_parks": 1, "backoff": [1]}}})


@FUZZ
@given(TABLES, st.integers(0, 2))
def test_the_service_path_never_raises_and_keeps_every_user_header(
    content: bytes, attempt: int
) -> None:
    """A dead letter of any table: read, decided, copied and encoded, as the service does."""
    own = short(b"x-dlx-attempt") + b"I" + struct.pack(">i", attempt)
    table = content + short(b"x-death") + X_DEATH + own
    frame = content_header(write_properties({"message_id": "m-1"}, table))
    _, _, props = decode_content_header(frame)
    headers = props.pop("application_headers", None)
    letter = read_dead_letter(b"{}", headers, props, exchange="celery_dlx", routing_key="work")
    verdict = decide_letter(letter, SERVICE, None, 1_763_900_000_000)
    if isinstance(verdict, BuryVerdict):
        assert attempt == 2 or letter.problem
        return
    copy = Outgoing(
        body=letter.body,
        routing_key=letter.queue,
        headers=letter.copy_headers(verdict.state),
        properties=copy_properties(letter.properties),
    )
    sent = dict(table_entries(_table_of(copy)))
    assert not any(k.startswith(b"x-death") for k in sent)
    for key, value in dict(table_entries(content)).items():  # a name's last entry counts
        name = key.decode("utf-8", "replace")
        if name.startswith(OWNED) or name == "x-delivery-count":
            continue  # celery_dlx's own and the broker's headers are rewritten or dropped
        assert sent[key] == value, name


def _table_of(copy: Outgoing) -> bytes:
    from celery_dlx.message.fieldtable import header_table_span

    encoded = bytes(amqp_message(copy, 1)._serialize_properties())
    span = header_table_span(encoded, 0)
    assert span is not None
    return encoded[span[0] : span[1]]


def test_a_1969_timestamp_from_go_is_read_where_py_amqp_raises() -> None:
    content = short(b"at") + b"T" + struct.pack(">Q", 2**64 - 86400)
    frame = content_header(write_properties({}, content))
    with pytest.raises(OverflowError):
        serialization.decode_properties_basic(frame, 12)
    _, _, decoded = decode_content_header(frame)
    assert decoded["application_headers"] == {"at": datetime(1969, 12, 31)}
    assert decoded[WIRE_HEADERS_PROPERTY] == content


def test_records_keep_the_raw_table_only_where_a_copy_needs_it() -> None:
    """A table every client's writer would reproduce (a Celery producer's) is not stored twice;
    of another, only the user entries are kept; a malformed one is kept whole."""
    from celery_dlx.message.fieldtable import encode_value, user_origin

    plain = b"".join(short(k) + encode_value(v) for k, v in [(b"task", "t"), (b"retries", 0)])
    assert user_origin(plain) is None
    go = short(b"n") + b"l" + struct.pack(">q", 7)
    own = short(b"x-dlx-attempt") + b"I" + struct.pack(">i", 1)
    death = short(b"x-death") + X_DEATH
    assert user_origin(plain + go + own + death) == plain + go
    assert user_origin(short(b"k") + b"Z") == short(b"k") + b"Z"
    assert user_origin(b"") is None and user_origin(None) is None


def test_a_header_nested_deeper_than_the_limit_that_py_amqp_reads_is_copied_whole() -> None:
    """py-amqp reads 300 levels (the fast path); the copy writes them back untouched, and a
    record without the raw table still encodes (a placeholder below the limit), never raises."""
    deep = nested(300)
    frame = content_header(write_properties({}, deep))
    _, _, props = decode_content_header(frame)
    assert UNDECODABLE_PROPERTY not in props
    headers = dict(props["application_headers"], **{"x-dlx-attempt": 1})
    written = dict(table_entries(write_table(headers, origin=props[WIRE_HEADERS_PROPERTY])))
    assert written[b"deep"] == deep[len(short(b"deep")) :]
    assert write_table(headers)  # no origin: encoded, the depth past the limit as text


def _user_origin_by_round_trip(content: bytes) -> bytes | None:
    """user_origin as first written: the user entries read and written again, then compared."""
    own = (b"x-dlx-", b"x-death", b"x-first-death-", b"x-last-death-", b"x-delivery-count")
    try:
        kept = b"".join(short(k) + v for k, v in table_entries(content) if not k.startswith(own))
        if not kept or write_table(read_table(kept)) == kept:
            return None
    except FieldTableError:
        return content
    return kept


#: Entries celery_dlx or the broker own, which a copy never keeps from the raw table.
OWN_ENTRIES = st.sampled_from(
    [
        short(b"x-dlx-attempt") + b"I" + struct.pack(">i", 2),
        short(b"x-death") + X_DEATH,
        short(b"x-delivery-count") + b"l" + struct.pack(">q", 3),
    ]
)


#: Values of the field types the shortcut judges from their bytes, the tricky ones included: long
#: strings that are not UTF-8, true octets other than 1.
JUDGED = st.one_of(
    st.text(max_size=8).map(lambda v: long(b"S", v.encode("utf-8", "surrogatepass"))),
    st.binary(max_size=8).map(lambda v: long(b"S", v)),
    st.integers(0, 255).map(lambda v: b"t" + bytes((v,))),
    int_field(b"I"),
    st.just(b"V"),
)
#: Names from a few, so that a table repeats one now and then.
FEW_NAMES = st.one_of(st.sampled_from([b"a", b"b", b"c"]), NAMES)
#: Arrays and tables of judged values (and now and then of any field), nested: judged from their
#: bytes too, repeated names inside a table included.
JUDGED_NESTED: st.SearchStrategy[bytes] = st.recursive(
    JUDGED,
    lambda inner: st.one_of(
        st.lists(st.tuples(FEW_NAMES, inner), max_size=4).map(
            lambda items: long(b"F", b"".join(short(k) + v for k, v in items))
        ),
        st.lists(st.one_of(inner, FIELDS), max_size=4).map(
            lambda items: long(b"A", b"".join(items))
        ),
    ),
    max_leaves=12,
)


@FUZZ
@given(
    st.lists(
        st.one_of(
            st.tuples(FEW_NAMES, JUDGED).map(lambda kv: short(kv[0]) + kv[1]),
            st.tuples(FEW_NAMES, JUDGED_NESTED).map(lambda kv: short(kv[0]) + kv[1]),
            st.tuples(FEW_NAMES, FIELDS).map(lambda kv: short(kv[0]) + kv[1]),
            OWN_ENTRIES,
        ),
        max_size=6,
    ),
    st.booleans(),
    st.one_of(st.none(), st.integers(0, 400)),
)
def test_user_origin_without_a_round_trip_says_what_the_round_trip_says(
    entries: list[bytes], repeat: bool, cut: int | None
) -> None:
    """The shortcut (judging each value's encoding) never answers other than reading the user
    entries and writing them again would: repeated keys, non-UTF-8 strings, true octets other
    than 1 and every other field type included; a table cut short is kept whole."""
    from celery_dlx.message.fieldtable import user_origin

    if repeat and entries:
        entries = [*entries, entries[0]]  # a repeated key reads as one entry: not written alike
    content = b"".join(entries)
    if cut is not None:
        content = content[:cut]
    assert user_origin(content) == _user_origin_by_round_trip(content)


def test_user_origin_needs_no_round_trip_for_the_usual_producers_tables() -> None:
    """Strings, int32s, booleans and voids, and arrays and tables of them, are judged from their
    bytes (a foreign producer's table, and Celery's task headers as py-amqp writes them); others
    are still compared."""
    from celery_dlx.message import fieldtable

    usual = b"".join(
        short(k) + v
        for k, v in [
            (b"source", long(b"S", b"billing-go")),
            (b"n", b"I" + struct.pack(">i", 7)),
            (b"ok", b"t\x01"),
            (b"none", b"V"),
            (b"x-death", X_DEATH),
        ]
    )
    celery_headers = dict(
        lang="py",
        task="proj.tasks.charge",
        id="c9f1e3a0-1b2c-4d5e-8f90-123456789abc",
        shadow=None,
        eta=None,
        expires=None,
        group=None,
        group_index=None,
        retries=0,
        timelimit=[None, None],
        root_id="c9f1e3a0-1b2c-4d5e-8f90-123456789abc",
        parent_id=None,
        argsrepr="(42,)",
        kwargsrepr="{}",
        origin="gen123@host",
        ignore_result=False,
        replaced_task_nesting=0,
        stamped_headers=None,
        stamps={},
    )
    # The property list py-amqp writes for a Celery producer.
    celery = bytes(amqp.Message(b"", application_headers=celery_headers)._serialize_properties())
    span = fieldtable.header_table_span(celery, 0)
    assert span is not None
    celery_table = celery[span[0] : span[1]]
    assert b"\ttimelimitA" in celery_table and b"\x06stampsF" in celery_table  # nested ones
    calls: list[bytes] = []
    real = fieldtable.read_table

    def counting(content: bytes) -> Any:
        calls.append(content)
        return real(content)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fieldtable, "read_table", counting)
        assert fieldtable.user_origin(usual) is None
        assert fieldtable.user_origin(celery_table) is None
        assert calls == []
        assert fieldtable.user_origin(short(b"n") + b"l" + struct.pack(">q", 7)) is not None
        assert len(calls) == 1
