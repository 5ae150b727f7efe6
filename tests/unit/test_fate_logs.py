"""Fate log lines a person can act on: the user's reason, the exception's type and message on one
line, and a burial traceback that starts at the task's own frames."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from celery import Celery

import celery_dlx
from celery_dlx.fates import PARKED, REQUEUED, FateEvent, Park, Requeue
from celery_dlx.message.headers import DLXState
from celery_dlx.policy.config import load_config
from celery_dlx.policy.decide import REASON_LIMIT, Policy, decide, one_line, reason_of
from celery_dlx.wiring.runtime import Runtime, error_part
from celery_dlx.worker.einfo import task_traceback
from celery_dlx.worker.retrying import RetryPark


@pytest.mark.parametrize(
    ("exc", "reason"),
    [
        (KeyError("sku"), "KeyError"),
        (Requeue(), "Requeue"),
        (Requeue("upstream busy"), "Requeue: upstream busy"),
        (Park(), "Park"),
        (Park(countdown=30), "Park"),
        (
            Park(countdown=30, message="waiting for stock\nat the depot"),
            "Park: waiting for stock at the depot",
        ),
        (RetryPark(countdown=5, message="KeyError('sku')"), "retry"),
        (RetryPark(), "retry"),
    ],
)
def test_the_reason_is_the_users_never_an_internal_class(exc: BaseException, reason: str) -> None:
    assert reason_of(exc) == reason
    assert "RetryPark" not in str(decide(exc, DLXState(), Policy()))


def test_a_long_user_reason_is_cut_to_one_line() -> None:
    reason = reason_of(Requeue("x" * 1000))
    assert len(reason) == len("Requeue: ") + REASON_LIMIT and reason.endswith("\u2026")
    assert one_line(" a\n\tb  c ") == "a b c"


@pytest.mark.parametrize(
    ("exc_type", "message", "part"),
    [
        ("KeyError", "'order 5'", " error=KeyError: 'order 5'"),
        ("shop.errors.Declined", "card\ndeclined", " error=shop.errors.Declined: card declined"),
        ("ValueError", "", " error=ValueError"),
        ("celery_dlx.fates.Park", "waiting", ""),  # the reason names it already
        ("", "", ""),
    ],
)
def test_error_part(exc_type: str, message: str, part: str) -> None:
    assert error_part(exc_type, message) == part


def _event(fate: str, exc_type: str, message: str, reason: str) -> FateEvent:
    return FateEvent.from_fields(
        fate,
        task="proj.charge",
        queue="orders",
        message_id="m-1",
        attempt=2,
        cause="c0ffee",
        exc_type=exc_type,
        exc_message=message,
        reason=reason,
        delay=10.0 if fate == PARKED else None,
    )


def test_requeue_and_park_lines_carry_the_exception_and_its_message(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = Celery("proj", set_as_current=False)
    celery_dlx.install(app)
    runtime = Runtime(app, load_config({}))
    caplog.set_level(logging.INFO, logger="celery_dlx")
    runtime.log_fates(
        [
            _event(REQUEUED, "KeyError", "'order 5'\n" + "y" * 400, "KeyError"),
            _event(PARKED, "builtins.TimeoutError", "gateway slow", "Park: waiting for stock"),
        ]
    )
    requeued, parked = [r.getMessage() for r in caplog.records if r.name == "celery_dlx"]
    assert requeued.startswith("requeued proj.charge[m-1] attempt=2 queue=orders cause=c0ffee")
    assert " reason=KeyError error=KeyError: 'order 5' yyy" in requeued
    assert "\n" not in requeued and requeued.endswith("\u2026")
    assert parked.endswith(
        "reason=Park: waiting for stock error=builtins.TimeoutError: gateway slow"
    )


# A "runner" whose frames count as celery_dlx's own: compiled under a file name inside the package.
_RUNNER = Path(celery_dlx.__file__).parent / "worker" / "_test_runner.py"
_runner: dict[str, object] = {}
exec(
    compile(
        "def run(task):\n    try:\n        task()\n    except Exception as exc:\n        return exc\n"
        "def crash():\n    raise RuntimeError('celery_dlx itself')\n",
        str(_RUNNER),
        "exec",
    ),
    _runner,
)


def _the_task() -> None:
    order = {"id": 5}
    raise KeyError(f"order {order['id']} has no sku")


def test_a_burial_traceback_starts_at_the_tasks_frames() -> None:
    exc = _runner["run"](_the_task)  # type: ignore[operator]
    assert isinstance(exc, KeyError)
    text = task_traceback(exc)
    assert text.startswith("Traceback (most recent call last):\n")
    assert str(_RUNNER) not in text  # the runner's frame is left out
    assert "in _the_task" in text and "has no sku" in text


def test_a_failure_of_celery_dlx_alone_keeps_its_frames() -> None:
    exc = _runner["run"](_runner["crash"])  # type: ignore[operator]
    text = task_traceback(exc)
    assert "in crash" in text and "RuntimeError: celery_dlx itself" in text


def test_a_traceback_never_formatted_is_its_exception_line() -> None:
    assert task_traceback(ValueError("bad")) == "ValueError: bad\n"


def test_a_spent_budget_counts_in_words() -> None:
    policy = Policy(max_requeues=1, max_parks=1)
    spent = decide(KeyError("x"), DLXState(requeues=1, parks=1), policy)
    assert str(spent.reason) == "retry budget spent: 1 requeue, 1 park (KeyError)"
    more = decide(KeyError("x"), DLXState(requeues=2, parks=0), Policy(max_requeues=2, max_parks=0))
    assert str(more.reason) == "retry budget spent: 2 requeues, 0 parks (KeyError)"
