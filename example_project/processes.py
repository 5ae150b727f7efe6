"""The demo's processes: a Celery worker (with beat and the DLX service) and the fulfilment service.

Each runs in its own process group with its output in a log file of the run's directory, and is
stopped with SIGTERM (a warm shutdown: running tasks finish, the DLX service acks its batch),
then SIGKILL if it has not stopped in time.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Directory holding the ``example_project`` package (the processes' working directory).
ROOT = Path(__file__).resolve().parent.parent
#: Seconds a process gets for a warm shutdown before it is killed.
STOP_TIMEOUT = 30.0


@dataclass
class Service:
    """One started process and its log."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL to its process group after :data:`STOP_TIMEOUT`; its exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return self.proc.returncode


def _start(name: str, argv: list[str], run: str, rundir: Path) -> Service:
    log = rundir / f"{name}.log"
    env = {**os.environ, "EXAMPLE_RUN": run, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return Service(name, proc, log)


def start_worker(run: str, rundir: Path) -> Service:
    """``celery worker -B``: tasks, beat (it schedules the drain) and the DLX service thread."""
    argv = [
        sys.executable,
        "-m",
        "celery",
        "-A",
        "example_project.app",
        "worker",
        "-B",
        "--schedule",
        str(rundir / "beat-schedule"),
        "-P",
        "prefork",
        "-c",
        "2",
        "-l",
        "INFO",
        "-n",
        f"orders-{run}@%h",
        "--without-gossip",
        "--without-mingle",
        # Task events for Flower (celery_dlx's own fate events are sent either way).
        "-E",
    ]
    return _start("worker", argv, run, rundir)


def start_fulfilment(run: str, rundir: Path) -> Service:
    """The fulfilment service, a plain pika consumer standing for a Go service."""
    return _start("fulfilment", [sys.executable, "-m", "example_project.fulfilment"], run, rundir)


def consumers(conn: Any, queue: str) -> int:
    """Consumers of ``queue`` (0 if it does not exist yet)."""
    channel = conn.channel()
    try:
        return int(channel.queue_declare(queue, passive=True).consumer_count)
    except Exception:  # 404: not declared yet (the channel is closed by the broker)
        return 0
    finally:
        with contextlib.suppress(Exception):  # already closed by the 404
            channel.close()


def wait_ready(
    conn: Any, queues: list[str], services: list[Service], timeout: float, say: Any
) -> None:
    """Wait until every queue in ``queues`` has a consumer.

    Raises:
        RuntimeError: a service exited, or ``timeout`` seconds passed.
    """
    deadline = time.monotonic() + timeout
    waiting = list(queues)
    while waiting:
        for service in services:
            if not service.alive():
                raise RuntimeError(
                    f"the {service.name} exited with code {service.proc.returncode}:\n"
                    f"{service.tail()}"
                )
        waiting = [q for q in waiting if consumers(conn, q) == 0]
        if waiting and time.monotonic() > deadline:
            raise RuntimeError(f"no consumer on {', '.join(waiting)} after {timeout:g}s")
        if waiting:
            time.sleep(0.25)
    say("  every queue has its consumer")
