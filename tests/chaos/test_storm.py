"""The day celery_dlx exists for, kept short: a burial storm fills a small Redis (issue 36).

A private Redis (``maxmemory`` :data:`MAXMEMORY_MB` MB, ``noeviction``), one prefork worker ``-c 2``
and a separate ``celery dlx service``; :data:`POISON` poison tasks with 1 KB payloads in
``dlx_bury_on``. The graveyard fills Redis and the dead-letter path stalls; then :data:`FLAKY`
unrelated flaky tasks fail once (parked for 1 s) and get their backoff plus :data:`FLAKY_SLACK`
seconds to succeed; ``dlx check`` must report the stall (exit 7); an operator then tries ``dlx
purge --all`` on the full Redis and finally raises ``maxmemory``, and the service finishes by
itself. An independent ledger in the shared Redis counts every run.

The storm runs once (a module fixture, about a minute); each test checks one promise. Two depend
on the graveyard's budget and purge on a full Redis (DESIGN guarantee 11), which the graveyard
store does not have yet: they are strict xfails naming that work, so they turn into failures the
day it lands and the marks must go.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from kombu import Connection

from celery_dlx.store.graveyard import Filters
from celery_dlx.wiring.runtime import get_runtime
from tests.chaos.storm import (
    CLI,
    ROOT,
    dlx_check,
    env_of,
    ledger,
    refuses_writes,
    small_redis,
    start_service,
    start_worker,
    wait_for,
)
from tests.chaos.storm_app import FLAKY_BACKOFF, LEDGER_URL, Names, make_storm_app
from tests.conftest import BROKER_URL, forget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

POISON = 2500
FLAKY = 100
MAXMEMORY_MB = 12
#: Seconds a flaky task may take past its backoff (the issue's bound).
FLAKY_SLACK = 10.0
#: What the graveyard budget and purge on a full Redis are waiting for.
GRAVEYARD_WORK = (
    "graveyard budget and purge on a full Redis (issue 36 parts 3-4, the graveyard store): "
    "without a budget the graveyard takes every byte, so refused parks wait behind the poison "
    "in the service queue, and purge appends to the history before it deletes"
)


@dataclass
class Storm:
    """What the storm left: ledger, checks, obituaries, timings and logs."""

    names: Names
    runs: dict[str, dict[str, float]] = field(default_factory=dict)
    check_during: tuple[int, dict[str, Any]] = (0, {})
    check_after: tuple[int, dict[str, Any]] = (0, {})
    stalled: bool = False
    obituary_ids: list[str] = field(default_factory=list)
    buried_messages: list[str] = field(default_factory=list)
    purge: dict[str, Any] = field(default_factory=dict)
    service_left: int = -1
    work_left: int = -1
    seconds: float = 0.0
    worker_log: str = ""
    service_log: str = ""


def _depth(conn: Connection, queue: str) -> int:
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue, passive=True).message_count)
    finally:
        channel.close()


def _purge(names: Names, url: str, client: redis.Redis, obituaries: int) -> dict[str, Any]:
    """``dlx purge --all --yes`` on the full Redis: its exit code and the bytes it freed."""
    before = int(client.info("memory")["used_memory"])
    done = subprocess.run(
        [*CLI, "-A", "tests.chaos.storm_app", "purge", "--all", "--yes", "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env_of(names, url)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    after = int(client.info("memory")["used_memory"])
    return {
        "rc": done.returncode,
        "freed": before - after,
        "obituaries": obituaries,
        "output": (done.stdout + done.stderr).decode(errors="replace")[-1500:],
    }


def _latencies(storm: Storm) -> dict[str, float]:
    """Seconds from a flaky task's first run to its success: median, max, and how many late."""
    took = sorted(v["done"] - v["first"] for k, v in storm.runs.items() if "done" in v)
    if not took:
        return {}
    late = sum(1 for t in took if t > FLAKY_BACKOFF + FLAKY_SLACK)
    return {"median": round(took[len(took) // 2], 2), "max": round(took[-1], 2), "late": late}


@pytest.fixture(scope="module")
def storm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Storm]:
    uid = uuid.uuid4().hex[:10]
    names = Names(uid)
    workdir = tmp_path_factory.mktemp("storm")
    result = Storm(names)
    started = time.monotonic()
    shared = redis.Redis.from_url(LEDGER_URL)
    conn = Connection(BROKER_URL)
    try:
        with small_redis(workdir / "redis", MAXMEMORY_MB) as server:
            client = server.client()
            worker = start_worker(names, server.url, workdir / "worker.log")
            service = start_service(names, server.url, workdir / "service.log")
            try:
                wait_for(lambda: " ready." in worker.text(), "the worker", 60)
                app = make_storm_app(uid, server.url)
                payload = "x" * 1024
                with app.producer_or_acquire() as producer:
                    for i in range(POISON):
                        app.send_task(
                            "storm.poison",
                            (f"p{i}", payload),
                            task_id=f"p{i}-{uid}",
                            producer=producer,
                        )
                wait_for(lambda: shared.hlen(names.runs) == POISON, "every poison's run", 90)
                # The graveyard fills Redis: the stall.
                result.stalled = bool(
                    wait_for(lambda: refuses_writes(client), "Redis to refuse writes", 60)
                )
                # Unrelated flaky tasks fail during the stall: each is due again after its 1 s
                # backoff, and is given that plus FLAKY_SLACK to succeed, before anyone helps.
                with app.producer_or_acquire() as producer:
                    for n in range(FLAKY):
                        app.send_task(
                            "storm.flaky", (f"f{n}",), task_id=f"f{n}-{uid}", producer=producer
                        )
                wait_for(
                    lambda: shared.hlen(names.runs) == POISON + FLAKY, "the flaky tasks' runs", 60
                )
                with contextlib.suppress(AssertionError):
                    wait_for(
                        lambda: shared.hlen(names.done_at) == FLAKY,
                        "the flaky tasks' successes",
                        FLAKY_BACKOFF + FLAKY_SLACK + 1,
                    )
                result.check_during = dlx_check(names, server.url)
                graveyard = get_runtime(app).graveyard
                result.purge = _purge(names, server.url, client, graveyard.count())
                # The operator raises maxmemory (what ended the run); the service resumes.
                client.config_set("maxmemory", 512 * 1048576)
                purged = result.purge["rc"] == 0
                wait_for(
                    lambda: (
                        _depth(conn, names.service) == 0 and shared.hlen(names.done_at) == FLAKY
                    ),
                    "the service queue drained and every flaky task done",
                    90,
                )
                ids = graveyard.ids(Filters(), limit=None)
                result.obituary_ids = list(ids)
                loaded = graveyard.load(ids)
                result.buried_messages = [o.message_id for o in loaded if o is not None]
                if not purged:
                    wait_for(lambda: graveyard.count() >= POISON, "every poison buried", 60)
                    result.buried_messages = [
                        o.message_id
                        for o in graveyard.load(graveyard.ids(Filters(), limit=None))
                        if o is not None
                    ]
                result.check_after = dlx_check(names, server.url)
            finally:
                worker.stop()
                service.stop()
                result.worker_log = worker.text()
                result.service_log = service.text()
                client.close()
            result.runs = ledger(shared, names)
            result.service_left = _depth(conn, names.service)
            result.work_left = _depth(conn, names.work)
    finally:
        result.seconds = time.monotonic() - started
        conn.release()
        shared.close()
        forget(uid)
    print(
        json.dumps(
            {
                "seconds": round(result.seconds, 1),
                "check_during_rc": result.check_during[0],
                "check_during_problems": result.check_during[1].get("problems"),
                "redis_during": result.check_during[1].get("redis"),
                "backlog_during": result.check_during[1].get("backlog"),
                "purge": {k: v for k, v in result.purge.items() if k != "output"},
                "obituaries": len(result.buried_messages),
                "flaky_latency_s": _latencies(result),
                "refused_after": result.check_after[1].get("refused"),
                "redis_after": result.check_after[1].get("redis"),
            },
            indent=1,
        )
    )
    yield result


def test_no_bury_on_task_runs_twice(storm: Storm) -> None:
    poison = {k: v["runs"] for k, v in storm.runs.items() if k.startswith("p")}
    assert len(poison) == POISON
    again = {k: n for k, n in poison.items() if n != 1}
    assert again == {}, f"{len(again)} poison tasks ran again"


def test_nothing_is_lost(storm: Storm) -> None:
    flaky = {k: v for k, v in storm.runs.items() if k.startswith("f")}
    assert len(flaky) == FLAKY and all(v["runs"] == 2 and "done" in v for v in flaky.values())
    assert (storm.work_left, storm.service_left) == (0, 0)
    buried = set(storm.buried_messages)
    if storm.purge.get("rc") != 0:  # nothing purged: every poison message is in the graveyard
        assert buried == {f"p{i}-{storm.names.uid}" for i in range(POISON)}


def test_dlx_check_fails_during_the_stall_and_passes_after(storm: Storm) -> None:
    assert storm.stalled
    rc, report = storm.check_during
    assert rc == 7, report
    assert "redis-full" in [p["kind"] for p in report["problems"]], report
    assert report["redis"]["writable"] is False
    rc, report = storm.check_after
    assert rc == 0, report


def test_one_log_line_per_outage_and_no_traceback_for_the_refusals(storm: Storm) -> None:
    worker, service = storm.worker_log, storm.service_log
    # Two pool processes, one line each at most per cause (plus a summary a minute).
    assert worker.count("cause records of burials (stashed for the DLX service) failing") <= 2
    assert "could not stash the cause" not in worker
    assert service.count("unavailable (") <= 2, service[-3000:]


def test_every_message_is_buried_at_most_once(storm: Storm) -> None:
    assert len(storm.buried_messages) == len(set(storm.buried_messages))


@pytest.mark.xfail(strict=True, reason=GRAVEYARD_WORK)
def test_unrelated_flaky_tasks_are_done_within_their_backoff(storm: Storm) -> None:
    late = {
        k: round(v["done"] - v["first"], 1)
        for k, v in storm.runs.items()
        if k.startswith("f") and v["done"] - v["first"] > FLAKY_BACKOFF + FLAKY_SLACK
    }
    assert late == {}, f"{len(late)} of {FLAKY} flaky tasks late: {sorted(late.values())[-5:]}"


@pytest.mark.xfail(strict=True, reason=GRAVEYARD_WORK)
def test_purge_on_a_full_redis_frees_the_bytes_it_removes(storm: Storm) -> None:
    purge = storm.purge
    assert purge["rc"] == 0, purge["output"]
    # About 5.4 KB per obituary (docs/operations.md); 90% of it must come back.
    assert purge["freed"] >= 0.9 * 5400 * purge["obituaries"], purge
