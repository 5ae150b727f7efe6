"""A corpus of bad dead letters against the real DLX service and every ``celery dlx`` command.

Each case is published to the dead-letter exchange as a foreign producer or consumer could send
it: ``x-death`` of the wrong type or shape, a missing or unknown queue, non-UTF-8 header values,
properties and header names, huge header tables, empty and 10 MB bodies, wrong content types and
encodings, a compression bomb, invalid and truncated protobuf, and pickle payloads carrying a
canary that creates a file if anything ever unpickles them. Header tables are also written field
type by field type as other clients write them (Go's amqp091-go ``amqp.Table`` with 64-bit ints,
bytes, decimals and timestamps, Node's amqplib typed values, nested arrays), and two look-alike
messages (one body, no message_id) must stay two. Every case must end kept (buried
with a reason, or parked), the service must keep running, and every command (list, show,
groups, parked, stats, check, replay, purge, migrate) must handle the result without a crash.
The canary must never fire.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import pickle
import struct
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import amqp
import pytest
import redis as redis_lib
from kombu import Connection

from celery_dlx.broker.frames import tolerant
from celery_dlx.broker.topology import dead_letter_arguments, service_queue
from celery_dlx.message.fieldtable import table_entries
from celery_dlx.message.names import (
    ATTEMPT_HEADER,
    HISTORY_HEADER,
    QUEUE_HEADER,
    REASON_HEADER,
    WIRE_HEADERS_PROPERTY,
)
from celery_dlx.ops import obituaries
from celery_dlx.service.loop import DLXService
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL, REDIS_URL
from tests.integration.cli_helpers import run, shop_protos
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import wait_until

MIB = 1024 * 1024


class Field:
    """A header value written as raw AMQP bytes (type tag + payload), as another client writes
    it: py-amqp's own encoder never writes ``l``, ``b``, ``B``, ``s``, ``u``, ``i``, ``f``, ``x``."""

    def __init__(self, tag: str, payload: bytes) -> None:
        self.tag = tag.encode()
        self.payload = payload


def long(value: int) -> Field:
    return Field("l", struct.pack(">q", value))


@contextlib.contextmanager
def raw_fields() -> Iterator[None]:
    """Let py-amqp's table encoder write :class:`Field` values verbatim (publishing only)."""
    from amqp import serialization

    original = serialization._write_item

    def write_item(value: Any, write: Any, bits: Any) -> None:
        if isinstance(value, Field):
            write(value.tag)
            write(value.payload)
            return
        original(value, write, bits)

    serialization._write_item = write_item
    try:
        yield
    finally:
        serialization._write_item = original


#: Epoch milliseconds: what a Go service puts in an int64 header (``l``).
NOW_MS = 1_763_900_000_000
#: The body of the two look-alike messages (no message_id, one body: two messages).
LOOK_ALIKE = b'{"event": "recount"}'


def go_table() -> dict[str, Any]:
    """Every field type amqp091-go writes (``amqp.Table``), RabbitMQ accepts them all."""
    return {
        "go-int64": long(NOW_MS),
        "go-int64-negative": long(-(2**40)),
        "go-int8": Field("b", b"\xff"),
        "go-uint8": Field("B", b"\xc8"),
        "go-int16": Field("s", struct.pack(">h", -3)),
        "go-float32": Field("f", struct.pack(">f", 1.5)),
        "go-decimal": Field("D", struct.pack(">Bi", 2, 12345)),
        "go-decimal-negative": Field("D", struct.pack(">Bi", 2, -5)),
        "go-timestamp": Field("T", struct.pack(">Q", 1_700_000_000)),
        "go-bytes": Field("x", struct.pack(">I", 3) + b"\x00\xff\x10"),
        "go-void": None,
        "go-table": {"deep": {"ms": long(NOW_MS)}},
    }


def node_table() -> dict[str, Any]:
    """amqplib's typed values ({'!': 'long', value}) and a number past 32 bits, as it writes them."""
    return {
        "node-long": long(2**53 - 1),
        "node-unsigned-short": Field("u", struct.pack(">H", 60000)),
        "node-unsigned-int": Field("i", struct.pack(">I", 4_000_000_000)),
        "node-byte": Field("b", b"\x7f"),
        "node-float": Field("f", struct.pack(">f", -0.25)),
        "node-timestamp": Field("T", struct.pack(">Q", 0)),
        "node-buffer": Field("x", struct.pack(">I", 0)),
    }


class Canary:
    """Unpickling this creates ``path``: proof that someone loaded a pickle payload."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


@dataclass
class Case:
    """One bad dead letter and what must become of it.

    ``reason`` is a fragment of the obituary's reason, or None for a case that must be parked.
    """

    name: str
    body: bytes = b"{}"
    headers: dict[str, Any] | None = None
    properties: dict[str, Any] = field(default_factory=dict)
    routing_key: str | None = None
    reason: str | None = "retry budget spent"
    why: str = ""
    #: The id the service gives it (its message_id as text), when that is not ``name``.
    identity: str | None = None
    #: False: published without a message_id (its obituary's id is derived, see expected_ids).
    message_id: bool = True

    @property
    def id(self) -> str:
        return self.identity or self.name


#: Timestamps RabbitMQ carries and py-amqp cannot read: time.Unix(-86400, 0) as amqp091-go writes
#: it, and the year 10000.
HOSTILE_TIMESTAMPS = {
    "go-1969": Field("T", struct.pack(">Q", 2**64 - 86400)),
    "go-year-10000": Field("T", struct.pack(">Q", 253_402_300_800 + 86_400)),
}


def death(queue: str, **extra: Any) -> list[dict[str, Any]]:
    return [{"queue": queue, "reason": "rejected", "count": 1, "exchange": "", **extra}]


def build_cases(bury: str, park: str, canary: str, pb: Any) -> list[Case]:
    """The corpus; ``bury``'s policy buries at once, ``park``'s parks for an hour."""
    valid = death(bury)
    shipment = pb.OrderPlaced(order_id="o-17", amount_cents=1250, currency="EUR")
    wire = shipment.SerializeToString()
    pickled = pickle.dumps(Canary(canary))
    bomb = gzip.compress(b"\0" * (64 * MIB))
    return [
        Case("x-death-string", headers={"x-death": "rejected"}, reason="x-death must be a list"),
        Case(
            "x-death-not-tables",
            headers={"x-death": ["not", "tables"]},
            reason="x-death[0] must be a table",
        ),
        Case(
            "x-death-no-queue",
            headers={"x-death": [{"reason": "rejected", "count": 1}]},
            reason="x-death[0] has no queue",
        ),
        Case(
            "x-death-count-text",
            headers={"x-death": [{"queue": bury, "reason": "rejected", "count": "many"}]},
            reason="count must be a non-negative integer",
        ),
        Case(
            "x-death-unknown-reason",
            headers={"x-death": [{"queue": bury, "reason": "eaten", "count": 1}]},
            reason="unknown reason",
        ),
        Case(
            "x-death-field-types",
            headers={"x-death": [{"queue": 7, "reason": None, "time": "yesterday"}]},
            reason="x-death[0] has no queue",
        ),
        Case(
            "x-death-empty-list",
            headers={"x-death": []},
            reason="no x-death: published to the dead-letter exchange directly",
        ),
        Case(
            "x-death-500-tables",
            headers={"x-death": death(bury) * 500},
            why="a long death history is read, not choked on",
        ),
        Case(
            "no-queue-anywhere",
            headers={},
            routing_key="",
            reason="no x-death, x-dlx-queue or routing key names its queue",
        ),
        Case(
            "unknown-queue",
            headers={"x-death": death(f"{bury}-nowhere")},
            reason="refused by the broker (queue missing?)",
            why="the default policy requeues; the queue does not exist",
        ),
        Case(
            "non-utf8-header-values",
            headers={
                "x-death": valid,
                "note": b"\xff\xfe\xfd",
                "x-dlx-exc-message": b"\xc3\x28 broken",
                "nested": {"inner": [b"\x80\x81", "ok"]},
            },
        ),
        Case(
            "non-utf8-properties",
            headers={"x-death": valid},
            properties={
                "correlation_id": b"\xff\xfe-corr",
                "content_type": b"text/\xff",
                "type": b"\xc3\x28",
                "app_id": b"\x80go-service",
            },
            why="AMQP short strings are octets; py-amqp raised in its frame reader on these",
        ),
        Case(
            "non-utf8-message-id",
            headers={"x-death": valid},
            properties={"message_id": b"\xff\xfenon-utf8-message-id"},
            identity="\ufffd\ufffdnon-utf8-message-id",
        ),
        Case(
            "non-utf8-header-name",
            headers={"x-death": valid, b"\xff\xfe-name": 1, "fine": b"\xff"},  # type: ignore[dict-item]
        ),
        Case(
            "non-utf8-header-name-parked",
            headers={"x-death": death(park), b"\xfe\xff-name": "v"},  # type: ignore[dict-item]
            reason=None,
            why="a park copies the headers: every name must survive being cleaned and stored",
        ),
        Case(
            "non-utf8-own-queue-header",
            headers={QUEUE_HEADER: b"\xff\xfe-queue"},
            reason="origin unknown",
        ),
        Case(
            "non-utf8-reason-header",
            headers={REASON_HEADER: b"\xffundecodable: by a foreign worker", "x-death": valid},
            reason="undecodable: by a foreign worker",
        ),
        Case(
            "header-tables-like-codec-tags",
            headers={
                "x-death": valid,
                "meta": {"__bytes__": "not hex"},
                "when": {"__datetime__": None},
                "shown": {"__repr__": ["x"]},
            },
            why="user data whose keys are the JSON codecs' own tags",
        ),
        Case(
            "parked-header-tables-like-codec-tags",
            headers={"x-death": death(park), "meta": {"__bytes__": "not hex"}},
            reason=None,
        ),
        Case(
            "attempt-not-a-number",
            headers={"x-death": valid, ATTEMPT_HEADER: "many"},
            reason="undecodable: header x-dlx-attempt",
        ),
        Case(
            "attempt-negative",
            headers={"x-death": valid, ATTEMPT_HEADER: -3},
            reason="must be a non-negative integer",
            why="RabbitMQ itself refuses a float infinity in a table, so a negative count stands in",
        ),
        Case(
            "history-not-json",
            headers={"x-death": valid, HISTORY_HEADER: "[[1, 'parked'"},
            reason="undecodable",
        ),
        Case(
            "task-header-not-text",
            headers={"x-death": valid, "task": 42, "id": ["not", "an", "id"]},
        ),
        Case(
            "huge-header-table",
            headers={"x-death": valid, **{f"h-{i:05d}": "v" * 24 for i in range(2000)}},
        ),
        Case("deep-header-table", headers={"x-death": valid, "deep": _nest(60)}),
        Case(
            "empty-body",
            body=b"",
            headers={"x-death": valid},
            why="py-amqp hands an empty body over as text, without a content_encoding property",
        ),
        Case(
            "empty-body-gzip-encoding",
            body=b"",
            headers={"x-death": valid},
            properties={"content_encoding": "gzip"},
            why="py-amqp hands an empty body over as text; no codec is named gzip",
        ),
        Case("ten-mb-body", body=os.urandom(10 * MIB), headers={"x-death": valid}),
        Case(
            "json-type-not-json",
            body=b"\x00\xff{not json",
            headers={"x-death": valid},
            properties={"content_type": "application/json", "content_encoding": "utf-8"},
        ),
        Case(
            "json-utf8-well-formed",
            body='{"order": "é-17"}'.encode(),
            headers={"x-death": valid},
            properties={"content_type": "application/json", "content_encoding": "utf-8"},
            why="the control: py-amqp decodes such a body to text unless told not to",
        ),
        Case(
            "gzip-encoding-not-gzip",
            body=b"plainly not gzip",
            headers={"x-death": valid},
            properties={"content_type": "application/json", "content_encoding": "gzip"},
        ),
        Case(
            "gzip-bomb",
            body=bomb,
            headers={"x-death": valid},
            properties={"content_type": "application/json", "content_encoding": "gzip"},
            why=f"{len(bomb)} bytes inflating to 64 MiB: decoding must stop at its cap",
        ),
        Case(
            "unknown-content-type",
            body=b"\x89PNG\r\n\x1a\n",
            headers={"x-death": valid},
            properties={"content_type": "image/x-made-up; charset=nonsense"},
        ),
        Case(
            "protobuf-invalid",
            body=b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
            headers={"x-death": valid},
            properties={"content_type": "application/x-protobuf"},
        ),
        Case(
            "protobuf-truncated",
            body=wire[: len(wire) // 2],
            headers={"x-death": valid},
            properties={"content_type": "application/x-protobuf", "type": "OrderPlaced"},
        ),
        Case(
            "pickle-canary-foreign",
            body=pickled,
            headers={"x-death": valid},
            properties={"content_type": "application/x-python-serialize"},
        ),
        Case(
            "pickle-canary-celery",
            body=pickled,
            headers={"x-death": valid, "task": "shop.charge", "id": "pickle-celery-id"},
            properties={
                "content_type": "application/x-python-serialize",
                "content_encoding": "binary",
            },
        ),
        Case(
            "parked-non-utf8-and-pickle",
            body=pickled,
            headers={"x-death": death(park), "note": b"\xff\x00\xfe"},
            properties={"content_type": "application/x-python-serialize"},
            reason=None,
        ),
        Case(
            "parked-ten-mb",
            body=os.urandom(10 * MIB),
            headers={"x-death": death(park)},
            reason=None,
        ),
        Case(
            "go-amqp-table",
            headers={"x-death": valid, **go_table()},
            why="amqp091-go writes int64 as l, byte as B, decimals, timestamps, bytes (x)",
        ),
        Case(
            "go-amqp-table-parked",
            headers={"x-death": death(park), **go_table()},
            reason=None,
            why="a park stores the table as JSON: decimals, timestamps and bytes come back typed",
        ),
        Case(
            "go-hostile-timestamps",
            headers={"x-death": valid, **HOSTILE_TIMESTAMPS},
            why="amqp091-go writes 1969 as the unsigned wrap-around; year 10000 is past datetime: "
            "py-amqp raised OverflowError in its frame reader and stopped the service",
        ),
        Case(
            "go-hostile-timestamps-parked",
            headers={"x-death": death(park), **HOSTILE_TIMESTAMPS},
            reason=None,
            why="the park keeps the raw table: the drained copy carries both timestamps as sent",
        ),
        Case(
            "go-int64-in-own-headers",
            headers={
                "x-death": valid,
                "x-dlx-first-failure-ms": long(NOW_MS),
                ATTEMPT_HEADER: Field("b", b"\x02"),
                "x-dlx-requeues": Field("s", struct.pack(">h", 1)),
            },
            why="celery_dlx's own headers rewritten by a Go consumer: 64-bit and small int types",
        ),
        Case(
            "node-typed-values",
            headers={"x-death": valid, **node_table()},
            why="amqplib's typed values: unsigned short and int, byte, float, zero timestamp",
        ),
        Case(
            "nested-arrays",
            headers={
                "x-death": valid,
                "matrix": [[[long(2**40)]], [], [{"at": long(NOW_MS), "ok": True}], [None, 1.5]],
                "mixed": [Field("x", struct.pack(">I", 1) + b"\x01"), Field("f", b"\x00" * 4)],
            },
            why="arrays of arrays of tables with 64-bit ints: every level is encoded again",
        ),
        Case(
            "empty-tables-and-arrays",
            headers={"x-death": valid, "empty": {}, "none": [], "k" * 255: "a 255-byte key"},
            why="the shortest and longest well-formed shapes (a truncated table never gets here: "
            "RabbitMQ refuses it, see test_a_truncated_header_table_never_reaches_a_queue)",
        ),
        Case(
            "look-alike-1",
            body=LOOK_ALIKE,
            headers={"x-death": valid},
            message_id=False,
            why="one body without message_id, twice: two messages, two obituaries",
        ),
        Case(
            "look-alike-2",
            body=LOOK_ALIKE,
            headers={"x-death": valid},
            message_id=False,
            why="the twin of look-alike-1: it must not be acked away as a redelivery of it",
        ),
    ]


def _nest(depth: int) -> Any:
    value: Any = "bottom"
    for i in range(depth):
        value = {f"level-{i}": value}
    return value


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Every case dead-lettered once and handled by a real DLX service."""
    uid = uuid.uuid4().hex[:10]
    tmp = tmp_path_factory.mktemp("corpus")
    canary = tmp / "canary-fired"
    descriptor_set, pb = shop_protos(tmp_path_factory.mktemp("corpus-protos"))
    bury, park = f"corpus-bury-{uid}", f"corpus-park-{uid}"
    app = make_app(
        uid,
        dlx_queues={
            bury: {"max_requeues": 0, "max_parks": 0},
            park: {"max_requeues": 0, "backoff": [3600]},
        },
        dlx_protobuf_descriptor_sets=[str(descriptor_set)],
    )
    runtime = get_runtime(app)
    cases = build_cases(bury, park, str(canary), pb)
    # celery_dlx's frame reader: plain py-amqp raises OverflowError reading the hostile timestamps
    # back (test_migrate_moves_bad_messages_intact gets them from the moved queue).
    conn = tolerant(Connection(BROKER_URL))
    channel = conn.connection.channel()  # raw py-amqp: messages exactly as the cases say
    try:
        _declare(app, conn.default_channel, [bury, park])
        with raw_fields():
            for case in cases:
                _publish(channel, app.conf.dlx_exchange, bury, case)
        svc = DLXService(app, prefetch=30)
        outcome: dict[str, Any] = {}
        thread = threading.Thread(target=_run, args=(svc, outcome), daemon=True)
        thread.start()
        thread.join(120)
        finished = not thread.is_alive()
        svc.stop()
        thread.join(30)
        assert finished, f"the service did not finish: {svc.stats}"
        # A message without message_id gets a derived identity: give each look-alike its own.
        derived = sorted(m for m in obituaries_by_message(runtime) if m.startswith("sha1-"))
        for case, message_id in zip((c for c in cases if not c.message_id), derived, strict=False):
            case.identity = message_id
        yield {
            "app": app,
            "runtime": runtime,
            "cases": cases,
            "canary": canary,
            "bury": bury,
            "park": park,
            "stats": svc.stats,
            "outcome": outcome,
            "channel": channel,
            "uid": uid,
        }
    finally:
        _cleanup(app, uid, [bury, park, f"{bury}-moved"], conn)
        runtime.reset_publisher()


def _declare(app: Any, channel: Any, queues: list[str]) -> None:
    service_queue(app.conf.dlx_service_queue, app.conf.dlx_exchange)(channel).declare()
    for name in queues:
        channel.queue_declare(
            name,
            durable=True,
            auto_delete=False,
            arguments=dead_letter_arguments(name, app.conf.dlx_exchange),
        )


def _publish(channel: Any, exchange: str, bury: str, case: Case) -> None:
    properties = {"delivery_mode": 2, **case.properties}
    if case.message_id:
        properties.setdefault("message_id", case.name)
    if case.headers is not None:
        properties["application_headers"] = case.headers
    message = amqp.Message(case.body, **properties)
    key = bury if case.routing_key is None else case.routing_key
    channel.basic_publish(message, exchange=exchange, routing_key=key)


def _run(svc: DLXService, outcome: dict[str, Any]) -> None:
    try:
        outcome["stats"] = svc.run(idle_timeout=3.0)
    except BaseException as exc:  # a crash is the finding; the test reports it
        outcome["crash"] = exc


def _cleanup(app: Any, uid: str, queues: list[str], conn: Any) -> None:
    channel = conn.connection.channel()
    for name in [*queues, app.conf.dlx_service_queue, app.conf.task_default_queue]:
        channel.queue_delete(name)
    channel.exchange_delete(app.conf.dlx_exchange)
    conn.release()
    client = redis_lib.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match="{" + f"test-{uid}" + "}*", count=1000):
        client.delete(key)
    client.close()


def obituaries_by_message(runtime: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for ob in obituaries.list_obituaries(runtime, limit=None, with_payload=True):
        out.setdefault(ob.message_id, []).append(ob)
    return out


def test_the_corpus_has_twenty_cases_or_more_each_named_once(corpus: dict[str, Any]) -> None:
    names = [c.name for c in corpus["cases"]]
    assert len(names) >= 20 and len(set(names)) == len(names)


def test_the_service_keeps_every_case_with_a_reason_and_never_crashes(
    corpus: dict[str, Any],
) -> None:
    assert "crash" not in corpus["outcome"], repr(corpus["outcome"].get("crash"))
    stats = corpus["stats"]
    cases = corpus["cases"]
    assert stats.received == len(cases) and stats.duplicates == 0
    runtime = corpus["runtime"]
    buried = obituaries_by_message(runtime)
    parked = {m.message_id for m in runtime.store.peek(limit=100)}
    expected_buried = {c.id for c in cases if c.reason is not None}
    # The case without any queue name gets a derived identity; everything else keeps its id.
    for case in cases:
        if case.reason is None:
            assert case.id in parked, case.name
            continue
        (ob,) = buried[case.id]
        assert case.reason in ob.reason, (case.name, ob.reason)
        assert ob.payload == case.body, case.name
    assert set(buried) == expected_buried
    assert parked == {c.id for c in cases if c.reason is None}
    assert stats.buried == len(expected_buried) and stats.parked == len(parked)
    channel = corpus["channel"]
    dead = channel.queue_declare(corpus["app"].conf.dlx_service_queue, passive=True)
    assert dead.message_count == 0
    assert not corpus["canary"].exists(), "a pickle payload was loaded"


def test_look_alikes_stay_two_messages(corpus: dict[str, Any]) -> None:
    look_alikes = [c for c in corpus["cases"] if not c.message_id]
    ids = {c.id for c in look_alikes}
    assert len(look_alikes) == 2 and len(ids) == 2 and all(i.startswith("sha1-") for i in ids)
    buried = obituaries_by_message(corpus["runtime"])
    for message_id in ids:
        (ob,) = buried[message_id]
        assert ob.payload == LOOK_ALIKE and ob.reason.startswith("retry budget spent")


def test_other_clients_header_types_are_kept_and_shown(corpus: dict[str, Any]) -> None:
    """The Go and Node tables are stored as they came (py-amqp's reading) and shown."""
    app, runtime = corpus["app"], corpus["runtime"]
    (go,) = obituaries_by_message(runtime)["go-amqp-table"]
    assert go.headers["go-int64"] == NOW_MS and go.headers["go-uint8"] == 200
    assert str(go.headers["go-decimal"]) == "123.45" and go.headers["go-bytes"] == b"\x00\xff\x10"
    assert go.headers["go-table"] == {"deep": {"ms": NOW_MS}}
    (own,) = obituaries_by_message(runtime)["go-int64-in-own-headers"]
    assert own.first_failure_ms == NOW_MS and own.attempt == 3
    parked = {m.message_id: m for m in runtime.store.peek(limit=100)}["go-amqp-table-parked"]
    assert str(parked.headers["go-decimal"]) == "123.45"
    assert parked.headers["go-bytes"] == b"\x00\xff\x10"
    (hostile,) = obituaries_by_message(runtime)["go-hostile-timestamps"]
    assert hostile.headers["go-1969"] == datetime(1969, 12, 31)
    assert hostile.headers["go-year-10000"] == 253_402_300_800 + 86_400  # no datetime holds it
    parked = {m.message_id: m for m in runtime.store.peek(limit=100)}
    kept = table_entries(parked["go-hostile-timestamps-parked"].properties[WIRE_HEADERS_PROPERTY])
    assert (b"go-1969", b"T" + struct.pack(">Q", 2**64 - 86400)) in kept
    for name in (
        "go-amqp-table",
        "node-typed-values",
        "nested-arrays",
        "go-hostile-timestamps",
    ):
        shown = run(app, "show", name, "--json")
        assert shown.exit_code == 0, (name, shown.output)
        assert json.loads(shown.stdout)["headers"], name


def test_a_truncated_header_table_never_reaches_a_queue(corpus: dict[str, Any]) -> None:
    """Why the corpus has no truncated table: RabbitMQ parses every header table on publish and
    closes the connection (541 INTERNAL_ERROR) on one cut mid-item, or on a type tag it does not
    know, so no consumer and no DLX service ever receives one."""
    inner = struct.pack(">B", 2) + b"ab" + b"I" + struct.pack(">i", 7)
    shapes = {
        "cut-mid-item": Field("F", struct.pack(">I", 6) + inner),
        "unknown-tag": Field("Z", b""),
    }
    for value in shapes.values():
        conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
        conn.connect()
        try:
            channel = conn.channel()
            channel.confirm_select()
            with raw_fields(), pytest.raises(amqp.exceptions.AMQPError):
                channel.basic_publish(
                    amqp.Message(b"x", application_headers={"h": value}),
                    exchange="",
                    routing_key=corpus["bury"],
                )
                conn.drain_events(timeout=5)
        finally:
            with contextlib.suppress(Exception):
                conn.close()


def test_show_renders_every_obituary_without_loading_pickle(corpus: dict[str, Any]) -> None:
    app = corpus["app"]
    for case in corpus["cases"]:
        if case.reason is None:
            continue
        result = run(app, "show", case.id, "--json")
        assert result.exit_code == 0, (case.name, result.output)
        data = json.loads(result.stdout)
        assert data["message_id"] == case.id and data["reason"]
        decoded = data["payload"]["decoded"]
        if "pickle" in case.name:
            assert decoded is None or "pickle" in json.dumps(decoded).lower(), decoded
        text = run(app, "show", case.id)
        assert text.exit_code == 0 and case.id in text.stdout
        raw = run(app, "show", case.id, "--raw", "--json")
        assert raw.exit_code == 0
    assert not corpus["canary"].exists(), "show loaded a pickle payload"


def test_read_commands_list_every_case(corpus: dict[str, Any]) -> None:
    app = corpus["app"]
    buried = {c.id for c in corpus["cases"] if c.reason is not None}
    listed = run(app, "list", "--limit", "1000", "--json")
    assert listed.exit_code == 0, listed.output
    rows = json.loads(listed.stdout)["obituaries"]
    assert {r["message_id"] for r in rows} == buried
    for args in (("list", "--limit", "1000"), ("list", "--no-decode"), ("groups",)):
        result = run(app, *args)
        assert result.exit_code == 0, (args, result.output)
    groups = json.loads(run(app, "groups", "--json").stdout)
    assert groups["total"] == len(buried)
    parked = json.loads(run(app, "parked", "--json").stdout)
    assert {m["message_id"] for m in parked["messages"]} == {
        c.id for c in corpus["cases"] if c.reason is None
    }
    assert run(app, "parked").exit_code == 0
    stats = json.loads(run(app, "stats", "--json").stdout)
    assert stats["graveyard"]["count"] == len(buried)
    assert run(app, "stats").exit_code == 0
    check = run(app, "check", "--no-management", "--json")
    assert check.exit_code in (0, 4), check.output
    json.loads(check.stdout)
    assert not corpus["canary"].exists()


def test_replay_and_purge_handle_every_case(corpus: dict[str, Any]) -> None:
    app, runtime = corpus["app"], corpus["runtime"]
    buried = {c.id for c in corpus["cases"] if c.reason is not None}
    result = run(app, "replay", "--all", "--json")
    # The cases whose queue does not exist cannot be replayed: reported, exit 5 (incomplete).
    assert result.exit_code in (0, 5), result.output
    report = json.loads(result.stdout)
    replayed = set(report["replayed"])
    failed = {f["id"] for f in report["failed"]}
    assert replayed | failed == {
        ob.id for obs in obituaries_by_message(runtime).values() for ob in obs
    }
    assert failed, "the unknown queue's obituary should not be replayable"
    channel = corpus["channel"]
    arrived = channel.queue_declare(corpus["bury"], passive=True).message_count
    assert arrived == len(replayed)
    purged = run(app, "purge", "--all", "--yes", "--json")
    assert purged.exit_code == 0, purged.output
    assert len(json.loads(purged.stdout)["purged"]) == len(buried)
    assert obituaries.count(runtime) == 0
    assert not corpus["canary"].exists()


def test_migrate_moves_bad_messages_intact(corpus: dict[str, Any]) -> None:
    """``migrate --rename`` moves a queue full of bad messages (the replays) without a crash."""
    app = corpus["app"]
    channel = corpus["channel"]
    before = channel.queue_declare(corpus["bury"], passive=True).message_count
    result = run(
        app, "migrate", corpus["bury"], "--rename", "--to", f"{corpus['bury']}-moved", "--json"
    )
    if result.exit_code == 1 and "management" in (result.stderr + result.stdout).lower():
        pytest.skip("the RabbitMQ management API is not enabled (scripts/ensure-services.sh)")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["moved"] == before
    bodies = {c.id: c.body for c in corpus["cases"]}
    arrived = {}
    channel.auto_decode = False
    anonymous = []
    while (msg := channel.basic_get(f"{corpus['bury']}-moved", no_ack=True)) is not None:
        body = msg.body.encode() if isinstance(msg.body, str) else msg.body
        if "message_id" not in msg.properties:  # the look-alikes
            anonymous.append(body)
            continue
        arrived[msg.properties["message_id"]] = body
    assert len(arrived) + len(anonymous) == before and "json-utf8-well-formed" in arrived
    assert all(body == bodies[mid] for mid, body in arrived.items())
    assert anonymous == [LOOK_ALIKE, LOOK_ALIKE]
    assert not corpus["canary"].exists()


def test_a_worker_runs_a_task_message_whose_properties_are_not_utf8(
    uid: str, key_prefix: str, cleanup_queues: list[str], redis_client: Any
) -> None:
    """py-amqp raised in the worker's frame reader ("Unrecoverable error: UnicodeDecodeError"):
    one such message in a queue stopped every worker that received it."""
    app = make_app(uid)
    cleanup_queues.extend([*queue_names(app), f"exchange:dlx-{uid}", f"exchange:work-{uid}"])
    ran = "{" + key_prefix + "}:test:ran"

    @app.task(name=f"record-{uid}", bind=True)
    def record(self: Any) -> None:
        redis_client.rpush(ran, self.request.id)

    with worker(app):
        with app.connection_for_write() as conn:
            body = json.dumps([[], {}, {"callbacks": None, "errbacks": None}]).encode()
            message = amqp.Message(
                body,
                message_id=b"\xff\xfe-not-utf8",
                app_id=b"\x80go",
                content_type="application/json",
                content_encoding="utf-8",
                application_headers={"task": f"record-{uid}", "id": "task-1", b"\xfe-h": 1},
            )
            conn.connection.channel().basic_publish(message, exchange="", routing_key=f"work-{uid}")
        wait_until(lambda: redis_client.lrange(ran, 0, -1), timeout=30, what="the task's run")
    assert redis_client.lrange(ran, 0, -1) == [b"task-1"]
