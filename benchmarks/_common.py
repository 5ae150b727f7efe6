"""Helpers shared by the benchmark scripts: service URLs, unique names, percentiles, ratio lines.

Benchmarks run against the real RabbitMQ and Redis (``DLX_BENCH_BROKER`` / ``DLX_BENCH_REDIS``
override the loopback defaults), use unique queue names and key prefixes, and delete what they
created. Speed is reported as a ratio against a baseline measured in the same run, so a busy
machine moves both sides together.
"""

from __future__ import annotations

import json
import math
import os
import re
import statistics
import sys
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BROKER_URL = os.environ.get("DLX_BENCH_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("DLX_BENCH_REDIS", "redis://127.0.0.1:6379/0")


def load() -> str:
    """The machine's load average now, ``1/5/15-minute``, printed with every figure."""
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f}/{five:.2f}/{fifteen:.2f}"


def load1() -> float:
    """The one-minute load average."""
    return os.getloadavg()[0]


def say(text: str) -> None:
    """Print a line at once (run_all reads the scripts' output as they go)."""
    print(text, flush=True)


def round_line(name: str, n: int, value: str) -> None:
    """One round's figure, with the load it was measured under."""
    say(f"round {n}: {name}: {value}  [load {load()}]")


def rounds_text(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """``median M (r1, r2, ...)``."""
    return (
        f"median {fmt.format(median(values))} (rounds "
        + ", ".join(fmt.format(v) for v in values)
        + ")"
    )


def rounds_list(values: Sequence[float], fmt: str = "{:.2f}") -> str:
    """``rounds r1, r2, ...``."""
    return "rounds " + ", ".join(fmt.format(v) for v in values)


def summary(
    bench: str,
    metric: str,
    target: str,
    measured: str,
    verdict: str,
    **extra: Any,
) -> None:
    """One machine-readable ``SUMMARY {json}`` line: a row of docs/benchmarks.md's table.

    ``benchmarks/run_all.py`` collects these lines; ``verdict`` is ``met``, ``not met`` or
    ``measured`` (no target). The load average at the time is added.
    """
    row = {
        "bench": bench,
        "metric": metric,
        "target": target,
        "measured": measured,
        "verdict": verdict,
        "load": load(),
        **extra,
    }
    say("SUMMARY " + json.dumps(row, sort_keys=True))


def unique(prefix: str) -> str:
    """A name no other run uses: ``<prefix>-<10 hex digits>``."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def percentile(values: Sequence[float], pct: float) -> float:
    """The ``pct`` percentile (0-100) of ``values``, linearly interpolated; NaN when empty."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * pct / 100.0
    low = math.floor(rank)
    high = math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def median(values: Sequence[float]) -> float:
    """The median of ``values``; NaN when empty."""
    return statistics.median(values) if values else math.nan


def ratio_line(name: str, measured: float, baseline: float, target: float) -> str:
    """One line ``RATIO <name>: <measured>/<baseline> = <x> (target >= <t>) OK|BELOW``."""
    ratio = measured / baseline if baseline else math.nan
    verdict = "OK" if ratio >= target else "BELOW"
    return (
        f"RATIO {name}: {measured:,.1f} / {baseline:,.1f} = {ratio:.2f}x "
        f"(target >= {target:.2f}x) {verdict}"
    )


def paired_ratio_line(name: str, ratios: Sequence[float], target: float) -> str:
    """One line ``RATIO <name>: median of per-round ratios <x> (rounds ...) OK|BELOW``.

    Each round measures both sides back to back, so a load change on a shared machine moves
    both; the median of the rounds' ratios is steadier than a ratio of medians.
    """
    ratio = median(ratios)
    verdict = "OK" if ratio >= target else "BELOW"
    rounds = ", ".join(f"{r:.2f}" for r in ratios)
    return (
        f"RATIO {name}: {ratio:.2f}x median of per-round ratios ({rounds}) "
        f"(target >= {target:.2f}x) {verdict}"
    )


def limit_line(name: str, measured: float, limit: float, unit: str = "") -> str:
    """One line ``LIMIT <name>: <measured> (target <= <limit>) OK|ABOVE``."""
    verdict = "OK" if measured <= limit else "ABOVE"
    return f"LIMIT {name}: {measured:,.1f}{unit} (target <= {limit:,.1f}{unit}) {verdict}"


def callgrind(log_file: str) -> list[str]:
    """The command prefix that runs a program under valgrind's callgrind, counting instructions
    only (no profile written); :func:`collected` reads the count from ``log_file``."""
    return [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        f"--log-file={log_file}",
    ]


def collected(log_text: str) -> int | None:
    """The instructions a callgrind log counted (its ``Collected :`` line), if it has one."""
    found = re.search(r"Collected : (\d+)", log_text)
    return int(found.group(1)) if found else None


def delete_keys(client: Any, prefix: str) -> int:
    """Delete every Redis key of the celery_dlx key prefix ``prefix`` (``{prefix}*``)."""
    deleted = 0
    for key in client.scan_iter(match="{" + prefix + "}*", count=1000):
        deleted += int(client.delete(key))
    return deleted


@contextmanager
def scratch_queues(connection: Any) -> Iterator[list[str]]:
    """Yield a list; every queue (or ``exchange:NAME``) appended is deleted on exit."""
    names: list[str] = []
    try:
        yield names
    finally:
        channel = connection.channel()
        for name in names:
            try:
                if name.startswith("exchange:"):
                    channel.exchange_delete(name[len("exchange:") :])
                else:
                    channel.queue_delete(name)
            except Exception:  # a queue already gone closes the channel; keep cleaning
                channel = connection.channel()
        channel.close()


def free_port() -> int:
    """A TCP port nothing listens on now."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateRedis:
    """A Redis server of the benchmark's own on a free port (no persistence), stopped by its PID."""

    def __init__(self, prefix: str = "bench-redis-") -> None:
        import shutil
        import subprocess
        import tempfile
        import time

        import redis

        self._rmtree = shutil.rmtree
        self.dir = tempfile.mkdtemp(prefix=prefix)
        self.port = free_port()
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self.dir,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise
                time.sleep(0.05)

    def commands(self) -> dict[str, int]:
        """Calls per command so far (``INFO commandstats``)."""
        stats = self.client.info("commandstats")
        return {name[len("cmdstat_") :]: int(v["calls"]) for name, v in stats.items()}

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)
        self._rmtree(self.dir, ignore_errors=True)
