"""A cause past ``dlx_graveyard_max_per_cause`` (issue 36): its further dead letters wait whole in
the overflow queue, nothing dropped, while the graveyard keeps its cap; ``dlx overflow --requeue``
hands them back once the cause has room. Real worker, DLX service, RabbitMQ and Redis."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from celery_dlx.broker.topology import overflow_name
from celery_dlx.ops import obituaries
from celery_dlx.service.loop import DLXService
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.cli_helpers import run_json
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import queue_depth, wait_until


@pytest.fixture
def shop(uid: str, cleanup_queues: list[str]) -> Iterator[dict[str, Any]]:
    app = make_app(uid, dlx_max_requeues=0, dlx_max_parks=0, dlx_graveyard_max_per_cause=2)
    runtime = get_runtime(app)

    @app.task(name=f"broken-{uid}")
    def broken(n: int) -> None:
        raise RuntimeError("card backend gone")

    cleanup_queues.extend([*queue_names(app), overflow_name(app.conf.dlx_service_queue)])
    cleanup_queues.append(f"exchange:{app.conf.dlx_exchange}")
    service = DLXService(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        yield {"app": app, "runtime": runtime, "task": broken, "service": service}
    finally:
        service.stop()
        thread.join(30)
        runtime.reset_publisher()


def test_a_cause_past_its_cap_waits_in_the_overflow_queue_and_comes_back(
    shop: dict[str, Any], broker: Any
) -> None:
    app, runtime, service = shop["app"], shop["runtime"], shop["service"]
    overflow = overflow_name(app.conf.dlx_service_queue)
    channel = broker.channel()
    with worker(app):
        for n in range(5):
            shop["task"].delay(n)
        wait_until(
            lambda: service.stats.buried + service.stats.overflowed == 5,
            timeout=60,
            what="five dead letters settled",
        )
    assert obituaries.count(runtime) == 2 and service.stats.overflowed == 3
    assert queue_depth(channel, overflow) == 3
    waiting = run_json(app, "overflow")
    assert (waiting["waiting"], waiting["max_per_cause"]) == (3, 2)

    # The cause gets room (a purge), and the overflow goes back to the service.
    assert len(run_json(app, "purge", "--all", "--yes")["purged"]) == 2
    back = run_json(app, "overflow", "--requeue")
    assert back["requeued"] == 3
    wait_until(
        lambda: obituaries.count(runtime) == 2 and queue_depth(channel, overflow) == 1,
        timeout=60,
        what="two buried, one back in the overflow queue",
    )
    buried = {ob.message_id for ob in obituaries.list_obituaries(runtime, status="all")}
    assert len(buried) == 2  # each message buried once; none of the five is lost
    channel.close()
