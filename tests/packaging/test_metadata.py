"""The wheel's metadata: its LICENSE, only user-facing extras, and a build without setuptools
warnings (built from a copy of the tree, as test_wheel.py does, without network)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

from tests.packaging.test_wheel import _source_copy

#: The extras a user may ask for; the test and benchmark tools are requirements files instead.
USER_EXTRAS = {"sentry", "protobuf", "spark", "flower", "web"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    work = tmp_path_factory.mktemp("metadata")
    source = _source_copy(work / "src")
    out = work / "dist"
    pip = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v"]
    run = subprocess.run(
        [*pip, "-w", str(out), str(source)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (wheel,) = out.glob("celery_dlx-*.whl")
    return wheel, run.stdout + run.stderr


def test_the_wheel_ships_its_license(built: tuple[Path, str]) -> None:
    wheel, _ = built
    with zipfile.ZipFile(wheel) as archive:
        (license_file,) = [n for n in archive.namelist() if n.endswith("/licenses/LICENSE")]
        text = archive.read(license_file).decode()
        metadata = Parser().parsestr(
            archive.read(license_file.split("/")[0] + "/METADATA").decode()
        )
    assert text.startswith("BSD 3-Clause License")
    assert metadata["License"] == "BSD-3-Clause" and metadata["License-File"] == "LICENSE"
    assert set(metadata.get_all("Provides-Extra")) == USER_EXTRAS


def test_the_console_files_are_in_and_the_build_does_not_warn(built: tuple[Path, str]) -> None:
    wheel, log = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {
        "celery_dlx_console/templates/base.html",
        "celery_dlx_console/static/console.js",
    } <= names
    assert "celery_dlx/py.typed" in names and "celery_dlx_spark/py.typed" in names
    assert "BuildBackendWarning" not in log and "SetuptoolsDeprecationWarning" not in log, log
