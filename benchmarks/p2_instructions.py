"""P2 counted, not timed: machine instructions per no-op task, plain Celery against celery_dlx.

P2's CPU row (``p2_success.py``) reads the worker's CPU time, which the machine's load moves by
more than the few percent the target allows. ``valgrind --tool=callgrind`` counts the
instructions a process executes instead: the same count for the same work, whatever else runs.
For each system this runs a worker (``bench_app``, ``--pool``, one process or child, prefetch
10, ``task_acks_late``) under callgrind over a backlog of ``LOW`` no-op tasks, then over one of
``HIGH``, and divides the difference by ``HIGH - LOW``: start-up and shut-down cancel out, what is
left is the instructions of one task, every process of the worker together (prefork: the main
process and its pool child; valgrind follows the fork).

One thing is set apart: celery_dlx's drain polls Redis once per ``dlx_drain_interval`` (1 s), by
the clock, not per task, and under valgrind the clock stretches some fifty times, so it would
be counted fifty times over; the workers run with ``dlx_drain_interval`` at an hour
(``BENCH_DRAIN_INTERVAL``). Needs Debian's ``valgrind``. A run takes several minutes per system
(callgrind runs Python some fifty times slower).

Run: ``.venv/bin/python benchmarks/p2_instructions.py [--pool solo] [--tasks 200,1200]``
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import REDIS_URL, ROOT, callgrind, collected, load, say, unique
from _workers import cleanup, publish, wait_count, worker_command

#: Target of P2's CPU row (celery_dlx / plain Celery).
TARGET = 1.03


def instructions(mode: str, pool: str, tasks: int) -> int:
    """Instructions a worker of ``mode`` executes over a backlog of ``tasks`` no-op tasks, from
    start to shut-down, its pool processes included."""
    uid = unique("p2i")
    publish(mode, uid, "bench.noop", [(tasks,)] * tasks)
    with tempfile.TemporaryDirectory(prefix="p2i-") as logs:
        command = [*callgrind(f"{logs}/%p.log"), *worker_command(mode, uid, pool)]
        env = {
            **os.environ,
            "BENCH_MODE": mode,
            "BENCH_UID": uid,
            "BENCH_PREFETCH": "10",
            "BENCH_DRAIN_INTERVAL": "3600",
            "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}",
        }
        proc = subprocess.Popen(
            command,
            cwd=ROOT / "benchmarks",
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis.from_url(REDIS_URL)
            wait_count(client, "{bench-" + uid + "}:bench:done", tasks, 3600, proc)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(600)
            cleanup(uid)
        # One count per process of the worker (the main process, and prefork's child). A
        # process forked only to run another program (a subprocess at start-up) leaves a log
        # without one, since valgrind does not follow the exec.
        counts = [
            count
            for path in glob.glob(f"{logs}/*.log")
            if (count := collected(Path(path).read_text())) is not None
        ]
        expected = 1 if pool == "solo" else 2
        if len(counts) != expected:
            raise RuntimeError(f"{len(counts)} instruction counts, {expected} worker processes")
        total = sum(counts)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default="solo", help="solo or prefork")
    parser.add_argument("--tasks", default="200,1200", help="LOW,HIGH backlog sizes")
    args = parser.parse_args()
    low, high = (int(n) for n in args.tasks.split(","))
    say(f"P2 instructions per no-op task ({args.pool}, {low:,} and {high:,} tasks), load {load()}")
    per_task = {}
    for mode in ("plain", "dlx"):
        a, b = instructions(mode, args.pool, low), instructions(mode, args.pool, high)
        per_task[mode] = (b - a) / (high - low)
        say(f"{mode}: {per_task[mode]:,.0f} instructions per task (runs {a:,} and {b:,})")
    ratio = per_task["dlx"] / per_task["plain"]
    verdict = "OK" if ratio <= TARGET else "ABOVE"
    say(
        f"RATIO P2 instructions per task, celery_dlx / plain Celery acks_late ({args.pool}): "
        f"{ratio:.3f}x (target <= {TARGET:.2f}x) {verdict}"
    )


if __name__ == "__main__":
    main()
