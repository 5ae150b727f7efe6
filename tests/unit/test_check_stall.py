"""``celery dlx check``'s stall findings: pure (Redis memory, graveyard budget, backlog)."""

from __future__ import annotations

import pytest

from celery_dlx.ops.checks import (
    BACKLOG,
    GRAVEYARD_FULL,
    REDIS_EVICTS,
    REDIS_FULL,
    STALL_KINDS,
    CheckReport,
    Problem,
    backlog_problems,
    graveyard_problems,
    memory_problems,
)
from celery_dlx.store.memory import RedisMemory, _oom_count

MB = 1048576


def memory(used: int, maxmemory: int = 48 * MB, **kw: object) -> RedisMemory:
    return RedisMemory(used=used, maxmemory=maxmemory, policy="noeviction", refused_writes=0, **kw)  # type: ignore[arg-type]


def test_a_full_redis_is_a_stall() -> None:
    assert memory_problems(memory(20 * MB)) == []
    assert memory_problems(memory(20 * MB, maxmemory=0)) == []  # no limit: never full
    near = memory_problems(memory(46 * MB))
    assert [p.kind for p in near] == [REDIS_FULL]
    refused = memory(30 * MB, writable=False, refusal="OOM command not allowed")
    (problem,) = memory_problems(refused)
    assert problem.kind == REDIS_FULL and "OOM command not allowed" in problem.detail
    assert "30.0 MB used of 48.0 MB" in problem.detail
    assert REDIS_FULL in STALL_KINDS


def test_an_evicting_redis_is_a_problem_not_a_stall() -> None:
    evicts = RedisMemory(used=1, maxmemory=48 * MB, policy="allkeys-lru", refused_writes=0)
    (problem,) = memory_problems(evicts)
    assert problem.kind == REDIS_EVICTS and "noeviction" in problem.detail
    assert REDIS_EVICTS not in STALL_KINDS
    unlimited = RedisMemory(used=1, maxmemory=0, policy="allkeys-lru", refused_writes=0)
    assert memory_problems(unlimited) == []  # never evicts without maxmemory


def test_a_graveyard_at_its_budget_is_a_stall() -> None:
    roomy = memory(20 * MB)
    assert graveyard_problems(10 * MB, 24 * MB, roomy) == []
    assert graveyard_problems(10 * MB, None, roomy) == []  # unlimited
    (problem,) = graveyard_problems(23 * MB, 24 * MB, roomy)  # the next obituaries do not fit
    assert problem.kind == GRAVEYARD_FULL and "23.0 MB of its 24.0 MB budget" in problem.detail
    # Past 90% of maxmemory burials stop whatever the budget: the rest is the parks' room.
    (problem,) = graveyard_problems(1 * MB, None, memory(44 * MB))
    assert problem.kind == GRAVEYARD_FULL and "past the 90% of maxmemory" in problem.detail
    assert GRAVEYARD_FULL in STALL_KINDS


def test_a_backlog_over_its_limit_is_a_stall() -> None:
    assert backlog_problems("dead", 10, None, 10) == []
    assert backlog_problems("dead", 10**6, None, 0) == []  # 0: not checked
    (problem,) = backlog_problems("dead", 21_936, 600.4, 10_000)
    assert problem.kind == BACKLOG and "21,936 dead letters" in problem.detail
    assert "the oldest 600 s old" in problem.detail


def test_a_report_is_stalled_only_by_a_stall() -> None:
    report = CheckReport("x", "dead", problems=[Problem(REDIS_EVICTS, "redis", "...")])
    assert not report.ok and not report.stalled
    report.problems.append(Problem(BACKLOG, "dead", "..."))
    assert report.stalled and report.to_json()["stalled"] is True


@pytest.mark.parametrize(
    ("stats", "count"),
    [({}, 0), ({"errorstat_OOM": {"count": 22024}}, 22024), ({"errorstat_OOM": "count=7"}, 7)],
)
def test_redis_refusals_are_read_from_errorstats(stats: dict[str, object], count: int) -> None:
    assert _oom_count(stats) == count
