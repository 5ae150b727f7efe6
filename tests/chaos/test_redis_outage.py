"""A Redis outage while a DLX task fails must not fork the message.

Found by the chaos run: with celery_dlx's Redis down, a failing task's tail requeue was published
(the broker was fine), then recording the fate in the history failed, the run failed, and Celery
rejected the original into the dead-letter exchange: the message then lived twice (the requeued
copy, and the original the DLX service requeued again), and every further failure during the
outage doubled it again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.chaos.servers import RedisServer, own_redis
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import queue_depth, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def dlx_redis(tmp_path: Any) -> Iterator[RedisServer]:
    with own_redis(tmp_path) as server:
        yield server


def test_a_requeue_during_a_redis_outage_acks_the_original(
    uid: str,
    dlx_redis: RedisServer,
    redis_client: Any,
    key_prefix: str,
    cleanup_queues: list[str],
    broker: Any,
) -> None:
    app = make_app(uid, dlx_redis_url=dlx_redis.url)
    cleanup_queues.extend([*queue_names(app), f"exchange:dlx-{uid}", f"exchange:work-{uid}"])
    runs = "{" + key_prefix + "}:test:runs"  # on the shared Redis, which stays up

    @app.task(name=f"flaky-{uid}")
    def flaky() -> str:
        if redis_client.incr(runs) == 1:
            raise ConnectionError("upstream down")
        return "ok"

    channel = broker.channel()
    with worker(app):
        dlx_redis.kill()  # celery_dlx's Redis is down; the broker is not
        flaky.delay()
        wait_until(lambda: int(redis_client.get(runs) or 0) >= 2, timeout=60, what="the retry")
    assert int(redis_client.get(runs)) == 2  # the requeued copy ran once, and succeeded
    assert queue_depth(channel, f"dead-{uid}") == 0, "the original was dead-lettered as well"
    assert queue_depth(channel, f"work-{uid}") == 0
