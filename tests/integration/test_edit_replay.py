"""``celery dlx edit`` on the real services, in a virtual host of its own: a Celery task buried
because ``kwargs.x`` was bad, edited and replayed, runs on a real worker with the new value as a
new task and succeeds, its other headers byte for byte as their producer wrote them; a base64
protobuf event edited and replayed carries the new field value; pickle is refused and a dry
run publishes nothing.
"""

from __future__ import annotations

import base64
import json
import pickle
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import amqp
import pytest
from kombu import Connection

import celery_dlx
from celery_dlx.broker.publish import EncodedMessage
from celery_dlx.fates import REPLAYED
from celery_dlx.message.fieldtable import encode_value, table_entries, write_properties
from celery_dlx.message.names import REPLAYED_HEADER, WIRE_HEADERS_PROPERTY
from celery_dlx.ops import obituaries
from celery_dlx.service.runner import run_service
from celery_dlx.wiring.runtime import get_runtime
from celery_dlx_edit.edit import EDITED_FROM_HEADER, edits_of
from tests.integration.cli_helpers import (
    b64,
    declare_foreign_queue,
    publish_and_reject,
    run,
    run_json,
    shop_protos,
)
from tests.integration.dlx_apps import make_app, service_thread, worker
from tests.integration.helpers import queue_depth, wait_until

pytestmark = pytest.mark.integration


def short(raw: bytes) -> bytes:
    return bytes((len(raw),)) + raw


#: Headers as another client (amqp091-go) writes them: types celery_dlx's writer would not pick.
FOREIGN = {
    b"go-int8": b"b" + struct.pack(">b", -128),
    b"go-float32": b"f" + struct.pack(">f", 1.5),
    b"go-int64": b"l" + struct.pack(">q", -(2**63)),
    b"go-sig": b"x" + struct.pack(">I", 4) + b"\xff\x00\x80\x7f",
    b"x-tenant": b"S" + struct.pack(">I", 4) + b"acme",
}


@pytest.fixture
def shop(uid: str, key_prefix: str, vhost: str) -> Iterator[dict[str, Any]]:
    """A DLX app on its own virtual host; its task buries when ``x`` is not a number."""
    app = make_app(uid, broker_url=vhost)
    runtime = get_runtime(app)
    done = f"{{{key_prefix}}}:done"
    seen: list[dict[str, Any]] = []

    @app.task(bind=True, name=f"charge-{uid}", acks_late=True)
    def charge(self: Any, order_id: int, x: Any = None) -> None:
        seen.append(dict(self.request.properties or {}))
        if not isinstance(x, int):
            raise celery_dlx.Bury(f"x must be a number, got {x!r}")
        runtime.redis.rpush(done, json.dumps([self.request.id, order_id, x]))

    conn = Connection(vhost)
    app.amqp.queues[app.conf.task_default_queue](conn.channel()).declare()
    try:
        yield {"app": app, "runtime": runtime, "task": charge, "done": done, "seen": seen}
    finally:
        runtime.reset_publisher()
        conn.release()


def publish_task(app: Any, task: Any, kwargs: dict[str, Any]) -> str:
    """A protocol 2 task message with headers only another client writes, published raw."""
    task_id = str(uuid.uuid4())
    headers, _props, body, _ = app.amqp.as_task_v2(task_id, task.name, (), kwargs)
    table = b"".join(short(k.encode()) + encode_value(v) for k, v in headers.items())
    table += b"".join(short(k) + v for k, v in FOREIGN.items())
    props = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "correlation_id": task_id,
        "delivery_mode": 2,
    }
    with Connection(app.conf.broker_url) as conn:
        conn.default_channel.basic_publish(
            EncodedMessage(json.dumps(body).encode(), write_properties(props, table)),
            exchange="",
            routing_key=app.conf.task_default_queue,
        )
    return task_id


def replayed_entries(runtime: Any) -> list[dict[str, str]]:
    return [f for _, f in runtime.history.read() if f["fate"] == REPLAYED]


def test_an_edited_celery_task_runs_with_the_new_value_as_a_new_task(
    shop: dict[str, Any],
) -> None:
    app, runtime, seen = shop["app"], shop["runtime"], shop["seen"]
    queue = app.conf.task_default_queue
    with service_thread(app), worker(app):
        old_id = publish_task(app, shop["task"], {"order_id": 7, "x": "bad"})
        wait_until(lambda: obituaries.count(runtime) == 1, timeout=60, what="the burial")
        ob = obituaries.get_obituary(runtime, old_id)
        assert ob is not None and ob.queue == queue

        # the diff only: nothing published, nothing recorded
        dry = run_json(app, "edit", ob.id, "--set", "kwargs.x=5", "--replay", "--dry-run")
        assert dry["dry_run"] is True and dry["replayed"] is False
        assert dry["changes"] == [
            {
                "path": "kwargs.x",
                "before": "bad",
                "after": 5,
                "before_absent": False,
                "after_absent": False,
            }
        ]
        text = run(app, "edit", ob.id, "--set", "kwargs.x=5")
        assert text.exit_code == 0, text.stderr
        assert '  - "bad"' in text.stdout and "  + 5" in text.stdout
        assert "nothing published" in text.stdout
        assert queue_depth(Connection(app.conf.broker_url).channel(), queue) == 0
        assert replayed_entries(runtime) == [] and len(seen) == 1

        # edited and replayed: a header changed, the others as their producer wrote them
        done = run_json(
            app, "edit", ob.id, "--set", "kwargs.x=5", "--header", "go-int8=7", "--replay"
        )
        assert done["replayed"] is True and done["old_message_id"] == old_id
        new_id = done["new_message_id"]
        assert new_id != old_id and done["task_id"] == new_id
        assert done["headers"][0]["path"] == "go-int8" and done["headers"][0]["after"] == 7
        wait_until(lambda: runtime.redis.llen(shop["done"]) == 1, timeout=60, what="the re-run")

    ran = json.loads(runtime.redis.lrange(shop["done"], 0, -1)[0])
    assert ran == [new_id, 7, 5]  # the new task id, with the corrected value
    props = seen[-1]
    headers = props["application_headers"]
    assert headers["id"] == headers["root_id"] == new_id
    assert props["correlation_id"] == new_id
    assert headers[EDITED_FROM_HEADER] == headers[REPLAYED_HEADER] == ob.id
    got = dict(table_entries(props[WIRE_HEADERS_PROPERTY]))
    assert got[b"go-int8"] == encode_value(7)
    changed = [k for k, v in FOREIGN.items() if k != b"go-int8" and got.get(k) != v]
    assert not changed, f"the edited copy changed {changed}"
    assert not any(k.startswith(b"x-death") for k in got)

    # the original stays and records the edit: ledger, history, audit
    again = obituaries.get_obituary(runtime, ob.id)
    assert again is not None and len(again.replays) == 1 and obituaries.count(runtime) == 1
    entries = replayed_entries(runtime)
    assert len(entries) == 1 and entries[0]["message_id"] == old_id
    assert entries[0]["reason"].startswith(
        "edited (kwargs.x, header go-int8, header kwargsrepr) by "
    )
    assert entries[0]["reason"].endswith(f"replayed from obituary {ob.id} as message {new_id}")
    edits = edits_of(runtime, ob.id)
    assert len(edits) == 1 and edits[0]["paths"] == ["kwargs.x"]
    assert edits[0]["headers"] == ["go-int8", "kwargsrepr"] and edits[0]["new_message_id"] == new_id
    assert edits[0]["role"] == "cli" and edits[0]["user"]


def test_refusals_publish_nothing(shop: dict[str, Any]) -> None:
    app, runtime = shop["app"], shop["runtime"]
    with service_thread(app), worker(app):
        publish_task(app, shop["task"], {"order_id": 1, "x": "bad"})
        wait_until(lambda: obituaries.count(runtime) == 1, timeout=60, what="the burial")
    ob = obituaries.list_obituaries(runtime)[0]
    for args, why in (
        (("--header", "x-dlx-attempt=0"), "cannot be edited"),
        (("--header", "x-death=[]"), "cannot be edited"),
        (("--set", "kwargs.x=oops"), "must be JSON"),
        (("--set", "nope.x=1"), "start with args, kwargs or embed"),
        (("--set", "kwargs.x=1", "--to-queue", "nowhere-at-all"), "does not exist"),
    ):
        refused = run(app, "edit", ob.id, *args, "--replay")
        assert refused.exit_code == 1 and why in refused.stderr, (args, refused.stderr)
    missing = run(app, "edit", "no-such-obituary", "--set", "kwargs.x=1")
    assert missing.exit_code == 3
    assert queue_depth(Connection(app.conf.broker_url).channel(), app.conf.task_default_queue) == 0
    assert replayed_entries(runtime) == [] and edits_of(runtime, ob.id) == []


@pytest.fixture
def foreign(
    uid: str, key_prefix: str, vhost: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """A foreign queue (no Celery) whose consumer rejects protobuf events and a pickle."""
    descriptor_set, pb = shop_protos(tmp_path_factory.mktemp("edit-protos"))
    queue = f"shipments-{uid}"
    app = make_app(
        uid,
        broker_url=vhost,
        dlx_protobuf_descriptor_sets=[str(descriptor_set)],
        dlx_queues={queue: {"max_requeues": 0, "max_parks": 0}},
    )
    runtime = get_runtime(app)
    conn = app.connection_for_write()
    try:
        declare_foreign_queue(conn, app, queue)
        yield {"app": app, "runtime": runtime, "pb": pb, "queue": queue, "conn": conn}
    finally:
        runtime.reset_publisher()
        conn.release()


def test_an_edited_protobuf_event_is_consumed_with_the_new_field_value(
    foreign: dict[str, Any],
) -> None:
    app, runtime, pb, queue = foreign["app"], foreign["runtime"], foreign["pb"], foreign["queue"]
    event = pb.Shipment(
        order_id="o-1",
        address=pb.Shipment.Address(street="Main 1", city="Olso", country="NO"),
        items=[pb.Shipment.Item(sku="A", quantity=1, price_cents=100)],
        carrier=pb.Shipment.CARRIER_DHL,
    )
    [mid] = publish_and_reject(foreign["conn"], queue, [(b64(event), "application/octet-stream")])
    run_service(app, idle_timeout=1.0, install_signals=False)
    ob = obituaries.get_obituary(runtime, mid)
    assert ob is not None

    done = run_json(
        app,
        "edit",
        ob.id,
        "--set",
        'address.city="Oslo"',
        "--set",
        "items.0.quantity=2",
        "--header",
        'x-fixed-by="ops"',
        "--replay",
    )
    assert done["kind"] == "protobuf" and done["type_name"] == "shop.events.v1.Shipment"
    assert [(c["path"], c["before"], c["after"]) for c in done["changes"]] == [
        ("address.city", "Olso", "Oslo"),
        ("items.0.quantity", 1, 2),
    ]
    channel = foreign["conn"].connection.channel()
    got = None
    wait_until(lambda: queue_depth(channel, queue) == 1, what="the edited copy")
    got = channel.basic_get(queue, no_ack=True)
    assert isinstance(got, amqp.Message)
    shipped = pb.Shipment.FromString(base64.b64decode(got.body))
    assert shipped.address.city == "Oslo" and shipped.address.street == "Main 1"
    assert shipped.items[0].quantity == 2 and shipped.carrier == pb.Shipment.CARRIER_DHL
    assert got.properties["message_id"] == done["new_message_id"] != mid
    assert got.headers[EDITED_FROM_HEADER] == ob.id and got.headers["x-fixed-by"] == "ops"
    channel.close()


def test_a_pickle_is_refused_and_a_dry_run_publishes_nothing(foreign: dict[str, Any]) -> None:
    app, runtime, pb, queue = foreign["app"], foreign["runtime"], foreign["pb"], foreign["queue"]
    body = pickle.dumps({"order_id": "o-1", "x": 1})
    event = pb.PaymentFailed(order_id="o-2", reason="declined", code=51)
    pickled, proto = publish_and_reject(
        foreign["conn"],
        queue,
        [(body, "application/x-python-serialize"), (b64(event), "application/octet-stream")],
    )
    run_service(app, idle_timeout=1.0, install_signals=False)
    ob_pickle = obituaries.get_obituary(runtime, pickled)
    ob_proto = obituaries.get_obituary(runtime, proto)
    assert ob_pickle is not None and ob_proto is not None

    refused = run(app, "edit", ob_pickle.id, "--set", "x=2", "--replay")
    assert refused.exit_code == 1 and "pickle" in refused.stderr
    refused = run(app, "edit", ob_pickle.id, "--header", 'x-a="b"', "--replay")
    assert refused.exit_code == 1 and "pickle" in refused.stderr
    dry = run_json(app, "edit", ob_proto.id, "--set", "code=0", "--replay", "--dry-run")
    assert dry["changes"][0]["before"] == 51 and dry["replayed"] is False

    channel = foreign["conn"].connection.channel()
    assert queue_depth(channel, queue) == 0
    assert replayed_entries(runtime) == []
    for ob in (ob_pickle, ob_proto):
        again = obituaries.get_obituary(runtime, ob.id)
        assert again is not None and again.replays == []
    channel.close()


def test_an_edited_copy_can_go_to_another_queue(foreign: dict[str, Any], uid: str) -> None:
    app, runtime, pb, queue = foreign["app"], foreign["runtime"], foreign["pb"], foreign["queue"]
    other = f"shipments-retry-{uid}"
    channel = foreign["conn"].connection.channel()
    channel.queue_declare(other, durable=True, auto_delete=False)
    event = pb.PaymentFailed(order_id="o-3", reason="declined", code=51)
    [mid] = publish_and_reject(foreign["conn"], queue, [(b64(event), "application/octet-stream")])
    run_service(app, idle_timeout=1.0, install_signals=False)
    ob = obituaries.get_obituary(runtime, mid)
    assert ob is not None
    done = run_json(app, "edit", ob.id, "--set", "code=0", "--to-queue", other, "--replay")
    assert done["queue"] == other and done["to_queue"] == other
    wait_until(lambda: queue_depth(channel, other) == 1, what="the redirected edited copy")
    got = channel.basic_get(other, no_ack=True)
    assert pb.PaymentFailed.FromString(base64.b64decode(got.body)).code == 0
    assert got.headers["x-dlx-queue"] == other and got.headers[EDITED_FROM_HEADER] == ob.id
    assert queue_depth(channel, queue) == 0
    assert list(runtime.graveyard.redirects([ob.id])[0].values()) == [other]
    assert edits_of(runtime, ob.id)[0]["to_queue"] == other
    channel.close()
