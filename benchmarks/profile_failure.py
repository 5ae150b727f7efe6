"""Where one handled failure's time goes: a worker under py-spy (wall clock, idle included).

Publishes ``--tasks`` ``bench.park_hour`` messages (each fails once with
``self.retry(countdown=3600)``: the P10 path), runs one worker (``--pool prefork``, one child, as
P10's headline; or ``solo``) under ``py-spy record --idle --subprocesses`` until every first run
is done, and splits py-spy's samples of the worker's main thread and of its pool child into the
stages of one failure (issue 23 item 2), each sample counted once, in the first stage whose rule
it matches (``ENCLOSING``, then ``INNERMOST``):

* pool hand-over: the parent's request handling, the job written to the child and its result
  read back, and the child's side of it (reading the job, pickling the result);
* tracer: Celery's tracer outside the stages below (``celery/app/trace.py``);
* decision: celery_dlx's policy (``celery_dlx/policy/``);
* Redis: every Redis call made by celery_dlx (the park, history, counters), waits included;
* publish: broker publishes (a requeue's copy; none on a park);
* ack: ``basic_ack``;
* event: celery_dlx's fate event and Celery's event dispatcher;
* log: Python's ``logging``;

and beside them the task body (the benchmark's own Redis ``INCR``), the rest of celery_dlx, the
consumer reading from the broker, and what is left. Idle samples (the parent in ``epoll``, the
child waiting for a job) are not a cost and are shown apart. Each figure is
``samples / sampling rate / failures``: microseconds per failure spent in that stage, by the
process that runs it; parent and child run in parallel, so the sum is work, not latency.

``--markdown`` prints the table as markdown with the run's command, commit and load (P10's
section of docs/benchmarks.md names the command). ``--detail`` adds the older
inclusive table (stages nest). ``--mode plain`` profiles Celery's own countdown retry, ``--mode
success`` plain Celery running as many tasks that succeed (the P10 baseline), for comparison.

Run: .venv/bin/python benchmarks/profile_failure.py [--tasks 3000] [--pool prefork] [--markdown]
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import REDIS_URL, load, say, unique
from _workers import bench_worker, cleanup, publish, wait_count, worker_command

PY_SPY = Path(sys.executable).with_name("py-spy")

#: (label, substring of a frame "function (file:line)" that marks the stage); inclusive.
STAGES = [
    ("main thread busy in the consumer loop (all of the work)", "__BUSY__"),
    ("  reading from the broker outside a run", "__CONSUMER__"),
    ("Celery tracer (trace_task), whole run", "trace_task (celery/app/trace.py"),
    ("DLXTask.__call__ (celery_dlx)", "__call__ (celery_dlx/worker/task.py"),
    ("task body (bench_app.park_hour)", "park_hour (bench_app.py"),
    (
        "billiard ExceptionInfo(), all (the tracer's two and DLXTask's)",
        "__init__ (billiard/einfo.py",
    ),
    ("DLXTask._fail", "_fail (celery_dlx/worker/task.py"),
    ("  celery_copy (the parked copy)", "celery_copy (celery_dlx/broker/copies.py"),
    ("  Runtime.park (Redis Lua park)", "park (celery_dlx/wiring/runtime.py"),
    ("  Runtime.record (history + counters + log)", "record (celery_dlx/wiring/runtime.py"),
    ("    Runtime._log (fate log line)", "_log (celery_dlx/wiring/runtime.py"),
    ("    redis pipeline execute", "execute (redis/client.py"),
    ("  DLXTask._mark_retry (task_retry signal)", "_mark_retry (celery_dlx/worker/task.py"),
    ("Celery handle_ignore / on_failure logging", "handle_ignore (celery/app/trace.py"),
    ("Celery log records (logging.Logger._log)", "_log (logging/__init__.py"),
    ("ack (basic_ack)", "basic_ack (amqp/channel.py"),
    ("redis socket reads", "read_response (redis/"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument(
        "--mode",
        default="dlx",
        choices=("dlx", "plain", "success", "dlx_success"),
        help="dlx: celery_dlx parks each failure; plain: Celery's own countdown retry; success: "
        "plain Celery (acks_late) running tasks that succeed, the baseline P10 compares with; "
        "dlx_success: the same successes with celery_dlx installed (P2)",
    )
    parser.add_argument("--pool", default="prefork", help="prefork (child and parent), or solo")
    parser.add_argument("--experiments", default="", help="BENCH_EXPERIMENTS for the worker")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", default=None, help="keep the collapsed stacks in this file")
    parser.add_argument("--markdown", action="store_true", help="print the table as markdown")
    parser.add_argument("--detail", action="store_true", help="also the inclusive table")
    args = parser.parse_args()
    uid = unique("pf")[3:]
    client = redis.Redis.from_url(REDIS_URL)
    runs = "{bench-" + uid + "}:bench:runs"
    out = args.out or tempfile.mktemp(suffix=".txt", prefix="profile-failure-")
    load_before = load()
    say(f"profile of {args.tasks} failures ({args.mode}, {args.pool} pool), load {load_before}")
    try:
        mode = {"success": "plain", "dlx_success": "dlx"}.get(args.mode, args.mode)
        task = "bench.count_run" if "success" in args.mode else "bench.park_hour"
        publish(mode, uid, task, [()] * args.tasks)
        cmd = [
            str(PY_SPY),
            "record",
            "--idle",
            "--subprocesses",
            "--format",
            "raw",
            "-r",
            str(args.rate),
            "-o",
            out,
            "--",
            *worker_command(mode, uid, args.pool),
        ]
        env = {"BENCH_EXPERIMENTS": args.experiments}
        with bench_worker(mode, uid, pool=args.pool, cmd=cmd, extra_env=env) as proc:
            # The clock starts at the first run, so the worker's start is not counted.
            wait_count(client, runs, 1, 300, proc)
            started = time.monotonic()
            wait_count(client, runs, args.tasks, 3600, proc)
            elapsed = time.monotonic() - started
            # py-spy writes its file when the worker exits: stop the worker only.
            for child in _children(proc.pid):
                os.kill(child, signal.SIGTERM)
            proc.wait(60)
    finally:
        cleanup(uid)
    say(
        f"{args.tasks} failures in {elapsed:.1f}s: {args.tasks / elapsed:.0f}/s, "
        f"{1000 * elapsed / args.tasks:.2f} ms per failure (load {load()})"
    )
    per_stage = stage_costs(out, args.rate, args.tasks)
    command = "python benchmarks/profile_failure.py " + " ".join(sys.argv[1:])
    print_stages(
        per_stage,
        markdown=args.markdown,
        heading=(
            f"`{command}` ({args.mode}, {args.pool} pool, {args.tasks:,} failures, py-spy at "
            f"{args.rate} Hz), commit {commit()}, "
            f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, load {load_before} -> "
            f"{load()}; {args.tasks / elapsed:,.0f} failures/s under the profiler = "
            f"{1e6 * elapsed / args.tasks:,.0f} µs per failure"
        ),
    )
    if args.detail:
        report(out, args.tasks, 1000 * elapsed / args.tasks)
    if not args.out:
        os.unlink(out)


def _children(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children(recursive=False)]


def commit() -> str:
    """The checkout's commit, ``+changes`` when the package differs from it."""
    root = Path(__file__).resolve().parent.parent

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=root, capture_output=True, text=True, check=False
        ).stdout.strip()

    head = git("rev-parse", "--short=10", "HEAD") or "unknown"
    return head + ("+changes" if git("status", "--porcelain", "--", "celery_dlx") else "")


#: Stages a sample belongs to when any of its frames matches, whatever is called below: the
#: task body's own Redis call is not celery_dlx's, an event's publish is the event's.
ENCLOSING: list[tuple[str, tuple[str, ...]]] = [
    ("task body (the benchmark's own Redis INCR)", ("(bench_app.py",)),
    ("event", ("(celery_dlx/integrations/events.py", "(celery/events/")),
    ("log", ("(logging/",)),
    ("ack", ("basic_ack (",)),
    # The policy is pure (no I/O): everything under it, its helpers included, is the decision.
    ("decision", ("(celery_dlx/policy/",)),
]
#: Otherwise the stage of the sample's deepest frame that matches one of these (a Redis call
#: made by celery_dlx's park is "Redis", celery_dlx's code around it is "celery_dlx").
INNERMOST: list[tuple[str, tuple[str, ...]]] = [
    ("Redis", ("(redis/",)),
    ("publish", ("basic_publish (", "Producer.publish (", "Producer._publish (")),
    ("celery_dlx, the rest (plan, copy, headers, records)", ("(celery_dlx/",)),
    ("tracer", ("(celery/app/trace.py",)),
    (
        "pool hand-over",
        (
            "(billiard/",
            "(celery/concurrency/",
            "(celery/worker/request.py",
            "(celery/worker/strategy.py",
        ),
    ),
    ("receive from the broker (consumer)", ("(amqp/", "(kombu/")),
]
#: The stages issue 23 names, in its order, then the others.
STAGE_ORDER = [
    "pool hand-over",
    "tracer",
    "decision",
    "Redis",
    "publish",
    "ack",
    "event",
    "log",
    "celery_dlx, the rest (plan, copy, headers, records)",
    "task body (the benchmark's own Redis INCR)",
    "receive from the broker (consumer)",
    "other",
]
IDLE = "idle (parent in epoll, child waiting for a job)"


def classify(frames: list[str]) -> str | None:
    """The stage of one sample (py-spy frames, root first), ``IDLE``, or None (not the loop)."""
    processes = sum(1 for f in frames if f.startswith("process "))
    stack = ";".join(f for f in frames if not f.startswith("process "))
    child = processes >= 2
    if child:
        if "workloop (billiard/pool.py" not in stack:
            return None  # the child's start and exit
        if "get_payload (billiard/queues.py" in stack and "_recv (billiard/connection.py" in stack:
            return IDLE
    else:
        pool_thread = "(concurrent/futures/thread.py" in stack  # the threads pool's workers
        # the main process's settler thread writes the parks its pool hands over
        settler = "(celery_dlx/worker/settler.py" in stack
        if (
            settler
            and "_run (celery_dlx/worker/settler.py" in stack
            and ("wait (threading.py" in stack)
        ):
            return IDLE
        if "synloop (celery/worker/loops.py" not in stack and not pool_thread and not settler:
            return None  # start-up, shutdown, other helper threads
        leaf = frames[-1]
        thread_waits = "wait (threading.py" in stack or leaf.startswith("_worker (concurrent/")
        if pool_thread and thread_waits and "(celery/app/trace.py" not in stack:
            return IDLE  # a pool thread waiting for its next task
        if "poll (" in leaf and "Hub.create_loop" in stack:
            return IDLE
        waiting = "poll (" in leaf or "select (" in leaf
        if waiting and "(celery_dlx/" not in stack and "(redis/" not in stack:
            return IDLE
    for stage, markers in ENCLOSING:
        if any(marker in stack for marker in markers):
            return stage
    for frame in reversed(frames):
        for stage, markers in INNERMOST:
            if any(marker in frame for marker in markers):
                return stage
    return "other"


def stage_costs(path: str, rate: int, failures: int) -> dict[str, tuple[float, float]]:
    """Per stage, microseconds per failure in the parent and in the child."""
    samples: dict[str, list[int]] = {}
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = stack.split(";")
        stage = classify(frames)
        if stage is None:
            continue
        child = sum(1 for f in frames if f.startswith("process ")) >= 2
        samples.setdefault(stage, [0, 0])[1 if child else 0] += int(count)
    scale = 1e6 / rate / failures
    return {stage: (n[0] * scale, n[1] * scale) for stage, n in samples.items()}


def print_stages(costs: dict[str, tuple[float, float]], markdown: bool, heading: str) -> None:
    """The per-stage table: µs per failure, parent, child, both, share of the busy time."""
    busy = sum(p + c for stage, (p, c) in costs.items() if stage != IDLE) or 1.0
    rows = [s for s in STAGE_ORDER if s in costs or s in STAGE_ORDER[:8]]
    if markdown:
        say(heading)
        say("")
        say("| stage | µs per failure, parent | µs, child | µs, both | share of busy |")
        say("| --- | ---: | ---: | ---: | ---: |")
        for stage in rows:
            parent, child = costs.get(stage, (0.0, 0.0))
            say(
                f"| {stage} | {parent:,.0f} | {child:,.0f} | {parent + child:,.0f} | "
                f"{(parent + child) / busy:.0%} |"
            )
        parent = sum(p for stage, (p, _) in costs.items() if stage != IDLE)
        child = sum(c for stage, (_, c) in costs.items() if stage != IDLE)
        say(f"| **busy, all stages** | {parent:,.0f} | {child:,.0f} | {parent + child:,.0f} | |")
        idle = costs.get(IDLE, (0.0, 0.0))
        say(f"| {IDLE} | {idle[0]:,.0f} | {idle[1]:,.0f} | | |")
        return
    say(heading)
    say(f"{'stage':52} {'parent µs':>10} {'child µs':>9} {'both µs':>8} {'share':>6}")
    for stage in [*rows, IDLE]:
        parent, child = costs.get(stage, (0.0, 0.0))
        share = "" if stage == IDLE else f"{(parent + child) / busy:6.0%}"
        say(f"{stage:52} {parent:10,.0f} {child:9,.0f} {parent + child:8,.0f} {share:>6}")


def report(path: str, failures: int, per_failure_ms: float) -> None:
    """Per-stage inclusive time per failure, from py-spy's collapsed stacks.

    The main thread's samples in the consumer loop, less those idle in ``epoll`` (before the
    first and after the last run), are the measured wall time of the runs: each stage gets its
    share of ``per_failure_ms``.
    """
    totals: Counter[str] = Counter()
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        frames = [f for f in stack.split(";") if not f.startswith("process ")]
        if not frames or not frames[0].startswith("_run_module_as_main"):
            continue  # the main thread only (timer and other helper threads idle)
        in_trace = any("trace_task (celery/app/trace.py" in f for f in frames)
        for label, marker in STAGES:
            if marker == "__BUSY__":
                hit = "loops.py" in stack and "_epoll.poll" not in frames[-1]
            elif marker == "__CONSUMER__":
                hit = not in_trace and any("drain_events" in f for f in frames)
            else:
                hit = marker in stack
            if hit:
                totals[label] += n
    total = totals[STAGES[0][0]] or 1
    say(f"{'stage (inclusive, wall clock incl. waits)':58} {'ms/failure':>10} {'share':>6}")
    for label, _ in STAGES:
        share = totals[label] / total
        say(f"{label:58} {share * per_failure_ms:10.3f} {share:6.1%}")


if __name__ == "__main__":
    main()
