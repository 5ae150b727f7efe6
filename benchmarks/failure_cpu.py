"""Where a failure's CPU goes, process by process, against a success (issue 23 item 2).

A P10-shaped run (one prefork worker, one pool process, prefetch 10): ``--tasks`` messages are
published, the worker starts, and from its first run to its last the CPU time (user + system) of
four processes is read with psutil: the worker's main process, its pool process, the shared
redis-server and the shared RabbitMQ node (so run it on a quiet machine: the servers' figures
include whatever else uses them). Printed per task, in microseconds, for:

- ``success``: plain Celery (``task_acks_late=True``) running no-op tasks (P10's baseline);
- ``dlx``: celery_dlx, each task failing once with ``self.retry(countdown=3600)``: a park, written
  by the main process (``dlx_parent_parks``, the default);
- ``dlx:child_parks``: the same with ``dlx_parent_parks = False`` (the pool process parks);
- ``dlx:no_park_write``: ``dlx`` whose main process acks each park without writing it (a
  ceiling that loses every park: the failure path without its durable write; see
  ``bench_experiments``);
- ``dlx:events``: ``dlx`` sending a fate event per park (``dlx_events_follow_worker = False``;
  the worker runs without ``-E``, so ``dlx`` sends none, as Celery sends none of its own);
- ``ignore``: plain Celery, each run ending in Celery's ``Ignore`` (no celery_dlx): the floor of
  a run that does not succeed, through Celery's own failure path;
- ``write_ignore``: ``ignore`` after the least a durable park writes, from the run (a hash field
  and a sorted-set member in one ``MULTI``/``EXEC``): the floor of a park made by the run;
- ``write_success``: plain Celery, a run that writes the same and succeeds: the cheapest way
  Celery offers to end a run after a durable write (no exception at all);
- ``dlx_success``: ``success`` with celery_dlx installed (P2's question, per process);
- ``dramatiq``: P10's peer, Dramatiq (1 process, 1 thread) raising ``Retry(delay=3600000)``;
  its main process only supervises, its one worker process runs the actor (the "pool process"
  column); ``dramatiq_confirm``: the same with ``confirm_delivery=True`` (the guarantee celery_dlx
  gives a park: the retry's copy confirmed before the original is acked).

Rounds alternate the cells, each in a fresh worker; every round is printed, then the medians.
With Celery's default fair scheduling and one pool process, the main process hands the pool its
next task only after the last one's result is in, so the two take turns: the rate is about one
over the sum of their CPU per task, which is why it is printed.

Run: .venv/bin/python benchmarks/failure_cpu.py [--tasks 3000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import psutil
import redis
from _common import REDIS_URL, load, say, unique
from _workers import bench_worker, cleanup, publish, wait_count

#: What each cell runs: (bench_app mode, task, BENCH_EXPERIMENTS).
CELLS = {
    "success": ("plain", "bench.count_run", ""),
    "dlx": ("dlx", "bench.park_hour", ""),
    "dlx:child_parks": ("dlx", "bench.park_hour", "child_parks"),
    "dlx:events": ("dlx", "bench.park_hour", "events_always"),
    "dlx:no_park_write": ("dlx", "bench.park_hour", "no_park_write"),
    "ignore": ("plain", "bench.count_ignore", ""),
    "write_ignore": ("plain", "bench.count_write_ignore", ""),
    "write_success": ("plain", "bench.count_write", ""),
    "dlx_success": ("dlx", "bench.count_run", ""),
    "dramatiq": ("dramatiq", "bench.park_hour", ""),
    "dramatiq_confirm": ("dramatiq_confirm", "bench.park_hour", ""),
}
#: The cells run unless ``--cells`` names others.
DEFAULT_CELLS = ("success", "dlx", "dlx:child_parks")
PROCESSES = ("main process", "pool process", "redis-server", "RabbitMQ")


def _cpu(processes: list[psutil.Process]) -> float:
    total = 0.0
    for process in processes:
        times = process.cpu_times()
        total += times.user + times.system
    return total


def _server(fragment: str, port: str = "") -> psutil.Process:
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if fragment in line and port in line:
            return process
    raise RuntimeError(f"no {fragment} process found")


def one_round(cell: str, tasks: int) -> tuple[float, dict[str, float]]:
    """Tasks per second and CPU µs per task of each process, for one fresh worker."""
    mode, task, experiments = CELLS[cell]
    uid = unique("fcpu")[5:]
    client = redis.Redis.from_url(REDIS_URL)
    runs = "{bench-" + uid + "}:bench:runs"
    servers = [_server("redis-server", ":6379"), _server("beam.smp")]
    try:
        publish(mode, uid, task, [()] * tasks)
        env = {"BENCH_EXPERIMENTS": experiments} if experiments else None
        with bench_worker(mode, uid, prefetch=10, pool="prefork", extra_env=env) as proc:
            wait_count(client, runs, 1, 300, proc)
            main = psutil.Process(proc.pid)
            # one pool process for Celery; Dramatiq's worker process (and any it forks)
            processes = [[main], main.children(recursive=True), *([s] for s in servers)]
            before = [_cpu(p) for p in processes]
            started = time.monotonic()
            wait_count(client, runs, tasks, 900, proc)
            elapsed = time.monotonic() - started
            after = [_cpu(p) for p in processes]
    finally:
        cleanup(uid)
    per_task = {
        name: 1e6 * (b - a) / (tasks - 1)
        for name, a, b in zip(PROCESSES, before, after, strict=True)
    }
    return (tasks - 1) / elapsed, per_task


def line(rate: float, cpu: dict[str, float]) -> str:
    parts = ", ".join(f"{name} {cpu[name]:,.0f}" for name in PROCESSES)
    both = cpu["main process"] + cpu["pool process"]
    return f"{rate:,.0f}/s; CPU µs per task: {parts}; main + pool {both:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--cells", default=",".join(DEFAULT_CELLS), help=f"comma-separated, of {', '.join(CELLS)}"
    )
    args = parser.parse_args()
    cells = [c for c in args.cells.split(",") if c]
    unknown = set(cells) - set(CELLS)
    if unknown:
        parser.error(f"unknown cells: {', '.join(sorted(unknown))}")
    say(f"failure CPU by process: {args.tasks:,} tasks per round, prefork, load {load()}")
    results: dict[str, list[tuple[float, dict[str, float]]]] = {cell: [] for cell in cells}
    for n in range(1, args.rounds + 1):
        for cell in cells:
            rate, cpu = one_round(cell, args.tasks)
            results[cell].append((rate, cpu))
            say(f"round {n}: {cell}: {line(rate, cpu)}  [load {load()}]")
    for cell, rounds in results.items():
        rate = statistics.median(r for r, _ in rounds)
        cpu = {name: statistics.median(c[name] for _, c in rounds) for name in PROCESSES}
        say(f"median {cell}: {line(rate, cpu)}")


if __name__ == "__main__":
    main()
