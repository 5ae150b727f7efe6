"""A retry copy published twice (a drain or the DLX service killed between its confirmed publish
and its delete publishes it again) runs once: the second copy of the same step is acked unrun, so
a failure never runs past its budget (issue 36). A redelivery, and a new step of the same
message, still run."""

from __future__ import annotations

import json
import uuid
from typing import Any

from celery_dlx.fates import now_ms
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
    app = make_app(uid)
    runtime = get_runtime(app)
    runs = f"{{{key_prefix}}}:runs"

    @app.task(name=f"count-{uid}")
    def count(n: int) -> None:
        runtime.redis.rpush(runs, n)

    cleanup_queues.extend(queue_names(app))
    queue = app.conf.task_default_queue
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
    app = make_app(uid)
    runtime = get_runtime(app)
    runs = f"{{{key_prefix}}}:runs"

    @app.task(name=f"count-{uid}")
    def count(n: int) -> None:
        runtime.redis.rpush(runs, n)

    cleanup_queues.extend(queue_names(app))
    queue = app.conf.task_default_queue
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
