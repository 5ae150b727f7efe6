"""A chaos run: messages of every kind through workers, DLX services and drains under kill -9.

:func:`run_chaos` starts celery_dlx's own Redis (AOF, fsync always) on a free port, the run's
processes (:mod:`tests.chaos.processes`), publishes the messages (with publisher confirms)
while the monkey kills and restarts, lets the system settle, stops everything and accounts for
every message id:

- done: executed successfully at least once (the ledger, on a Redis the chaos never touches);
- buried: in the graveyard;
- pending: still parked in Redis or ready in a queue when the settle time ran out;
- lost: none of these. The run exists to show this is 0.

Duplicates are successful executions beyond the first one of a message (at-least-once).

Then the independent check (:func:`ledger_check`): each message's expected fate follows from its
kind alone (good, flaky and accepted foreign messages are done, poison is buried), and the
ledger each run of a task writes itself (:mod:`tests.chaos.chaos_app`) must agree: every message
expected done is done at least once and never buried; every poison message is buried exactly
once, never done; no failure of a Celery task runs past its budget (the runs a kill cut short
aside, whatever dies, celery_dlx's own Redis included), and a foreign consumer's only by one
run more per death of the service, the drain or the broker in its message's life (it cannot
tell a second copy of a retry from the first); a
message no chaos event touched (publish to end, see :func:`disturbed`) ran exactly as often as
its kind says (poison: its whole budget). Besides the monkey's random kills, crash points (``DLX_FAULT``) kill
the drain and the DLX service at least once in each window where a crash could lose or double a
message: claimed and not published, published and not acked, buried and not acked.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import re
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import redis
from kombu import Connection, Producer

from celery_dlx.broker.topology import dlx_queue
from celery_dlx.ops import obituaries
from celery_dlx.wiring.runtime import get_runtime
from tests.chaos import processes as P
from tests.chaos.chaos_app import BROKER_URL, LEDGER_URL, Names, chaos_settings, make_chaos_app
from tests.chaos.servers import RedisServer

logger = logging.getLogger("chaos")

#: Default share of each kind of message.
DEFAULT_MIX = {"good": 0.6, "flaky": 0.2, "poison": 0.05, "foreign": 0.15}
#: Actions without the RabbitMQ restart (the only ones allowed in the test suite).
PROCESS_ACTIONS = (
    P.KILL_WORKER,
    P.KILL_POOL_CHILD,
    P.KILL_SERVICE,
    P.KILL_DRAIN,
    P.KILL_FOREIGN,
    P.RESTART_REDIS,
)
#: Seconds a publish is retried (on new connections) before the message counts as unsent.
PUBLISH_PATIENCE = 180.0
#: Crash points armed per process (``<kind><index>``): each fires once, at its second reach.
DEFAULT_FAULTS: dict[str, list[str]] = {
    "service0": ["service.published@2", "service.buried@2"],
    "drain0": ["drain.claimed@2"],
    "drain1": ["drain.published@2"],
}
#: Seconds around a message's life in which a chaos event counts as touching it.
DISTURB_MARGIN = 0.5


@dataclass
class ChaosPlan:
    """What a chaos run does. Durations in seconds."""

    messages: int = 10_000
    mix: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_MIX))
    workers: int = 2
    concurrency: int = 2
    services: int = 1
    drains: int = 2
    foreign_consumers: int = 1
    publish_seconds: float = 30.0
    chaos_seconds: float = 60.0
    settle_seconds: float = 180.0
    gap: tuple[float, float] = (1.0, 4.0)
    actions: tuple[str, ...] = PROCESS_ACTIONS
    faults: dict[str, list[str]] = field(default_factory=lambda: dict(DEFAULT_FAULTS))
    rabbit_restarts: int = 0
    quorum: bool = False
    seed: int = 7
    keep_logs: bool = False
    #: The broker (and virtual host) of the run, for this process and the ones it starts.
    broker_url: str = BROKER_URL
    #: A private RabbitMQ node (:class:`tests.chaos.servers.RabbitNode`) serving
    #: ``broker_url``: the only kind ``rabbit_restarts`` may restart in the test suite.
    rabbit_node: Any = None


@dataclass
class Message:
    """One message of the run: its id, kind and how many times it fails before succeeding."""

    id: str
    kind: str
    fails: int = 0


def make_messages(plan: ChaosPlan, rng: random.Random) -> list[Message]:
    """The run's messages in a shuffled order; ``fails`` drawn per kind."""
    kinds = list(plan.mix)
    counts = [int(plan.messages * plan.mix[k]) for k in kinds]
    counts[0] += plan.messages - sum(counts)
    out = []
    for kind, n in zip(kinds, counts, strict=True):
        for i in range(n):
            if kind == "flaky":
                fails = rng.randint(1, 3)
            elif kind == "foreign":
                # Most succeed at once, some after rejects, some are never accepted (buried).
                fails = rng.choice([0, 0, 0, 0, 1, 2, 99])
            else:
                fails = 0
            out.append(Message(f"{kind}-{i}", kind, fails))
    rng.shuffle(out)
    return out


@dataclass
class ChaosReport:
    """The accounting of one run."""

    sent: int = 0
    unsent: int = 0
    done: int = 0
    buried: int = 0
    pending: int = 0
    lost: int = 0
    duplicates: int = 0
    duplicated_messages: int = 0
    max_executions: int = 0
    done_and_buried: int = 0
    buried_twice: int = 0
    runs: int = 0
    killed_runs: int = 0
    exact_checked: int = 0
    disturbed: int = 0
    good_buried: int = 0
    violations: list[str] = field(default_factory=list)
    #: Failures run past their budget (no allowance), each with the events of its life.
    past_budget: list[str] = field(default_factory=list)
    #: What was still parked when a run did not settle (see :func:`stuck_parked`).
    stuck_parked: list[str] = field(default_factory=list)
    by_kind: dict[str, dict[str, int]] = field(default_factory=dict)
    lost_ids: list[str] = field(default_factory=list)
    duplicate_ids: list[str] = field(default_factory=list)
    buried_twice_ids: list[str] = field(default_factory=list)
    pending_ids: list[str] = field(default_factory=list)
    events: dict[str, int] = field(default_factory=dict)
    #: Events after the chaos ended, while the run settled (crash points firing late).
    settle_events: list[str] = field(default_factory=list)
    unexpected_exits: list[str] = field(default_factory=list)
    monkey_errors: list[str] = field(default_factory=list)
    publish_seconds: float = 0.0
    settle_seconds: float = 0.0
    total_seconds: float = 0.0
    settled: bool = False
    quorum: bool = False
    logdir: str = ""
    #: Per violating message, the lines every process logged about it (what CI prints).
    violation_logs: dict[str, list[str]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def lines(self) -> list[str]:
        """A human summary."""
        out = [
            f"messages sent {self.sent} (unsent {self.unsent}), queues "
            f"{'quorum' if self.quorum else 'classic'}, runs {self.runs}",
            f"done {self.done}, buried {self.buried}, pending {self.pending}, LOST {self.lost}",
            f"duplicates {self.duplicates} extra executions over {self.duplicated_messages} "
            f"messages (at most {self.max_executions} executions of one); done and buried "
            f"{self.done_and_buried}; buried twice {self.buried_twice}",
            f"ledger: {self.runs} runs started, {self.killed_runs} killed mid-run; "
            f"{self.exact_checked} untouched messages held to exact run counts, "
            f"{self.disturbed} touched by chaos; good/flaky buried {self.good_buried}; "
            f"violations {len(self.violations)}",
            f"chaos events: {json.dumps(self.events, sort_keys=True)}; while settling: "
            f"{self.settle_events}",
            f"unexpected exits: {len(self.unexpected_exits)}; monkey errors: "
            f"{len(self.monkey_errors)}",
            f"publish {self.publish_seconds:.1f}s, settle {self.settle_seconds:.1f}s, "
            f"total {self.total_seconds:.1f}s, settled {self.settled}",
        ]
        for kind, counts in sorted(self.by_kind.items()):
            out.append(f"  {kind:8} {json.dumps(counts, sort_keys=True)}")
        out.extend(f"  past budget: {line}" for line in self.past_budget)
        out.extend(f"  still parked: {line}" for line in self.stuck_parked)
        if self.lost_ids:
            out.append(f"lost ids (first 20): {self.lost_ids[:20]}")
        if self.duplicate_ids:
            out.append(f"executed more than once (first 20): {self.duplicate_ids[:20]}")
        if self.buried_twice_ids:
            out.append(f"buried more than once (first 20): {self.buried_twice_ids[:20]}")
        if self.pending_ids:
            out.append(f"pending ids (first 20): {self.pending_ids[:20]}")
        for violation in self.violations[:20]:
            out.append(f"LEDGER VIOLATION: {violation}")
        for message_id, logged in self.violation_logs.items():
            out.append(f"what the processes logged about {message_id}:")
            out.extend(f"    {line}" for line in logged)
        return out


def budgets(names: Names) -> tuple[int, int]:
    """Runs a poison message gets before burial: Celery tasks, foreign-queue messages."""
    conf = chaos_settings(names, "redis://unused", quorum=False)
    foreign = conf["dlx_queues"][names.foreign]
    return (
        1 + conf["dlx_max_requeues"] + conf["dlx_max_parks"],
        1 + foreign["max_requeues"] + foreign["max_parks"],
    )


def expected(message: Message, celery_budget: int, foreign_budget: int) -> tuple[str, int]:
    """A message's fate and its runs in a world without chaos, from its kind alone."""
    if message.kind == "poison":
        return "buried", celery_budget
    if message.kind == "foreign" and message.fails >= foreign_budget:
        return "buried", foreign_budget
    return "done", message.fails + 1


def end_of(
    message: Message, mine: list[dict[str, Any]], burials: dict[str, list[int]], start: float
) -> float:
    """When a message's life ended (its last run or burial), epoch seconds."""
    buried = (ms / 1000 for ms in burials.get(message.id, []))
    return max([start, *(e["at"] for e in mine), *buried])


def life_of(
    message: Message,
    mine: list[dict[str, Any]],
    burials: dict[str, list[int]],
    start: float,
    events: list[P.Event],
) -> str:
    """A message's runs (run, attempt header, outcome, pid, seconds after its publish) and the
    chaos events of its life, for a violation's report."""
    end = end_of(message, mine, burials, start)
    runs = [
        (e["run"], e.get("attempt"), e["outcome"], e.get("pid"), round(e["at"] - start, 1))
        for e in sorted(mine, key=lambda e: e["run"])
    ]
    seen = [
        f"{e.action}@{e.wall - start:+.1f}s"
        for e in events
        if start - DISTURB_MARGIN <= e.wall <= end + DISTURB_MARGIN
    ]
    return f"runs {runs}; events {seen}"


def stuck_parked(runtime: Any, limit: int = 20) -> list[str]:
    """What is still parked (for a run that did not settle): entry id, due or lease time relative
    to now, and whether its metadata and body exist."""
    out = []
    now = time.time() * 1000
    for shard in runtime.parking.shards.every():
        keys = shard.parked
        for member, score in runtime.redis.zrange(keys.due, 0, limit - 1, withscores=True):
            has_meta = runtime.redis.hexists(keys.meta, member)
            has_body = runtime.redis.hexists(keys.body, member)
            name = member.decode() if isinstance(member, bytes) else str(member)
            out.append(f"{name} at {(score - now) / 1000:+.1f}s meta={has_meta} body={has_body}")
    return out


def logged_about(logdir: Path, message_ids: list[str], limit: int = 60) -> dict[str, list[str]]:
    """Per message id, the lines of every process's log that name it (file name first, sorted
    by their timestamps), so a violation's report says what each process did with it."""
    out: dict[str, list[str]] = {}
    for message_id in dict.fromkeys(message_ids):
        pattern = re.compile(rf"\b{re.escape(message_id)}\b")
        found = []
        for path in sorted(Path(logdir).glob("*.log")):
            text = path.read_text(errors="replace")
            found.extend(
                (line[:40], f"{path.stem.split('-')[0]}: {line[:400]}")
                for line in text.splitlines()
                if pattern.search(line)
            )
        out[message_id] = [line for _, line in sorted(found)][:limit]
    return out


def republishers_died(start: float, end: float, events: list[P.Event]) -> int:
    """How many processes that publish a foreign consumer's retries (the DLX service, the drain)
    or brokers died (kill -9, a crash point, a restart) within ``start`` .. ``end``: each may
    have published one retry a second time, which a consumer in another language cannot tell
    from the first (a Celery worker acks it unrun)."""
    kinds = (
        P.KILL_SERVICE,
        P.KILL_DRAIN,
        P.RESTART_RABBITMQ,
        f"{P.FAULT_PREFIX}service.",
        f"{P.FAULT_PREFIX}drain.",
    )
    return sum(
        1
        for e in events
        if e.action.startswith(kinds) and start - DISTURB_MARGIN <= e.wall <= end + DISTURB_MARGIN
    )


def disturbed(start: float, end: float, events: list[P.Event]) -> bool:
    """Whether a chaos event (epoch seconds ``wall``..``until``) overlaps ``start``..``end``."""
    return any(
        e.wall - DISTURB_MARGIN <= end and max(e.until, e.wall) + DISTURB_MARGIN >= start
        for e in events
    )


def ledger_check(
    report: ChaosReport,
    messages: list[Message],
    sent: set[str],
    published_at: dict[str, float],
    ledger: tuple[dict[str, int], dict[str, list[dict[str, Any]]]],
    burials: dict[str, list[int]],
    events: list[P.Event],
    budget: tuple[int, int],
) -> None:
    """Hold every sent message to the fate its kind expects, from the ledger (module doc)."""
    runs, entries = ledger
    violations = report.violations
    for message in messages:
        if message.id not in sent:
            continue
        fate, want_runs = expected(message, *budget)
        mine = entries.get(message.id, [])
        start = published_at.get(message.id, 0.0)
        done = sum(1 for e in mine if e["outcome"] == "done")
        buried = len(burials.get(message.id, []))
        started = runs.get(message.id, 0)
        if fate == "done":
            if done == 0:
                violations.append(f"{message.id} ({message.kind}) never done")
            if buried:
                report.good_buried += 1
                violations.append(
                    f"{message.id} ({message.kind}, fails {message.fails}) buried {buried}x; "
                    f"{life_of(message, mine, burials, start, events)}"
                )
        else:
            if buried != 1:
                violations.append(f"{message.id} ({message.kind}) buried {buried}x, not once")
            if done:
                violations.append(f"{message.id} ({message.kind}) done {done}x")
            # Chaos or not, a failure runs its budget once: the runs a kill cut short (started,
            # never finished) are not counted; past that, a Celery task never runs again (a
            # second copy of a retry is acked unrun, a redelivered original whose retry exists
            # too). A foreign consumer cannot tell a second copy of one retry from the first:
            # each death of the service, the drain or the broker in its message's life may add
            # one run (at-least-once, DESIGN.md guarantee 1).
            failed = sum(1 for e in mine if e["outcome"] == "failed")
            allowed = want_runs
            if message.kind.startswith("foreign"):
                allowed += republishers_died(start, end_of(message, mine, burials, start), events)
            if failed > want_runs:
                report.past_budget.append(
                    f"{message.id} ({message.kind}) failed {failed}x > {want_runs}; "
                    f"{life_of(message, mine, burials, start, events)}"
                )
            if failed > allowed:
                violations.append(
                    f"{message.id} ({message.kind}) failed {failed}x, past its budget of "
                    f"{want_runs} ({started - len(mine)} run(s) cut short by a kill, "
                    f"{allowed - want_runs} service, drain or broker death(s) in its life); "
                    f"{life_of(message, mine, burials, start, events)}"
                )
        end = end_of(message, mine, burials, start)
        if disturbed(start, end, events):
            report.disturbed += 1
            continue
        report.exact_checked += 1
        outcomes = [e["outcome"] for e in sorted(mine, key=lambda e: e["run"])]
        want = ["failed"] * (want_runs - (fate == "done")) + ["done"] * (fate == "done")
        if started != want_runs or outcomes != want:
            violations.append(
                f"{message.id} ({message.kind}, untouched by chaos) ran {started}x {outcomes}, "
                f"expected {want_runs}x {want}"
            )


class _Publisher:
    """Publishes the run's messages with confirms, on a new connection after any failure."""

    def __init__(self, app: Any, names: Names) -> None:
        self.app = app
        self.names = names
        self.conn: Any = None

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):  # a dead connection may fail to close
                self.conn.release()
        self.conn = None

    def publish(self, message: Message) -> bool:
        """Publish ``message`` until the broker confirms it (a restart is waited out)."""
        deadline = time.monotonic() + PUBLISH_PATIENCE
        while True:
            try:
                self._send(message)
                return True
            except Exception as exc:  # not confirmed: publish again (a duplicate at worst)
                self.close()
                if time.monotonic() > deadline:
                    logger.error("gave up publishing %s: %r", message.id, exc)
                    return False
                time.sleep(0.5)

    def _send(self, message: Message) -> None:
        if self.conn is None:
            conn = self.app.connection_for_write()
            conn.ensure_connection(max_retries=1)
            self.conn = conn
        if message.kind == "foreign":
            Producer(self.conn.default_channel).publish(
                json.dumps({"id": message.id, "fails": message.fails}).encode(),
                exchange="",
                routing_key=self.names.foreign,
                message_id=message.id,
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
            )
            return
        args: list[Any] = [message.id]
        if message.kind == "flaky":
            args.append(message.fails)
        self.app.send_task(
            f"chaos.{message.kind}",
            args=args,
            task_id=message.id,
            connection=self.conn,
            retry=False,
        )


class ChaosRun:
    """One run of ``plan`` (see :func:`run_chaos`)."""

    def __init__(self, plan: ChaosPlan, workdir: Path, uid: str) -> None:
        self.plan = plan
        self.workdir = workdir
        self.uid = uid
        self.names = Names(uid)
        self.rng = random.Random(plan.seed)
        self.messages = make_messages(plan, self.rng)
        self.redis = RedisServer(workdir / "redis")
        self.rabbit = P.Rabbit(plan.rabbit_node)
        self.ledger = redis.Redis.from_url(LEDGER_URL)
        self.logdir = workdir / "logs"
        self.logdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[P.Proc] = []
        self.sent: set[str] = set()
        self.published_at: dict[str, float] = {}
        self._app: Any = None
        self.unsent: list[str] = []
        self.stuck: list[str] = []

    # -- setup ------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "CHAOS_UID": self.uid,
            "CHAOS_REDIS": self.redis.url,
            "CHAOS_LEDGER": LEDGER_URL,
            "CHAOS_QUORUM": "1" if self.plan.quorum else "0",
            "DLX_TEST_BROKER": self.plan.broker_url,
            "PYTHONPATH": str(P.ROOT),
        }

    def app(self) -> Any:
        """The run's app in this process (made once)."""
        if self._app is None:
            self._app = make_chaos_app(
                self.uid, self.redis.url, quorum=self.plan.quorum, broker_url=self.plan.broker_url
            )
        return self._app

    def declare(self, conn: Connection) -> None:
        """Declare the work queue (with the service queue first) and the foreign queue."""
        app = self.app()
        channel = conn.channel()
        for queue in app.amqp.queues.values():
            queue(channel).declare()
        dlx_queue(
            self.names.foreign,
            exchange="",
            routing_key=self.names.foreign,
            dlx=self.names.exchange,
            service=self.names.service,
            quorum=self.plan.quorum,
        )(channel).declare()
        channel.close()

    def start_processes(self) -> None:
        env = self.env()
        plan = self.plan
        layout = [
            (P.WORKER, plan.workers),
            (P.SERVICE, plan.services),
            (P.DRAIN, plan.drains),
            (P.FOREIGN, plan.foreign_consumers),
        ]
        for kind, n in layout:
            for i in range(n):
                name = f"{kind}{i}-{self.uid}"
                faults = plan.faults.get(f"{kind}{i}")
                proc = P.Proc(kind, name, env, self.logdir, plan.concurrency, faults)
                proc.start()
                self.procs.append(proc)

    # -- publishing --------------------------------------------------------------------------

    def publish_all(self) -> None:
        """Publish every message (confirmed) spread over ``publish_seconds``."""
        publisher = _Publisher(self.app(), self.names)
        interval = self.plan.publish_seconds / max(1, len(self.messages))
        start = time.monotonic()
        try:
            for i, message in enumerate(self.messages):
                ahead = start + i * interval - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
                self.published_at[message.id] = time.time()
                if publisher.publish(message):
                    self.sent.add(message.id)
                else:
                    self.unsent.append(message.id)
        finally:
            publisher.close()

    # -- settling and accounting ------------------------------------------------------------

    def done_counts(self) -> dict[str, int]:
        raw = self.ledger.hgetall(self.names.done)
        return {k.decode(): int(v) for k, v in raw.items()}

    def ledger_entries(self) -> tuple[dict[str, int], dict[str, list[dict[str, Any]]]]:
        """The ledger: runs started per message, and each finished run's entry."""
        runs = {k.decode(): int(v) for k, v in self.ledger.hgetall(self.names.runs).items()}
        entries: dict[str, list[dict[str, Any]]] = {}
        for raw in self.ledger.lrange(self.names.log, 0, -1):
            entry = json.loads(raw)
            entries.setdefault(entry["id"], []).append(entry)
        return runs, entries

    def burials(self, runtime: Any) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for ob in obituaries.list_obituaries(runtime, limit=None):
            out.setdefault(ob.message_id, []).append(ob.buried_ms)
        return out

    def buried_counts(self, runtime: Any) -> Counter[str]:
        return Counter(ob.message_id for ob in obituaries.list_obituaries(runtime, limit=None))

    def settle(self, runtime: Any) -> bool:
        """Wait until every sent id is done or buried and nothing is parked; False at timeout."""
        deadline = time.monotonic() + self.plan.settle_seconds
        while time.monotonic() < deadline:
            try:
                rough = self.ledger.hlen(self.names.done) + obituaries.count(runtime)
                if rough >= len(self.sent) and runtime.store.count() == 0:
                    settled = set(self.done_counts()) | set(self.buried_counts(runtime))
                    if self.sent <= settled:
                        return True
            except redis.RedisError as exc:
                logger.warning("settle check failed (%r)", exc)
            time.sleep(1.0)
        try:
            self.stuck = stuck_parked(runtime)
        except redis.RedisError as exc:
            self.stuck = [f"could not read the parked entries ({exc!r})"]
        return False

    def pending(self, runtime: Any, conn: Connection) -> set[str]:
        """Ids still parked, or ready in a queue of the run (consumers stopped)."""
        found = {m.message_id.split("@")[0] for m in runtime.store.peek(limit=10 * len(self.sent))}
        channel = conn.channel()
        for queue in self.names.queues:
            while (msg := channel.basic_get(queue, no_ack=True)) is not None:
                headers = msg.headers or {}
                found.add(str(headers.get("id") or msg.properties.get("message_id")))
        channel.close()
        return found

    def account(self, runtime: Any, conn: Connection) -> ChaosReport:
        done = self.done_counts()
        buried = self.buried_counts(runtime)
        pending = self.pending(runtime, conn) - set(done) - set(buried)
        report = ChaosReport(sent=len(self.sent), unsent=len(self.unsent), quorum=self.plan.quorum)
        report.done = sum(1 for m in self.sent if m in done)
        report.buried = sum(1 for m in self.sent if m in buried and m not in done)
        report.pending = len(pending & self.sent)
        report.pending_ids = sorted(pending & self.sent)
        lost = sorted(
            m for m in self.sent if m not in done and m not in buried and m not in pending
        )
        report.lost, report.lost_ids = len(lost), lost
        report.duplicates = sum(n - 1 for n in done.values() if n > 1)
        report.duplicated_messages = sum(1 for n in done.values() if n > 1)
        report.max_executions = max(done.values(), default=0)
        report.done_and_buried = sum(1 for m in done if m in buried)
        report.buried_twice = sum(1 for n in buried.values() if n > 1)
        report.duplicate_ids = sorted(m for m, n in done.items() if n > 1)
        report.buried_twice_ids = sorted(m for m, n in buried.items() if n > 1)
        report.runs = sum(int(v) for v in self.ledger.hvals(self.names.runs))
        report.killed_runs = report.runs - self.ledger.llen(self.names.log)
        report.by_kind = self._by_kind(done, buried, pending)
        return report

    def _by_kind(
        self, done: dict[str, int], buried: Counter[str], pending: set[str]
    ) -> dict[str, dict[str, int]]:
        out: dict[str, dict[str, int]] = {}
        for message in self.messages:
            if message.id not in self.sent:
                continue
            kind = message.kind if message.fails < 99 else "foreign-poison"
            row = out.setdefault(kind, Counter())
            row["sent"] += 1
            if message.id in done:
                row["done"] += 1
            elif message.id in buried:
                row["buried"] += 1
            elif message.id in pending:
                row["pending"] += 1
            else:
                row["lost"] += 1
        return {k: dict(v) for k, v in out.items()}

    # -- teardown ----------------------------------------------------------------------------

    def cleanup(self) -> None:
        """Delete the run's ledger keys, queues and exchanges (the broker started first)."""
        self.rabbit.ensure_running()
        self.ledger.delete(*self.names.ledger_keys)
        with Connection(self.plan.broker_url) as conn:
            self._delete_topology(conn)

    def _delete_topology(self, conn: Connection) -> None:
        channel = conn.channel()
        for queue in self.names.queues:
            try:
                channel.queue_delete(queue)
            except Exception:  # already gone: the channel closed, take another
                channel = conn.channel()
        for exchange in self.names.exchanges:
            try:
                channel.exchange_delete(exchange)
            except Exception:
                channel = conn.channel()
        channel.close()


def _stop_order(proc: P.Proc) -> int:
    # Producers of work stop first (drains, foreign), then workers, the service last: it acks
    # what the others dead-lettered while stopping.
    return {P.DRAIN: 0, P.FOREIGN: 1, P.WORKER: 2, P.SERVICE: 3}[proc.kind]


@contextmanager
def _workdir(keep: bool) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="dlx-chaos-"))
    try:
        yield path
    finally:
        if not keep:
            shutil.rmtree(path, ignore_errors=True)


def run_chaos(plan: ChaosPlan, uid: str | None = None) -> ChaosReport:
    """Run ``plan`` and return its accounting. The RabbitMQ node is running when this returns,
    whatever happened (``rabbitmqctl start_app`` + ``await_startup`` if the run stopped it)."""
    import uuid

    uid = uid or uuid.uuid4().hex[:8]
    started = time.monotonic()
    with ExitStack() as stack:
        workdir = stack.enter_context(_workdir(plan.keep_logs))
        run = ChaosRun(plan, workdir, uid)
        stack.callback(run.rabbit.ensure_running)
        run.redis.start()
        stack.callback(run.redis.kill)
        conn = stack.enter_context(Connection(plan.broker_url))
        stack.callback(run.cleanup)
        run.declare(conn)
        stack.callback(lambda: P.stop_all(run.procs, _stop_order))
        run.start_processes()
        monkey = P.Monkey(
            procs=run.procs,
            redis=run.redis,
            rabbit=run.rabbit,
            actions=plan.actions,
            gap=plan.gap,
            rng=random.Random(plan.seed + 1),
            rabbit_limit=plan.rabbit_restarts,
            act_until=time.monotonic() + plan.chaos_seconds,
        )
        monkey.start()
        stack.callback(monkey.stop)
        chaos_end = time.monotonic() + plan.chaos_seconds
        run.publish_all()
        publish_seconds = time.monotonic() - started
        while time.monotonic() < chaos_end:
            time.sleep(0.2)
        # The monkey goes on supervising while the run settles: a crash point armed in a
        # restarted process can fire late, and nothing would start that process again.
        monkey.calm()
        calm_at = len(monkey.events)
        run.rabbit.ensure_running()
        if run.redis.proc is None:
            run.redis.start()
        settle_start = time.monotonic()
        runtime = get_runtime(run.app())
        settled = run.settle(runtime)
        settle_seconds = time.monotonic() - settle_start
        monkey.stop()
        if not settled:  # kept, with every process's stacks: what was it waiting on?
            P.dump_stacks(run.procs, run.logdir)
            kept = Path(tempfile.mkdtemp(prefix="dlx-chaos-unsettled-")) / "logs"
            shutil.copytree(run.logdir, kept)
        P.stop_all(run.procs, _stop_order)
        with Connection(plan.broker_url) as fresh:
            report = run.account(runtime, fresh)
        report.events = monkey.counts()
        report.settle_events = [f"{e.action} {e.target}" for e in monkey.events[calm_at:]]
        ledger_check(
            report,
            run.messages,
            run.sent,
            run.published_at,
            run.ledger_entries(),
            run.burials(runtime),
            monkey.events,
            budgets(run.names),
        )
        report.violation_logs = logged_about(
            run.logdir, [v.split(" ", 1)[0] for v in report.violations[:5]]
        )
        report.unexpected_exits = monkey.unexpected_exits
        report.monkey_errors = monkey.errors
        report.publish_seconds = publish_seconds
        report.settle_seconds = settle_seconds
        report.settled = settled
        report.stuck_parked = run.stuck
        report.logdir = str(run.logdir) if plan.keep_logs else ""
        if not settled:
            report.logdir = str(kept)
        report.total_seconds = time.monotonic() - started
        return report
