"""A worker killed with SIGKILL mid-task: the redelivery counts as an attempt, and is bounded."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from celery_dlx.store.history import History
from tests.conftest import ROOT
from tests.integration.dlx_apps import drain_thread, make_app, queue_names
from tests.integration.helpers import fates_of, queue_depth, wait_until

pytestmark = pytest.mark.slow


@contextmanager
def worker_process(uid: str) -> Iterator[subprocess.Popen[bytes]]:
    """A prefork worker (one child) in its own process group."""
    env = {**os.environ, "DLX_TEST_UID": uid, "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.integration.worker_app",
        "worker",
        "-P",
        "prefork",
        "-c",
        "1",
        "-l",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"crash-{uid}-{os.urandom(2).hex()}@%h",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def app(uid: str, key_prefix: str, cleanup_queues: list[str]) -> Any:
    app = make_app(uid)
    cleanup_queues.extend(queue_names(app))
    return app


def test_worker_killed_mid_task_counts_an_attempt(
    app: Any, uid: str, redis_client: Any, key_prefix: str, keys: Any
) -> None:
    started = "{" + key_prefix + "}:test:started"
    with worker_process(uid) as first:
        result = app.send_task("crash.block_once")
        wait_until(lambda: redis_client.get(started), timeout=60, what="the task to start")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    with worker_process(uid):
        wait_until(
            lambda: "recovered" in fates_of(redis_client, keys, result.id),
            timeout=60,
            what="recovery",
        )
    assert int(redis_client.get("{" + key_prefix + "}:test:block_once")) == 2
    assert fates_of(redis_client, keys, result.id) == ["requeued", "recovered"]
    [requeued] = [f for _, f in History(redis_client, keys).read() if f["fate"] == "requeued"]
    assert (
        requeued["exc_type"] == "celery_dlx.worker.task.Redelivered" and requeued["attempt"] == "1"
    )


def test_task_that_kills_its_worker_is_buried_after_the_budget(
    app: Any, uid: str, redis_client: Any, key_prefix: str, keys: Any, broker: Any
) -> None:
    channel = broker.channel()
    with worker_process(uid), drain_thread(app):
        result = app.send_task("crash.suicide")
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, timeout=120, what="the burial")
    assert int(redis_client.get("{" + key_prefix + "}:test:suicide")) == 1 + 2 + 2
    assert fates_of(redis_client, keys, result.id) == [
        "requeued",
        "requeued",
        "parked",
        "drained",
        "parked",
        "drained",
    ]
