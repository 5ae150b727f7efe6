"""P1 clog: 10 poison + 1000 good messages at prefetch 10 in one worker process.

Time from the first run to the 1000th good message, with celery_dlx, vs. an all-good run of
1000 messages in the same worker setup (target <= 1.05x). Poison messages are requeued at the
tail and parked for an hour, so they never sit in front of good ones.

Run: .venv/bin/python benchmarks/p1_clog.py [--good 1000] [--poison 10] [--rounds 2]
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


def run(mode: str, good: int, poison: int, pool: str = "solo") -> float:
    uid = unique("p1")[3:]
    app = make_app(mode, uid)
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-{uid}"
    key = lambda name: "{" + prefix + "}:bench:" + name  # noqa: E731
    try:
        with app.connection_for_write() as conn:
            for _ in range(poison):
                app.send_task("bench.work", (True, good), connection=conn)
            for _ in range(good):
                app.send_task("bench.work", (False, good), connection=conn)
        with bench_worker(mode, uid, prefetch=10, pool=pool):
            last = float(wait_key(client, key("last"), timeout=600))
        first = float(client.get(key("first")))
        return last - first
    finally:
        cleanup(uid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--good", type=int, default=1000)
    parser.add_argument("--poison", type=int, default=10)
    parser.add_argument("--pool", default="solo", help="worker pool (solo: one process)")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    base, dlx = [], []
    for _ in range(args.rounds):
        base.append(run("dlx", args.good, 0, args.pool))
        dlx.append(run("dlx", args.good, args.poison, args.pool))
    b, d = min(base), min(dlx)
    print(f"all good ({args.good}), best of {args.rounds}: {b:.2f}s")
    print(
        f"{args.poison} poison + {args.good} good with celery_dlx, best of {args.rounds}: {d:.2f}s"
    )
    ratio = d / b
    print(
        f"RATIO P1 clog: {d:.2f}s / {b:.2f}s = {ratio:.3f}x (target <= 1.05x) {'OK' if ratio <= 1.05 else 'ABOVE'}"
    )


if __name__ == "__main__":
    main()
