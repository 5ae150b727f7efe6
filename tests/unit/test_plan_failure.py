"""``plan_failure``: the pure "what to do" of a failed run (``DLXTask._fail`` only carries it out)."""

from __future__ import annotations

import pytest

from celery_dlx.fates import Bury, Park
from celery_dlx.message.headers import DLXState, fingerprint
from celery_dlx.policy.decide import (
    ListBackoff,
    Policy,
    ToBury,
    ToPark,
    ToRequeue,
    plan_failure,
    root_cause,
)
from celery_dlx.worker.retrying import RetryPark

POLICY = Policy(max_requeues=2, max_parks=2, backoff=ListBackoff((5.0, 30.0)))
AT = 1_700_000_000_000


def plan(exc: BaseException, state: DLXState, retries: int = 0):  # type: ignore[no-untyped-def]
    return plan_failure(
        exc, state, POLICY, task="proj.charge", queue="work", retries=retries, at_ms=AT
    )


@pytest.mark.parametrize(
    ("state", "fate", "decision", "delay"),
    [
        (DLXState(), "requeued", ToRequeue(reason="ValueError"), None),
        (DLXState(attempt=2, requeues=2), "parked", ToPark(delay=5.0, reason="ValueError"), 5.0),
        (
            DLXState(attempt=4, requeues=2, parks=2),
            "buried",
            ToBury(reason="retry budget spent: 2 requeues, 2 parks (ValueError)"),
            None,
        ),
    ],
)
def test_escalation_table(
    state: DLXState, fate: str, decision: object, delay: float | None
) -> None:
    p = plan(ValueError("bad row 7"), state, retries=state.attempt)
    assert (p.fate, p.decision, p.delay) == (fate, decision, delay)
    assert p.exc_type == "ValueError" and p.exc_message == "bad row 7"
    assert p.cause == fingerprint("proj.charge", "ValueError", "bad row 7")
    if fate == "buried":
        assert p.buried and p.state == state and p.retries == state.attempt
    else:
        # Every requeue and park is a Celery retry: the copy's request.retries is one more.
        assert not p.buried and p.retries == state.attempt + 1
        assert p.state.attempt == state.attempt + 1 and p.state.queue == "work"
        assert p.state.history[-1].fate == fate and p.state.first_failure_ms == AT


def test_root_is_the_wrapped_exception_of_a_fate_request() -> None:
    err = KeyError("customer")
    park = Park(countdown=1.0)
    park.__cause__ = err
    p = plan(park, DLXState())
    assert (
        p.root is err
        and p.exc_type == "KeyError"
        and p.decision == ToPark(delay=1.0, reason="Park")
    )
    assert root_cause(Park()) is not None and isinstance(root_cause(Park()), Park)


def test_bury_with_a_cause_names_and_raises_the_cause() -> None:
    err = TypeError("two_args() missing 1 required positional argument: 'b'")
    bury = Bury("permanent failure: the call does not match the task")
    bury.__cause__ = err
    p = plan(bury, DLXState())
    assert p.buried and p.root is err and p.exc_type == "TypeError"
    assert p.decision == ToBury(reason="permanent failure: the call does not match the task")


def test_retry_park_is_not_bounded_by_the_park_budget() -> None:
    """self.retry() is bounded by Celery's max_retries (checked by DLXTask.retry)."""
    spent = DLXState(attempt=4, requeues=2, parks=2)
    assert plan(RetryPark(countdown=0.5), spent).decision == ToPark(delay=0.5, reason="retry")
    assert plan(RetryPark(), spent).decision == ToPark(delay=30.0, reason="retry")
    assert plan(Park(countdown=0.5), spent).buried
