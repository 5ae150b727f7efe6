"""Where one handled failure's time goes: a solo worker under py-spy (wall clock, idle included).

Publishes ``--tasks`` ``bench.park_hour`` messages (each fails once with
``self.retry(countdown=3600)``), runs one solo-pool worker under ``py-spy record --idle`` until
every first run is done, and sums py-spy's samples per stage of the failure path, per failure:
Celery's consumer and tracer, ``DLXTask.__call__`` and ``_fail``, ``ExceptionInfo``, the Redis
park, the history/counter round trip, the fate log line, the ``task_retry`` signal, the ack.
Stages nest (``_fail`` includes the park), so the table prints inclusive times. ``--mode plain``
profiles Celery's own countdown retry for comparison.

Run: .venv/bin/python benchmarks/profile_failure.py [--tasks 2000] [--mode dlx] [--out FILE]
"""

from __future__ import annotations

import argparse
import os
import signal
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
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--mode", default="dlx", choices=("dlx", "plain"))
    parser.add_argument("--pool", default="solo", help="solo, or prefork (child and parent)")
    parser.add_argument("--experiments", default="", help="BENCH_EXPERIMENTS for the worker")
    parser.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    parser.add_argument("--out", default=None, help="keep the collapsed stacks in this file")
    args = parser.parse_args()
    uid = unique("pf")[3:]
    client = redis.Redis.from_url(REDIS_URL)
    runs = "{bench-" + uid + "}:bench:runs"
    out = args.out or tempfile.mktemp(suffix=".txt", prefix="profile-failure-")
    say(f"profile of {args.tasks} failures ({args.mode}, {args.pool} pool), load {load()}")
    try:
        publish(args.mode, uid, "bench.park_hour", [()] * args.tasks)
        cmd = [
            str(PY_SPY),
            "record",
            "--idle",
            *(["--subprocesses"] if args.pool == "prefork" else []),
            "--format",
            "raw",
            "-r",
            str(args.rate),
            "-o",
            out,
            "--",
            *worker_command(args.mode, uid, args.pool),
        ]
        env = {"BENCH_EXPERIMENTS": args.experiments}
        with bench_worker(args.mode, uid, pool=args.pool, cmd=cmd, extra_env=env) as proc:
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
    report(out, args.tasks, 1000 * elapsed / args.tasks)
    if not args.out:
        os.unlink(out)


def _children(pid: int) -> list[int]:
    import psutil

    return [p.pid for p in psutil.Process(pid).children(recursive=False)]


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
        frames = stack.split(";")
        if not frames[0].startswith("_run_module_as_main"):
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
