"""Starting and measuring benchmark worker processes (benchmarks/bench_app.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
from _common import ROOT


@contextmanager
def bench_worker(
    mode: str,
    uid: str,
    *,
    pool: str = "solo",
    prefetch: int = 10,
    extra_env: dict[str, str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process for ``benchmarks/bench_app.py`` in ``mode``; stopped on exit."""
    env = {
        **os.environ,
        "BENCH_MODE": mode,
        "BENCH_UID": uid,
        "BENCH_PREFETCH": str(prefetch),
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}",
        **(extra_env or {}),
    }
    cmd = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench_app",
        "worker",
        "-P",
        pool,
        "-c",
        "1",
        "-l",
        "ERROR",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"bench-{mode}-{uid}@%h",
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT / "benchmarks",
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def wait_for_consumer(channel: Any, queue: str, timeout: float = 60.0) -> None:
    """Block until ``queue`` has a consumer (the worker is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if channel.queue_declare(queue, passive=True).consumer_count >= 1:
                return
        except Exception:
            channel = channel.connection.channel() if hasattr(channel, "connection") else channel
        time.sleep(0.05)
    raise RuntimeError(f"no consumer on {queue} after {timeout}s")


def tree_rss(proc: subprocess.Popen[bytes]) -> int:
    """Resident memory of a worker process and its children, in bytes."""
    parent = psutil.Process(proc.pid)
    return sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])


def unacked(queue: str) -> int:
    """Messages of ``queue`` delivered to consumers and not yet acked (rabbitmqctl)."""
    out = subprocess.run(
        ["rabbitmqctl", "-q", "list_queues", "name", "messages_unacknowledged"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == queue:
            return int(parts[1])
    return 0


def cleanup(uid: str) -> None:
    """Delete the keys, queues and exchanges of one bench_app run."""
    import redis
    from _common import BROKER_URL, REDIS_URL, delete_keys
    from kombu import Connection

    delete_keys(redis.Redis.from_url(REDIS_URL), f"bench-{uid}")
    with Connection(BROKER_URL) as conn:
        channel = conn.channel()
        for queue in (f"bench-{uid}", f"bench-dead-{uid}"):
            channel.queue_delete(queue)
        channel.exchange_delete(f"bench-dlx-{uid}")
        channel.exchange_delete(f"bench-{uid}")


def wait_key(client: Any, key: str, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = client.get(key)
        if value is not None:
            return bytes(value)
        time.sleep(0.02)
    raise RuntimeError(f"{key} not set after {timeout}s")
