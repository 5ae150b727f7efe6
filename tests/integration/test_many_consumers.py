"""Several DLX services and several drains at once: no message lost, none handled twice.

Three DLX services (each its own connections) share the service queue and three drains (each its
own app, runtime and publisher) share the parking store, while a foreign consumer rejects every
message until its own attempt header reaches the number its body names. Every message must reach
the consumer exactly once per attempt, in order, and poison messages must be buried exactly once.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from celery import Celery
from kombu import Producer

from celery_dlx.broker.topology import dlx_queue
from celery_dlx.fates import BURIED, DRAINED, PARKED, REQUEUED
from celery_dlx.message.names import ATTEMPT_HEADER
from celery_dlx.ops import obituaries
from celery_dlx.service.loop import DLXService
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL
from tests.integration.dlx_apps import drain_thread, make_app
from tests.integration.helpers import queue_depth, wait_until

MESSAGES = 1000
SERVICES = 3
DRAINS = 3


class Consumer:
    """A foreign consumer: rejects (requeue=false) while attempt < fails, then acks."""

    def __init__(self, queue: str) -> None:
        self.queue = queue
        self.attempts: dict[str, list[int]] = defaultdict(list)
        self.acked: Counter[str] = Counter()
        self.stop = threading.Event()

    def __call__(self) -> None:
        url = BROKER_URL[:-2] + "/%2F" if BROKER_URL.endswith("//") else BROKER_URL
        conn = pika.BlockingConnection(pika.URLParameters(url))
        channel = conn.channel()
        channel.basic_qos(prefetch_count=100)

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            spec = json.loads(body)
            attempt = int((props.headers or {}).get(ATTEMPT_HEADER, 0))
            self.attempts[spec["id"]].append(attempt)
            if attempt < spec["fails"]:
                ch.basic_reject(method.delivery_tag, requeue=False)
            else:
                self.acked[spec["id"]] += 1
                ch.basic_ack(method.delivery_tag)

        channel.basic_consume(self.queue, on_message)
        while not self.stop.is_set():
            conn.process_data_events(time_limit=0.1)
        conn.close()


@pytest.fixture
def names(uid: str, key_prefix: str, cleanup_queues: list[str]) -> dict[str, str]:
    out = {"orders": f"orders-{uid}", "dead": f"dead-{uid}", "dlx": f"dlx-{uid}"}
    cleanup_queues.extend([out["orders"], out["dead"], f"exchange:{out['dlx']}"])
    cleanup_queues.append(f"work-{uid}")
    return out


def apps(uid: str, names: dict[str, str], n: int) -> list[Celery]:
    """``n`` apps with the same settings: separate runtimes, connections and publishers."""
    policy = {"max_requeues": 1, "max_parks": 2, "backoff": [0.2, 0.4]}
    return [make_app(uid, dlx_queues={names["orders"]: policy}) for _ in range(n)]


@pytest.fixture
def services(uid: str, names: dict[str, str]) -> Iterator[list[DLXService]]:
    running = [DLXService(app, prefetch=60) for app in apps(uid, names, SERVICES)]
    threads = [threading.Thread(target=s.run, daemon=True) for s in running]
    for thread in threads:
        thread.start()
    yield running
    for svc in running:
        svc.stop()
    for thread in threads:
        thread.join(30)
        assert not thread.is_alive()


def test_three_services_and_three_drains_lose_nothing_and_repeat_nothing(
    uid: str, names: dict[str, str], broker: Any, services: list[DLXService]
) -> None:
    drains = apps(uid, names, DRAINS)
    runtime = get_runtime(drains[0])
    channel = broker.channel()
    dlx_queue(
        names["orders"],
        exchange="",
        routing_key=names["orders"],
        dlx=names["dlx"],
        service=names["dead"],
    )(channel).declare()
    # Most succeed on their second or third attempt; one in ten is never accepted (buried).
    fails = {f"m-{i}": (99 if i % 10 == 0 else 1 + i % 3) for i in range(MESSAGES)}
    consumer = Consumer(names["orders"])
    thread = threading.Thread(target=consumer, daemon=True)
    thread.start()
    poison = {m for m, f in fails.items() if f == 99}
    try:
        with drain_thread(drains[0]), drain_thread(drains[1]), drain_thread(drains[2]):
            producer = Producer(channel)
            for message_id, n in fails.items():
                producer.publish(
                    json.dumps({"id": message_id, "fails": n}).encode(),
                    routing_key=names["orders"],
                    message_id=message_id,
                    delivery_mode=2,
                    retry=True,
                )
            wait_until(
                lambda: len(consumer.acked) + obituaries.count(runtime) >= MESSAGES,
                timeout=180,
                what="every message acked or buried",
            )
            wait_until(lambda: runtime.store.count() == 0, timeout=30, what="an empty store")
    finally:
        consumer.stop.set()
        thread.join(30)

    budget = [0, 1, 2, 3]  # the first delivery, 1 requeue, 2 parks
    for message_id, n in fails.items():
        expected = budget if message_id in poison else list(range(n + 1))
        assert consumer.attempts[message_id] == expected, (
            message_id,
            consumer.attempts[message_id],
        )
    assert set(consumer.acked) == set(fails) - poison
    assert set(consumer.acked.values()) == {1}
    buried = Counter(ob.message_id for ob in obituaries.list_obituaries(runtime, limit=None))
    assert set(buried) == poison and set(buried.values()) == {1}

    fates = Counter((f["message_id"], f["fate"]) for _, f in runtime.history.read())
    for message_id, n in fails.items():
        failures = 4 if message_id in poison else n
        assert fates[(message_id, REQUEUED)] == min(failures, 1)
        parks = max(0, min(failures, 3) - 1)
        assert fates[(message_id, PARKED)] == parks, message_id
        assert fates[(message_id, DRAINED)] == parks, message_id
        assert fates[(message_id, BURIED)] == (1 if message_id in poison else 0)
    assert sum(s.stats.duplicates for s in services) == 0
    assert sum(1 for s in services if s.stats.received) >= 2, "one service did all the work"
    assert queue_depth(channel, names["dead"]) == 0
