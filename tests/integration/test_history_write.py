"""History.write on a real Redis: a batch appended with its counters, in one round trip."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from celery_dlx.fates import PARKED, REQUEUED, FateEvent
from celery_dlx.message.names import Keys
from celery_dlx.store.history import History, history_fields


def _events() -> list[FateEvent]:
    return [
        FateEvent.from_fields(
            PARKED,
            queue="orders",
            message_id="m-1",
            attempt=2,
            cause="c1",
            exc_type="KeyError",
            reason="rejected in orders",
            first_failure_ms=1_700_000_000_000,
            at_ms=1_700_000_000_500,
            delay=30.0,
        ),
        FateEvent.from_fields(
            REQUEUED,
            task="bill",
            queue="zahlungen",
            message_id='m-2 \u00e9\u4e2d\U0001f600 "quoted" \\ \n',
            attempt=1,
            cause="c2",
            exc_type="ValueError",
            reason="r" * 600,  # cut to 500, as one XADD would
            at_ms=1_700_000_000_600,
            extra={"obituary": {"id": "o1", "payload": None}},
        ),
    ]


def _stream(client: Any, keys: Keys) -> list[dict[str, str]]:
    return [fields for _, fields in History(client, keys).read()]


def test_a_batch_is_appended_as_one_xadd_per_event_would_append_it(
    redis_client: Any, keys: Keys
) -> None:
    events = _events()
    assert History(redis_client, keys).write(events)  # counted; a refused append raises
    expected = [history_fields(e) for e in events]
    assert _stream(redis_client, keys) == expected
    assert len(expected[1]["reason"]) == 500 and "obituary" in expected[1]
    # The same events appended one XADD each (the path a Redis Cluster takes) read back alike.
    other = Keys(keys.prefix + "-xadd")
    try:
        History(redis_client, other).append_many(events)
        assert _stream(redis_client, other) == expected
    finally:
        redis_client.delete(other.history)


def test_without_history_only_the_counters_are_written(redis_client: Any, keys: Keys) -> None:
    assert History(redis_client, keys).write(_events(), history=False)
    assert _stream(redis_client, keys) == []


def test_a_refused_append_is_reported(redis_client: Any, keys: Keys) -> None:
    redis_client.set(keys.history, "not a stream")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        History(redis_client, keys).write(_events())
