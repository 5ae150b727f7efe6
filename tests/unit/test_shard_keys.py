"""Key names of parked retries sharded by queue (``dlx_redis_shards``), and which layout an app
gets (pure: no Redis is reached)."""

from __future__ import annotations

import pytest
from celery import Celery
from redis.cluster import key_slot

from celery_dlx.errors import ConfigurationError
from celery_dlx.message.names import PARKED_BUCKETS, Keys
from celery_dlx.wiring.runtime import get_runtime


def slot(key: str) -> int:
    return int(key_slot(key.encode()))


def test_a_bucket_is_one_slot_and_buckets_of_a_queue_spread() -> None:
    keys = Keys("shop")
    slots = set()
    for bucket in range(PARKED_BUCKETS):
        shard = keys.parked_shard("orders", bucket)
        assert len({slot(shard.due), slot(shard.meta), slot(shard.body)}) == 1
        slots.add(slot(shard.due))
    assert len(slots) == PARKED_BUCKETS


def test_the_single_tag_layout_is_unchanged() -> None:
    keys = Keys("shop")
    legacy = keys.parked_legacy
    assert (legacy.due, legacy.meta, legacy.body) == (
        keys.parked_due,
        keys.parked_meta,
        keys.parked_body,
    )
    assert keys.parked_due == "{shop}:parked:due"
    assert slot(keys.parked_queues) == slot(keys.history) == slot(keys.parked_due)


def test_a_queue_name_with_a_brace_keeps_its_buckets_on_one_slot_each() -> None:
    shard = Keys("shop").parked_shard("odd}name", 2)
    assert len({slot(shard.due), slot(shard.meta), slot(shard.body)}) == 1


@pytest.mark.parametrize(
    ("url", "shards", "sharded"),
    [
        ("redis://127.0.0.1:6379/0", "auto", False),
        ("redis://127.0.0.1:7000/0?cluster=true", "auto", True),
        ("redis://127.0.0.1:6379/0", "queue", True),
        ("redis://127.0.0.1:7000/0?cluster=true", "none", False),
        ("sentinel://127.0.0.1:26379/mymaster/0", "auto", False),
    ],
)
def test_which_layout_an_app_gets(url: str, shards: str, sharded: bool) -> None:
    app = Celery("shards", set_as_current=False)
    app.conf.update(dlx_redis_url=url, dlx_redis_shards=shards)
    assert get_runtime(app).sharded is sharded


def test_an_unknown_value_names_the_setting() -> None:
    app = Celery("shards", set_as_current=False)
    app.conf.update(dlx_redis_shards="bucket")
    with pytest.raises(ConfigurationError, match="dlx_redis_shards"):
        get_runtime(app)
