"""celery_dlx_spark stands alone: executors import it without Celery or celery_dlx, and the zip
the launcher ships holds the whole package."""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import celery_dlx_spark
from celery_dlx_spark import launch as export


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text("utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_the_job_never_imports_celery_or_celery_dlx() -> None:
    modules = celery_dlx_spark.modules()
    assert {m.name for m in modules} >= {"export.py", "source.py", "records.py", "storage.py"}
    for module in modules:
        assert not _imports(module) & {"celery", "celery_dlx", "kombu", "billiard"}, module


def test_importing_the_job_loads_no_celery() -> None:
    code = (
        "import sys, celery_dlx_spark.source, celery_dlx_spark.records, celery_dlx_spark.stream;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('celery', 'celery_dlx', 'kombu')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_launcher_zips_the_package_and_writes_an_entry(tmp_path: Path) -> None:
    entry, archive = export.find_job(workdir=tmp_path)
    with zipfile.ZipFile(archive) as zipped:
        names = sorted(zipped.namelist())
    assert names == sorted(f"celery_dlx_spark/{m.name}" for m in celery_dlx_spark.modules())
    assert entry.read_text() == celery_dlx_spark.ENTRY_SOURCE
    again = export.find_job(workdir=tmp_path / "again")[1]
    assert again.read_bytes() == archive.read_bytes(), "the zip is reproducible"
