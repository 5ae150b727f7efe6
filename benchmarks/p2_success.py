"""P2 success path: no-op task throughput, celery_dlx vs. plain Celery with the same guarantee.

Each run publishes N no-op tasks, starts one worker (``--pools``, default prefork: Celery's default,
one child; prefetch 10) and times the first run to the last. Plain Celery runs with
``task_acks_late=True`` (celery_dlx acks late: its fates need the message until the run is over,
so the baseline pays the same ack after the run). Rounds alternate plain / celery_dlx; the
figure is the median of the rounds' ratios, each round printed with the load average.
Targets (issue 23 item 6): celery_dlx >= 0.97x plain, prefork. Each round also reads the CPU time
(user + system) the worker's process tree spent per task, first task to last: a second row per
pool, the median of the rounds' celery_dlx / plain ratios (target <= 1.03x), which a busy machine
moves far less than throughput. Both ratios are printed for every round and pool.

Run: .venv/bin/python benchmarks/p2_success.py [--tasks 5000] [--rounds 3] [--pools prefork]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import (
    REDIS_URL,
    load,
    median,
    round_line,
    rounds_list,
    rounds_text,
    say,
    summary,
    unique,
)
from _workers import bench_worker, cleanup, publish, tree_cpu, wait_key

#: celery_dlx / plain Celery acks_late: throughput at least, CPU per task at most.
TARGET = 0.97
CPU_TARGET = 1.03


def run(mode: str, tasks: int, pool: str = "prefork") -> tuple[float, float]:
    """Tasks per second of one worker over ``tasks`` no-op tasks, and the CPU time (user +
    system, µs) its process tree spent per task from the first task to the last.

    CPU time is read when the first task has run and when the last has: a few tasks' worth of
    imprecision at the start, none of the worker's start-up. On a shared machine it moves far
    less than the wall clock, which waits for whatever else runs.
    """
    uid = unique("p2")[3:]
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-{uid}"

    def key(name: str) -> str:
        return "{" + prefix + "}:bench:" + name

    try:
        publish(mode, uid, "bench.noop", [(tasks,)] * tasks)
        with bench_worker(mode, uid, prefetch=10, pool=pool) as proc:
            wait_key(client, key("first"), timeout=900)
            cpu_first = tree_cpu(proc)
            last = float(wait_key(client, key("last"), timeout=900))
            cpu_last = tree_cpu(proc)
        first = float(client.get(key("first")))
        return (tasks - 1) / (last - first), (cpu_last - cpu_first) * 1e6 / (tasks - 1)
    finally:
        cleanup(uid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--pools", default="prefork", help="pools, the first is the headline")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    say(f"P2 success path: {args.tasks:,} no-op tasks, prefetch 10, load {load()}")
    for index, pool in enumerate(args.pools.split(",")):
        plain, dlx, ratios, cpu_ratios = [], [], [], []
        plain_cpu, dlx_cpu = [], []
        for n in range(1, args.rounds + 1):
            p, p_cpu = run("plain", args.tasks, pool)
            d, d_cpu = run("dlx", args.tasks, pool)
            plain.append(p)
            dlx.append(d)
            ratios.append(d / p)
            cpu_ratios.append(d_cpu / p_cpu)
            plain_cpu.append(p_cpu)
            dlx_cpu.append(d_cpu)
            round_line(
                f"{pool}",
                n,
                f"plain Celery acks_late {p:,.0f}/s, celery_dlx {d:,.0f}/s -> {d / p:.3f}x; "
                f"CPU per task {p_cpu:,.0f} / {d_cpu:,.0f} µs -> {d_cpu / p_cpu:.3f}x",
            )
        ratio = median(ratios)
        say(f"{pool}: plain Celery acks_late tasks/s {rounds_text(plain, '{:,.0f}')}")
        say(f"{pool}: celery_dlx tasks/s {rounds_text(dlx, '{:,.0f}')}")
        met = ratio >= TARGET
        say(
            f"RATIO P2 success path ({pool}): {ratio:.3f}x {rounds_text(ratios, '{:.3f}')} "
            f"(target >= {TARGET}x) {'OK' if met else 'BELOW'}"
        )
        summary(
            "P2",
            f"success path: no-op tasks vs. plain Celery with acks_late, {pool}"
            + ("" if index == 0 else " (extra row)"),
            f">= {TARGET}x",
            f"{ratio:.2f}x ({rounds_list(ratios)}); plain {median(plain):,.0f}/s, "
            f"celery_dlx {median(dlx):,.0f}/s",
            "met" if met else "not met",
        )
        cpu = median(cpu_ratios)
        cpu_met = cpu <= CPU_TARGET
        say(
            f"RATIO P2 CPU per task ({pool}) celery_dlx / plain: {cpu:.3f}x "
            f"{rounds_text(cpu_ratios, '{:.3f}')} (target <= {CPU_TARGET}x) "
            f"{'OK' if cpu_met else 'ABOVE'}"
        )
        summary(
            "P2",
            f"success path: CPU time per task of the worker tree (user + system, first task to "
            f"last), celery_dlx / plain Celery acks_late, {pool}",
            f"<= {CPU_TARGET}x",
            f"{cpu:.2f}x ({rounds_list(cpu_ratios)}); plain {median(plain_cpu):,.0f} µs, "
            f"celery_dlx {median(dlx_cpu):,.0f} µs",
            "met" if cpu_met else "not met",
        )


if __name__ == "__main__":
    main()
