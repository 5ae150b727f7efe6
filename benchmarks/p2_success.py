"""P2 success path: no-op task throughput, celery_dlx vs. plain Celery with the same guarantee.

Each run publishes N no-op tasks, starts one worker (``--pools``, default prefork: Celery's default,
one child; prefetch 10) and times the first run to the last. Plain Celery runs with
``task_acks_late=True`` (celery_dlx acks late: its fates need the message until the run is over,
so the baseline pays the same ack after the run). Rounds alternate plain / celery_dlx; the
figure is the median of the rounds' ratios, each round printed with the load average.
Target: celery_dlx >= 0.95x plain, prefork.

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
from _workers import bench_worker, cleanup, publish, wait_key

TARGET = 0.95


def run(mode: str, tasks: int, pool: str = "prefork") -> float:
    """Tasks per second of one worker over ``tasks`` no-op tasks."""
    uid = unique("p2")[3:]
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-{uid}"

    def key(name: str) -> str:
        return "{" + prefix + "}:bench:" + name

    try:
        publish(mode, uid, "bench.noop", [(tasks,)] * tasks)
        with bench_worker(mode, uid, prefetch=10, pool=pool):
            last = float(wait_key(client, key("last"), timeout=900))
        first = float(client.get(key("first")))
        return (tasks - 1) / (last - first)
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
        plain, dlx, ratios = [], [], []
        for n in range(1, args.rounds + 1):
            p = run("plain", args.tasks, pool)
            d = run("dlx", args.tasks, pool)
            plain.append(p)
            dlx.append(d)
            ratios.append(d / p)
            round_line(
                f"{pool}",
                n,
                f"plain Celery acks_late {p:,.0f}/s, celery_dlx {d:,.0f}/s -> {d / p:.3f}x",
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
            ">= 0.95x",
            f"{ratio:.2f}x ({rounds_list(ratios)}); plain {median(plain):,.0f}/s, "
            f"celery_dlx {median(dlx):,.0f}/s",
            "met" if met else "not met",
        )


if __name__ == "__main__":
    main()
