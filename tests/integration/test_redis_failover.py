"""Nothing celery_dlx acknowledged is lost on a Redis failover, and a Redis outage never multiplies
a requeue (issue 24).

Every Redis here is private (a master, a replica and a Sentinel; a master and a replica; a Redis
Cluster of three masters with a replica each), started on free ports in the test's folder and
stopped by PID; a replica "lags" while it is stopped with SIGSTOP. RabbitMQ is the shared one,
with queue names of the test's own, and is not faulted.

The figures of docs/reliability.md ("Redis failover") come from::

    python -m tests.integration.test_redis_failover
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from kombu import Connection, Exchange, Producer, Queue

from celery_dlx.fates import PARKED, FateEvent, now_ms
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.service.loop import DLXService
from celery_dlx.store.client import NotReplicated
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.chaos.servers import RedisServer, SentinelServers, wait_for
from tests.conftest import BROKER_URL
from tests.integration.helpers import queue_depth

#: Replicas start streaming at once (Redis waits 5 s for more replicas to share a diskless sync).
FAST_SYNC = ("--repl-diskless-sync-delay", "0")
#: A parked retry's body: large enough that a stopped replica's socket buffers fill up.
BODY = b'{"order": "' + b"x" * 1000 + b'"}'


def pause(server: RedisServer) -> None:
    """Stop ``server`` (SIGSTOP): it keeps its connections, reads nothing, acknowledges nothing."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)


def resume(server: RedisServer) -> None:
    if server.proc is not None and server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)


def in_sync(server: RedisServer, replicas: int = 1, timeout_ms: int = 20_000) -> None:
    """Wait until ``replicas`` replicas of the master ``server`` hold every write so far."""
    client = server.client()

    def wrote() -> bool:
        try:  # a master with min-replicas-to-write refuses writes until its replica is there
            return bool(client.set("failover-test:probe", str(uuid.uuid4())))
        except redis.ResponseError:
            return False

    try:
        wait_for(wrote, f"a write to port {server.port}", 30)
        assert client.wait(replicas, timeout_ms) >= replicas, "the replica did not catch up"
    finally:
        client.close()


def role_of(port: int) -> str:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=2)
    try:
        return str(client.info("replication")["role"])
    except redis.RedisError:
        return "down"
    finally:
        client.close()


@contextlib.contextmanager
def sentinel_servers(workdir: Path) -> Iterator[SentinelServers]:
    """A master, a replica (in sync) and a Sentinel, with fast replica syncs; killed after."""
    servers = SentinelServers(workdir)
    servers.master.args.extend(FAST_SYNC)
    servers.replica.args.extend(FAST_SYNC)
    try:
        servers.start()
        in_sync(servers.master)
        yield servers
    finally:
        resume(servers.replica)
        servers.kill()


def parked(message_id: str, queue: str) -> ParkedMessage:
    return ParkedMessage(
        message_id=message_id,
        attempt=1,
        queue=queue,
        body=BODY,
        headers={"x-dlx-attempt": 1},
        properties={"content_type": "application/json", "delivery_mode": 2},
        due_ms=now_ms() + 3_600_000,
        task="proj.charge",
        cause="c0ffee",
    )


def parked_event(message: ParkedMessage) -> FateEvent:
    return FateEvent.from_fields(
        fate=PARKED,
        queue=message.queue,
        message_id=message.message_id,
        attempt=message.attempt,
        task=message.task,
        cause=message.cause,
        exc_type="ConnectionError",
        exc_message="upstream down",
        reason="park 1 of 5",
        delay=3600.0,
    )


def dead_letter(producer: Producer, exchange: str, queue: str, message_id: str) -> None:
    """What RabbitMQ dead-letters when a consumer rejects a message of ``queue``."""
    producer.publish(
        BODY,
        exchange=exchange,
        routing_key=queue,
        headers={"x-death": [{"queue": queue, "reason": "rejected", "count": 1}]},
        message_id=message_id,
        content_type="application/json",
        delivery_mode=2,
        retry=True,
    )


def parked_ids(port: int, runtime: Runtime, *, cluster_replica: bool = False) -> Counter[str]:
    """Parked entries by message id, read from the server on ``port`` (not through celery_dlx)."""
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        if cluster_replica:
            client.execute_command("READONLY")  # else a cluster replica answers MOVED
        ids = client.hkeys(runtime.keys.parked_meta)
    finally:
        client.close()
    out: Counter[str] = Counter()
    for raw in ids:
        message_id = raw.decode().rsplit(":", 1)[0]
        out[message_id.split("@", 1)[0]] += 1  # a park under a more specific id: same message
    return out


@dataclass
class FailoverRun:
    """What one run acknowledged, what failed, and what the new master holds."""

    #: Worker-path parks (``Runtime.park_recorded``) that returned: the task's message acked.
    worker_acked: set[str] = field(default_factory=set)
    #: Worker-path parks that raised ``NotReplicated`` (handed to the dead-letter path).
    worker_refused: set[str] = field(default_factory=set)
    #: Dead letters the DLX service had acked when the master died.
    service_acked_before_failover: int = 0
    #: Dead letters published to the DLX service (its own, and the refused worker parks).
    dead_letters: set[str] = field(default_factory=set)
    #: Parked entries on the new master, by message id.
    on_new_master: Counter[str] = field(default_factory=Counter)
    #: Batch retries of the DLX service while the replica lagged.
    service_retries_while_lagging: int = 0
    seconds: float = 0.0

    @property
    def acked(self) -> set[str]:
        """Every park acknowledged (worker parks that returned, dead letters the service acked)."""
        return self.worker_acked | self.dead_letters

    @property
    def lost(self) -> set[str]:
        return {m for m in self.acked if self.on_new_master[m] == 0}

    @property
    def duplicates(self) -> int:
        return sum(n - 1 for n in self.on_new_master.values() if n > 1)


def lagging_replica_failover(
    workdir: Path,
    uid: str,
    broker: Any,
    *,
    min_replicas: int | None,
    healthy: int,
    lagging: int,
    service: int,
) -> FailoverRun:
    """Park ``healthy`` messages through the worker path, stop the replica, park ``lagging``
    more and hand ``service`` dead letters to a DLX service, then kill the master, let Sentinel
    promote the lagging replica, give the new master a replica (the old master, restarted) and
    count what the new master holds.

    A worker park that fails is handed to the dead-letter path, as the worker does (the DLX
    service parks it later). The DLX service runs throughout, and is stopped once every dead
    letter it was given is acked.
    """
    run = FailoverRun()
    started = time.monotonic()
    park_queue, dead, dlx = f"park-{uid}", f"dead-{uid}", f"dlx-{uid}"
    with sentinel_servers(workdir) as servers, contextlib.ExitStack() as stack:
        app = Celery(f"failover-{uid}", broker=BROKER_URL, set_as_current=False)
        app.conf.update(
            dlx_redis_url=servers.url(),
            dlx_redis_replica_timeout=0.2,
            dlx_key_prefix=f"test-{uid}",
            dlx_exchange=dlx,
            dlx_service_queue=dead,
            dlx_queues={park_queue: {"max_requeues": 0, "backoff": [3600]}},
        )
        if min_replicas is not None:  # else the default of a sentinel:// URL: 1
            app.conf.update(dlx_redis_min_replicas=min_replicas)
        runtime = get_runtime(app)
        channel = broker.channel()
        stack.callback(channel.close)
        Queue(dead, exchange=Exchange(dlx, type="topic"), routing_key="#")(channel).declare()
        stack.callback(lambda: (channel.queue_delete(dead), channel.exchange_delete(dlx)))
        producer = Producer(channel)

        def park_as_a_worker(message_id: str) -> None:
            message = parked(message_id, park_queue)
            try:
                runtime.park_recorded(message, parked_event(message))
            except NotReplicated:
                run.worker_refused.add(message_id)  # the worker rejects it: a dead letter
                run.dead_letters.add(message_id)
                dead_letter(producer, dlx, park_queue, message_id)
            else:
                run.worker_acked.add(message_id)

        for i in range(healthy):
            park_as_a_worker(f"w-{i}")

        svc = DLXService(app, prefetch=300)
        thread = threading.Thread(target=svc.run, daemon=True)
        thread.start()
        stack.callback(thread.join, 30)
        stack.callback(svc.stop)

        pause(servers.replica)
        for i in range(service):
            run.dead_letters.add(f"s-{i}")
            dead_letter(producer, dlx, park_queue, f"s-{i}")
        for i in range(healthy, healthy + lagging):
            park_as_a_worker(f"w-{i}")
        if service:
            wait_for(
                lambda: svc.stats.retries >= 3 or svc.stats.parked >= service,
                "the DLX service to try its batches",
                30,
            )
        run.service_acked_before_failover = svc.stats.parked
        run.service_retries_while_lagging = svc.stats.retries

        # The master dies with writes its replica never received; Sentinel promotes the replica.
        servers.master.kill()
        resume(servers.replica)
        new = servers.replica.port
        wait_for(lambda: servers.master_port() == new, "Sentinel to promote the replica", 30)
        wait_for(lambda: role_of(new) == "master", "the replica to take over", 30)
        # The old master comes back as the new master's replica (its AOF is replaced by a sync).
        servers.master.start()
        old = servers.master.client()
        try:
            old.replicaof("127.0.0.1", str(new))
        finally:
            old.close()
        in_sync(servers.replica)

        wait_for(
            lambda: svc.stats.parked + svc.stats.duplicates >= len(run.dead_letters),
            "the DLX service to park every dead letter",
            30,
        )
        svc.stop()
        thread.join(30)
        assert not thread.is_alive()
        assert queue_depth(channel, dead) == 0, "dead letters left unacked"
        run.on_new_master = parked_ids(new, runtime)
        runtime.reset_publisher()
    run.seconds = time.monotonic() - started
    return run


def test_no_acknowledged_park_is_lost_when_the_master_dies_with_a_lagging_replica(
    tmp_path: Path, uid: str, broker: Any
) -> None:
    run = lagging_replica_failover(
        tmp_path, uid, broker, min_replicas=None, healthy=200, lagging=15, service=60
    )
    # While the replica lagged, nothing was acknowledged: every park failed.
    assert len(run.worker_acked) == 200 and run.worker_refused == {
        f"w-{i}" for i in range(200, 215)
    }
    assert run.service_acked_before_failover == 0 and run.service_retries_while_lagging >= 3
    # After the failover: every acknowledged park is on the new master, and nothing else is lost.
    assert run.lost == set()
    assert (
        set(run.on_new_master)
        == run.acked
        == {f"w-{i}" for i in range(215)} | {f"s-{i}" for i in range(60)}
    )
    assert run.duplicates <= len(run.worker_refused)  # a refused worker park the master kept
    assert run.seconds < 60


@contextlib.contextmanager
def master_with_replica(workdir: Path, *args: str) -> Iterator[tuple[RedisServer, RedisServer]]:
    """A master (``args`` added) and one replica in sync; killed after."""
    master = RedisServer(workdir / "master", args=[*FAST_SYNC, *args])
    replica = RedisServer(
        workdir / "replica", args=["--replicaof", "127.0.0.1", str(master.port), *FAST_SYNC]
    )
    try:
        master.start()
        replica.start()
        in_sync(master)
        yield master, replica
    finally:
        resume(replica)
        replica.kill()
        master.kill()


def refuses_writes(server: RedisServer) -> bool:
    client = server.client()
    try:
        client.set("failover-test:probe", "1")
    except redis.ResponseError as exc:
        return "NOREPLICAS" in str(exc)
    finally:
        client.close()
    return False


def requeues_while_redis_refuses_writes(
    workdir: Path, uid: str, broker: Any, *, messages: int, retries: int
) -> Counter[str]:
    """Copies of each requeued dead letter published while the DLX service's Redis refused
    writes (``min-replicas-to-write 1``, its replica stopped) for ``retries`` batch retries."""
    work, dead, dlx = f"work-{uid}", f"dead-{uid}", f"dlx-{uid}"
    lag = ("--min-replicas-to-write", "1", "--min-replicas-max-lag", "1")
    with master_with_replica(workdir, *lag) as (master, replica), contextlib.ExitStack() as stack:
        app = Celery(f"refusing-{uid}", broker=BROKER_URL, set_as_current=False)
        app.conf.update(
            dlx_redis_url=master.url,  # one node: dlx_redis_min_replicas defaults to 0
            dlx_key_prefix=f"test-{uid}",
            dlx_exchange=dlx,
            dlx_service_queue=dead,
            dlx_queues={work: {"max_requeues": 3, "max_parks": 0}},
        )
        channel = broker.channel()
        stack.callback(channel.close)
        Queue(work, durable=True)(channel).declare()
        Queue(dead, exchange=Exchange(dlx, type="topic"), routing_key="#")(channel).declare()
        stack.callback(
            lambda: (
                channel.queue_delete(work),
                channel.queue_delete(dead),
                channel.exchange_delete(dlx),
            )
        )
        pause(replica)
        wait_for(lambda: refuses_writes(master), "the master to refuse writes", 30)
        producer = Producer(channel)
        for i in range(messages):
            dead_letter(producer, dlx, work, f"r-{i}")
        svc = DLXService(app)
        thread = threading.Thread(target=svc.run, daemon=True)
        thread.start()
        stack.callback(thread.join, 30)
        stack.callback(svc.stop)
        wait_for(lambda: svc.stats.retries >= retries, f"{retries} batch retries", 30)
        assert svc.stats.requeued == 0  # nothing settled while Redis refused writes
        resume(replica)
        wait_for(lambda: svc.stats.requeued == messages, "the requeues to settle", 30)
        svc.stop()
        thread.join(30)
        copies: Counter[str] = Counter()
        while (msg := channel.basic_get(work, no_ack=True)) is not None:
            copies[msg.properties["message_id"]] += 1
        get_runtime(app).reset_publisher()
        return copies


def test_a_redis_refusing_writes_never_multiplies_a_requeue(
    tmp_path: Path, uid: str, broker: Any
) -> None:
    copies = requeues_while_redis_refuses_writes(tmp_path, uid, broker, messages=4, retries=4)
    assert copies == {f"r-{i}": 1 for i in range(4)}


@contextlib.contextmanager
def cluster_with_replicas(workdir: Path) -> Iterator[list[RedisServer]]:
    """Three masters with one replica each (``--cluster-replicas 1``), every replica in sync."""
    nodes = [
        RedisServer(
            workdir / f"node{i}",
            with_bus=True,
            args=["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf", *FAST_SYNC],
        )
        for i in range(6)
    ]
    try:
        for node in nodes:
            node.start()
        addresses = [f"127.0.0.1:{node.port}" for node in nodes]
        create = ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "1"]
        subprocess.run(
            [*create, "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=60,
        )

        def ready() -> bool:
            linked = 0
            for node in nodes:
                client = node.client()
                try:
                    info = client.info("replication")
                    state = client.execute_command("CLUSTER", "INFO")
                    table = client.execute_command("CLUSTER", "NODES")
                finally:
                    client.close()
                text = state.decode() if isinstance(state, bytes) else str(state)
                rows = (table.decode() if isinstance(table, bytes) else str(table)).splitlines()
                replicas = sum("slave" in row.split(" ")[2].split(",") for row in rows)
                if "cluster_state:ok" not in text or replicas != 3:
                    return False
                linked += info.get("master_link_status") == "up"
            return linked == 3

        wait_for(ready, "the cluster and its replicas", 60)
        yield nodes
    finally:
        for node in nodes:
            resume(node)
            node.kill()


def replica_of(nodes: list[RedisServer], master_port: int) -> RedisServer:
    for node in nodes:
        client = node.client()
        try:
            info = client.info("replication")
        finally:
            client.close()
        if info["role"] == "slave" and int(info["master_port"]) == master_port:
            return node
    raise LookupError(f"no replica of port {master_port}")


def test_on_a_redis_cluster_a_park_waits_for_the_replica_of_the_master_owning_its_keys(
    tmp_path: Path, uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    park_queue, dead, dlx = f"park-{uid}", f"dead-{uid}", f"dlx-{uid}"
    cleanup_queues.extend([dead, f"exchange:{dlx}"])
    with cluster_with_replicas(tmp_path) as nodes:
        app = Celery(f"cluster-{uid}", broker=BROKER_URL, set_as_current=False)
        app.conf.update(
            dlx_redis_url=f"redis://127.0.0.1:{nodes[0].port}/0?cluster=true",
            dlx_redis_replica_timeout=0.2,  # dlx_redis_min_replicas: the default, 1 per master
            dlx_redis_shards="none",  # the single-tag layout (per queue: test_redis_cluster_shard*)
            dlx_key_prefix=f"test-{uid}",
            dlx_exchange=dlx,
            dlx_service_queue=dead,
            dlx_queues={park_queue: {"max_requeues": 0, "backoff": [3600]}},
        )
        runtime = get_runtime(app)
        owner = int(runtime.redis.get_node_from_key(runtime.keys.parked_due).port)  # type: ignore[union-attr]
        own_replica = replica_of(nodes, owner)
        other_replicas = [
            node for node in nodes if node is not own_replica and role_of(node.port) == "slave"
        ]
        assert len(other_replicas) == 2

        # The replicas of the other masters lag: a park still counts. (redis-py's cluster client
        # sends WAIT to its default node, one primary picked at start, whoever holds the key.)
        for node in other_replicas:
            pause(node)
        message = parked("c-1", park_queue)
        runtime.park_recorded(message, parked_event(message))
        for node in other_replicas:
            resume(node)

        # The replica of the master owning the keys lags: a park fails, on both paths.
        pause(own_replica)
        message = parked("c-2", park_queue)
        try:
            runtime.park_recorded(message, parked_event(message))
            raise AssertionError("a park the owning master's replica does not hold counted")
        except NotReplicated as exc:
            assert "dlx_redis_min_replicas" in str(exc)
        channel = broker.channel()
        Queue(dead, exchange=Exchange(dlx, type="topic"), routing_key="#")(channel).declare()
        producer = Producer(channel)
        for i in range(10):
            dead_letter(producer, dlx, park_queue, f"cs-{i}")
        svc = DLXService(app)
        thread = threading.Thread(target=svc.run, daemon=True)
        thread.start()
        try:
            wait_for(lambda: svc.stats.retries >= 2, "the DLX service to retry", 30)
            assert svc.stats.parked == 0
            resume(own_replica)
            wait_for(lambda: svc.stats.parked == 10, "the parks", 30)
        finally:
            svc.stop()
            thread.join(30)
        assert queue_depth(channel, dead) == 0
        channel.close()
        runtime.reset_publisher()
        on_owner = parked_ids(owner, runtime)
        assert set(on_owner) == {"c-1", "c-2"} | {f"cs-{i}" for i in range(10)}
        assert parked_ids(own_replica.port, runtime, cluster_replica=True) == on_owner


if __name__ == "__main__":  # the figures of docs/reliability.md
    import tempfile

    with Connection(BROKER_URL) as conn:
        for setting, during in ((0, 4000), (None, 400)):
            figures = lagging_replica_failover(
                Path(tempfile.mkdtemp(prefix="dlx-failover-")),
                uuid.uuid4().hex[:10],
                conn,
                min_replicas=setting,
                healthy=0,
                lagging=during,
                service=2000,
            )
            print(
                f"dlx_redis_min_replicas={setting}: worker parks acked {len(figures.worker_acked)}"
                f", refused {len(figures.worker_refused)}; service dead letters acked before the "
                f"failover {figures.service_acked_before_failover} (batch retries "
                f"{figures.service_retries_while_lagging}); acknowledged {len(figures.acked)}, "
                f"lost {len(figures.lost)}, duplicates {figures.duplicates}, "
                f"{figures.seconds:.0f} s"
            )
        copies = requeues_while_redis_refuses_writes(
            Path(tempfile.mkdtemp(prefix="dlx-refusing-")),
            uuid.uuid4().hex[:10],
            conn,
            messages=4,
            retries=4,
        )
        print(f"requeued copies per message while Redis refused writes: {dict(copies)}")
