"""The small chaos run of the test suite: every message accounted for under kill -9.

400 messages (good, flaky, poison, foreign) through a prefork worker, a DLX service, two drains
and a foreign consumer, all subprocesses, while each is killed -9 at random and celery_dlx's own
Redis (AOF, fsync always) is restarted. The RabbitMQ node is never restarted here: it is shared;
``benchmarks/chaos.py`` does that, by hand. The full accounting is printed (``-s``).
"""

from __future__ import annotations

import pytest

from tests.chaos.harness import PROCESS_ACTIONS, ChaosPlan, run_chaos

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PLAN = ChaosPlan(
    messages=400,
    workers=1,
    concurrency=2,
    services=1,
    drains=2,
    foreign_consumers=1,
    publish_seconds=12.0,
    chaos_seconds=15.0,
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
    assert set(report.events) == set(PROCESS_ACTIONS), report.events
    assert report.monkey_errors == []
    assert report.unexpected_exits == []
    kinds = report.by_kind
    # Poison never succeeds: every poison message ends buried.
    assert kinds["poison"] == {"sent": kinds["poison"]["sent"], "buried": kinds["poison"]["sent"]}
    poison = kinds["foreign-poison"]
    assert poison == {"sent": poison["sent"], "buried": poison["sent"]}
    # A kill mid-task counts as an attempt, so a good message may end buried, never lost.
    for kind in ("good", "flaky", "foreign"):
        row = kinds[kind]
        assert row.get("done", 0) + row.get("buried", 0) == row["sent"], (kind, row)
        assert row.get("done", 0) > 0, (kind, row)
