"""A burial decided by a worker is attributed to the worker's code version, not the service's.

The code that failed is the worker's: a worker deployed as ``w7`` stashes its version in the cause
record, and a DLX service deployed separately as ``s3`` writes the obituary (and the cause group's
version stats) with ``w7``. Real worker, RabbitMQ, Redis and DLX service.
"""

from __future__ import annotations

from typing import Any

from celery_dlx.ops import obituaries
from celery_dlx.service.runner import run_service
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import queue_depth, wait_until


def test_a_workers_burial_carries_the_workers_code_version(
    uid: str, key_prefix: str, cleanup_queues: list[str], broker: Any
) -> None:
    budget = {"dlx_max_requeues": 0, "dlx_max_parks": 0}
    app = make_app(uid, dlx_code_version="w7", **budget)
    service_app = make_app(uid, dlx_code_version="s3", **budget)
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:dlx-{uid}")

    @app.task(name=f"poison-{uid}")
    def poison() -> None:
        raise ValueError("no customer")

    with worker(app):
        poison.delay()
        wait_until(
            lambda: queue_depth(broker.channel(), f"dead-{uid}") == 1, what="the dead letter"
        )
    runtime = get_runtime(service_app)
    try:
        run_service(service_app, idle_timeout=1.0, install_signals=False)
        [ob] = obituaries.list_obituaries(runtime)
        assert (ob.task, ob.code_version) == (f"poison-{uid}", "w7")
        [group] = obituaries.groups(runtime)
        assert group.versions == {"w7": 1}
    finally:
        runtime.reset_publisher()
        get_runtime(app).reset_publisher()
