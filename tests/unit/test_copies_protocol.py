"""Copies keep the task protocol of the delivery (1 or 2), Celery's retry count and new arguments.

The protocol 1 request is made as the worker makes it: ``as_task_v1``, an AMQP message, Celery's
``proto1_to_proto2`` (the strategy's step) and its ``Request``.
"""

from __future__ import annotations

import uuid
from typing import Any

import amqp
import pytest
from celery import Celery
from celery.app.task import Context
from celery.worker.request import Request
from celery.worker.strategy import proto1_to_proto2
from kombu import serialization
from kombu.transport.pyamqp import Message

from celery_dlx.broker.copies import celery_copy
from celery_dlx.message.copies import task_protocol
from celery_dlx.message.headers import DLXState, read_state
from tests.unit.test_copies import delivered

STATE = DLXState(attempt=1, requeues=1, queue="work")


@pytest.fixture(scope="module")
def app() -> Celery:
    app = Celery("copies-v1", set_as_current=False, broker="amqp://nobody:nothing@127.0.0.1:1//")

    @app.task(name="proj.add", shared=False)
    def add(x: int, y: int, z: int = 0) -> int:
        return x + y + z

    app.finalize()
    return app


def delivered_v1(app: Celery, retries: int = 2) -> Context:
    task_id = str(uuid.uuid4())
    msg = app.amqp.as_task_v1(
        task_id, "proj.add", (1, 2), {"z": 3}, retries=retries, countdown=None
    )
    ctype, enc, payload = serialization.dumps(msg.body, serializer="json")
    raw = amqp.Message(
        payload,
        content_type=ctype,
        content_encoding=enc,
        application_headers={"x-tenant": "acme", "x-death": [{"queue": "work"}]},
        priority=4,
        **msg.properties,
    )
    raw.delivery_info = {
        "exchange": "",
        "routing_key": "work",
        "redelivered": False,
        "delivery_tag": 1,
        "consumer_tag": "ctag",
        "priority": 4,
    }
    message = Message(raw, channel=None, accept=[ctype])
    body, headers, decoded, utc = proto1_to_proto2(message, message.decode())
    request = Request(
        message,
        app=app,
        task=app.tasks["proj.add"],
        body=body,
        headers=headers,
        decoded=decoded,
        utc=utc,
    )
    (args, kwargs, embed) = body
    context = dict(request.request_dict)
    context.update({"args": args, "kwargs": kwargs, "is_eager": False}, **(embed or {}))
    context["properties"] = {**message.properties, "application_headers": dict(message.headers)}
    context["delivery_info"] = raw.delivery_info
    return Context(context)


def loads(copy: Any) -> Any:
    return serialization.loads(
        copy.body,
        copy.properties["content_type"],
        copy.properties["content_encoding"],
        accept=[copy.properties["content_type"]],
    )


def test_protocol_1_copy_is_a_protocol_1_message(app: Celery) -> None:
    request = delivered_v1(app, retries=2)
    assert task_protocol(request.properties["application_headers"]) == 1
    copy = celery_copy(request, state=STATE, routing_key="work", retries=3)
    body = loads(copy)
    assert isinstance(body, dict)
    assert (body["task"], body["id"], body["args"], body["kwargs"]) == (
        "proj.add",
        request.id,
        [1, 2],
        {"z": 3},
    )
    assert body["retries"] == 3
    assert "task" not in copy.headers and "id" not in copy.headers  # still no task headers
    assert copy.headers["x-tenant"] == "acme" and "x-death" not in copy.headers
    assert read_state(copy.headers) == STATE
    assert copy.properties["correlation_id"] == request.id
    assert copy.properties["priority"] == 4


def test_protocol_1_copy_keeps_the_retry_count_unless_told(app: Celery) -> None:
    request = delivered_v1(app, retries=2)
    assert loads(celery_copy(request, state=STATE, routing_key="work"))["retries"] == 2


def test_protocol_2_copy_carries_retries_and_new_arguments() -> None:
    app2 = Celery("copies-v2", set_as_current=False, broker="amqp://nobody:nothing@127.0.0.1:1//")

    @app2.task(name="proj.add", shared=False)
    def add(x: int, y: int, z: int = 0) -> int:
        return x + y + z

    app2.finalize()
    request = delivered(app2)
    copy = celery_copy(
        request, state=STATE, routing_key="work", retries=5, args=(7, 8), kwargs={"z": 9}
    )
    assert task_protocol(copy.headers) == 2
    assert copy.headers["retries"] == 5 and copy.headers["task"] == "proj.add"
    args, kwargs, _embed = loads(copy)
    assert (args, kwargs) == ([7, 8], {"z": 9})
