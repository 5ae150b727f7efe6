"""P2 success path: no-op DLXTask throughput vs. a plain Celery task, same worker setup.

Each run publishes N no-op tasks, starts one worker process (`--pool`, default solo: one process; prefetch 10)
and times the first run to the last. Plain Celery uses its defaults (acks early); celery_dlx
acks late. Target: celery_dlx >= 0.95x plain.

Run: .venv/bin/python benchmarks/p2_success.py [--tasks 5000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import REDIS_URL, unique
from _workers import bench_worker, cleanup, wait_key
from bench_app import make_app


def run(mode: str, tasks: int, pool: str = "solo") -> float:
    """Tasks per second of one worker over ``tasks`` no-op tasks."""
    uid = unique("p2")[3:]
    app = make_app(mode, uid)
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-{uid}"

    def key(name: str) -> str:
        return "{" + prefix + "}:bench:" + name

    try:
        with app.connection_for_write() as conn:
            for _ in range(tasks):
                app.send_task("bench.noop", (tasks,), connection=conn)
        with bench_worker(mode, uid, prefetch=10, pool=pool):
            last = float(wait_key(client, key("last"), timeout=600))
        first = float(client.get(key("first")))
        return (tasks - 1) / (last - first)
    finally:
        cleanup(uid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--pool", default="solo", help="worker pool (solo: one process)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    plain, dlx = [], []
    for _ in range(args.rounds):
        plain.append(run("plain", args.tasks, args.pool))
        dlx.append(run("dlx", args.tasks, args.pool))
    p, d = max(plain), max(dlx)
    print(
        f"plain Celery no-op, best of {args.rounds}: {p:,.0f} tasks/s  (all: {', '.join(f'{x:,.0f}' for x in plain)})"
    )
    print(
        f"celery_dlx no-op,   best of {args.rounds}: {d:,.0f} tasks/s  (all: {', '.join(f'{x:,.0f}' for x in dlx)})"
    )
    ratio = d / p
    print(
        f"RATIO P2 success path: {d:,.0f} / {p:,.0f} = {ratio:.3f}x (target >= 0.95x) {'OK' if ratio >= 0.95 else 'BELOW'}"
    )


if __name__ == "__main__":
    main()
