"""The DLX service on the real RabbitMQ and Redis: foreign consumers, Celery burials, crashes."""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import pika
import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker
from kombu import Exchange, Producer, Queue

import celery_dlx
from celery_dlx.broker.topology import dlx_queue
from celery_dlx.drain.core import drain_once
from celery_dlx.fates import BURIED, DRAINED, PARKED, REQUEUED
from celery_dlx.message.names import ATTEMPT_HEADER, REASON_HEADER
from celery_dlx.message.obituary import payload_from_json_safe
from celery_dlx.ops import obituaries
from celery_dlx.service.loop import DLXService
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.conftest import BROKER_URL, ROOT
from tests.integration.dlx_apps import service_thread
from tests.integration.service_app import service_settings

TIMEOUT = 60.0


def wait_until(predicate: Callable[[], Any], what: str, timeout: float = TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)
    return value


def make_app(uid: str, **conf: Any) -> Celery:
    app = Celery(f"svc-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(service_settings(uid))
    app.conf.update(conf)
    return app


@contextlib.contextmanager
def running(target: Callable[[threading.Event], None]) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


def service(app: Celery) -> Any:
    return service_thread(app)


@contextlib.contextmanager
def worker(app: Celery) -> Iterator[Any]:
    """A real worker (solo pool) in a thread; a short timer tick lets it stop at once."""
    with start_worker(
        app, pool="solo", perform_ping_check=False, loglevel="WARNING", shutdown_timeout=30
    ) as w:
        w.timer.call_repeatedly(0.2, lambda: None)
        yield w


def drain(runtime: Runtime) -> Callable[[threading.Event], None]:
    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            drain_once(runtime)
            stop.wait(0.05)

    return loop


class GoConsumer:
    """A foreign consumer (pika, not Celery) that rejects every message with requeue=false."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.seen: dict[str, list[tuple[float, int]]] = defaultdict(list)

    def __call__(self, stop: threading.Event) -> None:
        # kombu writes the default vhost as "//", pika as "/%2F".
        url = BROKER_URL[:-2] + "/%2F" if BROKER_URL.endswith("//") else BROKER_URL
        conn = pika.BlockingConnection(pika.URLParameters(url))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=50)

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            attempt = int((props.headers or {}).get(ATTEMPT_HEADER, 0))
            self.seen[props.message_id].append((time.time(), attempt))
            ch.basic_reject(method.delivery_tag, requeue=False)

        channel.basic_consume(self.queue, on_message)
        while not stop.is_set():
            conn.process_data_events(time_limit=0.1)
        conn.close()


def history(runtime: Runtime) -> list[dict[str, str]]:
    return [fields for _, fields in runtime.history.read()]


def publish(
    broker: Any, exchange: Exchange | str, routing_key: str, bodies: list[bytes], **props: Any
) -> list[str]:
    producer = Producer(broker.channel())
    ids = []
    for i, body in enumerate(bodies):
        message_id = props.pop("message_id", None) or f"m-{i}"
        producer.publish(
            body,
            exchange=exchange,
            routing_key=routing_key,
            message_id=message_id,
            content_type="application/octet-stream",
            content_encoding="binary",
            retry=True,
            **props,
        )
        ids.append(message_id)
    return ids


@pytest.fixture
def names(uid: str, key_prefix: str, cleanup_queues: list[str]) -> dict[str, str]:
    assert key_prefix == service_settings(uid)["dlx_key_prefix"]  # its keys are deleted after
    out = {
        "billing": f"billing-{uid}",
        "audit": f"audit-{uid}",
        "events": f"events-{uid}",
        "dead": f"dead-{uid}",
        "dlx": f"dlx-{uid}",
        "hooks": f"hooks-{uid}",
    }
    cleanup_queues.extend([out["billing"], out["audit"], out["dead"], out["hooks"]])
    cleanup_queues.extend(f"exchange:{out[name]}" for name in ("events", "dlx", "billing", "hooks"))
    return out


def declare_billing(broker: Any, names: dict[str, str]) -> None:
    """A foreign queue dead-lettering to the DLX, and a sibling, both on one fanout exchange."""
    events = Exchange(names["events"], type="fanout", durable=False, auto_delete=False)
    channel = broker.channel()
    dlx_queue(
        names["billing"], exchange=events, routing_key="", dlx=names["dlx"], service=names["dead"]
    )(channel).declare()
    Queue(names["audit"], exchange=events, routing_key="", durable=False)(channel).declare()


def test_foreign_consumer_rejects_are_retried_after_the_delays_then_buried(
    uid: str, names: dict[str, str], broker: Any
) -> None:
    hook = f"hook-{uid}"
    app = make_app(
        uid,
        dlx_queues={
            names["billing"]: {
                "backoff": [0.2, 0.4],
                "max_parks": 2,
                "max_requeues": 1,
                "importance": "page",
            }
        },
        dlx_obituary_task=hook,
        task_default_queue=names["hooks"],
    )
    runtime = get_runtime(app)
    declare_billing(broker, names)
    go = GoConsumer(names["billing"])
    bodies = [f'{{"invoice": {i}}}'.encode() for i in range(5)]
    with service(app), running(go), running(drain(runtime)):
        ids = publish(broker, names["events"], "", bodies)
        wait_until(lambda: obituaries.count(runtime) == 5, "5 obituaries")

    for message_id in ids:
        deliveries = go.seen[message_id]
        assert [attempt for _, attempt in deliveries] == [0, 1, 2, 3]
        gaps = [b[0] - a[0] for a, b in itertools.pairwise(deliveries)]
        assert gaps[1] >= 0.2 - 0.01 and gaps[2] >= 0.4 - 0.01  # parked retries wait their delay
        fates = [h["fate"] for h in history(runtime) if h["message_id"] == message_id]
        assert sorted(fates) == sorted([REQUEUED, PARKED, DRAINED, PARKED, DRAINED, BURIED])
        (ob,) = obituaries.list_obituaries(runtime, message_id=message_id, with_payload=True)
        assert ob.queue == names["billing"] and ob.origin == "foreign" and ob.task is None
        assert ob.reason.startswith("retry budget spent: 1 requeue, 2 parks")
        assert ob.attempt == 4 and ob.importance == "page" and ob.death_reason == "rejected"
        assert [a.fate for a in ob.attempts] == [REQUEUED, PARKED, PARKED, BURIED]
        times = [a.at_ms for a in ob.attempts]
        assert times == sorted(times) and ob.first_failure_ms == times[0]
        assert ob.payload == bodies[int(message_id[2:])]
        assert ob.x_death and ob.x_death[0]["queue"] == names["billing"]

    channel = broker.channel()
    audit = []
    while (msg := channel.basic_get(names["audit"], no_ack=True)) is not None:
        audit.append(msg.properties["message_id"])
    assert sorted(audit) == sorted(
        ids
    )  # the sibling got each message once: retries skip the fanout

    hook_messages = []
    while (msg := channel.basic_get(names["hooks"], no_ack=True)) is not None:
        hook_messages.append(msg)
    assert {m.headers["task"] for m in hook_messages} == {hook}
    by_id = {
        json.loads(m.body)[0][0]["message_id"]: json.loads(m.body)[0][0] for m in hook_messages
    }
    assert set(by_id) == set(ids) and len(hook_messages) == 5
    sample = by_id["m-0"]
    assert sample["queue"] == names["billing"] and sample["attempt"] == 4
    assert sample["payload"]["content_type"] == "application/octet-stream"
    assert sample["id"] == obituaries.list_obituaries(runtime, message_id="m-0")[0].id


def test_celery_task_buried_by_the_in_worker_service_keeps_its_exception_and_traceback(
    uid: str, names: dict[str, str], vhost: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Its own vhost: the log check below counts every traceback the process logs, and on a shared
    # vhost any client's broadcast that fails in the worker's pidbox logs one.
    app = Celery(f"celery-{uid}", broker=vhost, set_as_current=False)
    celery_dlx.install(app)
    work = f"work-{uid}"
    app.conf.update(service_settings(uid))
    app.conf.update(
        dlx_enabled=True,
        dlx_max_requeues=0,
        dlx_max_parks=0,
        task_default_queue=work,
        worker_hijack_root_logger=False,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        dlx_obituary_task=f"on-dead-{uid}",
        dlx_service_in_worker=True,
    )

    @app.task(name=f"charge-{uid}")
    def charge(order: int) -> None:
        raise ValueError(f"card declined for order {order}")

    received: list[dict[str, Any]] = []

    @app.task(name=f"on-dead-{uid}")
    def on_dead(obituary: dict[str, Any]) -> None:
        received.append(obituary)

    runtime = get_runtime(app)
    with worker(app) as w:  # the DLX service runs inside it (dlx_service_in_worker)
        assert any(type(step).__name__ == "DLXServiceStep" for step in w.consumer.steps)
        result = charge.delay(42)
        wait_until(lambda: obituaries.count(runtime) == 1, "the obituary")
        wait_until(lambda: received, "the hook task to run")
    ob = obituaries.get_obituary(runtime, result.id)
    assert ob is not None
    assert (ob.task, ob.queue, ob.message_id, ob.origin) == (
        f"charge-{uid}",
        work,
        result.id,
        "celery",
    )
    assert ob.exc_type == "ValueError" and ob.exc_message == "card declined for order 42"
    assert "Traceback (most recent call last)" in ob.traceback
    assert 'raise ValueError(f"card declined for order {order}")' in ob.traceback
    assert ob.attempt == 1 and [a.fate for a in ob.attempts][-1] == BURIED
    assert ob.hostname and ob.payload and b"42" in ob.payload
    assert runtime.redis.exists(runtime.keys.cause(result.id)) == 0
    buried = [h for h in history(runtime) if h["fate"] == BURIED]
    assert [h["message_id"] for h in buried] == [result.id]
    (hooked,) = received
    assert hooked["id"] == ob.id and hooked["exc_type"] == "ValueError"
    assert "card declined" in hooked["traceback"]
    assert payload_from_json_safe(hooked) == ob.payload
    assert not [t for t in threading.enumerate() if t.name == "celery_dlx-service"]
    # One traceback in the logs per burial: Celery's "raised unexpected" line has it, and the
    # burial line names the cause without printing it again (the obituary keeps it).
    with_traceback = [r for r in caplog.records if "card declined" in r.getMessage() or r.exc_info]
    lines = [r for r in with_traceback if "Traceback (most recent call last)" in _text(r)]
    assert len(lines) == 1 and lines[0].name == "celery.app.trace", [
        (r.name, r.getMessage()[:80]) for r in with_traceback
    ]
    # The service's burial line: one, naming the message, without the traceback.
    burial = [
        r for r in caplog.records if r.name == "celery_dlx" and r.getMessage().startswith("buried")
    ]
    assert len(burial) == 1 and "Traceback" not in burial[0].getMessage()
    assert burial[0].levelname == "ERROR" and f"[{result.id}]" in burial[0].getMessage()


def _text(record: logging.LogRecord) -> str:
    text = record.getMessage()
    if record.exc_info:
        text += "".join(traceback.format_exception(*record.exc_info))
    return text


def test_bad_input_is_buried_with_a_reason_and_the_service_keeps_going(
    uid: str, names: dict[str, str], broker: Any
) -> None:
    app = make_app(uid, dlx_queues={names["billing"]: {"max_parks": 0, "max_requeues": 0}})
    runtime = get_runtime(app)
    declare_billing(broker, names)
    dead = Exchange(names["dlx"], type="topic", durable=True)
    big = os.urandom(10 * 1024 * 1024)
    with service(app):
        producer = Producer(broker.channel())
        bad_x_death = {"x-death": ["not", "tables"]}
        producer.publish(
            b"a",
            exchange=dead,
            routing_key=names["billing"],
            headers=bad_x_death,
            message_id="bad-x-death",
            retry=True,
        )
        producer.publish(
            b"b",
            exchange=dead,
            routing_key=names["billing"],
            headers={
                "x-death": [{"queue": names["billing"], "reason": "rejected", "count": 1}],
                ATTEMPT_HEADER: "many",
            },
            message_id="bad-attempt",
            retry=True,
        )
        producer.publish(
            b"c",
            exchange=dead,
            routing_key=names["billing"],
            headers={REASON_HEADER: "undecodable: body is not JSON"},
            message_id="published",
            retry=True,
        )
        producer.publish(b"no id here", exchange=dead, routing_key=names["billing"], retry=True)
        with running(GoConsumer(names["billing"])):
            publish(broker, names["events"], "", [big], message_id="huge")
            wait_until(lambda: obituaries.count(runtime) == 5, "5 obituaries")
    reasons = {ob.message_id: ob.reason for ob in obituaries.list_obituaries(runtime)}
    assert reasons["bad-x-death"].startswith("undecodable: x-death[0] must be a table")
    assert reasons["bad-attempt"].startswith("undecodable: header x-dlx-attempt")
    assert reasons["published"] == "undecodable: body is not JSON"
    assert reasons["huge"].startswith("retry budget spent")
    derived = [m for m in reasons if m.startswith("sha1-")]
    assert len(derived) == 1 and "origin unknown" in reasons[derived[0]]
    huge = obituaries.get_obituary(runtime, "huge")
    assert huge is not None and huge.payload == big


def test_expired_messages_return_without_counting_a_failure(
    uid: str, names: dict[str, str], broker: Any
) -> None:
    app = make_app(uid, dlx_queues={names["billing"]: {"backoff": [0.1, 0.2]}})
    runtime = get_runtime(app)
    channel = broker.channel()
    dlx_queue(
        names["billing"],
        dlx=names["dlx"],
        service=names["dead"],
        queue_arguments={"x-message-ttl": 100},
    )(channel).declare()
    with service(app), running(drain(runtime)):
        publish(broker, "", names["billing"], [b"late"], message_id="late")
        wait_until(
            lambda: sum(h["fate"] == PARKED for h in history(runtime)) >= 2, "two expiry parks"
        )
        msg = wait_until(
            lambda: channel.basic_get(names["billing"], no_ack=True), "the message back"
        )
    assert msg.headers[ATTEMPT_HEADER] == 0
    assert obituaries.count(runtime) == 0
    parks = [h for h in history(runtime) if h["fate"] == PARKED]
    assert {h["reason"].split(":")[0] for h in parks} == {f"expired in {names['billing']}"}


def service_process(
    uid: str, conf: dict[str, Any], *args: str, script: str = "celery-dlx", capture: bool = False
) -> subprocess.Popen[bytes]:
    """``celery-dlx -A app dlx service`` (or ``celery -A app dlx service``) in a subprocess.

    Its output is captured only when asked (then read it with ``communicate``): a full pipe
    nobody reads would stall the service.
    """
    out = subprocess.PIPE if capture else subprocess.DEVNULL
    env = dict(os.environ, DLX_SVC_UID=uid, DLX_SVC_CONF=json.dumps(conf), PYTHONPATH=str(ROOT))
    cmd = [
        os.path.join(os.path.dirname(sys.executable), script),
        "-A",
        "tests.integration.service_app",
        "dlx",
        "service",
        "--loglevel",
        "WARNING",
        *args,
    ]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=out)


@pytest.mark.slow
def test_service_killed_mid_batch_loses_nothing(
    uid: str, names: dict[str, str], broker: Any, cleanup_queues: list[str]
) -> None:
    bury_q, park_q = f"buryq-{uid}", f"parkq-{uid}"
    cleanup_queues.extend([bury_q, park_q, f"exchange:{bury_q}", f"exchange:{park_q}"])
    conf = {
        "dlx_queues": {
            bury_q: {"max_parks": 0, "max_requeues": 0},
            park_q: {"max_requeues": 0, "backoff": [3600]},
        },
        "dlx_service_prefetch": 50,
    }
    app = make_app(uid, **conf)
    runtime = get_runtime(app)
    channel = broker.channel()
    for name in (bury_q, park_q):
        dlx_queue(name, dlx=names["dlx"], service=names["dead"])(channel).declare()
    n = 300
    body = os.urandom(20_000)
    for name in (bury_q, park_q):
        producer = Producer(broker.channel())
        for i in range(n):
            producer.publish(body, routing_key=name, message_id=f"{name}-{i}", retry=True)
    with running(GoConsumer(bury_q)), running(GoConsumer(park_q)):
        wait_until(
            lambda: channel.queue_declare(names["dead"], passive=True).message_count == 2 * n,
            "every message dead-lettered",
        )

    def progress() -> int:
        return obituaries.count(runtime) + runtime.store.count()

    kills = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(3):
            before = progress()
            procs.append(service_process(uid, conf))
            wait_until(lambda b=before: progress() > b, "the service to make progress")
            procs[-1].send_signal(signal.SIGKILL)
            procs[-1].wait(30)
            kills.append(progress())
        assert any(k < 2 * n for k in kills), "every kill came after the work was done"
        procs.append(service_process(uid, conf, "--until-idle", "2", "--json", capture=True))
        out, err = procs[-1].communicate(timeout=120)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(30)
    final = procs[-1]
    assert final.returncode == 0, err.decode()
    stats = json.loads(out.decode().strip().splitlines()[-1])

    buried = Counter(ob.message_id for ob in obituaries.list_obituaries(runtime, limit=None))
    parked = Counter(m.message_id for m in runtime.store.peek(limit=10 * n))
    lost = [f"{bury_q}-{i}" for i in range(n) if buried[f"{bury_q}-{i}"] == 0]
    lost += [f"{park_q}-{i}" for i in range(n) if parked[f"{park_q}-{i}"] == 0]
    assert lost == []
    assert set(buried.values()) == {1} and set(parked.values()) == {1}
    assert channel.queue_declare(names["dead"], passive=True).message_count == 0
    burials = Counter(h["message_id"] for h in history(runtime) if h["fate"] == BURIED)
    assert set(burials.values()) == {1}  # one buried event per obituary, kills or not
    # The last run accounts for every dead letter it received, redelivered ones included.
    assert stats["received"] == stats["buried"] + stats["parked"] + stats["duplicates"]
    print(f"kill -9 accounting: progress at kills {kills}, last run {stats}")


def test_sigterm_stops_the_service_cleanly(uid: str, names: dict[str, str], broker: Any) -> None:
    proc = service_process(uid, {}, script="celery")  # through the celery.commands entry point
    try:
        wait_until(lambda: _consumers(broker, names["dead"]) == 1, "the service consumer")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _consumers(broker, names["dead"]) == 0


def _consumers(broker: Any, queue: str) -> int:
    channel = broker.channel()
    try:
        return int(channel.queue_declare(queue, passive=True).consumer_count)
    except Exception:  # not declared yet: the passive declare closed the channel
        return 0
    finally:
        with contextlib.suppress(Exception):
            channel.close()


class OwnRedis:
    """A redis-server of this test on a free port, stoppable and restartable."""

    def __init__(self, workdir: str) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        import redis

        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                self.workdir,
                "--save",
                "",
                "--appendonly",
                "yes",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)

        def up() -> bool:
            try:
                return bool(client.ping())
            except redis.RedisError:
                return False

        wait_until(up, "redis-server to start", timeout=30)
        client.close()

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
            self.proc = None


@pytest.fixture
def own_redis(tmp_path: Any) -> Iterator[OwnRedis]:
    server = OwnRedis(str(tmp_path))
    server.start()
    yield server
    server.stop()


def test_redis_outage_holds_dead_letters_unacked_and_logs_once(
    uid: str,
    names: dict[str, str],
    broker: Any,
    own_redis: OwnRedis,
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = make_app(
        uid,
        dlx_redis_url=own_redis.url,
        dlx_queues={names["billing"]: {"max_parks": 0, "max_requeues": 0}},
    )
    runtime = get_runtime(app)
    death = [{"queue": names["billing"], "reason": "rejected", "count": 1}]
    dead = Exchange(names["dlx"], type="topic", durable=True)
    caplog.set_level("WARNING", logger="celery_dlx.service.loop")
    with service(app) as svc:
        wait_until(lambda: _consumers(broker, names["dead"]) == 1, "the service consumer")
        own_redis.stop()
        producer = Producer(broker.channel())
        for i in range(20):
            producer.publish(
                b"x",
                exchange=dead,
                routing_key=names["billing"],
                headers={"x-death": death},
                message_id=f"o-{i}",
                retry=True,
            )
        wait_until(lambda: svc.stats.retries >= 3, "retries during the outage")
        own_redis.start()
        wait_until(lambda: obituaries.count(runtime) == 20, "20 obituaries after the outage")
    unavailable = [r for r in caplog.records if "unavailable" in r.getMessage()]
    assert len(unavailable) == 1 and "holding" in unavailable[0].getMessage()
    assert any("back after" in r.getMessage() for r in caplog.records)
    assert svc.stats.outages == 1 and svc.stats.buried == 20


def test_record_many_without_history_counts_and_notifies_only(uid: str, key_prefix: str) -> None:
    from celery_dlx.fates import FateEvent

    runtime = get_runtime(make_app(uid))
    heard: list[str] = []
    runtime.listeners.append(lambda event: heard.append(event.message_id))
    events = [
        FateEvent.from_fields(fate=BURIED, queue="q", message_id=f"m{i}", attempt=1)
        for i in range(3)
    ]
    runtime.record_many(events, history=False)
    assert runtime.history.length() == 0
    assert heard == ["m0", "m1", "m2"]
    minute = events[0].at_ms // 60000
    assert int(runtime.redis.hget(f"{runtime.keys.counter_prefix}{minute}", "q|buried")) == 3


def test_a_redelivered_dead_letter_gets_no_second_fate(
    uid: str, names: dict[str, str], broker: Any
) -> None:
    app = make_app(
        uid,
        dlx_queues={
            names["billing"]: {"max_parks": 0, "max_requeues": 0},
            names["audit"]: {"max_requeues": 0, "backoff": [60]},
        },
    )
    runtime = get_runtime(app)
    svc = DLXService(app)
    channel = broker.channel()
    dead = Queue(names["dead"], exchange=Exchange(names["dlx"], type="topic"), routing_key="#")
    dead(channel).declare()
    producer = Producer(channel)
    for queue in (names["billing"], names["audit"]):
        death = [{"queue": queue, "reason": "rejected", "count": 1}]
        producer.publish(
            b"{}",
            exchange=names["dlx"],
            routing_key=queue,
            headers={"x-death": death},
            message_id=f"{queue}-m",
            retry=True,
        )
    first = [wait_until(lambda: dead(channel).get(), "a dead letter") for _ in range(2)]
    svc.settle(first)  # fates written, then the service dies before its ack
    for message in first:
        message.requeue()
    again = [wait_until(lambda: dead(channel).get(), "the redelivery") for _ in range(2)]
    assert all(m.delivery_info["redelivered"] for m in again)
    svc.handle(again)
    assert svc.stats.duplicates == 2 and svc.stats.buried == 1 and svc.stats.parked == 1
    assert obituaries.count(runtime) == 1 and runtime.store.count() == 1
    assert [h["fate"] for h in history(runtime)].count(BURIED) == 1
    assert [h["fate"] for h in history(runtime)].count(PARKED) == 1
    assert dead(channel).get() is None


def test_the_service_moves_obituaries_past_retention_to_the_history(
    uid: str, names: dict[str, str]
) -> None:
    from celery_dlx.fates import ARCHIVED
    from celery_dlx.message.obituary import Obituary
    from celery_dlx.service.settle import buried_event
    from celery_dlx.store.graveyard import Graveyard

    app = make_app(uid, dlx_graveyard_retention=3600)
    runtime = get_runtime(app)
    old = Obituary.from_fields(
        id="old", message_id="m", queue="q", reason="r", buried_ms=1_000, payload=b"x"
    )
    Graveyard(runtime.redis, runtime.keys).write_many([(old, buried_event(old))])
    with service(app):
        wait_until(lambda: obituaries.count(runtime) == 0, "the retention sweep")
    archived = [h for h in history(runtime) if h["fate"] == ARCHIVED]
    assert [json.loads(h["obituary"])["id"] for h in archived] == ["old"]


def dead_letters(channel: Any, names: dict[str, str], count: int, prefix: str) -> None:
    """``count`` dead letters of the billing queue in the service queue, as RabbitMQ would put them."""
    dead = Queue(names["dead"], exchange=Exchange(names["dlx"], type="topic"), routing_key="#")
    dead(channel).declare()
    producer = Producer(channel)
    death = [{"queue": names["billing"], "reason": "rejected", "count": 1}]
    for i in range(count):
        producer.publish(
            b"{}",
            exchange=names["dlx"],
            routing_key=names["billing"],
            headers={"x-death": death},
            message_id=f"{prefix}-{i}",
            retry=True,
        )


def test_several_service_processes_share_the_queue(
    uid: str, names: dict[str, str], broker: Any
) -> None:
    conf = {"dlx_queues": {names["billing"]: {"max_parks": 0, "max_requeues": 0}}}
    runtime = get_runtime(make_app(uid, **conf))
    channel = broker.channel()
    dead_letters(channel, names, 300, "p")
    proc = service_process(
        uid, conf, "--processes", "2", "--until-idle", "2", "--json", capture=True
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    stats = json.loads(out.decode().strip().splitlines()[-1])
    assert stats["received"] == stats["buried"] == 300 and stats["processes"] == 2
    assert obituaries.count(runtime) == 300
    assert channel.queue_declare(names["dead"], passive=True).message_count == 0


def test_a_backlog_is_settled_in_full_batches(uid: str, names: dict[str, str], broker: Any) -> None:
    """A backlog arrives one delivery per read; the service hands settlers full batches (a third
    of the prefetch), not the few messages that arrived while a settler was free."""
    from celery_dlx.service.loop import DLXService

    conf = {"dlx_queues": {names["billing"]: {"max_parks": 0, "max_requeues": 0}}}
    app = make_app(uid, dlx_service_prefetch=300, **conf)
    runtime = get_runtime(app)
    channel = broker.channel()
    total = 1000
    dead_letters(channel, names, total, "b")
    wait_until(
        lambda: channel.queue_declare(names["dead"], passive=True).message_count == total,
        "the backlog",
    )
    svc = DLXService(app)
    assert svc.batch_limit == 100
    svc.run(idle_timeout=1.0)
    stats = svc.stats.as_dict()
    assert stats["buried"] == total
    assert obituaries.count(runtime) == total
    # 10 full batches; a few more when the broker paused mid-backlog (before: about 100).
    assert stats["batches"] <= 20, stats
