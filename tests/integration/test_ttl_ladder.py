"""The TTL delay-queue ladder on the real RabbitMQ: parks return through the broker alone."""

from __future__ import annotations

import json
import socket
import threading
from typing import Any

import pytest
from amqp.exceptions import NotFound, PreconditionFailed
from celery import Celery
from kombu import Exchange, Queue

from celery_dlx import Park
from celery_dlx.broker.ladder import delay_queue_arguments
from celery_dlx.broker.topology import dlx_queue
from celery_dlx.fates import BURIED, PARKED
from celery_dlx.message.copies import delivery_headers
from celery_dlx.message.names import (
    ATTEMPT_HEADER,
    HISTORY_HEADER,
    PARKS_HEADER,
    QUEUE_HEADER,
    REQUEUES_HEADER,
)
from celery_dlx.message.outgoing import PUBLISH_SEQ_HEADER
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.ops import obituaries
from celery_dlx.ops.ladders import ladder_depths
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.dlx_apps import make_app, queue_names, service_thread, worker
from tests.integration.helpers import fates_of, queue_depth, wait_until

#: Headers the broker adds when a delay queue's TTL dead-letters a message.
EXPIRY_HEADERS = {
    "x-death",
    "x-first-death-exchange",
    "x-first-death-queue",
    "x-first-death-reason",
}


def ttl_app(uid: str, cleanup_queues: list[str], **conf: Any) -> Celery:
    app = make_app(uid, dlx_delay_backend="ttl", **conf)
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:dlx-{uid}")
    return app


def exists(broker: Any, name: str) -> bool:
    channel = broker.connection.channel()
    try:
        channel.queue_declare(name, passive=True)
    except NotFound:
        return False
    channel.close()
    return True


def take(broker: Any, queue: str, what: str) -> Any:
    """Wait for one message on ``queue`` and take it (acked)."""
    channel = broker.channel()
    return wait_until(lambda: channel.basic_get(queue, no_ack=True), what=what)


def parked(queue: str, delay_ms: int, message_id: str = "m-1") -> ParkedMessage:
    history = json.dumps([[1, "requeued", "c1"], [2, "parked", "c1"]])
    return ParkedMessage(
        message_id=message_id,
        attempt=3,
        queue=queue,
        body=b"[[1], {}, {}]",
        headers={
            ATTEMPT_HEADER: 3,
            REQUEUES_HEADER: 1,
            PARKS_HEADER: 2,
            HISTORY_HEADER: history,
            QUEUE_HEADER: queue,
            "id": message_id,
            "task": "orders.charge",
            # Left over from an earlier death: never republished.
            "x-death": [{"queue": "elsewhere", "reason": "rejected", "count": 9}],
            "x-first-death-queue": "elsewhere",
        },
        properties={"content_type": "application/json", "message_id": message_id},
        due_ms=10_000 + delay_ms,
        parked_ms=10_000,
        task="orders.charge",
    )


def test_a_park_returns_through_its_delay_queue_with_its_headers_as_parked(
    uid: str, broker: Any, cleanup_queues: list[str], redis_client: Any, keys: Any
) -> None:
    app = ttl_app(uid, cleanup_queues)
    work = f"work-{uid}"
    broker.channel().queue_declare(work, durable=True, auto_delete=False)
    delay_queue = f"{work}_dlq_0.5"
    assert not exists(broker, delay_queue)  # declared on demand

    message = parked(work, delay_ms=300)  # rounds up to the 0.5 s step
    assert get_runtime(app).park(message) is True

    got = take(broker, work, "the retry back on its work queue")
    sent = {k: v for k, v in message.headers.items() if k not in EXPIRY_HEADERS}
    assert {k: got.headers[k] for k in sent} == sent  # attempt and history as written at park
    assert set(got.headers) - set(sent) == EXPIRY_HEADERS | {PUBLISH_SEQ_HEADER}
    [death] = got.headers["x-death"]  # the earlier death was stripped; the ladder's is new
    assert (death["queue"], death["reason"], death["exchange"]) == (delay_queue, "expired", "")
    assert got.headers["x-first-death-queue"] == delay_queue
    assert got.body == message.body
    assert got.properties["message_id"] == "m-1"
    assert got.properties["content_type"] == "application/json"
    assert got.delivery_info["routing_key"] == work and got.delivery_info["exchange"] == ""
    # Nothing went to Redis.
    assert redis_client.exists(keys.parked_due, keys.parked_meta, keys.history) == 0

    # The delay queue stays declared with exactly these arguments (x-expires included): the
    # same declaration is accepted, another is refused.
    channel = broker.connection.channel()
    args = delay_queue_arguments(work, 500)
    channel.queue_declare(delay_queue, durable=True, auto_delete=False, arguments=args)
    with pytest.raises(PreconditionFailed):
        channel.queue_declare(
            delay_queue,
            durable=True,
            auto_delete=False,
            arguments={**args, "x-expires": args["x-expires"] + 1},
        )


def test_a_quorum_ladder_returns_messages_too(
    uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    app = ttl_app(uid, cleanup_queues, dlx_quorum=True, dlx_ttl_ladder=[0.2])
    cleanup_queues.append(f"quorum-{uid}_dlq_0.2")
    work = f"quorum-{uid}"
    cleanup_queues.append(work)
    broker.channel().queue_declare(work, durable=True, auto_delete=False)
    get_runtime(app).park(parked(work, delay_ms=200))
    got = take(broker, work, "the retry from the quorum delay queue")
    assert got.headers["x-death"][0]["queue"] == f"{work}_dlq_0.2"
    assert got.headers[ATTEMPT_HEADER] == 3
    channel = broker.connection.channel()  # it is the quorum queue the ladder declares
    args = delay_queue_arguments(work, 200, quorum=True)
    channel.queue_declare(f"{work}_dlq_0.2", durable=True, auto_delete=False, arguments=args)


def test_ladder_depths_counts_the_waiting_retries_of_existing_delay_queues(
    uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    app = ttl_app(uid, cleanup_queues, dlx_ttl_ladder=[0.2, 600])
    work = f"work-{uid}"
    cleanup_queues.append(f"{work}_dlq_600")
    broker.channel().queue_declare(work, durable=True, auto_delete=False)
    runtime = get_runtime(app)
    for i in range(3):
        runtime.park(parked(work, delay_ms=10_000, message_id=f"m-{i}"))  # waits 600 s
    expected = [
        {
            "queue": work,
            "delay_queue": f"{work}_dlq_600",
            "delay_seconds": 600.0,
            "messages": 3,
            "consumers": 0,
        }
    ]
    assert ladder_depths(runtime) == expected  # the app's queue; the 0.2 s rung was never used
    assert ladder_depths(runtime, queues=[work, f"other-{uid}"]) == expected
    assert not exists(broker, f"other-{uid}_dlq_600")


def test_a_fanout_queue_retry_through_the_ladder_returns_only_to_that_queue(
    uid: str, redis_client: Any, key_prefix: str, broker: Any, cleanup_queues: list[str]
) -> None:
    fan = Exchange(f"fan-{uid}", type="fanout")
    app = ttl_app(
        uid,
        cleanup_queues,
        task_queues=[Queue(f"a-{uid}", fan), Queue(f"b-{uid}", fan)],
        task_default_exchange=fan.name,
        task_default_exchange_type="fanout",
        dlx_max_requeues=0,
    )
    cleanup_queues.append(f"exchange:fan-{uid}")
    runs = "{" + key_prefix + "}:test:runs"
    seen: list[dict[str, Any]] = []

    @app.task(name=f"fan-{uid}", bind=True)
    def handler(self: Any) -> None:
        seen.append(delivery_headers(self.request))
        if redis_client.incr(runs) == 1:
            raise Park(countdown=0.1)

    channel = broker.channel()
    app.amqp.queues[f"b-{uid}"](channel).declare()  # b has no consumer in this test
    with worker(app, queues=[f"a-{uid}"]):
        handler.apply_async(exchange=fan.name, routing_key="any", exchange_type="fanout")
        wait_until(lambda: int(redis_client.get(runs) or 0) == 2, what="the retry on queue a")
    assert seen[1]["x-death"][0]["queue"] == f"a-{uid}_dlq_0.2"  # it came through the ladder
    assert seen[1][ATTEMPT_HEADER] == 1 and seen[1][QUEUE_HEADER] == f"a-{uid}"
    # Queue b got the one fanout copy and nothing of a's retry.
    assert queue_depth(channel, f"b-{uid}") == 1
    assert queue_depth(channel, f"a-{uid}") == 0
    assert not exists(broker, f"b-{uid}_dlq_0.2")


def service(app: Celery) -> Any:
    return service_thread(app)


def test_a_burial_after_a_ladder_return_is_the_work_queues_death_not_the_ladders(
    uid: str, redis_client: Any, keys: Any, broker: Any, cleanup_queues: list[str]
) -> None:
    app = ttl_app(uid, cleanup_queues, dlx_max_requeues=0, dlx_max_parks=1)
    runtime = get_runtime(app)

    @app.task(name=f"poison-{uid}")
    def poison() -> None:
        raise ValueError("no such customer")

    with worker(app), service(app):
        result = poison.delay()
        wait_until(lambda: obituaries.count(runtime) == 1, what="the obituary")
    [ob] = obituaries.list_obituaries(runtime, message_id=result.id)
    work = f"work-{uid}"
    assert ob.queue == work and ob.death_reason == "rejected"
    assert [(d["queue"], d["reason"]) for d in ob.x_death] == [
        (work, "rejected"),  # newest first: the work queue's own rejection
        (f"{work}_dlq_0.2", "expired"),
    ]
    assert ob.exc_type == "ValueError" and ob.attempt == 2
    assert [a.fate for a in ob.attempts] == [PARKED, BURIED]
    assert fates_of(redis_client, keys, result.id) == [PARKED, BURIED]
    assert redis_client.zcard(keys.parked_due) == 0


def test_the_service_parks_foreign_dead_letters_through_the_ladder(
    uid: str, redis_client: Any, keys: Any, broker: Any, cleanup_queues: list[str]
) -> None:
    billing = f"billing-{uid}"
    app = ttl_app(
        uid,
        cleanup_queues,
        dlx_queues={billing: {"max_requeues": 0, "max_parks": 1, "backoff": [0.2]}},
    )
    cleanup_queues.extend([billing, f"{billing}_dlq_0.2"])
    runtime = get_runtime(app)
    channel = broker.channel()
    dlx_queue(billing, exchange="", dlx=f"dlx-{uid}", service=f"dead-{uid}")(channel).declare()
    channel.basic_publish(
        channel.prepare_message(b"invoice 7", properties={"message_id": "inv-7"}),
        exchange="",
        routing_key=billing,
    )
    reader = broker.connection.channel()  # a foreign consumer: it rejects without requeue
    deliveries = []
    with service(app):
        for n in (1, 2):
            msg = wait_until(lambda: reader.basic_get(billing), what=f"delivery {n}")
            deliveries.append(msg.headers or {})
            reader.basic_reject(msg.delivery_tag, requeue=False)
        wait_until(lambda: obituaries.count(runtime) == 1, what="the obituary")
    assert ATTEMPT_HEADER not in deliveries[0]
    retry = deliveries[1]  # parked by the service, returned by the broker
    assert (
        retry[ATTEMPT_HEADER] == 1 and retry[PARKS_HEADER] == 1 and retry[QUEUE_HEADER] == billing
    )
    assert [(d["queue"], d["reason"]) for d in retry["x-death"]] == [
        (f"{billing}_dlq_0.2", "expired")
    ]
    [ob] = obituaries.list_obituaries(runtime, message_id="inv-7")
    assert ob.queue == billing and ob.death_reason == "rejected" and ob.attempt == 2
    assert ob.x_death[1]["queue"] == f"{billing}_dlq_0.2"
    assert [a.fate for a in ob.attempts] == [PARKED, BURIED]
    assert redis_client.zcard(keys.parked_due) == 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_with_ttl_a_redis_outage_does_not_change_a_fate(
    uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    app = ttl_app(
        uid,
        cleanup_queues,
        dlx_redis_url=f"redis://127.0.0.1:{free_port()}/0",  # nothing listens there
        dlx_max_requeues=0,
    )
    runs: list[dict[str, Any]] = []
    done = threading.Event()

    @app.task(name=f"flaky-{uid}", bind=True)
    def flaky(self: Any) -> None:
        runs.append(delivery_headers(self.request))
        if len(runs) == 1:
            raise ConnectionError("upstream down")
        done.set()

    with worker(app):
        flaky.delay()
        assert done.wait(60), "the parked retry never ran"
    assert len(runs) == 2
    assert runs[1][ATTEMPT_HEADER] == 1 and runs[1][PARKS_HEADER] == 1
    assert runs[1]["x-death"][0]["queue"] == f"work-{uid}_dlq_0.2"
    assert queue_depth(broker.channel(), f"dead-{uid}") == 0  # parked, not handed to the DLX


def test_a_delay_queue_deleted_while_the_cache_trusts_it_is_declared_again(
    uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    app = ttl_app(uid, cleanup_queues)
    work = f"work-{uid}"
    broker.channel().queue_declare(work, durable=True, auto_delete=False)
    runtime = get_runtime(app)
    runtime.park(parked(work, delay_ms=200, message_id="m-1"))
    take(broker, work, "the first retry")
    broker.channel().queue_delete(f"{work}_dlq_0.2")  # by hand, within the declare refresh
    runtime.park(parked(work, delay_ms=200, message_id="m-2"))  # returned, declared, published
    again = take(broker, work, "the second retry")
    assert again.properties["message_id"] == "m-2"
