"""The graveyard's budget and a full Redis, on a private ``redis-server`` with a small
``maxmemory`` and ``noeviction`` (the only policy safe for parked retries).

What a failure storm needs from the graveyard (issue 36): no burial writes past the budget or
into the room kept for parked retries (refused before its first write, not after a leading
``DEL``), a purge runs on a full Redis and frees the bytes it removes, and the budget's byte
count follows what Redis really spends on an obituary.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from celery import Celery

from celery_dlx.message.names import Keys
from celery_dlx.message.obituary import Attempt, Obituary
from celery_dlx.ops import obituaries, purge
from celery_dlx.service.settle import buried_event
from celery_dlx.store.graveyard import OBITUARY_OVERHEAD, Budget, Graveyard, GraveyardFull
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.chaos.servers import RedisServer, own_redis
from tests.conftest import BROKER_URL

PAYLOAD = b"p" * 1024


@pytest.fixture
def full_redis() -> Iterator[RedisServer]:
    """A private Redis at 16 MB, refusing writes past it (no AOF: nothing to keep)."""
    args = ["--appendonly", "no", "--maxmemory", "16mb", "--maxmemory-policy", "noeviction"]
    with own_redis(args=args) as server:  # the later --appendonly wins
        yield server


def obituary(n: int, cause: str = "c1") -> Obituary:
    at = 1_700_000_000_000 + n
    return Obituary.from_fields(
        id=f"ob-{n}",
        message_id=f"m-{n}",
        queue="billing",
        reason="retry budget spent",
        buried_ms=at,
        task="shop.charge",
        cause=cause,
        exc_type="ValueError",
        exc_message=f"card {n} declined",
        attempt=3,
        attempts=[Attempt(at - 2, "parked", cause), Attempt(at, "buried", cause)],
        first_failure_ms=at - 2,
        last_failure_ms=at,
        traceback="Traceback (most recent call last):\n  ...\nValueError: card declined\n",
        headers={"id": f"m-{n}", "task": "shop.charge"},
        payload=PAYLOAD,
    )


def bury(yard: Graveyard, first: int, count: int) -> None:
    yard.write_many([(ob, buried_event(ob)) for ob in map(obituary, range(first, first + count))])


def used(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


def fill(client: redis.Redis) -> int:
    """Write junk until Redis refuses (OOM), 64 KiB values then 1 KiB ones, then hold it full:
    ``maxmemory`` just under what it uses (a refused command's own buffers are freed after it,
    which would leave room for the next small write). How many values went in."""
    n = 0
    for size in (65536, 1024):
        while True:
            try:
                client.set(f"junk:{n}", b"j" * size)
            except redis.exceptions.OutOfMemoryError:
                break
            n += 1
    client.config_set("maxmemory", used(client) - 64 * 1024)
    return n


def graveyard_bytes(client: redis.Redis, keys: Keys) -> int:
    """What Redis spends on the graveyard's keys (``MEMORY USAGE``, every field counted)."""
    match = keys.graveyard_prefix + "*"
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in client.scan_iter(match=match))


def runtime_on(server: RedisServer, prefix: str, **conf: Any) -> Runtime:
    app = Celery(f"budget-{prefix}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(dlx_redis_url=server.url, dlx_key_prefix=prefix, **conf)
    return get_runtime(app)


def test_the_counted_bytes_follow_what_redis_spends_on_an_obituary(
    full_redis: RedisServer,
) -> None:
    client = full_redis.client()
    keys = Keys("count")
    yard = Graveyard(client, keys)
    bury(yard, 0, 400)
    real, counted = graveyard_bytes(client, keys) / 400, yard.used_bytes() / 400
    # OBITUARY_OVERHEAD was measured so (record + payload + overhead) tracks MEMORY USAGE.
    assert 0.8 * real <= counted <= 1.25 * real, (real, counted, OBITUARY_OVERHEAD)
    obits = yard.load([f"ob-{i}" for i in range(400)])
    for chunk in range(0, 400, 100):
        for ob in obits[chunk : chunk + 100]:
            assert ob is not None
            yard.remove(ob, ob.fate_event("purged", 1))
    assert yard.used_bytes() == 0  # every removal takes back what its burial counted


def test_no_burial_writes_past_the_budget(full_redis: RedisServer) -> None:
    client = full_redis.client()
    keys = Keys("budget")
    yard = Graveyard(client, keys, budget=Budget(150_000))
    buried = 0
    with pytest.raises(GraveyardFull, match="dlx_graveyard_max_bytes"):
        while buried < 1000:
            bury(yard, buried, 10)
            buried += 10
    assert 0 < yard.count() < buried + 10 and yard.used_bytes() <= 150_000
    before = (yard.count(), used(client))
    with pytest.raises(GraveyardFull):  # refused again, and nothing written by the refusal
        bury(yard, 5000, 10)
    assert yard.count() == before[0]
    # A redelivered dead letter of an obituary already there still reads as "there": no error.
    assert yard.write_many([(obituary(0), buried_event(obituary(0)))]) == [False]


def test_burials_stop_short_of_maxmemory_and_a_purge_frees_what_it_removes_on_a_full_redis(
    full_redis: RedisServer, uid: str
) -> None:
    client = full_redis.client()
    runtime = runtime_on(full_redis, f"full-{uid}")  # dlx_graveyard_max_bytes = 0: half of 16 MB
    yard = runtime.graveyard
    written = 0
    with pytest.raises(GraveyardFull):
        while written < 10_000:
            bury(yard, written, 50)
            written += 50
    limit = runtime.graveyard_budget.limit()
    assert limit == 8 * 1024 * 1024 and yard.used_bytes() <= limit
    assert used(client) < 16 * 1024 * 1024

    # Now something else fills Redis to its maxmemory: writes are refused...
    fill(client)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("one-more", b"x" * 1024)
    # ...but a burial is refused before its first write (no leading DEL lets it through).
    runtime.graveyard_budget.ttl = 0  # read INFO memory again now
    with pytest.raises(GraveyardFull, match="maxmemory"):
        bury(yard, 90_000, 1)
    assert yard.load(["ob-90000"]) == [None]

    count = obituaries.count(runtime)
    spent = graveyard_bytes(client, runtime.keys)
    before = used(client)
    report = purge.purge(runtime, everything=True)
    assert len(report.purged) == count and obituaries.count(runtime) == 0
    freed = before - used(client)
    assert freed >= 0.9 * spent, (freed, spent)
    # The history keeps who, what, why and when of each; not its traceback, headers or payload.
    notes = [json.loads(f["obituary"]) for _, f in runtime.history.read() if f["fate"] == "purged"]
    assert len(notes) == count and {n["id"] for n in notes} == set(report.purged)
    assert not {"payload", "headers", "traceback"} & set(notes[0])
    print(f"purge of {count} obituaries on a full Redis freed {freed / spent:.0%} of their bytes")


def test_the_export_runs_without_its_redis_lock_and_trims_on_a_full_redis(
    full_redis: RedisServer,
) -> None:
    """``dlx export --trim`` is the other way to make room: on a full Redis its lock and its
    checkpoint mirror cannot be written, so it goes on without them (saying so), and its trim
    frees the history's bytes."""
    from celery_dlx_spark import stream as dlx_stream

    client = full_redis.client()
    key = Keys("export").history
    ids = [client.xadd(key, {"fate": "buried", "blob": b"b" * 512}) for _ in range(2000)]
    fill(client)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("one-more", b"x" * 1024)
    with dlx_stream.ExportLock(client, key) as lock:
        assert not lock.held  # not written: Redis refused it
        dlx_stream.mirror_checkpoint(client, key, {"last_id": ids[-1].decode()})
        before = used(client)
        assert dlx_stream.trim(client, key, ids[-1].decode()) == 2000
    assert before - used(client) > 2000 * 512
    client.set("one-more", b"x" * 1024)  # room again
    with dlx_stream.ExportLock(client, key) as lock:
        assert lock.held
