"""``bench_app`` with tracemalloc on, for finding what a worker keeps per handled failure.

Run as a worker app (``celery -A trace_app worker -P solo|threads``) by
``benchmarks/p3_tracemalloc.py``; ``bench.snapshot(path)`` collects garbage and writes a
tracemalloc snapshot of the worker process (solo and threads run tasks in that process).
"""

from __future__ import annotations

import gc
import tracemalloc

tracemalloc.start(int(__import__("os").environ.get("BENCH_TRACE_FRAMES", "30")))

from bench_app import _redis, app, key  # noqa: E402

__all__ = ["app"]


@app.task(name="bench.snapshot")
def snapshot(path: str) -> None:
    """Collect garbage, dump a tracemalloc snapshot to ``path``, count itself."""
    gc.collect()
    tracemalloc.take_snapshot().dump(path)
    _redis.incr(key("snapshots"))
