"""Every header celery_dlx republishes keeps its producer's field type, or is one every client reads.

Each producer of a republish (worker requeue/park copy, quarantine copy, DLX service requeue and
park, drain, TTL ladder, graveyard replay, queue migration) is fed headers at their worst: 64-bit
epoch milliseconds from celery_dlx's own state, and every field type a Go, Node or Ruby publisher
can send. The copy is encoded by celery_dlx's writer (:meth:`Outgoing.encode`) and the bytes
it would put on the wire are walked:

* with the delivery's raw header table (what celery_dlx's frame reader keeps), every foreign
  header goes out byte for byte as its producer wrote it;
* without it (a record written before celery_dlx kept the table), every type tag, nested ones
  included, is one of ``WRITTEN_TYPES``: never py-amqp's ``L``, which Go and Node cannot read.

A walk of the bytes, not of Python types, so a changed type cannot pass.
"""

from __future__ import annotations

import json
import struct
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import amqp
import pytest
from amqp import serialization
from celery import Celery
from celery.app.task import Context
from celery.worker.request import Request
from kombu import serialization as kombu_serialization
from kombu.transport.pyamqp import Message

from celery_dlx.broker.copies import celery_copy
from celery_dlx.broker.ladder import DelayQueue
from celery_dlx.broker.publish import amqp_message, outgoing_copies
from celery_dlx.message.fieldtable import (
    WRITTEN_TYPES,
    encode_value,
    header_table_span,
    read_table,
    table_entries,
)
from celery_dlx.message.headers import DLXState, HistoryEntry, clean_headers, read_state
from celery_dlx.message.names import (
    FIRST_FAILURE_HEADER,
    QUEUE_HEADER,
    REASON_HEADER,
    WIRE_HEADERS_PROPERTY,
)
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.outgoing import INT32_MAX, Outgoing, copy_properties
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.ops.replay import replay_copy
from celery_dlx.policy.config import load_config
from celery_dlx.policy.deadletter import read_dead_letter
from celery_dlx.policy.verdicts import (
    BuryVerdict,
    ParkVerdict,
    RequeueVerdict,
    build_obituary,
    decide_letter,
)

NOW = 1_763_900_000_000  # epoch ms: beyond 32 bits, as every real timestamp is
STATE = DLXState(
    attempt=3,
    requeues=1,
    parks=2,
    history=(HistoryEntry(NOW - 9000, "requeued", "c"), HistoryEntry(NOW - 5000, "parked", "c")),
    queue="work",
    first_failure_ms=NOW - 9000,
    cause="c",
    exc_type="ValueError",
    exc_message="bad",
)


# -- the raw frames foreign publishers send -------------------------------------------------


def _short(text: str) -> bytes:
    raw = text.encode()
    return struct.pack(">B", len(raw)) + raw


def _table(items: list[tuple[str, bytes]]) -> bytes:
    body = b"".join(_short(k) + v for k, v in items)
    return struct.pack(">I", len(body)) + body


def _array(items: list[bytes]) -> bytes:
    body = b"".join(items)
    return struct.pack(">I", len(body)) + body


#: One value of each field type amqp091-go, amqplib and bunny write (RabbitMQ errata letters).
FOREIGN_FIELDS: list[tuple[str, bytes]] = [
    ("go-int64", b"l" + struct.pack(">q", NOW)),
    ("go-int64-negative", b"l" + struct.pack(">q", -(2**40))),
    ("go-int32", b"I" + struct.pack(">i", -7)),
    ("go-int16", b"s" + struct.pack(">h", -3)),
    ("go-int8", b"b" + struct.pack(">b", -1)),
    ("go-uint8", b"B" + struct.pack(">B", 200)),
    ("go-uint16", b"u" + struct.pack(">H", 60000)),
    ("go-uint32", b"i" + struct.pack(">I", 4_000_000_000)),
    ("go-float32", b"f" + struct.pack(">f", 1.5)),
    ("go-float64", b"d" + struct.pack(">d", 2.25)),
    ("go-decimal", b"D" + struct.pack(">Bi", 2, 12345)),
    ("go-timestamp", b"T" + struct.pack(">Q", 1_700_000_000)),
    ("go-bytes", b"x" + struct.pack(">I", 3) + b"\x00\xff\x10"),
    ("go-bool", b"t\x01"),
    ("go-void", b"V"),
    ("node-long-string", b"S" + struct.pack(">I", 5) + b"hello"),
    (
        "nested",
        b"A"
        + _array(
            [
                b"l" + struct.pack(">q", NOW),
                b"F" + _table([("at", b"l" + struct.pack(">q", NOW)), ("ok", b"t\x00")]),
                b"A" + _array([b"A" + _array([b"l" + struct.pack(">q", 2**33)])]),
            ]
        ),
    ),
    ("table", b"F" + _table([("deep", b"F" + _table([("ms", b"l" + struct.pack(">q", NOW))]))])),
]


def foreign_headers() -> dict[str, Any]:
    """The header table a foreign publisher sent, as py-amqp hands it to celery_dlx."""
    raw = _table(FOREIGN_FIELDS)
    (headers,), _ = serialization.loads("F", raw, 0)
    assert headers["go-int64"] == NOW  # py-amqp reads 'l' as a plain int: it would write 'L'
    assert read_table(raw[4:]) == headers  # and celery_dlx's reader gives the same values
    return dict(headers)


#: The raw content of that table, as celery_dlx's frame reader keeps it in the properties.
ORIGIN = _table(FOREIGN_FIELDS)[4:]


# -- walking what py-amqp writes ------------------------------------------------------------

_FIXED = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "U": 2, "I": 4, "i": 4, "f": 4}
_FIXED.update({"l": 8, "L": 8, "d": 8, "T": 8, "D": 5, "V": 0})


def _walk_value(buf: bytes, offset: int, path: str, out: list[tuple[str, str]]) -> int:
    tag = chr(buf[offset])
    offset += 1
    out.append((path, tag))
    if tag in _FIXED:
        return offset + _FIXED[tag]
    (length,) = struct.unpack_from(">I", buf, offset)
    offset += 4
    end = offset + length
    if tag == "F":
        _walk_table(buf[offset:end], path, out)
    elif tag == "A":
        i = 0
        inner = offset
        while inner < end:
            inner = _walk_value(buf, inner, f"{path}[{i}]", out)
            i += 1
    elif tag not in ("S", "x"):
        raise AssertionError(f"unknown tag {tag!r} at {path}")
    return end


def _walk_table(buf: bytes, path: str, out: list[tuple[str, str]]) -> None:
    offset = 0
    while offset < len(buf):
        keylen = buf[offset]
        key = buf[offset + 1 : offset + 1 + keylen].decode("utf-8", "replace")
        offset = _walk_value(buf, offset + 1 + keylen, f"{path}.{key}" if path else key, out)


def sent_table(copy: Outgoing, seq: int = 7) -> bytes:
    """The content of the header table ``copy`` puts on the wire."""
    encoded = bytes(amqp_message(copy, seq)._serialize_properties())
    span = header_table_span(encoded, 0)
    assert span is not None
    return encoded[span[0] : span[1]]


def wire_tags(copy: Outgoing, skip: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Every (header path, type tag) of ``copy`` on the wire, but the top-level ``skip`` ones."""
    kept = b"".join(
        _short(k.decode()) + v for k, v in table_entries(sent_table(copy)) if k.decode() not in skip
    )
    out: list[tuple[str, str]] = []
    _walk_table(kept, "", out)
    return out


def assert_safe(copy: Outgoing, skip: frozenset[str] = frozenset()) -> None:
    tags = wire_tags(copy, skip)
    unsafe = [(path, tag) for path, tag in tags if tag not in WRITTEN_TYPES]
    assert not unsafe, f"headers a foreign client cannot decode: {unsafe}"
    assert {tag for _, tag in tags} >= {"S", "I"}


FOREIGN_NAMES = frozenset(name for name, _ in FOREIGN_FIELDS)


def assert_kept(copy: Outgoing) -> None:
    """Every foreign header goes out exactly as its producer wrote it; the rest is safe."""
    sent = {k.decode(): v for k, v in table_entries(sent_table(copy))}
    changed = [name for name, raw in FOREIGN_FIELDS if sent.get(name) != raw]
    assert not changed, f"foreign headers not written back as their producer wrote them: {changed}"
    unsafe = [(p, t) for p, t in wire_tags(copy, FOREIGN_NAMES) if t not in WRITTEN_TYPES]
    assert not unsafe, f"headers a foreign client cannot decode: {unsafe}"


# -- the producers ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app() -> Celery:
    app = Celery("wire", set_as_current=False, broker="amqp://nobody:nothing@127.0.0.1:1//")

    @app.task(name="proj.add", shared=False)
    def add(x: int, y: int) -> int:
        return x + y

    app.finalize()
    return app


def kept(origin: bytes | None) -> dict[str, Any]:
    """The properties key celery_dlx's frame reader adds, when the test gives the raw table."""
    return {WIRE_HEADERS_PROPERTY: origin} if origin is not None else {}


def celery_request(app: Celery, extra: dict[str, Any], origin: bytes | None = None) -> Context:
    """The task context a worker child runs with, for a delivery carrying ``extra`` headers."""
    task_id = str(uuid.uuid4())
    headers, properties, body, _ = app.amqp.as_task_v2(task_id, "proj.add", (1, 2), {})
    ctype, enc, payload = kombu_serialization.dumps(body, serializer="json")
    raw = amqp.Message(
        payload,
        content_type=ctype,
        content_encoding=enc,
        application_headers={**headers, **extra},
        **properties,
        **kept(origin),
    )
    raw.delivery_info = {"exchange": "", "routing_key": "work", "delivery_tag": 1}
    message = Message(raw, channel=None, accept=[ctype])
    request = Request(message, app=app, task=app.tasks["proj.add"])
    context = dict(request.request_dict)
    context.update({"args": [1, 2], "kwargs": {}, "is_eager": False})
    return Context(context)


def service_letter(
    extra: dict[str, Any],
    state: DLXState = STATE,
    message_id: str | None = "m-1",
    origin: bytes | None = None,
) -> Any:
    from celery_dlx.message.headers import state_headers

    headers = {
        **extra,
        **state_headers(state),
        "x-death": [
            {
                "queue": "work",
                "reason": "rejected",
                "count": 1,
                "exchange": "",
                "routing-keys": ["work"],
                "time": datetime(2025, 1, 1, tzinfo=timezone.utc),
            }
        ],
    }
    return read_dead_letter(
        b'{"n": 1}',
        headers,
        {
            "content_type": "application/json",
            "timestamp": NOW // 1000,
            **({"message_id": message_id} if message_id else {}),
            **kept(origin),
        },
        exchange="celery_dlx",
        routing_key="work",
    )


def service_copies(
    extra: dict[str, Any], message_id: str | None = "m-1", origin: bytes | None = None
) -> list[Outgoing]:
    """The DLX service's requeue and park copies, built as ``service/loop.py`` builds them."""
    out = []
    for policy in ({"max_requeues": 5}, {"max_requeues": 0, "backoff": [1], "max_parks": 9}):
        config = load_config({"dlx_queues": {"work": policy}})
        letter = service_letter(extra, DLXState(), message_id, origin)
        verdict = decide_letter(letter, config, None, NOW)
        # a second failure: the state now carries first-failure and history timestamps
        letter = service_letter(
            extra,
            verdict.state if not isinstance(verdict, BuryVerdict) else STATE,
            message_id,
            origin,
        )
        verdict = decide_letter(letter, config, None, NOW + 1000)
        assert isinstance(verdict, (RequeueVerdict, ParkVerdict))
        assert verdict.state.first_failure_ms is not None
        assert verdict.state.first_failure_ms > INT32_MAX
        out.append(
            Outgoing(
                body=letter.body,
                routing_key=letter.queue,
                headers=letter.copy_headers(verdict.state),
                properties=copy_properties(letter.properties),
            )
        )
    return out


def parked(extra: dict[str, Any], origin: bytes | None = None) -> ParkedMessage:
    """A parked retry as the drain reads it back from Redis (through its JSON form)."""
    from celery_dlx.message.headers import state_headers

    entry = ParkedMessage(
        message_id="m-1",
        attempt=STATE.attempt,
        queue="work",
        body=b"{}",
        headers=clean_headers(extra, STATE),
        properties={"content_type": "application/json", "timestamp": NOW // 1000, **kept(origin)},
        due_ms=NOW,
        parked_ms=NOW,
    )
    assert entry.headers[FIRST_FAILURE_HEADER] == state_headers(STATE)[FIRST_FAILURE_HEADER]
    return ParkedMessage.from_stored(entry.meta_json(), entry.body)


def obituary(extra: dict[str, Any], origin: bytes | None = None) -> Obituary:
    """An obituary as the graveyard stores it (JSON record) and replay reads it back."""
    config = load_config({"dlx_queues": {"work": {"max_requeues": 0, "max_parks": 0}}})
    letter = service_letter(extra, origin=origin)
    verdict = decide_letter(letter, config, None, NOW)
    assert isinstance(verdict, BuryVerdict)
    ob = build_obituary(letter, verdict, buried_ms=NOW, code_version="1", hostname="h")
    return Obituary.from_record(ob.record_json(), ob.payload)


def producers(app: Celery, origin: bytes | None = None) -> dict[str, Outgoing]:
    """One copy from every republish celery_dlx makes, all fed the worst headers (and, given
    ``origin``, the raw table they came in, as celery_dlx's frame reader keeps it)."""
    extra = foreign_headers()
    request = celery_request(app, extra, origin)
    ob = obituary(extra, origin)
    copies: dict[str, Outgoing] = {
        "worker requeue/park copy": celery_copy(request, state=STATE, routing_key="work"),
        "worker quarantine copy (task)": celery_copy(
            request,
            state=DLXState(attempt=STATE.attempt, queue="work"),
            routing_key="work",
            exchange="celery_dlx",
            extra_headers={REASON_HEADER: "undecodable: x-death", QUEUE_HEADER: "work"},
        ),
        # worker/consumer.py's _bury_raw, for a message the worker cannot even decode
        "worker quarantine copy (raw)": Outgoing(
            body=b"\xff",
            routing_key="work",
            exchange="celery_dlx",
            headers={
                **clean_headers(extra, DLXState(attempt=STATE.attempt, queue="work")),
                REASON_HEADER: "undecodable",
                QUEUE_HEADER: "work",
            },
            properties=kept(origin),
        ),
        "drain": parked(extra, origin).outgoing(),
        "ttl ladder": parked(extra, origin).outgoing(
            DelayQueue("work_dlq_1", "work", 1000, {}).name
        ),
        "replay": replay_copy(ob),
        "replay keeping attempts": replay_copy(ob, keep_attempts=True),
        "migrate": outgoing_copies([(b"{}", extra, kept(origin), "work")])[0],
    }
    requeue, park = service_copies(extra, origin=origin)
    copies["service requeue"] = requeue
    copies["service park"] = park
    requeue, park = service_copies(extra, message_id=None, origin=origin)  # x-dlx-id stamped
    assert "x-dlx-id" in requeue.headers and "x-dlx-id" in park.headers
    copies["service requeue (look-alike)"] = requeue
    copies["service park (look-alike)"] = park
    return copies


PRODUCERS = [
    "worker requeue/park copy",
    "worker quarantine copy (task)",
    "worker quarantine copy (raw)",
    "drain",
    "ttl ladder",
    "replay",
    "replay keeping attempts",
    "migrate",
    "service requeue",
    "service park",
    "service requeue (look-alike)",
    "service park (look-alike)",
]


@pytest.mark.parametrize("producer", PRODUCERS)
def test_every_foreign_header_goes_out_as_its_producer_wrote_it(app: Celery, producer: str) -> None:
    copies = producers(app, ORIGIN)
    assert sorted(copies) == sorted(PRODUCERS)
    assert_kept(copies[producer])


@pytest.mark.parametrize("producer", PRODUCERS)
def test_without_the_raw_table_every_header_is_a_safe_field_type(
    app: Celery, producer: str
) -> None:
    copies = producers(app)
    assert sorted(copies) == sorted(PRODUCERS)
    assert_safe(copies[producer])
    with pytest.raises(AssertionError, match="not written back"):
        assert_kept(copies[producer])  # the check can fail: the types change without the table


@pytest.mark.parametrize("producer", PRODUCERS)
def test_nothing_unsafe_would_have_gone_out_unencoded(app: Celery, producer: str) -> None:
    """The check can fail: the same copies without the encoder carry py-amqp's ``L``."""
    copy = producers(app)[producer]
    raw = serialization.dumps("F", [clean_headers(copy.headers)])
    out: list[tuple[str, str]] = []
    _walk_table(raw[4:], "", out)
    assert "L" in {tag for _, tag in out}


def test_own_state_survives_the_wire_and_reads_back(app: Celery) -> None:
    from celery_dlx.message.headers import state_headers

    copy = Outgoing(body=b"", routing_key="work", headers=state_headers(STATE))
    # what a consumer receives: py-amqp decodes the encoded table
    table = sent_table(copy, seq=1)
    (received,), _ = serialization.loads("F", struct.pack(">I", len(table)) + table, 0)
    assert received[FIRST_FAILURE_HEADER] == str(STATE.first_failure_ms)
    assert read_state(received) == STATE
    assert json.loads(received["x-dlx-history"])[0][0] == NOW - 9000


@pytest.mark.parametrize(
    "first",
    [NOW, str(NOW), str(NOW).encode(), float(NOW), f"{NOW}.0", f" {NOW} "],
    ids=["old-int-L", "string", "bytes", "double", "double-text", "padded"],
)
def test_first_failure_reads_old_and_new_forms(first: Any) -> None:
    assert read_state({FIRST_FAILURE_HEADER: first}).first_failure_ms == NOW


@pytest.mark.parametrize("first", ["soon", "-5", True, float("inf"), [NOW]])
def test_first_failure_in_no_known_form_is_malformed(first: Any) -> None:
    from celery_dlx.errors import MalformedHeader

    with pytest.raises(MalformedHeader):
        read_state({FIRST_FAILURE_HEADER: first})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (INT32_MAX, INT32_MAX),
        (INT32_MAX + 1, str(INT32_MAX + 1)),
        (-(2**31) + 1, -(2**31) + 1),
        (-(2**31), -(2**31)),  # py-amqp would write L already here; celery_dlx writes I
        (2**70, str(2**70)),
        (True, True),
        (1.5, 1.5),
        (float("nan"), "nan"),
        (Decimal("123.45"), Decimal("123.45")),
        (Decimal("1E+3"), "1E+3"),
        (Decimal("99999999999.5"), "99999999999.5"),
        (Decimal("NaN"), "NaN"),
        (datetime(1960, 1, 1), "1960-01-01T00:00:00"),
        (bytearray(b"\x01"), b"\x01"),
        ({"a": [2**40, {"b": 2**40}]}, {"a": [str(2**40), {"b": str(2**40)}]}),
        ((1, 2**40), [1, str(2**40)]),
        ({1, 2}, "{1, 2}"),
    ],
)
def test_encode_value(value: Any, expected: Any) -> None:
    encoded = encode_value(value)
    # what a consumer receives: py-amqp decodes it
    (received,), _ = serialization.loads("F", _table([("v", encoded)]), 0)
    assert received["v"] == expected
    out: list[tuple[str, str]] = []
    _walk_value(encoded, 0, "v", out)
    assert {tag for _, tag in out} <= WRITTEN_TYPES


def test_the_publish_sequence_header_stays_a_32_bit_int() -> None:
    """A long-running publisher's sequence number wraps before py-amqp would write it as L."""
    import itertools

    from celery_dlx.broker.publish import ConfirmingPublisher

    publisher = ConfirmingPublisher(connection=None)  # type: ignore[arg-type]
    assert next(publisher._seq) == 1
    seqs = publisher._seq
    assert isinstance(seqs, itertools.cycle)
    out: list[tuple[str, str]] = []
    _walk_table(sent_table(Outgoing(body=b"", routing_key="q"), seq=INT32_MAX), "", out)
    assert ("x-dlx-pubseq", "I") in out
