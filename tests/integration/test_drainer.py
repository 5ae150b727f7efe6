"""The drain runs inside the worker (a bootstep under a Redis lease): one drainer per key prefix,
taken over when its holder dies, draining whatever queues the worker consumes, and quiet."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.drain.drainer import Drainer, lease_seconds
from celery_dlx.message.names import Keys
from celery_dlx.store.lease import DrainLease
from tests.integration.dlx_apps import make_app
from tests.integration.dropin_app import build, queue_of
from tests.integration.dropin_worker import worker_process
from tests.integration.helpers import fates_of, queue_depth, wait_until


def test_lease_one_holder_renewed_then_taken_over_after_expiry(
    redis_client: Any, keys: Keys
) -> None:
    first = DrainLease(redis_client, keys.drain_lease, 0.6, token="first")
    second = DrainLease(redis_client, keys.drain_lease, 0.6, token="second")
    assert first.acquire() and not second.acquire()
    for _ in range(4):  # renewed past its TTL: still the holder
        time.sleep(0.25)
        assert first.acquire() and not second.acquire()
    # The holder dies (no renewal, no release): the other takes over once the TTL ran out.
    wait_until(second.acquire, what="takeover after the lease expired", timeout=5)
    assert not first.acquire(), "the dead holder does not get it back"
    assert not first.release(), "releasing a lease held by another deletes nothing"
    assert redis_client.get(keys.drain_lease) == b"second"
    assert second.release() and redis_client.get(keys.drain_lease) is None


def test_lease_lasts_five_intervals_at_least_ten_seconds() -> None:
    assert lease_seconds(1.0) == 10.0
    assert lease_seconds(4.0) == 20.0


def test_two_drainers_only_the_holder_drains_and_the_other_takes_over(
    uid: str, key_prefix: str, redis_client: Any, cleanup_queues: list[str]
) -> None:
    app = make_app(uid)
    one, two = Drainer(app, name="one"), Drainer(app, name="two")
    assert one.step() is False and one.held
    assert two.step() is False and not two.held
    one.held = False  # dies without releasing: the lease expires by itself
    redis_client.pexpire(Keys(key_prefix).drain_lease, 50)
    wait_until(lambda: (two.step(), two.held)[1], what="the second drainer takes the lease")
    assert not one.step() and not one.held
    two.stop()
    two._give_up()
    assert redis_client.get(Keys(key_prefix).drain_lease) is None


@pytest.mark.slow
def test_worker_consuming_only_its_queue_drains_parked_retries_back(
    uid: str,
    key_prefix: str,
    keys: Keys,
    redis_client: Any,
    broker: Any,
    cleanup_queues: list[str],
    tmp_path: Path,
) -> None:
    cleanup_queues.extend([queue_of(uid), f"default-{uid}", f"dead-{uid}", f"exchange:dlx-{uid}"])
    producer = build(uid)
    log = tmp_path / "worker.log"
    with worker_process(uid, log, "-Q", queue_of(uid)):
        results = [producer.send_task("dropin.park_once", args=[n]) for n in range(5)]
        bad = producer.send_task("dropin.poison", args=[0])
        done = "{" + key_prefix + "}:test:parked-done"
        wait_until(
            lambda: redis_client.scard(done) == 5,
            what="5 parked retries drained and done",
            timeout=120,
        )
        wait_until(
            lambda: "buried" in fates_of(redis_client, keys, bad.id),
            what="poison buried",
            timeout=120,
        )
        time.sleep(1.0)  # the service's burial line
    for result in results:
        assert fates_of(redis_client, keys, result.id) == ["parked", "drained", "recovered"]
    text = log.read_text(errors="replace")
    assert f"parked dropin.park_once[{results[0].id}]" in text, "celery_dlx's INFO lines show"
    assert "drained dropin" not in text, "a drained retry is logged at DEBUG only"
    # Per poison message: at most attempts + 1 records beside Celery's "Received task".
    attempts = (
        fates_of(redis_client, keys, bad.id).count("requeued")
        + fates_of(redis_client, keys, bad.id).count("parked")
        + 1
    )
    mine = [
        line
        for line in text.splitlines()
        if bad.id in line and re.match(r"^\[\d{4}-", line) and not line.endswith("] received")
    ]
    print(f"poison message: {attempts} attempts, {len(mine)} records", *mine, sep="\n")
    assert attempts == 5  # 2 requeues, 2 parks, then buried (the test app's budgets)
    assert len(mine) <= attempts + 1, mine
    channel = broker.channel()
    assert queue_depth(channel, queue_of(uid)) == 0
    # No drain tick went to the default queue (the worker does not read it): none exists.
    with pytest.raises(Exception, match="NOT_FOUND"):
        broker.channel().queue_declare(f"default-{uid}", passive=True)
    assert redis_client.zcard(keys.parked_due) == 0


@pytest.mark.slow
def test_idle_worker_with_beat_at_info_writes_no_per_tick_records(
    uid: str, key_prefix: str, vhost: str, tmp_path: Path
) -> None:
    """The whole log stays empty, not only celery_dlx's loggers: in a virtual host of its own,
    so that other workers on the broker (their mingle makes every worker log ``sync with``)
    cannot write to it."""
    log = tmp_path / "worker.log"
    idle = 20.0
    with worker_process(uid, log, "-B", "-s", str(tmp_path / "beat-schedule"), broker=vhost):
        wait_until(
            lambda: " ready." in log.read_text(errors="replace"), what="worker ready", timeout=120
        )
        time.sleep(1.0)  # let start-up lines (beat's "Starting...") land
        before = log.read_text(errors="replace").splitlines()
        assert any("beat: Starting" in line for line in before), "INFO records are written"
        own = vhost.rsplit("/", 1)[1]
        assert any("transport:" in line and own in line for line in before), "in its vhost"
        time.sleep(idle)
        after = log.read_text(errors="replace").splitlines()
    records = [line for line in after[len(before) :] if re.match(r"^\[\d{4}-", line)]
    print(f"records while idle for {idle:.0f}s: {len(records)}", records)
    ticks = [r for r in records if re.search(r"drain|Sending due task|Received task|succeeded", r)]
    assert ticks == [], ticks
    assert records == [], f"an idle worker should write nothing; wrote {len(records)}: {records}"


def test_a_deep_backlog_drains_back_to_back_not_one_batch_per_interval(
    uid: str,
    key_prefix: str,
    keys: Keys,
    redis_client: Any,
    broker: Any,
    cleanup_queues: list[str],
) -> None:
    from tests.integration.test_drain import declare, message_count, park

    app = make_app(uid, dlx_drain_batch=50, dlx_drain_interval=30.0)
    queue = declare(broker, cleanup_queues, f"backlog-{uid}")
    drainer = Drainer(app, name="deep")
    park(drainer.runtime, queue, 260)
    # one turn drains batch after batch (pipelined) within its budget, and a turn that drained
    # full batches says "go on at once": the loop never waits the interval during a backlog
    assert drainer.step() is True
    assert message_count(broker, queue) == 260
    assert redis_client.zcard(keys.parked_due) == 0
    assert drainer.step() is False, "nothing left: now the loop waits the interval"
    drainer.stop()
    drainer._give_up()


@pytest.mark.slow
def test_when_the_draining_worker_is_killed_another_takes_over(
    uid: str,
    key_prefix: str,
    keys: Keys,
    redis_client: Any,
    cleanup_queues: list[str],
    tmp_path: Path,
) -> None:
    import os
    import signal

    cleanup_queues.extend([queue_of(uid), f"default-{uid}", f"dead-{uid}", f"exchange:dlx-{uid}"])
    producer = build(uid)

    def holder() -> str:
        return (redis_client.get(keys.drain_lease) or b"").decode()

    with worker_process(uid, tmp_path / "a.log", "-Q", queue_of(uid)) as first:
        wait_until(
            lambda: holder().startswith(f"dropin-{uid}"),
            what="a drainer holds the lease",
            timeout=120,
        )
        taken_by = holder()
        with worker_process(uid, tmp_path / "b.log", "-Q", queue_of(uid)):
            wait_until(
                lambda: " ready." in (tmp_path / "b.log").read_text(errors="replace"),
                what="second worker ready",
                timeout=120,
            )
            assert holder() == taken_by, "one drainer at a time"
            os.killpg(first.pid, signal.SIGKILL)  # the lease holder dies without letting go
            first.wait(30)
            results = [producer.send_task("dropin.park_once", args=[n]) for n in range(3)]
            done = "{" + key_prefix + "}:test:parked-done"
            wait_until(
                lambda: redis_client.scard(done) == 3,
                what="retries drained by the surviving worker",
                timeout=120,
            )
            # A run records its recovery after its body: wait for the records before the
            # worker stops (its pool processes are killed with it).
            wait_until(
                lambda: all("recovered" in fates_of(redis_client, keys, r.id) for r in results),
                what="each retry's recovery recorded",
                timeout=60,
            )
            assert holder() not in ("", taken_by), "the survivor took the lease"
    for result in results:
        assert fates_of(redis_client, keys, result.id) == ["parked", "drained", "recovered"]
