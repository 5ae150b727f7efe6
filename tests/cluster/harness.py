"""A run on a private 3-node RabbitMQ cluster: quorum queues, kill -9 of each node in turn.

:func:`run_cluster` starts three private RabbitMQ 3.10 nodes joined into one cluster
(:class:`tests.chaos.servers.RabbitCluster`, management plugin on each), celery_dlx's own Redis,
a Celery worker and the DLX service as subprocesses of the chaos app
(:mod:`tests.chaos.chaos_app`, ``dlx_quorum=True``: quorum queues on the three nodes with
at-least-once dead-lettering), each given the node list as its ``broker_url`` failover list in its
own order (the worker starts on node 0, the service on node 1, the test's publisher on node 2).
It publishes a steady stream of good and poison tasks (publisher confirms) and, meanwhile, kills
-9 each node in turn, chosen live:

1. the node the worker is connected to;
2. the node the DLX service is connected to;
3. a follower: a node that does not lead the work queue (one no process uses, if there is one);

each restarted before the next kill. Then it lets the run settle and accounts for every message
id as :mod:`tests.chaos.harness` does (done from the tasks' own ledger, buried from the
graveyard of this run's key prefix). Per kill it measures the stall: the longest time in which
no task run ended, from the kill until the node was back (plus ``recover_seconds``): tasks in
flight at the kill end first, then nothing until the worker consumes again. Also the time until
the first task published after the kill was done, and the publisher's own gap (kill to its next
confirmed publish). ``CLUSTER_NO_DELAYED_DELIVERY=1`` runs the worker without Celery's native
delayed-delivery step (:mod:`tests.cluster.cluster_app`), to measure what that step costs.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from kombu import Connection

from tests.chaos import processes as P
from tests.chaos.chaos_app import make_chaos_app
from tests.chaos.harness import ChaosPlan, ChaosReport, ChaosRun, _Publisher, budgets, ledger_check
from tests.chaos.servers import RabbitCluster, RabbitNode

logger = logging.getLogger("cluster")

#: Node orders of the failover lists: who starts on which node.
WORKER_ORDER, SERVICE_ORDER, PUBLISHER_ORDER = (0, 1, 2), (1, 2, 0), (2, 0, 1)
#: The three kills, in order.
KILL_WORKER_NODE = "worker's node"
KILL_SERVICE_NODE = "DLX service's node"
KILL_FOLLOWER = "a follower"
KILLS = (KILL_WORKER_NODE, KILL_SERVICE_NODE, KILL_FOLLOWER)


@dataclass
class ClusterPlan:
    """What a cluster run does. Durations in seconds."""

    messages: int = 1000
    poison_share: float = 0.1
    #: Seconds over which the messages are published (a steady stream; longer than the kills).
    publish_seconds: float = 150.0
    #: Seconds after the stream starts before the first kill.
    first_kill: float = 8.0
    #: Seconds a killed node stays down before it is started again.
    down_seconds: float = 5.0
    #: Seconds after a restarted node is up before the next kill.
    recover_seconds: float = 12.0
    settle_seconds: float = 180.0
    concurrency: int = 2
    seed: int = 24
    keep_logs: bool = False

    def chaos_plan(self) -> ChaosPlan:
        return ChaosPlan(
            messages=self.messages,
            mix={"good": 1.0 - self.poison_share, "poison": self.poison_share},
            workers=1,
            concurrency=self.concurrency,
            services=1,
            drains=0,
            foreign_consumers=0,
            publish_seconds=self.publish_seconds,
            settle_seconds=self.settle_seconds,
            faults={},
            quorum=True,
            seed=self.seed,
            keep_logs=self.keep_logs,
        )


@dataclass
class Kill:
    """One kill -9 of a node: which, why, when (epoch seconds) and what followed."""

    reason: str
    node: str
    leader_before: str | None
    killed_at: float
    up_at: float = 0.0
    #: Seconds from the kill until the first task published after it completed (a task
    #: published in the instant of the kill may still reach the dying node's consumer).
    first_new_done: float | None = None
    #: Seconds from the kill until the publisher's next confirmed publish.
    publish_gap: float | None = None
    #: The stall: the longest time no task run ended, from the kill until the node was back
    #: and ``recover_seconds`` more (tasks in flight at the kill end first, then nothing).
    stall: float | None = None
    #: The work queue's leader once the node was back.
    leader_after: str | None = None
    #: The nodes the worker and the DLX service had connections to at the kill.
    worker_on: list[str] = field(default_factory=list)
    service_on: list[str] = field(default_factory=list)

    def line(self) -> str:
        stall = "-" if self.stall is None else f"{self.stall:.1f}s"
        first = "none" if self.first_new_done is None else f"{self.first_new_done:.1f}s"
        gap = "-" if self.publish_gap is None else f"{self.publish_gap:.1f}s"
        return (
            f"kill -9 {self.reason} ({self.node}; queue leader before {self.leader_before}, "
            f"after {self.leader_after}; worker on {self.worker_on}, service on "
            f"{self.service_on}): STALL {stall}, first task published after it done in "
            f"{first}, publisher gap {gap}, "
            f"node down {self.up_at - self.killed_at:.1f}s"
        )


@dataclass
class ClusterReport:
    """A :class:`ChaosReport` plus the kills, the check through another node, and the times."""

    chaos: ChaosReport
    kills: list[Kill] = field(default_factory=list)
    check: dict[str, Any] = field(default_factory=dict)
    check_exit: int | None = None
    check_stderr: str = ""
    cluster_start_seconds: float = 0.0
    total_seconds: float = 0.0
    logdir: str = ""

    def lines(self) -> list[str]:
        out = [
            f"cluster of 3 started in {self.cluster_start_seconds:.1f}s; "
            f"total {self.total_seconds:.1f}s",
            *self.chaos.lines(),
            *(k.line() for k in self.kills),
            f"dlx check with node 0 dead: exit {self.check_exit}, management API "
            f"{self.check.get('management_url')} of {self.check.get('management_tried')}, "
            f"problems {self.check.get('problems')}",
        ]
        return out


class _Proc(P.Proc):
    """A chaos process whose app module is :mod:`tests.cluster.cluster_app` (the chaos app,
    with Celery's delayed-delivery step left out when ``CLUSTER_NO_DELAYED_DELIVERY=1``)."""

    def start(self) -> None:
        args = P.command(self.kind, self.name, self.concurrency)
        args[args.index("tests.chaos.chaos_app")] = "tests.cluster.cluster_app"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=P.ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.starts += 1
        self.started_at = time.monotonic()


class ClusterRun(ChaosRun):
    """A :class:`ChaosRun` whose broker is a private cluster and whose chaos is node kills."""

    def __init__(self, plan: ClusterPlan, workdir: Path, uid: str) -> None:
        super().__init__(plan.chaos_plan(), workdir, uid)
        self.cluster_plan = plan
        self.cluster = RabbitCluster(workdir / "rabbit")
        self.confirmed_at: dict[str, float] = {}

    def app(self) -> Any:
        if self._app is None:
            app = make_chaos_app(self.uid, self.redis.url, quorum=True)
            app.conf.broker_url = self.cluster.broker_url(PUBLISHER_ORDER)
            self._app = app
        return self._app

    def env_for(self, order: tuple[int, ...]) -> dict[str, str]:
        return {**self.env(), "DLX_TEST_BROKER": self.cluster.broker_url(order)}

    def start_processes(self) -> None:
        for kind, order in ((P.WORKER, WORKER_ORDER), (P.SERVICE, SERVICE_ORDER)):
            proc = _Proc(
                kind,
                f"{kind}-{self.uid}",
                self.env_for(order),
                self.logdir,
                self.cluster_plan.concurrency,
            )
            proc.start()
            self.procs.append(proc)

    def proc(self, kind: str) -> P.Proc:
        return next(p for p in self.procs if p.kind == kind)

    # -- which node is which -----------------------------------------------------------------

    def nodes_of(self, proc: P.Proc) -> list[RabbitNode]:
        """The nodes ``proc``'s main process has AMQP connections to, most used first."""
        if proc.proc is None:
            return []
        counts: dict[str, int] = {}
        try:
            conns = psutil.Process(proc.proc.pid).net_connections(kind="tcp")
        except psutil.Error:
            return []
        for c in conns:
            if c.raddr and c.status == psutil.CONN_ESTABLISHED:
                node = self.cluster.node_of_port(c.raddr.port)
                if node is not None and c.raddr.port == node.port:
                    counts[node.node] = counts.get(node.node, 0) + 1
        ranked = sorted(counts, key=lambda n: -counts[n])
        by_name = {n.node: n for n in self.cluster.nodes}
        return [by_name[name] for name in ranked]

    def leader(self) -> str | None:
        """The node leading the work queue (through any node's management API)."""
        for node in self.cluster.nodes:
            if node.pid is None:
                continue
            try:
                info = _get_json(f"{node.management_url}/api/queues/%2F/{self.names.work}")
            except OSError:
                continue
            leader = info.get("leader") or info.get("node")
            return str(leader) if leader else None
        return None

    def victim(self, reason: str) -> RabbitNode:
        leader = self.leader()
        if reason == KILL_WORKER_NODE:
            found = self.nodes_of(self.proc(P.WORKER))
        elif reason == KILL_SERVICE_NODE:
            found = self.nodes_of(self.proc(P.SERVICE))
        else:
            # A follower of the work queue; best one no process uses, else one the worker does
            # not use (a worker's node was the first kill already).
            worker = {n.node for n in self.nodes_of(self.proc(P.WORKER))}
            service = {n.node for n in self.nodes_of(self.proc(P.SERVICE))}
            followers = [n for n in self.cluster.nodes if n.node != leader]
            found = sorted(followers, key=lambda n: (n.node in worker, n.node in service))
        if not found:
            raise RuntimeError(f"no node found for kill of {reason}")
        return found[0]

    # -- the kills ---------------------------------------------------------------------------

    def kill_each(self, publishing: threading.Event) -> list[Kill]:
        plan = self.cluster_plan
        kills = []
        time.sleep(plan.first_kill)
        for reason in KILLS:
            node = self.victim(reason)
            kill = Kill(reason, node.node, self.leader(), time.time())
            kill.worker_on = [n.node for n in self.nodes_of(self.proc(P.WORKER))]
            kill.service_on = [n.node for n in self.nodes_of(self.proc(P.SERVICE))]
            node.kill()
            logger.warning("killed %s (%s)", node.node, reason)
            time.sleep(plan.down_seconds)
            node.restart()
            kill.up_at = time.time()
            kills.append(kill)
            time.sleep(plan.recover_seconds)
            kill.leader_after = self.leader()
            if not publishing.is_set():
                logger.warning("the stream ended before the kill of %s", reason)
        return kills

    def publish_stream(self, publishing: threading.Event) -> None:
        """Publish every message (confirmed) spread over ``publish_seconds``; each id's first
        publish time and confirm time are kept."""
        publisher = _Publisher(self.app(), self.names)
        interval = self.plan.publish_seconds / max(1, len(self.messages))
        start = time.monotonic()
        publishing.set()
        try:
            for i, message in enumerate(self.messages):
                ahead = start + i * interval - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                self.published_at[message.id] = time.time()
                if publisher.publish(message):
                    self.sent.add(message.id)
                    self.confirmed_at[message.id] = time.time()
                else:
                    self.unsent.append(message.id)
        finally:
            publisher.close()
            publishing.clear()

    def measure(self, kills: list[Kill]) -> None:
        """Each kill's stall and publisher gap, from the ledger and the confirm times."""
        _, entries = self.ledger_entries()
        done_at = {
            mid: min(e["at"] for e in runs if e["outcome"] == "done")
            for mid, runs in entries.items()
            if any(e["outcome"] == "done" for e in runs)
        }
        ended = sorted(e["at"] for runs in entries.values() for e in runs)
        for kill in kills:
            until = kill.up_at + self.cluster_plan.recover_seconds
            marks = [kill.killed_at, *(at for at in ended if kill.killed_at < at < until), until]
            kill.stall = max(b - a for a, b in itertools.pairwise(marks))
            after = [
                done_at[mid]
                for mid, at in self.published_at.items()
                if at >= kill.killed_at and mid in done_at
            ]
            kill.first_new_done = min(after) - kill.killed_at if after else None
            confirms = [at for at in self.confirmed_at.values() if at >= kill.killed_at]
            kill.publish_gap = min(confirms) - kill.killed_at if confirms else None

    # -- the check through another node ------------------------------------------------------

    def check_with_first_node_dead(self) -> tuple[int, dict[str, Any], str]:
        """Kill -9 node 0 (the first URL of the command's broker list and the first management
        URL) and run ``celery dlx check --json`` as a user would: it must use another node."""
        first = self.cluster.nodes[0]
        first.kill()
        management = ",".join(n.management_url for n in self.cluster.nodes)
        env = {**self.env_for(WORKER_ORDER), "CELERY_DLX_MANAGEMENT_URL": management}
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                "from celery_dlx.cli.main import main; main()",
                "-A",
                "tests.cluster.cluster_app",
                "check",
                "--json",
            ],
            cwd=P.ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        try:
            data = json.loads(done.stdout)
        except ValueError:
            data = {"unparsed": done.stdout[-2000:]}
        return done.returncode, data, done.stderr[-3000:]

    def cleanup(self) -> None:
        """Delete the ledger keys (the queues die with the private cluster)."""
        with contextlib.suppress(Exception):
            self.ledger.delete(*self.names.ledger_keys)


def _get_json(url: str) -> dict[str, Any]:
    import base64
    import urllib.request

    req = urllib.request.Request(url)
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    with urllib.request.urlopen(req, timeout=5) as resp:
        data = json.loads(resp.read())
    return data if isinstance(data, dict) else {}


def _supervise(run: ClusterRun, stop: threading.Event, exits: list[str]) -> None:
    """Start again a process that exited by itself (counted: none should)."""
    while not stop.wait(0.5):
        for proc in run.procs:
            if not proc.alive and proc.proc is not None:
                exits.append(f"{proc.name} exit {proc.proc.returncode}")
                proc.start()


def _stop_order(proc: P.Proc) -> int:
    return {P.WORKER: 0, P.SERVICE: 1}[proc.kind]


def _first_done(run: ClusterRun, timeout: float = 120.0) -> None:
    """Wait until the worker has run a task (it consumes), publishing one warm-up task."""
    from tests.chaos.harness import Message

    warm = Message(f"warmup-{run.uid}", "good")
    publisher = _Publisher(run.app(), run.names)
    try:
        publisher.publish(warm)
    finally:
        publisher.close()
    deadline = time.monotonic() + timeout
    while not run.ledger.hget(run.names.done, warm.id):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the worker ran no task within {timeout}s of its start")
        time.sleep(0.2)


def run_cluster(plan: ClusterPlan, uid: str | None = None) -> ClusterReport:
    """Run ``plan`` on a private 3-node cluster and return its accounting; every node and
    process this run started is stopped when it returns or raises."""
    uid = uid or uuid.uuid4().hex[:8]
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="dlx-cluster-"))
    with ExitStack() as stack:
        if not plan.keep_logs:
            stack.callback(_rmtree, workdir)
        run = ClusterRun(plan, workdir, uid)
        stack.callback(run.cluster.stop)
        run.cluster.start()
        cluster_start = time.monotonic() - started
        run.redis.start()
        stack.callback(run.redis.kill)
        stack.callback(run.cleanup)
        with Connection(run.cluster.broker_url(PUBLISHER_ORDER)) as conn:
            run.declare(conn)
        stack.callback(lambda: P.stop_all(run.procs, _stop_order))
        run.start_processes()
        exits: list[str] = []
        stop = threading.Event()
        supervisor = threading.Thread(target=_supervise, args=(run, stop, exits), daemon=True)
        supervisor.start()
        stack.callback(stop.set)
        _first_done(run)

        publishing = threading.Event()
        stream = threading.Thread(target=run.publish_stream, args=(publishing,), daemon=True)
        stream.start()
        kills = run.kill_each(publishing)
        stream.join(plan.publish_seconds + 600)

        from celery_dlx.wiring.runtime import get_runtime

        runtime = get_runtime(run.app())
        settle_start = time.monotonic()
        settled = run.settle(runtime)
        settle_seconds = time.monotonic() - settle_start
        check_exit, check, check_stderr = run.check_with_first_node_dead()
        run.cluster.nodes[0].restart()

        stop.set()
        P.stop_all(run.procs, _stop_order)
        with Connection(run.cluster.broker_url(PUBLISHER_ORDER)) as fresh:
            chaos = run.account(runtime, fresh)
        events = [
            P.Event(0.0, f"kill -9 {k.reason}", k.node, k.killed_at, k.up_at + plan.recover_seconds)
            for k in kills
        ]
        chaos.events = {f"kill -9 {k.reason}": 1 for k in kills}
        ledger_check(
            chaos,
            run.messages,
            run.sent,
            run.published_at,
            run.ledger_entries(),
            run.burials(runtime),
            events,
            budgets(run.names),
        )
        run.measure(kills)
        chaos.unexpected_exits = exits
        chaos.settled = settled
        chaos.settle_seconds = settle_seconds
        chaos.quorum = True
        report = ClusterReport(
            chaos,
            kills,
            check,
            check_exit,
            check_stderr,
            cluster_start_seconds=cluster_start,
            logdir=str(run.logdir) if plan.keep_logs else "",
        )
        report.total_seconds = time.monotonic() - started
    return report


def _rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":  # python -m tests.cluster.harness: one run, printed
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s %(name)s] %(message)s")
    result = run_cluster(ClusterPlan(keep_logs=os.environ.get("KEEP_LOGS") == "1"))
    print("\n".join(result.lines()))
    print("logs:", result.logdir)
