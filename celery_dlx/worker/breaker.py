"""The worker's side of the per-cause breaker (``dlx_breaker``, :mod:`celery_dlx.policy.breaker`),
called only when the task has a breaker on its queue.

A failure of a cause whose breaker is open becomes a *held* park (:func:`hold_failure`): the copy
keeps the delivery's attempt/requeue/park headers (no budget spent), carries ``x-dlx-held`` (the
cause) and ``x-dlx-holds``, and is due at the breaker's verdict. Its parking entry is
``<message id>/held<n>:<attempt>``, one per hold, so a copy held again before the drain deleted
the previous entry is never mistaken for it. A held message that succeeds closes the breaker
(:func:`close_breaker`).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from celery_dlx.fates import PARKED, now_ms
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.breaker import HELD_HEADER, HOLDS_HEADER, BreakerSettings, release_schedule
from celery_dlx.policy.decide import FailurePlan, Policy, ToPark, classify
from celery_dlx.wiring.runtime import Runtime
from celery_dlx.worker.delivery import Delivery

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Held:
    """A failure held by an open breaker: the plan to carry out and what its copy carries."""

    plan: FailurePlan
    headers: dict[str, Any]
    #: ``<message id>/held<n>``
    entry_message_id: str
    opened: bool
    canary: bool


def hold_failure(
    runtime: Runtime,
    settings: BreakerSettings,
    delivery: Delivery,
    plan: FailurePlan,
    exc: BaseException,
    policy: Policy,
    *,
    task: str,
    retries: int,
) -> Held | None:
    """Count this failure against its cause's breaker: a :class:`Held` when it holds it, else
    None (closed, a permanent failure, or the store failing: the budget is the safe side)."""
    if classify(exc, policy) == "bury":
        return None
    holds = _int(delivery.headers.get(HOLDS_HEADER)) + 1
    entry_message_id = f"{delivery.message_id}/held{holds}"
    entry_id = f"{entry_message_id}:{delivery.state.attempt}"
    try:
        verdict = runtime.breakers.fail(
            delivery.queue,
            plan.cause,
            settings,
            plan.at_ms,
            entry_id=entry_id,
            task=task,
            exc_type=plan.exc_type,
        )
    except Exception as err:  # never worse than no breaker
        logger.warning(
            "breaker of %s on %s unreachable (%r): the failure takes its ordinary fate",
            plan.cause,
            delivery.queue,
            err,
        )
        return None
    if verdict is None:
        return None
    delay = max(0.0, (verdict.due_ms - plan.at_ms) / 1000)
    if verdict.opened:
        reason = f"breaker opened for cause {plan.cause}: held as the first canary"
    else:
        what = "canary" if verdict.canary else "held"
        reason = f"{what}: breaker open for cause {plan.cause}"
    held_plan = replace(
        plan,
        decision=ToPark(delay=delay, reason=reason),
        fate=PARKED,
        # Held, not failed: the attempt and first failure stay the delivery's own.
        failure=plan.failure.but(
            attempt=delivery.state.attempt,
            reason=reason,
            first_failure_ms=delivery.state.first_failure_ms,
        ),
        state=delivery.state,
        retries=retries,
        delay=delay,
    )
    if verdict.opened:
        logger.warning(
            "breaker opened for cause %s (%s) of %s on queue %s: more than %d failures in %ss; "
            "its failures are held %ss without spending their budget, a canary every %ss",
            plan.cause,
            plan.exc_type,
            task,
            delivery.queue,
            settings.failures,
            settings.window,
            settings.hold,
            settings.probe,
        )
    return Held(
        plan=held_plan,
        headers={HELD_HEADER: plan.cause, HOLDS_HEADER: holds},
        entry_message_id=entry_message_id,
        opened=verdict.opened,
        canary=verdict.canary,
    )


def _int(value: object) -> int:
    if isinstance(value, bytes):
        value = value.decode("ascii", "replace")
    if not isinstance(value, (int, str)) or isinstance(value, bool):
        return 0
    try:
        return max(0, int(value))
    except ValueError:
        return 0


def close_breaker(runtime: Runtime, queue: str, cause: str, release_rate: int) -> int:
    """Close the breaker of ``cause`` on ``queue`` and make its held messages due again,
    ``release_rate`` per second; how many were released (0 when it was not open).

    Raises:
        redis.RedisError: the store failed (the held messages still come back at their hold
            time).
    """
    was_open, entry_ids = runtime.breakers.close(queue, cause)
    if not was_open:
        return 0
    held = [_entry(queue, entry_id) for entry_id in entry_ids]
    for start, stop, due_ms in release_schedule(len(held), release_rate, now_ms()):
        runtime.parking.release(held[start:stop], due_ms=due_ms)
    logger.warning(
        "breaker closed for cause %s on queue %s: releasing %d held messages at %d/s",
        cause,
        queue,
        len(held),
        release_rate,
    )
    return len(held)


def _entry(queue: str, entry_id: str) -> ParkedMessage:
    """A parked entry known by id only (all ``Parking.release`` needs)."""
    message_id, _, attempt = entry_id.rpartition(":")
    return ParkedMessage(
        message_id=message_id, attempt=int(attempt or 0), queue=queue, body=b"", parked_ms=0
    )
