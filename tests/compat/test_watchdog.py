"""The compat gate's watchdog: a run of Celery's suite that hangs is killed and fails the gate fast.

A hang that swallows pytest-timeout's interrupt (as the queue probe did before it stopped closing
its channel after an interrupted read, tests/integration/test_topology_probe.py) would
otherwise hold the README's test command until CI's 90-minute limit. These tests hang real
processes (pytest itself in the second) and check what the gate does with them.
"""

from __future__ import annotations

import os
import sys
import textwrap
import time
from pathlib import Path
from types import ModuleType

import pytest


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie still answers signal 0 until it is reaped; it runs nothing.
    stat = Path(f"/proc/{pid}/stat")
    return stat.exists() and stat.read_text().split(")")[-1].split()[0] != "Z"


def test_a_run_that_outlives_its_limit_leaves_its_stacks_and_nothing_running(
    compat: ModuleType, tmp_path: Path
) -> None:
    pidfile = tmp_path / "grandchild.pid"
    script = textwrap.dedent(
        f"""
        import faulthandler, subprocess, sys, threading, time
        faulthandler.enable()
        child = subprocess.Popen(["sleep", "600"])
        open({str(pidfile)!r}, "w").write(str(child.pid))
        threading.Thread(target=lambda: threading.Event().wait(), name="waiter").start()

        def swallowing_hang():
            while True:
                try:
                    time.sleep(600)
                except BaseException:
                    pass

        swallowing_hang()
        """
    )
    log = tmp_path / "run.log"
    started = time.monotonic()
    with log.open("w") as out:
        finished = compat.run_watched(
            [sys.executable, "-c", script], cwd=tmp_path, env=dict(os.environ), out=out, limit=2.0
        )
    took = time.monotonic() - started
    text = log.read_text()
    assert finished is False
    assert took < 2.0 + compat.DUMP_GRACE + 5, took
    assert "no end after 2s" in text
    assert "swallowing_hang" in text  # faulthandler's dump of the main thread
    assert text.count("hread 0x") >= 2, text  # "Current thread 0x..." and "Thread 0x..."
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while alive(grandchild) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not alive(grandchild), "the hung run's own child outlived it"


def test_a_run_that_ends_in_time_is_left_alone(compat: ModuleType, tmp_path: Path) -> None:
    log = tmp_path / "run.log"
    with log.open("w") as out:
        finished = compat.run_watched(
            [sys.executable, "-c", "print('done')"],
            cwd=tmp_path,
            env=dict(os.environ),
            out=out,
            limit=30.0,
        )
    assert finished is True
    assert log.read_text() == "done\n"


@pytest.mark.integration
def test_a_hung_pytest_run_of_the_suite_is_reported_as_hung(
    compat: ModuleType, tmp_path: Path
) -> None:
    """Through run_suite: pytest with the gate's plugins, a test longer than the run's limit."""
    suite = tmp_path / "suite"
    (suite / "t" / "integration").mkdir(parents=True)
    (suite / "pyproject.toml").write_text("")
    (suite / "t" / "integration" / "test_hang.py").write_text(
        textwrap.dedent(
            """
            import time

            def test_that_never_ends():
                time.sleep(600)
            """
        )
    )
    started = time.monotonic()
    with pytest.raises(compat.SuiteHung) as hung:
        compat.run_suite(
            suite,
            ["t/integration/test_hang.py"],
            "plain",
            budgets=None,
            timeout=300,
            tag="watchdog-test",
            limit=8.0,
        )
    assert time.monotonic() - started < 8.0 + compat.DUMP_GRACE + 20
    message = str(hung.value)
    assert "did not finish in 8s" in message
    assert "test_that_never_ends" in message  # pytest's faulthandler wrote the stack
