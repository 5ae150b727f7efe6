"""A DLX app for worker subprocesses of the drop-in tests (migration, drainer, quiet worker).

``celery -A tests.integration.dropin_app worker``: names come from ``DLX_TEST_UID`` (queue
``orders-<uid>``, key prefix ``test-<uid>``), the DLX service runs in the worker, Celery sets up
logging (``-l INFO`` prints celery_dlx's lines). ``DLX_TEST_PLAIN=1`` gives the same app without
celery_dlx: the producer of the queue before it was migrated.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from celery_dlx import Park
from tests.conftest import BROKER_URL, REDIS_URL
from tests.integration.dlx_apps import make_app

UID = os.environ.get("DLX_TEST_UID", "unset")
PREFIX = f"test-{UID}"


def queue_of(uid: str) -> str:
    """The work queue the tasks are routed to (not the default queue)."""
    return f"orders-{uid}"


def build(uid: str, *, plain: bool = False) -> Celery:
    """The app: tasks routed to ``orders-<uid>``, the default queue ``default-<uid>`` unused."""
    routes = {"dropin.*": {"queue": queue_of(uid)}}
    if plain:
        plain_app = Celery(f"dropin-{uid}", broker=BROKER_URL, set_as_current=False)
        plain_app.conf.update(
            task_default_queue=f"default-{uid}", task_routes=routes, task_ignore_result=True
        )
        return plain_app
    return make_app(
        uid,
        task_default_queue=f"default-{uid}",
        task_routes=routes,
        dlx_service_in_worker=True,
        dlx_drain_interval=1.0,
        worker_hijack_root_logger=True,
    )


app = build(UID, plain=os.environ.get("DLX_TEST_PLAIN") == "1")
_redis = redis.Redis.from_url(REDIS_URL)


def key(name: str) -> str:
    return "{" + PREFIX + "}:test:" + name


@app.task(name="dropin.good")
def good(n: int) -> int:
    _redis.sadd(key("good"), n)
    return n


@app.task(name="dropin.poison")
def poison(n: int) -> None:
    _redis.incr(key("poison-runs"))
    raise ValueError(f"poison {n}")


@app.task(name="dropin.park_once")
def park_once(n: int) -> int:
    """Parks on its first run, succeeds when the drain brought it back."""
    if _redis.incr(key(f"park-once-{n}")) == 1:
        raise Park(countdown=0.5)
    _redis.sadd(key("parked-done"), n)
    return n


@app.task(name="dropin.flaky", bind=True)
def flaky(self: Any, n: int) -> int:
    """Fails its first run in a celery_dlx worker (celery_dlx requeues a copy); a copy run in a
    celery_dlx worker waits until a plain worker has run one (tests/integration/test_rolling_deploy.py).
    Records each run as ``kind:n:x-dlx-requeues``."""
    plain = os.environ.get("DLX_TEST_PLAIN") == "1"
    requeues = self.request.get("x-dlx-requeues") or (self.request.headers or {}).get(
        "x-dlx-requeues"
    )
    _redis.rpush(key("flaky-runs"), f"{'plain' if plain else 'dlx'}:{n}:{requeues}")
    if not plain and requeues is None:
        raise ValueError(f"flaky {n}")
    if plain and requeues is not None:
        _redis.set(key("plain-ran-copy"), 1)
    elif not plain:
        deadline = time.monotonic() + 120
        while not _redis.exists(key("plain-ran-copy")) and time.monotonic() < deadline:
            time.sleep(0.05)
    _redis.sadd(key("flaky-done"), n)
    return n
