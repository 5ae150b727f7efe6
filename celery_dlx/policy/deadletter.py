"""Pure reading of a dead letter and the DLX service's decision about it; no I/O.

:func:`read_dead_letter` never raises: whatever it cannot parse becomes ``DeadLetter.problem``
(``undecodable: ...``), and such a letter is buried with that reason. :func:`decide_letter` turns
a letter (plus the worker's cause record, if any) into :class:`BuryVerdict`, :class:`ParkVerdict`
or :class:`RequeueVerdict`, from the queue's policy and the message's own headers, never from
``x-death`` counts (RabbitMQ 4.x ignores a republished ``x-death``): ``x-death`` gives the queue
and the reason only.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from celery_dlx.errors import MalformedHeader
from celery_dlx.fates import PARKED, REQUEUED, Park
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.headers import (
    Death,
    DLXState,
    HistoryEntry,
    clean_headers,
    fingerprint,
    message_identity,
    parse_x_death,
    provable_identity,
    read_state,
)
from celery_dlx.message.names import (
    HISTORY_LIMIT,
    IDENTITY_HEADER,
    QUEUE_HEADER,
    REASON_HEADER,
    REPLAYED_HEADER,
)
from celery_dlx.message.obituary import ORIGIN_CELERY, ORIGIN_FOREIGN, Attempt, Obituary
from celery_dlx.policy.config import DLXConfig
from celery_dlx.policy.decide import ToBury, ToPark, ToRequeue, decide

#: ``death_reason`` of a message a worker buried by publishing a clean copy (no ``x-death``).
PUBLISHED = "published"
#: ``death_reason`` of a message that reached the dead-letter exchange without ``x-death`` and
#: without celery_dlx's reason header: someone published it there directly.
UNKNOWN = "unknown"
#: Cause written in the history of a park that followed a TTL expiry (not a consumer failure).
EXPIRED_CAUSE = "expired"
#: Exception type given to failures whose type nobody knows (a foreign consumer's reject).
UNDECODABLE = "undecodable"


class Rejected(Exception):
    """A consumer rejected the message (``x-death`` reason ``rejected``); its error is unknown."""


@dataclass(frozen=True)
class DeadLetter:
    """What the DLX service knows about one dead letter before any I/O.

    ``queue`` is the queue it died in (first ``x-death`` table, else ``x-dlx-queue``, else the
    routing key); ``death_reason`` is the ``x-death`` reason, :data:`PUBLISHED` or
    :data:`UNKNOWN`; ``problem`` holds the ``undecodable: ...`` reason when headers could not be
    read; ``key`` identifies this death (queue, message, attempt, history, replay) for dedup and
    is the obituary id.

    ``identity`` is the message's provable id (:func:`provable_identity`) when it has one
    (``provable``); else the digest of its body joined with ``key``, and ``key`` then includes the
    delivery (:func:`read_dead_letter`'s ``delivery``): look-alike messages, the same body without
    a ``message_id``, are different messages and never share a key, so none is deduplicated away
    as another's redelivery. Their copies carry ``identity`` in ``x-dlx-id``
    (:meth:`copy_headers`), so later deaths of one of them are provably that one.

    ``burial_key`` is the obituary id: a message is buried once in its life, so for a provable
    identity it names the message in its queue (with the replay it came from and the first failure
    its copies carry), not the death: two copies of one message left by a crash (a retry
    published twice) get one obituary.
    """

    body: bytes
    headers: dict[str, Any]
    properties: dict[str, Any]
    identity: str
    queue: str
    death_reason: str
    key: str
    exchange: str = ""
    routing_key: str = ""
    redelivered: bool = False
    state: DLXState = field(default_factory=DLXState)
    problem: str | None = None
    bury_reason: str | None = None
    task: str | None = None
    replayed_from: str | None = None
    death_ms: int | None = None
    x_death: list[Any] = field(default_factory=list)
    provable: bool = True
    burial_key: str = ""

    def copy_headers(self, state: DLXState) -> dict[str, Any]:
        """The headers of a requeued or parked copy: cleaned, ``state`` written, identity stamped
        when the message had no provable one."""
        headers = clean_headers(self.headers, state)
        if not self.provable:
            headers[IDENTITY_HEADER] = self.identity
        return headers

    @property
    def scope(self) -> str:
        """The fingerprint scope: the Celery task name, else the queue."""
        return self.task or self.queue


def _text(value: Any) -> str | None:
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    if isinstance(value, str):
        return value
    return None


def _ms(when: datetime | None) -> int | None:
    return int(when.timestamp() * 1000) if when is not None else None


def letter_key(
    queue: str,
    identity: str,
    state: DLXState | None,
    replayed: str | None,
    delivery: str | None = None,
) -> str:
    """The dedup key (and obituary id) of one death.

    With a provable ``identity``, stable across redeliveries of the death. ``delivery`` names one
    delivery (given for a message without a provable identity): the key is then that delivery's.
    """
    if state is None:
        tail = "?"
    else:
        last = state.history[-1].at_ms if state.history else 0
        tail = f"{state.attempt}\x1f{last}"
    parts = (queue, identity, tail, replayed or "")
    raw = "\x1f".join((*parts, delivery) if delivery is not None else parts)
    return hashlib.sha1(raw.encode("utf-8", "replace"), usedforsecurity=False).hexdigest()[:20]


def burial_key(
    queue: str, identity: str, replayed: str | None, first_failure_ms: int | None = None
) -> str:
    """The obituary id of a message with a provable identity: one per message, queue, replay and
    lineage (the first failure its copies carry: a publisher sending the same id again later
    starts another lineage)."""
    lineage = "" if first_failure_ms is None else str(first_failure_ms)
    raw = "\x1f".join(("buried", queue, identity, replayed or "", lineage))
    return hashlib.sha1(raw.encode("utf-8", "replace"), usedforsecurity=False).hexdigest()[:20]


def _first_death(headers: Mapping[str, Any]) -> tuple[list[Death], str | None]:
    try:
        return parse_x_death(headers), None
    except MalformedHeader as exc:
        return [], f"undecodable: {exc}"
    except Exception as exc:  # the parser promises MalformedHeader; a letter must survive anyway
        return [], f"undecodable: x-death: {type(exc).__name__}: {exc}"


def _own_state(headers: Mapping[str, Any]) -> tuple[DLXState | None, str | None]:
    try:
        return read_state(headers), None
    except MalformedHeader as exc:
        return None, f"undecodable: {exc}"
    except Exception as exc:  # e.g. an infinite float where a count belongs
        return None, f"undecodable: celery_dlx headers: {type(exc).__name__}: {exc}"


def read_dead_letter(
    body: bytes,
    headers: Mapping[str, Any] | None,
    properties: Mapping[str, Any] | None,
    *,
    exchange: str = "",
    routing_key: str = "",
    redelivered: bool = False,
    delivery: str | None = None,
) -> DeadLetter:
    """Read a dead letter defensively; never raises (problems land in ``DeadLetter.problem``).

    ``delivery`` names this delivery uniquely (the service's connection and delivery tag): the key
    of a message without a provable identity is this delivery's, so a settle retried on the same
    delivery gives no second fate; a random one when not given.
    """
    hdrs = dict(headers) if isinstance(headers, Mapping) else {}
    props = {
        str(k): v
        for k, v in (properties.items() if isinstance(properties, Mapping) else ())
        if k != "application_headers"
    }
    raw_body = bytes(body) if isinstance(body, (bytes, bytearray, memoryview)) else b""
    problems: list[str] = []
    if not isinstance(body, (bytes, bytearray, memoryview)):
        problems.append(f"undecodable: body is {type(body).__name__}, not bytes")
    if headers is not None and not isinstance(headers, Mapping):
        problems.append(f"undecodable: headers are {type(headers).__name__}, not a table")
    deaths, death_problem = _first_death(hdrs)
    if death_problem:
        problems.append(death_problem)
    state, state_problem = _own_state(hdrs)
    if state_problem:
        problems.append(state_problem)
    provable = provable_identity(props, hdrs) is not None
    identity = message_identity(props, hdrs, raw_body)
    bury_reason = _text(hdrs.get(REASON_HEADER))
    queue = (
        (deaths[0].queue if deaths else None)
        or _text(hdrs.get(QUEUE_HEADER))
        or (state.queue if state else None)
        or routing_key
    )
    if not queue:
        problems.append("undecodable: no x-death, x-dlx-queue or routing key names its queue")
        queue = "unknown"
    if deaths:
        death_reason = deaths[0].reason
    elif bury_reason is not None:
        death_reason = PUBLISHED
    else:
        death_reason = UNKNOWN
    replayed = _text(hdrs.get(REPLAYED_HEADER))
    if provable:
        key = letter_key(queue, identity, state, replayed)
    else:
        # Only a look-alike: when in doubt, keep both. The key is this delivery's.
        key = letter_key(queue, identity, state, replayed, delivery or uuid.uuid4().hex)
        identity = f"{identity}~{key}"
    raw_x_death = hdrs.get("x-death")
    return DeadLetter(
        body=raw_body,
        headers=hdrs,
        properties=props,
        identity=identity,
        queue=queue,
        death_reason=death_reason,
        key=key,
        exchange=exchange,
        routing_key=routing_key,
        redelivered=redelivered,
        state=state or DLXState(),
        problem="; ".join(problems) or None,
        bury_reason=bury_reason,
        task=_text(hdrs.get("task")),
        replayed_from=replayed,
        death_ms=_ms(deaths[0].time) if deaths else None,
        x_death=list(raw_x_death)
        if isinstance(raw_x_death, (list, tuple))
        else ([] if raw_x_death is None else [raw_x_death]),
        provable=provable,
        burial_key=(
            burial_key(queue, identity, replayed, state.first_failure_ms if state else None)
            if provable
            else key
        ),
    )


@dataclass(frozen=True)
class BuryVerdict:
    """Bury: write an obituary with these facts."""

    reason: str
    cause: str
    exc_type: str
    exc_message: str
    importance: str
    attempt: int
    history: tuple[HistoryEntry, ...]
    traceback: str = ""
    first_failure_ms: int | None = None
    last_failure_ms: int | None = None
    task: str | None = None
    queue: str | None = None
    hostname: str | None = None
    from_worker: bool = False


@dataclass(frozen=True)
class ParkVerdict:
    """Park for ``delay`` seconds with ``state`` written into the copy's headers.

    ``counted`` is False for a TTL expiry: the park budget and attempt count are left alone.
    """

    delay: float
    state: DLXState
    cause: str
    exc_type: str
    exc_message: str
    reason: str
    importance: str
    counted: bool = True


@dataclass(frozen=True)
class RequeueVerdict:
    """Publish a copy with ``state`` at the tail of the queue."""

    state: DLXState
    cause: str
    exc_type: str
    exc_message: str
    reason: str
    importance: str


Verdict = BuryVerdict | ParkVerdict | RequeueVerdict


def bury_from_record(
    letter: DeadLetter, record: CauseRecord, config: DLXConfig, now: int
) -> BuryVerdict:
    """The burial a worker decided, with the cause it stashed (unknown fields from the letter)."""
    queue = record.queue or letter.queue
    task = record.task or letter.task
    return BuryVerdict(
        reason=record.reason or "buried by the worker",
        cause=record.cause or fingerprint(task or queue, record.exc_type, record.exc_message),
        exc_type=record.exc_type,
        exc_message=record.exc_message,
        traceback=record.traceback,
        importance=record.importance or config.importance(queue),
        attempt=letter.state.attempt + 1 if record.attempt is None else record.attempt,
        history=record.history or (*letter.state.history, HistoryEntry(now, "buried", "")),
        first_failure_ms=(
            letter.state.first_failure_ms
            if record.first_failure_ms is None
            else record.first_failure_ms
        ),
        last_failure_ms=now if record.at_ms is None else record.at_ms,
        task=task,
        queue=queue,
        hostname=record.hostname,
        from_worker=True,
    )


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
    return BuryVerdict(
        reason=reason,
        cause=cause,
        exc_type=exc_type,
        exc_message=exc_message,
        importance=config.importance(letter.queue),
        attempt=state.attempt + (1 if failed else 0),
        history=history,
        first_failure_ms=state.first_failure_ms if state.first_failure_ms is not None else now,
        last_failure_ms=letter.death_ms or now,
        task=letter.task,
        queue=letter.queue,
    )


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
    return ParkVerdict(
        delay=delay,
        state=new_state,
        cause=EXPIRED_CAUSE,
        exc_type="expired",
        exc_message="",
        reason=f"expired in {letter.queue}: returned later (dlx_expired=park)",
        importance=config.importance(letter.queue),
        counted=False,
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
    importance = config.importance(letter.queue)
    reason = f"{letter.death_reason} in {letter.queue}"
    if isinstance(decision, ToPark):
        return ParkVerdict(
            decision.delay, new_state, cause, exc_type, exc_message, reason, importance
        )
    return RequeueVerdict(new_state, cause, exc_type, exc_message, reason, importance)


def decide_letter(
    letter: DeadLetter, config: DLXConfig, record: CauseRecord | None, now: int
) -> Verdict:
    """The fate of a dead letter.

    Args:
        letter: the dead letter as read by :func:`read_dead_letter`.
        config: the app's settings (``dlx_queues`` policies, ``dlx_expired``...).
        record: the worker's cause record for the message, if it stashed one: the worker decided
            to bury, so the message is buried, never parked again.
        now: epoch milliseconds.
    """
    if record is not None:
        return bury_from_record(letter, record, config, now)
    if letter.bury_reason is not None:
        why = "; ".join(r for r in (letter.bury_reason, letter.problem) if r)
        return bury_verdict(letter, config, why, now, failed=True)
    if letter.problem:
        return bury_verdict(letter, config, letter.problem, now, failed=True)
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
    attempts = [Attempt(e.at_ms, e.fate, e.cause) for e in verdict.history]
    failures = [a.at_ms for a in attempts if a.fate != "buried"]
    first = verdict.first_failure_ms
    if first is None:
        first = failures[0] if failures else verdict.last_failure_ms
    return Obituary(
        id=letter.burial_key or letter.key,
        message_id=letter.identity,
        queue=verdict.queue or letter.queue,
        reason=verdict.reason,
        buried_ms=buried_ms,
        task=verdict.task,
        origin=ORIGIN_CELERY if (verdict.task or verdict.from_worker) else ORIGIN_FOREIGN,
        cause=verdict.cause,
        exc_type=verdict.exc_type,
        exc_message=verdict.exc_message,
        traceback=verdict.traceback,
        importance=verdict.importance,
        attempt=verdict.attempt,
        attempts=attempts,
        first_failure_ms=first,
        last_failure_ms=verdict.last_failure_ms,
        death_reason=letter.death_reason,
        x_death=list(letter.x_death),
        # x-death is kept once, in x_death.
        headers={k: v for k, v in letter.headers.items() if k != "x-death"},
        properties=dict(letter.properties),
        exchange=letter.exchange,
        routing_key=letter.routing_key,
        payload=letter.body,
        payload_size=len(letter.body),
        code_version=code_version,
        hostname=verdict.hostname or hostname,
        replayed_from=letter.replayed_from,
    )
