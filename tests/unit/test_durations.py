"""One rule for every duration (celery_dlx.policy.durations), used by config and policy alike.

Each table holds edge values with the verdict of the code that consumes them at run time
(a Redis expiry, a beat schedule, a delay queue's declare, a park); the validators must reject
exactly those. tests/integration/test_duration_limits.py checks the broker and Redis limits used here
against the real servers.
"""

from __future__ import annotations

import math
from datetime import timedelta
from typing import Any

import pytest

from celery_dlx.broker.ladder import Ladder, delay_queue_arguments, round_up
from celery_dlx.errors import ConfigurationError
from celery_dlx.fates import now_ms
from celery_dlx.policy import durations
from celery_dlx.policy.config import load_config
from celery_dlx.policy.decide import CallableBackoff, ExponentialBackoff, parse_backoff

INT64 = 2**63 - 1
EDGE_SECONDS: list[Any] = [
    0,
    0.0,
    -0.0,
    -1,
    0.0004,
    0.0005,
    0.001,
    0.0011,
    1,
    1.5,
    3600,
    timedelta(milliseconds=1),
    timedelta(0),
    timedelta(seconds=-1),
    durations.MAX_SECONDS,
    durations.MAX_SECONDS + 86_400,
    1e300,
    math.inf,
    -math.inf,
    math.nan,
    True,
    False,
    None,
    "5",
    b"5",
    [5],
]


def _seconds_of(value: Any) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"not seconds: {value!r}")
    return float(value)


def _as_used(value: Any) -> tuple[float, int] | None:
    """``(seconds, ms)`` as the runtime turns a value into a timedelta and whole ms, or None
    where that raises."""
    try:
        seconds = _seconds_of(value)
        ms = int(seconds * 1000)
        timedelta(seconds=seconds)
    except (TypeError, ValueError, OverflowError):
        return None
    return seconds, ms


def runtime_takes_duration(value: Any) -> bool:
    """What the consumers of a duration setting accept.

    ``dlx_cause_ttl`` and ``dlx_sentry_rate_window`` become ``SET ... PX int(s * 1000)`` (Redis:
    1 ms to an int64 of epoch ms), ``dlx_drain_interval`` a Celery beat schedule (a timedelta),
    ``dlx_drain_lease`` and ``dlx_graveyard_retention`` millisecond offsets of epoch-ms scores.
    """
    used = _as_used(value)
    return used is not None and used[0] > 0 and used[1] >= 1 and now_ms() + used[1] <= INT64


def runtime_takes_delay(value: Any) -> bool:
    """What a park does with a backoff delay: ``due_ms = now + int(delay * 1000)``, an epoch-ms
    score (int64). Like every duration it stays within what a timedelta holds; a negative delay
    means nothing (it is refused as a mistake)."""
    used = _as_used(value)
    return used is not None and used[0] >= 0 and now_ms() + used[1] <= INT64


def _accepts(check: Any, value: Any) -> bool:
    try:
        check(value)
    except ConfigurationError:
        return False
    return True


@pytest.mark.parametrize("value", EDGE_SECONDS, ids=repr)
def test_a_duration_setting_is_refused_exactly_when_the_runtime_cannot_use_it(value: Any) -> None:
    expected = runtime_takes_duration(value)
    for name in (
        "dlx_drain_interval",
        "dlx_drain_lease",
        "dlx_graveyard_retention",
        "dlx_cause_ttl",
        "dlx_sentry_rate_window",
    ):
        assert _accepts(lambda v, n=name: load_config({n: v}), value) is expected, name
    assert _accepts(lambda v: durations.duration(v, "x"), value) is expected


@pytest.mark.parametrize("value", EDGE_SECONDS, ids=repr)
def test_a_backoff_delay_is_refused_exactly_when_a_park_cannot_use_it(value: Any) -> None:
    expected = runtime_takes_delay(value)
    # Config (dlx_backoff, dlx_queues) and policy (task options) parse backoffs the same way.
    assert _accepts(lambda v: load_config({"dlx_backoff": [v]}), value) is expected
    assert _accepts(lambda v: load_config({"dlx_queues": {"q": {"backoff": [v]}}}), value) is (
        expected
    )
    assert _accepts(lambda v: parse_backoff([v]), value) is expected
    assert _accepts(lambda v: parse_backoff({"base": v, "max": v}), value) is expected


@pytest.mark.parametrize("value", [v for v in EDGE_SECONDS if not isinstance(v, (str, bytes))])
def test_a_backoff_callable_is_held_to_the_same_rule_at_run_time(value: Any) -> None:
    backoff = CallableBackoff(lambda _n: value)
    assert _accepts(lambda _: backoff(0), None) is runtime_takes_delay(value)


def test_a_huge_exponential_factor_waits_the_max_instead_of_overflowing() -> None:
    backoff = parse_backoff({"base": 1, "factor": 1e300, "max": 60, "jitter": 0})
    assert isinstance(backoff, ExponentialBackoff)
    assert [backoff(n) for n in (0, 1, 5, 100)] == [1, 60, 60, 60]


def runtime_takes_ladder(value: Any) -> bool:
    """What the TTL ladder does at the first park: build its steps, then declare each delay
    queue with ``x-message-ttl`` = step and ``x-expires`` = step + margin (RabbitMQ: at most
    :data:`durations.MAX_TTL_MS`, a positive TTL per step) and round delays up to a step."""
    try:
        steps = [durations.step_ms(_seconds_of(v)) for v in value]
    except (TypeError, ValueError, OverflowError):
        return False
    if not steps or any(s < 1 for s in steps) or steps != sorted(set(steps)):
        return False
    for ms in steps:
        args = delay_queue_arguments("q", ms)
        if not (args["x-message-ttl"] >= 1 and args["x-expires"] <= durations.MAX_TTL_MS):
            return False
    return round_up(steps[-1], steps) == (steps[-1], False)


LADDERS: list[Any] = [
    [1, 5, 10],
    [0.001, 0.002],
    [0.0006, 1],  # rounds to 1 ms
    [0.0004, 1],  # rounds to 0 ms
    [0.0011, 0.0012],  # one millisecond twice
    [1.0001, 1.0002],
    [5, 1],
    [1, 1],
    [],
    [0, 5],
    [-1, 5],
    [1, math.inf],
    [math.nan],
    [timedelta(seconds=1), timedelta(minutes=1)],
    [durations.MAX_STEP_MS / 1000],
    [(durations.MAX_STEP_MS + 1) / 1000],
    [1, 3650 * 86_400],  # ten years: RabbitMQ's largest TTL, past it with the expiry margin
    [True],
    ["1"],
]


@pytest.mark.parametrize("ladder", LADDERS, ids=repr)
def test_a_ladder_is_refused_exactly_when_the_broker_would_refuse_it(ladder: Any) -> None:
    expected = runtime_takes_ladder(ladder)
    assert _accepts(lambda v: load_config({"dlx_ttl_ladder": v}), ladder) is expected
    assert _accepts(lambda v: durations.ladder(v), ladder) is expected
    assert _accepts(lambda v: durations.ladder_ms(v), ladder) is expected
    assert _accepts(Ladder, ladder) is expected


@pytest.mark.parametrize("ladder", [v for v in LADDERS if runtime_takes_ladder(v)], ids=repr)
def test_a_configured_ladder_is_the_one_the_broker_uses(ladder: Any) -> None:
    config = load_config({"dlx_ttl_ladder": ladder})
    assert Ladder(config.ttl_ladder).steps == durations.ladder_ms(ladder)


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"dlx_cause_ttl": math.inf}, "dlx_cause_ttl must be a finite number of seconds, got inf"),
        ({"dlx_drain_lease": math.nan}, "dlx_drain_lease must be a finite number of seconds"),
        ({"dlx_drain_interval": 0.0004}, "dlx_drain_interval must be at least 0.001 s"),
        ({"dlx_graveyard_retention": 1e300}, "dlx_graveyard_retention must be at most"),
        ({"dlx_backoff": [math.inf]}, "dlx_backoff[0] must be a finite number of seconds"),
        ({"dlx_ttl_ladder": [1, math.inf]}, "dlx_ttl_ladder[1] must be a finite number"),
        (
            {"dlx_ttl_ladder": [1, 3650 * 86_400]},
            "dlx_ttl_ladder steps must be at most 315356400 s",
        ),
        ({"dlx_ttl_ladder": [1.0001, 1.0002]}, "dlx_ttl_ladder steps must differ by at least 1 ms"),
    ],
)
def test_refusals_name_the_setting_and_the_rule(conf: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_config(conf)
    assert str(info.value).startswith(message), str(info.value)
