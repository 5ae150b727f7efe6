"""The graveyard sharded by queue on a real 3-master Redis Cluster (issue 24, item 1).

:class:`~celery_dlx.store.graveyard.Graveyard` sharded by queue (what ``dlx_redis_shards = "queue"``
or ``"auto"`` on a cluster URL selects) is measured against the single-tag one: the same
obituaries go to a single-tag graveyard (one app prefix) and to a sharded one (another): the
bytes per master are measured (``MEMORY USAGE`` of every key of each prefix), and every read of
the sharded graveyard is checked against the single-tag one's answer for the same data.

The cluster is private to this module, so the prefixes and queue names are fixed (where a
bucket lands depends on its tag's CRC16; fixed names keep the measure repeatable).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Exchange, Producer, Queue

from celery_dlx.fates import PURGED
from celery_dlx.message.obituary import Attempt, Obituary
from celery_dlx.ops import obituaries as reading
from celery_dlx.service.loop import DLXService
from celery_dlx.service.settle import buried_event
from celery_dlx.store.client import NotReplicated
from celery_dlx.store.graveyard import Filters, Graveyard
from celery_dlx.store.migrate import migrate_graveyard as migrate
from celery_dlx.wiring.runtime import Runtime, get_runtime
from celery_dlx_console import reads
from celery_dlx_console.metrics import DLXCollector
from tests.chaos.servers import RedisClusterServers, redis_cluster
from tests.conftest import BROKER_URL
from tests.integration.cli_helpers import run, run_json

QUEUES = [f"orders-{i}" for i in range(6)]
PER_QUEUE = 40
PAYLOAD = b"x" * 1024
T0 = 1_700_000_000_000


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with redis_cluster(tmp_path_factory.mktemp("graves")) as servers:
        yield servers


def runtime_on(cluster: RedisClusterServers, prefix: str, **conf: Any) -> Runtime:
    app = Celery(f"graves-{prefix}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(dlx_redis_url=cluster.url, dlx_key_prefix=prefix, **conf)
    return get_runtime(app)


def obituaries(queues: list[str], per_queue: int = PER_QUEUE) -> list[Obituary]:
    """Per queue, ``per_queue`` obituaries of two tasks, interleaved in time over the queues;
    the causes are scoped by task, so each cause has obituaries in every queue."""
    out = []
    for n in range(per_queue):
        for q, queue in enumerate(queues):
            at = T0 + n * len(queues) + q
            task = f"proj.task{n % 2}"
            cause = f"cause-{n % 2}"
            out.append(
                Obituary.from_fields(
                    id=f"ob-{queue}-{n}",
                    message_id=f"m-{queue}-{n}",
                    queue=queue,
                    reason="retry budget spent",
                    buried_ms=at,
                    task=task,
                    cause=cause,
                    exc_type="ValueError",
                    exc_message=f"bad value {n}",
                    attempt=3,
                    attempts=[Attempt(at, "buried", cause)],
                    first_failure_ms=at,
                    last_failure_ms=at,
                    headers={},
                    properties={"content_type": "application/octet-stream"},
                    payload=PAYLOAD,
                    payload_size=len(PAYLOAD),
                    code_version="v2" if n >= per_queue // 2 else "v1",
                )
            )
    return out


def bury(yard: Graveyard, obits: list[Obituary]) -> list[bool]:
    return yard.write_many([(ob, buried_event(ob)) for ob in obits])


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


def history_kinds(rt: Runtime) -> list[str]:
    entries = rt.redis.xrange(rt.keys.history)
    return [fields[b"fate"].decode() for _, fields in entries]


def same_reads(one: Graveyard, many: Graveyard) -> None:
    """Every read of the sharded graveyard answers as the single-tag one does."""
    assert many.count() == one.count()
    for filters in (
        Filters(),
        Filters(task="proj.task1"),
        Filters(cause="cause-0"),
        Filters(queue=QUEUES[2]),
        Filters(queue=QUEUES[3], task="proj.task0"),
        Filters(since_ms=T0 + 50, until_ms=T0 + 120),
    ):
        for limit in (7, None):
            assert many.ids(filters, limit=limit) == one.ids(filters, limit=limit), filters
        assert many.ids(filters, limit=None, oldest_first=True) == one.ids(
            filters, limit=None, oldest_first=True
        )
    assert many.groups() == one.groups()
    assert many.groups_of(["cause-1", "nope", "cause-0"]) == one.groups_of(
        ["cause-1", "nope", "cause-0"]
    )
    assert many.top_causes(1) == one.top_causes(1)
    assert many.version_times() == one.version_times()
    for kind in ("queue", "task"):
        assert sorted(many.names(kind)) == sorted(one.names(kind))
    assert many.older_than(T0 + 30, 10) == one.older_than(T0 + 30, 10)
    ids = [*one.ids(Filters(), limit=25), "missing"]
    assert many.load(ids, with_payload=True) == one.load(ids, with_payload=True)


def test_burials_of_six_queues_spread_over_three_masters_and_read_as_one(
    cluster: RedisClusterServers,
) -> None:
    single_rt, sharded_rt = (
        runtime_on(cluster, "gy-one", dlx_redis_shards="none"),
        runtime_on(cluster, "gy-many"),
    )
    one = Graveyard(single_rt.redis, single_rt.keys)
    many = Graveyard(sharded_rt.redis, sharded_rt.keys, per_queue=True)
    obits = obituaries(QUEUES)
    assert all(bury(one, obits)) and all(bury(many, obits))
    assert not any(bury(many, obits[:5]))  # a redelivered dead letter writes nothing
    assert many.queues() == sorted(QUEUES)
    single = bytes_per_master(cluster, "gy-one")
    spread = bytes_per_master(cluster, "gy-many")
    print(
        f"\ngraveyard bytes per master, single tag: {single} ({share(single):.1%} on the largest)"
    )
    print(f"graveyard bytes per master, per queue: {spread} ({share(spread):.1%} on the largest)")
    assert share(single) > 0.99
    assert share(spread) <= 0.5, spread
    assert min(spread.values()) > 0
    assert history_kinds(sharded_rt).count("buried") == len(obits)

    same_reads(one, many)
    group = many.groups_of(["cause-0"])[0]
    assert group.count == len(QUEUES) * PER_QUEUE // 2
    assert group.versions == {"v1": group.count // 2, "v2": group.count // 2}

    # replay ledger and purge, across shards
    chosen = [o.id for o in obits[:: len(QUEUES) + 1][:6]]
    many.add_replays([(oid, 5) for oid in chosen], to_queue="elsewhere")
    assert many.redirects(chosen) == [{5: "elsewhere"}] * len(chosen)
    assert [ob.replays for ob in many.load(chosen) if ob] == [[5]] * len(chosen)
    for ob in many.load(chosen):
        assert ob is not None
        assert many.remove(ob, ob.fate_event(PURGED, T0))
        assert not many.remove(ob, ob.fate_event(PURGED, T0))
    for ob in one.load(chosen):
        assert ob is not None and one.remove(ob, ob.fate_event(PURGED, T0))
    assert many.load(chosen) == [None] * len(chosen)
    assert many.redirects(chosen) == [{}] * len(chosen)
    assert history_kinds(sharded_rt).count("purged") == len(chosen)
    same_reads(one, many)


def test_migration_copies_then_deletes_each_obituary_and_reads_both_meanwhile(
    cluster: RedisClusterServers,
) -> None:
    rt = runtime_on(cluster, "gy-mig", dlx_redis_shards="none")
    old = Graveyard(rt.redis, rt.keys)
    queues = QUEUES[:3]
    obits = obituaries(queues, per_queue=10)
    assert all(bury(old, obits))
    old.add_replays([(obits[0].id, 7)])
    oracle = runtime_on(cluster, "gy-mig-oracle", dlx_redis_shards="none")
    expected = Graveyard(oracle.redis, oracle.keys)
    bury(expected, obits)
    expected.add_replays([(obits[0].id, 7)])

    many = Graveyard(rt.redis, rt.keys, per_queue=True)
    assert many.count() == len(obits)  # read-both: the old keys are read before the move
    same_reads(expected, many)
    dry = migrate(many, dry_run=True)
    assert (dry.found, dry.copied, dry.moved) == (len(obits), 0, 0)
    assert dry.queues == dict.fromkeys(queues, 10)
    assert old.count() == len(obits)

    # an interrupted run: some obituaries copied, their originals still there
    for ob in obits[:4]:
        many.shards.add_queues([ob.queue])
        raw = rt.redis.hget(old.shards.home.records, ob.id)
        assert many.shard(ob.queue, ob.id).copy_in(ob, raw, PAYLOAD, None)
    moved = migrate(many, batch=7)
    assert (moved.found, moved.copied, moved.present, moved.moved, moved.left) == (
        len(obits),
        len(obits) - 4,
        4,
        len(obits),
        0,
    )
    assert old.count() == 0 and many.count() == len(obits)
    left = {k.decode() for k in rt.redis.scan_iter(match="{gy-mig}:graveyard:*")}
    # the index of queues, and when each version was first seen (kept, as a purge keeps it)
    assert left == {"{gy-mig}:graveyard:shards", "{gy-mig}:graveyard:versions"}
    assert many.load([obits[0].id])[0].replays == [7]  # type: ignore[union-attr]
    assert "purged" not in history_kinds(rt)
    assert migrate(many).found == 0
    for a, b in zip(many.groups(), expected.groups(), strict=True):
        assert a.count == b.count and a.versions == b.versions and a.first_ms == b.first_ms
        assert a.total == a.count  # the lifetime total restarts at the obituaries moved


def test_cli_console_replay_and_purge_read_every_shard(
    cluster: RedisClusterServers, uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    rt = runtime_on(cluster, f"gy-cli-{uid}", dlx_redis_shards="auto")
    assert rt.graveyard.shards.layout.per_queue
    queues = [f"cli{i}-{uid}" for i in range(6)]
    obits = obituaries(queues, per_queue=6)
    assert all(bury(rt.graveyard, obits))
    newest = sorted(obits, key=lambda o: -o.buried_ms)

    listed = run_json(rt.app, "list", "-n", "10")
    assert [r["id"] for r in listed["obituaries"]] == [o.id for o in newest[:10]]
    assert listed["total"] == len(obits)
    by_task = run_json(rt.app, "list", "--task", "proj.task1", "-n", "1000")["obituaries"]
    assert [r["id"] for r in by_task] == [o.id for o in newest if o.task == "proj.task1"]
    groups = run_json(rt.app, "groups")["groups"]
    assert sorted((g["cause"], g["count"]) for g in groups) == [("cause-0", 18), ("cause-1", 18)]
    shown = run(rt.app, "show", obits[7].id)
    assert shown.exit_code == 0 and obits[7].id in shown.stdout
    stats = run_json(rt.app, "stats")["graveyard"]
    assert stats["count"] == len(obits) and stats["oldest_ms"] == T0
    assert sorted(q["queue"] for q in stats["queues"]) == sorted(queues)

    page = reads.causes_page(rt, limit=1)
    assert page["causes"] == 2 and page["total"] == len(obits) and page["count"] == 1
    cause0 = reads.group_page(rt, "cause-0", reads.GroupFilters(), limit=5)
    expected = [o.id for o in newest if o.cause == "cause-0"]
    assert [r["id"] for r in cause0.rows] == expected[:5] and cause0.matching == 18
    later = reads.group_page(rt, "cause-0", reads.GroupFilters(), offset=5, limit=50)
    assert [r["id"] for r in later.rows] == expected[5:] and later.next_offset is None
    one_queue = reads.group_page(rt, "cause-0", reads.GroupFilters(queue=queues[3]), limit=50)
    assert [r["id"] for r in one_queue.rows] == [i for i in expected if queues[3] in i]
    families = {f.name: f for f in DLXCollector(rt).collect()}
    per_queue = {
        s.labels["queue"]: s.value for s in families["celery_dlx_graveyard_obituaries"].samples
    }
    assert per_queue == dict.fromkeys(queues, 6)
    per_cause = families["celery_dlx_graveyard_cause_obituaries"].samples
    assert sorted((s.labels["cause"], s.value) for s in per_cause) == [
        ("cause-0", 18),
        ("cause-1", 18),
    ]

    target = f"replayed-{uid}"
    channel = broker.channel()
    channel.queue_declare(target, durable=True, auto_delete=False)
    cleanup_queues.append(target)
    chosen = [obits[1].id, obits[8].id, obits[15].id]
    replayed = run_json(rt.app, "replay", *chosen, "--to-queue", target)
    assert sorted(replayed["replayed"]) == sorted(chosen)
    assert channel.queue_declare(target, passive=True).message_count == 3
    assert all(rt.graveyard.redirects(chosen))

    purged = run_json(rt.app, "purge", "-y", "--cause", "cause-1")
    assert len(purged["purged"]) == 18
    assert run_json(rt.app, "list", "-n", "1000")["total"] == 18
    assert [g["cause"] for g in run_json(rt.app, "groups")["groups"]] == ["cause-0"]
    assert history_kinds(rt).count("purged") == 18


def test_migrate_keys_moves_old_layout_obituaries(cluster: RedisClusterServers, uid: str) -> None:
    prefix = f"gy-keys-{uid}"
    old = runtime_on(cluster, prefix, dlx_redis_shards="none")
    obits = obituaries(QUEUES[:2], per_queue=5)
    assert all(bury(old.graveyard, obits))
    rt = runtime_on(cluster, prefix, dlx_redis_shards="queue")
    assert run_json(rt.app, "list")["total"] == 10  # read-both before the move
    dry = run_json(rt.app, "migrate-keys", "--dry-run")
    assert dry["found"] == 0 and dry["graveyard"]["found"] == 10
    assert dry["graveyard"]["queues"] == dict.fromkeys(QUEUES[:2], 5)
    moved = run_json(rt.app, "migrate-keys")["graveyard"]
    assert (moved["moved"], moved["left"], moved["gone"]) == (10, 0, 0)
    assert old.graveyard.count() == 0 and rt.graveyard.count() == 10
    assert run_json(rt.app, "migrate-keys")["graveyard"]["found"] == 0


def test_a_burial_waits_for_the_replicas_of_its_own_master(
    cluster: RedisClusterServers, uid: str
) -> None:
    # The test cluster has no replicas: a burial that wants one is written, then refused.
    rt = runtime_on(
        cluster,
        f"gy-wait-{uid}",
        dlx_redis_shards="auto",
        dlx_redis_min_replicas=1,
        dlx_redis_replica_timeout=0.1,
    )
    yard = rt.graveyard
    assert yard.shards.layout.per_queue
    ob = obituaries(QUEUES[:1], per_queue=1)[0]
    with pytest.raises(NotReplicated, match="graveyard queue"):
        bury(yard, [ob])
    assert yard.count() == 0 and yard.queues() == [ob.queue]  # the index first, unconfirmed
    yard.shards._indexed.add(ob.queue)  # as if its replicas had confirmed the index
    with pytest.raises(NotReplicated, match="obituaries of"):
        bury(yard, [ob])
    assert yard.count() == 1  # stored on its bucket's master, just not confirmed
    # its history entry is written all the same: the retry finds the obituary and writes none
    assert history_kinds(rt) == ["buried"]
    assert bury(runtime_on(cluster, f"gy-wait-{uid}", dlx_redis_shards="auto").graveyard, [ob]) == [
        False
    ]


def test_the_dlx_service_buries_dead_letters_of_six_queues_into_their_shards(
    cluster: RedisClusterServers, uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    queues = [f"svc{i}-{uid}" for i in range(6)]
    dead_name, dlx = f"dead-{uid}", f"dlx-{uid}"
    cleanup_queues.extend([dead_name, f"exchange:{dlx}"])
    rt = runtime_on(
        cluster,
        f"gy-svc-{uid}",
        dlx_redis_shards="auto",
        dlx_exchange=dlx,
        dlx_service_queue=dead_name,
        dlx_queues={q: {"max_parks": 0, "max_requeues": 0} for q in queues},
    )
    channel = broker.channel()
    dead = Queue(dead_name, exchange=Exchange(dlx, type="topic"), routing_key="#")
    dead(channel).declare()
    producer = Producer(channel)
    n = 20
    for queue in queues:
        for i in range(n):
            producer.publish(
                f'{{"i": {i}}}'.encode(),
                exchange=dlx,
                routing_key=queue,
                headers={"x-death": [{"queue": queue, "reason": "rejected", "count": 1}]},
                message_id=f"{queue}-{i}",
                retry=True,
            )
    svc = DLXService(rt.app, prefetch=60)
    thread = threading.Thread(target=svc.run, kwargs={"idle_timeout": 1.0}, daemon=True)
    thread.start()
    thread.join(120)
    finished = not thread.is_alive()
    svc.stop()
    thread.join(30)
    assert finished, f"the service did not finish: {svc.stats}"
    assert svc.stats.buried == n * len(queues) and svc.stats.outages == 0

    yard = rt.graveyard
    assert yard.shards.layout.per_queue and yard.queues() == sorted(queues)
    assert yard.shards.home.count() == 0 and yard.count() == n * len(queues)
    assert sorted((q, c) for q, c, _ in yard.names("queue")) == [(q, n) for q in sorted(queues)]
    assert history_kinds(rt).count("buried") == n * len(queues)
    found = reading.get_obituary(rt, f"{queues[4]}-7")  # by message id, over every shard
    assert found is not None and found.payload == b'{"i": 7}'
    assert len(run_json(rt.app, "list", "-n", "1000")["obituaries"]) == n * len(queues)
    assert dead(channel).get() is None
