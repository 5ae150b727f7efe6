"""A solo-pool worker never goes to sleep in its event loop's poll with a DLX task's ack queued
(celery_dlx/worker/loopwake.py), checked on a real worker, RabbitMQ and Redis.

kombu's loop runs the callbacks ``Hub.call_soon`` queued, fires its timers, calls its tick
callbacks, then polls. A tick callback of this test looks, just before each poll, at what is
queued: an ack queued there (Celery's ``Message.ack_log_error``) waits for the poll to end, which
without an event lasts until the next timer. The wake-up must then be armed (a byte in its pipe,
so the poll returns at once). The test also asserts that acks were seen queued at a tick, so that
the check was put to work: a backlog at prefetch 10 runs most of its tasks inside kombu's queued
reader callbacks, whose acks are queued behind them.
"""

from __future__ import annotations

from typing import Any

from celery_dlx.compat import hub_wakes_for_other_threads
from celery_dlx.worker.loopwake import LoopWakeStep, loop_wake_of
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import wait_until

TASKS = 400


def _queued_acks(hub: Any) -> int:
    """Acks among the callbacks queued on ``hub`` (kombu's ``Hub._ready``)."""
    count = 0
    for item in list(hub._ready):
        fun = getattr(item, "fun", item)
        fun = getattr(fun, "func", fun)
        if getattr(fun, "__name__", "") == "ack_log_error":
            count += 1
    return count


def test_solo_worker_acks_wake_the_loop(
    uid: str, key_prefix: str, redis_client: Any, cleanup_queues: list[str]
) -> None:
    app = make_app(uid, worker_prefetch_multiplier=10)
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:dlx-{uid}")
    done = "{" + key_prefix + "}:test:done"

    @app.task(name=f"count-{uid}")
    def count() -> None:
        redis_client.incr(done)

    with app.producer_or_acquire() as producer:
        for _ in range(TASKS):
            count.apply_async(producer=producer)

    seen = {"ticks_with_acks": 0, "asleep_with_acks": 0}
    with worker(app, pool="solo") as w:
        assert any(isinstance(step, LoopWakeStep) for step in w.steps)
        wake = loop_wake_of(app)
        assert wake is not None

        def tick() -> None:
            if _queued_acks(w.hub):
                seen["ticks_with_acks"] += 1
                if not wake.armed:
                    seen["asleep_with_acks"] += 1

        w.hub.on_tick.add(tick)
        try:
            wait_until(lambda: int(redis_client.get(done) or 0) == TASKS, what="every task")
        finally:
            w.hub.on_tick.discard(tick)
    assert seen["ticks_with_acks"] > 0, "no ack was ever queued at a poll: the check saw nothing"
    assert seen["asleep_with_acks"] == 0, seen
    assert loop_wake_of(app) is None  # the stopped worker's pipe is gone with it


def test_only_the_solo_pool_gets_a_wake_up(uid: str, cleanup_queues: list[str]) -> None:
    """From kombu 5.7 on; below, whose loop sleeps through another thread's ``call_soon``, the
    threads pool gets one too, written from its threads (``hub_wakes_for_other_threads``)."""
    app = make_app(uid)
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:dlx-{uid}")
    with worker(app, pool="threads") as w:
        if hub_wakes_for_other_threads():
            assert not any(isinstance(step, LoopWakeStep) for step in w.steps)
            assert loop_wake_of(app) is None
        else:
            wake = loop_wake_of(app)
            assert wake is not None and wake.other_threads
