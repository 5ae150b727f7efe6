"""The breaker store on a real Redis Cluster: its transaction (WATCH/MULTI) and its keys stay on
the app's one hash slot."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.cluster import key_slot

from celery_dlx.message.names import Keys
from celery_dlx.policy.breaker import BreakerSettings
from celery_dlx.store.breaker import Breakers
from celery_dlx.store.client import redis_client
from tests.chaos.servers import redis_cluster


@pytest.fixture
def client(tmp_path: Path) -> Iterator[Any]:
    with redis_cluster(tmp_path) as servers:
        conn = redis_client(servers.url)
        yield conn
        conn.close()


def test_breaker_opens_holds_lists_and_closes_on_the_cluster(client: Any, uid: str) -> None:
    keys = Keys(f"test-{uid}")
    store = Breakers(client, keys)
    member = Breakers.member("orders", "cafe")
    slots = {
        key_slot(k.encode())
        for k in (keys.breakers_open, keys.breaker_state(member), keys.breaker_held(member))
    }
    assert len(slots) == 1
    settings = BreakerSettings(failures=1, hold=10, probe=1)
    assert store.fail("orders", "cafe", settings, 1000, entry_id="a:0") is None
    opened = store.fail("orders", "cafe", settings, 1001, entry_id="b:0", task="t")
    assert opened is not None and opened.opened
    assert [b.cause for b in store.list_open()] == ["cafe"]
    assert store.close("orders", "cafe") == (True, ["b:0"])
    assert store.list_open() == []
