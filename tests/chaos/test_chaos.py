"""The small chaos run of the test suite: every message accounted for under kill -9.

400 messages (good, flaky, poison, foreign) through a prefork worker, a DLX service, two drains
and a foreign consumer, all subprocesses, while each is killed -9 at random, celery_dlx's own
Redis (AOF, fsync always) is restarted, and crash points kill the drain and the DLX service in
each window where a crash matters (claimed/unpublished, published/unacked, buried/unacked).
Publishing goes on for a few seconds after the chaos stops, so some messages meet none and are
held to exact run counts. Fates are checked against the ledger the tasks write themselves, not
against celery_dlx's own counts. The RabbitMQ node is never restarted here: it is shared;
``benchmarks/chaos.py`` does that, by hand. The full accounting is printed (``-s``).
"""

from __future__ import annotations

import pytest

from tests.chaos.harness import DEFAULT_FAULTS, PROCESS_ACTIONS, ChaosPlan, run_chaos
from tests.chaos.processes import FAULT_PREFIX

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLAN = ChaosPlan(
    messages=400,
    workers=1,
    concurrency=2,
    services=1,
    drains=2,
    foreign_consumers=1,
    publish_seconds=18.0,
    chaos_seconds=14.0,
    settle_seconds=90.0,
    gap=(1.0, 2.0),
    actions=PROCESS_ACTIONS,
    seed=11,
)


def test_no_message_is_lost_while_processes_and_redis_die() -> None:
    report = run_chaos(PLAN)
    print("\n".join(["chaos accounting:", *report.lines()]))

    assert report.unsent == 0 and report.sent == PLAN.messages
    assert report.lost == 0, f"lost: {report.lost_ids[:20]}"
    assert report.settled and report.pending == 0, f"pending: {report.pending_ids[:20]}"
    assert report.done + report.buried == report.sent
    assert set(PROCESS_ACTIONS) <= set(report.events), report.events
    # Every crash point fired: each window where a crash could lose or double a message.
    points = {p.split("@")[0] for faults in DEFAULT_FAULTS.values() for p in faults}
    assert {f"{FAULT_PREFIX}{p}" for p in points} <= set(report.events), report.events
    assert report.monkey_errors == []
    assert report.unexpected_exits == []
    # The independent ledger: good and flaky done and never buried, poison buried exactly once,
    # runs exactly as the kind says for every message no chaos touched.
    assert report.violations == [], report.violations[:20]
    assert report.good_buried == 0
    assert report.exact_checked > 0 and report.disturbed > 0
    kinds = report.by_kind
    for kind in ("poison", "foreign-poison"):
        assert kinds[kind] == {"sent": kinds[kind]["sent"], "buried": kinds[kind]["sent"]}
    for kind in ("good", "flaky", "foreign"):
        assert kinds[kind] == {"sent": kinds[kind]["sent"], "done": kinds[kind]["sent"]}


def test_a_crash_point_firing_while_the_run_settles_is_restarted(vhost: str) -> None:
    """The harness goes on supervising after the chaos: a crash point still armed in a
    restarted process may fire while the run settles (bigger service batches made that common),
    and the dead process must be started again, as a supervisor would, or its queue waits
    forever. No monkey actions here; the DLX service dies at its 4th burial batch, which on
    these machines comes after publishing has ended (before the fix this run never settled).
    On quorum queues, so on a virtual host of its own: their worker declares Celery's shared
    delayed-delivery topology (``celery_delayed_*``)."""
    plan = ChaosPlan(
        messages=200,
        workers=1,
        drains=1,
        publish_seconds=4.0,
        chaos_seconds=0.1,
        settle_seconds=60.0,
        actions=(),
        faults={"service0": ["service.buried@4"]},
        quorum=True,
        seed=23,
        broker_url=vhost,
    )
    report = run_chaos(plan)
    print("\n".join(["late crash accounting:", *report.lines()]))

    assert report.events == {f"{FAULT_PREFIX}service.buried": 1}
    assert report.settled and report.pending == 0, f"pending: {report.pending_ids[:20]}"
    assert report.lost == 0 and report.done + report.buried == report.sent
    assert report.violations == []
