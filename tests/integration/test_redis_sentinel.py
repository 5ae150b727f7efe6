"""celery_dlx through a Sentinel URL (``sentinel://host:port/mymaster/0``), across a failover.

The test starts its own master, a replica and one Sentinel monitoring them (quorum 1), so it can
fail the master over without touching the shared Redis.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Exchange, Producer, Queue

from celery_dlx.drain.core import drain_once
from celery_dlx.fates import now_ms
from celery_dlx.message.names import Keys
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.ops import obituaries
from celery_dlx.service.loop import DLXService
from celery_dlx.store.client import redis_client
from celery_dlx.store.parking import ParkingStore
from celery_dlx.wiring.runtime import get_runtime
from tests.chaos.servers import SentinelServers, redis_sentinel, wait_for
from tests.conftest import BROKER_URL


@pytest.fixture
def sentinel(tmp_path: Any) -> Iterator[SentinelServers]:
    with redis_sentinel(tmp_path) as servers:
        yield servers


def role_of(port: int) -> str:
    import redis

    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        return str(client.info("replication")["role"])
    finally:
        client.close()


def test_a_sentinel_url_reaches_the_master_and_the_store_works(
    sentinel: SentinelServers, uid: str
) -> None:
    client = redis_client(sentinel.url())
    store = ParkingStore(client, Keys(f"st-{uid}"))
    message = ParkedMessage("m", 1, "orders", b"body", headers={"h": b"\x00"}, due_ms=now_ms())
    assert store.park(message)
    assert role_of(sentinel.master.port) == "master"
    assert sentinel.master.client().zcard(store.keys.parked_due) == 1  # written to the master
    (claimed,) = store.claim(10, lease_ms=30_000)
    assert claimed.body == b"body" and claimed.headers == {"h": b"\x00"}
    assert store.ack([claimed]) == 1 and store.count() == 0
    client.close()


def failover(sentinel: SentinelServers) -> int:
    """Fail the master over to the replica once it has every write; returns the new port."""
    old = sentinel.master.port
    master = sentinel.master.client()
    try:
        assert master.execute_command("WAIT", 1, 10_000) == 1, "the replica did not catch up"
    finally:
        master.close()
    admin = sentinel.sentinel_client()
    try:
        admin.execute_command("SENTINEL", "FAILOVER", sentinel.service)
    finally:
        admin.close()
    new = wait_for(
        lambda: (p := sentinel.master_port()) not in (None, old) and p, "the failover", 60
    )
    wait_for(lambda: role_of(new) == "master", "the replica to take over", 60)
    return int(new)


@pytest.fixture
def names(uid: str, key_prefix: str, cleanup_queues: list[str]) -> dict[str, str]:
    out = {"dead": f"dead-{uid}", "dlx": f"dlx-{uid}", "bury": f"bury-{uid}", "park": f"park-{uid}"}
    cleanup_queues.extend([out["dead"], out["park"], f"exchange:{out['dlx']}"])
    return out


def publish_dead_letters(broker: Any, names: dict[str, str], start: int, n: int) -> None:
    producer = Producer(broker.channel())
    for queue in (names["bury"], names["park"]):
        death = [{"queue": queue, "reason": "rejected", "count": 1}]
        for i in range(start, start + n):
            producer.publish(
                b"{}",
                exchange=names["dlx"],
                routing_key=queue,
                headers={"x-death": death},
                message_id=f"{queue}-{i}",
                delivery_mode=2,
                retry=True,
            )


def test_service_and_drain_lose_nothing_across_a_sentinel_failover(
    uid: str, sentinel: SentinelServers, names: dict[str, str], broker: Any
) -> None:
    app = Celery(f"sent-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(
        dlx_redis_url=sentinel.url(),
        dlx_key_prefix=f"test-{uid}",
        dlx_exchange=names["dlx"],
        dlx_service_queue=names["dead"],
        dlx_queues={
            names["bury"]: {"max_parks": 0, "max_requeues": 0},
            names["park"]: {"max_requeues": 0, "backoff": [3600]},
        },
    )
    runtime = get_runtime(app)
    channel = broker.channel()
    Queue(names["dead"], exchange=Exchange(names["dlx"], type="topic"), routing_key="#")(
        channel
    ).declare()
    Queue(names["park"], durable=True)(channel).declare()
    n = 100
    svc = DLXService(app, prefetch=60)
    thread = threading.Thread(target=svc.run, daemon=True)
    thread.start()
    try:
        publish_dead_letters(broker, names, 0, n)
        wait_for(lambda: svc.stats.buried + svc.stats.parked == 2 * n, "the first batch", 60)
        new_port = failover(sentinel)
        publish_dead_letters(broker, names, n, n)
        wait_for(lambda: svc.stats.buried + svc.stats.parked == 4 * n, "the second batch", 120)
    finally:
        svc.stop()
        thread.join(30)
    assert not thread.is_alive()
    assert new_port == sentinel.replica.port
    # Read on the new master itself: a connection celery_dlx opened before the failover may
    # still reach the old master, which Sentinel turns into a replica only seconds later (and
    # whose writes meanwhile are lost then). The DLX service waited for a replica of the new
    # master (dlx_redis_min_replicas defaults to 1 behind Sentinel) before it acked.
    direct = redis.Redis(host="127.0.0.1", port=new_port)
    try:
        assert direct.zcard(runtime.keys.parked_due) == 2 * n
        assert direct.hlen(runtime.keys.graveyard("records")) == 2 * n
    finally:
        direct.close()
    assert obituaries.count(runtime) == 2 * n and runtime.store.count() == 2 * n
    buried = {ob.message_id for ob in obituaries.list_obituaries(runtime, limit=None)}
    assert buried == {f"{names['bury']}-{i}" for i in range(2 * n)}

    # The drain republishes what was parked before and after the failover, from the new master.
    drained = drain_once(runtime, now_ms=now_ms() + 3_700_000)
    assert drained.published == 2 * n and not drained.failed
    assert runtime.store.count() == 0
    arrived = set()
    while (msg := channel.basic_get(names["park"], no_ack=True)) is not None:
        arrived.add(msg.properties["message_id"])
    assert arrived == {f"{names['park']}-{i}" for i in range(2 * n)}
    runtime.reset_publisher()
