"""The per-cause breaker (``dlx_breaker``) end to end: a real worker, RabbitMQ and Redis.

A dependency fails for a few seconds, then recovers. With the breaker on, the failures past the
threshold are held (parked without spending their budget), one canary probes, and once it
succeeds every held message comes back and succeeds: nothing is buried. With it off and the same
budget, the same messages are buried. A second cause on the same queue keeps its ordinary fate.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from celery_dlx.policy.breaker import BreakerSettings
from celery_dlx.store.breaker import Breakers
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.dlx_apps import delays_returning, make_app, queue_names, worker
from tests.integration.helpers import fates_of, queue_depth, wait_until

#: Messages sent while the dependency is down.
N = 12
#: Seconds the dependency stays down.
OUTAGE = 8.0
BREAKER = {"failures": 3, "window": 30, "hold": 20, "probe": 1.5, "release_rate": 50}


def key(prefix: str, name: str) -> str:
    return "{" + prefix + "}:test:" + name


def outage_app(uid: str, cleanup_queues: list[str], breaker: dict[str, Any] | None) -> Any:
    # Budget: 2 requeues and 2 parks of 0.2/0.3 s: spent in about a second, far inside the outage.
    app = make_app(uid, dlx_breaker=breaker)
    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:dlx-{uid}")
    return app


def outage_tasks(
    app: Any, uid: str, redis_client: Any, key_prefix: str
) -> tuple[Any, Any, list[float]]:
    """The flaky dependency's task and another cause's; set ``recover_at[0]`` (monotonic)."""
    done = key(key_prefix, "done")
    other_runs = key(key_prefix, "other-runs")
    recover_at = [float("inf")]

    @app.task(name=f"charge-{uid}")
    def charge(n: int) -> int:
        if time.monotonic() < recover_at[0]:
            raise ConnectionError("payment gateway unreachable")
        redis_client.sadd(done, n)
        return n

    # Three runs (no parks): never more than `failures`, so its own breaker stays closed.
    @app.task(name=f"other-{uid}", dlx_max_parks=0)
    def other() -> None:
        redis_client.incr(other_runs)
        raise ValueError("a different cause")

    return charge, other, recover_at


@pytest.mark.parametrize("breaker", [True, False], ids=["breaker-on", "breaker-off"])
def test_outage_with_and_without_the_breaker(
    uid: str,
    key_prefix: str,
    keys: Any,
    redis_client: Any,
    broker: Any,
    cleanup_queues: list[str],
    breaker: bool,
) -> None:
    app = outage_app(uid, cleanup_queues, BREAKER if breaker else None)
    channel = broker.channel()
    dead = f"dead-{uid}"
    done = key(key_prefix, "done")
    charge, other, recover_at = outage_tasks(app, uid, redis_client, key_prefix)
    with worker(app), delays_returning(app):
        # Off: the dependency stays down until every message is buried (no race with a slow run).
        recover_at[0] = time.monotonic() + OUTAGE if breaker else float("inf")
        results = [charge.delay(n) for n in range(N)]
        other_result = other.delay()
        if breaker:
            # Open while the outage lasts, with the cause, the task and how many it holds.
            wait_until(
                lambda: len(get_runtime(app).breakers.list_open()) == 1, what="breaker opened"
            )
            [opened] = get_runtime(app).breakers.list_open()
            assert opened.queue == f"work-{uid}" and opened.task == f"charge-{uid}"
            assert opened.exc_type == "ConnectionError"
            wait_until(
                lambda: redis_client.scard(done) == N,
                what="every message succeeded after the recovery",
                timeout=60,
            )
            # The other cause was never held: buried after its whole budget (1 + 2 runs).
            wait_until(lambda: queue_depth(channel, dead) == 1, what="the other cause's burial")
            assert int(redis_client.get(key(key_prefix, "other-runs"))) == 3
            assert get_runtime(app).breakers.list_open() == []
        else:
            wait_until(
                lambda: queue_depth(channel, dead) == N + 1,
                what="every message buried",
                timeout=60,
            )
            assert redis_client.scard(done) == 0
            # Off costs nothing in Redis: not one breaker key was written.
            assert list(redis_client.scan_iter(match="{" + key_prefix + "}:breaker:*")) == []
    if breaker:
        assert queue_depth(channel, dead) == 1, "nothing of the breaker's cause was buried"
        fates = [fates_of(redis_client, keys, r.id) for r in results]
        # The held ones spent no budget: never more than the ordinary fates of the first failures.
        assert all(f.count("requeued") <= 2 and "buried" not in f for f in fates), fates
        assert sum(f.count("parked") for f in fates) >= N - 3
    assert other_result.id


def test_store_close_releases_held_ids_and_list_drops_expired_entries(
    key_prefix: str, keys: Any, redis_client: Any
) -> None:
    store = Breakers(redis_client, keys)
    settings = BreakerSettings(failures=1, window=10, hold=10, probe=1, release_rate=5)
    assert store.fail("q", "c1", settings, 1000, entry_id="a:0") is None
    hold = store.fail("q", "c1", settings, 1001, entry_id="b:0", task="t", exc_type="E")
    assert hold is not None and hold.opened and hold.canary and hold.due_ms == 2001
    assert store.fail("q", "c2", settings, 1002, entry_id="x:0") is None, "another cause"
    third = store.fail("q", "c1", settings, 1003, entry_id="c:0")
    assert third is not None and not third.canary and third.due_ms == 11003
    [listed] = store.list_open()
    assert (listed.queue, listed.cause, listed.task, listed.held) == ("q", "c1", "t", 2)
    assert store.is_open("q", "c1") and not store.is_open("q", "c2")
    assert store.close("q", "c1") == (True, ["b:0", "c:0"])
    assert store.close("q", "c1") == (False, [])
    assert store.list_open() == []
    # An index entry whose state expired is dropped from the list.
    store.fail("q", "c3", settings, 1004, entry_id="d:0")
    store.fail("q", "c3", settings, 1005, entry_id="e:0")
    redis_client.delete(store.state_key("q", "c3"))
    assert store.list_open() == []
    assert redis_client.zcard(store.open_index) == 0


def test_cli_lists_open_breakers_and_close_releases_what_they_hold(
    uid: str, key_prefix: str, cleanup_queues: list[str]
) -> None:
    from celery_dlx.fates import now_ms
    from celery_dlx.message.parked import ParkedMessage
    from tests.integration.cli_helpers import run, run_json

    app = outage_app(uid, cleanup_queues, {"failures": 1, "hold": 100, "probe": 50})
    runtime = get_runtime(app)
    settings = runtime.config.breaker_for(f"work-{uid}")
    assert settings is not None
    queue, now = f"work-{uid}", now_ms()
    assert run_json(app, "breakers") == []
    held = [
        ParkedMessage(
            message_id=f"m{i}/held1", attempt=0, queue=queue, body=b"{}", due_ms=now + 100_000
        )
        for i in range(3)
    ]
    runtime.breakers.fail(queue, "cafe", settings, now, entry_id="first:0")
    for message in held:
        runtime.parking.park(message)
        assert runtime.breakers.fail(queue, "cafe", settings, now, entry_id=message.entry_id)
    [listed] = run_json(app, "breakers")
    assert (listed["queue"], listed["cause"], listed["held"]) == (queue, "cafe", 3)
    assert "cafe" in run(app, "breakers").stdout
    missing = run(app, "breakers", "close", "beef")
    assert missing.exit_code == 3 and "no open breaker" in missing.stderr
    closed = run_json(app, "breakers", "close", "cafe")
    assert closed == [{"queue": queue, "cause": "cafe", "released": 3}]
    # Released: due now (release_rate 50/s), not after their 100 s hold.
    dues = [m.lease_score for m in runtime.parking.soonest(10)]
    assert len(dues) == 3 and max(dues) <= now_ms() + 1000
    assert run_json(app, "breakers") == []
