"""Per-minute fate counters: written by Runtime.record, read by celery_dlx.store.counters (real Redis)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from celery_dlx.errors import ConfigurationError
from celery_dlx.fates import BURIED, PARKED, REQUEUED, FateEvent
from celery_dlx.message.names import Keys
from celery_dlx.store import counters
from celery_dlx.store.counters import COUNTER_TTL
from celery_dlx.wiring.runtime import get_runtime

REDIS_URL = "redis://127.0.0.1:6379/0"
#: A fixed minute far from now, so the test's reads see only its own writes.
T0 = 1_700_000_000_000 - (1_700_000_000_000 % 60000)


def _runtime(key_prefix: str) -> Any:
    app = Celery("counters-test", set_as_current=False)
    app.conf.update(dlx_key_prefix=key_prefix, dlx_redis_url=REDIS_URL)
    return get_runtime(app)


def _record(runtime: Any, fate: str, queue: str, at_ms: int, n: int = 1) -> None:
    for i in range(n):
        runtime.record(
            FateEvent.from_fields(
                fate=fate,
                queue=queue,
                message_id=f"{queue}-{fate}-{at_ms}-{i}",
                attempt=1,
                at_ms=at_ms,
            ),
            history=False,
        )


def test_counts_per_queue_fate_and_minute(key_prefix: str, keys: Keys, redis_client: Any) -> None:
    runtime = _runtime(key_prefix)
    _record(runtime, REQUEUED, "orders", T0, 3)
    _record(runtime, BURIED, "orders", T0 + 59_999, 1)
    _record(runtime, BURIED, "orders", T0 + 60_000, 2)
    _record(runtime, PARKED, "odd|queue", T0 + 120_000, 1)
    start = counters.minute_of(T0)
    read = counters.read_minutes(redis_client, keys, start, start + 3)
    assert sorted((r.minute - start, r.queue, r.fate, r.count) for r in read.rows) == [
        (0, "orders", "buried", 1),
        (0, "orders", "requeued", 3),
        (1, "orders", "buried", 2),
        (2, "odd|queue", "parked", 1),
    ]
    assert read.totals() == {
        ("orders", "requeued"): 3,
        ("orders", "buried"): 3,
        ("odd|queue", "parked"): 1,
    }
    assert read.by_fate() == {"requeued": 3, "buried": 3, "parked": 1}
    assert read.series("orders", "buried") == [
        (start, 1),
        (start + 1, 2),
        (start + 2, 0),
        (start + 3, 0),
    ]
    assert read.queues() == ["odd|queue", "orders"]
    assert read.malformed == []
    ttl = redis_client.ttl(f"{keys.counter_prefix}{start}")
    assert 0 < ttl <= COUNTER_TTL


def test_window_and_thresholds(key_prefix: str, keys: Keys, redis_client: Any) -> None:
    runtime = _runtime(key_prefix)
    now = T0 + 10 * 60000 + 5000
    _record(runtime, BURIED, "payments", now - 30 * 60000, 50)  # outside a 5-minute window
    _record(runtime, BURIED, "payments", now - 2 * 60000, 4)
    _record(runtime, BURIED, "emails", now, 1)
    window = counters.read_window(redis_client, keys, 300, at_ms=now)
    assert window.totals() == {("payments", "buried"): 4, ("emails", "buried"): 1}

    rules = [
        counters.Threshold(fate=BURIED, limit=3, seconds=300),
        counters.Threshold(fate=BURIED, limit=0, seconds=300, queue="emails"),
        counters.Threshold(fate=PARKED, limit=0, seconds=300),
    ]
    found = counters.breaches(redis_client, keys, rules, at_ms=now)
    assert [(b.queue, b.count, b.threshold.limit) for b in found] == [
        ("payments", 4, 3),
        ("emails", 1, 0),
    ]
    hour = counters.breaches(redis_client, keys, [counters.Threshold(BURIED, 50, 3600)], at_ms=now)
    assert [(b.queue, b.count) for b in hour] == [("payments", 54)]


def test_malformed_fields_are_reported_not_dropped(
    key_prefix: str, keys: Keys, redis_client: Any
) -> None:
    minute = counters.minute_of(T0)
    key = f"{keys.counter_prefix}{minute}"
    redis_client.hset(key, mapping={"orders|buried": 2, "no-separator": 1, "orders|parked": "x"})
    read = counters.read_minutes(redis_client, keys, minute, minute)
    assert [(r.queue, r.fate, r.count) for r in read.rows] == [("orders", "buried", 2)]
    reasons = {name: reason for _, name, reason in read.malformed}
    assert set(reasons) == {"no-separator", "orders|parked"}
    assert "<queue>|<fate>" in reasons["no-separator"]


def test_prometheus_text() -> None:
    text = counters.prometheus_text({("orders", "buried"): 3, ('we"ird', "parked"): 1}, 300)
    lines = text.splitlines()
    assert lines[1] == "# TYPE celery_dlx_fate_changes gauge"
    assert 'celery_dlx_fate_changes{queue="orders",fate="buried",window="300s"} 3' in lines
    assert 'celery_dlx_fate_changes{queue="we\\"ird",fate="parked",window="300s"} 1' in lines


def test_bad_windows_name_the_problem(keys: Keys, redis_client: Any) -> None:
    with pytest.raises(ConfigurationError, match="before it starts"):
        counters.read_minutes(redis_client, keys, 10, 9)
    with pytest.raises(ConfigurationError, match="retention"):
        counters.read_window(redis_client, keys, 30 * 86400)
    with pytest.raises(ConfigurationError, match="fate must be one of"):
        counters.Threshold(fate="exploded", limit=1)
