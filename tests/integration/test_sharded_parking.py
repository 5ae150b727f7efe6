"""Parked retries sharded by queue (``dlx_redis_shards = "queue"``) on the shared Redis node.

The layout is the one a Redis Cluster gets by default; on one node it only changes key names, so
every behaviour of the store (merged reads, claims over queues, acks, the read-both window and
the migration from the single-tag layout) is checked here without starting a cluster.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_dlx.fates import PARKED, FateEvent, now_ms
from celery_dlx.message.names import PARKED_BUCKETS, Keys
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.store.migrate import migrate_parked
from celery_dlx.store.parking import ParkingStore
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.cli_helpers import run
from tests.integration.dlx_apps import make_app


@pytest.fixture
def sharded_keys(key_prefix: str, redis_client: Any) -> Iterator[Keys]:
    """The app's keys; the per-queue ones (another tag than ``{prefix}``) are deleted after."""
    yield Keys(key_prefix)
    for key in redis_client.scan_iter(match="{" + key_prefix + ":q:*", count=1000):
        redis_client.delete(key)


def parked(message_id: str, queue: str, due_ms: int, attempt: int = 1) -> ParkedMessage:
    return ParkedMessage(
        message_id=message_id,
        attempt=attempt,
        queue=queue,
        body=f"body-{message_id}".encode(),
        headers={"x-dlx-attempt": attempt},
        due_ms=due_ms,
        task="proj.t",
        cause="c",
    )


def test_keys_of_a_queue_bucket_share_one_tag_and_differ_from_the_app_tag() -> None:
    keys = Keys("app")
    shard = keys.parked_shard("orders", 3)
    assert shard.due == "{app:q:orders:3}:parked:due"
    assert {shard.meta, shard.body} == {
        "{app:q:orders:3}:parked:meta",
        "{app:q:orders:3}:parked:body",
    }
    assert keys.parked_legacy.due == keys.parked_due == "{app}:parked:due"
    assert keys.parked_queues == "{app}:parked:queues"


def test_parks_spread_over_queue_buckets_and_reads_merge_them_by_due(
    redis_client: Any, sharded_keys: Keys
) -> None:
    store = ParkingStore(redis_client, sharded_keys, per_queue=True)
    now = now_ms()
    queues = ["alpha", "beta", "gamma"]
    messages = [parked(f"m{i}", queues[i % 3], now - 1000 + i) for i in range(60)]
    assert store.park_many(messages) == [True] * 60
    assert store.park(messages[0]) is False  # idempotent per id and attempt
    assert store.park(parked("late", "beta", now + 3_600_000))

    assert store.queues() == queues
    used = [k for k in redis_client.scan_iter(match="{" + sharded_keys.prefix + ":q:*:parked:due")]
    assert len(used) > len(queues)  # one queue's retries span several buckets (slots)
    assert not redis_client.exists(sharded_keys.parked_due)  # nothing in the single-tag layout
    assert store.count() == 61 and store.due_count(now) == 60

    assert [m.message_id for m in store.peek(limit=5)] == ["m0", "m1", "m2", "m3", "m4"]
    assert [m.message_id for m in store.peek(limit=3, offset=58)] == ["m58", "m59", "late"]
    assert [m.message_id for m in store.soonest(61, batch=7)][-2:] == ["m59", "late"]
    found = store.entry("m7:1")
    assert found is not None and found.body == b"body-m7" and found.queue == "beta"

    first = store.claim(30, lease_ms=60_000, now=now)
    assert len(first) == 30 and {m.queue for m in first} == set(queues)  # a share per queue
    rest = store.claim(100, lease_ms=60_000, now=now)
    assert len(rest) == 30 and not {m.entry_id for m in first} & {m.entry_id for m in rest}
    assert store.claim(100, lease_ms=60_000, now=now) == []  # all leased
    store.release(rest[:10], due_ms=now - 1)
    again = store.claim(100, lease_ms=60_000, now=now)
    assert sorted(m.entry_id for m in again) == sorted(m.entry_id for m in rest[:10])
    assert store.ack(first) == 30 and store.ack(rest[10:]) == 20 and store.ack(again) == 10
    assert store.ack(first) == 0
    assert store.count() == 1 and store.remove(["late:1"]) == 1 and store.count() == 0


def test_the_single_tag_layout_is_read_drained_and_migrated_without_loss(
    redis_client: Any, sharded_keys: Keys
) -> None:
    old = ParkingStore(redis_client, sharded_keys)  # what an older version parked
    now = now_ms()
    for i in range(25):
        assert old.park(parked(f"o{i}", f"q{i % 4}", now - 100 + i))
    store = ParkingStore(redis_client, sharded_keys, per_queue=True)
    assert store.park(parked("new", "q0", now - 1000))
    # Read-both: the old entries are listed, counted and claimed (and acked where they are).
    assert store.count() == 26 and [m.message_id for m in store.peek(2)] == ["new", "o0"]
    claimed = store.claim(3, lease_ms=60_000, now=now)
    assert {m.message_id for m in claimed} <= {"new", "o0", "o1", "o2", "o3"}
    assert store.ack(claimed) == 3 and store.count() == 23

    dry = migrate_parked(store, dry_run=True)
    legacy_left = old.count()
    assert dry.found == legacy_left and dry.moved == 0 and old.count() == legacy_left
    assert sum((dry.queues or {}).values()) == legacy_left

    # An interrupted run: a few copied but not deleted yet.
    target = store.shard("q1", "o5:1").parked
    meta = redis_client.hget(sharded_keys.parked_meta, "o5:1")
    body = redis_client.hget(sharded_keys.parked_body, "o5:1")
    redis_client.hset(target.meta, "o5:1", meta)
    redis_client.hset(target.body, "o5:1", body)
    redis_client.zadd(target.due, {"o5:1": now - 95})

    done = migrate_parked(store, batch=4)
    assert done.found == legacy_left and done.moved == legacy_left and done.present == 1
    assert old.count() == 0 and store.count() == 23
    assert migrate_parked(store).found == 0  # idempotent
    moved = store.entry("o5:1")
    assert moved is not None and moved.body == b"body-o5" and moved.due_ms == now - 95
    everything = store.claim(100, lease_ms=60_000, now=now)
    assert len(everything) == 23 and store.ack(everything) == 23


def test_the_setting_picks_the_sharded_store_and_migrate_keys_moves_old_parks(
    uid: str, redis_client: Any, sharded_keys: Keys
) -> None:
    old_app = make_app(uid, dlx_key_prefix=sharded_keys.prefix)
    assert not get_runtime(old_app).sharded
    assert isinstance(get_runtime(old_app).parking, ParkingStore)
    now = now_ms()
    for i in range(5):
        get_runtime(old_app).parking.park(parked(f"m{i}", "orders", now + i))
    app = make_app(uid, dlx_key_prefix=sharded_keys.prefix, dlx_redis_shards="queue")
    runtime = get_runtime(app)
    assert runtime.sharded and isinstance(runtime.parking, ParkingStore) and runtime.store.per_queue
    assert runtime.parking is runtime.parking  # one per process (it remembers its claims)

    refused = run(old_app, "migrate-keys")
    assert refused.exit_code == 1 and "dlx_redis_shards" in refused.stderr
    dry = run(app, "migrate-keys", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "orders: 5" in dry.output and "5 parked retries would move" in dry.output
    assert redis_client.zcard(sharded_keys.parked_due) == 5
    moved = run(app, "migrate-keys", "--json")
    assert moved.exit_code == 0, moved.output
    assert '"moved": 5' in moved.output
    assert redis_client.zcard(sharded_keys.parked_due) == 0
    assert [m.message_id for m in runtime.parking.peek()] == [f"m{i}" for i in range(5)]
    assert PARKED_BUCKETS > 1


def test_a_worker_s_batch_of_parks_goes_to_the_queue_buckets_and_each_fate_is_recorded(
    uid: str, redis_client: Any, sharded_keys: Keys
) -> None:
    # What a worker's settler writes (Runtime.park_recorded_many): the sharded store parks each
    # message in its queue's bucket, and the fates go to the history under the app's tag after.
    runtime = get_runtime(
        make_app(uid, dlx_key_prefix=sharded_keys.prefix, dlx_redis_shards="queue")
    )
    now = now_ms()
    messages = [parked(f"w{i}", ["alpha", "beta"][i % 2], now + 60_000) for i in range(4)]
    events = [
        FateEvent.from_fields(PARKED, task="proj.t", queue=m.queue, message_id=m.message_id)
        for m in messages
    ]
    assert runtime.park_recorded_many(list(zip(messages, events, strict=True))) == [None] * 4
    assert runtime.parking.count() == 4
    assert {m.queue for m in runtime.parking.peek(limit=10)} == {"alpha", "beta"}
    recorded = [f for _, f in runtime.history.read() if f.get("fate") == PARKED]
    assert sorted(f["message_id"] for f in recorded) == ["w0", "w1", "w2", "w3"]
