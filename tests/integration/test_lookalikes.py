"""Look-alike messages are never merged (issue 12), on the real RabbitMQ, Redis and DLX service.

Foreign publishers often send the same body without a ``message_id`` (``{"event": "recount"}``):
those are different messages. Each must get its own fate and its own obituary, parks or not; a
redelivery is deduplicated only when the message's identity is provable (a ``message_id``).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery

from celery_dlx.broker.topology import dlx_queue
from celery_dlx.drain.core import drain_once
from celery_dlx.fates import BURIED, PARKED, REQUEUED
from celery_dlx.ops import obituaries
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.conftest import BROKER_URL, ROOT
from tests.integration.dlx_apps import service_thread
from tests.integration.helpers import wait_until
from tests.integration.service_app import service_settings

BODY = b'{"event": "recount"}'
N = 20


def make_app(uid: str, **conf: Any) -> Celery:
    app = Celery(f"look-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(service_settings(uid))
    app.conf.update(conf)
    return app


@pytest.fixture
def queue(uid: str, key_prefix: str, cleanup_queues: list[str], broker: Any) -> str:
    assert key_prefix == service_settings(uid)["dlx_key_prefix"]
    name = f"recount-{uid}"
    cleanup_queues.extend([name, f"dead-{uid}", f"exchange:dlx-{uid}"])
    dlx_queue(name, dlx=f"dlx-{uid}", service=f"dead-{uid}")(broker.channel()).declare()
    return name


def publish_raw(broker: Any, queue: str, n: int, message_ids: list[str | None]) -> None:
    """Publish straight through py-amqp: no client library adds a message_id behind our back."""
    channel = broker.channel()
    for i in range(n):
        props: dict[str, Any] = {"delivery_mode": 2, "content_type": "application/json"}
        message_id = message_ids[i % len(message_ids)]
        if message_id is not None:
            props["message_id"] = f"{message_id}-{i}"
        channel.basic_publish(amqp.Message(BODY, **props), exchange="", routing_key=queue)


class Rejecter:
    """A consumer that is not Celery: it rejects every delivery (requeue=false) and counts."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.deliveries: list[dict[str, Any]] = []

    def __call__(self, stop: threading.Event) -> None:
        conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
        conn.connect()
        channel = conn.channel()
        channel.basic_qos(0, 50, False)

        def on_message(message: Any) -> None:
            self.deliveries.append(dict(message.headers or {}))
            channel.basic_reject(message.delivery_tag, requeue=False)

        channel.basic_consume(self.queue, callback=on_message)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                conn.drain_events(timeout=0.1)
        conn.close()


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


def drain(runtime: Runtime) -> Callable[[threading.Event], None]:
    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            drain_once(runtime)
            stop.wait(0.05)

    return loop


def test_twenty_look_alikes_get_twenty_obituaries(uid: str, queue: str, broker: Any) -> None:
    app = make_app(uid, dlx_queues={queue: {"max_parks": 0, "max_requeues": 0}})
    runtime = get_runtime(app)
    consumer = Rejecter(queue)
    with service_thread(app) as svc, running(consumer):
        publish_raw(broker, queue, N, [None])
        wait_until(lambda: obituaries.count(runtime) >= N, what=f"{N} obituaries")
        wait_until(lambda: svc.stats.received >= N, what="the service to count them")
    obs = obituaries.list_obituaries(runtime, limit=None, with_payload=True)
    assert len(obs) == N and len({ob.id for ob in obs}) == N
    assert len({ob.message_id for ob in obs}) == N
    assert all(ob.message_id.startswith("sha1-") and ob.payload == BODY for ob in obs)
    assert svc.stats.duplicates == 0 and svc.stats.buried == N
    assert len(consumer.deliveries) == N


def test_look_alikes_parked_and_requeued_in_between_stay_distinct(
    uid: str, queue: str, broker: Any
) -> None:
    app = make_app(
        uid, dlx_queues={queue: {"max_requeues": 1, "max_parks": 2, "backoff": [0.1, 0.1]}}
    )
    runtime = get_runtime(app)
    consumer = Rejecter(queue)
    with service_thread(app) as svc, running(consumer), running(drain(runtime)):
        publish_raw(broker, queue, N, [None])
        wait_until(lambda: obituaries.count(runtime) >= N, timeout=120, what=f"{N} obituaries")
    obs = obituaries.list_obituaries(runtime, limit=None)
    assert len(obs) == N and len({ob.message_id for ob in obs}) == N
    for ob in obs:
        assert [a.fate for a in ob.attempts] == [REQUEUED, PARKED, PARKED, BURIED]
        assert ob.attempt == 4
    # every copy carried its own identity; each message was delivered exactly 4 times
    assert len(consumer.deliveries) == 4 * N
    stamped = Counter(d.get("x-dlx-id") for d in consumer.deliveries)
    assert stamped.pop(None) == N  # the first deliveries, as published
    assert len(stamped) == N and set(stamped.values()) == {3}
    assert {ob.message_id for ob in obs} == set(stamped)
    assert svc.stats.duplicates == 0
    fates = Counter((fields["message_id"], fields["fate"]) for _, fields in runtime.history.read())
    assert Counter(fate for (_, fate) in fates.elements()) >= Counter(
        {REQUEUED: N, PARKED: 2 * N, BURIED: N}
    )


def service_process(
    uid: str, conf: dict[str, Any], *args: str, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    """The DLX service in a subprocess (the CLI's ``dlx service``), output captured."""
    cmd = [
        sys.executable,
        "-c",
        "from celery_dlx.cli.main import main; main()",
        "-A",
        "tests.integration.service_app",
        "service",
        "--loglevel",
        "WARNING",
        *args,
    ]
    full_env = dict(
        os.environ,
        DLX_SVC_UID=uid,
        DLX_SVC_CONF=json.dumps(conf),
        PYTHONPATH=str(ROOT),
        **(env or {}),
    )
    return subprocess.Popen(
        cmd,
        env=full_env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.mark.slow
def test_a_redelivery_after_kill_9_mid_batch_is_counted_once(
    uid: str, queue: str, broker: Any, tmp_path: Path
) -> None:
    """The service dies (exit 9) after writing a batch's obituaries, before its ack: the broker
    redelivers the batch. Provable messages get one obituary each; look-alikes are all kept."""
    conf = {"dlx_queues": {queue: {"max_parks": 0, "max_requeues": 0}}, "dlx_service_prefetch": 30}
    app = make_app(uid, **conf)
    runtime = get_runtime(app)
    channel = broker.channel()
    with running(Rejecter(queue)):
        publish_raw(broker, queue, 2 * N, ["m", None])  # provable and look-alike, interleaved
        wait_until(
            lambda: channel.queue_declare(f"dead-{uid}", passive=True).message_count == 2 * N,
            what="every message dead-lettered",
        )
    log = tmp_path / "faults.log"
    env = {"DLX_FAULT": "service.buried@2", "DLX_FAULT_LOG": str(log)}
    killed = service_process(uid, conf, env=env)
    _, err = killed.communicate(timeout=120)
    assert killed.returncode == 9, err
    assert log.read_text().startswith("service.buried")
    first = obituaries.count(runtime)
    assert 0 < first < 2 * N, "the crash came before or after the work, not mid-way"
    at_kill = [
        ob
        for ob in obituaries.list_obituaries(runtime, limit=None)
        if ob.message_id.startswith("sha1-")
    ]

    final = service_process(uid, conf, "--until-idle", "2", "--json")
    out, err = final.communicate(timeout=120)
    assert final.returncode == 0, err
    stats = json.loads(out.strip().splitlines()[-1])

    obs = obituaries.list_obituaries(runtime, limit=None)
    provable = Counter(ob.message_id for ob in obs if ob.message_id.startswith("m-"))
    look_alikes = [ob for ob in obs if ob.message_id.startswith("sha1-")]
    assert provable == Counter({f"m-{i}": 1 for i in range(0, 2 * N, 2)})  # counted once
    burials = Counter(
        fields["message_id"] for _, fields in runtime.history.read() if fields["fate"] == BURIED
    )
    assert all(burials[m] == 1 for m in provable)  # one buried event each, kill or not
    assert stats["received"] >= 2 * N - first  # the unacked batch came back
    # None lost. The look-alikes buried before the kill and not yet acked came back and, with
    # nothing to prove they are the same messages, were buried again: at-least-once, both kept.
    extra = len(look_alikes) - N
    assert 0 <= extra <= len(at_kill) and extra <= stats["unproven_redeliveries"]
    assert channel.queue_declare(f"dead-{uid}", passive=True).message_count == 0
    print(
        f"kill -9 after the graveyard write: {first} obituaries at the kill "
        f"({len(at_kill)} look-alikes, {extra} buried again), last run {stats}"
    )
