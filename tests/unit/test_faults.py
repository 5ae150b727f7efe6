"""The chaos tests' crash points: parsed strictly, off unless armed, exit 9 at the n-th reach."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from celery_dlx import faults
from tests.conftest import ROOT


def test_armed_parses_points_and_counts() -> None:
    assert faults.armed("drain.claimed@3, service.buried") == {
        "drain.claimed": 3,
        "service.buried": 1,
    }
    assert faults.armed("") == {}


@pytest.mark.parametrize("spec", ["drain.nowhere", "service.buried@0", "drain.claimed@x"])
def test_armed_refuses_unknown_points_and_bad_counts(spec: str) -> None:
    with pytest.raises(ValueError):
        faults.armed(spec)


def test_a_point_is_a_no_op_unless_armed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.FAULT_ENV, raising=False)
    faults.point("drain.claimed")  # still here
    monkeypatch.setenv(faults.FAULT_ENV, "service.buried@1")
    faults.point("drain.claimed")  # another point: still here


def test_the_nth_reach_exits_9_and_logs(tmp_path: Path) -> None:
    log = tmp_path / "faults.log"
    code = (
        "from celery_dlx import faults\n"
        "for i in range(5):\n"
        "    print(i, flush=True)\n"
        "    faults.point('drain.published')\n"
    )
    env = dict(
        os.environ,
        DLX_FAULT="drain.published@3",
        DLX_FAULT_LOG=str(log),
        PYTHONPATH=str(ROOT),
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 9
    assert done.stdout.split() == ["0", "1", "2"]
    assert log.read_text().startswith("drain.published pid=")
