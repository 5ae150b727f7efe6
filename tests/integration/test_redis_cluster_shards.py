"""Parked retries sharded by queue on a real 3-master Redis Cluster (issue 24, item 1).

Measured: the parks of 8 queues, by the bytes Redis reports (``MEMORY USAGE`` of every key of
the app's prefix, found by ``SCAN`` on each master). With the single-tag layout
(``dlx_redis_shards = "none"``) every byte sits on one master; with ``"auto"`` (the default) on
a cluster URL (keys per queue and bucket) no master holds more than half. Then the drain returns every parked
retry to its queue across the masters, and ``dlx parked`` lists every shard; data parked by the
old layout is read, moved by ``dlx migrate-keys`` and drained.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Queue

from celery_dlx.drain.core import run_drain
from celery_dlx.fates import now_ms
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.store.parking import ParkingStore
from celery_dlx.wiring.runtime import get_runtime
from tests.chaos.servers import RedisClusterServers, redis_cluster
from tests.conftest import BROKER_URL
from tests.integration.cli_helpers import run
from tests.integration.helpers import wait_until

QUEUES = 8
PER_QUEUE = 100
PAYLOAD = b"x" * 1024


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with redis_cluster(tmp_path_factory.mktemp("shards")) as servers:
        yield servers


def app_on(cluster: RedisClusterServers, prefix: str, **conf: Any) -> Celery:
    app = Celery(f"shards-{prefix}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(dlx_redis_url=cluster.url, dlx_key_prefix=prefix, **conf)
    return app


def retries(queues: list[str], due_ms: int, per_queue: int = PER_QUEUE) -> list[ParkedMessage]:
    return [
        ParkedMessage(
            message_id=f"{queue}-{i}",
            attempt=1,
            queue=queue,
            body=PAYLOAD,
            headers={"x-dlx-attempt": 1},
            properties={"content_type": "application/octet-stream", "delivery_mode": 2},
            due_ms=due_ms + i,
            task="proj.t",
            cause="c0ffee",
        )
        for queue in queues
        for i in range(per_queue)
    ]


def bytes_per_master(cluster: RedisClusterServers, prefix: str) -> dict[int, int]:
    """``MEMORY USAGE`` summed over every key of ``prefix`` (both layouts), per master port."""
    out = {}
    for node in cluster.nodes:
        client = node.client()
        try:
            total = 0
            for pattern in ("{" + prefix + "}*", "{" + prefix + ":q:*"):
                for key in client.scan_iter(match=pattern, count=1000):
                    total += int(client.memory_usage(key, samples=0) or 0)
            out[node.port] = total
        finally:
            client.close()
    return out


def share(per_master: dict[int, int]) -> float:
    return max(per_master.values()) / sum(per_master.values())


def queue_depths(broker: Any, names: list[str]) -> dict[str, int]:
    channel = broker.channel()
    try:
        return {n: channel.queue_declare(n, passive=True).message_count for n in names}
    finally:
        channel.close()


def test_parks_of_eight_queues_spread_over_three_masters_and_drain_from_each(
    uid: str, cluster: RedisClusterServers, broker: Any, cleanup_queues: list[str]
) -> None:
    queues = [f"sh{i}-{uid}" for i in range(QUEUES)]
    due = now_ms() - 60_000

    before = get_runtime(app_on(cluster, f"one-{uid}", dlx_redis_shards="none"))  # one tag
    assert not before.sharded
    assert all(before.parking.park_many(retries(queues, due)))
    single = bytes_per_master(cluster, f"one-{uid}")

    runtime = get_runtime(app_on(cluster, f"many-{uid}", dlx_redis_shards="auto"))
    assert runtime.sharded and isinstance(runtime.parking, ParkingStore) and runtime.store.per_queue
    assert all(runtime.parking.park_many(retries(queues, due)))
    spread = bytes_per_master(cluster, f"many-{uid}")
    print(f"\nbytes per master, single tag: {single} ({share(single):.1%} on the largest)")
    print(f"bytes per master, per queue: {spread} ({share(spread):.1%} on the largest)")
    assert share(single) > 0.99  # the old layout: one master holds everything
    assert share(spread) <= 0.5, spread
    assert min(spread.values()) > 0

    listed = json.loads(run(before.app, "parked", "--json", "-n", "2000").stdout)
    data = json.loads(run(runtime.app, "parked", "--json", "-n", "2000").stdout)
    assert data["count"] == listed["count"] == QUEUES * PER_QUEUE
    assert Counter(m["queue"] for m in data["messages"]) == dict.fromkeys(queues, PER_QUEUE)
    assert [m["due_ms"] for m in data["messages"]] == sorted(m["due_ms"] for m in data["messages"])

    channel = broker.channel()
    for name in queues:
        Queue(name, durable=False, auto_delete=False)(channel).declare()
    cleanup_queues.extend(queues)
    wait_until(
        lambda: run_drain(runtime, budget_seconds=2.0) and runtime.parking.count() == 0,
        timeout=30,
        what="the drain of every shard",
    )
    assert queue_depths(broker, queues) == dict.fromkeys(queues, PER_QUEUE)
    assert before.parking.count() == QUEUES * PER_QUEUE  # the other app's, untouched


def test_old_layout_parks_are_read_then_moved_by_migrate_keys_and_drained(
    uid: str, cluster: RedisClusterServers, broker: Any, cleanup_queues: list[str]
) -> None:
    prefix = f"mig-{uid}"
    queues = [f"mig{i}-{uid}" for i in range(3)]
    old = get_runtime(app_on(cluster, prefix, dlx_redis_shards="none"))
    assert all(old.parking.park_many(retries(queues, now_ms() - 1000, per_queue=20)))
    runtime = get_runtime(app_on(cluster, prefix, dlx_redis_shards="queue"))
    assert runtime.parking.count() == 60  # read-both: the old keys are read before the move
    dry = json.loads(run(runtime.app, "migrate-keys", "--dry-run", "--json").stdout)
    assert dry["found"] == 60 and dry["moved"] == 0 and dry["queues"] == dict.fromkeys(queues, 20)
    moved = json.loads(run(runtime.app, "migrate-keys", "--json").stdout)
    assert moved["moved"] == 60 and moved["left"] == 0
    assert old.parking.count() == 0 and runtime.parking.count() == 60
    assert json.loads(run(runtime.app, "migrate-keys", "--json").stdout)["found"] == 0

    channel = broker.channel()
    for name in queues:
        Queue(name, durable=False, auto_delete=False)(channel).declare()
    cleanup_queues.extend(queues)
    wait_until(
        lambda: run_drain(runtime, budget_seconds=2.0) and runtime.parking.count() == 0,
        timeout=30,
        what="the drain of the moved retries",
    )
    assert queue_depths(broker, queues) == dict.fromkeys(queues, 20)
