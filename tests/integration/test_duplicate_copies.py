"""A retry copy published twice (a drain or the DLX service killed between its confirmed publish
and its delete publishes it again) runs once: the second copy of the same step is acked unrun, so
a failure never runs past its budget (issue 36). A redelivery, and a new step of the same
message, still run."""

from __future__ import annotations

import json
import logging
import time
import uuid
from typing import Any

import pytest

from celery_dlx.fates import now_ms
from celery_dlx.message.headers import DLXState
from celery_dlx.message.lineage import ANY_LINEAGE, lineage
from celery_dlx.message.names import (
    ATTEMPT_HEADER,
    FIRST_FAILURE_HEADER,
    HISTORY_HEADER,
    QUEUE_HEADER,
)
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import queue_depth, wait_until


def test_a_second_copy_of_one_retry_step_is_acked_without_running(
    uid: str, key_prefix: str, broker: Any, cleanup_queues: list[str]
) -> None:
    app, runtime, count, runs, queue = _counting_app(uid, key_prefix, cleanup_queues)
    task_id = str(uuid.uuid4())
    at = now_ms()

    def copy(attempt: int, step_ms: int) -> dict[str, Any]:
        history = json.dumps([[step_ms, "parked", "c"]])
        return {ATTEMPT_HEADER: attempt, HISTORY_HEADER: history, QUEUE_HEADER: queue}

    with worker(app):
        channel = broker.channel()
        for headers in (copy(2, at), copy(2, at), copy(3, at + 1)):  # a duplicate, then a step
            count.apply_async((1,), task_id=task_id, headers=headers)
        wait_until(lambda: runtime.redis.llen(runs) >= 2, timeout=30, what="two runs")
        wait_until(lambda: queue_depth(channel, queue) == 0, timeout=30, what="an empty queue")
        # The duplicate was consumed and acked; it did not run.
        assert runtime.redis.llen(runs) == 2
        channel.close()
    runtime.redis.delete(runs)


def test_two_copies_of_one_retry_made_by_different_processes_run_once(
    uid: str, key_prefix: str, broker: Any, cleanup_queues: list[str]
) -> None:
    """A worker's copy and the one its fallback handed to the DLX service (or the service's copy
    written again after a crash) carry the same attempt and lineage but each its own fate time:
    still one step, run once. A copy of another lineage (the id reused by its publisher, with
    a first failure of its own) runs."""
    app, runtime, count, runs, queue = _counting_app(uid, key_prefix, cleanup_queues)
    task_id = str(uuid.uuid4())
    first = now_ms() - 5_000

    def copy(step_ms: int, first_ms: int) -> dict[str, Any]:
        history = json.dumps([[first_ms, "requeued", "c"], [step_ms, "requeued", "c"]])
        return {
            ATTEMPT_HEADER: 2,
            HISTORY_HEADER: history,
            QUEUE_HEADER: queue,
            FIRST_FAILURE_HEADER: first_ms,
        }

    with worker(app):
        channel = broker.channel()
        # The worker's copy, the service's copy of the same retry, another lineage's copy.
        for headers in (
            copy(first + 100, first),
            copy(first + 180, first),
            copy(first + 900, first + 700),
        ):
            count.apply_async((1,), task_id=task_id, headers=headers)
        wait_until(lambda: runtime.redis.llen(runs) >= 2, timeout=30, what="two runs")
        wait_until(lambda: queue_depth(channel, queue) == 0, timeout=30, what="an empty queue")
        assert runtime.redis.llen(runs) == 2
        channel.close()
    runtime.redis.delete(runs)


def test_a_retry_handed_to_the_service_without_a_confirm_is_pending_for_its_lineage_only(
    uid: str,
) -> None:
    """The store's side: a pending mark makes the look-up of its lineage undecided (raises),
    another lineage's look-up is not held up, and the copy's real marker replaces it; a pending
    mark never replaces a real marker."""
    from celery_dlx.store.errors import RetryPending

    causes = get_runtime(make_app(uid)).causes
    causes.mark_pending_many([("q", "m1", 1, ":100")], 30)
    with pytest.raises(RetryPending):
        causes.was_copied("q", "m1", 1, ":100")
    assert causes.was_copied("q", "m1", 1, "replay-1:200") is False
    causes.mark_copied_many([("q", "m1", 1, ":100")])
    assert causes.was_copied("q", "m1", 1, ":100") is True
    causes.mark_pending_many([("q", "m1", 1, ":100")], 30)
    assert causes.was_copied("q", "m1", 1, ":100") is True


def test_a_redelivered_original_waits_while_its_retry_is_on_its_way_to_the_service(
    uid: str,
    key_prefix: str,
    broker: Any,
    cleanup_queues: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its worker handed the retry to the DLX service and lost the confirm with its connection:
    the original comes back redelivered. It waits in its queue (not counted as a crash, which
    would start a second lineage) until the service writes the copy, then is acked unrun."""
    app, runtime, count, runs, queue = _counting_app(uid, key_prefix, cleanup_queues)
    task_id = str(uuid.uuid4())
    channel = broker.channel()
    count.apply_async((1,), task_id=task_id)
    # A worker took it and died before its ack: the broker redelivers it (redelivered=True).
    _take_unacked(channel, queue)
    channel.basic_recover(requeue=True)
    runtime.causes.mark_pending_many([(queue, task_id, 1, lineage(DLXState(), None))], 60)
    caplog.set_level(logging.INFO, logger="celery_dlx")
    with worker(app):
        wait_until(
            lambda: "until the DLX service writes the retries" in caplog.text,
            timeout=30,
            what="the original waiting",
        )
        time.sleep(2)  # it keeps waiting: neither run nor given a retry of its own
        assert runtime.redis.llen(runs) == 0
        assert list(runtime.history.read()) == []
        runtime.causes.mark_copied_many([(queue, task_id, 1, ANY_LINEAGE)])  # the service wrote it
        wait_until(
            lambda: "redelivered after its retry was made" in caplog.text,
            timeout=30,
            what="the original acked unrun",
        )
        wait_until(lambda: queue_depth(channel, queue) == 0, timeout=30, what="the ack")
    assert runtime.redis.llen(runs) == 0
    assert list(runtime.history.read()) == []
    assert queue_depth(channel, f"dead-{uid}") == 0
    channel.close()


def test_a_redelivered_copy_of_a_retry_that_succeeded_is_acked_unrun(
    uid: str,
    key_prefix: str,
    broker: Any,
    cleanup_queues: list[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A retry ran and succeeded; a second copy of it (a drain killed between its publish and
    its delete) reached a worker that lost it unrun, and comes back redelivered. Counted as a
    crash it would get a retry of its own, and could be buried though its task succeeded: it is
    acked unrun."""
    app, runtime, count, runs, queue = _counting_app(uid, key_prefix, cleanup_queues)
    task_id = str(uuid.uuid4())
    first = now_ms() - 5_000
    headers = {
        ATTEMPT_HEADER: 2,
        HISTORY_HEADER: json.dumps([[first, "requeued", "c"], [first + 50, "requeued", "c"]]),
        QUEUE_HEADER: queue,
        FIRST_FAILURE_HEADER: first,
    }
    channel = broker.channel()
    with worker(app):
        count.apply_async((1,), task_id=task_id, headers=headers)
        wait_until(lambda: runtime.redis.llen(runs) == 1, timeout=30, what="the retry's run")
        wait_until(lambda: queue_depth(channel, queue) == 0, timeout=30, what="its ack")
    count.apply_async((1,), task_id=task_id, headers=headers)  # the second copy
    _take_unacked(channel, queue)  # taken, lost unrun
    channel.basic_recover(requeue=True)
    caplog.set_level(logging.INFO, logger="celery_dlx")
    with worker(app):
        wait_until(
            lambda: "redelivered after a run of this retry succeeded" in caplog.text,
            timeout=30,
            what="the redelivered copy acked unrun",
        )
        wait_until(lambda: queue_depth(channel, queue) == 0, timeout=30, what="its ack")
    assert runtime.redis.llen(runs) == 1
    fates = [entry["fate"] for _, entry in runtime.history.read()]
    assert "requeued" not in fates and "parked" not in fates, fates
    channel.close()


def _take_unacked(channel: Any, queue: str) -> None:
    """Take the message just published to ``queue`` without acking it (as a worker that dies
    before its ack): once ``basic_recover`` requeues it, it comes back redelivered."""
    wait_until(
        lambda: channel.basic_get(queue, no_ack=False) is not None,
        timeout=30,
        what="the published message",
    )


def _counting_app(uid: str, key_prefix: str, cleanup_queues: list[str]) -> tuple[Any, ...]:
    """A DLX app with one task that appends its argument to a list in Redis (its runs): the
    app, its runtime, the task, the list's key and the app's queue."""
    app = make_app(uid)
    runtime = get_runtime(app)
    runs = f"{{{key_prefix}}}:runs"

    @app.task(name=f"count-{uid}")
    def count(n: int) -> None:
        runtime.redis.rpush(runs, n)

    cleanup_queues.extend(queue_names(app))
    return app, runtime, count, runs, app.conf.task_default_queue
