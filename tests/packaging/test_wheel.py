"""The wheel is whole: built from this tree, installed with the ``spark`` extra into a fresh venv
outside the tree, ``celery -A app dlx export`` runs the Spark job and writes Parquet.

The venv is created without system site packages; ``pip install '<wheel>[spark]'`` resolves the
dependencies from PyPI through pip's own cache (pyspark's built wheel is reused from
``~/.cache/pip/wheels``, downloads from ``~/.cache/pip/http-v2``), exactly as a user's install.
No PYTHONPATH reaches the venv, and the test checks that ``celery_dlx`` and ``celery_dlx_spark`` are
imported from the venv, not from this checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import BROKER_URL, REDIS_URL
from tests.spark import generated

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(1800)]

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, **kwargs)
    assert result.returncode == 0, (
        f"{argv} exited {result.returncode}:\n{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
    )
    return result


def _source_copy(dest: Path) -> Path:
    """The project's files as git sees them (tracked and new, not ignored), so the build writes
    nothing into the checkout."""
    listed = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            target = dest / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return dest


def _clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "PYSPARK", "VIRTUAL_ENV"))
    }
    env.update(extra)
    return env


def test_wheel_in_a_fresh_venv_exports_the_history_to_parquet(
    tmp_path_factory: pytest.TempPathFactory, redis_client: Any, key_prefix: str, keys: Any
) -> None:
    pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    work = tmp_path_factory.mktemp("wheel")
    assert ROOT not in work.parents, "the venv must live outside the source tree"

    # 1. the wheel, built like `pip wheel --no-deps .` from a copy of the tree
    source = _source_copy(work / "src")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(work / "dist"),
            str(source),
        ],
    )
    (wheel,) = (work / "dist").glob("celery_dlx-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    assert {
        "celery_dlx_spark/__init__.py",
        "celery_dlx_spark/export.py",
        "celery_dlx_spark/source.py",
        "celery_dlx_spark/launch.py",
        "celery_dlx_edit/edit.py",
        "celery_dlx_edit/py.typed",
        "celery_dlx/py.typed",
        "celery_dlx_spark/py.typed",
    } <= names
    assert not any(name.startswith(("spark/", "tests/")) for name in names)

    # 2. a fresh venv outside the tree, the wheel with the spark extra
    venv = work / "venv"
    _run([sys.executable, "-m", "venv", str(venv)])
    python = venv / "bin" / "python"
    env = _clean_env()
    _run([str(python), "-m", "pip", "install", "-q", f"{wheel}[spark]"], env=env, timeout=1200)
    where = _run(
        [
            str(python),
            "-c",
            "import celery_dlx, celery_dlx_spark; print(celery_dlx.__file__); print(celery_dlx_spark.__file__)",
        ],
        env=env,
        cwd=work,
    ).stdout.split()
    assert all(Path(path).is_relative_to(venv) for path in where), where

    # 3. a tiny app and a few history entries in the real Redis
    app_dir = work / "app"
    app_dir.mkdir()
    (app_dir / "tinyapp.py").write_text(
        textwrap.dedent(
            f"""
            from celery import Celery

            import celery_dlx

            app = Celery("tinyapp", broker={BROKER_URL!r})
            app.conf.update(dlx_enabled=True, dlx_redis_url={REDIS_URL!r}, dlx_key_prefix={key_prefix!r})
            celery_dlx.install(app)
            """
        )
    )
    generated.write(redis_client, keys.history, generated.history())

    # 4. `celery -A tinyapp dlx export --out DIR` from the venv, in a directory with no source
    out = work / "out"
    result = _run(
        [
            str(venv / "bin" / "celery"),
            "-A",
            "tinyapp",
            "dlx",
            "export",
            "--out",
            str(out),
            "--master",
            "local[2]",
            "--json",
        ],
        env=env,
        cwd=app_dir,
        timeout=900,
    )
    assert f'"records": {generated.VALID}' in result.stdout, result.stdout[-2000:]
    events = pq.read_table(out / "events")
    assert events.num_rows == generated.VALID
    assert set(events.column("fate").to_pylist()) >= {"requeued", "parked", "buried"}
    malformed = pq.read_table(out / "malformed")
    assert malformed.num_rows == sum(generated.MALFORMED.values())
