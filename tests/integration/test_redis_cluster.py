"""The parking store, the graveyard, the DLX service and DLX tasks on a real Redis Cluster.

The test starts three masters (``redis-server --cluster-enabled yes`` on free ports) and joins
them with ``redis-cli --cluster create``; celery_dlx reaches them through
``redis://host:port/0?cluster=true``. Every key of one prefix carries the ``{prefix}`` hash tag,
so its Lua scripts and pipelines stay on one slot while different prefixes spread over masters.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Producer, Queue
from redis.cluster import RedisCluster, key_slot

from celery_dlx.fates import BURIED, now_ms
from celery_dlx.message.names import Keys
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.ops import obituaries, purge
from celery_dlx.ops import replay as replaying
from celery_dlx.service.loop import DLXService
from celery_dlx.store import counters
from celery_dlx.store.client import redis_client
from celery_dlx.store.history import History
from celery_dlx.store.parking import ParkingStore
from celery_dlx.wiring.runtime import get_runtime
from tests.chaos.servers import RedisClusterServers, redis_cluster
from tests.integration.dlx_apps import drain_thread, make_app, queue_names, worker
from tests.integration.helpers import fates_of, wait_until


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with redis_cluster(tmp_path_factory.mktemp("cluster")) as servers:
        yield servers


@pytest.fixture
def client(cluster: RedisClusterServers) -> Iterator[Any]:
    conn = redis_client(cluster.url)
    yield conn
    conn.close()


def key_attributes(keys: Keys) -> list[str]:
    return [
        keys.parked_due,
        keys.parked_meta,
        keys.parked_body,
        keys.history,
        keys.cause("m-1"),
        keys.graveyard("records"),
        keys.graveyard("queue:orders"),
        f"{keys.counter_prefix}123",
        f"{keys.seen_prefix}abc",
        keys.replay_ledger,
    ]


def test_the_url_gives_a_cluster_client_and_prefixes_spread_over_masters(
    cluster: RedisClusterServers, client: Any
) -> None:
    assert isinstance(client, RedisCluster)
    assert len(client.get_primaries()) == 3
    owners = set()
    for i in range(30):
        keys = Keys(f"tenant-{i}")
        slots = {key_slot(k.encode()) for k in key_attributes(keys)}
        assert len(slots) == 1, f"keys of one prefix span slots {slots}"
        owners.add(cluster.node_of_slot(slots.pop()).port)
    assert owners == {node.port for node in cluster.nodes}


def parked(message_id: str, due_ms: int, **fields: Any) -> ParkedMessage:
    return ParkedMessage(
        message_id=message_id,
        attempt=fields.pop("attempt", 1),
        queue="orders",
        body=fields.pop("body", b'{"order": 1}'),
        headers=fields.pop("headers", {"x-dlx-attempt": 1, "raw": b"\xff\x00"}),
        properties={"content_type": "application/json", "delivery_mode": 2},
        due_ms=due_ms,
        task="proj.charge",
        cause="c0ffee",
        **fields,
    )


def test_parking_store_claims_leases_acks_and_releases_on_the_cluster(
    client: Any, uid: str
) -> None:
    store = ParkingStore(client, Keys(f"cl-{uid}"))
    store.load_scripts()
    now = now_ms()
    assert store.park(parked("a", now - 10))
    assert not store.park(parked("a", now - 10))  # idempotent per id and attempt
    assert store.park(parked("b", now - 5)) and store.park(parked("later", now + 3_600_000))
    assert store.count() == 3 and store.due_count(now) == 2

    first = store.claim(10, lease_ms=60_000, now=now)
    assert [m.message_id for m in first] == ["a", "b"]
    assert first[0].headers["raw"] == b"\xff\x00" and first[0].body == b'{"order": 1}'
    assert store.claim(10, lease_ms=60_000, now=now) == []  # leased: hidden from other drains
    store.release(first[1:])
    again = store.claim(10, lease_ms=60_000, now=now_ms())
    assert [m.message_id for m in again] == ["b"]
    assert store.ack(first[:1]) == 1 and store.ack(again) == 1
    assert [m.message_id for m in store.peek()] == ["later"]
    assert store.remove(["later:1"]) == 1 and store.count() == 0


@pytest.fixture
def names(uid: str, key_prefix: str, cleanup_queues: list[str]) -> dict[str, str]:
    out = {"dead": f"dead-{uid}", "dlx": f"dlx-{uid}", "bury": f"bury-{uid}", "park": f"park-{uid}"}
    cleanup_queues.extend([out["dead"], f"exchange:{out['dlx']}"])
    return out


def service_app(uid: str, cluster: RedisClusterServers, names: dict[str, str]) -> Celery:
    from tests.conftest import BROKER_URL

    app = Celery(f"cl-svc-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(
        dlx_redis_url=cluster.url,
        dlx_key_prefix=f"test-{uid}",
        dlx_exchange=names["dlx"],
        dlx_service_queue=names["dead"],
        dlx_queues={
            names["bury"]: {"max_parks": 0, "max_requeues": 0},
            names["park"]: {"max_requeues": 0, "backoff": [3600]},
        },
    )
    return app


def test_dlx_service_parks_and_buries_on_the_cluster_and_the_graveyard_reads_back(
    uid: str, cluster: RedisClusterServers, names: dict[str, str], broker: Any
) -> None:
    app = service_app(uid, cluster, names)
    runtime = get_runtime(app)
    channel = broker.channel()
    dead = Queue(names["dead"], exchange=Exchange(names["dlx"], type="topic"), routing_key="#")
    dead(channel).declare()
    producer = Producer(channel)
    n = 120
    for queue in (names["bury"], names["park"]):
        death = [{"queue": queue, "reason": "rejected", "count": 1}]
        for i in range(n):
            producer.publish(
                f'{{"i": {i}}}'.encode(),
                exchange=names["dlx"],
                routing_key=queue,
                headers={"x-death": death},
                message_id=f"{queue}-{i}",
                retry=True,
            )
    svc = DLXService(app, prefetch=60)
    thread = threading.Thread(target=svc.run, kwargs={"idle_timeout": 1.0}, daemon=True)
    thread.start()
    thread.join(120)
    finished = not thread.is_alive()
    svc.stop()
    thread.join(30)
    assert finished, f"the service did not finish: {svc.stats}"
    assert svc.stats.buried == n and svc.stats.parked == n and svc.stats.outages == 0

    assert obituaries.count(runtime) == n and runtime.store.count() == n
    assert {m.message_id for m in runtime.store.peek(limit=2 * n)} == {
        f"{names['park']}-{i}" for i in range(n)
    }
    (group,) = obituaries.groups(runtime)
    assert group.total == n and group.queue == names["bury"]
    ob = obituaries.get_obituary(runtime, f"{names['bury']}-7")
    assert ob is not None and ob.payload == b'{"i": 7}' and ob.queue == names["bury"]
    listed = obituaries.list_obituaries(runtime, queue=names["bury"], limit=None)
    assert len(listed) == n
    fates = [f["fate"] for _, f in runtime.history.read()]
    assert fates.count(BURIED) == n and fates.count("parked") == n
    totals = counters.read_window(runtime.redis, runtime.keys, 600).by_fate()
    assert totals["buried"] == n and totals["parked"] == n

    report = purge.purge(runtime, queue=names["bury"], everything=True)
    assert len(report.purged) == n and obituaries.count(runtime) == 0
    assert dead(channel).get() is None


def test_dlx_tasks_requeue_park_drain_and_bury_on_the_cluster(
    uid: str, cluster: RedisClusterServers, cleanup_queues: list[str], key_prefix: str
) -> None:
    app = make_app(uid, dlx_redis_url=cluster.url)
    cleanup_queues.extend([*queue_names(app), f"exchange:dlx-{uid}"])
    runtime = get_runtime(app)
    ledger = redis_client(cluster.url)
    runs = "{" + key_prefix + "}:test:runs"

    @app.task(name=f"flaky-{uid}")
    def flaky() -> str:
        if ledger.incr(runs) <= 3:
            raise ConnectionError("upstream down")
        return "ok"

    @app.task(name=f"poison-{uid}")
    def poison(order: int) -> None:
        raise ValueError(f"order {order} has no customer")

    svc = DLXService(app)
    thread = threading.Thread(target=svc.run, daemon=True)
    thread.start()
    try:
        with worker(app), drain_thread(app):
            good = flaky.delay()
            bad = poison.delay(42)
            wait_until(lambda: obituaries.count(runtime) == 1, timeout=60, what="the burial")
            wait_until(
                lambda: "recovered" in fates_of(runtime.redis, runtime.keys, good.id),
                timeout=60,
                what="the recovery",
            )
    finally:
        svc.stop()
        thread.join(30)
    assert fates_of(runtime.redis, runtime.keys, good.id) == [
        "requeued",
        "requeued",
        "parked",
        "drained",
        "recovered",
    ]
    (ob,) = obituaries.list_obituaries(runtime, with_payload=True)
    assert ob.message_id == bad.id and ob.exc_type == "ValueError" and ob.attempt == 5
    assert "order 42 has no customer" in ob.traceback
    assert runtime.store.count() == 0
    report = replaying.replay(runtime, [ob.id])
    assert report.replayed == [ob.id]
    rows = [f for _, f in History(runtime.redis, runtime.keys).read()]
    assert [f["fate"] for f in rows if f["message_id"] == bad.id][-1] == "replayed"
