"""The drain on the real RabbitMQ and Redis: due retries reach the failed queue, and only it,
through the default exchange; refused ones are kept; concurrent and killed drains lose nothing."""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from celery import Celery
from celery.beat import Scheduler
from celery.local import maybe_evaluate
from kombu import Connection

from celery_dlx.drain.core import (
    DRAIN_TASK_NAME,
    RELEASE_DELAY,
    beat_entry,
    drain_once,
    register_drain_task,
    run_drain,
)
from celery_dlx.fates import DRAINED, FateEvent, now_ms
from celery_dlx.message.fieldtable import read_table, write_table
from celery_dlx.message.headers import read_state
from celery_dlx.message.outgoing import PUBLISH_SEQ_HEADER
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.config import load_config
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.conftest import BROKER_URL, REDIS_URL, ROOT

#: Generous bound for anything awaited (a busy CI machine), never a timing assertion.
WAIT = 60.0


def make_app(key_prefix: str, broker_url: str = BROKER_URL, **conf: Any) -> Celery:
    app = Celery(f"drain-{key_prefix}", broker=broker_url, set_as_current=False)
    settings: dict[str, Any] = {
        "dlx_redis_url": REDIS_URL,
        "dlx_key_prefix": key_prefix,
        "broker_connection_retry_on_startup": True,
    }
    app.conf.update({**settings, **conf})
    return app


@pytest.fixture
def app(key_prefix: str) -> Celery:
    return make_app(key_prefix)


@pytest.fixture
def runtime(app: Celery) -> Iterator[Runtime]:
    rt = get_runtime(app)
    yield rt
    rt.reset_publisher()


def declare(broker: Connection, cleanup: list[str], name: str) -> str:
    channel = broker.channel()
    channel.queue_declare(name, durable=True, auto_delete=False)
    channel.close()
    cleanup.append(name)
    return name


def message_count(broker: Connection, queue: str) -> int:
    channel = broker.channel()
    try:
        return int(channel.queue_declare(queue, passive=True).message_count)
    finally:
        channel.close()


def get_all(broker: Connection, queue: str) -> list[Any]:
    """Every message in ``queue`` now (the drain's confirms mean they are all there)."""
    channel = broker.channel()
    out = []
    while True:
        message = channel.basic_get(queue, no_ack=True)
        if message is None:
            break
        out.append(message)
    channel.close()
    return out


def park(
    runtime: Runtime,
    queue: str,
    count: int = 1,
    *,
    due_ms: int | None = None,
    prefix: str = "m",
    **fields: Any,
) -> list[ParkedMessage]:
    due = now_ms() - 50 if due_ms is None else due_ms
    parked = []
    for i in range(count):
        message = ParkedMessage(
            message_id=f"{prefix}{i}",
            attempt=fields.get("attempt", 2),
            queue=queue,
            body=fields.get("body", f'{{"n": {i}}}'.encode()),
            headers=dict(fields.get("headers", {"x-dlx-attempt": 2})),
            properties=dict(fields.get("properties", {"content_type": "application/json"})),
            due_ms=due,
            task=fields.get("task", "proj.tasks.add"),
            cause=fields.get("cause", "c0ffee"),
        )
        assert runtime.store.park(message)
        parked.append(message)
    return parked


def wait_for(condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


def drain_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "celery_dlx.drain.core" and r.levelno >= logging.WARNING
    ]


HEADERS = {
    "lang": "py",
    "task": "proj.tasks.add",
    "id": "4f1c-task-id",
    "retries": 0,
    "timelimit": [None, 30],
    "argsrepr": "(1, 2)",
    "x-dlx-attempt": 3,
    "x-dlx-requeues": 2,
    "x-dlx-parks": 1,
    "x-dlx-history": '[[1700000000000,"requeued","c0ffee"],[1700000001000,"parked","c0ffee"]]',
    "x-dlx-cause": "c0ffee",
    "x-dlx-first-failure-ms": 1700000000000,
    "nested": {"a": [1, "two", {"b": True}]},
}
BROKER_OWNED = {
    "x-death": [{"queue": "orders", "reason": "rejected", "count": 4, "exchange": ""}],
    "x-first-death-queue": "orders",
    "x-first-death-reason": "rejected",
    "x-first-death-exchange": "",
    "x-last-death-queue": "orders",
    "x-last-death-reason": "rejected",
    "x-delivery-count": 4,
}
PROPERTIES = {
    "content_type": "application/json",
    "content_encoding": "utf-8",
    "correlation_id": "4f1c-task-id",
    "message_id": "4f1c-message",
    "priority": 7,
    "delivery_mode": 2,
    "app_id": "proj",
    "type": "proj.tasks.add",
    "reply_to": "replies",
}


def test_a_due_retry_arrives_through_the_default_exchange_intact(
    runtime: Runtime, broker: Connection, cleanup_queues: list[str], uid: str
) -> None:
    queue = declare(broker, cleanup_queues, f"orders-{uid}")
    events: list[FateEvent] = []
    runtime.listeners.append(events.append)
    body = b'[[1, 2], {}, {"callbacks": null}]'
    due = now_ms() - 250
    park(
        runtime,
        queue,
        due_ms=due,
        body=body,
        headers={**HEADERS, **BROKER_OWNED},
        properties=PROPERTIES,
        attempt=3,
    )

    result = drain_once(runtime)

    assert (result.claimed, result.published, result.released, result.failed) == (1, 1, 0, False)
    assert result.lateness_ms[0] >= 250
    (message,) = get_all(broker, queue)
    # py-amqp decodes a body that declares a content encoding; the bytes on the wire are these.
    assert message.body.encode(message.properties["content_encoding"]) == body
    assert message.delivery_info["exchange"] == ""
    assert message.delivery_info["routing_key"] == queue
    headers = dict(message.headers)
    headers.pop(PUBLISH_SEQ_HEADER, None)
    # Intact in meaning; 64-bit ms go out as text every AMQP client reads (issue 12).
    assert headers == read_table(write_table(HEADERS))
    assert read_state(headers) == read_state(HEADERS)
    assert {k: message.properties.get(k) for k in PROPERTIES} == PROPERTIES
    assert runtime.store.count() == 0

    (event,) = events
    assert (event.fate, event.queue, event.message_id, event.attempt, event.task) == (
        DRAINED,
        queue,
        "m0",
        3,
        "proj.tasks.add",
    )
    assert event.extra["lateness_ms"] == result.lateness_ms[0]
    assert event.first_failure_ms == 1700000000000
    ((_, fields),) = runtime.history.read()
    assert (fields["fate"], fields["message_id"], fields["queue"]) == (DRAINED, "m0", queue)


def test_a_retry_not_yet_due_stays_parked(
    runtime: Runtime, broker: Connection, cleanup_queues: list[str], uid: str
) -> None:
    queue = declare(broker, cleanup_queues, f"later-{uid}")
    park(runtime, queue, due_ms=now_ms() + 60_000)
    park(runtime, queue, prefix="due-")

    result = drain_once(runtime)

    assert (result.claimed, result.published) == (1, 1)
    assert [m.body for m in get_all(broker, queue)] == [b'{"n": 0}']
    assert [m.message_id for m in runtime.store.peek()] == ["m0"]
    assert runtime.store.due_count() == 0


def test_a_retry_reaches_only_the_failed_queue_not_its_fanout_siblings(
    runtime: Runtime, broker: Connection, cleanup_queues: list[str], uid: str
) -> None:
    fanout = f"events-{uid}"
    channel = broker.channel()
    channel.exchange_declare(fanout, "fanout", durable=False, auto_delete=False)
    cleanup_queues.append(f"exchange:{fanout}")
    failed = declare(broker, cleanup_queues, f"billing-{uid}")
    sibling = declare(broker, cleanup_queues, f"audit-{uid}")
    for queue in (failed, sibling):
        channel.queue_bind(queue, fanout, "")
    channel.close()
    park(runtime, failed, count=3)

    result = drain_once(runtime)

    assert result.published == 3
    # Confirms come after routing: had the retries gone through the fanout, the sibling
    # would hold them now.
    assert message_count(broker, sibling) == 0
    assert len(get_all(broker, failed)) == 3


def test_a_retry_for_a_deleted_queue_is_released_not_deleted(
    runtime: Runtime,
    broker: Connection,
    cleanup_queues: list[str],
    uid: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    gone = f"gone-{uid}"
    kept = declare(broker, cleanup_queues, f"kept-{uid}")
    park(runtime, gone, count=3)
    park(runtime, kept, prefix="k")
    caplog.set_level(logging.WARNING, logger="celery_dlx")

    before = now_ms()
    result = drain_once(runtime)

    assert (result.claimed, result.published, result.released) == (4, 1, 3)
    assert len(get_all(broker, kept)) == 1
    assert runtime.store.count() == 3
    assert runtime.store.due_count() == 0
    scores = [m.lease_score for m in runtime.store.peek()]
    assert all(s >= before + RELEASE_DELAY * 1000 for s in scores)
    # One warning for the batch, not one per message.
    warnings = drain_warnings(caplog)
    assert len(warnings) == 1
    assert "3 parked retries" in warnings[0] and gone in warnings[0]

    # Once the queue exists again, the released retries go out on a later drain.
    declare(broker, cleanup_queues, gone)
    later = drain_once(runtime, now_ms=max(scores))
    assert later.published == 3
    assert sorted(m.body for m in get_all(broker, gone)) == [
        b'{"n": 0}',
        b'{"n": 1}',
        b'{"n": 2}',
    ]
    assert runtime.store.count() == 0


def test_concurrent_drains_deliver_every_retry_once(
    app: Celery, broker: Connection, cleanup_queues: list[str], uid: str
) -> None:
    app.conf.dlx_drain_batch = 100
    total = 3000
    drains = 4
    queue = declare(broker, cleanup_queues, f"busy-{uid}")
    runtimes = [Runtime(app, load_config(app.conf)) for _ in range(drains)]
    park(runtimes[0], queue, count=total)
    start = threading.Barrier(drains)
    results: list[Any] = [None] * drains

    def drain(index: int) -> None:
        runtime = runtimes[index]
        start.wait(timeout=WAIT)
        published = stale = 0
        while True:
            result = run_drain(runtime, budget_seconds=5.0)
            assert not result.failed
            published += result.published
            stale += result.stale
            if result.claimed == 0:
                break
        results[index] = (published, stale)

    threads = [threading.Thread(target=drain, args=(i,)) for i in range(drains)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
    finally:
        for runtime in runtimes:
            runtime.reset_publisher()

    assert all(r is not None for r in results), "a drain thread failed or hung"
    assert sum(p for p, _ in results) == total
    assert sum(s for _, s in results) == 0
    # Spread over several drains, so they really ran at once.
    assert sum(1 for p, _ in results if p > 0) > 1
    arrived = Counter(m.body for m in get_all(broker, queue))
    assert len(arrived) == total, f"lost {total - len(arrived)}"
    duplicates = sum(n - 1 for n in arrived.values())
    assert duplicates == 0
    assert runtimes[0].store.count() == 0


_FROZEN_DRAIN = textwrap.dedent(
    """
    import sys
    from celery import Celery
    from celery_dlx.drain.core import drain_once
    from celery_dlx.broker.publish import ConfirmingPublisher
    from celery_dlx.wiring.runtime import get_runtime

    broker, redis_url, prefix, lease = sys.argv[1:5]

    def freeze(self, messages):
        # Stop between claim and publish: tell the test, then wait for a kill -9.
        print(f"claimed {len(messages)}", flush=True)
        sys.stdin.read()
        raise SystemExit("the test closed stdin instead of killing this drain")

    ConfirmingPublisher.publish_many = freeze
    app = Celery("frozen", broker=broker, set_as_current=False)
    app.conf.update(dlx_redis_url=redis_url, dlx_key_prefix=prefix, dlx_drain_lease=float(lease))
    drain_once(get_runtime(app))
    """
)


def test_a_drain_killed_after_claiming_loses_nothing(
    runtime: Runtime, broker: Connection, cleanup_queues: list[str], uid: str, key_prefix: str
) -> None:
    queue = declare(broker, cleanup_queues, f"killed-{uid}")
    park(runtime, queue, count=50)
    child = subprocess.Popen(
        [sys.executable, "-c", _FROZEN_DRAIN, BROKER_URL, REDIS_URL, key_prefix, "1.5"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], WAIT)
        assert ready, "the drain subprocess never claimed"
        assert child.stdout.readline().strip() == b"claimed 50"
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait(WAIT) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(WAIT)

    assert message_count(broker, queue) == 0
    assert runtime.store.count() == 50
    # Still leased to the dead drain: every entry was re-scored past its due time.
    due = max(m.due_ms for m in runtime.store.peek(limit=50))
    assert min(m.lease_score for m in runtime.store.peek(limit=50)) > due

    wait_for(lambda: runtime.store.due_count() == 50, "the dead drain's lease to run out")
    result = drain_once(runtime)

    assert (result.claimed, result.published) == (50, 50)
    assert len({m.body for m in get_all(broker, queue)}) == 50
    assert runtime.store.count() == 0


class CuttableProxy:
    """A TCP proxy to RabbitMQ whose open connections the test can cut, as a network failure."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        with self.lock:
            sockets, self.sockets = self.sockets, []
        for s in sockets:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.listener.close()
        self.cut()


def test_a_lost_broker_connection_keeps_the_batch_and_logs_one_warning(
    key_prefix: str,
    broker: Connection,
    cleanup_queues: list[str],
    uid: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = CuttableProxy(("127.0.0.1", 5672))
    app = make_app(key_prefix, f"amqp://guest:guest@127.0.0.1:{proxy.port}//")
    runtime = get_runtime(app)
    queue = declare(broker, cleanup_queues, f"flaky-{uid}")
    caplog.set_level(logging.WARNING, logger="celery_dlx")
    try:
        park(runtime, queue, count=5, prefix="a")
        assert drain_once(runtime).published == 5  # the publisher is connected through the proxy

        park(runtime, queue, count=5, prefix="b")
        proxy.cut()
        result = drain_once(runtime)

        assert (result.claimed, result.published, result.failed) == (5, 0, True)
        assert len(drain_warnings(caplog)) == 1
        assert runtime.store.count() == 5  # nothing deleted
        assert runtime.store.due_count() == 0  # nothing released: the lease brings them back
        lease_end = max(m.lease_score for m in runtime.store.peek())

        again = drain_once(runtime, now_ms=lease_end)  # reconnects
        assert (again.claimed, again.published, again.failed) == (5, 5, False)
        assert runtime.store.count() == 0
        assert message_count(broker, queue) == 10
    finally:
        runtime.reset_publisher()
        proxy.close()


def test_a_broker_lost_during_a_backlog_run_loses_nothing(
    key_prefix: str,
    broker: Connection,
    cleanup_queues: list[str],
    uid: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = CuttableProxy(("127.0.0.1", 5672))
    app = make_app(key_prefix, f"amqp://guest:guest@127.0.0.1:{proxy.port}//", dlx_drain_batch=10)
    runtime = get_runtime(app)
    queue = declare(broker, cleanup_queues, f"cut-{uid}")
    park(runtime, queue, count=50)
    # The connection drops right after the first batch is recorded, while the run has more
    # full batches to go (one of them claimed ahead).
    runtime.listeners.append(lambda event: proxy.cut())
    caplog.set_level(logging.WARNING, logger="celery_dlx")
    try:
        result = run_drain(runtime, budget_seconds=WAIT)

        assert (result.published, result.failed) == (10, True)
        assert len(drain_warnings(caplog)) == 1
        assert message_count(broker, queue) == 10
        assert runtime.store.count() == 40
        # The batch whose publish failed stays leased; the batch claimed ahead, never
        # published, is due again at once.
        assert runtime.store.due_count() == 30
        lease_end = max(m.lease_score for m in runtime.store.peek(limit=50))

        runtime.listeners.clear()
        again = drain_once(runtime, now_ms=lease_end)
        while again.claimed:
            again = drain_once(runtime, now_ms=lease_end)
        assert runtime.store.count() == 0
        assert len({m.body for m in get_all(broker, queue)}) == 50
    finally:
        runtime.reset_publisher()
        proxy.close()


def test_an_unreachable_redis_fails_the_drain_with_one_warning(
    key_prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    app = make_app(key_prefix, dlx_redis_url=f"redis://127.0.0.1:{closed_port}/0")
    caplog.set_level(logging.WARNING, logger="celery_dlx")

    runtime = get_runtime(app)
    result = run_drain(runtime, budget_seconds=1.0)

    assert (result.claimed, result.failed) == (0, True)
    assert len(drain_warnings(caplog)) == 1
    # Beat ticks every second during an outage: still one line for the whole outage.
    for _ in range(3):
        assert run_drain(runtime, budget_seconds=1.0).failed
    assert len(drain_warnings(caplog)) == 1


def test_run_drain_empties_a_backlog_of_many_batches(
    app: Celery, broker: Connection, cleanup_queues: list[str], uid: str
) -> None:
    app.conf.dlx_drain_batch = 50
    runtime = get_runtime(app)
    queue = declare(broker, cleanup_queues, f"backlog-{uid}")
    park(runtime, queue, count=520)
    try:
        result = run_drain(runtime, budget_seconds=WAIT)
    finally:
        runtime.reset_publisher()

    assert (result.claimed, result.published, result.failed, result.batches) == (
        520,
        520,
        False,
        11,
    )
    assert len(result.lateness_ms) == 520
    assert message_count(broker, queue) == 520
    assert runtime.history.length() == 520
    assert runtime.store.count() == 0


def test_the_drain_task_and_its_beat_entry(
    key_prefix: str, broker: Connection, cleanup_queues: list[str], uid: str
) -> None:
    ticks = f"ticks-{uid}"
    app = make_app(key_prefix, task_default_queue=ticks, dlx_drain_interval=2.5)
    register_drain_task(app)
    register_drain_task(app)  # harmless twice
    app.finalize()
    task = app.tasks[DRAIN_TASK_NAME]
    assert maybe_evaluate(register_drain_task(app)) is task  # and after the app is finalized

    assert task.name == DRAIN_TASK_NAME
    assert task.ignore_result is True
    assert task.acks_late is False
    assert task.max_retries == 0

    config = get_runtime(app).config
    entry = beat_entry(config)
    assert entry == {DRAIN_TASK_NAME: {"task": DRAIN_TASK_NAME, "schedule": 2.5}}

    # Beat reads the entry, and a tick it sends names the task and never expires (an expiring
    # tick in a queue with a dead-letter exchange would be dead-lettered).
    app.conf.beat_schedule = entry
    declare(broker, cleanup_queues, ticks)
    scheduler = Scheduler(app, lazy=False)
    scheduled = scheduler.schedule[DRAIN_TASK_NAME]
    assert scheduled.schedule.run_every.total_seconds() == 2.5
    scheduler.apply_async(scheduled, producer=scheduler.producer)
    (tick,) = get_all(broker, ticks)
    assert tick.headers["task"] == DRAIN_TASK_NAME
    assert tick.headers["expires"] is None and "expiration" not in tick.properties

    # Run in-process, the task drains.
    queue = declare(broker, cleanup_queues, f"tasked-{uid}")
    park(get_runtime(app), queue, count=3)
    try:
        task.apply().get()
        assert message_count(broker, queue) == 3
        assert get_runtime(app).store.count() == 0
    finally:
        get_runtime(app).reset_publisher()
