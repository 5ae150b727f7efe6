"""A private Spark standalone cluster for tests: one master and its workers from pip's pyspark.

Each daemon runs ``spark-class`` (which execs the JVM, so its PID is the daemon's) on free
loopback ports, with its logs and work directory under its owner's folder, and is stopped by
that PID. Nothing here touches another Spark installation or cluster.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from tests.chaos.servers import free_port, wait_for

#: Seconds to wait for the master to answer and for its workers to register.
START_TIMEOUT = 90.0
#: Seconds a daemon gets to exit after SIGTERM before SIGKILL.
STOP_TIMEOUT = 20.0


def spark_home() -> Path:
    """The pyspark package directory: a Spark home with ``bin/spark-class`` and the jars."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def fetch_json(url: str) -> Any:
    """The JSON a master's or worker's web UI serves at ``url``."""
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.load(response)


class SparkStandalone:
    """A master on ``127.0.0.1`` and ``workers`` workers of one core and ``worker_memory`` each."""

    def __init__(self, workdir: str | Path, workers: int = 2, worker_memory: str = "1g") -> None:
        self.workdir = Path(workdir)
        self.workers = workers
        self.worker_memory = worker_memory
        self.port = free_port()
        self.webui_port = free_port()
        self.processes: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []

    @property
    def url(self) -> str:
        """The master URL for ``--master``."""
        return f"spark://127.0.0.1:{self.port}"

    @property
    def status_url(self) -> str:
        """The master's JSON status (workers, active and completed applications)."""
        return f"http://127.0.0.1:{self.webui_port}/json/"

    def status(self) -> Any:
        return fetch_json(self.status_url)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(SPARK_HOME=str(spark_home()), SPARK_LOCAL_IP="127.0.0.1")
        return env

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.workdir / f"{name}.log", "wb")  # noqa: SIM115  # closed in stop()
        self._logs.append(log)
        command = [str(spark_home() / "bin" / "spark-class"), *args]
        self.processes.append(
            subprocess.Popen(
                command,
                env=self._env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        )

    def _answers(self) -> bool:
        """True once the master's UI serves its JSON status, and it is this master's (another
        suite's Spark on a port just freed, or a UI still starting, serves other text)."""
        self._follow_ui_port()
        try:
            status = self.status()
        except (OSError, ValueError):  # not listening yet, or not JSON yet
            return False
        return bool(status.get("status") == "ALIVE" and status.get("url") == self.url)

    def _follow_ui_port(self) -> None:
        """The UI port the master bound: Spark takes the next one when ``--webui-port`` is taken."""
        log = self.workdir / "master.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        found = re.findall(r"MasterWebUI.*started at http://[^:]+:(\d+)", text)
        if found:
            self.webui_port = int(found[-1])

    def alive_workers(self) -> list[dict[str, Any]]:
        try:
            workers = self.status()["workers"]
        except (OSError, ValueError):
            return []
        return [worker for worker in workers if worker["state"] == "ALIVE"]

    def start(self) -> None:
        """Start the master, then the workers, and wait until every worker is ALIVE."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        master = "org.apache.spark.deploy.master.Master"
        ports = ["--port", str(self.port), "--webui-port", str(self.webui_port)]
        self._spawn("master", master, "--host", "127.0.0.1", *ports)
        wait_for(self._answers, f"the Spark master at {self.status_url}", START_TIMEOUT)
        for i in range(self.workers):
            work = self.workdir / f"worker{i}"
            work.mkdir(exist_ok=True)
            self._spawn(
                f"worker{i}",
                "org.apache.spark.deploy.worker.Worker",
                self.url,
                *("--host", "127.0.0.1", "--cores", "1", "--memory", self.worker_memory),
                *("--webui-port", "0", "--work-dir", str(work)),
            )
        wait_for(
            lambda: len(self.alive_workers()) == self.workers,
            f"{self.workers} ALIVE workers at {self.status_url}",
            START_TIMEOUT,
        )

    def log_tail(self, lines: int = 30) -> str:
        """The end of every daemon's log, to explain a failure."""
        parts = []
        for path in sorted(self.workdir.glob("*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGTERM each daemon by PID, workers first (they stop their executors), then SIGKILL
        what is left of its own session (executors and Python workers it started)."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in reversed(self.processes):
            try:
                process.wait(timeout=STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        for log in self._logs:
            log.close()
        self.processes.clear()
        self._logs.clear()


@contextlib.contextmanager
def spark_standalone(workdir: str | Path, workers: int = 2) -> Iterator[SparkStandalone]:
    """A started standalone cluster in ``workdir`` (master and ``workers`` workers); stopped after."""
    cluster = SparkStandalone(workdir, workers=workers)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
