"""Several workers and a separate DLX service under kill -9, on a private RabbitMQ node that is
restarted too: each failure runs its budget once and is buried once.

Three prefork workers (``-c 2``), a DLX service in its own process (which drains too) and a
foreign consumer, all subprocesses, on a private RabbitMQ node (its own ports and folder,
stopped by name) and a private Redis (AOF, fsync always). A monkey kills a worker, a pool child,
the service and the foreign consumer with ``kill -9``, restarts Redis with ``kill -9`` and stops
and starts the RabbitMQ node; every crash point of :mod:`celery_dlx.faults` (each write of a
park, a requeue, a settle and a drain) is armed in the process that reaches it. Three seeds, each
its own run. Checked against the ledger the tasks write themselves: nothing lost, every poison
message buried exactly once, no failure run past its budget except the runs a kill cut short,
and every message no chaos touched run exactly as its kind says.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from celery_dlx import faults
from tests.chaos.harness import PROCESS_ACTIONS, ChaosPlan, run_chaos
from tests.chaos.processes import FAULT_PREFIX, RESTART_RABBITMQ
from tests.chaos.servers import RabbitNode

pytestmark = [
    pytest.mark.integration,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("DLX_CHAOS_MULTI") != "1",
        reason="multi-process chaos on a private RabbitMQ node, under a minute a seed: set "
        "DLX_CHAOS_MULTI=1 (bash scripts/test-chaos.sh)",
    ),
]

#: Which process of the run reaches each kind of crash point (``<kind><index>``).
REACHED_BY = {"service": "service0", "drain": "drain0", "worker": "worker1"}


def every_crash_point() -> dict[str, list[str]]:
    """Every crash point, armed at its second reach in the process that reaches it."""
    armed: dict[str, list[str]] = {}
    for point in sorted(faults.POINTS):
        armed.setdefault(REACHED_BY[point.split(".")[0]], []).append(f"{point}@2")
    return armed


@pytest.fixture(scope="module")
def rabbit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RabbitNode]:
    name = f"dlxchaos{secrets.token_hex(3)}"
    node = RabbitNode(Path(tmp_path_factory.mktemp("rabbit")), name, secrets.token_hex(16))
    node.start()
    try:
        yield node
    finally:
        node.stop()


PLAN = ChaosPlan(
    messages=300,
    workers=3,
    concurrency=2,
    services=1,
    drains=1,
    foreign_consumers=1,
    publish_seconds=10.0,
    chaos_seconds=12.0,
    settle_seconds=120.0,
    gap=(0.8, 1.6),
    actions=(*PROCESS_ACTIONS, RESTART_RABBITMQ),
    rabbit_restarts=1,
    faults=every_crash_point(),
)


@pytest.mark.parametrize("seed", [101, 202, 303])
def test_every_poison_is_buried_once_and_no_failure_runs_past_its_budget(
    rabbit: RabbitNode, seed: int
) -> None:
    keep = os.environ.get("DLX_CHAOS_KEEP_LOGS") == "1"
    plan = replace(PLAN, seed=seed, broker_url=rabbit.url, rabbit_node=rabbit, keep_logs=keep)
    report = run_chaos(plan)
    print("\n".join([f"multi-process chaos, seed {seed}:", *report.lines()]))
    if report.logdir:
        print(f"logs: {report.logdir}")

    assert report.unsent == 0 and report.sent == plan.messages
    assert report.lost == 0, f"lost: {report.lost_ids[:20]}"
    assert report.settled and report.pending == 0, f"pending: {report.pending_ids[:20]}"
    assert report.done + report.buried == report.sent
    assert report.monkey_errors == [] and report.unexpected_exits == []
    assert report.events.get(RESTART_RABBITMQ) == 1, report.events
    fired = {e.removeprefix(FAULT_PREFIX) for e in report.events if e.startswith(FAULT_PREFIX)}
    assert fired, report.events  # crash points fired (which ones depends on the seed's timing)
    # The ledger: poison buried exactly once, no failure past its budget, good never buried.
    assert report.violations == [], report.violations[:20]
    assert report.good_buried == 0
    kinds = report.by_kind
    for kind in ("poison", "foreign-poison"):
        assert kinds[kind] == {"sent": kinds[kind]["sent"], "buried": kinds[kind]["sent"]}
    for kind in ("good", "flaky", "foreign"):
        assert kinds[kind] == {"sent": kinds[kind]["sent"], "done": kinds[kind]["sent"]}
