"""``dlx_redis_min_replicas``: its default per Redis URL, and the error of a park too few replicas hold."""

from __future__ import annotations

import pytest
from redis.exceptions import RedisError

from celery_dlx.errors import ConfigurationError, DLXError
from celery_dlx.policy.config import load_config
from celery_dlx.store.client import (
    NotReplicated,
    Replicas,
    _replicas_in_table,
    is_cluster_url,
    is_sentinel_url,
)
from celery_dlx.store.errors import STORE_ERRORS


@pytest.mark.parametrize(
    ("url", "count", "expected"),
    [
        ("redis://127.0.0.1:6379/0", None, 0),
        ("rediss://redis.example:6380/1", None, 0),
        ("unix:///run/redis.sock", None, 0),
        ("sentinel://s1:26379,s2:26379/mymaster/0", None, 1),
        ("sentinels://s1:26379/mymaster", None, 1),
        ("redis://node1:7000/0?cluster=true", None, None),  # per master: see Replicas.wanted
        ("redis://127.0.0.1:6379/0", 2, 2),
        ("sentinel://s1:26379/mymaster/0", 0, 0),
        ("redis://node1:7000/0?cluster=true", 1, 1),
    ],
)
def test_the_default_follows_the_url(url: str, count: int | None, expected: int | None) -> None:
    replicas = Replicas.for_url(url, count, 0.5)
    assert replicas.count == expected and replicas.timeout == 0.5


def test_url_kinds() -> None:
    assert is_cluster_url("redis://h:1/0?cluster=true") and is_cluster_url("redis://h/0?cluster=1")
    assert not is_cluster_url("redis://h:1/0?cluster=false") and not is_cluster_url("redis://h")
    assert is_sentinel_url("sentinel://h/m") and is_sentinel_url("sentinels://h/m")
    assert not is_sentinel_url("redis://sentinel/0")


def test_a_set_count_is_asked_of_every_client() -> None:
    assert Replicas(3).wanted(object(), "k") == 3  # type: ignore[arg-type]
    assert Replicas(None).wanted(object(), "k") == 0  # type: ignore[arg-type]  # not a cluster


def test_settings() -> None:
    config = load_config({})
    assert config.redis_min_replicas is None and config.redis_replica_timeout == 1.0
    config = load_config({"dlx_redis_min_replicas": 2, "dlx_redis_replica_timeout": 0.25})
    assert config.redis_min_replicas == 2 and config.redis_replica_timeout == 0.25
    assert load_config({"dlx_redis_min_replicas": 0}).redis_min_replicas == 0
    with pytest.raises(ConfigurationError, match=r"^dlx_redis_min_replicas must be a non-negative"):
        load_config({"dlx_redis_min_replicas": -1})
    with pytest.raises(ConfigurationError, match=r"^dlx_redis_replica_timeout"):
        load_config({"dlx_redis_replica_timeout": 0})


def test_not_replicated_is_a_store_outage_naming_the_setting() -> None:
    err = NotReplicated("the park of m:1", 1, 0, 1.0)
    assert isinstance(err, DLXError) and isinstance(err, RedisError)
    assert isinstance(err, STORE_ERRORS)  # the worker falls back, the DLX service retries
    assert "dlx_redis_min_replicas" in str(err) and "0 of the 1" in str(err)
    assert err.wanted == 1 and err.confirmed == 0


NODES = """\
07c3 127.0.0.1:30004@40004 slave e7d1 0 1426238317239 4 connected
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30003@40003 master - 0 1426238318243 3 connected 10923-16383
6ec2 127.0.0.1:30005@40005 slave,fail 67ed 0 1426238316232 5 disconnected
824f 127.0.0.1:30006@40006 slave 292f 0 1426238317741 6 connected
e7d1 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
"""


@pytest.mark.parametrize(
    ("table", "expected"),
    [
        (NODES, 1),
        (NODES.encode(), 1),
        (NODES.replace("slave e7d1", "slave 67ed"), 0),  # a master without replicas
        (NODES.replace("myself,master", "master"), 0),  # no node said it answered
    ],
)
def test_replicas_of_the_answering_master(table: object, expected: int) -> None:
    assert _replicas_in_table(table) == expected


def test_replicas_of_the_answering_master_from_redis_pys_parsed_table() -> None:
    from redis._parsers.helpers import parse_cluster_nodes

    assert _replicas_in_table(parse_cluster_nodes(NODES)) == 1
    mine = NODES.replace("myself,master - 0 0 1", "master - 0 0 1").replace(
        "67ed 127.0.0.1:30002@40002 master", "67ed 127.0.0.1:30002@40002 myself,master"
    )
    assert _replicas_in_table(parse_cluster_nodes(mine)) == 1  # the failed replica counts too
