"""A DLX app for a prefork worker subprocess that reports which functions its processes hold
(``celery -A tests.integration.originals_app worker``; names from ``DLX_TEST_UID``).

Its tasks requeue, park and bury; ``originals.report`` then describes the watched functions in
the pool process that ran them, and the main process describes its own when it shuts down.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import signals

from celery_dlx import Bury, Park, Requeue
from celery_dlx.compat import settles
from tests.conftest import REDIS_URL
from tests.integration.dlx_apps import make_app
from tests.integration.originals import result_settings, snapshot

UID = os.environ.get("DLX_TEST_UID", "unset")
PREFIX = f"test-{UID}"
app = make_app(UID, **result_settings(UID, REDIS_URL))
_redis = redis.Redis.from_url(REDIS_URL)
#: The tasks that end in a fate.
FATE_TASKS = ("originals.requeue_once", "originals.fail_once", "originals.park", "originals.bury")


def key(name: str) -> str:
    return "{" + PREFIX + "}:test:" + name


def _report(where: str, **extra: Any) -> None:
    backend = type(app.backend)
    functions = snapshot(f"{backend.__module__}:{backend.__qualname__}")
    report = {"pid": os.getpid(), "backend": backend.__qualname__, "functions": functions}
    _redis.set(key(where), json.dumps({**report, **extra}))


@app.task(name="originals.requeue_once", bind=True)
def requeue_once(self: Any) -> str:
    if not self.request.retries:
        raise Requeue("first run")
    return "ok"


@app.task(name="originals.fail_once", bind=True)
def fail_once(self: Any) -> str:
    if not self.request.retries:
        raise ConnectionError("upstream down")
    return "ok"


@app.task(name="originals.park")
def park() -> None:
    raise Park(countdown=3600)


@app.task(name="originals.bury")
def bury() -> None:
    raise Bury("a permanent failure")


@app.task(name="originals.report")
def report() -> None:
    _report("child", settling=[settles(app.tasks[name].__trace__) for name in FATE_TASKS])


@signals.worker_shutting_down.connect
def _on_shutdown(**_: Any) -> None:
    _report("main")
