"""A DLX app for the worker subprocesses of ``test_parent_parks.py``.

Its names come from ``DLX_TEST_UID``; ``DLX_TEST_REDIS_URL`` (celery_dlx's Redis, a private server
in the outage test), ``DLX_TEST_PARENT_PARKS`` (``dlx_parent_parks``) and ``DLX_TEST_PREFETCH``
(the prefetch multiplier, 10 unless given) and ``DLX_TEST_TASK_EVENTS`` (``1``: the worker sends
task events, as with ``-E``) from the test.
"""

from __future__ import annotations

import os
from typing import Any

import redis

from tests.conftest import REDIS_URL
from tests.integration.dlx_apps import make_app

UID = os.environ.get("DLX_TEST_UID", "unset")
app = make_app(
    UID,
    dlx_redis_url=os.environ.get("DLX_TEST_REDIS_URL", REDIS_URL),
    dlx_parent_parks=os.environ.get("DLX_TEST_PARENT_PARKS", "1") == "1",
    worker_prefetch_multiplier=int(os.environ.get("DLX_TEST_PREFETCH", "10")),
    worker_send_task_events=os.environ.get("DLX_TEST_TASK_EVENTS", "0") == "1",
)
_runs = redis.Redis.from_url(REDIS_URL)  # the shared Redis: it stays up in the outage test


@app.task(name="pp.park_once", bind=True)
def park_once(self: Any) -> None:
    """Counts its run, then fails with a retry due in an hour (a park)."""
    _runs.incr("{test-" + UID + "}:test:runs")
    raise self.retry(countdown=3600, exc=TimeoutError("supplier API rate limited"))


@app.task(name="pp.park_twice", bind=True)
def park_twice(self: Any) -> None:
    """Parked twice for 0.2 s (drained back by the worker's drainer), then succeeds."""
    runs = _runs.incr("{test-" + UID + "}:test:twice:" + self.request.id)
    if runs <= 2:
        raise self.retry(countdown=0.2, exc=TimeoutError("supplier API rate limited"))
    _runs.sadd("{test-" + UID + "}:test:done", self.request.id)


@app.task(name="pp.fail_twice", bind=True)
def fail_twice(self: Any) -> None:
    """Fails twice with an error celery_dlx requeues at the tail (``dlx_max_requeues`` is 2),
    then succeeds."""
    runs = _runs.incr("{test-" + UID + "}:test:fails:" + self.request.id)
    if runs <= 2:
        raise ValueError("flaky downstream")
    _runs.sadd("{test-" + UID + "}:test:done", self.request.id)
