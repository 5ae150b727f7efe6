"""Fate changes reach a real Flower process as task events: its HTTP API and /metrics show them."""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_dlx.fates import BURIED, DRAINED, PARKED, REPLAYED, REQUEUED, FateEvent
from celery_dlx.integrations import EventSender, install_integrations
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL, REDIS_URL

AUTH = "dlx:flower-test"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Flower:
    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"
        self.auth = "Basic " + base64.b64encode(AUTH.encode()).decode()

    def get(self, path: str) -> tuple[int, bytes]:
        request = urllib.request.Request(self.base + path, headers={"Authorization": self.auth})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read()

    def json(self, path: str) -> Any:
        status, body = self.get(path)
        assert status == 200, (path, status, body[:200])
        return json.loads(body)

    def task(self, task_id: str) -> dict[str, Any] | None:
        status, body = self.get(f"/api/task/info/{task_id}")
        return json.loads(body) if status == 200 else None

    def metric(self, name: str, **labels: str) -> float:
        _, body = self.get("/metrics")
        total = 0.0
        for line in body.decode().splitlines():
            if not line.startswith(name + "{"):
                continue
            found = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line.split("}", 1)[0]))
            if all(found.get(k) == v for k, v in labels.items()):
                total += float(line.rsplit(" ", 1)[1])
        return total


def wait_until(check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def app(uid: str, key_prefix: str) -> Iterator[Celery]:
    app = Celery(f"flower-test-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(dlx_key_prefix=key_prefix, dlx_redis_url=REDIS_URL)
    yield app
    app.close()


@pytest.fixture
def flower(tmp_path: Path) -> Iterator[Flower]:
    port = _free_port()
    log = open(tmp_path / "flower.log", "wb")  # noqa: SIM115 - closed below
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLOWER_")}
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "celery", f"--broker={BROKER_URL}", "flower",
            f"--port={port}", "--address=127.0.0.1", f"--basic_auth={AUTH}",
        ],
        stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    client = Flower(port)
    try:

        def healthy() -> bool:
            if proc.poll() is not None:
                raise AssertionError((tmp_path / "flower.log").read_text()[-3000:])
            try:
                return client.get("/healthcheck")[0] == 200
            except OSError:
                return False

        wait_until(healthy, "Flower to answer HTTP")
        yield client
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _event(fate: str, message_id: str, **kw: Any) -> FateEvent:
    return FateEvent.from_fields(
        fate=fate,
        queue=kw.pop("queue", "orders"),
        message_id=message_id,
        attempt=kw.pop("attempt", 1),
        task=kw.pop("task", "shop.charge"),
        cause=kw.pop("cause", "c0ffee0123456789"),
        exc_type="ValueError",
        exc_message="order 42 is bad",
        **kw,
    )


def _wait_for_receiver(flower: Flower, sender: EventSender, uid: str) -> None:
    """Flower binds its event queue after it answers HTTP: probe until an event is seen."""
    probe = f"probe-{uid}"

    def seen() -> bool:
        sender.send(_event(REQUEUED, probe, task="probe"))
        return wait_for_task(flower, probe, timeout=1.0) is not None

    wait_until(seen, "Flower's event receiver")


def wait_for_task(
    flower: Flower, task_id: str, state: str | None = None, timeout: float = 30.0
) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = flower.task(task_id)
        if info is not None and (state is None or info.get("state") == state):
            return info
        time.sleep(0.1)
    return None


def test_each_fate_change_is_a_task_event_flower_shows_and_counts(
    app: Celery, flower: Flower, uid: str
) -> None:
    runtime = get_runtime(app)
    added = install_integrations(app, runtime)
    sender = next(listener for listener in added if isinstance(listener, EventSender))
    assert install_integrations(app, runtime) == []  # idempotent
    _wait_for_receiver(flower, sender, uid)
    hostname = f"celery_dlx@{socket.gethostname()}"
    task = f"shop.charge.{uid}"
    before = {
        t: flower.metric("flower_events_total", type=t, task=task)
        for t in ("task-requeued", "task-parked", "task-buried", "task-replayed")
    }
    assert before == dict.fromkeys(before, 0.0)

    message = f"msg-{uid}"
    runtime.record(_event(REQUEUED, message, task=task, attempt=1), history=False)
    info = wait_for_task(flower, message, "REQUEUED")
    assert info is not None, "task-requeued not seen"
    assert info["name"] == task
    assert info["worker"] == hostname
    assert info["exception"] == "ValueError('order 42 is bad')"
    assert info["result"] == "requeued queue=orders attempt=1 cause=c0ffee0123456789"

    runtime.record(_event(PARKED, message, task=task, attempt=3, delay=12.5), history=False)
    info = wait_for_task(flower, message, "PARKED")
    assert info is not None, "task-parked not seen"
    assert "attempt=3" in info["result"] and "delay=12.500s" in info["result"]

    traceback = "Traceback (most recent call last):\n  ...\nValueError: order 42 is bad\n"
    runtime.record(
        _event(
            BURIED, message, task=task, attempt=8, reason="park budget spent", traceback=traceback
        ),
        history=False,
    )
    info = wait_for_task(flower, message, "BURIED")
    assert info is not None, "task-buried not seen"
    assert info["traceback"] == traceback
    assert "attempt=8" in info["result"] and "reason=park budget spent" in info["result"]

    runtime.record(
        _event(REPLAYED, message, task=task, attempt=8, extra={"obituary_id": "ob-1"}),
        history=False,
    )
    assert wait_for_task(flower, message, "REPLAYED") is not None, "task-replayed not seen"
    runtime.record(_event(DRAINED, message, task=task), history=False)  # not an event type

    listed = flower.json(f"/api/tasks?taskname={task}")
    assert listed[message]["state"] == "REPLAYED"
    assert flower.json(f"/api/tasks?state=REPLAYED&taskname={task}").keys() == {message}

    def counted() -> dict[str, float]:
        got = {
            t: flower.metric("flower_events_total", type=t, task=task, worker=hostname)
            for t in ("task-requeued", "task-parked", "task-buried", "task-replayed")
        }
        return got if all(got.values()) else {}

    assert wait_until(counted, "flower_events_total") == {
        "task-requeued": 1.0,
        "task-parked": 1.0,
        "task-buried": 1.0,
        "task-replayed": 1.0,
    }
    # this test's task only: Flower counts every event on the vhost, whoever sends it
    assert flower.metric("flower_events_total", type="task-drained", task=task) == 0.0


def test_retry_events_keep_the_custom_state_until_success(
    app: Celery, flower: Flower, uid: str
) -> None:
    runtime = get_runtime(app)
    sender = EventSender(runtime)
    _wait_for_receiver(flower, sender, uid)
    message, task = f"retry-{uid}", f"shop.charge.{uid}"
    sender.send(_event(REQUEUED, message, task=task))
    assert wait_for_task(flower, message, "REQUEUED") is not None
    with app.events.default_dispatcher(hostname=f"worker-{uid}@test") as dispatcher:
        dispatcher.send("task-received", uuid=message, name=task, args="()", kwargs="{}")
        dispatcher.send("task-started", uuid=message)
    sender.send(_event(PARKED, f"marker-{uid}", task=task))  # events arrive in order
    assert wait_for_task(flower, f"marker-{uid}", "PARKED") is not None
    assert flower.task(message)["state"] == "REQUEUED"  # type: ignore[index]
    with app.events.default_dispatcher(hostname=f"worker-{uid}@test") as dispatcher:
        dispatcher.send("task-succeeded", uuid=message, result="'ok'", runtime=0.01)
    info = wait_for_task(flower, message, "SUCCESS")
    assert info is not None and info["result"] == "'ok'"


def test_kept_connection_lost_is_replaced_and_the_event_still_arrives(
    app: Celery, flower: Flower, uid: str
) -> None:
    """The sender keeps one connection; when the broker side of it is gone, the next event goes
    out on a fresh one (and the sender can be closed and used again)."""
    runtime = get_runtime(app)
    sender = EventSender(runtime)
    _wait_for_receiver(flower, sender, uid)
    (hostname,) = sender._dispatchers
    kept = sender._dispatchers[hostname]
    kept.connection.connection.transport.sock.shutdown(socket.SHUT_RDWR)  # a dead TCP link
    message = f"after-loss-{uid}"
    sender.send(_event(PARKED, message, task=f"shop.charge.{uid}"))
    assert wait_for_task(flower, message, "PARKED") is not None
    assert sender._dispatchers[hostname] is not kept
    sender.close()
    assert not sender._dispatchers
    again = f"after-close-{uid}"
    sender.send(_event(REQUEUED, again, task=f"shop.charge.{uid}"))
    assert wait_for_task(flower, again, "REQUEUED") is not None
    sender.close()


def test_a_batch_of_fate_changes_goes_out_as_one_message_flower_shows_each(
    app: Celery, flower: Flower, uid: str
) -> None:
    """A worker's main process tells of the parks it wrote in one batch at once: one
    ``task.multi`` message (a list of events, Celery's own format) under the worker's node name;
    Flower shows and counts each event as if it had come alone."""
    runtime = get_runtime(app)
    sender = EventSender(runtime)
    _wait_for_receiver(flower, sender, uid)
    task = f"shop.batch.{uid}"
    node = f"worker-{uid}@test"
    batch = [_event(PARKED, f"batch-{uid}-{n}", task=task, attempt=n, delay=5.0) for n in (1, 2, 3)]
    batch.append(_event(DRAINED, f"batch-{uid}-1", task=task))  # a fate with no event: skipped
    with runtime.acting_for(node):
        assert sender.notify_many(batch) == 3
    for n in (1, 2, 3):
        info = wait_for_task(flower, f"batch-{uid}-{n}", "PARKED")
        assert info is not None, f"event {n} of the batch not seen"
        assert info["worker"] == node
        assert f"attempt={n}" in info["result"] and "delay=5.000s" in info["result"]
    assert flower.metric("flower_events_total", type="task-parked", task=task) == 3.0
    assert [key for key in sender._dispatchers if key[1]] == [(node, True)]  # one batching one
    sender.close()


def test_warm_connects_before_the_first_event_which_uses_that_connection(
    app: Celery, flower: Flower, uid: str
) -> None:
    """A worker process warms the sender when it starts: the broker connection is made then,
    and the first fate change sends on it instead of connecting. Not in a worker that starts
    without task events (no ``-E``): its fate events follow that switch, so none go out until
    events are turned on, and it holds no idle connection meanwhile."""
    sender = EventSender(get_runtime(app))
    sender.warm()
    assert sender._connection is None  # started without task events: nothing to send yet
    app.conf.worker_send_task_events = True  # celery worker -E
    sender.warm()
    warmed = sender._connection
    assert warmed is not None and warmed.connected
    _wait_for_receiver(flower, sender, uid)
    message = f"warm-{uid}"
    sender.send(_event(PARKED, message, task=f"shop.charge.{uid}"))
    assert wait_for_task(flower, message, "PARKED") is not None
    assert sender._connection is warmed
    (dispatcher,) = sender._dispatchers.values()
    assert dispatcher.connection is warmed
    sender.close()
    assert sender._connection is None and not warmed.connected


def test_foreign_message_events_and_disabled_setting(app: Celery, flower: Flower, uid: str) -> None:
    runtime = get_runtime(app)
    sender = EventSender(runtime)
    _wait_for_receiver(flower, sender, uid)
    message = f"sha1-{uid}"
    sender.send(_event(BURIED, message, task=None, queue=f"go-orders-{uid}"))
    info = wait_for_task(flower, message, "BURIED")
    assert info is not None
    assert info["name"] is None
    assert f"queue=go-orders-{uid}" in info["result"]

    off = Celery(f"flower-off-{uid}", broker=BROKER_URL, set_as_current=False)
    off.conf.update(dlx_key_prefix=runtime.keys.prefix, dlx_send_events=False, dlx_sentry=False)
    try:
        added = install_integrations(off, get_runtime(off))
        assert not any(isinstance(x, EventSender) for x in added)
    finally:
        off.close()


def test_real_worker_and_service_fates_reach_flower(
    flower: Flower, uid: str, cleanup_queues: list[str]
) -> None:
    """A poison message through a real worker, drain and DLX service: Flower sees every fate."""
    import threading

    from celery_dlx.service.loop import DLXService
    from tests.integration.dlx_apps import drain_thread, make_app, queue_names, worker

    # Fate events whatever the worker's own task-event switch says: with Celery's task events on
    # too, its task-failed of the last run would hold the task at FAILURE in Flower (a ready
    # state outranks a custom one); test_parent_parks tests the switch itself.
    app = make_app(uid, dlx_events_follow_worker=False)
    cleanup_queues.extend(queue_names(app))
    task_name = f"charge-{uid}"

    @app.task(name=task_name)
    def charge(order_id: int) -> None:
        raise ValueError(f"order {order_id} is bad")

    runtime = get_runtime(app)
    sender = next(x for x in runtime.listeners if isinstance(x, EventSender))
    _wait_for_receiver(flower, sender, uid)
    service = DLXService(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        with worker(app), drain_thread(app):
            task_id = charge.delay(7).id
            info = wait_for_task(flower, task_id, "BURIED", timeout=90)
    finally:
        service.stop()
        thread.join(30)
    assert info is not None, "task-buried not seen"
    assert info["name"] == task_name
    assert "ValueError: order 7 is bad" in info["traceback"]
    assert info["result"].startswith("buried queue=work-") and "attempt=5" in info["result"]

    service_node = f"celery_dlx@{socket.gethostname()}"

    def counted() -> dict[tuple[str, bool], float]:
        got: dict[tuple[str, bool], float] = {}
        for line in flower.get("/metrics")[1].decode().splitlines():
            if line.startswith("flower_events_total{") and f'task="{task_name}"' in line:
                labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
                key = (labels["type"], labels["worker"] == service_node)
                got[key] = got.get(key, 0.0) + float(line.rsplit(" ", 1)[1])
        return got if ("task-buried", True) in got else {}

    # requeues and parks are sent from the task's run (the worker's node name), the burial
    # by the DLX service (celery_dlx@<host>)
    assert wait_until(counted, "flower_events_total of the poison message") == {
        ("task-requeued", False): 2.0,
        ("task-parked", False): 2.0,
        ("task-buried", True): 1.0,
    }
