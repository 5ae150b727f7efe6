"""celery_dlx_spark.launch: the spark-submit command, and a real run through spark-submit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_dlx.cli.main import dlx
from celery_dlx_spark import launch as export
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
    assert result.master == "local[2]" and result.app_id.startswith("local-")
    events = list((out / "events").glob("day=*/queue=*/batch=after-0-0/*.parquet"))
    assert events, "Parquet written under day/queue/batch partitions"
    assert (out / "_last_export.json").is_file()


def test_the_cli_hands_master_and_conf_to_spark_submit() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.update(dlx_redis_url="redis://10.1.2.3:6380/4", dlx_key_prefix="shop")
    obj = CLIContext(app=app, no_color=True, workdir=None)
    args = ["export", "--out", "/data/dlx", "--master", "spark://m:7077", "--print-command"]
    conf = ["--conf", "spark.executor.memory=2g", "--conf", "spark.pyspark.python=/opt/py"]
    ran = CliRunner().invoke(dlx, [*args, *conf, "--json"], obj=obj)
    assert ran.exit_code == 0, ran.output
    command = json.loads(ran.stdout)
    assert command[command.index("--master") + 1] == "spark://m:7077"
    assert "spark.executor.memory=2g" in command and "spark.pyspark.python=/opt/py" in command
    assert "--master" not in command[command.index("--py-files") :], "the job gets no master"
    refused = CliRunner().invoke(dlx, [*args, "--conf", "spark.executor.memory"], obj=obj)
    assert refused.exit_code == 2 and "KEY=VALUE" in refused.stderr


def _job(tmp_path: Path, *args: str, spark_submit: list[str] | None = None) -> Any:
    """Run the job as a process: with plain python, or under ``spark_submit`` options."""
    result_json = tmp_path / "result.json"
    job_args = ["--snapshot", str(tmp_path / "s.jsonl"), "--out", str(tmp_path / "out")]
    job_args += ["--no-aggregates", "--quiet", "--result-json", str(result_json), *args]
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER", "PYSPARK_SUBMIT_ARGS")}
    env.update(PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    if spark_submit is None:
        command = [sys.executable, "-m", "celery_dlx_spark", *job_args]
    else:
        entry, archive = export.package_job(tmp_path / "job")
        submit = [export.find_spark_submit(), *spark_submit, "--py-files", str(archive)]
        command = [*submit, str(entry), *job_args]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=240)
    result = json.loads(result_json.read_text()) if result_json.exists() else None
    return done, result


def test_the_job_defaults_to_local_only_when_nothing_set_a_master(tmp_path: Path) -> None:
    pytest.importorskip("pyspark")
    from celery_dlx_spark import source

    with open(tmp_path / "s.jsonl", "w") as handle:
        for entry_id, fields in generated.history()[:20]:
            handle.write(source.snapshot_line(entry_id, fields) + "\n")

    done, result = _job(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert result["master"] == "local[*]" and result["records"] + result["malformed"] == 20

    # under spark-submit the job keeps spark-submit's master and refuses to run on another
    done, result = _job(tmp_path, "--master", "local[2]", spark_submit=["--master", "local[1]"])
    assert done.returncode == 2, done.stderr[-3000:]
    assert result["status"] == "failed" and "spark-submit's --master" in result["error"]


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
