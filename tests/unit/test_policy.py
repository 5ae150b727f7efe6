"""The pure failure policy: classification, the escalation ladder, backoff schedules (no I/O)."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import timedelta
from types import MappingProxyType
from typing import Any

import pytest

from celery_dlx.errors import ConfigurationError
from celery_dlx.fates import Bury, Park, Requeue
from celery_dlx.message.headers import DLXState
from celery_dlx.policy.decide import (
    Backoff,
    CallableBackoff,
    Decision,
    ExponentialBackoff,
    ListBackoff,
    Policy,
    ToBury,
    ToPark,
    ToRequeue,
    classify,
    decide,
    parse_backoff,
    parse_matchers,
)

AT_MS = 1_700_000_000_000


def letter(decision: Decision) -> str:
    return {ToRequeue: "R", ToPark: "P", ToBury: "B"}[type(decision)]


def run_until_buried(make_exc: Callable[[], BaseException], policy: Policy) -> list[Decision]:
    """Feed a message that always fails through ``decide``, carrying its state as a copy would."""
    state = DLXState()
    decisions: list[Decision] = []
    for run in range(1000):
        decision = decide(make_exc(), state, policy)
        decisions.append(decision)
        if isinstance(decision, ToBury):
            return decisions
        fate = "requeued" if isinstance(decision, ToRequeue) else "parked"
        state = state.after_failure(fate=fate, at_ms=AT_MS + run, cause="c", queue="q")
    raise AssertionError("the message was never buried")


# --- the escalation ladder ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_requeues", "max_parks", "ladder"),
    [
        (0, 0, "B"),
        (1, 0, "RB"),
        (0, 1, "PB"),
        (2, 3, "RRPPPB"),
        (2, 5, "RRPPPPPB"),
        (5, 2, "RRRRRPPB"),
        (10, 10, "R" * 10 + "P" * 10 + "B"),
    ],
)
def test_always_failing_message_climbs_the_whole_ladder(
    max_requeues: int, max_parks: int, ladder: str
) -> None:
    policy = Policy(max_requeues=max_requeues, max_parks=max_parks, backoff=ListBackoff((1.0,)))
    decisions = run_until_buried(lambda: RuntimeError("boom"), policy)
    assert "".join(letter(d) for d in decisions) == ladder
    assert len(decisions) == policy.max_runs == 1 + max_requeues + max_parks


@pytest.mark.parametrize(
    "make_exc",
    [lambda: RuntimeError("unclassified"), lambda: Requeue("explicit requeue")],
    ids=["unclassified", "Requeue"],
)
def test_requeue_and_unclassified_failures_escalate_alike(
    make_exc: Callable[[], BaseException],
) -> None:
    decisions = run_until_buried(make_exc, Policy(max_requeues=2, max_parks=2))
    assert "".join(letter(d) for d in decisions) == "RRPPB"


@pytest.mark.parametrize(
    ("max_requeues", "max_parks", "ladder"),
    [(0, 0, "B"), (3, 0, "B"), (3, 2, "PPB"), (0, 4, "PPPPB")],
)
def test_park_classified_failures_skip_the_requeues(
    max_requeues: int, max_parks: int, ladder: str
) -> None:
    policy = Policy(max_requeues=max_requeues, max_parks=max_parks, park_on=(TimeoutError,))
    for make_exc in (lambda: TimeoutError("slow"), lambda: Park(), lambda: Park(countdown=3)):
        decisions = run_until_buried(make_exc, policy)
        assert "".join(letter(d) for d in decisions) == ladder
        assert len(decisions) == 1 + max_parks


def test_parks_follow_the_backoff_schedule_by_park_index() -> None:
    policy = Policy(max_requeues=1, max_parks=5, backoff=ListBackoff((1.0, 2.0, 3.0)))
    decisions = run_until_buried(lambda: RuntimeError("x"), policy)
    assert [d.delay for d in decisions if isinstance(d, ToPark)] == [1.0, 2.0, 3.0, 3.0, 3.0]


def test_spent_budget_reason_names_the_counts_and_the_exception() -> None:
    state = DLXState(attempt=7, requeues=2, parks=5)
    decision = decide(KeyError("k"), state, Policy(max_requeues=2, max_parks=5))
    assert decision == ToBury(reason="retry budget spent: 2 requeues, 5 parks (KeyError)")


def test_decisions_carry_the_exception_type_as_reason() -> None:
    policy = Policy(max_requeues=1, max_parks=1, backoff=ListBackoff((4.0,)))
    assert decide(OSError("x"), DLXState(), policy) == ToRequeue(reason="OSError")
    assert decide(OSError("x"), DLXState(requeues=1), policy) == ToPark(delay=4.0, reason="OSError")


# --- classification -------------------------------------------------------------------------


def mentions_fatal(exc: BaseException) -> bool:
    return "fatal" in str(exc)


def broken_predicate(exc: BaseException) -> bool:
    raise RuntimeError("the predicate itself is broken")


@pytest.mark.parametrize(
    ("exc", "lists", "kind"),
    [
        (ValueError(), {}, "escalate"),
        (ValueError(), {"requeue_on": (ValueError,)}, "requeue"),
        (ValueError(), {"park_on": (ValueError,), "requeue_on": (ValueError,)}, "park"),
        (
            ValueError(),
            {"bury_on": (ValueError,), "park_on": (ValueError,), "requeue_on": (ValueError,)},
            "bury",
        ),
        (KeyError(), {"park_on": (LookupError,)}, "park"),
        (TypeError(), {"park_on": (ValueError,), "bury_on": (KeyError,)}, "escalate"),
        (Bury(), {"requeue_on": (Exception,), "park_on": (Exception,)}, "bury"),
        (Park(), {"requeue_on": (Exception,)}, "park"),
        (Requeue(), {}, "requeue"),
        (Requeue(), {"bury_on": (Exception,)}, "bury"),
        (RuntimeError("fatal: disk"), {"bury_on": (mentions_fatal,)}, "bury"),
        (RuntimeError("flaky"), {"bury_on": (mentions_fatal,)}, "escalate"),
        (RuntimeError("x"), {"bury_on": (broken_predicate,)}, "escalate"),
        (RuntimeError("x"), {"bury_on": (broken_predicate, RuntimeError)}, "bury"),
        (RuntimeError("x"), {"bury_on": (broken_predicate,), "park_on": (RuntimeError,)}, "park"),
        (KeyboardInterrupt(), {"bury_on": (Exception,)}, "escalate"),
        (KeyboardInterrupt(), {"bury_on": (BaseException,)}, "bury"),
    ],
)
def test_classify(exc: BaseException, lists: dict[str, Any], kind: str) -> None:
    assert classify(exc, Policy(**lists)) == kind


def test_a_raising_predicate_does_not_break_decide() -> None:
    policy = Policy(max_requeues=1, park_on=(broken_predicate,))
    assert decide(RuntimeError("x"), DLXState(), policy) == ToRequeue(reason="RuntimeError")


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (Bury("invoice has no customer"), "invoice has no customer"),
        (Bury(), "buried by task"),
        (ValueError("bad"), "permanent failure: ValueError"),
    ],
)
def test_burials_ignore_the_remaining_budget(exc: BaseException, reason: str) -> None:
    policy = Policy(max_requeues=9, max_parks=9, bury_on=(ValueError,))
    assert decide(exc, DLXState(), policy) == ToBury(reason=reason)


# --- Park(countdown) -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "parks", "expected"),
    [
        (Park(countdown=7.5), 0, ToPark(delay=7.5, reason="Park")),
        (Park(countdown=0), 0, ToPark(delay=0, reason="Park")),
        (Park(countdown=42), 2, ToPark(delay=42, reason="Park")),
        (Park(), 0, ToPark(delay=100.0, reason="Park")),
        (Park(), 1, ToPark(delay=200.0, reason="Park")),
        (Park(countdown=7.5), 3, ToBury(reason="retry budget spent: 0 requeues, 3 parks (Park)")),
    ],
)
def test_park_countdown_overrides_the_backoff(exc: Park, parks: int, expected: Decision) -> None:
    policy = Policy(max_requeues=5, max_parks=3, backoff=ListBackoff((100.0, 200.0)))
    assert decide(exc, DLXState(parks=parks), policy) == expected


def test_park_rejects_a_negative_countdown() -> None:
    with pytest.raises(ValueError, match="countdown"):
        Park(countdown=-1)


def test_countdown_is_not_used_for_an_escalated_park() -> None:
    """Only a Park exception carries a countdown; an escalated failure uses the schedule."""
    policy = Policy(max_requeues=0, max_parks=3, backoff=ListBackoff((5.0, 6.0)))
    assert decide(RuntimeError(), DLXState(parks=1), policy) == ToPark(6.0, "RuntimeError")


# --- backoff schedules -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("delays", "index", "expected"),
    [
        ((1.0, 2.0, 3.0), 0, 1.0),
        ((1.0, 2.0, 3.0), 2, 3.0),
        ((1.0, 2.0, 3.0), 9, 3.0),
        ((5.0,), 4, 5.0),
    ],
)
def test_list_backoff_repeats_its_last_delay(
    delays: tuple[float, ...], index: int, expected: float
) -> None:
    assert ListBackoff(delays)(index) == expected


@pytest.mark.parametrize(
    ("base", "factor", "cap", "index", "expected"),
    [
        (10.0, 2.0, 3600.0, 0, 10.0),
        (10.0, 2.0, 3600.0, 3, 80.0),
        (10.0, 2.0, 3600.0, 8, 2560.0),
        (10.0, 2.0, 3600.0, 9, 3600.0),
        (1.0, 3.0, 1000.0, 4, 81.0),
        (5.0, 1.0, 60.0, 10, 5.0),
        (10.0, 2.0, 3600.0, 10_000, 3600.0),
        (0.5, 10.0, 1e9, 5, 50_000.0),
    ],
)
def test_exponential_backoff_without_jitter(
    base: float, factor: float, cap: float, index: int, expected: float
) -> None:
    backoff = ExponentialBackoff(base=base, factor=factor, max=cap, jitter=0.0)
    assert backoff(index) == pytest.approx(expected)


@pytest.mark.parametrize("jitter", [0.1, 0.5, 1.0])
def test_exponential_jitter_only_shortens_and_is_reproducible(jitter: float) -> None:
    def schedule(seed: int) -> list[float]:
        backoff = ExponentialBackoff(
            base=10, factor=2, max=300, jitter=jitter, rng=random.Random(seed)
        )
        return [backoff(i % 8) for i in range(200)]

    delays = schedule(7)
    assert delays == schedule(7)
    assert delays != schedule(8)
    for i, delay in enumerate(delays):
        full = min(300.0, 10.0 * 2 ** (i % 8))
        assert full * (1 - jitter) <= delay <= full
    # The jitter really spreads the delays over its range, not just a sliver of it.
    ratios = [delay / min(300.0, 10.0 * 2 ** (i % 8)) for i, delay in enumerate(delays)]
    assert max(ratios) - min(ratios) > 0.8 * jitter


def test_exponential_backoffs_compare_without_their_random_source() -> None:
    assert ExponentialBackoff(rng=random.Random(1)) == ExponentialBackoff(rng=random.Random(2))


@pytest.mark.parametrize(
    ("fn", "index", "expected"),
    [(lambda n: n * 2, 3, 6.0), (lambda n: 0, 0, 0.0), (lambda n: 2.5**n, 2, 6.25)],
)
def test_callable_backoff(fn: Callable[[int], float], index: int, expected: float) -> None:
    delay = CallableBackoff(fn)(index)
    assert delay == expected
    assert isinstance(delay, float)


def test_callable_backoff_rejects_a_negative_delay_naming_the_setting() -> None:
    with pytest.raises(ConfigurationError, match=r"dlx_backoff callable returned a negative delay"):
        CallableBackoff(lambda n: -1)(0)


# --- parse_backoff ---------------------------------------------------------------------------


def double(n: int) -> float:
    return 2.0 * n


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ([1, 2, 3], ListBackoff((1.0, 2.0, 3.0))),
        ((5,), ListBackoff((5.0,))),
        ([0], ListBackoff((0.0,))),
        ([timedelta(seconds=30), timedelta(minutes=2)], ListBackoff((30.0, 120.0))),
        ([1.5, timedelta(milliseconds=250)], ListBackoff((1.5, 0.25))),
        ({}, ExponentialBackoff(base=10.0, factor=2.0, max=3600.0, jitter=0.1)),
        (
            {"base": 1, "factor": 3, "max": 60, "jitter": 0},
            ExponentialBackoff(base=1.0, factor=3.0, max=60.0, jitter=0.0),
        ),
        (
            {"base": timedelta(seconds=5), "max": timedelta(hours=1), "jitter": 1},
            ExponentialBackoff(base=5.0, factor=2.0, max=3600.0, jitter=1.0),
        ),
        (MappingProxyType({"base": 2}), ExponentialBackoff(base=2.0)),
        (double, CallableBackoff(double)),
    ],
)
def test_parse_backoff_accepts(value: Any, expected: Backoff) -> None:
    assert parse_backoff(value) == expected


def test_parse_backoff_passes_a_backoff_through() -> None:
    backoff = ExponentialBackoff(jitter=0.0)
    assert parse_backoff(backoff) is backoff


def test_parse_backoff_callable_is_called_with_the_park_index() -> None:
    assert parse_backoff(double)(4) == 8.0


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], r"^dlx_backoff must not be an empty list$"),
        ((), r"^dlx_backoff must not be an empty list$"),
        ([-1], r"^dlx_backoff\[0\] must hold non-negative seconds, got -1$"),
        ([1, "2"], r"^dlx_backoff\[1\] must hold non-negative seconds, got '2'$"),
        ([True], r"^dlx_backoff\[0\] must hold non-negative seconds, got True$"),
        ([None], r"^dlx_backoff\[0\] must hold non-negative seconds"),
        ([timedelta(seconds=-1)], r"^dlx_backoff\[0\] must hold non-negative seconds"),
        ("10", r"^dlx_backoff must be a list of seconds.*got str$"),
        (10, r"^dlx_backoff must be a list of seconds.*got int$"),
        (None, r"^dlx_backoff must be a list of seconds.*got NoneType$"),
        ({1, 2}, r"^dlx_backoff must be a list of seconds.*got set$"),
        ({"base": 1, "cap": 5}, r"^dlx_backoff has unknown keys \['cap'\]; use base, factor"),
        ({"jitter": 1.5}, r"^dlx_backoff\['jitter'\] must be between 0 and 1, got 1.5$"),
        ({"jitter": -0.1}, r"^dlx_backoff\['jitter'\] must be between 0 and 1"),
        ({"jitter": float("nan")}, r"^dlx_backoff\['jitter'\] must be a finite number, got nan$"),
        ({"factor": 0.5}, r"^dlx_backoff\['factor'\] must be >= 1, got 0.5$"),
        ({"base": -1}, r"^dlx_backoff\['base'\] must hold non-negative seconds, got -1$"),
        ({"max": "1h"}, r"^dlx_backoff\['max'\] must hold non-negative seconds, got '1h'$"),
        ({"base": timedelta(seconds=-3)}, r"^dlx_backoff\['base'\] must hold non-negative"),
    ],
)
def test_parse_backoff_rejects_naming_the_setting(value: Any, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        parse_backoff(value)


@pytest.mark.parametrize("value", [[], [-1], {"jitter": 2}, "x"])
def test_parse_backoff_errors_use_the_given_name(value: Any) -> None:
    name = "dlx_queues['billing']['backoff']"
    with pytest.raises(ConfigurationError) as info:
        parse_backoff(value, name)
    assert str(info.value).startswith(name)


# --- parse_matchers --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, ()),
        ((), ()),
        (ValueError, (ValueError,)),
        (mentions_fatal, (mentions_fatal,)),
        ([ValueError, mentions_fatal], (ValueError, mentions_fatal)),
        ((KeyError, BaseException), (KeyError, BaseException)),
        ([Bury], (Bury,)),
    ],
)
def test_parse_matchers_accepts(value: Any, expected: tuple[Any, ...]) -> None:
    assert parse_matchers(value, "dlx_park_on") == expected


def test_parse_matchers_accepts_a_set() -> None:
    assert set(parse_matchers({ValueError, KeyError}, "dlx_park_on")) == {ValueError, KeyError}


@pytest.mark.parametrize(
    ("value", "bad"),
    [
        ("ValueError", "'ValueError'"),
        (int, "<class 'int'>"),
        ([ValueError, 3], "3"),
        ([ValueError(), KeyError], "ValueError()"),
        ([None], "None"),
    ],
)
def test_parse_matchers_rejects_naming_the_option(value: Any, bad: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        parse_matchers(value, "task t: option dlx_bury_on")
    assert str(info.value) == (
        f"task t: option dlx_bury_on must hold exception classes or predicates, got {bad}"
    )


@pytest.mark.parametrize(("requeues", "parks", "runs"), [(0, 0, 1), (2, 5, 8), (3, 0, 4)])
def test_max_runs(requeues: int, parks: int, runs: int) -> None:
    assert Policy(max_requeues=requeues, max_parks=parks).max_runs == runs


def test_policy_defaults() -> None:
    policy = Policy()
    assert (policy.max_requeues, policy.max_parks, policy.max_runs) == (2, 5, 8)
    assert policy.backoff == ExponentialBackoff(base=10.0, factor=2.0, max=3600.0, jitter=0.1)
