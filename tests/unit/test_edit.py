"""Editing a buried message without a broker: paths, setting values, encoding back, the diff,
the edited copy's ids and headers, and what is refused."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.codecs import ProtobufRegistry
from celery_dlx.message.names import ATTEMPT_HEADER, REPLAYED_HEADER
from celery_dlx.message.obituary import Obituary
from celery_dlx_edit.edit import EDITED_FROM_HEADER, check_header_name, plan_edit
from celery_dlx_edit.payload import (
    ABSENT,
    Change,
    EditError,
    check_celery_shape,
    diff_lines,
    edit_json,
    parse_assignment,
    parse_path,
    set_json,
)
from tests.fixtures.codecs.protos import compile_descriptor_set, compile_python


def celery_ob(body: Any, *, headers: dict[str, Any] | None = None, **props: Any) -> Obituary:
    raw = json.dumps(body).encode()
    return Obituary.from_fields(
        id="ob-1",
        message_id="t-1",
        queue="orders",
        reason="r",
        buried_ms=1_000,
        origin="celery",
        headers={
            "task": "shop.charge",
            "id": "t-1",
            "root_id": "t-1",
            "parent_id": None,
            ATTEMPT_HEADER: 3,
            "x-tenant": "acme",
            **(headers or {}),
        },
        properties={
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "correlation_id": "t-1",
            **props,
        },
        payload=raw,
        payload_size=len(raw),
    )


def plain_ob(body: bytes, content_type: str, **extra: Any) -> Obituary:
    return Obituary.from_fields(
        id="ob-2",
        message_id="m-2",
        queue="events",
        reason="r",
        buried_ms=1_000,
        origin="foreign",
        headers={"x-tenant": "acme"},
        properties={"content_type": content_type, "message_id": "m-2"},
        payload=body,
        payload_size=len(body),
        **extra,
    )


@pytest.mark.parametrize(
    ("path", "parts"),
    [
        ("args.0", ["args", "0"]),
        ("kwargs.order_id", ["kwargs", "order_id"]),
        ("a.b.c", ["a", "b", "c"]),
        ("/a/b.c/x~1y/t~0", ["a", "b.c", "x/y", "t~"]),
    ],
)
def test_paths_are_dotted_keys_or_json_pointers(path: str, parts: list[str]) -> None:
    assert parse_path(path) == parts


@pytest.mark.parametrize("bad", ["", " ", "a..b", ".a", "a.", "/a//b"])
def test_empty_paths_and_segments_are_refused(bad: str) -> None:
    with pytest.raises(EditError):
        parse_path(bad)


def test_assignments_take_json_values() -> None:
    assert parse_assignment('kwargs.x={"a": [1, 2.5, null]}') == ("kwargs.x", {"a": [1, 2.5, None]})
    assert parse_assignment("args.0=7") == ("args.0", 7)
    assert parse_assignment('a="x=y"') == ("a", "x=y")
    with pytest.raises(EditError, match="must be JSON"):
        parse_assignment("kwargs.x=unquoted")
    with pytest.raises(EditError, match="PATH=JSON"):
        parse_assignment("no-equals-sign")
    with pytest.raises(EditError, match="NaN"):
        parse_assignment("a=NaN")


def test_set_json_replaces_appends_and_adds_only_the_last_key() -> None:
    root: Any = {"a": {"b": [1, 2]}, "c": 1}
    assert set_json(root, ["a", "b", "0"], 9, "a.b.0") == 1
    assert set_json(root, ["a", "b", "-"], 3, "a.b.-") is ABSENT
    assert set_json(root, ["a", "b", "-1"], 4, "a.b.-1") == 3
    assert set_json(root, ["a", "new"], "v", "a.new") is ABSENT
    assert root == {"a": {"b": [9, 2, 4], "new": "v"}, "c": 1}
    with pytest.raises(EditError, match="out of range"):
        set_json(root, ["a", "b", "7"], 0, "a.b.7")
    with pytest.raises(EditError, match="only the last key may be new"):
        set_json(root, ["x", "y"], 0, "x.y")
    with pytest.raises(EditError, match="not a list or mapping"):
        set_json(root, ["c", "d"], 0, "c.d")
    with pytest.raises(EditError, match="not a list index"):
        set_json(root, ["a", "b", "first"], 0, "a.b.first")


def test_a_celery_protocol_2_body_is_edited_by_args_and_kwargs() -> None:
    body = json.dumps([[1, "a"], {"x": "bad", "n": 1}, {"callbacks": None}]).encode()
    edited = edit_json(
        body, "celery", [("kwargs.x", "good"), ("args.1", "b"), ("kwargs.new", True)], None
    )
    assert json.loads(edited.body) == [
        [1, "b"],
        {"x": "good", "n": 1, "new": True},
        {"callbacks": None},
    ]
    assert [c.to_json() for c in edited.changes] == [
        {
            "path": "kwargs.x",
            "before": "bad",
            "after": "good",
            "before_absent": False,
            "after_absent": False,
        },
        {
            "path": "args.1",
            "before": "a",
            "after": "b",
            "before_absent": False,
            "after_absent": False,
        },
        {
            "path": "kwargs.new",
            "before": None,
            "after": True,
            "before_absent": True,
            "after_absent": False,
        },
    ]
    with pytest.raises(EditError, match="start with args, kwargs or embed"):
        edit_json(body, "celery", [("x", 1)], None)
    with pytest.raises(EditError, match="name an argument"):
        edit_json(body, "celery", [("kwargs", {})], None)


def test_a_celery_protocol_1_body_gets_its_new_task_id_in_the_body() -> None:
    body = json.dumps({"task": "t", "id": "old", "args": [1], "kwargs": {"x": 0}}).encode()
    edited = edit_json(body, "celery", [("kwargs.x", 5), ("args.0", 2)], None, task_id="new")
    assert json.loads(edited.body) == {"task": "t", "id": "new", "args": [2], "kwargs": {"x": 5}}


def test_the_diff_shows_before_and_after_of_each_path_and_header() -> None:
    lines = diff_lines(
        [Change("kwargs.x", "bad", "good"), Change("kwargs.y", ABSENT, [1])],
        [Change("x-tenant", "acme", ABSENT)],
    )
    assert lines == [
        "payload kwargs.x:",
        '  - "bad"',
        '  + "good"',
        "payload kwargs.y:",
        "  - <absent>",
        "  + [1]",
        "header x-tenant:",
        '  - "acme"',
        "  + <absent>",
    ]


def test_an_edited_celery_copy_is_a_new_task_with_the_new_value() -> None:
    ob = celery_ob([[1], {"x": "bad"}, {}])
    plan = plan_edit(ob, sets=[("kwargs.x", 2)], headers=[("x-note", "fixed")], new_id="t-new")
    out = plan.outgoing
    assert json.loads(out.body) == [[1], {"x": 2}, {}]
    assert (out.exchange, out.routing_key) == ("", "orders")
    assert out.headers["id"] == out.headers["root_id"] == "t-new"
    assert out.properties["correlation_id"] == "t-new"
    assert out.headers[EDITED_FROM_HEADER] == out.headers[REPLAYED_HEADER] == "ob-1"
    assert out.headers["x-tenant"] == "acme" and out.headers["x-note"] == "fixed"
    assert ATTEMPT_HEADER not in out.headers  # a fresh budget, as every replay
    assert (plan.old_message_id, plan.new_message_id, plan.task_id) == ("t-1", "t-new", "t-new")
    assert plan.paths == ["kwargs.x"] and plan.header_names == ["x-note"]
    assert plan.diff() == [
        "payload kwargs.x:",
        '  - "bad"',
        "  + 2",
        "header x-note:",
        "  - <absent>",
        '  + "fixed"',
    ]


def test_a_child_task_keeps_its_workflow_root() -> None:
    ob = celery_ob([[], {"x": 1}, {}], headers={"root_id": "root-9", "parent_id": "p-9"})
    out = plan_edit(ob, sets=[("kwargs.x", 2)], new_id="t-new").outgoing
    assert out.headers["id"] == "t-new"
    assert out.headers["root_id"] == "root-9" and out.headers["parent_id"] == "p-9"


def test_a_plain_json_body_gets_a_new_message_id() -> None:
    ob = plain_ob(json.dumps({"order": {"lines": [{"sku": "A"}]}}).encode(), "application/json")
    plan = plan_edit(ob, sets=[("order.lines.0.sku", "B"), ("/order/note", "n")], new_id="m-new")
    assert json.loads(plan.outgoing.body) == {"order": {"lines": [{"sku": "B"}], "note": "n"}}
    assert plan.outgoing.properties["message_id"] == "m-new"
    assert plan.kind == "json" and plan.task_id is None


@pytest.mark.parametrize(
    "name",
    [
        "x-dlx-attempt",
        "x-dlx-edited-from",
        "X-DLX-queue",
        "x-death",
        "x-first-death-queue",
        "x-last-death-reason",
    ],
)
def test_celery_dlx_and_broker_headers_cannot_be_set(name: str) -> None:
    with pytest.raises(EditError, match="cannot be edited"):
        check_header_name(name)
    ob = celery_ob([[], {}, {}])
    with pytest.raises(EditError, match="cannot be edited"):
        plan_edit(ob, headers=[(name, 1)])


def test_a_celery_task_id_header_cannot_be_set() -> None:
    with pytest.raises(EditError, match="new task id"):
        plan_edit(celery_ob([[], {}, {}]), headers=[("id", "mine")])


def test_a_null_header_value_removes_the_header() -> None:
    plan = plan_edit(celery_ob([[], {}, {}]), headers=[("x-tenant", None)])
    assert "x-tenant" not in plan.outgoing.headers
    assert plan.header_changes[0].after is ABSENT


def test_pickle_is_refused_whatever_the_content_type_says() -> None:
    body = pickle.dumps(([1], {"x": 1}, {}))
    for content_type in ("application/x-python-serialize", "application/json"):
        with pytest.raises(EditError, match=r"pickle|unsafe"):
            plan_edit(plain_ob(body, content_type), sets=[("a", 1)])


@pytest.mark.parametrize(
    ("body", "content_type", "why"),
    [
        (b"just some words", "text/plain", "text body cannot be edited"),
        (b"\x00\x01\x02\xff" * 8, "application/octet-stream", "cannot be edited"),
        (b"\x1f\x8b\x08\x00garbage", "application/json", "cannot be edited|wrapped"),
    ],
)
def test_what_is_not_read_exactly_is_refused(body: bytes, content_type: str, why: str) -> None:
    with pytest.raises(EditError, match=why):
        plan_edit(plain_ob(body, content_type), sets=[("a", 1)])


def test_a_gzipped_json_body_is_refused_rather_than_sent_uncompressed() -> None:
    import gzip

    ob = plain_ob(gzip.compress(b'{"a": 1}'), "application/json")
    with pytest.raises(EditError, match="wrapped"):
        plan_edit(ob, sets=[("a", 2)])


def test_nothing_to_edit_is_an_error() -> None:
    with pytest.raises(EditError, match="nothing to edit"):
        plan_edit(celery_ob([[], {}, {}]))


def test_a_replacement_payload_must_read_as_the_message_does() -> None:
    ob = celery_ob([[], {"x": 1}, {}])
    plan = plan_edit(ob, payload=json.dumps([[5], {"x": 2}, None]).encode(), sets=[("args.0", 6)])
    assert json.loads(plan.outgoing.body) == [[6], {"x": 2}, None]
    assert plan.replaced_payload and plan.diff()[0] == "payload replaced from a file"
    with pytest.raises(EditError, match="--payload"):
        plan_edit(ob, payload=b'{"not": "celery"}')
    with pytest.raises(EditError, match=r"pickle"):
        plan_edit(ob, payload=pickle.dumps([[], {}, {}]))


def test_the_celery_shape_is_checked() -> None:
    check_celery_shape([[], {}, None], None)
    check_celery_shape({"task": "t", "args": [], "kwargs": {}}, None)
    for bad in ([[], {}], [{}, {}, {}], [[], [], {}], {"args": []}, {"task": "t", "args": {}}):
        with pytest.raises(EditError, match="Celery protocol"):
            check_celery_shape(bad, None)
    ob = celery_ob([[1], {}, {}])
    with pytest.raises(EditError, match="name an argument"):
        plan_edit(ob, sets=[("kwargs", [])])


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> tuple[ProtobufRegistry, Any]:
    import importlib
    import sys

    out: Path = tmp_path_factory.mktemp("edit-protos")
    registry = ProtobufRegistry()
    registry.add_descriptor_set(compile_descriptor_set(out))
    compile_python(out)
    sys.path.insert(0, str(out))
    try:
        module = importlib.reload(importlib.import_module("events_pb2"))
    finally:
        sys.path.remove(str(out))
    return registry, module


def test_a_protobuf_body_is_edited_with_its_best_fitting_type(
    shop: tuple[ProtobufRegistry, Any],
) -> None:
    registry, pb = shop
    original = pb.Shipment(
        order_id="o-1",
        address=pb.Shipment.Address(street="Main 1", city="Oslo", country="NO"),
        items=[pb.Shipment.Item(sku="A", quantity=1, price_cents=100)],
        carrier=pb.Shipment.CARRIER_DHL,
        labels={"gift": "yes"},
        box_weights_grams=[10, 20],
    )
    ob = plain_ob(original.SerializeToString(), "application/x-protobuf")
    plan = plan_edit(
        ob,
        sets=[
            ("address.city", "Bergen"),
            ("items.0.quantity", 3),
            ("carrier", "CARRIER_UPS"),
            ("labels.gift", "no"),
            ("box_weights_grams.1", 25),
            ("items.-", {"sku": "B", "quantity": 2}),
        ],
        registry=registry,
        new_id="m-new",
    )
    assert plan.type_name == "shop.events.v1.Shipment"
    got = pb.Shipment.FromString(plan.outgoing.body)
    assert got.address.city == "Bergen" and got.address.street == "Main 1"
    assert [(i.sku, i.quantity) for i in got.items] == [("A", 3), ("B", 2)]
    assert got.carrier == pb.Shipment.CARRIER_UPS and dict(got.labels) == {"gift": "no"}
    assert list(got.box_weights_grams) == [10, 25]
    assert [(c.path, c.before, c.after) for c in plan.changes][:4] == [
        ("address.city", "Oslo", "Bergen"),
        ("items.0.quantity", 1, 3),
        ("carrier", "CARRIER_DHL", "CARRIER_UPS"),
        ("labels.gift", "yes", "no"),
    ]
    with pytest.raises(EditError, match="has no field 'nope'"):
        plan_edit(ob, sets=[("nope", 1)], registry=registry)
    with pytest.raises(EditError, match="does not fit field quantity"):
        plan_edit(ob, sets=[("items.0.quantity", "many")], registry=registry)
    with pytest.raises(EditError, match="not a value of"):
        plan_edit(ob, sets=[("carrier", "CARRIER_FEDEX")], registry=registry)


def test_protobuf_without_a_registered_type_is_refused(shop: tuple[ProtobufRegistry, Any]) -> None:
    _registry, pb = shop
    ob = plain_ob(
        pb.OrderPlaced(order_id="o", amount_cents=5).SerializeToString(), "application/x-protobuf"
    )
    with pytest.raises(EditError, match="protobuf-wire body cannot be edited"):
        plan_edit(ob, sets=[("order_id", "p")], registry=None)


def test_base64_protobuf_is_edited_inside_and_wrapped_back(
    shop: tuple[ProtobufRegistry, Any],
) -> None:
    import base64

    registry, pb = shop
    raw = pb.PaymentFailed(order_id="o-1", reason="card declined", code=51).SerializeToString()
    ob = plain_ob(base64.b64encode(raw), "application/octet-stream")
    plan = plan_edit(ob, sets=[("code", 0), ("reason", "retry me")], registry=registry)
    assert plan.type_name == "shop.events.v1.PaymentFailed"
    got = pb.PaymentFailed.FromString(base64.b64decode(plan.outgoing.body))
    assert (got.order_id, got.reason, got.code) == ("o-1", "retry me", 0)
    unpadded = base64.urlsafe_b64encode(raw).rstrip(b"=")
    plan = plan_edit(plain_ob(unpadded, "text/plain"), sets=[("code", 7)], registry=registry)
    assert b"=" not in plan.outgoing.body
    padded = plan.outgoing.body + b"=" * (-len(plan.outgoing.body) % 4)
    assert pb.PaymentFailed.FromString(base64.urlsafe_b64decode(padded)).code == 7


def test_celery_display_headers_follow_the_edited_arguments() -> None:
    ob = celery_ob(
        [[1], {"x": "bad"}, {}], headers={"argsrepr": "(1,)", "kwargsrepr": "{'x': 'bad'}"}
    )
    plan = plan_edit(ob, sets=[("kwargs.x", 5)])
    assert plan.outgoing.headers["argsrepr"] == "(1,)"
    assert plan.outgoing.headers["kwargsrepr"] == "{'x': 5}"
    assert [(c.path, c.before, c.after) for c in plan.header_changes] == [
        ("kwargsrepr", "{'x': 'bad'}", "{'x': 5}")
    ]
    # a header-only edit leaves them alone
    plan = plan_edit(ob, headers=[("x-note", "n")])
    assert plan.outgoing.headers["kwargsrepr"] == "{'x': 'bad'}"


def test_a_celery_protocol_1_copy_carries_its_new_task_id_in_the_body() -> None:
    body = {"task": "shop.charge", "id": "t-1", "args": [1], "kwargs": {"x": "bad"}}
    raw = json.dumps(body).encode()
    ob = plain_ob(raw, "application/json")
    ob.properties = {"content_type": "application/json", "correlation_id": "t-1"}
    plan = plan_edit(ob, sets=[("kwargs.x", 3)], new_id="t-new")
    assert plan.kind == "celery" and plan.old_message_id == "t-1" and plan.task_id == "t-new"
    assert json.loads(plan.outgoing.body) == {**body, "id": "t-new", "kwargs": {"x": 3}}
    assert plan.outgoing.properties["correlation_id"] == "t-new"


def test_a_proto3_default_shows_as_its_value_and_presence_fields_as_absent(
    shop: tuple[ProtobufRegistry, Any],
) -> None:
    registry, pb = shop
    ob = plain_ob(
        pb.PaymentFailed(order_id="o-1", reason="x").SerializeToString(), "application/x-protobuf"
    )
    plan = plan_edit(ob, sets=[("code", 5)], registry=registry)
    assert [(c.path, c.before, c.after) for c in plan.changes] == [("code", 0, 5)]
    ship = pb.Shipment(order_id="o-1", items=[pb.Shipment.Item(sku="A", quantity=1)])
    plan = plan_edit(
        plain_ob(ship.SerializeToString(), "application/x-protobuf"),
        sets=[("address", {"city": "Oslo"}), ("carrier", "CARRIER_UPS")],
        registry=registry,
    )
    assert [(c.path, c.before) for c in plan.changes] == [
        ("address", ABSENT),
        ("carrier", "CARRIER_UNSPECIFIED"),
    ]
    assert pb.Shipment.FromString(plan.outgoing.body).address.city == "Oslo"
