"""Starting and measuring benchmark worker processes (benchmarks/bench_app.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psutil
from _common import ROOT

#: The systems a benchmark worker can run: celery_dlx, plain Celery (acks late), Dramatiq as it
#: ships (publishes not confirmed), and Dramatiq with ``confirm_delivery=True``: a retry's copy is
#: confirmed by the broker before the original is acked, as celery_dlx acks a failed message only
#: once Redis has its park (the same delivery guarantee).
SYSTEMS = ("dlx", "plain", "dramatiq", "dramatiq_confirm")
#: How each system is named in the output.
LABELS = {
    "dlx": "celery_dlx",
    "plain": "Celery autoretry",
    "dramatiq": "Dramatiq",
    "dramatiq_confirm": "Dramatiq (confirm_delivery)",
}


def is_dramatiq(mode: str) -> bool:
    """True for the Dramatiq systems (one worker model: 1 process, 1 thread; no Celery pool)."""
    return mode.startswith("dramatiq")


#: Celery pools a benchmark runs; prefork (Celery's default) is the headline.
POOLS = ("prefork", "solo", "threads")


def worker_command(mode: str, uid: str, pool: str) -> list[str]:
    """The command line of one worker: one process (or one pool child / one thread; Celery's
    ``-c`` from ``BENCH_CONCURRENCY`` when set)."""
    if is_dramatiq(mode):
        return [
            sys.executable,
            "-m",
            "dramatiq",
            "dramatiq_app",
            "--processes",
            "1",
            "--threads",
            "1",
        ]
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "bench_app",
        "worker",
        "-P",
        pool,
        "-c",
        os.environ.get("BENCH_CONCURRENCY", "1"),
        "-l",
        "ERROR",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"bench-{mode}-{uid}@%h",
    ]


@contextmanager
def bench_worker(
    mode: str,
    uid: str,
    *,
    pool: str = "prefork",
    prefetch: int = 10,
    extra_env: dict[str, str] | None = None,
    cmd: list[str] | None = None,
) -> Iterator[subprocess.Popen[bytes]]:
    """A worker process for ``bench_app.py`` (``mode`` dlx/plain) or ``dramatiq_app.py``.

    Its output goes to a log file in the temp directory (a pipe nobody reads would block it);
    the file is removed on exit unless the worker failed.
    """
    env = {
        **os.environ,
        "BENCH_MODE": mode,
        "BENCH_UID": uid,
        "BENCH_PREFETCH": str(prefetch),
        "BENCH_DRAMATIQ_CONFIRM": "1" if mode == "dramatiq_confirm" else "0",
        "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'benchmarks'}",
        **(extra_env or {}),
    }
    log = tempfile.NamedTemporaryFile(  # noqa: SIM115
        prefix=f"bench-{mode}-{uid}-", suffix=".log", delete=False
    )
    proc = subprocess.Popen(
        cmd or worker_command(mode, uid, pool),
        cwd=ROOT / "benchmarks",
        env=env,
        start_new_session=True,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        yield proc
    finally:
        ended = proc.poll() is not None
        failed = ended and proc.returncode != 0
        if not ended:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        log.close()
        if failed:
            print(f"worker exited early (rc {proc.returncode}); its output: {log.name}")
        else:
            os.unlink(log.name)


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


def tree_cpu(proc: subprocess.Popen[bytes]) -> float:
    """CPU seconds (user + system) used so far by a worker process and its live children."""
    parent = psutil.Process(proc.pid)
    total = 0.0
    for p in [parent, *parent.children(recursive=True)]:
        with contextlib.suppress(psutil.NoSuchProcess):
            times = p.cpu_times()
            total += times.user + times.system
    return total


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
        queues = (f"bench-{uid}", f"bench-dead-{uid}", f"bench-{uid}.DQ", f"bench-{uid}.XQ")
        for queue in queues:
            channel.queue_delete(queue)
        channel.exchange_delete(f"bench-dlx-{uid}")
        channel.exchange_delete(f"bench-{uid}")


def wait_count(client: Any, key: str, count: int, timeout: float, proc: Any = None) -> None:
    """Block until the integer at ``key`` reaches ``count`` (the worker must stay alive)."""
    deadline = time.monotonic() + timeout
    while int(client.get(key) or 0) < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{key} below {count} after {timeout}s: {client.get(key)!r}")
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(
                f"worker exited (rc {proc.returncode}) with {key} at {client.get(key)!r}"
            )
        time.sleep(0.05)


def wait_key(client: Any, key: str, timeout: float) -> bytes:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = client.get(key)
        if value is not None:
            return bytes(value)
        time.sleep(0.02)
    raise RuntimeError(f"{key} not set after {timeout}s")


#: Dramatiq's actor name for each bench_app task.
DRAMATIQ_ACTORS = {
    "bench.noop": "bench_noop",
    "bench.work": "bench_work",
    "bench.park_hour": "bench_park_hour",
    "bench.count_run": "bench_count_run",
    "bench.fresh": "bench_fresh",
}


def publish(mode: str, uid: str, task: str, calls: list[tuple[Any, ...]]) -> None:
    """Publish one ``task`` message per args tuple of ``calls`` to ``bench-<uid>``, in order."""
    if is_dramatiq(mode):
        import dramatiq_app

        dramatiq_app.publish(uid, DRAMATIQ_ACTORS[task], calls)
        return
    from bench_app import make_app

    app = make_app(mode, uid)
    with app.connection_for_write() as conn:
        for args in calls:
            app.send_task(task, args, connection=conn)
