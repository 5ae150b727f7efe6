"""celery_dlx.ops.export: the spark-submit command, and a real run through spark-submit."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

from celery_dlx.ops import export
from tests.conftest import REDIS_URL

from . import generated

pytestmark = pytest.mark.spark


def test_command_runs_the_job_with_its_modules_and_options(tmp_path: Path) -> None:
    command = export.build_spark_submit_command(
        out=tmp_path / "out",
        redis_url="redis://h:6379/2",
        key_prefix="shop",
        master="spark://master:7077",
        trim=True,
        ranges=12,
        aggregates=False,
        conf={"spark.executor.memory": "2g"},
        spark_submit="/opt/spark/bin/spark-submit",
        workdir=tmp_path / "job",
    )
    assert command[:3] == ["/opt/spark/bin/spark-submit", "--master", "spark://master:7077"]
    assert "spark.executor.memory=2g" in command
    assert "spark.driver.bindAddress=127.0.0.1" not in command, "only local runs pin loopback"
    archive = Path(command[command.index("--py-files") + 1])
    with zipfile.ZipFile(archive) as zipped:
        names = set(zipped.namelist())
    assert "celery_dlx_spark/export.py" in names and "celery_dlx_spark/source.py" in names
    assert all(name.startswith("celery_dlx_spark/") for name in names), names
    job = Path(command[command.index("--py-files") + 2])
    assert job.name == "dlx_export.py" and job.parent == tmp_path / "job"
    assert "from celery_dlx_spark.export import main" in job.read_text()
    args = command[command.index("--py-files") + 3 :]
    assert args == [
        "--out",
        str(tmp_path / "out"),
        "--redis-url",
        "redis://h:6379/2",
        "--prefix",
        "shop",
        "--ranges",
        "12",
        "--trim",
        "--no-aggregates",
    ]


def test_command_rejects_what_cannot_run(tmp_path: Path) -> None:
    with pytest.raises(export.ExportError, match="redis_url"):
        export.build_spark_submit_command(out=tmp_path, spark_submit="spark-submit")
    with pytest.raises(export.ExportError, match="trim"):
        export.build_spark_submit_command(
            out=tmp_path, snapshot=tmp_path / "s.jsonl", trim=True, spark_submit="x"
        )
    with pytest.raises(export.ExportError, match="not found"):
        export.build_spark_submit_command(
            out=tmp_path, redis_url=REDIS_URL, job=tmp_path / "missing.py", spark_submit="x"
        )


def test_run_export_with_the_apps_settings_through_spark_submit(
    redis_client: Any, key_prefix: str, keys: Any, tmp_path: Path
) -> None:
    pytest.importorskip("pyspark")
    entries = generated.history()
    generated.write(redis_client, keys.history, entries)
    app = Celery("export-test", set_as_current=False)
    app.conf.update(dlx_redis_url=REDIS_URL, dlx_key_prefix=key_prefix)
    out = tmp_path / "out"

    result = export.run_export(
        app, out=out, master="local[2]", ranges=2, aggregates=False, echo=False, timeout=280
    )

    assert result.exported and result.records == generated.VALID
    assert result.malformed_by_reason == generated.MALFORMED
    assert result.checkpoint["last_id"] == entries[-1][0] == result.end_id
    assert result.command[result.command.index("--prefix") + 1] == key_prefix
    assert result.chart is None and result.summary == []
    events = list((out / "events").glob("day=*/queue=*/batch=after-0-0/*.parquet"))
    assert events, "Parquet written under day/queue/batch partitions"
    assert (out / "_last_export.json").is_file()


def _fake_spark_submit(tmp_path: Path, body: str) -> str:
    """A stand-in for spark-submit (a real process) that fails the way a job can fail."""
    script = tmp_path / "spark-submit"
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return str(script)


def test_a_job_that_dies_without_a_result_raises_with_its_output(tmp_path: Path) -> None:
    fake = _fake_spark_submit(tmp_path, "echo 'java.lang.OutOfMemoryError: heap' >&2\nexit 3\n")
    with pytest.raises(export.ExportError, match=r"exited with 3(?s:.)*OutOfMemoryError"):
        export.run_export(out=tmp_path / "out", snapshot="s.jsonl", spark_submit=fake, echo=False)


def test_a_job_that_reports_a_failure_raises_its_error(tmp_path: Path) -> None:
    # the job writes its result to the path after --result-json, then exits 1
    body = (
        'while [ "$1" != "--result-json" ]; do shift; done\n'
        'printf \'{"status": "failed", "error": "--out holds another stream"}\' > "$2"\n'
        "exit 1\n"
    )
    fake = _fake_spark_submit(tmp_path, body)
    with pytest.raises(export.ExportError, match="export failed: --out holds another stream"):
        export.run_export(out=tmp_path / "out", redis_url=REDIS_URL, spark_submit=fake, echo=False)
