"""DESIGN.md guarantee 9 in a real prefork worker: after requeues, parks and a burial, its main
process and its pool process still hold the original functions of the standard library, billiard,
Celery and py-amqp, as a fresh interpreter imports them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery.result import AsyncResult
from kombu import Connection

from celery_dlx import dlx_details
from tests.conftest import BROKER_URL, REDIS_URL, ROOT, forget
from tests.integration.dlx_apps import make_app
from tests.integration.helpers import queue_depth, wait_until
from tests.integration.originals import WATCHED, result_settings

pytestmark = pytest.mark.slow

#: Watched names, and the result backend class's ``_get_result_meta``.
NAMES = (*WATCHED, "result backend class:_get_result_meta")
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def fresh_snapshot(backend_class: str) -> dict[str, Any]:
    """The watched functions as a fresh interpreter imports them."""
    code = (
        "import json, sys\n"
        "from tests.integration.originals import snapshot\n"
        "print(json.dumps(snapshot(sys.argv[1])))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, backend_class],
        cwd=ROOT,
        env=ENV,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    snapshot: dict[str, Any] = json.loads(out)
    return snapshot


def run_worker_through_fates(uid: str, client: Any, channel: Any) -> dict[str, Any]:
    """Start a prefork worker, send it tasks that requeue, park and get buried, and return what
    its pool process and its main process report."""
    app = make_app(uid, **result_settings(uid, REDIS_URL))
    prefix = "{test-" + uid + "}:test:"
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.integration.originals_app",
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
        f"originals-{uid}@%h",
    ]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**ENV, "DLX_TEST_UID": uid}, start_new_session=True)
    try:
        requeued = app.send_task("originals.requeue_once")
        failed = app.send_task("originals.fail_once")
        parked = app.send_task("originals.park")
        buried = app.send_task("originals.bury")
        assert requeued.get(timeout=60) == "ok"
        assert failed.get(timeout=60) == "ok"
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, timeout=60, what="the burial")
        wait_until(lambda: parked.state == "RETRY", timeout=60, what="the park")
        fates = {
            name: (dlx_details(result) or {}).get("fate")
            for name, result in (
                ("requeue", requeued),
                ("fail", failed),
                ("park", parked),
                ("bury", buried),
            )
        }
        assert fates == {
            "requeue": "recovered",
            "fail": "recovered",
            "park": "parked",
            "bury": "buried",
        }
        assert AsyncResult(buried.id, app=app).state == "FAILURE"
        app.send_task("originals.report")
        wait_until(lambda: client.get(prefix + "child"), timeout=60, what="the pool's report")
        proc.send_signal(signal.SIGTERM)  # warm shutdown: the main process reports
        proc.wait(60)
        child = json.loads(client.get(prefix + "child"))
        main = json.loads(client.get(prefix + "main") or "null")
        assert main is not None, "the main process did not report at shutdown"
        assert child["pid"] != main["pid"]
        return {"child": child, "main": main}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


@pytest.fixture(scope="module")
def reports() -> Iterator[dict[str, Any]]:
    uid = uuid.uuid4().hex[:10]
    client = redis.Redis.from_url(REDIS_URL)
    broker = Connection(BROKER_URL)
    channel = broker.channel()
    try:
        got = run_worker_through_fates(uid, client, channel)
        got["fresh"] = fresh_snapshot("celery.backends.redis:RedisBackend")
        yield got
    finally:
        broker.release()
        client.close()
        forget(uid)  # its keys, queues and exchanges (Celery's work-<uid> exchange too)


def test_the_worker_ran_its_dlx_tasks_through_the_settling_tracer(reports: dict[str, Any]) -> None:
    assert reports["child"]["settling"] == [True, True, True, True]
    assert reports["child"]["backend"] == reports["main"]["backend"] == "RedisBackend"


@pytest.mark.parametrize("process", ["main", "child"])
@pytest.mark.parametrize("name", NAMES)
def test_worker_processes_hold_the_original_functions(
    reports: dict[str, Any], process: str, name: str
) -> None:
    held = reports[process]["functions"][name]
    original = reports["fresh"][name]
    assert held == original, f"{name} in the worker's {process} process was replaced: {held}"
