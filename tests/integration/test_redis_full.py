"""A permanent failure runs once, whatever Redis does; a redelivered original whose park exists is
recognised (issue 36, DESIGN guarantee 10).

Real RabbitMQ; celery_dlx's Redis a private server with a small ``maxmemory`` and ``noeviction``,
filled first, so it refuses every write; the worker and the DLX service are processes of their
own; an independent ledger (the shared Redis) counts every run.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis
from kombu import Exchange, Queue

from celery_dlx.message.headers import DLXState, state_headers
from celery_dlx.store.graveyard import Filters
from celery_dlx.wiring.runtime import get_runtime
from tests.chaos.servers import own_redis
from tests.chaos.storm import (
    dlx_check,
    fill,
    ledger,
    make_room,
    refuses_writes,
    small_redis,
    start_service,
    start_worker,
    wait_for,
)
from tests.chaos.storm_app import Names, make_storm_app
from tests.integration.helpers import queue_depth

POISON = 12
FLAKY = 4


def _ready(worker: Any) -> bool:
    assert worker.alive, worker.text()[-3000:]
    return " ready." in worker.text()


def test_a_bury_on_task_runs_once_and_waits_buried_while_redis_refuses_writes(
    uid: str, tmp_path: Path, redis_client: Any, broker: Any
) -> None:
    names = Names(uid)
    with small_redis(tmp_path / "redis", maxmemory_mb=64) as server:
        client = server.client()
        worker = start_worker(names, server.url, tmp_path / "worker.log")
        service = None
        try:
            wait_for(lambda: _ready(worker), "the worker", 60)
            filled = fill(client)
            assert filled > 0 and refuses_writes(client)
            app = make_storm_app(uid, server.url)
            for i in range(POISON):
                app.send_task("storm.poison", (f"p{i}", "x" * 1024), task_id=f"p{i}-{uid}")
            for i in range(FLAKY):
                app.send_task("storm.flaky", (f"f{i}",), task_id=f"f{i}-{uid}")
            channel = broker.channel()
            # Each burial and each refused park went to the DLX service queue as a copy naming
            # its fate; the originals were acked, none rejected into the dead-letter exchange.
            wait_for(
                lambda: queue_depth(channel, names.service) == POISON + FLAKY,
                "the copies in the DLX service queue",
                60,
            )
            assert queue_depth(channel, names.work) == 0
            rc, report = dlx_check(names, server.url)
            assert rc == 7, report  # stalled: Redis refuses writes
            assert [p["kind"] for p in report["problems"]] == ["redis-full"], report
            assert report["redis"]["writable"] is False
            assert report["backlog"]["messages"] == POISON + FLAKY

            # The service holds them unacked while Redis refuses its writes: nothing runs again.
            service = start_service(names, server.url, tmp_path / "service.log")
            wait_for(
                lambda: "unavailable" in service.text(), "the service to meet the full Redis", 60
            )
            runs = ledger(redis_client, names)
            assert {k: v["runs"] for k, v in runs.items()} == {
                **{f"p{i}": 1.0 for i in range(POISON)},
                **{f"f{i}": 1.0 for i in range(FLAKY)},
            }
            graveyard = get_runtime(app).graveyard
            assert graveyard.count() == 0

            # Room again: every poison message is buried, every flaky one done, none ran twice.
            assert make_room(client) == filled
            wait_for(lambda: graveyard.count() == POISON, "the burials", 60)
            wait_for(
                lambda: len(redis_client.hgetall(names.done_at)) == FLAKY, "the flaky tasks", 60
            )
            runs = ledger(redis_client, names)
            assert {k: v["runs"] for k, v in runs.items() if k.startswith("p")} == {
                f"p{i}": 1.0 for i in range(POISON)
            }
            assert {k: v["runs"] for k, v in runs.items() if k.startswith("f")} == {
                f"f{i}": 2.0 for i in range(FLAKY)
            }
            wait_for(lambda: queue_depth(channel, names.service) == 0, "an empty service queue", 30)
            ids = graveyard.ids(Filters(), limit=100)
            obituaries = [o for o in graveyard.load(ids) if o is not None]
            assert sorted(o.message_id for o in obituaries) == sorted(
                f"p{i}-{uid}" for i in range(POISON)
            )
            assert all("ValueError" in (o.exc_type or "") for o in obituaries)
            rc, report = dlx_check(names, server.url)
            assert rc == 0, report
            assert report["refused"] == {"parked": FLAKY}, report
        finally:
            worker.stop()
            if service is not None:
                service.stop()
            client.close()
    text = worker.text()
    # One line per outage, cause and process (two pool processes), not one per message; no
    # traceback for any of it.
    stash_lines = text.count("cause records of burials (stashed for the DLX service) failing")
    assert 1 <= stash_lines <= 2, text[-5000:]
    assert text.count("parked copies failing") == 1, text[-5000:]
    assert "Traceback" not in text, text[-5000:]


def test_a_redelivered_original_whose_park_exists_gets_no_second_lineage(
    uid: str, tmp_path: Path, redis_client: Any, broker: Any
) -> None:
    """The worker dies between its park and its ack (the ``worker.parked`` crash point, as when
    RabbitMQ stops there): the broker redelivers the original, the next worker finds the park of
    that message and attempt and acks it; the parked copy is the only retry."""
    names = Names(uid)
    with small_redis(tmp_path / "redis", maxmemory_mb=64) as server:
        first = start_worker(
            names,
            server.url,
            tmp_path / "first.log",
            concurrency=1,
            DLX_FAULT="worker.parked@1",
            DLX_FAULT_LOG=str(tmp_path / "faults.log"),
        )
        second = None
        try:
            wait_for(lambda: _ready(first), "the first worker", 60)
            app = make_storm_app(uid, server.url)
            app.send_task("storm.flaky", ("f0",), task_id=f"f0-{uid}")
            wait_for(lambda: not first.alive, "the crash after the park", 60)
            assert (tmp_path / "faults.log").read_text().startswith("worker.parked")
            runtime = get_runtime(app)
            (entry,) = runtime.parking.peek()
            assert entry.entry_id == f"f0-{uid}:1"
            second = start_worker(names, server.url, tmp_path / "second.log", concurrency=1)
            wait_for(
                lambda: redis_client.hget(names.done_at, "f0") is not None,
                "the retry's success",
                60,
            )
            wait_for(lambda: runtime.parking.count() == 0, "the park drained", 30)
        finally:
            first.stop()
            if second is not None:
                second.stop()
        # Two runs: the failure and the parked copy's success, and no copy left over (a second
        # retry would have run a third time, or be back in the queue after the warm shutdown).
        runs = ledger(redis_client, names)["f0"]["runs"]
        assert (runs, queue_depth(broker.channel(), names.work)) == (2.0, 0)
        text = second.text()
        assert "redelivered after its park was written" in text, text[-3000:]
        assert "Redelivered" not in text, text[-3000:]
        assert queue_depth(broker.channel(), names.service) == 0
        client = redis.Redis.from_url(server.url)
        try:
            assert not list(client.scan_iter(match="*graveyard*"))
        finally:
            client.close()


def test_a_redelivered_original_whose_requeue_went_out_gets_no_second_lineage(
    uid: str, tmp_path: Path, redis_client: Any, broker: Any
) -> None:
    """The worker dies between its requeued copy (confirmed and recorded) and the original's
    ack (the ``worker.requeued`` crash point, in the pool's parent that settles requeues): the
    broker redelivers the original behind the copy; the next worker acks it unrun, the copy is
    the only retry."""
    names = Names(uid)
    with small_redis(tmp_path / "redis", maxmemory_mb=64) as server:
        first = start_worker(
            names,
            server.url,
            tmp_path / "first.log",
            concurrency=1,
            prefetch=1,  # the copy cannot reach the first worker before it dies
            DLX_FAULT="worker.requeued@1",
            DLX_FAULT_LOG=str(tmp_path / "faults.log"),
        )
        second = None
        try:
            wait_for(lambda: _ready(first), "the first worker", 60)
            app = make_storm_app(uid, server.url)
            app.send_task("storm.shaky", ("s0",), task_id=f"s0-{uid}")
            wait_for(lambda: not first.alive, "the crash after the requeue", 60)
            assert (tmp_path / "faults.log").read_text().startswith("worker.requeued")
            second = start_worker(names, server.url, tmp_path / "second.log", concurrency=1)
            wait_for(
                lambda: redis_client.hget(names.done_at, "s0") is not None,
                "the retry's success",
                60,
            )
            wait_for(
                lambda: "redelivered after its retry was made" in second.text(),
                "the original acked unrun",
                30,
            )
            wait_for(lambda: queue_depth(broker.channel(), names.work) == 0, "an empty queue", 30)
        finally:
            first.stop()
            if second is not None:
                second.stop()
        runs = ledger(redis_client, names)["s0"]["runs"]
        text = second.text() if second else ""
        assert runs == 2.0, first.text()[-3000:] + text[-3000:]
        assert "redelivered after its retry was made" in text, text[-3000:]
        assert "Redelivered" not in text, text[-3000:]


def test_a_redelivered_original_waits_in_its_queue_while_redis_cannot_say_if_its_retry_exists(
    uid: str, tmp_path: Path, redis_client: Any, broker: Any
) -> None:
    """As above, with celery_dlx's Redis down when the original comes back: counted as a crash
    it would get a second retry (a second lineage). It waits in its queue instead, while the
    retry runs; once Redis is back, the marker is read and the original acked unrun."""
    names = Names(uid)
    with own_redis(tmp_path / "redis") as server:
        first = start_worker(
            names,
            server.url,
            tmp_path / "first.log",
            concurrency=1,
            prefetch=1,  # the copy cannot reach the first worker before it dies
            DLX_FAULT="worker.requeued@1",
            DLX_FAULT_LOG=str(tmp_path / "faults.log"),
        )
        second = None
        try:
            wait_for(lambda: _ready(first), "the first worker", 60)
            make_storm_app(uid, server.url).send_task("storm.shaky", ("s0",), task_id=f"s0-{uid}")
            wait_for(lambda: not first.alive, "the crash after the requeue", 60)
            server.kill()
            second = start_worker(names, server.url, tmp_path / "second.log", concurrency=1)
            wait_for(
                lambda: redis_client.hget(names.done_at, "s0") is not None,
                "the retry's success while Redis is down",
                60,
            )
            wait_for(
                lambda: "wait in their queues until Redis (dlx_redis_url) answers" in second.text(),
                "the original waiting",
                30,
            )
            server.start()
            wait_for(
                lambda: "redelivered after its retry was made" in second.text(),
                "the original acked unrun",
                60,
            )
            wait_for(lambda: queue_depth(broker.channel(), names.work) == 0, "an empty queue", 30)
        finally:
            first.stop()
            if second is not None:
                second.stop()
        runs = ledger(redis_client, names)["s0"]["runs"]
        text = second.text() if second else ""
        assert runs == 2.0, text[-3000:]
        assert "Redelivered" not in text, text[-3000:]


def test_a_redelivered_original_whose_park_was_drained_gets_no_second_lineage(
    uid: str, tmp_path: Path, redis_client: Any, broker: Any
) -> None:
    """As above, but the park is drained (its copy back in the queue) before the original comes
    back, as when RabbitMQ stays down longer than the backoff: no entry left to find, the retry's
    marker (written with the park, in its transaction) tells the next worker the retry exists."""
    names = Names(uid)
    with small_redis(tmp_path / "redis", maxmemory_mb=64) as server:
        first = start_worker(
            names,
            server.url,
            tmp_path / "first.log",
            concurrency=1,
            DLX_FAULT="worker.parked@1",
            DLX_FAULT_LOG=str(tmp_path / "faults.log"),
        )
        second = service = None
        try:
            wait_for(lambda: _ready(first), "the first worker", 60)
            app = make_storm_app(uid, server.url)
            app.send_task("storm.flaky", ("f0",), task_id=f"f0-{uid}")
            wait_for(lambda: not first.alive, "the crash after the park", 60)
            runtime = get_runtime(app)
            assert [e.entry_id for e in runtime.parking.peek()] == [f"f0-{uid}:1"]
            # The service's drain publishes the parked copy behind the redelivered original.
            service = start_service(names, server.url, tmp_path / "service.log")
            wait_for(lambda: runtime.parking.count() == 0, "the park drained", 60)
            wait_for(lambda: queue_depth(broker.channel(), names.work) == 2, "both copies", 30)
            second = start_worker(names, server.url, tmp_path / "second.log", concurrency=1)
            wait_for(
                lambda: redis_client.hget(names.done_at, "f0") is not None,
                "the retry's success",
                60,
            )
            wait_for(lambda: queue_depth(broker.channel(), names.work) == 0, "an empty queue", 30)
        finally:
            first.stop()
            for proc in (second, service):
                if proc is not None:
                    proc.stop()
        # Two runs: the failure and the drained copy's success; the original acked unrun.
        runs = ledger(redis_client, names)["f0"]["runs"]
        assert runs == 2.0, second.text()[-3000:] if second else ""
        text = second.text() if second else ""
        assert "redelivered after its retry was made" in text, text[-3000:]
        assert "Redelivered" not in text, text[-3000:]


def test_a_batch_held_by_a_refused_write_has_published_no_requeued_copy(
    uid: str, tmp_path: Path, broker: Any
) -> None:
    """The service writes a batch's parks and burials before it publishes its requeued copies:
    a batch Redis refuses is held unacked without having run any of its tasks again, and once
    Redis has room it is settled once (a retry publishes no second copy)."""
    from kombu import Exchange, Producer, Queue

    from celery_dlx.service.settle import BatchSettler
    from tests.integration.dlx_apps import make_app

    billing, orders, source = f"billing-{uid}", f"orders-{uid}", f"in-{uid}"
    with small_redis(tmp_path / "redis", maxmemory_mb=64) as server:
        client = server.client()
        app = make_app(
            uid,
            dlx_redis_url=server.url,
            dlx_queues={
                billing: {"max_requeues": 1, "max_parks": 0},
                orders: {"max_requeues": 0, "max_parks": 1, "backoff": [3600]},
            },
        )
        channel = broker.channel()
        for name in (billing, orders, source):
            Queue(name, Exchange(""), routing_key=name, durable=False)(channel).declare()
        producer = Producer(channel)
        for i, dead_in in enumerate((billing, orders, billing)):
            producer.publish(
                b"{}",
                routing_key=source,
                message_id=f"m{i}-{uid}",
                headers={"x-death": [{"queue": dead_in, "reason": "rejected", "count": 1}]},
            )
        inbox = Queue(source, Exchange(""), routing_key=source)(channel)
        messages = [
            wait_for(lambda: inbox.get(no_ack=False), "a dead letter", 10) for _ in range(3)
        ]
        runtime = get_runtime(app)
        settler = BatchSettler(app, runtime=runtime)
        try:
            fill(client)
            try:
                settler.settle(messages)
            except Exception as exc:
                assert "maxmemory" in str(exc), exc
            else:
                raise AssertionError("Redis took the batch's writes")
            assert queue_depth(channel, billing) == 0  # nothing ran again
            make_room(client)
            settler.settle(messages)
            assert (queue_depth(channel, billing), runtime.parking.count()) == (2, 1)
            settler.settle(messages)  # a redelivered batch: no second fate
            assert (queue_depth(channel, billing), runtime.parking.count()) == (2, 1)
            for message in messages:
                message.ack()
        finally:
            client.close()


def test_a_park_sent_to_the_service_whose_write_did_land_is_parked_once(
    uid: str, broker: Any
) -> None:
    """A worker's park write that landed while its reply was lost (Redis went down) was also
    sent to the service as a fate copy: the service finds the entry with the copy's own history
    and parks nothing more (one lineage)."""
    from kombu import Exchange, Producer, Queue

    from celery_dlx.message.fate_copy import fate_copy
    from celery_dlx.message.headers import DLXState
    from celery_dlx.message.parked import ParkedMessage
    from celery_dlx.service.settle import BatchSettler
    from tests.integration.dlx_apps import make_app

    app = make_app(uid)
    runtime = get_runtime(app)
    work, source = f"work-{uid}", f"in-{uid}"
    state = DLXState().after_failure(fate="parked", at_ms=1_000, cause="c", queue=work)
    parked = ParkedMessage(
        message_id=f"m-{uid}",
        attempt=state.attempt,
        queue=work,
        body=b"{}",
        headers=dict(state_headers(state)),
        due_ms=10**13,
        parked_ms=1_000,
    )
    assert runtime.parking.park(parked)  # the write that landed
    copy = fate_copy(parked.outgoing(), fate="parked", exchange="", queue=work, delay=3600)
    channel = broker.channel()
    Queue(source, Exchange(""), routing_key=source, durable=False)(channel).declare()
    Producer(channel).publish(
        copy.body, routing_key=source, headers=copy.headers, message_id=f"m-{uid}"
    )
    inbox = Queue(source, Exchange(""), routing_key=source)(channel)
    message = wait_for(lambda: inbox.get(no_ack=False), "the fate copy", 10)
    BatchSettler(app, runtime=runtime).settle([message])
    message.ack()
    assert [e.entry_id for e in runtime.parking.peek()] == [parked.entry_id]


def test_a_redelivered_retry_that_never_ran_runs_as_its_first(
    uid: str, tmp_path: Path, redis_client: Any, broker: Any
) -> None:
    """A retry's copy comes back redelivered before any run of it started (the consumer that
    took it died): no run claimed its step, so it runs as the step's first run. Counted as a
    crash, it would spend a run of its budget that never ran."""
    names = Names(uid)
    with own_redis(tmp_path / "redis") as server:
        app = make_storm_app(uid, server.url)
        state = DLXState().after_failure(
            fate="requeued", at_ms=1_000, cause="c", queue=names.work, exc_type="ConnectionError"
        )
        app.send_task(
            "storm.shaky", ("s0",), task_id=f"s0-{uid}", headers=dict(state_headers(state))
        )
        channel = broker.channel()
        inbox = Queue(names.work, Exchange(""), routing_key=names.work)(channel)
        taken = wait_for(lambda: inbox.get(no_ack=False), "the retry's copy", 10)
        assert not taken.delivery_info.get("redelivered")
        channel.close()  # unacked: the broker redelivers it
        worker = start_worker(names, server.url, tmp_path / "worker.log", concurrency=1)
        try:
            wait_for(
                lambda: redis_client.hget(names.done_at, "s0") is not None,
                "the retry's success",
                60,
            )
        finally:
            worker.stop()
        text = worker.text()
        # Its run failed (shaky's first run), was requeued, and the next one succeeded.
        assert ledger(redis_client, names)["s0"]["runs"] == 2.0, text[-3000:]
        assert "redelivered before any run of it started: runs as its first" in text, text[-3000:]
        assert "Redelivered" not in text, text[-3000:]


def test_a_requeue_during_a_redis_restart_goes_out_only_once_its_retry_is_marked(
    uid: str, tmp_path: Path, redis_client: Any, broker: Any
) -> None:
    """Redis restarts while a run fails into a requeue: the copy waits for its retry's pending
    mark. Published unmarked, the worker dying after its publish (the ``worker.requeued`` crash
    point) would leave the redelivered original nothing to find, and it would start a second
    lineage beside the copy: three runs, not two."""
    names = Names(uid)
    with own_redis(tmp_path / "redis") as server:
        worker = start_worker(
            names,
            server.url,
            tmp_path / "first.log",
            concurrency=1,
            prefetch=1,  # the copy cannot reach the first worker before it dies
            DLX_FAULT="worker.requeued@1",
            DLX_FAULT_LOG=str(tmp_path / "faults.log"),
        )
        second = None
        try:
            wait_for(lambda: _ready(worker), "the worker", 60)
            server.kill()
            make_storm_app(uid, server.url).send_task("storm.shaky", ("s0",), task_id=f"s0-{uid}")
            wait_for(lambda: ledger(redis_client, names).get("s0"), "the failing run", 30)
            time.sleep(2)
            assert worker.alive, worker.text()[-3000:]  # no copy out yet: no crash point
            server.start()  # within the worker's patience
            wait_for(lambda: not worker.alive, "the crash after the requeue", 60)
            second = start_worker(names, server.url, tmp_path / "second.log", concurrency=1)
            wait_for(
                lambda: redis_client.hget(names.done_at, "s0") is not None,
                "the retry's success",
                60,
            )
            wait_for(lambda: queue_depth(broker.channel(), names.work) == 0, "an empty queue", 30)
            time.sleep(2)  # a second lineage, if one had started, would run by now
        finally:
            worker.stop()
            if second is not None:
                second.stop()
        text = worker.text() + (second.text() if second else "")
        assert ledger(redis_client, names)["s0"]["runs"] == 2.0, text[-6000:]


def test_a_retry_during_a_redis_restart_runs_once_its_run_is_claimed(
    uid: str, tmp_path: Path, redis_client: Any, broker: Any
) -> None:
    """A retry's copy arrives while Redis restarts: it waits for its run's claim. Run
    unclaimed, a second copy of the same step arriving later would run too."""
    names = Names(uid)
    state = DLXState().after_failure(
        fate="requeued", at_ms=1_000, cause="c", queue=names.work, exc_type="ConnectionError"
    )
    headers = dict(state_headers(state))
    with own_redis(tmp_path / "redis") as server:
        app = make_storm_app(uid, server.url)
        worker = start_worker(names, server.url, tmp_path / "worker.log", concurrency=1)
        try:
            wait_for(lambda: _ready(worker), "the worker", 60)
            server.kill()
            app.send_task("storm.shaky", ("s0",), task_id=f"s0-{uid}", headers=headers)
            time.sleep(3)
            assert not ledger(redis_client, names).get("s0")  # waiting for its claim
            server.start()
            wait_for(
                lambda: redis_client.hget(names.done_at, "s0") is not None,
                "the retry's success",
                60,
            )
            # A second copy of the same step (a drain killed after its publish): acked unrun.
            app.send_task("storm.shaky", ("s0",), task_id=f"s0-{uid}", headers=headers)
            wait_for(lambda: "a second copy of this retry" in worker.text(), "the second copy", 30)
        finally:
            worker.stop()
        text = worker.text()
        # The step's run failed (shaky's first), its requeued copy succeeded; nothing else ran.
        assert ledger(redis_client, names)["s0"]["runs"] == 2.0, text[-3000:]
