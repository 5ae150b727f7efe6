"""A DLX app for worker subprocesses (``celery -A tests.integration.worker_app worker``).

Its names come from ``DLX_TEST_UID``, so a test and its worker processes share queues and keys.
"""

from __future__ import annotations

import os
import signal
import time

import redis

from tests.conftest import REDIS_URL
from tests.integration.dlx_apps import make_app

UID = os.environ.get("DLX_TEST_UID", "unset")
PREFIX = f"test-{UID}"
app = make_app(UID)
_redis = redis.Redis.from_url(REDIS_URL)


def key(name: str) -> str:
    return "{" + PREFIX + "}:test:" + name


@app.task(name="crash.block_once")
def block_once() -> str:
    """Blocks on its first run (the test kills the worker then); succeeds afterwards."""
    if _redis.incr(key("block_once")) == 1:
        _redis.set(key("started"), "1")
        time.sleep(300)
    return "ok"


@app.task(name="crash.suicide")
def suicide() -> None:
    """Kills the pool process running it, every time."""
    _redis.incr(key("suicide"))
    os.kill(os.getpid(), signal.SIGKILL)
