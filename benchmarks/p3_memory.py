"""P3 memory: worker RSS growth with N parked one-hour retries, celery_dlx vs. Celery countdown.

Each task fails once with ``self.retry(countdown=3600)``. With celery_dlx the retry is parked in
Redis and the message acked; with plain Celery it is an ETA message the worker holds unacked in
memory. Reports the worker's RSS growth (main process and pool child), the messages held unacked
once every first run is done, and (P3b) the latency of fresh tasks published afterwards.
Targets: <= 5 MiB growth and 0 unacked for celery_dlx at 100k; P3b <= 50 ms.

Run: .venv/bin/python benchmarks/p3_memory.py [--parked 100000] [--plain 20000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import BROKER_URL, REDIS_URL, percentile, unique
from _workers import bench_worker, cleanup, tree_rss, unacked, wait_for_consumer
from bench_app import make_app
from kombu import Connection

MIB = 1024 * 1024


def run(mode: str, n: int, fresh: int = 20, task: str = "bench.park_hour") -> dict[str, float]:
    uid = unique("p3")[3:]
    app = make_app(mode, uid)
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-{uid}"
    queue = f"bench-{uid}"

    def key(name: str) -> str:
        return "{" + prefix + "}:bench:" + name

    try:
        with bench_worker(mode, uid, prefetch=10) as proc, Connection(BROKER_URL) as conn:
            channel = conn.channel()
            # Warm up: 200 retries so imports and connections are made before the baseline.
            with app.connection_for_write() as pub:
                for _ in range(200):
                    app.send_task(task, connection=pub)
            wait_for_consumer(channel, queue)
            while int(client.get(key("runs")) or 0) < 200:
                time.sleep(0.05)
            time.sleep(1.0)
            before = tree_rss(proc)
            started = time.monotonic()
            with app.connection_for_write() as pub:
                for _ in range(n):
                    app.send_task(task, connection=pub)
            while int(client.get(key("runs")) or 0) < 200 + n:
                time.sleep(0.2)
            elapsed = time.monotonic() - started
            # RabbitMQ refreshes queue statistics every 5 s (collect_statistics_interval).
            time.sleep(6.0)
            after = tree_rss(proc)
            held = unacked(queue)
            latencies = []
            for _ in range(fresh):
                app.send_task("bench.fresh", (time.time(),))
                deadline = time.monotonic() + 120
                while (
                    client.llen(key("latency")) < len(latencies) + 1 and time.monotonic() < deadline
                ):
                    time.sleep(0.002)
                values = client.lrange(key("latency"), 0, -1)
                if len(values) <= len(latencies):
                    latencies.append(float("inf"))
                    break
                latencies.append(float(values[-1]) * 1000)
        return {
            "growth_mib": (after - before) / MIB,
            "unacked": held,
            "seconds": elapsed,
            "fresh_p50_ms": percentile(latencies, 50),
            "fresh_max_ms": max(latencies),
        }
    finally:
        cleanup(uid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parked", type=int, default=100_000)
    parser.add_argument("--plain", type=int, default=20_000)
    args = parser.parse_args()
    dlx = run("dlx", args.parked)
    # The worker's own growth for as many messages, each a no-op that succeeds (bench.count_run):
    # what Celery itself keeps per message processed, with nothing parked and nothing held.
    floor = run("plain", args.parked, fresh=1, task="bench.count_run")
    plain = run("plain", args.plain)
    print(
        f"celery_dlx, {args.parked:,} parked one-hour retries: RSS growth {dlx['growth_mib']:.1f} MiB, "
        f"unacked {dlx['unacked']:.0f}, {dlx['seconds']:.0f}s to park all; "
        f"fresh task latency p50 {dlx['fresh_p50_ms']:.1f} ms, max {dlx['fresh_max_ms']:.1f} ms"
    )
    print(
        f"plain Celery, {args.plain:,} countdown retries: RSS growth {plain['growth_mib']:.1f} MiB, "
        f"unacked {plain['unacked']:.0f}, {plain['seconds']:.0f}s; "
        f"fresh task latency p50 {plain['fresh_p50_ms']:.1f} ms, max {plain['fresh_max_ms']:.1f} ms"
    )
    print(
        f"plain Celery, {args.parked:,} no-op tasks (the worker's own growth per message processed): "
        f"RSS growth {floor['growth_mib']:.1f} MiB"
    )
    print(
        f"celery_dlx growth beyond plain Celery's own for as many messages: "
        f"{dlx['growth_mib'] - floor['growth_mib']:.1f} MiB"
    )
    ok = dlx["growth_mib"] <= 5 and dlx["unacked"] == 0
    print(
        f"LIMIT P3 RSS growth at {args.parked:,} parked: {dlx['growth_mib']:.1f} MiB, unacked {dlx['unacked']:.0f} "
        f"(target <= 5 MiB and 0) {'OK' if ok else 'ABOVE'}"
    )
    print(
        f"LIMIT P3b fresh task latency max: {dlx['fresh_max_ms']:.1f} ms (target <= 50 ms) "
        f"{'OK' if dlx['fresh_max_ms'] <= 50 else 'ABOVE'}"
    )


if __name__ == "__main__":
    main()
