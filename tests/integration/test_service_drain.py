"""The standalone DLX service drains: with no Celery worker anywhere, a foreign queue's parked
retries come back from ``celery -A app dlx service`` (under the workers' drain lease) until they are
buried; with ``--no-drain`` they stay parked."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pika
import pytest
from kombu import Producer

from celery_dlx.broker.topology import dlx_queue
from celery_dlx.fates import BURIED, DRAINED, PARKED
from celery_dlx.message.names import ATTEMPT_HEADER, Keys
from celery_dlx.ops import obituaries
from celery_dlx.ops.inspection import parked_data
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.conftest import BROKER_URL, ROOT
from tests.integration.helpers import fates_of, wait_until
from tests.integration.service_app import make_service_app, service_settings

TIMEOUT = 60.0
#: Messages published to the foreign queue per test.
MESSAGES = 12
#: The foreign queue's policy: no requeue, two parks of 0.2 s and 0.3 s, then the graveyard.
POLICY = {"max_requeues": 0, "max_parks": 2, "backoff": [0.2, 0.3]}
#: Seconds between drains (``dlx_drain_interval``).
INTERVAL = 0.2


@pytest.fixture
def names(uid: str, key_prefix: str, cleanup_queues: list[str]) -> dict[str, str]:
    assert key_prefix == service_settings(uid)["dlx_key_prefix"]  # its keys are deleted after
    out = {"billing": f"billing-{uid}", "dead": f"dead-{uid}", "dlx": f"dlx-{uid}"}
    cleanup_queues.extend([out["billing"], out["dead"]])
    cleanup_queues.extend([f"exchange:{out['billing']}", f"exchange:{out['dlx']}"])
    return out


@pytest.fixture
def conf(names: dict[str, str]) -> dict[str, Any]:
    """The service's settings (the subprocess's and the test's app share them)."""
    return {"dlx_queues": {names["billing"]: POLICY}, "dlx_drain_interval": INTERVAL}


@pytest.fixture
def runtime(uid: str, conf: dict[str, Any]) -> Iterator[Runtime]:
    runtime = get_runtime(make_service_app(uid, conf))
    yield runtime
    runtime.reset_publisher()


class RejectingConsumer:
    """A foreign consumer (pika, no Celery) that rejects every delivery with requeue=false."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.attempts: dict[str, list[int]] = defaultdict(list)
        self._lock = threading.Lock()

    def deliveries(self) -> int:
        with self._lock:
            return sum(len(a) for a in self.attempts.values())

    def run(self, stop: threading.Event) -> None:
        # kombu writes the default vhost as "//", pika as "/%2F".
        url = BROKER_URL[:-2] + "/%2F" if BROKER_URL.endswith("//") else BROKER_URL
        conn = pika.BlockingConnection(pika.URLParameters(url))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=50)

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            with self._lock:
                attempt = int((props.headers or {}).get(ATTEMPT_HEADER, 0))
                self.attempts[props.message_id].append(attempt)
            ch.basic_reject(method.delivery_tag, requeue=False)

        channel.basic_consume(self.queue, on_message)
        while not stop.is_set():
            conn.process_data_events(time_limit=0.1)
        conn.close()


@contextmanager
def consuming(consumer: RejectingConsumer) -> Iterator[RejectingConsumer]:
    stop = threading.Event()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield consumer
    finally:
        stop.set()
        thread.join(30)
        assert not thread.is_alive()


@contextmanager
def service_process(
    uid: str, conf: dict[str, Any], log: Path, *args: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``celery -A app dlx service ARGS`` in a subprocess, its output in ``log``; on exit it is
    stopped with SIGTERM (the caller may have done so) and must exit 0."""
    env = dict(os.environ, DLX_SVC_UID=uid, DLX_SVC_CONF=json.dumps(conf), PYTHONPATH=str(ROOT))
    celery = os.path.join(os.path.dirname(sys.executable), "celery")
    cmd = [celery, "-A", "tests.integration.service_app", "dlx", "service", "-l", "INFO", *args]
    with log.open("ab") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=out, stderr=out)
    try:
        yield proc
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)


def consumers(channel: Any, queue: str) -> int:
    return int(channel.queue_declare(queue, passive=True).consumer_count)


def start_foreign_queue(broker: Any, names: dict[str, str]) -> None:
    """The foreign queue, dead-lettering to the service's exchange and queue."""
    dlx_queue(names["billing"], dlx=names["dlx"], service=names["dead"])(broker.channel()).declare()


def publish(broker: Any, queue: str, count: int) -> list[str]:
    """``count`` foreign messages on ``queue`` (default exchange), ids ``m-0``..."""
    producer = Producer(broker.channel())
    ids = [f"m-{i}" for i in range(count)]
    for message_id in ids:
        producer.publish(
            f'{{"invoice": "{message_id}"}}'.encode(),
            routing_key=queue,
            message_id=message_id,
            content_type="application/json",
            content_encoding="utf-8",
            retry=True,
        )
    return ids


def assert_drained_then_buried(
    runtime: Runtime, consumer: RejectingConsumer, ids: list[str], redis_client: Any, keys: Keys
) -> None:
    """Each message: delivered 3 times (attempts 0, 1, 2), parked twice, drained twice, buried."""
    assert dict(consumer.attempts) == {m: [0, 1, 2] for m in ids}
    assert consumer.deliveries() == 3 * len(ids)
    assert obituaries.count(runtime) == len(ids)
    for message_id in ids:
        (ob,) = obituaries.list_obituaries(runtime, message_id=message_id)
        assert ob.origin == "foreign" and ob.attempt == 3
        assert [a.fate for a in ob.attempts] == [PARKED, PARKED, BURIED]
        assert fates_of(redis_client, keys, message_id) == [
            PARKED,
            DRAINED,
            PARKED,
            DRAINED,
            BURIED,
        ]
    assert parked_data(runtime)["count"] == 0


def test_the_service_alone_drains_parked_retries_until_they_are_buried(
    uid: str,
    names: dict[str, str],
    conf: dict[str, Any],
    runtime: Runtime,
    broker: Any,
    redis_client: Any,
    keys: Keys,
    tmp_path: Path,
) -> None:
    """Two service processes, no worker: one holds the drain lease for the whole run, and
    SIGTERM releases it."""
    start_foreign_queue(broker, names)
    channel = broker.channel()
    log = tmp_path / "service.log"
    holders: set[bytes] = set()

    def buried_all() -> bool:
        if (holder := redis_client.get(keys.drain_lease)) is not None:
            holders.add(holder)
        return obituaries.count(runtime) >= MESSAGES

    with (
        service_process(uid, conf, log, "--processes", "2") as proc,
        consuming(RejectingConsumer(names["billing"])) as consumer,
    ):
        wait_until(lambda: consumers(channel, names["dead"]) == 2, TIMEOUT, what="2 services")
        ids = publish(broker, names["billing"], MESSAGES)
        wait_until(buried_all, TIMEOUT, what=f"{MESSAGES} obituaries")
        assert redis_client.get(keys.drain_lease) in holders
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()

    assert_drained_then_buried(runtime, consumer, ids, redis_client, keys)
    # One drainer held the lease throughout: a child (host:pid:random), not the parent.
    (holder,) = holders
    assert int(holder.decode().split(":")[-2]) != proc.pid
    # Released at the stop, not left to expire (its TTL is 10 s).
    assert redis_client.get(keys.drain_lease) is None
    assert log.read_text().count("DLX service draining parked retries every 0.2s") == 2


def test_no_drain_leaves_parked_retries_parked(
    uid: str,
    names: dict[str, str],
    conf: dict[str, Any],
    runtime: Runtime,
    broker: Any,
    redis_client: Any,
    keys: Keys,
    tmp_path: Path,
) -> None:
    """``--no-drain``: every message parked once and kept; a draining service then takes them
    to the graveyard."""
    start_foreign_queue(broker, names)
    channel = broker.channel()
    log = tmp_path / "service.log"
    with consuming(RejectingConsumer(names["billing"])) as consumer:
        with service_process(uid, conf, log, "--no-drain"):
            wait_until(lambda: consumers(channel, names["dead"]) == 1, TIMEOUT, what="service")
            ids = publish(broker, names["billing"], MESSAGES)
            wait_until(
                lambda: parked_data(runtime)["due_now"] == MESSAGES, TIMEOUT, what="all parked, due"
            )
            # Nothing to await: a drainer would have republished them within one interval.
            time.sleep(5 * INTERVAL)
            parked = parked_data(runtime, limit=2 * MESSAGES)
            assert parked["count"] == parked["due_now"] == MESSAGES
            assert sorted(m["message_id"] for m in parked["messages"]) == sorted(ids)
            assert {m["attempt"] for m in parked["messages"]} == {1}
            assert dict(consumer.attempts) == {m: [0] for m in ids}
            assert obituaries.count(runtime) == 0
            assert redis_client.get(keys.drain_lease) is None  # no drainer ever took it
        assert "DLX service not draining parked retries" in log.read_text()

        with service_process(uid, conf, log):
            wait_until(
                lambda: obituaries.count(runtime) >= MESSAGES, TIMEOUT, what="the obituaries"
            )
    assert_drained_then_buried(runtime, consumer, ids, redis_client, keys)
    assert redis_client.get(keys.drain_lease) is None
