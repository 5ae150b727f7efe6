"""What the storm tests share: a private Redis filled to its ``maxmemory``, the run's worker and
DLX service as processes of their own, ``celery dlx check`` as the operator runs it, the ledger.

The private Redis has a small ``maxmemory`` and ``noeviction`` (the only policy safe for parked
retries); it is stopped by PID (:class:`~tests.chaos.servers.RedisServer`). Nothing here touches
the shared servers but the run's own queues (named after its uid) and its ledger keys.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from tests.chaos.servers import RedisServer
from tests.chaos.storm_app import Names

ROOT = Path(__file__).resolve().parent.parent.parent
#: Filler values written to make Redis full (bytes each).
FILLER_SIZE = 64 * 1024
#: Prefix of the filler keys (not celery_dlx's).
FILLER_PREFIX = "storm-filler:"
#: The CLI's entry function, not the console script: a stale script cannot break a run.
CLI = [sys.executable, "-c", "from celery_dlx.cli.main import main; main()"]


@contextlib.contextmanager
def small_redis(workdir: Path, maxmemory_mb: int) -> Iterator[RedisServer]:
    """A private Redis at ``maxmemory_mb`` MB with ``noeviction``, nothing kept on disk."""
    server = RedisServer(
        workdir,
        args=[
            "--appendonly",
            "no",
            "--maxmemory",
            f"{maxmemory_mb}mb",
            "--maxmemory-policy",
            "noeviction",
        ],
    )
    server.start()
    try:
        yield server
    finally:
        server.kill()


def fill(client: redis.Redis, filler_bytes: int = 4 * 1048576) -> int:
    """Write ``filler_bytes`` of filler, then lower ``maxmemory`` 1 MB below what Redis uses:
    every write is refused (at the limit itself a refusal frees a little and the next small write
    may pass), until :func:`make_room`. Returns the filler keys written."""
    value = b"x" * FILLER_SIZE
    n = filler_bytes // FILLER_SIZE
    client.config_set("maxmemory", 0)  # room for the filler, whatever Redis holds already
    pipe = client.pipeline(transaction=False)
    for i in range(n):
        pipe.set(f"{FILLER_PREFIX}{i}", value)
    pipe.execute()
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory", used - 1048576)
    return n


def make_room(client: redis.Redis) -> int:
    """Delete the filler (a ``DEL`` is taken on a full Redis); returns the keys deleted."""
    keys = list(client.scan_iter(match=f"{FILLER_PREFIX}*", count=1000))
    return int(client.delete(*keys)) if keys else 0


def refuses_writes(client: redis.Redis) -> bool:
    try:
        client.set("storm-probe", b"1", px=100)
    except redis.exceptions.OutOfMemoryError:
        return True
    return False


class Process:
    """A worker or a DLX service of the run, in its own session, its output in ``log``."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                args,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM (the main process ends its pool), then SIGKILL the process group."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


def env_of(names: Names, redis_url: str) -> dict[str, str]:
    return {"STORM_UID": names.uid, "STORM_REDIS": redis_url}


def start_worker(
    names: Names,
    redis_url: str,
    log: Path,
    *,
    concurrency: int = 2,
    prefetch: int | None = None,
    **env: str,
) -> Process:
    args = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "tests.chaos.storm_app",
        "worker",
        "-P",
        "prefork",
        "-c",
        str(concurrency),
        "-l",
        "INFO",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
        "-n",
        f"storm-{names.uid}-{log.stem}@%h",
        *([] if prefetch is None else ["--prefetch-multiplier", str(prefetch)]),
    ]
    return Process(args, {**env_of(names, redis_url), **env}, log)


def start_service(names: Names, redis_url: str, log: Path) -> Process:
    args = [*CLI, "-A", "tests.chaos.storm_app", "service", "-l", "INFO"]
    return Process(args, env_of(names, redis_url), log)


def dlx_check(names: Names, redis_url: str) -> tuple[int, dict[str, Any]]:
    """``celery dlx check --no-management --json``: its exit code and report."""
    done = subprocess.run(
        [*CLI, "-A", "tests.chaos.storm_app", "check", "--no-management", "--json"],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env_of(names, redis_url)},
        capture_output=True,
        timeout=120,
        check=False,
    )
    try:
        report = json.loads(done.stdout)
    except ValueError:
        report = {"stdout": done.stdout.decode(errors="replace")}
    report["stderr"] = done.stderr.decode(errors="replace")[-2000:]
    return done.returncode, report


def wait_for(predicate: Any, what: str, timeout: float, every: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(every)


def ledger(client: redis.Redis, names: Names) -> dict[str, dict[str, float]]:
    """The run's ledger: runs, first run and success time per message id."""
    out: dict[str, dict[str, float]] = {}
    for key, field in ((names.runs, "runs"), (names.first_at, "first"), (names.done_at, "done")):
        for message_id, value in client.hgetall(key).items():
            name = message_id.decode() if isinstance(message_id, bytes) else str(message_id)
            out.setdefault(name, {})[field] = float(value)
    return out
