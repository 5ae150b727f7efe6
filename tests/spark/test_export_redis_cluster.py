"""The exporter reading a history kept on a private three-master Redis Cluster.

``dlx_redis_url`` with ``?cluster=true`` gives the executors a ``RedisCluster`` client, which
returns XRANGE fields as dicts (it applies its nodes' response callbacks): the reader sliced them
like lists and every export from a cluster failed with ``TypeError: unhashable type: 'slice'``
(issue 24). Exports from the cluster must equal exports of the same history from one Redis.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.fates import FateEvent
from celery_dlx.message.names import Keys
from celery_dlx.store.client import redis_client
from celery_dlx.store.history import History
from tests.chaos.servers import RedisClusterServers, redis_cluster
from tests.conftest import REDIS_URL

from . import checks, generated

dlx_export = pytest.importorskip("celery_dlx_spark.export")

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    with redis_cluster(tmp_path_factory.mktemp("redis-cluster")) as servers:
        yield servers


@pytest.fixture
def cluster_client(cluster: RedisClusterServers) -> Iterator[Any]:
    client = redis_client(cluster.url)
    yield client
    client.close()


def _options(out: Path, url: str, prefix: str, **kwargs: Any) -> Any:
    kwargs.setdefault("progress", False)
    return dlx_export.ExportOptions(out=str(out), redis_url=url, prefix=prefix, **kwargs)


def test_export_from_a_cluster_gives_the_exact_records_and_aggregates(
    spark: Any,
    cluster: RedisClusterServers,
    cluster_client: Any,
    key_prefix: str,
    keys: Any,
    tmp_path: Path,
) -> None:
    entries = generated.history()
    generated.write(cluster_client, keys.history, entries)
    out = tmp_path / "out"

    result = dlx_export.export(spark, _options(out, cluster.url, key_prefix, ranges=4, trim=True))

    assert result["status"] == "exported" and result["ranges"] == 4
    assert result["records"] == generated.VALID
    assert result["malformed_by_reason"] == generated.MALFORMED
    assert result["end_id"] == entries[-1][0]
    checks.assert_events(spark, out, checks.valid_ids(entries))
    checks.assert_aggregates(spark, out)
    checks.assert_summary(result["summary"])
    # the lock, the checkpoint mirror and the trim are cluster commands too
    mirror = cluster_client.hgetall(keys.history_export)
    assert mirror[b"last_id"].decode() == entries[-1][0]
    assert result["trimmed"] == len(entries) and cluster_client.xlen(keys.history) == 0
    assert not cluster_client.exists(keys.history_export_lock)


def _fate_events() -> list[FateEvent]:
    """The generated history's well-formed entries as the fate events that would record them."""
    events = []
    for _, fields in generated.history():
        if fields["message_id"].startswith("bad"):
            continue
        obituary = fields.get("obituary")
        events.append(
            FateEvent.from_fields(
                fate=fields["fate"],
                queue=fields["queue"],
                message_id=fields["message_id"],
                attempt=int(fields["attempt"]),
                task=fields["task"] or None,
                cause=fields["cause"],
                exc_type=fields["exc_type"],
                reason=fields["reason"],
                delay=float(fields["delay"]) if fields["delay"] else None,
                importance=fields["importance"],
                first_failure_ms=int(fields["first_failure_ms"] or 0) or None,
                at_ms=int(fields["at_ms"]),
                extra={"obituary": json.loads(obituary)} if obituary else {},
            )
        )
    return events


def _records(spark: Any, out: Path) -> Counter[tuple[Any, ...]]:
    """Every exported event without its stream id (ids are given by each Redis on XADD)."""
    frame = checks.read_events(spark, out).drop("stream_id", "id_ms", "id_seq")
    columns = sorted(frame.columns)
    return Counter(tuple(row[c] for c in columns) for row in frame.select(*columns).collect())


def test_a_history_recorded_on_a_cluster_exports_like_one_on_a_single_redis(
    spark: Any,
    cluster: RedisClusterServers,
    cluster_client: Any,
    redis_client: Any,
    key_prefix: str,
    tmp_path: Path,
) -> None:
    events = _fate_events()
    # recorded through the package's own history writer, on each kind of Redis
    for client in (cluster_client, redis_client):
        History(client, Keys(key_prefix)).append_many(events)
    single, clustered = tmp_path / "single", tmp_path / "cluster"

    from_single = dlx_export.export(spark, _options(single, REDIS_URL, key_prefix, ranges=3))
    from_cluster = dlx_export.export(spark, _options(clustered, cluster.url, key_prefix, ranges=3))

    assert from_single["records"] == from_cluster["records"] == len(events) == generated.VALID
    assert from_single["malformed"] == from_cluster["malformed"] == 0
    records = _records(spark, clustered)
    assert sum(records.values()) == len(events)
    assert records == _records(spark, single)
    assert from_cluster["summary"]["rows"] == from_single["summary"]["rows"]
    assert from_cluster["summary"]["totals"] == from_single["summary"]["totals"]
    checks.assert_aggregates(spark, clustered)
