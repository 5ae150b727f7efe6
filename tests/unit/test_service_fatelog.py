"""The DLX service's fate log: one line per batch and fate, grouped by queue and cause."""

from __future__ import annotations

import logging

import pytest

from celery_dlx.fates import BURIED, PARKED, FateEvent
from celery_dlx.service import fatelog
from celery_dlx.service.fatelog import GROUPS_LIMIT, fate_lines, log_fates


def _event(fate: str, queue: str, cause: str, n: int, **extra: object) -> FateEvent:
    return FateEvent.from_fields(
        fate,
        queue=queue,
        cause=cause,
        message_id=f"{queue}-{n}",
        attempt=n % 3,
        reason=f"rejected in {queue}",
        at_ms=1_700_000_000_000,
        **extra,  # type: ignore[arg-type]
    )


def test_a_batch_gets_one_line_per_fate_counting_each_queue_and_cause() -> None:
    events = [
        *(_event(PARKED, "orders", "c1", i, delay=30.0) for i in range(3)),
        *(_event(BURIED, "mail", "c2", i) for i in range(2)),
        _event(BURIED, "orders", "c3", 7, task="bill"),
    ]
    (parked, buried) = fate_lines(events)
    assert parked == (
        logging.INFO,
        "DLX service parked 3 dead letter(s): 3 in queue=orders cause=c1 "
        "(e.g. -[orders-0] attempt=0 delay=30.000s reason=rejected in orders)",
    )
    assert buried == (
        logging.ERROR,
        "DLX service buried 3 dead letter(s): 2 in queue=mail cause=c2 "
        "(e.g. -[mail-0] attempt=0 reason=rejected in mail); 1 in queue=orders cause=c3 "
        "(e.g. bill[orders-7] attempt=1 reason=rejected in orders)",
    )


def test_a_line_names_at_most_the_limit_of_groups() -> None:
    events = [_event(BURIED, f"q{i}", "c", i) for i in range(GROUPS_LIMIT + 3)]
    ((_, line),) = fate_lines(events)
    assert line.startswith(f"DLX service buried {GROUPS_LIMIT + 3} dead letter(s): ")
    assert line.count(" in queue=") == GROUPS_LIMIT
    assert line.endswith("; and 3 more queue/cause group(s)")


def test_each_letter_is_logged_at_debug_only(caplog: pytest.LogCaptureFixture) -> None:
    events = [_event(PARKED, "orders", "c1", i, delay=1.0) for i in range(4)]
    caplog.set_level(logging.INFO, logger=fatelog.__name__)
    log_fates(events)
    assert [r.getMessage()[:31] for r in caplog.records] == ["DLX service parked 4 dead lette"]
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger=fatelog.__name__)
    log_fates(events)
    assert len(caplog.records) == 5
    assert caplog.records[1].getMessage() == (
        "parked -[orders-0] attempt=0 queue=orders cause=c1 reason=rejected in orders"
    )
    caplog.clear()
    log_fates([])
    assert caplog.records == []
