"""P10 failure intake: how fast a worker takes in a flood of failures (a bad deploy, an outage).

``--tasks`` messages (20,000) that each fail once with ``self.retry(countdown=3600)`` are
published, then one worker (prefork, one child, prefetch 10) starts; the clock runs from the first
run until every first attempt has run. celery_dlx parks each retry in Redis and acks; plain
Celery (``task_acks_late=True``) publishes an ETA copy that the worker then holds unacked; Dramatiq
(1 process, 1 thread) raises ``dramatiq.Retry(delay=3600000)``: a message in its delay queue.
Rounds alternate the systems, each in a fresh worker; the figure is the median of the rounds'
failures per second, and the ratio celery_dlx / Dramatiq is the median of the rounds' ratios.
Target: celery_dlx >= Dramatiq's rate (ratio >= 1.0).

Run: .venv/bin/python benchmarks/p10_intake.py [--tasks 20000] [--rounds 3] [--pools prefork]
"""

from __future__ import annotations

import argparse
import sys
import time
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
from _workers import LABELS, bench_worker, cleanup, publish, wait_count

TARGET = 1.0


def run(mode: str, tasks: int, pool: str = "prefork", experiments: str = "") -> float:
    """Failures taken in per second, from the first run to the last first attempt."""
    uid = unique("p10")[4:]
    client = redis.Redis.from_url(REDIS_URL)
    runs = "{bench-" + uid + "}:bench:runs"
    try:
        publish(mode, uid, "bench.park_hour", [()] * tasks)
        env = {"BENCH_EXPERIMENTS": experiments} if experiments else None
        with bench_worker(mode, uid, prefetch=10, pool=pool, extra_env=env) as proc:
            wait_count(client, runs, 1, 300, proc)
            started = time.monotonic()
            wait_count(client, runs, tasks, 7200, proc)
            elapsed = time.monotonic() - started
        return (tasks - 1) / elapsed
    finally:
        cleanup(uid)


def label(mode: str, pool: str) -> str:
    base, _, experiment = mode.partition(":")
    where = "" if base == "dramatiq" else f" ({pool})"
    return LABELS[base] + where + (f" + experiment {experiment}" if experiment else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pools", default="prefork", help="Celery pools, the first is the headline"
    )
    parser.add_argument("--systems", default="dlx,plain,dramatiq")
    parser.add_argument(
        "--experiments",
        default="",
        help="adds celery_dlx rows with variants patched in (benchmarks/bench_experiments.py): "
        "e.g. no_events (',' between rows, '+' within one)",
    )
    args = parser.parse_args()
    pools = args.pools.split(",")
    systems = args.systems.split(",")
    cells = [(s, pools[0]) for s in systems] + [
        ("dlx", pool) for pool in pools[1:] if "dlx" in systems
    ]
    cells += [(f"dlx:{e}", pools[0]) for e in args.experiments.split(",") if e]
    say(
        f"P10 failure intake: {args.tasks:,} tasks failing once with a one-hour retry, load {load()}"
    )
    rates: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
    for n in range(1, args.rounds + 1):
        for mode, pool in cells:
            base, _, experiment = mode.partition(":")
            rate = run(base, args.tasks, pool, experiment.replace("+", ","))
            rates[(mode, pool)].append(rate)
            round_line(
                label(mode, pool),
                n,
                f"{rate:,.0f} failures/s ({args.tasks / rate:.1f}s, {1000 / rate:.2f} ms each)",
            )
    for (mode, pool), values in rates.items():
        say(f"{label(mode, pool)}: failures/s {rounds_text(values, '{:,.0f}')}")
    head = rates.get(("dlx", pools[0]))
    if not head:
        return
    text = "; ".join(f"{LABELS[m]} {median(rates[(m, pools[0])]):,.0f}/s" for m in systems)
    if "dramatiq" in systems:
        ratios = [d / q for d, q in zip(head, rates[("dramatiq", pools[0])], strict=True)]
        ratio = median(ratios)
        met = ratio >= TARGET
        say(
            f"RATIO P10 failure intake celery_dlx / Dramatiq ({pools[0]}): {ratio:.2f}x "
            f"({rounds_text(ratios)}) (target >= {TARGET:.2f}x) {'OK' if met else 'BELOW'}"
        )
        summary(
            "P10",
            f"failure intake: {args.tasks:,} tasks failing once with retry(countdown=3600), "
            f"{pools[0]}, celery_dlx / Dramatiq",
            ">= 1.0x",
            f"{ratio:.2f}x ({rounds_list(ratios)}); {text}",
            "met" if met else "not met",
        )
    for pool in pools[1:]:
        values = rates[("dlx", pool)]
        summary(
            "P10",
            f"failure intake, celery_dlx on the {pool} pool",
            "measured",
            f"{median(values):,.0f}/s ({rounds_list(values, '{:,.0f}')})",
            "measured",
        )


if __name__ == "__main__":
    main()
