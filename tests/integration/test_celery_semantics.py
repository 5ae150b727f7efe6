"""Celery's own semantics kept under celery_dlx, end to end (real worker, RabbitMQ and Redis).

Each test is a behaviour Celery's integration suite (scripts/celery_compat.py) expects of a plain
Celery app, checked here on a DLX-enabled app: a buried task's result and errbacks, retry counts,
a task's own Reject, pickling of fate exceptions through a prefork pool, failures no retry can
cure, and the task protocol of copies.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from celery.exceptions import MaxRetriesExceededError, Reject
from celery.result import AsyncResult
from kombu import Connection, Exchange, Producer

from celery_dlx import Bury, Park, Requeue, dlx_details
from tests.conftest import BROKER_URL
from tests.integration.dlx_apps import delays_returning, make_app, queue_names, worker
from tests.integration.helpers import fates_of, queue_depth, wait_until


class OrderMissing(Exception):
    """The task's own exception (importable, so the result backend rebuilds its type)."""


@pytest.fixture
def app(uid: str, key_prefix: str, cleanup_queues: list[str]) -> Any:
    app = make_app(
        uid,
        task_ignore_result=False,
        result_backend="redis://127.0.0.1:6379/0",
        result_backend_transport_options={"global_keyprefix": f"{{test-{uid}}}:"},
        result_extended=True,
    )
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:dlx-{uid}")
    return app


def key(key_prefix: str, name: str) -> str:
    return "{" + key_prefix + "}:test:" + name


def test_buried_result_is_the_tasks_own_exception_and_errbacks_run_once(
    app: Any, uid: str, key_prefix: str, redis_client: Any, broker: Any
) -> None:
    runs, errbacks = key(key_prefix, "runs"), key(key_prefix, "errbacks")

    @app.task(name=f"missing-{uid}")
    def missing(order: int) -> None:
        redis_client.incr(runs)
        raise OrderMissing(f"order {order} not found")

    @app.task(name=f"on-error-{uid}")
    def on_error(request: Any, exc: Any, traceback: Any) -> None:
        redis_client.rpush(errbacks, f"{type(exc).__name__}: {exc}")

    channel = broker.channel()
    with worker(app), delays_returning(app):
        result = missing.apply_async((7,), link_error=on_error.s())
        with pytest.raises(OrderMissing, match="order 7 not found"):
            result.get(timeout=60)
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the dead letter")
        wait_until(lambda: redis_client.llen(errbacks) >= 1, what="the errback")
    assert int(redis_client.get(runs)) == 1 + 2 + 2  # parks and requeues did not fail it
    assert result.state == "FAILURE"
    assert isinstance(result.result, OrderMissing)
    assert "order 7 not found" in (result.traceback or "")
    assert "OrderMissing" in (result.traceback or "")
    assert redis_client.lrange(errbacks, 0, -1) == [b"OrderMissing: order 7 not found"]
    # celery_dlx's own account of the run count is in the result meta: every retry it made.
    assert app.backend.get_task_meta(result.id)["retries"] == 4
    # ... and its own details of the burial beside Celery's fields, not in the exception type.
    details = dlx_details(result)
    assert details is not None
    assert details["fate"] == "buried"
    assert details["attempt"] == 5
    assert details["queue"] == f"work-{uid}"
    assert "OrderMissing" in details["exc_type"]
    assert details["cause"] and details["reason"]
    assert details["first_failure_ms"] <= details["at_ms"]


def test_result_meta_carries_each_runs_fate(
    app: Any, uid: str, key_prefix: str, redis_client: Any
) -> None:
    """Each run sees the details its predecessor stored with RETRY; success stores `recovered`."""
    seen = key(key_prefix, "seen")

    @app.task(name=f"flaky-{uid}", bind=True)
    def flaky(self: Any) -> int:
        before = dlx_details(AsyncResult(self.request.id, app=app)) or {}
        redis_client.rpush(
            seen, f"{before.get('fate')}:{before.get('attempt')}:{'due_ms' in before}"
        )
        if self.request.retries < 3:
            raise ConnectionError("upstream down")
        return int(self.request.retries)

    with worker(app), delays_returning(app):
        result = flaky.delay()
        assert result.get(timeout=60) == 3
    assert redis_client.lrange(seen, 0, -1) == [
        b"None:None:False",
        b"requeued:1:False",
        b"requeued:2:False",
        b"parked:3:True",
    ]
    details = dlx_details(result)
    assert details is not None
    assert details["fate"] == "recovered"
    assert details["attempt"] == 3
    assert details["replayed"] is False


def test_request_retries_counts_every_requeue_and_park(
    app: Any, uid: str, key_prefix: str, redis_client: Any, keys: Any
) -> None:
    seen = key(key_prefix, "seen")

    @app.task(name=f"counting-{uid}", bind=True)
    def counting(self: Any) -> int:
        redis_client.rpush(seen, self.request.retries)
        if self.request.retries < 3:
            raise ConnectionError("upstream down")
        return int(self.request.retries)

    with worker(app), delays_returning(app):
        result = counting.delay()
        assert result.get(timeout=60) == 3
    assert redis_client.lrange(seen, 0, -1) == [b"0", b"1", b"2", b"3"]
    assert fates_of(redis_client, keys, result.id)[:4] == [
        "requeued",
        "requeued",
        "parked",
        "drained",
    ]


def test_retry_once_returns_and_max_retries_keeps_celerys_meaning(
    app: Any, uid: str, key_prefix: str, redis_client: Any
) -> None:
    runs = key(key_prefix, "runs")

    @app.task(name=f"retry-once-{uid}", bind=True, max_retries=1)
    def retry_once(self: Any) -> int:
        if self.request.retries:
            return int(self.request.retries)
        raise self.retry(countdown=0.1)

    @app.task(name=f"retry-always-{uid}", bind=True, max_retries=2)
    def retry_always(self: Any) -> None:
        redis_client.incr(runs)
        raise self.retry(countdown=0.1)

    @app.task(name=f"retry-args-{uid}", bind=True, max_retries=1)
    def retry_args(self: Any, n: int) -> int:
        if not self.request.retries:
            raise self.retry(args=(n + 1,), countdown=0)
        return n

    @app.task(name=f"retry-kwargs-{uid}", bind=True, max_retries=1)
    def retry_kwargs(self: Any, foo: int, bar: int) -> list[int]:
        if not self.request.retries:
            raise self.retry(kwargs={"foo": foo + 1}, countdown=0)
        return [foo, bar]

    with worker(app), delays_returning(app):
        assert retry_once.delay().get(timeout=60) == 1
        assert retry_args.delay(1).get(timeout=60) == 2
        assert retry_kwargs.delay(1, 2).get(timeout=60) == [2, 2]
        poison = retry_always.delay()
        with pytest.raises(MaxRetriesExceededError):
            poison.get(timeout=60)
    # max_retries=2: the first run and two retries, then Celery's MaxRetriesExceededError.
    assert int(redis_client.get(runs)) == 3


def test_own_reject_with_requeue_is_not_a_crash(
    app: Any, uid: str, key_prefix: str, redis_client: Any, keys: Any
) -> None:
    @app.task(name=f"reject-then-succeed-{uid}", bind=True)
    def reject_then_succeed(self: Any) -> str:
        if not self.request.delivery_info.get("redelivered"):
            raise Reject(requeue=True)
        return "second-pass"

    with worker(app):
        result = reject_then_succeed.delay()
        assert result.get(timeout=60) == "second-pass"
    assert fates_of(redis_client, keys, result.id) == []


def test_fate_exceptions_cross_a_prefork_pool_and_the_worker_survives(
    app: Any, uid: str, key_prefix: str, redis_client: Any
) -> None:
    """A buried Park (and a poison self.retry()) reaches the worker's main process pickled."""

    @app.task(name=f"parks-{uid}", dlx_max_parks=1)
    def parks() -> None:
        raise Park(countdown=0.1, message="not yet")

    @app.task(name=f"poison-retry-{uid}", bind=True, max_retries=None, dlx_max_parks=1)
    def poison_retry(self: Any) -> None:
        if self.request.retries == 0:
            raise self.retry(countdown=0.1)
        raise Park(countdown=0.1)

    @app.task(name=f"requeues-{uid}", dlx_max_requeues=1, dlx_max_parks=0)
    def requeues() -> None:
        raise Requeue("busy")

    @app.task(name=f"buries-{uid}")
    def buries() -> None:
        raise Bury("order cancelled")

    @app.task(name=f"ok-{uid}")
    def ok() -> str:
        return "alive"

    with worker(app, pool="prefork", concurrency=1), delays_returning(app):
        buried = parks.delay()
        with pytest.raises(Park) as info:
            buried.get(timeout=60)
        assert "not yet" in str(info.value)
        with pytest.raises(Park):
            poison_retry.delay().get(timeout=60)
        with pytest.raises(Requeue, match="busy"):
            requeues.delay().get(timeout=60)
        with pytest.raises(Bury, match="order cancelled"):
            buries.delay().get(timeout=60)
        assert ok.delay().get(timeout=60) == "alive"


def test_wrong_arguments_are_buried_at_once(
    app: Any, uid: str, key_prefix: str, redis_client: Any, broker: Any
) -> None:
    runs = key(key_prefix, "runs")

    @app.task(name=f"two-args-{uid}")
    def two_args(a: int, b: int) -> int:
        redis_client.incr(runs)
        return a + b

    @app.task(name=f"type-error-inside-{uid}", dlx_max_requeues=1, dlx_max_parks=0)
    def type_error_inside() -> None:
        redis_client.incr(runs + "-inside")
        raise TypeError("a bug inside the task is retried like any other")

    channel = broker.channel()
    with worker(app):
        # send_task: apply_async would refuse the call before it is sent (task.typing).
        result = app.send_task(f"two-args-{uid}", args=(1,))
        with pytest.raises(TypeError):
            result.get(timeout=60)
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the dead letter")
        inside = type_error_inside.delay()
        with pytest.raises(TypeError):
            inside.get(timeout=60)
    assert redis_client.get(runs) is None  # the body never ran, nor was it retried
    assert int(redis_client.get(runs + "-inside")) == 2


def test_body_the_pool_cannot_decode_is_buried_at_once_with_failure(
    app: Any, uid: str, broker: Any
) -> None:
    @app.task(name=f"decoded-{uid}")
    def decoded() -> None:
        return None

    task_id = str(uuid.uuid4())
    channel = broker.channel()
    with worker(app):
        with Connection(BROKER_URL) as conn:
            Producer(conn.channel()).publish(
                b"\xff{not json",
                exchange=Exchange(""),
                routing_key=f"work-{uid}",
                content_type="application/json",
                content_encoding="utf-8",
                headers={"task": f"decoded-{uid}", "id": task_id, "lang": "py", "retries": 0},
            )
        result = app.AsyncResult(task_id)
        wait_until(lambda: result.state == "FAILURE", what=f"FAILURE {result.id}")
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the graveyard copy")
        wait_until(lambda: queue_depth(channel, f"work-{uid}") == 0, what="the work queue")


@pytest.mark.parametrize("protocol", [1, 2])
def test_requeued_and_parked_copies_keep_the_task_protocol(
    uid: str, key_prefix: str, redis_client: Any, cleanup_queues: list[str], protocol: int
) -> None:
    app = make_app(
        uid,
        task_protocol=protocol,
        task_ignore_result=False,
        result_backend="redis://127.0.0.1:6379/0",
        result_backend_transport_options={"global_keyprefix": f"{{test-{uid}}}:"},
    )
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:dlx-{uid}")
    runs = key(key_prefix, "runs")

    @app.task(name=f"flaky-{uid}", bind=True)
    def flaky(self: Any, x: int, *, y: int) -> list[int]:
        n = redis_client.incr(runs)
        if n <= 3:  # requeue, requeue, park
            raise ConnectionError("upstream down")
        return [x, y, self.request.retries]

    with worker(app), delays_returning(app):
        assert flaky.delay(1, y=2).get(timeout=60) == [1, 2, 3]


def test_unknown_task_is_buried_at_once_with_failure(app: Any, uid: str, broker: Any) -> None:
    from celery.exceptions import NotRegistered

    channel = broker.channel()
    with worker(app):
        result = app.send_task(f"nobody-knows-{uid}", args=(1,))
        with pytest.raises(NotRegistered):
            result.get(timeout=60)
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the graveyard copy")
        wait_until(lambda: queue_depth(channel, f"work-{uid}") == 0, what="the work queue")


def test_message_quarantined_before_its_run_fails_for_celery(
    app: Any, uid: str, key_prefix: str, redis_client: Any, broker: Any
) -> None:
    from celery_dlx.errors import MalformedHeader

    errbacks = key(key_prefix, "errbacks")

    @app.task(name=f"victim-{uid}")
    def victim() -> None:
        return None

    @app.task(name=f"on-error-{uid}")
    def on_error(request: Any, exc: Any, traceback: Any) -> None:
        redis_client.rpush(errbacks, type(exc).__name__)

    channel = broker.channel()
    with worker(app):
        # x-death copied by a producer as a list of strings: never dead-lettered, quarantined.
        result = victim.apply_async(headers={"x-death": ["not", "tables"]}, link_error=on_error.s())
        with pytest.raises(MalformedHeader, match="malformed x-death"):
            result.get(timeout=60)
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the quarantined copy")
        wait_until(lambda: redis_client.llen(errbacks) == 1, what="the errback")
    assert redis_client.lrange(errbacks, 0, -1) == [b"MalformedHeader"]
