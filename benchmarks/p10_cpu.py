"""P10's CPU per task, by process: where a failure costs more than a success, on the whole machine.

P10 (``p10_intake.py``) runs its worker, RabbitMQ and Redis on one 2-core machine, and they share
it: a rate there is bounded by the CPU every one of them spends per task, not only the worker's.
This runs the same cells (``--tasks`` messages of ``bench.park_hour`` for celery_dlx and the
Dramatiq systems, ``bench.count_run`` successes for plain Celery's ``success`` baseline; one
worker, prefork with one child, prefetch 10) and reads, from the first run to the last, the CPU
time (user + system) of each process it cares about, divided by the runs in between:

* the worker's main process (a Celery worker's parent: its consumer, the pool's hand-over, the
  settler's thread that writes the parks; Dramatiq's main process);
* its pool processes (the Celery prefork child, Dramatiq's worker process);
* RabbitMQ (``beam.smp``) and Redis (the ``redis-server`` of ``DLX_BENCH_REDIS``'s port).

The broker and Redis are shared servers: run it on a quiet machine, or their rows count other
work too. Rounds alternate the systems, each in a fresh worker; medians of the rounds are printed
after every round's figures.

Run: .venv/bin/python benchmarks/p10_cpu.py [--tasks 8000] [--rounds 3]
     [--systems dlx,success,dramatiq,dramatiq_confirm]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
import redis
from _common import REDIS_URL, load, median, say, unique
from _workers import bench_worker, cleanup, publish, wait_count
from p10_intake import NAMES, TASK

#: The processes a task's CPU is read from, in the order they are printed.
KINDS = ("worker main", "worker pool", "RabbitMQ", "Redis")


def servers() -> dict[str, list[psutil.Process]]:
    """RabbitMQ's Erlang VM and the Redis server the benchmarks use (by its port)."""
    port = str(urlparse(REDIS_URL).port or 6379)
    found: dict[str, list[psutil.Process]] = {"RabbitMQ": [], "Redis": []}
    for process in psutil.process_iter(["name", "cmdline"]):
        name = process.info["name"] or ""
        command = " ".join(process.info["cmdline"] or [])
        if name.startswith("beam"):
            found["RabbitMQ"].append(process)
        elif name.startswith("redis-server") and f":{port}" in command:
            found["Redis"].append(process)
    return found


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def snapshot(worker: psutil.Process, shared: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """CPU seconds so far of each of :data:`KINDS`."""
    return {
        "worker main": cpu_seconds([worker]),
        "worker pool": cpu_seconds(worker.children(recursive=True)),
        **{kind: cpu_seconds(shared[kind]) for kind in ("RabbitMQ", "Redis")},
    }


def run(mode: str, tasks: int) -> tuple[float, dict[str, float]]:
    """Tasks per second and CPU µs per task of each kind, from the first run to the last."""
    uid = unique("p10c")[5:]
    client = redis.Redis.from_url(REDIS_URL)
    runs = "{bench-" + uid + "}:bench:runs"
    shared = servers()
    try:
        system, task = ("plain", "bench.count_run") if mode == "success" else (mode, TASK)
        publish(system, uid, task, [()] * tasks)
        with bench_worker(system, uid, pool="prefork", prefetch=10) as proc:
            worker = psutil.Process(proc.pid)
            wait_count(client, runs, 1, 300, proc)
            started, before = time.monotonic(), snapshot(worker, shared)
            wait_count(client, runs, tasks, 7200, proc)
            elapsed, after = time.monotonic() - started, snapshot(worker, shared)
    finally:
        cleanup(uid)
    per_task = {kind: 1e6 * (after[kind] - before[kind]) / (tasks - 1) for kind in KINDS}
    return (tasks - 1) / elapsed, per_task


def line(mode: str, rate: float, per_task: dict[str, float]) -> str:
    parts = ", ".join(f"{kind} {per_task[kind]:,.0f}" for kind in KINDS)
    total = sum(per_task.values())
    return f"{NAMES[mode]}: {rate:,.0f}/s; CPU µs per task: {parts}; all {total:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--systems", default="dlx,success,dramatiq,dramatiq_confirm")
    args = parser.parse_args()
    systems = args.systems.split(",")
    say(f"P10 CPU per task by process: {args.tasks:,} tasks per cell, load {load()}")
    got: dict[str, list[tuple[float, dict[str, float]]]] = {mode: [] for mode in systems}
    for n in range(1, args.rounds + 1):
        for mode in systems:
            rate, per_task = run(mode, args.tasks)
            got[mode].append((rate, per_task))
            say(f"round {n}: {line(mode, rate, per_task)}  [load {load()}]")
    for mode in systems:
        rate = median([r for r, _ in got[mode]])
        per_task = {kind: median([p[kind] for _, p in got[mode]]) for kind in KINDS}
        say(f"median {line(mode, rate, per_task)}")


if __name__ == "__main__":
    main()
