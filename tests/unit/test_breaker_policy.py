"""The per-cause breaker's pure state machine and its setting (celery_dlx.policy.breaker)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.breaker import (
    BreakerSettings,
    BreakerState,
    Hold,
    on_failure,
    on_success,
    parse_breaker,
    release_schedule,
)
from celery_dlx.policy.config import load_config

S = BreakerSettings(failures=3, window=10, hold=60, probe=5, release_rate=2)
T0 = 1_000_000


def fail_times(
    times: list[int], state: BreakerState | None = None
) -> tuple[BreakerState, list[Hold | None]]:
    state = state or BreakerState()
    verdicts = []
    for t in times:
        state, verdict = on_failure(state, S, t)
        verdicts.append(verdict)
    return state, verdicts


def test_failures_up_to_the_threshold_take_their_ordinary_fate() -> None:
    state, verdicts = fail_times([T0, T0 + 1000, T0 + 2000])
    assert verdicts == [None, None, None]
    assert not state.open
    assert state.failures == 3


def test_the_failure_past_the_threshold_opens_and_is_the_first_canary() -> None:
    state, verdicts = fail_times([T0, T0 + 1, T0 + 2, T0 + 3])
    assert verdicts[-1] == Hold(due_ms=T0 + 3 + 5000, canary=True, opened=True)
    assert state.open and state.opened_ms == T0 + 3 and state.held == 1


def test_failures_spread_over_windows_never_open() -> None:
    # 3 per 10 s window, for a minute: never more than `failures` in one window.
    times = [T0 + w * 10_000 + i for w in range(6) for i in range(3)]
    state, verdicts = fail_times(times)
    assert verdicts == [None] * len(times)
    assert not state.open


def test_while_open_failures_are_held_for_hold_and_only_one_canary_per_probe() -> None:
    state, _ = fail_times([T0, T0 + 1, T0 + 2, T0 + 3])
    probe = T0 + 3 + 5000
    state, second = on_failure(state, S, T0 + 100)
    state, third = on_failure(state, S, T0 + 200)
    assert second == Hold(due_ms=T0 + 100 + 60_000, canary=False, opened=False)
    assert third == Hold(due_ms=T0 + 200 + 60_000, canary=False, opened=False)
    assert state.probe_ms == probe and state.held == 3


def test_a_failing_canary_becomes_the_canary_of_the_next_probe() -> None:
    state, _ = fail_times([T0, T0 + 1, T0 + 2, T0 + 3])
    canary_at = state.probe_ms
    state, again = on_failure(state, S, canary_at + 50)  # the canary ran and failed
    assert again == Hold(due_ms=canary_at + 50 + 5000, canary=True, opened=False)
    state, other = on_failure(state, S, canary_at + 60)
    assert other is not None and not other.canary
    assert state.open


def test_success_closes_and_resets_the_counts() -> None:
    state, _ = fail_times([T0, T0 + 1, T0 + 2, T0 + 3])
    closed, was_open = on_success(state)
    assert was_open and closed == BreakerState()
    # Counting starts over: it takes `failures` + 1 failures to open again.
    _, verdicts = fail_times([T0 + 10, T0 + 11, T0 + 12], closed)
    assert verdicts == [None, None, None]
    assert on_success(BreakerState())[1] is False


def test_release_schedule_spreads_held_messages_at_the_rate() -> None:
    assert release_schedule(5, 2, 0) == [(0, 2, 0), (2, 4, 1000), (4, 5, 2000)]
    assert release_schedule(0, 2, 0) == []


def test_parse_breaker_defaults_and_partial_mappings() -> None:
    assert parse_breaker(None) is None
    assert parse_breaker({}) == BreakerSettings()
    assert parse_breaker({"failures": 5, "hold": 20, "probe": 2}) == BreakerSettings(
        failures=5, window=60.0, hold=20.0, probe=2.0, release_rate=50
    )


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("on", "dlx_breaker must be None or a mapping"),
        ({"failure": 1}, "dlx_breaker has unknown keys ['failure']"),
        ({"failures": 0}, "dlx_breaker['failures'] must be a positive integer"),
        ({"release_rate": 2.5}, "dlx_breaker['release_rate'] must be a positive integer"),
        ({"window": float("inf")}, "dlx_breaker['window'] must be a positive number"),
        ({"hold": 5, "probe": 10}, "dlx_breaker['probe'] (10.0) must not exceed"),
    ],
)
def test_parse_breaker_errors_name_the_key(value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_breaker(value)
    assert str(info.value).startswith(message), str(info.value)


def test_per_queue_breaker_refines_the_setting() -> None:
    config = load_config(
        {
            "dlx_breaker": {"failures": 10},
            "dlx_queues": {
                "billing": {"breaker": {"failures": 2, "hold": 30, "probe": 3}},
                "emails": {"breaker": None},
            },
        }
    )
    assert config.breaker_for("orders") == BreakerSettings(failures=10)
    assert config.breaker_for("billing") == BreakerSettings(failures=2, hold=30.0, probe=3.0)
    assert config.breaker_for("emails") is None
    assert load_config({}).breaker_for("orders") is None


def test_task_option_overrides_queue_and_setting() -> None:
    from celery_dlx.policy.options import resolve_task_options

    config = load_config({"dlx_queues": {"billing": {"breaker": {"failures": 2}}}})
    plain = type("Charge", (), {"name": "proj.charge"})
    own = type("Charge", (), {"name": "proj.charge", "dlx_breaker": {"failures": 7}})
    assert resolve_task_options(plain, config, "orders").breaker is None
    assert resolve_task_options(plain, config, "billing").breaker == BreakerSettings(failures=2)
    assert resolve_task_options(own, config, "orders").breaker == BreakerSettings(failures=7)
    bad = type("Charge", (), {"name": "proj.charge", "dlx_breaker": {"failures": -1}})
    with pytest.raises(
        ConfigurationError, match=r"^task proj.charge: option dlx_breaker\['failures'\]"
    ):
        resolve_task_options(bad, config, "orders")
