"""``dlx_parent_parks``: a prefork worker's main process writes the parks of its pool's runs to
Redis, in batches, and acks each original only after its park is in; a park it cannot write
goes to the dead-letter path. Real workers (``celery worker -P prefork``), a real broker and
Redis; the log line of each park says which process wrote it."""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery.events.receiver import EventReceiver

from celery_dlx.message.names import WIRE_HEADERS_PROPERTY
from celery_dlx.wiring.runtime import get_runtime
from tests.chaos.servers import own_redis
from tests.conftest import ROOT
from tests.integration.dlx_apps import make_app, queue_names
from tests.integration.helpers import queue_depth, wait_until

pytestmark = pytest.mark.integration

TASKS = 40
PARKED_LINE = re.compile(r"/(MainProcess|ForkPoolWorker-\d+)\] parked pp\.park_once\[")
PARKED_TWICE_LINE = re.compile(r"/(MainProcess|ForkPoolWorker-\d+)\] parked pp\.park_twice\[")
REQUEUED_LINE = re.compile(r"/(MainProcess|ForkPoolWorker-\d+)\] requeued pp\.fail_twice\[")


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    return tmp_path


class Worker:
    """``celery worker -P POOL -c 1`` (prefork unless asked) on the test app, its log in a file."""

    def __init__(
        self,
        uid: str,
        log: Path,
        env: dict[str, str],
        pool: str = "prefork",
        without: tuple[str, ...] = ("gossip", "mingle", "heartbeat"),
    ) -> None:
        cmd = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.parent_parks_app",
            "worker",
            "-P",
            pool,
            "-c",
            "1",
            "-l",
            "INFO",
            *(f"--without-{what}" for what in without),
            "-n",
            f"parent-parks-{uid}@%h",
        ]
        self.log = log
        self._out = log.open("wb")
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "DLX_TEST_UID": uid, **env},
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def ready(self) -> bool:
        assert self.proc.poll() is None, self.text()[-3000:]
        return " ready." in self.text()

    def stop(self) -> None:
        """Warm shutdown; a message it had not acked goes back to its queue."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._out.close()


@pytest.fixture
def start_worker(
    uid: str, workdir: Path, cleanup_queues: list[str], key_prefix: str
) -> Iterator[Any]:
    started: list[Worker] = []
    app = make_app(uid)
    cleanup_queues.extend([*queue_names(app), f"exchange:dlx-{uid}", f"exchange:work-{uid}"])

    def start(
        pool: str = "prefork",
        without: tuple[str, ...] = ("gossip", "mingle", "heartbeat"),
        **env: str,
    ) -> Worker:
        w = Worker(uid, workdir / f"worker{len(started)}.log", env, pool, without)
        started.append(w)
        wait_until(w.ready, timeout=60, what="the worker")
        return w

    yield start
    for w in started:
        w.stop()


def wait_for_third_runs(redis_client: Any, uid: str, ids: set[str]) -> None:
    """Wait until every one of ``ids`` has had its third run (the test tasks that fail twice
    mark it in ``{test-<uid>}:test:done``)."""
    done = "{test-" + uid + "}:test:done"
    wait_until(
        lambda: {i.decode() for i in redis_client.smembers(done)} == ids,
        timeout=90,
        what="every message's third run",
    )


#: The receiver's queue is declared here and consumed by the thread's channel: not exclusive
#: (Celery 5.5 made it exclusive by default, with the option; before, it never was).
_NOT_EXCLUSIVE = (
    {"queue_exclusive": False}
    if "queue_exclusive" in inspect.signature(EventReceiver.__init__).parameters
    else {}
)


@contextlib.contextmanager
def parked_events(app: Any) -> Iterator[dict[str, str]]:
    """The ``task-parked`` events sent while in the block: the node name per task id (a Celery
    event receiver, as Flower's, its queue bound before the block starts)."""
    seen: dict[str, str] = {}
    with app.connection_for_read() as conn:
        receiver = app.events.Receiver(
            conn,
            handlers={"task-parked": lambda e: seen.setdefault(e["uuid"], e["hostname"])},
            queue_expires=60,
            **_NOT_EXCLUSIVE,
        )
        receiver.queue(conn.default_channel).declare()
        thread = threading.Thread(
            target=receiver.capture, kwargs={"limit": None, "wakeup": False}, daemon=True
        )
        thread.start()
        try:
            yield seen
        finally:
            receiver.should_stop = True
            thread.join(10)


@pytest.mark.parametrize(
    ("parent_parks", "writer"), [("1", "MainProcess"), ("0", "ForkPoolWorker")]
)
def test_each_park_is_written_by_the_process_the_setting_names_and_acked_after(
    uid: str,
    parent_parks: str,
    writer: str,
    start_worker: Any,
    redis_client: Any,
    broker: Any,
) -> None:
    app = make_app(uid)
    runtime = get_runtime(app)
    w = start_worker(DLX_TEST_PARENT_PARKS=parent_parks, DLX_TEST_TASK_EVENTS="1")
    with parked_events(app) as seen:
        ids = {app.send_task("pp.park_once").id for _ in range(TASKS)}
        wait_until(lambda: runtime.parking.count() == TASKS, timeout=90, what="every park")
        wait_until(lambda: ids <= seen.keys(), timeout=30, what="every task-parked event")
    w.stop()  # what it had not acked would be back in the queue now
    # whichever process writes the park, its event names the worker's node
    assert {seen[i] for i in ids} == {f"parent-parks-{uid}@{socket.gethostname()}"}
    channel = broker.channel()
    assert queue_depth(channel, f"work-{uid}") == 0
    assert queue_depth(channel, f"dead-{uid}") == 0
    assert int(redis_client.get("{test-" + uid + "}:test:runs")) == TASKS  # each ran once
    writers = [m.group(1).split("-")[0] for m in PARKED_LINE.finditer(w.text())]
    assert writers == [writer] * TASKS
    parked = [f for _, f in runtime.history.read() if f.get("fate") == "parked"]
    assert len(parked) == TASKS
    # A Celery producer's header table is written back byte for byte: no raw copy is stored
    # (the main process cut what the pool process handed over whole).
    entries = runtime.parking.peek(TASKS)
    assert len(entries) == TASKS
    assert [e.entry_id for e in entries if WIRE_HEADERS_PROPERTY in e.properties] == []


def test_a_park_the_main_process_cannot_write_goes_to_the_dlx_service_naming_its_fate(
    uid: str, workdir: Path, start_worker: Any, redis_client: Any, broker: Any
) -> None:
    with own_redis(workdir / "redis") as dlx_redis:
        w = start_worker(DLX_TEST_REDIS_URL=dlx_redis.url)
        dlx_redis.kill()  # celery_dlx's Redis is down; the broker and the task's Redis are not
        for _ in range(3):
            make_app(uid).send_task("pp.park_once")
        channel = broker.channel()
        wait_until(
            lambda: queue_depth(channel, f"dead-{uid}") == 3, timeout=90, what="the dead letters"
        )
        w.stop()
    assert queue_depth(channel, f"work-{uid}") == 0
    assert int(redis_client.get("{test-" + uid + "}:test:runs")) == 3
    text = w.text()
    # One line for the outage, not one per message; each copy went to the DLX service naming
    # its fate (a rejection would read as a burial there).
    assert len(re.findall(r"/MainProcess\] celery_dlx: parked copies failing", text)) == 1, text[
        -3000:
    ]
    assert "could not park" not in text
    assert not PARKED_LINE.search(text)


@pytest.mark.parametrize(
    ("pool", "prefetch"), [("prefork", "1"), ("prefork", "10"), ("threads", "1")]
)
def test_a_parked_message_the_drain_returns_runs_again_on_the_same_worker(
    uid: str, pool: str, prefetch: str, start_worker: Any, redis_client: Any, broker: Any
) -> None:
    """The main process acked each original after its park: the drained copies are delivered
    to the same worker and run until they succeed (with a prefetch of 1 too, where an ack that
    never came would stop the worker's deliveries: an ack asked for from inside an event-loop
    callback waited for the loop's next event, and a threads-pool worker at prefetch 1 had none)."""
    app = make_app(uid)
    w = start_worker(pool, DLX_TEST_PARENT_PARKS="1", DLX_TEST_PREFETCH=prefetch)
    ids = {app.send_task("pp.park_twice").id for _ in range(10)}
    wait_for_third_runs(redis_client, uid, ids)
    w.stop()
    assert queue_depth(broker.channel(), f"work-{uid}") == 0
    fates = [f.get("fate") for _, f in get_runtime(app).history.read()]
    assert fates.count("parked") == 20 and fates.count("drained") == 20
    writers = {m.group(1).split("-")[0] for m in PARKED_TWICE_LINE.finditer(w.text())}
    assert writers == {"MainProcess"}


@pytest.mark.parametrize(
    ("pool", "parent_parks", "writer"),
    [
        ("prefork", "1", "MainProcess"),
        ("prefork", "0", "ForkPoolWorker"),
        ("threads", "1", "MainProcess"),
    ],
)
def test_each_requeue_is_published_by_the_process_the_setting_names_and_runs_again(
    uid: str,
    pool: str,
    parent_parks: str,
    writer: str,
    start_worker: Any,
    redis_client: Any,
    broker: Any,
) -> None:
    """A requeued copy is published (confirmed) by the main process, batched, and the original
    acked after: each message runs three times (two requeues at the tail, then a success), its
    history holds both requeues, and nothing is left in the queue or dead-lettered."""
    app = make_app(uid)
    w = start_worker(pool, DLX_TEST_PARENT_PARKS=parent_parks, DLX_TEST_PREFETCH="10")
    ids = {app.send_task("pp.fail_twice").id for _ in range(TASKS)}
    wait_for_third_runs(redis_client, uid, ids)
    w.stop()
    channel = broker.channel()
    assert queue_depth(channel, f"work-{uid}") == 0
    assert queue_depth(channel, f"dead-{uid}") == 0
    for i in ids:  # no copy ran twice: each original was acked once its copy was confirmed
        assert int(redis_client.get("{test-" + uid + "}:test:fails:" + i)) == 3
    requeued = [f for _, f in get_runtime(app).history.read() if f.get("fate") == "requeued"]
    assert len(requeued) == 2 * TASKS
    assert {f.get("message_id") for f in requeued} == ids
    writers = [m.group(1).split("-")[0] for m in REQUEUED_LINE.finditer(w.text())]
    assert writers == [writer] * (2 * TASKS)


@pytest.mark.parametrize("parent_parks", ["1", "0"])
def test_fate_events_follow_the_worker_s_task_event_switch(
    uid: str, parent_parks: str, start_worker: Any
) -> None:
    """A worker that sends no task events (no ``-E``) sends no fate events either, whichever
    process writes the park; ``celery control enable_events`` (what Flower broadcasts) turns
    them on, ``disable_events`` off again, as for Celery's own task events. (Celery's remote
    switch needs the worker's event dispatcher on: its heartbeats keep it on.)"""
    app = make_app(uid)
    runtime = get_runtime(app)
    w = start_worker(without=("gossip", "mingle"), DLX_TEST_PARENT_PARKS=parent_parks)
    node = f"parent-parks-{uid}@{socket.gethostname()}"

    def park(count: int, total: int) -> set[str]:
        ids = {app.send_task("pp.park_once").id for _ in range(count)}
        wait_until(lambda: runtime.parking.count() == total, timeout=90, what="the parks")
        return ids

    with parked_events(app) as seen:
        quiet = park(5, 5)
        app.control.enable_events(destination=[node])
        wait_until(
            lambda: app.control.inspect([node], timeout=2).stats(), timeout=30, what="the node"
        )
        heard = park(5, 10)
        wait_until(lambda: heard <= seen.keys(), timeout=30, what="the events once enabled")
        app.control.disable_events(destination=[node])
        app.control.inspect([node], timeout=2).stats()  # the broadcast was handled
        quiet |= park(5, 15)
        # an event of the first or last five would have arrived by now: the receiver got
        # the five enabled ones, sent after the first five and before the last five
        app.send_task("pp.park_once")
        wait_until(lambda: runtime.parking.count() == 16, timeout=90, what="a last park")
    w.stop()
    assert not quiet & seen.keys()
