"""Protobuf decoding: best-fitting registered type, runner-up, base64 wrapping, wire dumps."""

from __future__ import annotations

import base64
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.codecs import ProtobufRegistry, decode_payload, registry_from_config
from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.config import load_config
from tests.fixtures.codecs.protos import TWIN_PROTOS, compile_descriptor_set, compile_python

EVENTS = "shop.events.v1"
PROTOBUF = "application/x-protobuf"


@pytest.fixture(scope="session")
def descriptor_set(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_descriptor_set(tmp_path_factory.mktemp("protos"))


@pytest.fixture(scope="session")
def registry(descriptor_set: Path) -> ProtobufRegistry:
    registry = ProtobufRegistry()
    registry.add_descriptor_set(descriptor_set)
    return registry


def build(registry: ProtobufRegistry, type_name: str, /, **fields: Any) -> bytes:
    return registry.message_class(type_name)(**fields).SerializePartialToString()


def shipment(registry: ProtobufRegistry) -> bytes:
    message = registry.message_class(f"{EVENTS}.Shipment")(order_id="o-9", carrier=2)
    message.address.street = "1 rue de la Paix"
    message.address.city = "Lyon"
    message.items.add(sku="A-1", quantity=2, price_cents=1999)
    message.items.add(sku="B-7", quantity=1)
    message.labels["priority"] = "high"
    message.shipped_at.seconds = 1_700_000_000
    message.box_weights_grams.extend([250, 1200])
    message.tracking_blob = b"\x00\xff\x10"
    return message.SerializeToString()


def decode(body: bytes, registry: ProtobufRegistry | None, **kwargs: Any) -> Any:
    decoded = decode_payload(
        body,
        content_type=kwargs.pop("content_type", None),
        content_encoding=kwargs.pop("content_encoding", None),
        headers=kwargs.pop("headers", None),
        registry=registry,
        **kwargs,
    )
    json.dumps(decoded.to_json(), allow_nan=False)
    return decoded


def test_registry_lists_every_message_type_of_the_descriptor_set(
    registry: ProtobufRegistry,
) -> None:
    assert registry.type_names == (
        f"{EVENTS}.CounterIncrement",
        f"{EVENTS}.OrderPlaced",
        f"{EVENTS}.PaymentFailed",
        f"{EVENTS}.Shipment",
        f"{EVENTS}.Shipment.Address",
        f"{EVENTS}.Shipment.Item",
        "shop.legacy.Refund",
    )


@pytest.mark.parametrize(
    ("name", "fields", "runner_up"),
    [
        (
            "OrderPlaced",
            {"order_id": "o-1", "amount_cents": 1250, "currency": "EUR"},
            f"{EVENTS}.CounterIncrement",
        ),
        (
            "PaymentFailed",
            {"order_id": "o-1", "reason": "card declined", "code": 51},
            f"{EVENTS}.Shipment.Address",
        ),
        ("CounterIncrement", {"name": "logins", "by": 3}, f"{EVENTS}.OrderPlaced"),
    ],
)
def test_the_type_the_bytes_were_written_with_wins(
    registry: ProtobufRegistry, name: str, fields: dict[str, Any], runner_up: str
) -> None:
    decoded = decode(build(registry, f"{EVENTS}.{name}", **fields), registry)
    assert decoded.kind == "protobuf"
    assert decoded.type_name == f"{EVENTS}.{name}"
    assert decoded.data == fields
    assert decoded.score == 1.0
    assert decoded.runner_up is not None
    assert decoded.runner_up.type_name == runner_up
    assert 0 < decoded.runner_up.score < decoded.score
    assert decoded.notes == []


def test_on_equal_fit_a_top_level_type_beats_a_nested_one(registry: ProtobufRegistry) -> None:
    # proto3 does not send empty fields: {1: string, 3: varint} fits PaymentFailed and the nested
    # Shipment.Item equally; a payload is far more often a top-level type.
    body = build(registry, f"{EVENTS}.PaymentFailed", order_id="o-2", code=5)
    decoded = decode(body, registry)
    assert decoded.type_name == f"{EVENTS}.PaymentFailed"
    assert decoded.data == {"order_id": "o-2", "code": 5}
    assert decoded.score == pytest.approx(0.933)
    assert decoded.runner_up is not None
    assert decoded.runner_up.type_name == f"{EVENTS}.Shipment.Item"
    assert decoded.runner_up.score == decoded.score
    assert any(note.startswith("ambiguous:") for note in decoded.notes)


def test_nested_messages_enums_maps_timestamps_and_bytes_are_readable(
    registry: ProtobufRegistry,
) -> None:
    decoded = decode(shipment(registry), registry)
    assert decoded.type_name == f"{EVENTS}.Shipment"
    assert decoded.score == 1.0
    assert decoded.data == {
        "order_id": "o-9",
        "address": {"street": "1 rue de la Paix", "city": "Lyon"},
        "items": [
            {"sku": "A-1", "quantity": 2, "price_cents": 1999},
            {"sku": "B-7", "quantity": 1},
        ],
        "carrier": "CARRIER_UPS",
        "shipped_at": "2023-11-14T22:13:20Z",
        "labels": {"priority": "high"},
        "box_weights_grams": [250, 1200],
        "tracking_blob": "0x00ff10",
    }


def test_proto2_required_field_present_wins_and_missing_costs_score(
    registry: ProtobufRegistry,
) -> None:
    refund = "shop.legacy.Refund"
    full = decode(
        build(registry, refund, refund_id="r-1", order_id="o-1", amount_cents=9), registry
    )
    assert (full.type_name, full.score) == (refund, 1.0)

    hinted = f"{PROTOBUF}; messageType={refund}"
    partial = build(registry, refund, order_id="o-1", amount_cents=9)
    decoded = decode(partial, registry, content_type=hinted)
    assert decoded.type_name == refund
    assert decoded.score is not None and decoded.score < 0.9
    assert "required fields missing: refund_id" in decoded.notes
    # Without the hint, a type needing nothing more wins over the incomplete Refund.
    assert decode(partial, registry).type_name != refund


def test_fields_the_type_does_not_declare_are_kept_and_named(registry: ProtobufRegistry) -> None:
    body = build(registry, f"{EVENTS}.OrderPlaced", order_id="o-3", amount_cents=7, currency="USD")
    body += b"\x48\x2a"  # field 9, varint 42: not in any registered type
    decoded = decode(body, registry)
    assert decoded.type_name == f"{EVENTS}.OrderPlaced"
    assert decoded.score is not None and decoded.score < 1.0
    assert decoded.data["_unknown_fields"] == [{"field": 9, "wire_type": "varint", "value": 42}]
    assert any("fields 9 are not in" in note for note in decoded.notes)


@pytest.mark.parametrize(
    "wrap",
    [
        base64.b64encode,
        lambda raw: base64.b64encode(raw).rstrip(b"="),
        base64.urlsafe_b64encode,
        lambda raw: base64.urlsafe_b64encode(raw).rstrip(b"="),
        lambda raw: base64.encodebytes(raw),  # MIME: lines of 76 characters
    ],
    ids=["standard", "standard-unpadded", "urlsafe", "urlsafe-unpadded", "mime-lines"],
)
def test_base64_wrapped_protobuf_decodes(registry: ProtobufRegistry, wrap: Any) -> None:
    raw = shipment(registry) * 2  # long enough for MIME line breaks; a repeated message merges
    decoded = decode(wrap(raw), registry, content_type="text/plain")
    assert decoded.kind == "protobuf"
    assert decoded.type_name == f"{EVENTS}.Shipment"
    assert decoded.layers[0] in ("base64", "base64url")
    assert decoded.data["order_id"] == "o-9"


def test_base64_protobuf_inside_a_json_string_decodes(registry: ProtobufRegistry) -> None:
    raw = build(registry, f"{EVENTS}.PaymentFailed", order_id="o-4", reason="fraud", code=3)
    body = json.dumps(base64.b64encode(raw).decode()).encode()
    decoded = decode(body, registry, content_type="application/json")
    assert (decoded.kind, decoded.type_name) == ("protobuf", f"{EVENTS}.PaymentFailed")
    assert decoded.data == {"order_id": "o-4", "reason": "fraud", "code": 3}
    assert "the body is a JSON string holding base64" in decoded.notes


def test_celery_task_arguments_holding_base64_protobuf_are_decoded_alongside(
    registry: ProtobufRegistry,
) -> None:
    raw = build(registry, f"{EVENTS}.OrderPlaced", order_id="o-5", amount_cents=100, currency="EUR")
    wrapped = base64.b64encode(raw).decode()
    body = json.dumps([[wrapped], {"event": wrapped, "n": 1}, {}]).encode()
    decoded = decode(
        body,
        registry,
        content_type="application/json",
        headers={"task": "shop.handle", "id": "t-1"},
    )
    assert decoded.kind == "celery"
    assert decoded.data["args"] == [wrapped]
    for where in ("args[0]", "kwargs['event']"):
        entry = decoded.data["decoded"][where]
        assert entry["type_name"] == f"{EVENTS}.OrderPlaced"
        assert entry["data"] == {"order_id": "o-5", "amount_cents": 100, "currency": "EUR"}


def test_bytes_no_registered_type_explains_give_a_wire_dump(registry: ProtobufRegistry) -> None:
    # field 20: varint 300; field 21: a sub-message {1: "inner", 2: -1 as int64}; field 22: fixed32
    inner = b"\x0a\x05inner\x10" + b"\xff" * 9 + b"\x01"
    body = (
        b"\xa0\x01\xac\x02"
        + b"\xaa\x01"
        + bytes([len(inner)])
        + inner
        + b"\xb5\x01\x00\x00\x80\x3f"
    )
    decoded = decode(body, registry)
    assert decoded.kind == "protobuf-wire"
    assert decoded.type_name is None
    assert decoded.data == [
        {"field": 20, "wire_type": "varint", "value": 300},
        {
            "field": 21,
            "wire_type": "length-delimited",
            "length": len(inner),
            "message": [
                {"field": 1, "wire_type": "length-delimited", "length": 5, "text": "inner"},
                {"field": 2, "wire_type": "varint", "value": (1 << 64) - 1, "as_int64": -1},
            ],
        },
        {"field": 22, "wire_type": "fixed32", "value": 0x3F800000, "as_float": 1.0},
    ]
    assert any(note.startswith("no registered protobuf type fits") for note in decoded.notes)


def test_without_a_registry_protobuf_is_dumped_and_the_settings_are_named(
    registry: ProtobufRegistry,
) -> None:
    body = build(registry, f"{EVENTS}.OrderPlaced", order_id="o-6", amount_cents=1, currency="EUR")
    decoded = decode(body, None)
    assert decoded.kind == "protobuf-wire"
    assert decoded.data[0] == {
        "field": 1,
        "wire_type": "length-delimited",
        "length": 3,
        "text": "o-6",
    }
    assert any("dlx_protobuf_descriptor_sets" in note for note in decoded.notes)


def test_truncated_protobuf_gets_a_note_saying_where_it_breaks(registry: ProtobufRegistry) -> None:
    body = build(registry, f"{EVENTS}.OrderPlaced", order_id="o-7", amount_cents=12, currency="EUR")
    decoded = decode(body[:-2], registry, content_type=PROTOBUF)
    assert decoded.kind == "protobuf-wire"
    assert decoded.type_name is None
    assert any(
        "not valid protobuf: field 3 (length-delimited) at byte 7 claims 3 bytes but only 1 remain"
        in note
        for note in decoded.notes
    )
    assert decoded.data == [
        {"field": 1, "wire_type": "length-delimited", "length": 3, "text": "o-7"},
        {"field": 2, "wire_type": "varint", "value": 12},
    ]


def test_invalid_wire_type_is_reported_and_the_bytes_kept(registry: ProtobufRegistry) -> None:
    body = b"\x0f\x01\x02\x03"  # field 1 with wire type 7, which does not exist
    decoded = decode(body, registry, content_type=PROTOBUF)
    assert decoded.kind == "binary"
    assert decoded.data["hex"] == "0f010203"
    assert "not valid protobuf: field 1 at byte 0 has invalid wire type 7" in decoded.notes


def test_equal_fits_are_reported_as_ambiguous_and_a_named_type_settles_it(
    descriptor_set: Path, tmp_path: Path
) -> None:
    registry = ProtobufRegistry()
    registry.add_descriptor_set(descriptor_set)
    registry.add_descriptor_set(compile_descriptor_set(tmp_path, TWIN_PROTOS))
    body = build(registry, f"{EVENTS}.CounterIncrement", name="signups", by=2)

    guessed = decode(body, registry)
    assert guessed.runner_up is not None
    assert {guessed.type_name, guessed.runner_up.type_name} == {
        f"{EVENTS}.CounterIncrement",
        "shop.metrics.v1.GaugeRaised",
    }
    assert guessed.score == guessed.runner_up.score == 1.0
    assert any(note.startswith("ambiguous:") for note in guessed.notes)

    named = decode(
        body, registry, content_type=f"{PROTOBUF}; messageType=shop.metrics.v1.GaugeRaised"
    )
    assert named.type_name == "shop.metrics.v1.GaugeRaised"
    assert named.data == {"gauge": "signups", "delta": 2}
    assert named.runner_up is not None and named.runner_up.type_name == f"{EVENTS}.CounterIncrement"


def test_registry_from_config_reads_descriptor_sets_and_modules(
    descriptor_set: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(compile_python(tmp_path, TWIN_PROTOS)))
    monkeypatch.delitem(sys.modules, "twins_pb2", raising=False)
    config = load_config(
        {
            "dlx_protobuf_descriptor_sets": [str(descriptor_set)],
            "dlx_protobuf_modules": ["twins_pb2"],
        }
    )
    registry = registry_from_config(config)
    assert "shop.metrics.v1.GaugeRaised" in registry
    assert f"{EVENTS}.Shipment" in registry
    assert registry.sources == (str(descriptor_set), "twins_pb2")
    body = build(registry, "shop.metrics.v1.GaugeRaised", gauge="g", delta=-4)
    decoded = decode(body, registry, content_type=f"{PROTOBUF}; proto=shop.metrics.v1.GaugeRaised")
    assert decoded.data == {"gauge": "g", "delta": -4}


def test_an_empty_config_gives_an_empty_registry() -> None:
    registry = registry_from_config(load_config({}))
    assert len(registry) == 0
    assert decode(b"\x08\x01", registry).kind == "protobuf-wire"


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"dlx_protobuf_descriptor_sets": ["/nonexistent/x.pb"]},
            "dlx_protobuf_descriptor_sets: cannot read",
        ),
        (
            {"dlx_protobuf_modules": ["no_such_module_for_codecs"]},
            "dlx_protobuf_modules: cannot import",
        ),
        ({"dlx_protobuf_modules": ["json"]}, "holds no protobuf message type"),
    ],
)
def test_bad_settings_raise_configuration_errors_naming_them(
    settings: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError, match=message):
        registry_from_config(settings)


def test_a_file_that_is_not_a_descriptor_set_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "garbage.pb"
    path.write_bytes(b"\xff\xff\xff not protobuf")
    with pytest.raises(ConfigurationError, match="is not a FileDescriptorSet"):
        ProtobufRegistry().add_descriptor_set(path)


def test_a_descriptor_set_without_its_imports_names_the_protoc_flag(tmp_path: Path) -> None:
    bare = compile_descriptor_set(tmp_path, include_imports=False)
    with pytest.raises(ConfigurationError, match="--include_imports"):
        ProtobufRegistry().add_descriptor_set(bare)


def test_without_protobuf_installed_the_extra_is_named(
    registry: ProtobufRegistry, descriptor_set: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    body = build(registry, f"{EVENTS}.CounterIncrement", name="n", by=1)
    for module in ("google.protobuf", "google.protobuf.message"):
        monkeypatch.setitem(sys.modules, module, None)
    decoded = decode(body, None)
    assert decoded.kind == "protobuf-wire"
    assert any("pip install celery-dlx[protobuf]" in note for note in decoded.notes)
    with pytest.raises(ConfigurationError, match=r"pip install celery-dlx\[protobuf\]"):
        ProtobufRegistry().add_descriptor_set(descriptor_set)


def _nest(levels: int) -> bytes:
    body = b"\x08\x07"
    for _ in range(levels):
        body = b"\x0a" + bytes([len(body)]) + body
    return body


def test_wire_dump_stops_opening_sub_messages_past_the_depth_limit() -> None:
    decoded = decode(_nest(12), None)
    node, depth = decoded.data[0], 1
    while "message" in node:
        node, depth = node["message"][0], depth + 1
    assert depth == 8
    assert node["hex"].startswith("0a")


def test_wire_dump_of_very_many_fields_is_cut_with_a_note() -> None:
    decoded = decode(b"\x08\x01" * 5000, None)
    assert decoded.kind == "protobuf-wire"
    assert len(decoded.data) == 1001
    assert decoded.data[-1] == {"truncated": "4000 more fields not shown"}
    assert "wire dump cut: too many fields or nested too deeply" in decoded.notes
    assert decoded.truncated


def _decoys(count: int) -> bytes:
    """A descriptor set of ``count`` types with Shipment's first fields, sub-messages as bytes."""
    from google.protobuf import descriptor_pb2

    proto = descriptor_pb2.FieldDescriptorProto
    fds = descriptor_pb2.FileDescriptorSet()
    file = fds.file.add(name="decoys.proto", package="decoys", syntax="proto3")
    for i in range(count):
        message = file.message_type.add(name=f"Decoy{i}")
        first = proto.TYPE_STRING if i % 2 else proto.TYPE_BYTES
        message.field.add(name="id", number=1, type=first, label=proto.LABEL_OPTIONAL)
        message.field.add(name="blob", number=2, type=proto.TYPE_BYTES, label=proto.LABEL_OPTIONAL)
        message.field.add(name="parts", number=3, type=proto.TYPE_BYTES, label=proto.LABEL_REPEATED)
    return fds.SerializeToString()


def test_a_type_naming_nested_messages_beats_many_that_call_them_bytes(
    descriptor_set: Path,
) -> None:
    registry = ProtobufRegistry()
    registry.add_descriptor_set(descriptor_set)
    registry.add_descriptor_set(_decoys(200))
    # Only fields 1-3: a decoy {1: string, 2: bytes, 3: bytes} covers all it declares.
    message = registry.message_class(f"{EVENTS}.Shipment")(order_id="o-1")
    message.address.city = "Brest"
    message.items.add(sku="C-3", quantity=4)
    decoded = decode(message.SerializeToString(), registry)
    assert decoded.type_name == f"{EVENTS}.Shipment"
    assert decoded.runner_up is not None and decoded.runner_up.type_name.startswith("decoys.")
    assert decoded.runner_up.score < decoded.score
    assert decoded.data == {
        "order_id": "o-1",
        "address": {"city": "Brest"},
        "items": [{"sku": "C-3", "quantity": 4}],
    }


def test_protobuf_longer_than_the_limit_is_dumped_up_to_the_cut(registry: ProtobufRegistry) -> None:
    message = registry.message_class(f"{EVENTS}.Shipment")(order_id="o-big")
    for i in range(3000):
        message.items.add(sku=f"sku-{i}", quantity=i % 5)
    decoded = decode(message.SerializeToString(), registry, limit=4096)
    assert decoded.kind == "protobuf-wire"
    assert decoded.truncated
    assert decoded.data[0] == {
        "field": 1,
        "wire_type": "length-delimited",
        "length": 5,
        "text": "o-big",
    }
    assert decoded.data[1]["message"][0]["text"] == "sku-0"
    assert "typed protobuf decoding skipped: the body is cut at the decode limit" in decoded.notes
    assert any(n.startswith("the body is cut at the decode limit: field 3") for n in decoded.notes)


def test_random_bytes_cut_at_the_limit_are_not_passed_off_as_protobuf() -> None:
    # Field 1 varint, then wire type 7 (invalid) long before the cut: not a cut message.
    decoded = decode(b"\x08\x01\x0f" + b"\x00" * 5000, None, limit=1024)
    assert decoded.kind == "binary"
    assert decoded.truncated
