"""DLXTask fates end to end: a real worker, the real RabbitMQ and Redis.

Tests that park run with both delay backends (``delay_backend``): Redis with the drain, and the
broker-only TTL ladder.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from celery import signals
from kombu import Exchange, Queue

from celery_dlx import Bury, Park, TopologyError
from celery_dlx.message.names import ATTEMPT_HEADER, HISTORY_HEADER, QUEUE_HEADER, REASON_HEADER
from celery_dlx.store.causes import read_cause
from tests.integration.dlx_apps import (
    DELAY_BACKENDS,
    delays_returning,
    expected_fates,
    make_app,
    queue_names,
    worker,
)
from tests.integration.helpers import fates_of, get_all, queue_depth, wait_until

#: Tests that park run once per delay backend.
both_backends = pytest.mark.parametrize("delay_backend", DELAY_BACKENDS)


@pytest.fixture
def delay_backend() -> str:
    """The delay backend of ``app``; tests marked ``both_backends`` override it."""
    return "redis"


@pytest.fixture
def app(uid: str, key_prefix: str, cleanup_queues: list[str], delay_backend: str) -> Any:
    app = make_app(uid, dlx_delay_backend=delay_backend)
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:dlx-{uid}")
    return app


def runs_key(key_prefix: str, name: str) -> str:
    return "{" + key_prefix + "}:test:" + name


@both_backends
def test_flaky_message_succeeds_after_requeues_and_parks(
    app: Any, uid: str, redis_client: Any, key_prefix: str, keys: Any, delay_backend: str
) -> None:
    runs = runs_key(key_prefix, "runs")

    @app.task(name=f"flaky-{uid}", bind=True)
    def flaky(self: Any) -> str:
        n = redis_client.incr(runs)
        if n <= 3:
            raise ConnectionError(f"upstream down (run {n})")
        return "ok"

    with worker(app), delays_returning(app):
        result = flaky.delay()
        wait_until(
            lambda: b"recovered" in str(fates_of(redis_client, keys, result.id)).encode(),
            what="recovery",
        )
    assert int(redis_client.get(runs)) == 4
    assert fates_of(redis_client, keys, result.id) == expected_fates(
        ["requeued", "requeued", "parked", "drained", "recovered"], delay_backend
    )


@both_backends
def test_permanent_failure_is_buried_after_exactly_1_plus_n_plus_m_runs(
    app: Any,
    uid: str,
    redis_client: Any,
    key_prefix: str,
    keys: Any,
    broker: Any,
    delay_backend: str,
) -> None:
    runs = runs_key(key_prefix, "runs")

    @app.task(name=f"poison-{uid}")
    def poison(order: int) -> None:
        redis_client.incr(runs)
        raise ValueError(f"order {order} has no customer")

    channel = broker.channel()
    with worker(app), delays_returning(app):
        result = poison.delay(42)
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the dead letter")
    assert int(redis_client.get(runs)) == 1 + 2 + 2
    assert fates_of(redis_client, keys, result.id) == expected_fates(
        ["requeued", "requeued", "parked", "drained", "parked", "drained"], delay_backend
    )
    [dead] = get_all(channel, f"dead-{uid}")
    death = dead.headers["x-death"][0]
    assert death["reason"] == "rejected" and death["queue"] == f"work-{uid}"
    if delay_backend == "ttl":  # the newest death is the work queue's; the ladder's comes after
        assert [(d["queue"], d["reason"]) for d in dead.headers["x-death"][1:]] == [
            (f"work-{uid}_dlq_0.5", "expired")
        ]
    assert (
        dead.headers[ATTEMPT_HEADER] == 4
    )  # the buried delivery had failed 4 times before its last run
    history = json.loads(dead.headers[HISTORY_HEADER])
    assert [h[1] for h in history] == ["requeued", "requeued", "parked", "parked"]
    cause = read_cause(redis_client, keys, result.id)
    assert cause is not None
    assert cause.exc_type == "ValueError" and cause.attempt == 5
    assert "order 42 has no customer" in cause.traceback and "Traceback" in cause.traceback
    assert cause.task == f"poison-{uid}" and cause.queue == f"work-{uid}"


@both_backends
def test_explicit_fates_and_classification(
    app: Any,
    uid: str,
    redis_client: Any,
    key_prefix: str,
    keys: Any,
    broker: Any,
    delay_backend: str,
) -> None:
    runs = runs_key(key_prefix, "runs")

    @app.task(name=f"bury-{uid}")
    def bury_now() -> None:
        redis_client.incr(runs + ":bury")
        raise Bury("order cancelled upstream")

    @app.task(name=f"park-{uid}")
    def park_then_ok() -> None:
        if redis_client.incr(runs + ":park") == 1:
            raise Park(countdown=0.3)

    @app.task(name=f"classified-{uid}", dlx_bury_on=(KeyError,), dlx_park_on=(TimeoutError,))
    def classified(kind: str) -> None:
        n = redis_client.incr(runs + ":" + kind)
        if kind == "key":
            raise KeyError("missing field")
        if n == 1:
            raise TimeoutError("slow lookup")

    channel = broker.channel()
    with worker(app), delays_returning(app):
        b = bury_now.delay()
        p = park_then_ok.delay()
        k = classified.delay("key")
        t = classified.delay("timeout")
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 2, what="two burials")
        wait_until(lambda: "recovered" in fates_of(redis_client, keys, p.id), what="park recovery")
        wait_until(
            lambda: "recovered" in fates_of(redis_client, keys, t.id), what="timeout recovery"
        )
    assert int(redis_client.get(runs + ":bury")) == 1
    assert int(redis_client.get(runs + ":key")) == 1
    returned = expected_fates(["parked", "drained", "recovered"], delay_backend)
    assert fates_of(redis_client, keys, p.id) == returned
    assert fates_of(redis_client, keys, t.id) == returned
    assert fates_of(redis_client, keys, b.id) == [] and fates_of(redis_client, keys, k.id) == []
    assert read_cause(redis_client, keys, b.id).reason == "order cancelled upstream"
    assert read_cause(redis_client, keys, k.id).reason == "permanent failure: KeyError"


def test_requeue_goes_to_the_tail_not_the_head(
    app: Any, uid: str, redis_client: Any, key_prefix: str
) -> None:
    order = runs_key(key_prefix, "order")

    @app.task(name=f"step-{uid}")
    def step(name: str) -> None:
        redis_client.rpush(order, name)
        if name == "poison":
            raise RuntimeError("always")

    app.conf.dlx_max_parks = 0
    # Publish before the worker starts, so the queue holds poison, a, b, c in that order.
    with app.connection_for_write() as conn:
        for name in ("poison", "a", "b", "c"):
            step.apply_async((name,), connection=conn)
    with worker(app):
        wait_until(lambda: redis_client.llen(order) == 6, what="6 runs")
    assert [x.decode() for x in redis_client.lrange(order, 0, -1)] == [
        "poison",
        "a",
        "b",
        "c",
        "poison",
        "poison",
    ]


@both_backends
def test_poison_filling_the_prefetch_window_does_not_block_good_messages(
    app: Any, uid: str, redis_client: Any, key_prefix: str, broker: Any, delay_backend: str
) -> None:
    done = runs_key(key_prefix, "done")
    app.conf.worker_prefetch_multiplier = 10

    @app.task(name=f"work-{uid}")
    def work(poison: bool) -> None:
        if poison:
            raise ValueError("cannot parse")
        redis_client.incr(done)

    with app.connection_for_write() as conn:
        for _ in range(10):
            work.apply_async((True,), connection=conn)
        for _ in range(200):
            work.apply_async((False,), connection=conn)
    channel = broker.channel()
    with worker(app), delays_returning(app):
        wait_until(
            lambda: int(redis_client.get(done) or 0) == 200, timeout=60, what="200 good messages"
        )
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 10, timeout=60, what="10 burials")


def test_retry_of_a_fanout_queue_reaches_only_that_queue(
    uid: str, redis_client: Any, key_prefix: str, broker: Any, cleanup_queues: list[str]
) -> None:
    fan = Exchange(f"fan-{uid}", type="fanout")
    app = make_app(
        uid,
        task_queues=[Queue(f"a-{uid}", fan), Queue(f"b-{uid}", fan)],
        task_default_exchange=fan.name,
        task_default_exchange_type="fanout",
    )
    cleanup_queues.extend(
        [f"a-{uid}", f"b-{uid}", f"dead-{uid}", f"exchange:fan-{uid}", f"exchange:dlx-{uid}"]
    )
    runs = runs_key(key_prefix, "runs")

    @app.task(name=f"fan-{uid}")
    def handler() -> None:
        if redis_client.incr(runs) <= 2:
            raise ConnectionError("flaky")

    channel = broker.channel()
    app.amqp.queues[f"b-{uid}"](channel).declare()  # b has no consumer in this test
    with worker(app, queues=[f"a-{uid}"]), delays_returning(app):
        handler.apply_async(exchange=fan.name, routing_key="any", exchange_type="fanout")
        wait_until(lambda: int(redis_client.get(runs) or 0) == 3, what="3 runs on queue a")
    # Queue b got the one fanout copy and nothing from a's two requeues.
    assert queue_depth(channel, f"b-{uid}") == 1
    assert queue_depth(channel, f"a-{uid}") == 0


def test_existing_queue_with_other_arguments_gives_a_clear_error(
    app: Any, uid: str, broker: Any
) -> None:
    channel = broker.channel()
    channel.queue_declare(f"work-{uid}", durable=True, auto_delete=False)  # a pre-celery_dlx queue

    @app.task(name=f"t-{uid}")
    def t() -> None:
        return None

    with pytest.raises(TopologyError) as err:
        t.delay()
    message = str(err.value)
    assert f"work-{uid}" in message and "406" in message
    assert "dlx migrate" in message and "policy" in message and "rename" in message


def test_malformed_x_death_is_buried_by_publishing_never_rejected(
    app: Any, uid: str, redis_client: Any, key_prefix: str, keys: Any, broker: Any
) -> None:
    runs = runs_key(key_prefix, "runs")

    @app.task(name=f"victim-{uid}")
    def victim() -> None:
        redis_client.incr(runs)

    @app.task(name=f"ok-{uid}")
    def ok() -> None:
        redis_client.incr(runs + ":ok")

    # A producer copied x-death from a dead letter into a new message, as a list of strings:
    # RabbitMQ 3.10 crashes the queue if this message is ever dead-lettered.
    result = victim.apply_async(headers={"x-death": ["not", "tables"]})
    channel = broker.channel()
    with worker(app):
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the quarantined copy")
        ok.delay()  # the queue still works
        wait_until(lambda: redis_client.get(runs + ":ok"), what="a later message")
    assert redis_client.get(runs) is None  # never ran: its headers cannot be trusted
    [copy] = get_all(channel, f"dead-{uid}")
    assert "x-death" not in copy.headers
    assert copy.headers[REASON_HEADER].startswith("undecodable: malformed x-death")
    assert copy.headers[QUEUE_HEADER] == f"work-{uid}"
    assert copy.headers["id"] == result.id
    assert read_cause(redis_client, keys, result.id).exc_type == "Quarantined"


def test_undecodable_body_is_buried_not_dropped(app: Any, uid: str, broker: Any) -> None:
    @app.task(name=f"t-{uid}")
    def t() -> None:
        return None

    t.delay()  # declares the queue with its arguments
    channel = broker.channel()
    wait_until(lambda: queue_depth(channel, f"work-{uid}") == 1)
    from kombu import Producer

    Producer(channel).publish(
        b"\xff\xfe{not json",
        routing_key=f"work-{uid}",
        exchange="",
        content_type="application/json",
        content_encoding="utf-8",
        headers={"task": f"t-{uid}", "id": "bad-1", "lang": "py"},
    )
    with worker(app):
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the undecodable message")
        wait_until(lambda: queue_depth(channel, f"work-{uid}") == 0)
    [copy] = get_all(channel, f"dead-{uid}")
    assert copy.body == b"\xff\xfe{not json"
    assert copy.headers[REASON_HEADER].startswith("undecodable")


def test_result_states_and_signals_stay_meaningful(
    uid: str, redis_client: Any, key_prefix: str, cleanup_queues: list[str]
) -> None:
    app = make_app(
        uid,
        task_ignore_result=False,
        result_backend="redis://127.0.0.1:6379/0",
        result_backend_transport_options={"global_keyprefix": f"{{test-{uid}}}:"},
    )
    cleanup_queues.extend(queue_names(app))
    retried: list[str] = []
    failed: list[Any] = []

    def on_retry(sender: Any = None, request: Any = None, reason: Any = None, **_: Any) -> None:
        retried.append(type(reason).__name__)

    def on_failure(sender: Any = None, exception: Any = None, **_: Any) -> None:
        failed.append(exception)

    signals.task_retry.connect(on_retry, weak=False)
    signals.task_failure.connect(on_failure, weak=False)
    try:

        @app.task(name=f"always-{uid}", dlx_max_parks=0, dlx_max_requeues=1)
        def always() -> None:
            raise LookupError("no such row")

        with worker(app):
            result = always.delay()
            wait_until(lambda: result.state == "FAILURE", what="FAILURE state")
    finally:
        signals.task_retry.disconnect(on_retry)
        signals.task_failure.disconnect(on_failure)
    assert retried == ["LookupError"]
    assert len(failed) == 1 and "no such row" in repr(failed[0])
