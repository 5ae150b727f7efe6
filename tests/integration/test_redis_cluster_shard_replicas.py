"""Parks sharded by queue on a Redis Cluster with replicas: each park waits (``WAIT``) for the
replica of the master owning its own bucket, not the app's tag (issue 24, items 1 and 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from celery_dlx.store.client import NotReplicated
from celery_dlx.store.parking import ParkingStore
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL
from tests.integration.test_redis_failover import (
    cluster_with_replicas,
    parked,
    pause,
    replica_of,
    resume,
)


def owner(client: Any, key: str) -> int:
    return int(client.get_node_from_key(key).port)


def test_a_sharded_park_waits_for_the_replica_of_its_bucket_master(
    tmp_path: Path, uid: str
) -> None:
    queue = f"orders-{uid}"
    with cluster_with_replicas(tmp_path) as nodes:
        app = Celery(f"shard-replicas-{uid}", broker=BROKER_URL, set_as_current=False)
        app.conf.update(
            dlx_redis_url=f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true",
            dlx_redis_shards="queue",
            dlx_redis_replica_timeout=0.2,  # dlx_redis_min_replicas: the default, 1 per master
            dlx_key_prefix=f"test-{uid}",
        )
        runtime = get_runtime(app)
        store = runtime.parking
        assert isinstance(store, ParkingStore) and store.per_queue
        client = runtime.redis
        index_master = owner(client, runtime.keys.parked_queues)
        # A message whose bucket lives on another master than the app's tag (and the index).
        message = next(
            m
            for m in (parked(f"s-{i}", queue) for i in range(200))
            if owner(client, store.shard(queue, m.entry_id).parked.due) != index_master
        )
        bucket = store.shard(queue, message.entry_id).parked
        bucket_master = owner(client, bucket.due)
        own = replica_of(nodes, bucket_master)

        # The replica of the bucket's master lags: the park does not count.
        store.park(parked("warm-up", queue))  # the queue is in the index (on another master)
        pause(own)
        try:
            with pytest.raises(NotReplicated, match="dlx_redis_min_replicas"):
                store.park(message)
        finally:
            resume(own)
        # Caught up, the same park goes in (or was already in: idempotent) and is on the replica.
        store.park(message)
        replica = redis.Redis(host="127.0.0.1", port=own.port)
        try:
            replica.execute_command("READONLY")
            assert replica.hexists(bucket.meta, message.entry_id)
        finally:
            replica.close()

        # The replica of the app tag's master lags: a park of that bucket still counts.
        tag_replica = replica_of(nodes, index_master)
        pause(tag_replica)
        try:
            later = next(
                m
                for m in (parked(f"t-{i}", queue) for i in range(200))
                if owner(client, store.shard(queue, m.entry_id).parked.due) == bucket_master
            )
            assert store.park(later)
        finally:
            resume(tag_replica)
        assert store.count() == 3
