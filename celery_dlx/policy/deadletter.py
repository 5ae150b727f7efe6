"""Pure reading of a dead letter of any producer: what it is, where it came from, its identity.

:func:`read_dead_letter` never raises: whatever it cannot parse becomes ``DeadLetter.problem``
(``undecodable: ...``), and such a letter is buried with that reason. ``x-death`` gives the queue
and the reason only, never counts (RabbitMQ 4.x ignores a republished ``x-death``). What the
service does with a letter is decided in :mod:`celery_dlx.policy.verdicts`.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery_dlx.errors import MalformedHeader
from celery_dlx.message.dictinit import dict_init
from celery_dlx.message.headers import (
    Death,
    DLXState,
    clean_headers,
    message_identity,
    parse_x_death,
    provable_identity,
    read_state,
)
from celery_dlx.message.names import (
    IDENTITY_HEADER,
    QUEUE_HEADER,
    REASON_HEADER,
    REPLAYED_HEADER,
    UNDECODABLE_PROPERTY,
)

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


@dict_init
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

    def copy_headers(self, state: DLXState) -> dict[str, object]:
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


def text_or_none(value: object) -> str | None:
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


def _shape_problems(body: object, headers: object) -> list[str]:
    """What is wrong with the body's or the header table's type (a client's bug), if anything."""
    problems = []
    if not isinstance(body, (bytes, bytearray, memoryview)):
        problems.append(f"undecodable: body is {type(body).__name__}, not bytes")
    if headers is not None and not isinstance(headers, Mapping):
        problems.append(f"undecodable: headers are {type(headers).__name__}, not a table")
    return problems


def _origin_queue(
    deaths: list[Death], headers: Mapping[str, Any], state: DLXState | None, routing_key: str
) -> str | None:
    """The queue a dead letter died in: its first ``x-death``, else celery_dlx's own headers,
    else the routing key it was dead-lettered with."""
    return (
        (deaths[0].queue if deaths else None)
        or text_or_none(headers.get(QUEUE_HEADER))
        or (state.queue if state else None)
        or routing_key
        or None
    )


def read_dead_letter(
    body: bytes,
    headers: Mapping[str, object] | None,
    properties: Mapping[str, object] | None,
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
    problems = _shape_problems(body, headers)
    undecodable = props.get(UNDECODABLE_PROPERTY)
    if undecodable is not None:  # kept with its raw bytes (x-dlx-raw-properties) for the graveyard
        problems.append(f"undecodable: AMQP properties: {undecodable}")
    deaths, death_problem = _first_death(hdrs)
    state, state_problem = _own_state(hdrs)
    problems += [p for p in (death_problem, state_problem) if p]
    provable = provable_identity(props, hdrs) is not None
    identity = message_identity(props, hdrs, raw_body)
    bury_reason = text_or_none(hdrs.get(REASON_HEADER))
    queue = _origin_queue(deaths, hdrs, state, routing_key)
    if not queue:
        problems.append("undecodable: no x-death, x-dlx-queue or routing key names its queue")
        queue = "unknown"
    death_reason = (
        deaths[0].reason if deaths else (PUBLISHED if bury_reason is not None else UNKNOWN)
    )
    replayed = text_or_none(hdrs.get(REPLAYED_HEADER))
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
        task=text_or_none(hdrs.get("task")),
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
