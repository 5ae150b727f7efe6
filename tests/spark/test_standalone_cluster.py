"""``celery dlx export --master spark://...`` on a real Spark standalone cluster.

A private master and two one-core workers (``spark-class`` from pip's pyspark, on free loopback
ports) run the export launched by the real CLI over a history in the shared Redis. The master
must list the application as completed with its executors on both workers, and the Parquet
output must hold exactly the known records in the promised partitions. Before issue 24 the job
replaced spark-submit's master with ``local[*]``: the master never saw an application.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from celery.bin.base import CLIContext
from click.testing import CliRunner

from celery_dlx.cli.main import dlx
from tests.chaos.servers import wait_for
from tests.conftest import REDIS_URL

from . import checks, generated
from .standalone import SparkStandalone, fetch_json, spark_standalone

pytest.importorskip("pyspark")

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    with spark_standalone(tmp_path_factory.mktemp("spark-standalone"), workers=2) as cluster:
        yield cluster


def _completed(cluster: SparkStandalone, app_id: str) -> dict[str, Any] | None:
    apps = cluster.status()["completedapps"]
    return next((app for app in apps if app["id"] == app_id), None)


def _executors_by_worker(cluster: SparkStandalone, app_id: str) -> dict[str, int]:
    """Executors of ``app_id`` each worker ran (its own JSON status lists finished executors)."""
    counts = {}
    for worker in cluster.status()["workers"]:
        status = fetch_json(worker["webuiaddress"] + "/json/")
        executors = status["executors"] + status["finishedexecutors"]
        counts[worker["id"]] = sum(1 for e in executors if e["appid"] == app_id)
    return counts


def test_export_runs_on_the_standalone_master_it_is_given(
    standalone: SparkStandalone,
    redis_client: Any,
    key_prefix: str,
    keys: Any,
    tmp_path: Path,
    spark: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    entries = generated.history()
    generated.write(redis_client, keys.history, entries)
    app = Celery("standalone-export", set_as_current=False)
    app.conf.update(dlx_redis_url=REDIS_URL, dlx_key_prefix=key_prefix)
    # the driver runs here, beside the cluster: keep it on loopback like the daemons
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    out = tmp_path / "out"
    args = [
        "export",
        "--out",
        str(out),
        "--master",
        standalone.url,
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.ui.enabled=false",
        "--timeout",
        "240",
        "--json",
    ]

    ran = CliRunner().invoke(dlx, args, obj=CLIContext(app=app, no_color=True, workdir=None))

    assert ran.exit_code == 0, f"{ran.output}\n{standalone.log_tail()}"
    result = json.loads(ran.stdout)
    command = result["command"]
    assert command[command.index("--master") + 1] == standalone.url
    assert result["master"] == standalone.url, "the job ran on the master it was given"
    app_id = result["app_id"]
    assert app_id.startswith("app-"), app_id

    completed = wait_for(lambda: _completed(standalone, app_id), f"{app_id} in completedapps")
    assert completed["state"] == "FINISHED" and completed["name"] == "celery-dlx-export"
    assert completed["cores"] == 2, "one core granted on each worker"
    assert not standalone.status()["activeapps"]
    executors = _executors_by_worker(standalone, app_id)
    assert len(executors) == 2 and all(n >= 1 for n in executors.values()), executors

    assert result["status"] == "exported" and result["records"] == generated.VALID
    assert result["malformed_by_reason"] == generated.MALFORMED
    assert result["end_id"] == entries[-1][0] == result["checkpoint"]["last_id"]
    assert list((out / "events").glob("day=*/queue=*/batch=after-0-0/*.parquet"))
    checks.assert_events(spark, out, checks.valid_ids(entries))
    checks.assert_aggregates(spark, out)
    checks.assert_summary({"totals": result["totals"], "rows": result["summary"]})
