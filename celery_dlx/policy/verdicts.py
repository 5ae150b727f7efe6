"""The DLX service's decision about a dead letter (:func:`decide_letter`, from the queue's policy
and the message's own headers, never ``x-death`` counts), and a burial's obituary; no I/O."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from celery_dlx.fates import PARKED, REQUEUED, Park
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.dictinit import dict_init
from celery_dlx.message.failure import Failure, MaybeAttempt
from celery_dlx.message.headers import DLXState, HistoryEntry, fingerprint
from celery_dlx.message.names import HISTORY_LIMIT
from celery_dlx.message.obituary import ORIGIN_CELERY, ORIGIN_FOREIGN, Obituary
from celery_dlx.message.outgoing import record_properties
from celery_dlx.policy.config import DLXConfig
from celery_dlx.policy.deadletter import EXPIRED_CAUSE, UNDECODABLE, UNKNOWN, DeadLetter, Rejected
from celery_dlx.policy.decide import ToBury, ToPark, ToRequeue, decide


@dict_init
@dataclass(frozen=True)
class BuryVerdict(MaybeAttempt):
    """Bury: write an obituary with these facts (``history``: every failed run, ending with the
    burial; ``from_worker``: a worker decided it)."""

    failure: Failure
    history: tuple[HistoryEntry, ...]
    from_worker: bool = False


@dict_init
@dataclass(frozen=True)
class ParkVerdict(MaybeAttempt):
    """Park for ``delay`` seconds with ``state`` in the copy's headers (``failure``: the event's
    facts; ``counted`` False for a TTL expiry: budget and attempt left alone)."""

    delay: float
    state: DLXState
    failure: Failure
    counted: bool = True


@dict_init
@dataclass(frozen=True)
class RequeueVerdict(MaybeAttempt):
    """Publish a copy with ``state`` at the tail of the queue (``failure``: the event's facts)."""

    state: DLXState
    failure: Failure


Verdict = BuryVerdict | ParkVerdict | RequeueVerdict


def bury_from_record(
    letter: DeadLetter, record: CauseRecord, config: DLXConfig, now: int
) -> BuryVerdict:
    """The burial a worker decided, with the cause it stashed (gaps filled from the letter)."""
    queue = record.queue or letter.queue
    task = record.task or letter.task
    failure = record.failure.but(
        task=task,
        queue=queue,
        message_id=record.message_id or letter.identity,
        reason=record.reason or "buried by the worker",
        cause=record.cause or fingerprint(task or queue, record.exc_type, record.exc_message),
        importance=record.importance or config.importance(queue),
        attempt=letter.state.attempt + 1 if record.attempt is None else record.attempt,
        first_failure_ms=(
            letter.state.first_failure_ms
            if record.first_failure_ms is None
            else record.first_failure_ms
        ),
        at_ms=now if record.at_ms is None else record.at_ms,
    )
    history = record.history or (*letter.state.history, HistoryEntry(now, "buried", ""))
    return BuryVerdict(failure, history, from_worker=True)


def _failure(letter: DeadLetter) -> tuple[str, str]:
    """Exception type and message of the failure: the message's headers, else the death reason."""
    state = letter.state
    if letter.problem:
        return UNDECODABLE, letter.problem
    return state.exc_type or letter.death_reason, state.exc_message or ""


def bury_verdict(
    letter: DeadLetter, config: DLXConfig, reason: str, now: int, failed: bool
) -> BuryVerdict:
    """A burial of ``letter`` for ``reason``; ``failed``: its last delivery was a failed run."""
    exc_type, exc_message = _failure(letter)
    cause = fingerprint(letter.scope, exc_type, exc_message)
    state = letter.state
    history = (*state.history, HistoryEntry(now, "buried", cause))[-HISTORY_LIMIT:]
    failure = _letter_failure(
        letter,
        config,
        attempt=state.attempt + (1 if failed else 0),
        cause=cause,
        exc_type=exc_type,
        exc_message=exc_message,
        reason=reason,
        first_failure_ms=state.first_failure_ms if state.first_failure_ms is not None else now,
        at_ms=letter.death_ms or now,
    )
    return BuryVerdict(failure, history)


def _expired_park(letter: DeadLetter, config: DLXConfig, now: int) -> ParkVerdict:
    """Return an expired message later without counting a failure: its history notes the park."""
    state = letter.state
    expiries = sum(1 for e in state.history if e.cause == EXPIRED_CAUSE)
    delay = config.policy(letter.queue).backoff(expiries)
    new_state = replace(
        state,
        history=(*state.history, HistoryEntry(now, PARKED, EXPIRED_CAUSE))[-HISTORY_LIMIT:],
        queue=letter.queue,
    )
    failure = _letter_failure(
        letter,
        config,
        attempt=new_state.attempt,
        first_failure_ms=new_state.first_failure_ms,
        cause=EXPIRED_CAUSE,
        exc_type="expired",
        exc_message="",
        reason=f"expired in {letter.queue}: returned later (dlx_expired=park)",
    )
    return ParkVerdict(delay, new_state, failure, counted=False)


def _letter_failure(letter: DeadLetter, config: DLXConfig, **facts: Any) -> Failure:
    """A failure of ``letter`` in its queue, with ``facts``."""
    return Failure(
        task=letter.task,
        queue=letter.queue,
        message_id=letter.identity,
        importance=config.importance(letter.queue),
        **facts,
    )


def _from_policy(letter: DeadLetter, config: DLXConfig, exc: BaseException, now: int) -> Verdict:
    policy = config.policy(letter.queue)
    decision = decide(exc, letter.state, policy)
    if isinstance(decision, ToBury):
        return bury_verdict(letter, config, decision.reason, now, failed=True)
    exc_type, exc_message = _failure(letter)
    cause = fingerprint(letter.scope, exc_type, exc_message)
    fate = REQUEUED if isinstance(decision, ToRequeue) else PARKED
    new_state = letter.state.after_failure(
        fate=fate,
        at_ms=now,
        cause=cause,
        queue=letter.queue,
        exc_type=exc_type,
        exc_message=exc_message or None,
    )
    failure = _letter_failure(
        letter,
        config,
        attempt=new_state.attempt,
        first_failure_ms=new_state.first_failure_ms,
        cause=cause,
        exc_type=exc_type,
        exc_message=exc_message,
        reason=f"{letter.death_reason} in {letter.queue}",
    )
    if isinstance(decision, ToPark):
        return ParkVerdict(decision.delay, new_state, failure)
    return RequeueVerdict(new_state, failure)


def worker_retry(letter: DeadLetter, config: DLXConfig) -> ParkVerdict | RequeueVerdict:
    """The park or requeue a DLX worker decided and could not write (``letter.worker_fate``),
    written as it is: its state is already after the failure (no second count or decision)."""
    state = letter.state
    fate = letter.worker_fate
    failure = _letter_failure(
        letter,
        config,
        attempt=state.attempt,
        first_failure_ms=state.first_failure_ms,
        cause=state.cause or "",
        exc_type=state.exc_type or "",
        exc_message=state.exc_message or "",
        reason=f"{fate} by a worker that could not write it: written by the DLX service",
    )
    if fate == PARKED:
        return ParkVerdict(letter.worker_delay or 0.0, state, failure)
    return RequeueVerdict(state, failure)


#: Burial reason of a dead letter a DLX task rejected and no cause record explains.
UNKNOWN_VERDICT = (
    "rejected by a DLX task with no cause record (the worker decided to bury it and its record "
    "was refused or has expired): buried, never run again"
)


def decide_letter(
    letter: DeadLetter,
    config: DLXConfig,
    record: CauseRecord | None,
    now: int,
    *,
    dlx_task: bool = False,
) -> Verdict:
    """The fate of a dead letter at ``now`` (epoch ms).

    ``record``, the worker's stashed cause, means the worker decided to bury. ``dlx_task``: the
    letter's task runs as a DLX task here, whose worker rejects only to bury (a park or requeue
    it cannot write goes as a copy naming its fate), so a rejection without a record is buried.
    """
    if record is not None:
        return bury_from_record(letter, record, config, now)
    if letter.bury_reason is not None or letter.problem:
        why = "; ".join(r for r in (letter.bury_reason, letter.problem) if r)
        return bury_verdict(letter, config, why, now, failed=True)
    if letter.worker_fate is not None:
        return worker_retry(letter, config)
    reason = letter.death_reason
    if reason == UNKNOWN:
        why = "no x-death: published to the dead-letter exchange directly, origin unknown"
        return bury_verdict(letter, config, why, now, failed=False)
    if reason == "delivery_limit":
        why = f"delivery limit reached in {letter.queue} (x-delivery-limit)"
        return bury_verdict(letter, config, why, now, failed=True)
    if reason == "expired":
        if config.expired_action(letter.queue) == "bury":
            why = f"expired in {letter.queue} (dlx_expired=bury)"
            return bury_verdict(letter, config, why, now, failed=False)
        return _expired_park(letter, config, now)
    if reason == "maxlen":
        return _from_policy(letter, config, Park(message="queue full (maxlen)"), now)
    if dlx_task and reason == "rejected":
        return bury_verdict(letter, config, UNKNOWN_VERDICT, now, failed=True)
    return _from_policy(letter, config, Rejected(f"rejected by a consumer of {letter.queue}"), now)


def build_obituary(
    letter: DeadLetter,
    verdict: BuryVerdict,
    *,
    buried_ms: int,
    code_version: str | None,
    hostname: str | None,
) -> Obituary:
    """The obituary of ``letter``, buried with ``verdict``."""
    attempts = list(verdict.history)
    failures = [a.at_ms for a in attempts if a.fate != "buried"]
    first = verdict.first_failure_ms
    if first is None:
        first = failures[0] if failures else verdict.at_ms
    failure = verdict.failure.but(
        message_id=letter.identity,
        queue=verdict.queue or letter.queue,
        attempt=verdict.attempt or 0,
        first_failure_ms=first,
        # The worker's when its record says (the code that failed).
        code_version=verdict.failure.code_version or code_version,
        hostname=verdict.hostname or hostname,
    )
    return Obituary(
        id=letter.burial_key or letter.key,
        buried_ms=buried_ms,
        failure=failure,
        origin=ORIGIN_CELERY if (verdict.task or verdict.from_worker) else ORIGIN_FOREIGN,
        attempts=attempts,
        death_reason=letter.death_reason,
        x_death=list(letter.x_death),
        headers={k: v for k, v in letter.headers.items() if k != "x-death"},
        properties=record_properties(letter.properties),
        exchange=letter.exchange,
        routing_key=letter.routing_key,
        payload=letter.body,
        payload_size=len(letter.body),
        replayed_from=letter.replayed_from,
    )
