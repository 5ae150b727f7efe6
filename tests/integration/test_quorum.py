"""Quorum work queues (``dlx_quorum = True``) with at-least-once dead-lettering, end to end.

A quorum queue dead-letters at-least-once (RabbitMQ keeps the message until the target queue
confirms it), which classic queues cannot; it also counts deliveries, so ``x-delivery-limit``
ends a loop of requeues no consumer code ever counted. Quorum queues work on one node too.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from celery import Celery

from celery_dlx.broker.topology import dlx_queue
from celery_dlx.ops import obituaries
from celery_dlx.service.loop import DLXService
from celery_dlx.wiring.runtime import get_runtime
from tests.chaos.harness import PROCESS_ACTIONS, ChaosPlan, run_chaos
from tests.integration.dlx_apps import drain_thread, make_app, service_thread, worker
from tests.integration.helpers import fates_of, wait_until


@pytest.fixture
def app(uid: str, key_prefix: str, vhost: str) -> Celery:
    """The test app on a virtual host of its own: a worker on quorum queues declares Celery's
    native delayed-delivery topology (``celery_delayed_*``), shared by every app of a virtual
    host, so it goes with this one's."""
    return make_app(uid, broker_url=vhost, dlx_quorum=True, dlx_delivery_limit=20)


@pytest.fixture
def service(app: Celery) -> Iterator[DLXService]:
    with service_thread(app) as svc:
        yield svc


def queue_facts(broker_url: str, *names: str) -> dict[str, dict[str, Any]]:
    """Type and arguments of queues of ``broker_url``'s virtual host, as the broker reports them."""
    vhost = urllib.parse.unquote(urllib.parse.urlsplit(broker_url).path[1:]) or "/"
    out = subprocess.run(
        [
            "rabbitmqctl",
            "-q",
            "list_queues",
            "-p",
            vhost,
            "--formatter",
            "json",
            "name",
            "type",
            "arguments",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    rows = {row["name"]: row for row in json.loads(out)}
    return {
        name: {"type": rows[name]["type"], **{k: v for k, _, v in rows[name]["arguments"]}}
        for name in names
    }


def test_work_and_service_queues_are_quorum_queues_dead_lettering_at_least_once(
    app: Celery, uid: str, vhost: str
) -> None:
    with app.connection_for_write() as conn:
        for queue in app.amqp.queues.values():
            queue(conn.default_channel).declare()
    facts = queue_facts(vhost, f"work-{uid}", f"dead-{uid}")
    work = facts[f"work-{uid}"]
    assert work["type"] == "quorum" and work["x-dead-letter-strategy"] == "at-least-once"
    assert work["x-overflow"] == "reject-publish" and work["x-delivery-limit"] == 20
    assert work["x-dead-letter-exchange"] == f"dlx-{uid}"
    assert facts[f"dead-{uid}"]["type"] == "quorum"


def test_fates_end_to_end_on_quorum_queues(
    app: Celery,
    uid: str,
    service: DLXService,
    redis_client: Any,
    key_prefix: str,
    keys: Any,
) -> None:
    runs = "{" + key_prefix + "}:test:runs"
    runtime = get_runtime(app)

    @app.task(name=f"flaky-{uid}")
    def flaky() -> str:
        if redis_client.incr(runs) <= 3:
            raise ConnectionError("upstream down")
        return "ok"

    @app.task(name=f"poison-{uid}")
    def poison(order: int) -> None:
        raise ValueError(f"order {order} has no customer")

    with worker(app), drain_thread(app):
        good, bad = flaky.delay(), poison.delay(7)
        wait_until(lambda: obituaries.count(runtime) == 1, timeout=60, what="the burial")
        wait_until(
            lambda: "recovered" in fates_of(redis_client, keys, good.id),
            timeout=60,
            what="the recovery",
        )
    assert fates_of(redis_client, keys, good.id) == [
        "requeued",
        "requeued",
        "parked",
        "drained",
        "recovered",
    ]
    (ob,) = obituaries.list_obituaries(runtime)
    assert ob.message_id == bad.id and ob.attempt == 5 and ob.exc_type == "ValueError"
    assert "order 7 has no customer" in ob.traceback
    assert ob.death_reason == "rejected" and ob.x_death[0]["queue"] == f"work-{uid}"


def test_delivery_limit_dead_letters_what_a_consumer_requeues_forever(
    app: Celery, uid: str, service: DLXService, vhost: str
) -> None:
    """A foreign consumer that nacks with requeue=True never counts attempts; the quorum queue's
    ``x-delivery-limit`` does, dead-letters the message at-least-once, and it is buried."""
    name = f"loop-{uid}"
    runtime = get_runtime(app)
    with app.connection_for_write() as conn:
        dlx_queue(
            name,
            exchange="",
            routing_key=name,
            dlx=f"dlx-{uid}",
            service=f"dead-{uid}",
            quorum=True,
            delivery_limit=3,
        )(conn.default_channel).declare()
    connection = pika.BlockingConnection(pika.URLParameters(vhost))
    channel = connection.channel()
    deliveries: list[int] = []
    try:
        channel.basic_publish(
            "", name, b"{}", pika.BasicProperties(message_id="looping", delivery_mode=2)
        )

        def nack(ch: Any, method: Any, props: Any, body: bytes) -> None:
            deliveries.append(int((props.headers or {}).get("x-delivery-count", 0)))
            ch.basic_nack(method.delivery_tag, requeue=True)

        channel.basic_consume(name, nack)
        deadline = time.monotonic() + 60
        while obituaries.count(runtime) == 0 and time.monotonic() < deadline:
            connection.process_data_events(time_limit=0.1)
    finally:
        connection.close()
    (ob,) = obituaries.list_obituaries(runtime)
    assert ob.message_id == "looping" and ob.queue == name
    assert ob.reason == f"delivery limit reached in {name} (x-delivery-limit)"
    assert ob.death_reason == "delivery_limit"
    assert len(deliveries) == 4  # the first delivery and three redeliveries


def test_nothing_is_lost_on_quorum_queues_while_processes_and_redis_die(vhost: str) -> None:
    """The chaos run on quorum queues: kill -9 of workers, services, drains, Redis restarts
    (on a virtual host of its own, as the app above)."""
    plan = ChaosPlan(
        messages=200,
        workers=1,
        drains=1,
        publish_seconds=6.0,
        chaos_seconds=10.0,
        settle_seconds=90.0,
        gap=(0.8, 1.5),
        actions=PROCESS_ACTIONS,
        quorum=True,
        seed=23,
        broker_url=vhost,
    )
    report = run_chaos(plan)
    print("\n".join(["quorum chaos accounting:", *report.lines()]))
    assert report.sent == 200 and report.lost == 0, report.lost_ids[:20]
    assert report.settled and report.pending == 0
    assert report.done + report.buried == report.sent
    assert report.by_kind["poison"].get("done", 0) == 0
