"""Worker subprocesses of ``tests.integration.dropin_app`` for the drop-in tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.conftest import ROOT

APP = "tests.integration.dropin_app"


def env(uid: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "DLX_TEST_UID": uid, "PYTHONPATH": str(ROOT), **extra}


def command(uid: str, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        APP,
        "worker",
        # prefork, the usual production pool (tests/integration/test_publisher_threads.py covers
        # the thread pool's shared publisher)
        "-P",
        "prefork",
        "-c",
        "2",
        "--without-gossip",
        "--without-mingle",
        "-n",
        f"dropin-{uid}-{os.urandom(2).hex()}@%h",
        *args,
    ]


@contextmanager
def worker_process(
    uid: str, log: Path, *args: str, broker: str | None = None
) -> Iterator[subprocess.Popen[bytes]]:
    """A worker (``-l INFO`` unless ``args`` say otherwise) logging to ``log``; stopped with
    SIGTERM (warm shutdown) at the end. ``broker``: its broker URL (default ``BROKER_URL``)."""
    if "-l" not in args:
        args = (*args, "-l", "INFO")
    extra = {"DLX_TEST_BROKER": broker} if broker else {}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command(uid, *args),
            cwd=ROOT,
            env=env(uid, **extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


#: ``celery`` with this tree's ``dlx`` command registered, whatever entry point metadata the
#: shared venv holds (an editable install made before a layout change names a stale module).
CELERY = (
    "import sys; from celery.bin.celery import celery; from celery_dlx.cli.main import dlx; "
    "celery.add_command(dlx); sys.exit(celery.main(args=sys.argv[1:], prog_name='celery'))"
)


def celery_cli(uid: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``celery -A tests.integration.dropin_app ARGS`` in a subprocess."""
    return subprocess.run(
        [sys.executable, "-c", CELERY, "-A", APP, *args],
        cwd=ROOT,
        env=env(uid),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
