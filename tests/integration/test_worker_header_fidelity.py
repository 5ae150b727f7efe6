"""A Celery task message from another client, with headers py-amqp cannot read, through a real worker.

A Go service publishing Celery task messages can add headers py-amqp raises on (a 1969 timestamp,
written as amqp091-go's unsigned wrap-around; a year-10000 timestamp) or would write back as
other types (int8, float32, a byte array, int64). The worker must run the task, and its requeued
copy and its parked-then-drained copy must carry each of those headers byte for byte.
"""

from __future__ import annotations

import json
import struct
import uuid
from datetime import datetime
from typing import Any

import pytest
from kombu import Connection

import celery_dlx
from celery_dlx.broker.publish import EncodedMessage
from celery_dlx.message.fieldtable import encode_value, table_entries, write_properties
from celery_dlx.message.names import WIRE_HEADERS_PROPERTY
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL
from tests.integration.dlx_apps import drain_thread, make_app, queue_names, worker
from tests.integration.helpers import wait_until

pytestmark = pytest.mark.integration


def short(raw: bytes) -> bytes:
    return bytes((len(raw),)) + raw


#: Headers as amqp091-go writes them, raw: name -> encoded field.
FOREIGN = {
    b"go-1969": b"T" + struct.pack(">Q", 2**64 - 86400),
    b"go-year-10000": b"T" + struct.pack(">Q", 253_402_300_800 + 86_400),
    b"go-int8": b"b" + struct.pack(">b", -128),
    b"go-float32": b"f" + struct.pack(">f", 1.5),
    b"go-int64": b"l" + struct.pack(">q", -(2**63)),
    b"go-sig": b"x" + struct.pack(">I", 4) + b"\xff\x00\x80\x7f",
}


def test_a_go_task_message_runs_and_its_copies_keep_every_header(uid: str) -> None:
    app = make_app(uid, dlx_max_requeues=1, dlx_max_parks=1, dlx_backoff=[0.2])
    seen: list[dict[str, Any]] = []

    @app.task(name=f"probe-{uid}", bind=True, acks_late=True)
    def probe(self: Any) -> str:
        seen.append(dict(self.request.properties or {}))
        if len(seen) == 1:
            raise celery_dlx.Requeue()
        if len(seen) == 2:
            raise celery_dlx.Park(countdown=0.2)
        return "ok"

    task_id = str(uuid.uuid4())
    headers, _properties, body, _ = app.amqp.as_task_v2(task_id, probe.name, (), {})
    celery = b"".join(short(k.encode()) + encode_value(v) for k, v in headers.items())
    table = celery + b"".join(short(k) + v for k, v in FOREIGN.items())
    encoded = write_properties(
        {
            "content_type": "application/json",
            "content_encoding": "utf-8",
            "correlation_id": task_id,
            "delivery_mode": 2,
        },
        table,
    )
    queue = app.conf.task_default_queue
    try:
        with worker(app), drain_thread(app, 0.1):
            with Connection(BROKER_URL) as conn:
                conn.default_channel.basic_publish(
                    EncodedMessage(json.dumps(body).encode(), encoded),
                    exchange="",
                    routing_key=queue,
                )
            wait_until(
                lambda: len(seen) >= 3, what="three runs: first, requeued copy, drained park"
            )
        first, requeued, drained = seen[:3]
        assert first["application_headers"]["go-1969"] == datetime(1969, 12, 31)
        assert first["application_headers"]["go-year-10000"] == 253_402_300_800 + 86_400
        for name, run in (("requeued", requeued), ("drained", drained)):
            got = dict(table_entries(run[WIRE_HEADERS_PROPERTY]))
            changed = [k for k, v in FOREIGN.items() if got.get(k) != v]
            assert not changed, f"the {name} copy changed {changed}"
            assert not any(k.startswith(b"x-death") for k in got), name
    finally:
        runtime = get_runtime(app)
        with Connection(BROKER_URL) as conn:
            channel = conn.default_channel
            for name in queue_names(app):
                channel.queue_delete(name)
            channel.exchange_delete(app.conf.dlx_exchange)
        keys = list(runtime.redis.scan_iter(match=f"*test-{uid}*"))
        if keys:
            runtime.redis.delete(*keys)
