"""What one settler transaction costs the worker's main process, by the number of parks in it.

A worker's main process writes its pool's parks in batches (``celery_dlx.worker.settler``):
one ``MULTI``/``EXEC`` per batch with the parks, their history entries and counters. This
script calls the same ``Runtime.park_recorded_many`` in one process against the shared Redis,
on P10-shaped parks (``bench.park_hour``'s headers, body and fate), in batches of each size
given, and prints the CPU time (``time.thread_time``) and the wall time per park and per
batch, then the least-squares fit ``CPU per batch = fixed + per park x size``. The worker's
task events are off, as in P10. A tight loop keeps the code and data in the CPU's caches: inside
a worker, where the loop, the pool and the settler share the process, the same transaction has
measured about twice as long (the settler's own clock, 2026-11-27).

    .venv/bin/python benchmarks/park_batch_cost.py --parks 3000 --sizes 1,3,5,10,30 --rounds 3
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
import uuid
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import REDIS_URL, delete_keys, load, median, unique
from bench_app import make_app

from celery_dlx.fates import PARKED, FateEvent, now_ms
from celery_dlx.message.failure import Failure
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.wiring.runtime import get_runtime

BODY = b'[[], {}, {"callbacks": null, "errbacks": null, "chain": null, "chord": null}]'


def park(queue: str) -> tuple[ParkedMessage, FateEvent]:
    """One park as P10's ``bench.park_hour`` hands it over: Celery's headers, celery_dlx's
    state, an hour's delay, and its fate."""
    message_id = str(uuid.uuid4())
    at = now_ms()
    headers = {
        "lang": "py",
        "task": "bench.park_hour",
        "id": message_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 1,
        "timelimit": [None, None],
        "root_id": message_id,
        "parent_id": None,
        "argsrepr": "()",
        "kwargsrepr": "{}",
        "origin": "gen1234@bench",
        "ignore_result": True,
        "replaced_task_nesting": 0,
        "stamped_headers": None,
        "stamps": {},
        "x-dlx-attempt": 1,
        "x-dlx-parks": 1,
        "x-dlx-first-failure-ms": at,
        "x-dlx-cause": "TimeoutError",
    }
    properties = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 2,
        "priority": 0,
        "correlation_id": message_id,
    }
    message = ParkedMessage(
        message_id=message_id,
        attempt=1,
        queue=queue,
        body=BODY,
        headers=headers,
        properties=properties,
        due_ms=at + 3_600_000,
        parked_ms=at,
        task="bench.park_hour",
        cause="5f0c3e1d2b4a6978",
    )
    failure = Failure(
        task="bench.park_hour",
        queue=queue,
        message_id=message_id,
        importance="normal",
        exc_type="TimeoutError",
        exc_message="supplier API rate limited",
        cause="5f0c3e1d2b4a6978",
    )
    return message, FateEvent.of(PARKED, failure, delay=3600.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parks", type=int, default=3000, help="parks per size and round")
    parser.add_argument("--sizes", default="1,3,5,10,30")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    uid = unique("batch")
    app = make_app("dlx", uid)
    runtime = get_runtime(app)
    runtime.follow_worker_events(lambda: False)  # P10's worker sends no task events
    logging.disable(logging.INFO)  # the fate lines, as a worker at -l ERROR
    queue = f"bench-{uid}"
    print(f"park_batch_cost: {args.parks:,} parks per size and round, load {load()}")
    cpu: dict[int, list[float]] = {size: [] for size in sizes}
    try:
        for n in range(1, args.rounds + 1):
            for size in sizes:
                batches = [[park(queue) for _ in range(size)] for _ in range(args.parks // size)]
                started_cpu, started = time.thread_time(), time.perf_counter()
                for batch in batches:
                    failed = [o for o in runtime.park_recorded_many(batch) if o is not None]
                    if failed:
                        raise SystemExit(f"a park failed: {failed[0]!r}")
                spent_cpu = time.thread_time() - started_cpu
                spent = time.perf_counter() - started
                parks = len(batches) * size
                cpu[size].append(spent_cpu / len(batches) * 1e6)
                print(
                    f"round {n}: batches of {size}: CPU {spent_cpu / parks * 1e6:.1f} µs per "
                    f"park, {spent_cpu / len(batches) * 1e6:.0f} µs per batch; wall "
                    f"{spent / parks * 1e6:.1f} µs per park  [load {load()}]"
                )
    finally:
        client = redis.Redis.from_url(REDIS_URL)
        delete_keys(client, f"bench-{uid}")
        client.close()
    per_batch = {size: median(values) for size, values in cpu.items()}
    for size, value in per_batch.items():
        print(
            f"median batches of {size}: CPU {value / size:.1f} µs per park, {value:.0f} per batch"
        )
    if len(sizes) > 1:
        slope, fixed = statistics.linear_regression(list(per_batch), list(per_batch.values()))
        print(
            f"FIT CPU per batch = {fixed:.0f} µs per transaction + {slope:.1f} µs per park "
            "(medians, least squares)"
        )


if __name__ == "__main__":
    main()
