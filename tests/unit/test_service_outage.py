"""The DLX service's outage lines: once per outage, a full Redis that flaps included."""

from __future__ import annotations

import logging

import pytest

from celery_dlx.service.outage import Outage
from celery_dlx.service.stats import ServiceStats


class OutOfMemoryError(Exception):
    """Named as redis-py's: the service sees Redis errors by name only."""


def test_a_flapping_full_redis_is_one_outage(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    looks: list[object] = []
    outage = Outage(
        "Redis", quiet=10.0, clock=lambda: now[0], timer=lambda _, call: looks.append(call)
    )
    stats = ServiceStats()
    refused = OutOfMemoryError("command not allowed when used memory > 'maxmemory'.")
    with caplog.at_level(logging.WARNING, "celery_dlx.service.outage"):
        for _ in range(50):  # refused, one batch slips through, refused again...
            outage.begin(refused, 10, stats)
            now[0] += 2.0
            outage.end()
        assert outage.tries == 0  # each success resets the retry delay
        assert len(looks) == 1  # looked at again once the quiet time is over, once
        now[0] += 10.0
        looks[0]()  # type: ignore[operator]
        outage.end()  # over: nothing more
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert "unavailable (OutOfMemoryError" in lines[0]
    assert lines[1] == "DLX service: Redis back after 110.0s (50 failed tries)"
    assert stats.outages == 1 and stats.retries == 50


def test_a_server_that_was_down_is_back_at_the_first_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outage = Outage("Redis")
    with caplog.at_level(logging.WARNING, "celery_dlx.service.outage"):
        outage.begin(ConnectionError("Connection refused"), 1, ServiceStats())
        outage.end()
    assert [r.getMessage().split(" after")[0] for r in caplog.records][1:] == [
        "DLX service: Redis back"
    ]
