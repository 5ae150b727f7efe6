"""Which deploy broke it, on real RabbitMQ and Redis with the real DLX service.

A foreign consumer rejects messages into the DLX; the DLX service buries them under code version
``v1`` (one cause), then a second service process, deployed as ``v2``, buries the old cause again
and a cause that is new in ``v2``. ``dlx groups --new-since v2`` finds only the new cause, the
``--json`` rows carry the per-version stats, a purge keeps them right, and ``/metrics`` exposes
when each cause was first seen, with the version.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis as redis_lib
from prometheus_client import CollectorRegistry, generate_latest

from celery_dlx.ops import obituaries
from celery_dlx.service.runner import run_service
from celery_dlx.wiring.runtime import get_runtime
from celery_dlx_console.metrics import DLXCollector
from tests.conftest import REDIS_URL
from tests.integration.cli_helpers import declare_foreign_queue, publish_and_reject, run, run_json
from tests.integration.dlx_apps import make_app


@pytest.fixture(scope="module")
def deploys() -> Iterator[dict[str, Any]]:
    """Burials of queue ``old`` under v1; of ``old`` and ``new`` under v2 (one service each)."""
    uid = uuid.uuid4().hex[:10]
    old, new = f"orders-{uid}", f"invoices-{uid}"
    no_retry = {"max_requeues": 0, "max_parks": 0}
    conf = {"dlx_queues": {old: no_retry, new: no_retry}}
    v1 = make_app(uid, dlx_code_version="v1", **conf)
    v2 = make_app(uid, dlx_code_version="v2", **conf)
    conn = v1.connection_for_write()
    runtimes = [get_runtime(v1), get_runtime(v2)]
    try:
        declare_foreign_queue(conn, v1, old)
        declare_foreign_queue(conn, v1, new)
        body = [(b'{"order": 1}', "application/json")]
        publish_and_reject(conn, old, body * 3)
        run_service(v1, idle_timeout=1.0, install_signals=False)
        publish_and_reject(conn, old, body * 2)
        publish_and_reject(conn, new, body * 2)
        run_service(v2, idle_timeout=1.0, install_signals=False)
        assert obituaries.count(runtimes[1]) == 7
        yield {"v1": v1, "v2": v2, "runtime": runtimes[1], "old": old, "new": new}
    finally:
        channel = conn.channel()
        for name in (old, new, v1.conf.dlx_service_queue):
            channel.queue_delete(name)
        channel.exchange_delete(v1.conf.dlx_exchange)
        conn.release()
        for runtime in runtimes:
            runtime.reset_publisher()
        client = redis_lib.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match="{" + f"test-{uid}" + "}*", count=1000):
            client.delete(key)


def _by_queue(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["queue"]: r for r in rows}


def test_groups_json_carries_versions_and_new_since_finds_the_new_cause(
    deploys: dict[str, Any],
) -> None:
    old, new = deploys["old"], deploys["new"]
    data = run_json(deploys["v2"], "groups")
    rows = _by_queue(data["groups"])
    assert set(rows) == {old, new} and rows[old]["cause"] != rows[new]["cause"]
    assert rows[old]["first_seen_version"] == "v1" and rows[old]["last_seen_version"] == "v2"
    assert rows[old]["versions"] == {"v1": 3, "v2": 2}
    assert rows[new]["first_seen_version"] == rows[new]["last_seen_version"] == "v2"
    assert rows[new]["versions"] == {"v2": 2}
    assert rows[old]["first_seen_ms"] < rows[new]["first_seen_ms"]
    assert rows[old]["first_seen_ms"] == rows[old]["first_ms"]
    assert [v["version"] for v in data["code_versions"]] == ["v1", "v2"]
    assert data["newest_version"] == "v2" and data["new_since"] is None

    since_v2 = run_json(deploys["v2"], "groups", "--new-since", "v2")
    assert [r["cause"] for r in since_v2["groups"]] == [rows[new]["cause"]]
    assert since_v2["new_since"] == "v2" and since_v2["total"] == 7
    since_v1 = run_json(deploys["v2"], "groups", "--new-since", "v1")
    assert {r["cause"] for r in since_v1["groups"]} == {rows[old]["cause"], rows[new]["cause"]}

    unknown = run(deploys["v2"], "groups", "--new-since", "v9")
    assert unknown.exit_code == 2 and "'v9' was never seen" in unknown.stderr
    assert "'v1', 'v2'" in unknown.stderr
    table = run(deploys["v2"], "groups", "--new-since", "v2").stdout
    assert "VERSION" in table and "1 cause, 7 obituaries" in table


def test_metrics_expose_when_each_cause_was_first_seen(deploys: dict[str, Any]) -> None:
    registry = CollectorRegistry()
    registry.register(DLXCollector(deploys["runtime"]))
    text = generate_latest(registry).decode()
    groups = {g.queue: g for g in obituaries.groups(deploys["runtime"])}
    for queue, version in ((deploys["old"], "v1"), (deploys["new"], "v2")):
        group = groups[queue]
        line = (
            f'celery_dlx_cause_first_seen_timestamp_seconds{{cause="{group.cause}",'
            f'queue="{queue}",version="{version}"}}'
        )
        assert line in text
        value = float(text.split(line, 1)[1].split()[0])
        assert group.first_seen_ms is not None and value == group.first_seen_ms / 1000


def test_purge_keeps_version_stats_right(deploys: dict[str, Any]) -> None:
    """Runs last in this module: it empties the graveyard."""
    app, old, new = deploys["v2"], deploys["old"], deploys["new"]
    runtime = deploys["runtime"]
    v1_ids = [
        ob.id
        for ob in obituaries.list_obituaries(runtime, limit=None)
        if ob.queue == old and ob.code_version == "v1"
    ]
    assert len(v1_ids) == 3
    assert run(app, "purge", "--yes", *v1_ids[:2]).exit_code == 0
    rows = _by_queue(run_json(app, "groups")["groups"])
    assert rows[old]["versions"] == {"v1": 1, "v2": 2}
    assert rows[old]["first_seen_version"] == "v1" and rows[old]["count"] == 3
    assert run(app, "purge", "--yes", v1_ids[2]).exit_code == 0
    rows = _by_queue(run_json(app, "groups")["groups"])
    assert rows[old]["versions"] == {"v2": 2}
    # The whole cause gone: its version stats go with it.
    assert run(app, "purge", "--yes", "--queue", old).exit_code == 0
    data = run_json(app, "groups")
    assert [r["queue"] for r in data["groups"]] == [new]
    yard = runtime.graveyard
    cause = data["groups"][0]["cause"]
    assert not runtime.redis.exists(yard.shards.home.cause_versions(rows[old]["cause"]))
    assert runtime.redis.hgetall(yard.shards.home.cause_versions(cause)) == {b"v2": b"2"}
    # Versions stay known after their obituaries left: --new-since v1 still answers.
    assert [r["queue"] for r in run_json(app, "groups", "--new-since", "v1")["groups"]] == [new]
    run(app, "purge", "--yes", "--all")
    assert run_json(app, "groups")["groups"] == []
    assert not [k for k in runtime.redis.scan_iter(match=yard.shards.home.cause_versions("*"))]


def test_a_group_started_before_version_stats_gets_no_made_up_first_version(
    keys: Any, redis_client: Any
) -> None:
    """A group written by a release without version stats (simulated by deleting them) keeps
    ``first_version`` unknown; removing its old obituaries never drives a count below zero."""
    from celery_dlx.fates import PURGED
    from celery_dlx.service.settle import buried_event
    from celery_dlx.store.graveyard import Graveyard
    from tests.integration.test_cli_read import celery_obituary

    yard = Graveyard(redis_client, keys)
    old = [celery_obituary(i) for i in range(2)]
    for ob in old:
        ob.code_version = "v0"
    yard.write_many([(ob, buried_event(ob)) for ob in old])
    cause = old[0].cause
    redis_client.hdel(yard.shards.home.group_key(cause), "first_version", "last_version")
    redis_client.delete(yard.shards.home.cause_versions(cause))
    new = celery_obituary(5)
    new.code_version = "v1"
    yard.write_many([(new, buried_event(new))])
    (group,) = yard.groups()
    assert (group.first_version, group.last_version, group.versions) == (None, "v1", {"v1": 1})
    assert group.first_seen_ms == old[0].buried_ms
    for ob in old:
        assert yard.remove(ob, ob.fate_event(PURGED, ob.buried_ms + 1))
    (group,) = yard.groups()
    assert group.versions == {"v1": 1} and group.count == 1
