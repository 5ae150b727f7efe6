"""Copies of a running task's message, from the request Celery's worker builds for a delivery.

The request is made the way the worker makes it: Celery's own task message (``as_task_v2``),
encoded and sent as an AMQP message, received as a kombu message, turned into Celery's worker
``Request``, its body decoded and merged into the task ``Context``. No broker is involved.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import amqp
import pytest
from celery import Celery
from celery.app.task import Context
from celery.worker.request import Request
from kombu import serialization
from kombu.compression import compress, decompress
from kombu.transport.pyamqp import Message

from celery_dlx.broker.copies import celery_copy
from celery_dlx.broker.publish import amqp_message
from celery_dlx.message.copies import delivery_headers
from celery_dlx.message.headers import DLXState, HistoryEntry, read_state, state_headers
from celery_dlx.message.names import DELIVERY_QUEUE_HEADER, REASON_HEADER

AT_MS = 1_700_000_000_000
BROKER_HEADERS = {
    "x-death": [{"queue": "work", "reason": "rejected", "count": 1, "exchange": ""}],
    "x-first-death-queue": "work",
    "x-first-death-reason": "rejected",
    "x-first-death-exchange": "",
    "x-last-death-queue": "work",
    "x-last-death-reason": "rejected",
    "x-last-death-exchange": "",
    "x-delivery-count": 2,
    DELIVERY_QUEUE_HEADER: "work",
}
CUSTOM_HEADERS = {"x-tenant": "acme", "x-trace": "t-1"}
STATE = DLXState(
    attempt=2,
    requeues=1,
    parks=1,
    history=(HistoryEntry(AT_MS, "requeued", "c"), HistoryEntry(AT_MS + 5, "parked", "c")),
    queue="work",
    first_failure_ms=AT_MS,
    cause="c",
    exc_type="ValueError",
    exc_message="bad",
)


@pytest.fixture(scope="module")
def app() -> Celery:
    app = Celery("copies", set_as_current=False, broker="amqp://nobody:nothing@127.0.0.1:1//")

    @app.task(name="proj.add", shared=False)
    def add(x: int, y: int, z: int = 0) -> int:
        return x + y + z

    @app.task(name="proj.report", shared=False)
    def report(*args: Any) -> None:
        return None

    app.finalize()
    return app


def delivered(
    app: Celery,
    args: tuple[Any, ...] = (1, 2),
    kwargs: dict[str, Any] | None = None,
    *,
    serializer: str = "json",
    compression: str | None = None,
    priority: int | None = 3,
    headers: dict[str, Any] | None = None,
    **options: Any,
) -> Context:
    """The task ``Context`` a worker child runs with for one delivery of ``proj.add``."""
    task_id = str(uuid.uuid4())
    celery_headers, properties, body, _ = app.amqp.as_task_v2(
        task_id, "proj.add", args, kwargs if kwargs is not None else {"z": 3}, **options
    )
    content_type, encoding, payload = serialization.dumps(body, serializer=serializer)
    all_headers = {**celery_headers, **BROKER_HEADERS, **CUSTOM_HEADERS, **(headers or {})}
    if compression:
        payload, all_headers["compression"] = compress(payload, compression)
    raw = amqp.Message(
        payload,
        content_type=content_type,
        content_encoding=encoding,
        application_headers=all_headers,
        delivery_mode=2,
        **({"priority": priority} if priority is not None else {}),
        **properties,
    )
    raw.delivery_info = {
        "exchange": "",
        "routing_key": "work",
        "redelivered": False,
        "delivery_tag": 1,
        "consumer_tag": "ctag",
    }
    message = Message(raw, channel=None, accept=[content_type])
    request = Request(message, app=app, task=app.tasks["proj.add"])
    context = dict(request.request_dict)
    got_args, got_kwargs, embed = serialization.loads(
        message.body, message.content_type, message.content_encoding, accept=[content_type]
    )
    context.update({"args": got_args, "kwargs": got_kwargs, "is_eager": False}, **(embed or {}))
    return Context(context)


def decode(body: bytes, properties: dict[str, Any], headers: dict[str, Any]) -> Any:
    if headers.get("compression"):
        body = decompress(body, headers["compression"])
    return serialization.loads(
        body,
        properties["content_type"],
        properties["content_encoding"],
        accept=[properties["content_type"]],
    )


def test_copy_has_the_same_task_message_with_new_state_headers(app: Celery) -> None:
    request = delivered(app)
    copy = celery_copy(request, state=STATE, routing_key="work")
    original = request.properties["application_headers"]
    celery_headers = {k: v for k, v in original.items() if k not in BROKER_HEADERS}
    assert copy.headers == {**celery_headers, **state_headers(STATE)}
    assert copy.headers["id"] == request.id and copy.headers["task"] == "proj.add"
    assert read_state(copy.headers) == STATE
    assert (copy.routing_key, copy.exchange) == ("work", "")
    # The delivery the worker still holds is left as it was.
    assert "x-death" in request.properties["application_headers"]


@pytest.mark.parametrize("header", sorted(BROKER_HEADERS))
def test_copy_never_carries_broker_headers(app: Celery, header: str) -> None:
    copy = celery_copy(delivered(app), state=STATE, routing_key="work")
    assert header not in copy.headers
    assert header not in amqp_message(copy, 1).application_headers


def test_copy_properties(app: Celery) -> None:
    request = delivered(app)
    copy = celery_copy(request, state=STATE, routing_key="work")
    assert copy.properties == {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 2,
        "priority": 3,
        "correlation_id": request.id,
        "reply_to": "",
    }
    assert isinstance(copy.body, bytes)


@pytest.mark.parametrize(
    ("args", "kwargs"),
    [
        ((1, 2), {"z": 3}),
        ((), {}),
        (("caf\u00e9", "\u2603", None, 1.5, [1, {"a": [True]}]), {"nested": {"list": [1, 2]}}),
        ((10**20,), {"x": ""}),
    ],
)
def test_json_body_round_trips_args_kwargs_and_embed(
    app: Celery, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    callback = app.tasks["proj.report"].s("done")
    errback = app.tasks["proj.report"].si("failed")
    request = delivered(app, args, kwargs, callbacks=[callback], errbacks=[errback])
    copy = celery_copy(request, state=STATE, routing_key="work")
    got_args, got_kwargs, embed = decode(copy.body, copy.properties, copy.headers)
    assert (got_args, got_kwargs) == (list(args), kwargs)
    assert embed == {
        "callbacks": [json.loads(json.dumps(callback))],
        "errbacks": [json.loads(json.dumps(errback))],
        "chain": None,
        "chord": None,
    }


def test_body_is_reencoded_with_the_delivery_serializer(app: Celery) -> None:
    request = delivered(app, (1, b"\x00raw"), {"z": 3}, serializer="pickle")
    copy = celery_copy(request, state=STATE, routing_key="work", default_serializer="json")
    assert copy.properties["content_type"] == "application/x-python-serialize"
    args, kwargs, _ = decode(copy.body, copy.properties, copy.headers)
    assert (args, kwargs) == ([1, b"\x00raw"], {"z": 3})


@pytest.mark.parametrize("content_type", [None, "application/x-unknown"])
def test_unknown_content_type_falls_back_to_the_default_serializer(
    app: Celery, content_type: str | None
) -> None:
    request = delivered(app)
    request.properties = {**request.properties, "content_type": content_type}
    copy = celery_copy(request, state=STATE, routing_key="work", default_serializer="json")
    assert copy.properties["content_type"] == "application/json"
    assert decode(copy.body, copy.properties, copy.headers)[:2] == [[1, 2], {"z": 3}]


@pytest.mark.parametrize("compression", ["zlib", "bzip2"])
def test_compressed_delivery_gives_a_compressed_copy(app: Celery, compression: str) -> None:
    request = delivered(app, (1, "x" * 1000), compression=compression)
    copy = celery_copy(request, state=STATE, routing_key="work")
    assert copy.headers["compression"] == request.properties["application_headers"]["compression"]
    assert b"x" * 100 not in copy.body
    assert decode(copy.body, copy.properties, copy.headers)[:2] == [[1, "x" * 1000], {"z": 3}]


@pytest.mark.parametrize(("priority", "expected"), [(None, None), (0, 0), (9, 9)])
def test_priority_comes_from_the_delivery(
    app: Celery, priority: int | None, expected: int | None
) -> None:
    copy = celery_copy(delivered(app, priority=priority), state=STATE, routing_key="work")
    assert copy.properties.get("priority") == expected


def test_destination_and_extra_headers(app: Celery) -> None:
    copy = celery_copy(
        delivered(app),
        state=DLXState(attempt=2, queue="work"),
        routing_key="work",
        exchange="celery_dlx",
        extra_headers={REASON_HEADER: "undecodable: x-death", "x-tenant": "override"},
    )
    assert (copy.routing_key, copy.exchange) == ("work", "celery_dlx")
    assert copy.headers[REASON_HEADER] == "undecodable: x-death"
    assert copy.headers["x-tenant"] == "override"


def test_delivery_headers_prefer_the_full_amqp_table(app: Celery) -> None:
    request = delivered(app)
    headers = delivery_headers(request)
    assert headers == request.properties["application_headers"]
    headers["x-tenant"] = "changed"
    assert request.properties["application_headers"]["x-tenant"] == "acme"


@pytest.mark.parametrize("properties", [{}, None, {"application_headers": None}])
def test_delivery_headers_fall_back_to_request_headers(properties: Any) -> None:
    request = Context(properties=properties, headers={"id": "t-1", "x-death": "junk"})
    assert delivery_headers(request) == {"id": "t-1", "x-death": "junk"}
    request.headers = None
    assert delivery_headers(request) == {}


def test_copy_of_a_request_without_properties_uses_the_default_serializer() -> None:
    request = Context(
        properties=None,
        headers={"id": "t-1", "task": "proj.add", "x-death": "junk"},
        args=(1,),
        kwargs={},
    )
    copy = celery_copy(request, state=DLXState(attempt=1), routing_key="work")
    assert copy.headers == {"id": "t-1", "task": "proj.add", **state_headers(DLXState(attempt=1))}
    assert copy.properties == {"content_type": "application/json", "content_encoding": "utf-8"}
    assert decode(copy.body, copy.properties, copy.headers) == [
        [1],
        {},
        {"callbacks": None, "errbacks": None, "chain": None, "chord": None},
    ]
