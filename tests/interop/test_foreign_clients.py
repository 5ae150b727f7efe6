"""Real foreign consumers (Go amqp091-go, Node amqplib, Ruby bunny) decode every copy celery_dlx
republishes (issue 12).

Each consumer rejects every delivery with requeue=false from a queue with celery_dlx's dead-letter
topology. The real DLX service (in a thread) and drain requeue once, park twice, then bury; then
the graveyard is replayed into the same queue and the cycle runs again. The messages carry every
header type a Go publisher writes (64-bit ints as ``l``, decimals, timestamps, bytes, nested
arrays and tables), Celery-like headers (void, arrays) and two look-alikes without message_id.
The consumer must stay connected, decode every copy, and see exactly the configured deliveries.
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import amqp
import pytest
from celery import Celery

from celery_dlx.broker.topology import dlx_queue
from celery_dlx.drain.core import drain_once
from celery_dlx.fates import BURIED, PARKED, REQUEUED
from celery_dlx.message.names import ATTEMPT_HEADER, FIRST_FAILURE_HEADER, REPLAYED_HEADER
from celery_dlx.ops import obituaries
from celery_dlx.ops.replay import replay
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.conftest import BROKER_URL
from tests.integration.dlx_apps import service_thread
from tests.integration.service_app import service_settings
from tests.interop import clients

pytestmark = pytest.mark.integration

CLIENTS = ("go", "node", "ruby")
#: The queue's budget: 1 requeue, 2 parks, then buried: 4 deliveries per message.
POLICY = {"max_requeues": 1, "max_parks": 2, "backoff": [0.2, 0.3]}
DELIVERIES = 1 + 1 + 2
GO_MESSAGES = 3
TIMEOUT = 120.0


def wait_until(predicate: Callable[[], Any], what: str, consumer: clients.Consumer) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not predicate():
        if not consumer.alive():
            pytest.fail(f"the {consumer.client} consumer died: {consumer.stderr()}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {TIMEOUT}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture(scope="session")
def go_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return clients.build_go(tmp_path_factory.mktemp("interop-go"))


@contextlib.contextmanager
def running(target: Callable[[threading.Event], None]) -> Iterator[None]:
    """``target(stop)`` in a thread until the block ends."""
    stop = threading.Event()
    thread = threading.Thread(target=target, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def drain_loop(runtime: Runtime) -> Callable[[threading.Event], None]:
    def loop(stop: threading.Event) -> None:
        while not stop.is_set():
            drain_once(runtime)
            stop.wait(0.05)

    return loop


def publish_python(queue: str) -> list[str | None]:
    """Messages a Python publisher sends: Celery-like header shapes, and two look-alikes."""
    conn = amqp.Connection("127.0.0.1:5672", userid="guest", password="guest")
    conn.connect()
    try:
        channel = conn.channel()
        celery_like = {
            "timelimit": [None, None],
            "eta": None,
            "retries": 0,
            "ignore_result": False,
            "ratio": 0.5,
            "stamps": {"tags": ["a", 1, True]},
        }
        sent: list[str | None] = []
        for message_id, headers in (("py-celery-like", celery_like), (None, {}), (None, {})):
            props: dict[str, Any] = {"delivery_mode": 2, "application_headers": headers}
            if message_id:
                props["message_id"] = message_id
            channel.basic_publish(
                amqp.Message(b'{"event": "recount"}', **props), exchange="", routing_key=queue
            )
            sent.append(message_id)
        return sent
    finally:
        conn.close()


def by_message(deliveries: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Deliveries grouped per message: its message_id, else the x-dlx-id of its copies.

    A look-alike's first delivery carries neither: those are pooled in one group of their own.
    """
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    anonymous = []
    for d in deliveries:
        key = d.get("message_id") or (d.get("headers") or {}).get("x-dlx-id")
        if key:
            groups[key].append(d)
        else:
            anonymous.append(d)
    groups["(look-alike first deliveries)"] = anonymous
    return groups


def attempt_of(delivery: dict[str, Any]) -> int:
    return int((delivery.get("headers") or {}).get(ATTEMPT_HEADER, 0))


@pytest.mark.parametrize("client", CLIENTS)
def test_foreign_client_decodes_every_republished_copy(
    client: str,
    uid: str,
    key_prefix: str,
    cleanup_queues: list[str],
    broker: Any,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    clients.require(client)
    go = request.getfixturevalue("go_binary")  # the Go publisher writes Go's header types
    assert key_prefix == service_settings(uid)["dlx_key_prefix"]
    queue = f"interop-{client}-{uid}"
    cleanup_queues.extend([queue, f"dead-{uid}", f"exchange:dlx-{uid}"])
    dlx_queue(queue, dlx=f"dlx-{uid}", service=f"dead-{uid}")(broker.channel()).declare()
    app = Celery(f"interop-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(service_settings(uid), dlx_queues={queue: POLICY})
    runtime = get_runtime(app)
    command = clients.consumer_command(client, go, queue)

    with clients.consuming(client, command, tmp_path) as consumer:
        with service_thread(app), running(drain_loop(runtime)):
            # bunny cannot read a byte 'B' (Go's byte): not in the messages it consumes
            portable = ["no-byte"] if client == "ruby" else []
            subprocess.run(
                [str(go), "publish", clients.amqp_url(), queue, str(GO_MESSAGES), *portable],
                check=True,
                timeout=60,
            )
            python_ids = publish_python(queue)
            total = GO_MESSAGES + len(python_ids)
            wait_until(lambda: obituaries.count(runtime) >= total, f"{total} obituaries", consumer)
            wait_until(
                lambda: len(consumer.poll()) >= total * DELIVERIES, "every delivery", consumer
            )
            first_round = list(consumer.poll())

            report = replay(runtime, queue=queue)
            assert len(report.replayed) == total and not report.failed
            wait_until(
                lambda: obituaries.count(runtime) >= 2 * total, "the replays buried", consumer
            )
            wait_until(
                lambda: len(consumer.poll()) >= 2 * total * DELIVERIES,
                "every replayed delivery",
                consumer,
            )
        time.sleep(0.5)  # nothing more may come
        consumer.poll()
        assert consumer.alive(), consumer.stderr()
    assert "CONNECTION CLOSED" not in consumer.stderr()
    errors = consumer.stderr().strip()
    assert not errors, errors

    # Exactly the configured deliveries, each decoded: 4 per message per round.
    deliveries = consumer.deliveries
    assert len(deliveries) == 2 * total * DELIVERIES
    groups = by_message(first_round)
    look_alike_firsts = groups.pop("(look-alike first deliveries)")
    assert len(look_alike_firsts) == 2
    stamped = [k for k in groups if k.startswith("sha1-")]
    assert len(stamped) == 2  # two look-alikes, never merged
    for key, seen in groups.items():
        expected = DELIVERIES - 1 if key in stamped else DELIVERIES
        assert len(seen) == expected, (key, seen)
        attempts = [attempt_of(d) for d in seen]
        assert attempts == sorted(attempts) and attempts[-1] == DELIVERIES - 1
        for d in seen:
            if attempt_of(d) > 0:
                first = d["headers"][FIRST_FAILURE_HEADER]
                assert isinstance(first, str) and first.isdigit(), first
    go_copies = [d for d in first_round if d["message_id"].startswith("go-")]
    assert len(go_copies) == GO_MESSAGES * DELIVERIES
    for d in go_copies:
        headers = d["headers"]
        assert "go-int64" in headers and "go-decimal" in headers and "go-time" in headers
        assert "go-nested" in headers and "go-table" in headers
        if attempt_of(d) > 0:  # a republished copy: the 64-bit int came back as text
            assert str(headers["go-int64"]).isdigit()
        if client == "go":  # decimals and timestamps stay typed through requeue and parks
            types = d["types"]
            assert (types["go-decimal"], types["go-time"]) == ("amqp091.Decimal", "time.Time")
            assert types["go-nested"] == "[]interface {}" and types["go-table"] == "amqp091.Table"

    replayed = [d for d in deliveries if REPLAYED_HEADER in (d.get("headers") or {})]
    # each replay received once (a fresh budget: attempt 0), then its own cycle of copies
    assert len([d for d in replayed if attempt_of(d) == 0]) == total
    assert len(replayed) == total * DELIVERIES
    assert {d["message_id"] for d in replayed if d["message_id"]} == {
        *(f"go-{i}" for i in range(GO_MESSAGES)),
        "py-celery-like",
    }
    obs = obituaries.list_obituaries(runtime, limit=None)
    assert len(obs) == 2 * total
    for ob in obs:
        assert [a.fate for a in ob.attempts] == [REQUEUED, PARKED, PARKED, BURIED]
    assert Counter(ob.replayed_from is not None for ob in obs) == {True: total, False: total}
    print(f"{clients.client_version(client)}: decoded {len(deliveries)} deliveries")
