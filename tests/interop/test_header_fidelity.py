"""Every copy celery_dlx republishes carries every user header with its producer's field type and
value, and no valid header stops the DLX service (issue 21).

Publishers on four real clients (Go amqp091-go, Node amqplib, Ruby bunny, Python pika) send
messages whose headers use every field type the client writes, with boundary values (see the
``publish-all`` mode of each program in ``tests/interop``). Each goes to one queue per consumer
client (Go, Node, Ruby, pika): 16 publisher/consumer pairs, each a queue with celery_dlx's
dead-letter topology. Every consumer rejects everything with requeue=false; the real DLX service
(a thread) and drain requeue once, park once, then bury; then the graveyard is replayed and the
cycle runs again: six deliveries per message. The matrix runs twice: parked retries wait in Redis
(republished by the drain), then in the broker (``dlx_delay_backend = "ttl"``: the TTL ladder). Each consumer prints every header as its client
decoded it (type and canonical value, nested ones too), and every later delivery must equal the
first one, header by header, but for celery_dlx's own ``x-dlx-*`` headers; none may carry the
broker's ``x-death``, ``x-first-death-*``, ``x-last-death-*`` (the consumer's reject dead-letters
into the service queue, so the consumer never sees those on a first delivery either).

The whole matrix runs once per module (one service, one drain, four consumers); each pair is a
test of its own, failing with the list of cells that changed. A summary table (cells compared,
changed type, changed value, per pair) is printed at the end of the module.

A separate test publishes the hostile timestamps a Go service writes (``time.Unix(-86400, 0)``,
which amqp091-go writes as the uint64 wrap-around, and the year 10000) next to an innocent message
of another queue: the service must stay up, its queue must end empty, and each message must meet
the policy's fate with its headers intact.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection

from celery_dlx.broker.ladder import delay_queue_name
from celery_dlx.broker.topology import dlx_queue
from celery_dlx.fates import BURIED, PARKED, REQUEUED
from celery_dlx.ops import obituaries
from celery_dlx.ops.replay import replay
from celery_dlx.policy.durations import ladder_ms
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.conftest import BROKER_URL, REDIS_URL
from tests.integration.dlx_apps import DELAY_BACKENDS, TEST_LADDER
from tests.integration.service_app import service_settings
from tests.interop import clients
from tests.interop.fidelity import (
    CYCLE,
    EXPECTED,
    MessageReport,
    Watched,
    by_message,
    service_and_drain,
    wait_for,
)

pytestmark = pytest.mark.integration

CLIENTS = ("go", "node", "ruby", "pika")
#: 1 requeue, 1 park, then buried: three deliveries per message per round.
POLICY = {"max_requeues": 1, "max_parks": 1, "backoff": [0.2]}
#: Seconds one round (every message buried) may take before the run reports what it has.
ROUND_TIMEOUT = 90.0


def queue_name(publisher: str, consumer: str, uid: str) -> str:
    return f"hf-{publisher}-{consumer}-{uid}"


@dataclass
class Matrix:
    """What one run of the whole publisher x consumer matrix saw."""

    uid: str
    backend: str
    clients: tuple[str, ...]
    deliveries: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # per consumer
    consumer_errors: dict[str, str] = field(default_factory=dict)
    publish_errors: dict[str, str] = field(default_factory=dict)
    service: Watched | None = None
    drainer: Watched | None = None
    rounds: list[str] = field(default_factory=list)  # how each round ended
    seconds: float = 0.0

    def reports(self, publisher: str, consumer: str) -> list[MessageReport]:
        seen = by_message(
            self.deliveries.get(consumer, []), queue_name(publisher, consumer, self.uid)
        )
        ids = clients.ALL_TYPES_MESSAGES[publisher]
        ladder = self.backend == "ttl"
        out = [MessageReport.of(mid, seen.pop(mid, []), ladder=ladder) for mid in ids]
        out.extend(MessageReport.of(mid, ds, ladder=ladder) for mid, ds in seen.items())
        return out

    def run_problems(self, publisher: str, consumer: str) -> list[str]:
        """What went wrong for the whole run, as it touches this pair."""
        out = []
        for watched in (self.service, self.drainer):
            died = watched.died() if watched else None
            if died:
                out.append(died)
        out.extend(f"round {i + 1}: {r}" for i, r in enumerate(self.rounds) if r != "done")
        if publisher in self.publish_errors:
            out.append(f"the {publisher} publisher failed: {self.publish_errors[publisher]}")
        if consumer in self.consumer_errors:
            out.append(f"the {consumer} consumer failed: {self.consumer_errors[consumer]}")
        return out


def _graveyard_counts(runtime: Runtime) -> dict[str, int]:
    return {q: n for q, n, _ in obituaries.queues(runtime)}


def _cleanup(uid: str, queues: list[str]) -> None:
    delays = [delay_queue_name(q, step) for q in queues for step in ladder_ms(TEST_LADDER)]
    with Connection(BROKER_URL) as conn:
        channel = conn.channel()
        for kind, name in [
            *(("queue", n) for n in [*queues, *delays, f"dead-{uid}"]),
            *(("exchange", n) for n in [*queues, f"dlx-{uid}"]),
        ]:
            try:
                getattr(channel, f"{kind}_delete")(name)
            except Exception:  # an error closes the channel: the next name needs a new one
                channel = conn.channel()
    client = redis.Redis.from_url(REDIS_URL)
    for key in client.scan_iter(match="{" + f"test-{uid}" + "}*", count=1000):
        client.delete(key)
    client.close()


def _run_matrix(
    matrix: Matrix, app: Celery, go: Path | None, workdir: Path, queues: dict[tuple[str, str], str]
) -> None:
    runtime = get_runtime(app)
    present = matrix.clients
    with contextlib.ExitStack() as stack:
        consumers = {}
        for c in present:
            command = clients.all_types_command(
                c, go, "consume-typed", *(queues[p, c] for p in present)
            )
            consumers[c] = stack.enter_context(clients.consuming(c, command, workdir))
        service, drainer = stack.enter_context(service_and_drain(app, runtime))
        matrix.service, matrix.drainer = service, drainer

        for p in present:
            by_omit: dict[str, list[str]] = {}
            for c in present:
                by_omit.setdefault(clients.UNREADABLE[c] or "-", []).append(queues[p, c])
            for omit, targets in by_omit.items():
                done = subprocess.run(
                    clients.all_types_command(p, go, "publish-all", omit, *targets),
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                if done.returncode != 0:
                    matrix.publish_errors[p] = done.stderr.strip()[-2000:]

        def expected(round_: int) -> dict[str, int]:
            out = {}
            for (p, c), q in queues.items():
                if p not in matrix.publish_errors and consumers[c].alive():
                    out[q] = round_ * len(clients.ALL_TYPES_MESSAGES[p])
            return out

        def buried(round_: int) -> bool:
            for c in consumers.values():
                c.poll()
            counts = _graveyard_counts(runtime)
            return all(counts.get(q, 0) >= n for q, n in expected(round_).items())

        def give_up() -> str | None:
            return service.died() or drainer.died()

        matrix.rounds.append(wait_for(lambda: buried(1), give_up, ROUND_TIMEOUT) or "done")
        if matrix.rounds[-1] == "done":
            replay(runtime, everything=True)
            matrix.rounds.append(wait_for(lambda: buried(2), give_up, ROUND_TIMEOUT) or "done")
        time.sleep(0.5)  # nothing more may come
        for c, consumer in consumers.items():
            matrix.deliveries[c] = list(consumer.poll())
            errors = consumer.stderr().strip()
            if not consumer.alive() or errors:
                matrix.consumer_errors[c] = errors[-2000:] or "exited"


@pytest.fixture(scope="module", params=DELAY_BACKENDS)
def matrix(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[Matrix]:
    """Run the whole matrix once per delay backend; each pair's test reads its part."""
    backend: str = request.param
    present = tuple(c for c in CLIENTS if clients.available(c))
    uid = uuid.uuid4().hex[:10]
    workdir = tmp_path_factory.mktemp(f"header-fidelity-{backend}")
    go = clients.build_go(workdir) if "go" in present else None
    queues = {(p, c): queue_name(p, c, uid) for p in present for c in present}
    matrix = Matrix(uid, backend, present)
    app = Celery(f"fidelity-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(
        service_settings(uid),
        dlx_queues={q: POLICY for q in queues.values()},
        dlx_delay_backend=backend,
        dlx_ttl_ladder=TEST_LADDER,
    )
    try:
        with Connection(BROKER_URL) as conn:
            for q in queues.values():
                dlx_queue(q, dlx=f"dlx-{uid}", service=f"dead-{uid}")(conn.channel()).declare()
        started = time.monotonic()
        _run_matrix(matrix, app, go, workdir, queues)
        matrix.seconds = time.monotonic() - started
        yield matrix
    finally:
        _cleanup(uid, list(queues.values()))
        _summary(matrix, workdir, request)


def _summary(matrix: Matrix, workdir: Path, request: pytest.FixtureRequest) -> None:
    """The table of cells compared and changed per pair, on the terminal and in a JSON file."""
    rows, details = [], {}
    for p in matrix.clients:
        for c in matrix.clients:
            reports = matrix.reports(p, c)
            counts = sum((r.counts() for r in reports), Counter())
            seen = sum(len(r.labels) for r in reports)
            want = len(clients.ALL_TYPES_MESSAGES[p]) * len(EXPECTED)
            cells = sum(r.cells for r in reports)
            rows.append(
                f"{p:>5} -> {c:<5} {seen:>3}/{want:<3} {cells:>6} {counts['type']:>6} "
                f"{counts['value']:>6} {counts['missing']:>6} {counts['added']:>6} "
                f"{sum(len(r.broker) for r in reports):>6}"
            )
            details[f"{p}->{c}"] = {r.message_id: r.problems() for r in reports}
    path = workdir / f"header-fidelity-{matrix.backend}.json"
    path.write_text(json.dumps(details, indent=1, ensure_ascii=False))
    reporter = request.config.pluginmanager.getplugin("terminalreporter")
    capture = request.config.pluginmanager.getplugin("capturemanager")
    if reporter is None:
        return
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        reporter.write_line("")
        reporter.write_sep(
            "-", f"header fidelity, parks in {matrix.backend} ({matrix.seconds:.0f}s)"
        )
        reporter.write_line(
            "publisher->consumer  deliveries  cells   type  value missing  added x-death"
        )
        for row in rows:
            reporter.write_line(row)
        reporter.write_line(
            f"cells: user header paths of the first delivery x copies; details: {path}"
        )


@pytest.mark.parametrize("consumer", CLIENTS)
@pytest.mark.parametrize("publisher", CLIENTS)
def test_every_copy_keeps_every_header(publisher: str, consumer: str, matrix: Matrix) -> None:
    clients.require(publisher)
    clients.require(consumer)
    problems = matrix.run_problems(publisher, consumer)
    for report in matrix.reports(publisher, consumer):
        problems.extend(report.problems())
    head = f"{publisher} -> {consumer}, parks in {matrix.backend}:\n"
    assert not problems, head + "\n".join(problems)


# -- hostile timestamps ---------------------------------------------------------------------------

#: The Go messages with timestamps py-amqp cannot make a datetime of, and the value each carries.
HOSTILE = {"go-hostile-1969": "-86400", "go-hostile-10000": "253402300800"}


def test_hostile_timestamps_leave_the_service_up(
    uid: str,
    key_prefix: str,
    cleanup_queues: list[str],
    broker: Any,
    tmp_path: Path,
) -> None:
    clients.require("go")
    clients.require("pika")
    go = clients.build_go(tmp_path)
    assert key_prefix == service_settings(uid)["dlx_key_prefix"]
    hostile, innocent = f"hostile-{uid}", f"innocent-{uid}"
    cleanup_queues.extend([hostile, innocent, f"dead-{uid}"])
    cleanup_queues.extend(f"exchange:{n}" for n in (hostile, innocent, f"dlx-{uid}"))
    for q in (hostile, innocent):
        dlx_queue(q, dlx=f"dlx-{uid}", service=f"dead-{uid}")(broker.channel()).declare()
    app = Celery(f"hostile-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(service_settings(uid), dlx_queues={hostile: POLICY, innocent: POLICY})
    runtime = get_runtime(app)
    command = clients.all_types_command("go", go, "consume-typed", hostile, innocent)
    expected = {**dict.fromkeys(HOSTILE, hostile), "pika-all": innocent}

    problems: list[str] = []
    with clients.consuming("go", command, tmp_path) as consumer:
        with service_and_drain(app, runtime) as (service, drainer):
            for cmd in (
                clients.all_types_command("go", go, "publish-hostile", hostile),
                clients.all_types_command("pika", None, "publish-all", "-", innocent),
            ):
                subprocess.run(cmd, check=True, timeout=60)
            ended = wait_for(
                lambda: obituaries.count(runtime) >= len(expected),
                lambda: service.died() or drainer.died(),
                ROUND_TIMEOUT,
            )
            if ended and not (service.died() or drainer.died()):
                problems.append(f"waiting for {len(expected)} burials: {ended}")
            time.sleep(0.5)
            alive = service.alive()
        # stopped: a dead letter the service held unacked is back in the queue and counted
        depth = broker.channel().queue_declare(f"dead-{uid}", passive=True).message_count
        consumer.poll()
        consumer_errors = consumer.stderr().strip()

    for watched in (service, drainer):
        if watched.died():
            problems.append(watched.died() or "")
    if not alive:
        problems.append("the DLX service thread was not running at the end")
    if depth:
        problems.append(f"the service queue dead-{uid} holds {depth} dead letters afterwards")
    if consumer_errors:
        problems.append(f"the Go consumer failed: {consumer_errors[-2000:]}")
    buried = {ob.message_id: ob for ob in obituaries.list_obituaries(runtime, limit=None)}
    for mid, queue in expected.items():
        ob = buried.get(mid)
        if ob is None:
            problems.append(f"{mid} (queue {queue}) is not in the graveyard")
            continue
        fates = [a.fate for a in ob.attempts]
        if fates != [REQUEUED, PARKED, BURIED] or ob.queue != queue:
            problems.append(
                f"{mid}: fates {fates} in {ob.queue}, expected requeued, parked, buried"
            )
        seen = by_message(consumer.deliveries, queue).get(mid, [])
        problems.extend(MessageReport.of(mid, seen).problems(CYCLE))  # no replay here
        if mid in HOSTILE and seen:
            got = seen[0]["headers"].get("go.time.hostile", {}).get("value")
            if got != HOSTILE[mid]:
                problems.append(f"{mid}: the first delivery's timestamp reads {got!r}")
    assert not problems, "\n".join(problems)
