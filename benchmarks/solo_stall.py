"""Where a solo-pool worker waits: rounds of P2's no-op backlog on the solo pool, each worker's
event loop watched by a tick probe (``BENCH_PROBE_TICKS`` in ``bench_app``), every wait longer
than ``--threshold`` seconds printed with what was already queued to run when it began.

A stall whose ``ready`` count is above zero waited in the poll with callbacks scheduled on the
loop (kombu's ``Hub.call_soon``) not yet run; with ``ready`` 0 it waited for the socket.

Run: .venv/bin/python benchmarks/solo_stall.py [--tasks 2000] [--rounds 3] [--modes plain,dlx]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import REDIS_URL, load, say, unique
from _workers import bench_worker, cleanup, publish, wait_key


def run(
    mode: str, tasks: int, threshold: float, pool: str
) -> tuple[float, list[dict[str, object]]]:
    uid = unique("ss")[3:]
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-{uid}"

    def key(name: str) -> str:
        return "{" + prefix + "}:bench:" + name

    try:
        publish(mode, uid, "bench.noop", [(tasks,)] * tasks)
        env = {"BENCH_PROBE_TICKS": str(threshold)}
        with bench_worker(mode, uid, prefetch=10, pool=pool, extra_env=env):
            wait_key(client, key("first"), timeout=900)
            wait_key(client, key("last"), timeout=900)
        first, last = float(client.get(key("first"))), float(client.get(key("last")))
        stalls = [json.loads(s) for s in client.lrange(key("stalls"), 0, -1)]
        return (tasks - 1) / (last - first), stalls
    finally:
        cleanup(uid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--modes", default="plain,dlx")
    parser.add_argument("--pool", default="solo")
    parser.add_argument("--threshold", type=float, default=0.1)
    args = parser.parse_args()
    say(f"solo stall probe: {args.tasks:,} no-op tasks, {args.pool}, load {load()}")
    for n in range(1, args.rounds + 1):
        for mode in args.modes.split(","):
            rate, stalls = run(mode, args.tasks, args.threshold, args.pool)
            waited = sum(float(s["gap"]) for s in stalls)  # type: ignore[arg-type]
            say(
                f"round {n} {mode}: {rate:,.0f}/s, {len(stalls)} waits > {args.threshold}s "
                f"({waited:.2f}s in all)"
            )
            for s in stalls:
                say(f"    {float(s['gap']):.3f}s, {s['ready']} ready: {s['what']}")  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
