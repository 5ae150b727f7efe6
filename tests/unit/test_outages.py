"""One log line per outage and cause, with counts (celery_dlx.outages)."""

from __future__ import annotations

import logging

import pytest

from celery_dlx.outages import OutageLog, cause_of, outage_log


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class OOM(Exception):
    pass


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records]


def test_a_storm_of_refusals_is_one_line_then_one_per_window(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    looks: list[tuple[float, object]] = []
    log = OutageLog(
        logging.getLogger("t.outage"),
        "parks",
        window=60,
        clock=clock,
        timer=lambda delay, call: looks.append((delay, call)),
    )
    refused = OOM("OOM command not allowed when used memory > 'maxmemory'.\nmore")
    with caplog.at_level(logging.WARNING, "t.outage"):
        for n in range(1_235):
            clock.now = n * 0.1  # 123.4 s of refusals
            log.failed(refused, "sent to the DLX service")
        assert log.failing and log.total() == 1_235
        clock.now = 130.0
        log.succeeded()  # a write slipping through at the limit: still the same outage
        log.succeeded()
        assert log.failing
        # ... looked at again once the quiet time is over (once), even if no write follows
        assert [round(d, 1) for d, _ in looks] == [3.5]
        clock.now = 140.0
        looks[0][1]()  # type: ignore[operator]
        log.succeeded()  # no outage: nothing
    text = lines(caplog)
    assert len(text) == 4, text
    assert text[0].startswith("celery_dlx: parks failing (OOM: OOM command not allowed")
    assert "more" not in text[0] and "sent to the DLX service" in text[0]
    assert text[1] == (
        "celery_dlx: parks failed 600 times in the last 60 s (OOM: OOM command not allowed when "
        "used memory > 'maxmemory'.); sent to the DLX service"
    )
    assert "failed 600 times" in text[2]
    assert text[3].startswith("celery_dlx: parks succeeding again after 140.0 s (1,235 failures")
    assert not log.failing and all(r.exc_info is None for r in caplog.records)


def test_each_cause_has_its_own_first_line(caplog: pytest.LogCaptureFixture) -> None:
    log = OutageLog(logging.getLogger("t.causes"), "writes", clock=Clock(), timer=None)
    with caplog.at_level(logging.WARNING, "t.causes"):
        for _ in range(3):
            log.failed(OOM("full"))
            log.failed(ConnectionError("refused"))
    assert len(lines(caplog)) == 2
    assert cause_of(ValueError("")) == "ValueError"


def test_an_owner_keeps_one_log_per_name() -> None:
    class Owner:
        pass

    owner = Owner()
    first = outage_log(owner, "_x", logging.getLogger("t"), "parks")
    assert outage_log(owner, "_x", logging.getLogger("t"), "parks") is first
    assert outage_log(owner, "_y", logging.getLogger("t"), "parks") is not first
