"""What a solo or threads worker keeps per handled failure: tracemalloc snapshots compared.

One worker (``benchmarks/trace_app.py``: ``bench_app`` with tracemalloc on) takes ``--warmup``
failures (``bench.park_hour``: a one-hour retry, parked by celery_dlx), then snapshot A; then
``--failures`` more, snapshot B. Prints the allocations alive in B and not in A, grouped by
traceback (the frames that made them), largest first, and the RSS of the worker at each point.

Run: .venv/bin/python benchmarks/p3_tracemalloc.py [--pool solo] [--warmup 2000] [--failures 10000]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import REDIS_URL, load, say, unique
from _workers import bench_worker, cleanup, publish, tree_rss, wait_count, worker_command

MIB = 1024 * 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pool", default="solo", choices=("solo", "threads"))
    parser.add_argument("--mode", default="dlx", choices=("dlx", "plain"))
    parser.add_argument("--task", default="bench.park_hour")
    parser.add_argument("--warmup", type=int, default=2000)
    parser.add_argument("--failures", type=int, default=10000)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--frames", type=int, default=30)
    args = parser.parse_args()
    uid = unique("p3t")[4:]
    client = redis.Redis.from_url(REDIS_URL)

    def key(name: str) -> str:
        return "{bench-" + uid + "}:bench:" + name

    tmp = Path(tempfile.mkdtemp(prefix="p3-trace-"))
    cmd = worker_command(args.mode, uid, args.pool)
    cmd[cmd.index("bench_app")] = "trace_app"
    say(f"tracemalloc, {args.mode} {args.pool} worker, {args.task}, load {load()}")
    try:
        env = {"BENCH_TRACE_FRAMES": str(args.frames)}
        with bench_worker(args.mode, uid, pool=args.pool, cmd=cmd, extra_env=env) as proc:
            rss = []
            done = 0
            for name, count in (("A", args.warmup), ("B", args.failures)):
                publish(args.mode, uid, args.task, [()] * count)
                done += count
                wait_count(client, key("runs"), done, 7200, proc)
                publish(args.mode, uid, "bench.snapshot", [(str(tmp / name),)])
                wait_count(client, key("snapshots"), 1 if name == "A" else 2, 600, proc)
                time.sleep(0.5)
                rss.append(tree_rss(proc) / MIB)
                say(
                    f"snapshot {name} after {done:,} failures: RSS {rss[-1]:.1f} MiB [load {load()}]"
                )
    finally:
        cleanup(uid)
    a = tracemalloc.Snapshot.load(str(tmp / "A"))
    b = tracemalloc.Snapshot.load(str(tmp / "B"))
    ignore = [tracemalloc.Filter(False, tracemalloc.__file__)]
    a, b = a.filter_traces(ignore), b.filter_traces(ignore)
    total_a = sum(s.size for s in a.statistics("filename"))
    total_b = sum(s.size for s in b.statistics("filename"))
    say(
        f"traced memory: A {total_a / MIB:.2f} MiB, B {total_b / MIB:.2f} MiB: "
        f"{total_b - total_a:+,} B = {(total_b - total_a) / args.failures:+.1f} B per failure; "
        f"RSS {rss[1] - rss[0]:+.1f} MiB"
    )
    for group in ("lineno", "traceback"):
        say(f"\n== top {args.top} differences by {group}")
        for stat in b.compare_to(a, group)[: args.top]:
            say(
                f"{stat.size_diff:+,} B in {stat.count_diff:+,} blocks "
                f"({stat.size_diff / args.failures:+.1f} B per failure)"
            )
            frames = stat.traceback.format(limit=args.frames if group == "traceback" else 1)
            for line in frames[-24:]:
                say("    " + line)


if __name__ == "__main__":
    main()
