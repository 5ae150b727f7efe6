"""P3 memory: worker tree RSS with parked one-hour retries, after warm-up, at 20k and at 120k.

Each task fails once with ``self.retry(countdown=3600)``. celery_dlx parks the retry in Redis
and acks; plain Celery (acks late) publishes an ETA copy that the worker holds unacked in memory;
Dramatiq puts it in its delay queue (the worker holds up to 1000 of those per thread).

Per run, one fresh worker: ``--warmup`` failures (imports, connections, caches: Celery's pool
child grows to a plateau over the first thousand tasks), RSS of the worker tree (main process
and pool children) after warm-up, then RSS when ``--parked`` (20k) and ``--parked-high`` (120k)
retries are parked, the messages held unacked (``rabbitmqctl``, after the 5 s statistics interval;
read until it is 0, for up to 30 s) and (P3b) the latency of 20 fresh tasks published one by one.
The growth between the two parked counts is the per-retry cost (target <= 5 MiB, every pool).
Plain Celery holds its retries in memory, so it stops at ``--plain`` (default the low count).

Run: .venv/bin/python benchmarks/p3_memory.py [--parked 20000] [--parked-high 120000]
     [--pools prefork,solo,threads] [--systems dlx,plain,dramatiq] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import (
    REDIS_URL,
    load,
    median,
    percentile,
    round_line,
    rounds_list,
    say,
    summary,
    unique,
)
from _workers import LABELS, bench_worker, cleanup, publish, tree_rss, unacked, wait_count

MIB = 1024 * 1024
LIMIT_MIB = 5.0


def held_unacked(queue: str, settle: float = 30.0) -> int:
    """Messages of ``queue`` the worker still holds unacked ``settle`` seconds after its last run.

    RabbitMQ refreshes queue statistics every 5 s (collect_statistics_interval), and a sample read
    just after the last runs can predate their acks: a solo worker read 1-6 here 7 s after its
    last run, and 0 two seconds later. The count is read until it is 0 or ``settle`` has passed
    (Celery autoretry holds its ETA retries for an hour: it stays up).
    """
    deadline = time.monotonic() + settle
    time.sleep(6.0)
    held = unacked(queue)
    while held and time.monotonic() < deadline:
        time.sleep(2.0)
        held = unacked(queue)
    return held


def run(mode: str, pool: str, warmup: int, counts: list[int], fresh: int = 20) -> dict[str, Any]:
    """RSS (MiB) after warm-up and at each parked count; unacked and fresh-task latency at the end."""
    uid = unique("p3")[3:]
    client = redis.Redis.from_url(REDIS_URL)
    queue = f"bench-{uid}"

    def key(name: str) -> str:
        return "{bench-" + uid + "}:bench:" + name

    try:
        with bench_worker(mode, uid, prefetch=10, pool=pool) as proc:
            publish(mode, uid, "bench.park_hour", [()] * warmup)
            wait_count(client, key("runs"), warmup, 3600, proc)
            time.sleep(1.0)
            rss = {0: tree_rss(proc) / MIB}
            done = 0
            started = time.monotonic()
            for count in counts:
                publish(mode, uid, "bench.park_hour", [()] * (count - done))
                wait_count(client, key("runs"), warmup + count, 14400, proc)
                done = count
                time.sleep(1.0)
                rss[count] = tree_rss(proc) / MIB
            elapsed = time.monotonic() - started
            held = held_unacked(queue)
            latencies: list[float] = []
            for _ in range(fresh):
                publish(mode, uid, "bench.fresh", [(time.time(),)])
                deadline = time.monotonic() + 30
                while client.llen(key("latency")) <= len(latencies):
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.002)
                values = client.lrange(key("latency"), 0, -1)
                if len(values) <= len(latencies):
                    latencies.append(float("inf"))
                    break
                latencies.append(float(values[-1]) * 1000)
        return {
            "rss": rss,
            "unacked": held,
            "seconds": elapsed,
            "fresh_p50_ms": percentile(latencies, 50),
            "fresh_max_ms": max(latencies),
        }
    finally:
        cleanup(uid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parked", type=int, default=20_000)
    parser.add_argument("--parked-high", type=int, default=120_000)
    parser.add_argument(
        "--plain", type=int, default=None, help="plain Celery's count (default --parked)"
    )
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--pools", default="prefork,solo,threads")
    parser.add_argument("--systems", default="dlx,plain,dramatiq")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    low, high = args.parked, args.parked_high
    pools = args.pools.split(",")
    systems = args.systems.split(",")
    cells: list[tuple[str, str, list[int]]] = []
    if "dlx" in systems:
        cells += [("dlx", pool, [low, high]) for pool in pools]
    if "plain" in systems:
        cells.append(("plain", pools[0], [args.plain or low]))
    if "dramatiq" in systems:
        cells.append(("dramatiq", "-", [low, high]))
    say(
        f"P3 memory: warm-up {args.warmup:,}, then {low:,} and {high:,} parked one-hour retries, "
        f"load {load()}"
    )
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(m, p): [] for m, p, _ in cells}
    for n in range(1, args.rounds + 1):
        for mode, pool, counts in cells:
            r = run(mode, pool, args.warmup, counts)
            results[(mode, pool)].append(r)
            rss = r["rss"]
            steps = ", ".join(f"{c:,}: {rss[c]:.1f}" for c in counts)
            round_line(
                name(mode, pool),
                n,
                f"RSS MiB after warm-up {rss[0]:.1f}, at {steps}; growth "
                f"{rss[counts[-1]] - rss[counts[0]]:+.1f} MiB between {counts[0]:,} and {counts[-1]:,}"
                f"; unacked {r['unacked']}; fresh task p50 {r['fresh_p50_ms']:.1f} ms, max "
                f"{r['fresh_max_ms']:.1f} ms; {r['seconds']:.0f}s",
            )
    growths: dict[tuple[str, str], list[float]] = {}
    for mode, pool, counts in cells:
        runs = results[(mode, pool)]
        growth = [r["rss"][counts[-1]] - r["rss"][counts[0]] for r in runs]
        from_warm = [r["rss"][counts[0]] - r["rss"][0] for r in runs]
        growths[(mode, pool)] = growth
        say(
            f"{name(mode, pool)}: RSS after warm-up {median([r['rss'][0] for r in runs]):.1f} MiB; "
            f"warm-up to {counts[0]:,}: median {median(from_warm):+.1f} MiB ({rounds_list(from_warm, '{:+.1f}')})"
            + (
                f"; {counts[0]:,} to {counts[-1]:,}: median {median(growth):+.1f} MiB "
                f"({rounds_list(growth, '{:+.1f}')})"
                if len(counts) > 1
                else ""
            )
            + f"; unacked {max(r['unacked'] for r in runs)}"
        )
    for pool in pools if "dlx" in systems else []:
        runs = results[("dlx", pool)]
        growth = growths[("dlx", pool)]
        held = max(r["unacked"] for r in runs)
        met = median(growth) <= LIMIT_MIB and held == 0
        peers = []
        if "dramatiq" in systems:
            peers.append(f"Dramatiq {median(growths[('dramatiq', '-')]):+.1f} MiB")
        if "plain" in systems and pool == pools[0]:
            plain = results[("plain", pools[0])]
            peers.append(
                f"Celery autoretry {median([r['rss'][r_count(r)] - r['rss'][0] for r in plain]):+.1f} MiB "
                f"from warm-up to {r_count(plain[0]):,}, {median([r['unacked'] for r in plain]):,.0f} held unacked"
            )
        say(
            f"LIMIT P3 RSS growth {low:,} -> {high:,} parked ({pool}): {median(growth):+.1f} MiB, "
            f"unacked {held} (target <= {LIMIT_MIB} MiB and 0) {'OK' if met else 'ABOVE'}"
        )
        summary(
            "P3",
            f"worker tree RSS growth from {low:,} to {high:,} parked retries, after warm-up, "
            f"{pool}; messages held unacked",
            "<= 5 MiB, 0 unacked",
            f"{median(growth):+.1f} MiB ({rounds_list(growth, '{:+.1f}')}), {held} unacked"
            + (f"; {'; '.join(peers)}" if peers else ""),
            "met" if met else "not met",
        )
    if "dlx" in systems:
        runs = results[("dlx", pools[0])]
        worst = [r["fresh_max_ms"] for r in runs]
        summary(
            "P3b",
            f"latency of a fresh task with {high:,} retries parked, {pools[0]} (max of 20)",
            "<= 50 ms",
            f"median of rounds' max {median(worst):.1f} ms ({rounds_list(worst, '{:.1f}')})",
            "met" if median(worst) <= 50 else "not met",
        )


def r_count(r: dict[str, Any]) -> int:
    return max(r["rss"])


def name(mode: str, pool: str) -> str:
    return LABELS[mode] + ("" if mode == "dramatiq" else f" ({pool})")


if __name__ == "__main__":
    main()
