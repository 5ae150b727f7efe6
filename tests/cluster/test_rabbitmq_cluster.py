"""A 3-node RabbitMQ 3.10 cluster, quorum queues, kill -9 of each node in turn (issue 24).

The worker and the DLX service (real subprocesses) are given the three nodes as their
``broker_url`` failover list; good and poison tasks stream in while the worker's node, the DLX
service's node and a follower are killed -9 in turn, each started again before the next kill.
Nothing may be lost, every poison message is buried exactly once (in this run's graveyard),
duplicates of good tasks are counted; the stall after each kill is measured and printed (``-s``).
Then ``celery dlx check`` runs with the first node of its lists dead and must answer through
another node's management API. Runs only with ``DLX_CLUSTER=1`` (``tox -e cluster``,
``scripts/test-cluster.sh``): about five minutes.
"""

from __future__ import annotations

import pytest

from tests.cluster.harness import KILLS, ClusterPlan, run_cluster

PLAN = ClusterPlan()


@pytest.mark.timeout(1500)
def test_each_node_killed_in_turn_loses_nothing_and_buries_poison_once() -> None:
    report = run_cluster(PLAN)
    print("\n".join(["RabbitMQ cluster accounting:", *report.lines()]))
    chaos = report.chaos

    assert chaos.unsent == 0 and chaos.sent == PLAN.messages
    assert chaos.lost == 0, f"lost: {chaos.lost_ids[:20]}"
    assert chaos.settled and chaos.pending == 0, f"pending: {chaos.pending_ids[:20]}"
    assert chaos.done + chaos.buried == chaos.sent
    poison = chaos.by_kind["poison"]
    assert poison == {"sent": poison["sent"], "buried": poison["sent"]}
    assert chaos.buried_twice == 0 and chaos.done_and_buried == 0
    good = chaos.by_kind["good"]
    assert good == {"sent": good["sent"], "done": good["sent"]} and chaos.good_buried == 0
    # At-least-once: only a message a kill touched may run more than its kind says.
    assert chaos.violations == [], chaos.violations[:20]
    assert chaos.exact_checked > 0
    assert chaos.unexpected_exits == []

    assert [k.reason for k in report.kills] == list(KILLS)
    worker_kill, service_kill, follower_kill = report.kills
    assert worker_kill.node == worker_kill.worker_on[0]
    assert service_kill.node == service_kill.service_on[0]
    assert follower_kill.node != follower_kill.leader_before
    for kill in report.kills:
        assert kill.stall is not None and kill.first_new_done is not None, kill.line()

    # dlx check with node 0 (first of the broker list and of the management URLs) dead.
    assert report.check_exit == 0, (report.check, report.check_stderr)
    assert report.check["ok"] is True
    tried = report.check["management_tried"]
    assert len(tried) == 3 and report.check["management_url"] == tried[1]
