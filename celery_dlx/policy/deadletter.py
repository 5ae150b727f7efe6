"""Pure reading of a dead letter of any producer: what it is, where it came from, its identity.

:func:`read_dead_letter` never raises: what it cannot parse becomes ``DeadLetter.problem``
(``undecodable: ...``), the reason it is buried with. ``x-death`` gives the queue and reason,
never counts (RabbitMQ 4.x ignores a republished ``x-death``).
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from celery_dlx.errors import MalformedHeader
from celery_dlx.fates import PARKED, REQUEUED
from celery_dlx.message.dictinit import dict_init
from celery_dlx.message.headers import (
    DLXState,
    clean_headers,
    message_identity,
    parse_x_death,
    provable_identity,
    read_state,
)
from celery_dlx.message.names import (
    DELAY_HEADER,
    FATE_HEADER,
    IDENTITY_HEADER,
    QUEUE_HEADER,
    REASON_HEADER,
    REPLAYED_HEADER,
    UNDECODABLE_PROPERTY,
)

#: ``death_reason`` of a message a worker published here: a burial, or a park or requeue it could
#: not write (``x-dlx-fate``).
PUBLISHED = "published"
#: ``death_reason`` of a message published to the dead-letter exchange directly.
UNKNOWN = "unknown"
#: Cause written in the history of a park that followed a TTL expiry (not a consumer failure).
EXPIRED_CAUSE = "expired"
#: Exception type given to failures whose type nobody knows (a foreign consumer's reject).
UNDECODABLE = "undecodable"

T = TypeVar("T")


class Rejected(Exception):
    """A consumer rejected the message (``x-death`` reason ``rejected``); its error is unknown."""


@dict_init
@dataclass(frozen=True)
class DeadLetter:
    """What the DLX service knows about one dead letter before any I/O.

    ``queue``: where it died (first ``x-death``, else ``x-dlx-queue``, else the routing key);
    ``death_reason``: the ``x-death`` reason, :data:`PUBLISHED` or :data:`UNKNOWN`; ``problem``:
    why its headers could not be read; ``key``: this death (queue, message, attempt, history,
    replay), for dedup.

    ``identity`` is the provable message id (``provable``), else the body's digest joined with
    ``key``, which then names the delivery: look-alikes (one body, no ``message_id``) never share
    a key, so none is deduplicated away as another's redelivery; their copies carry ``identity``
    in ``x-dlx-id``. ``burial_key``, the obituary id, is built from what every copy carries, never
    a failure's time: two copies left by a crash get one obituary. ``worker_fate``/
    ``worker_delay``: the park (seconds) or requeue a DLX worker decided but could not write.
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
    worker_fate: str | None = None
    worker_delay: float | None = None

    def copy_headers(self, state: DLXState) -> dict[str, object]:
        """The headers of a requeued or parked copy, with ``state``."""
        headers = clean_headers(self.headers, state)
        for name in (FATE_HEADER, DELAY_HEADER):  # carried out once, by whoever reads it
            headers.pop(name, None)
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


def letter_key(
    queue: str,
    identity: str,
    state: DLXState | None,
    replayed: str | None,
    delivery: str | None = None,
    *,
    fate: str | None = None,
) -> str:
    """The dedup key of one death, stable across its redeliveries unless ``delivery`` is given
    (a message without a provable identity): then that delivery's. ``fate``: the fate a worker
    handed over with a copy it could not write (``x-dlx-fate``); that copy carries the headers
    of the retry it becomes, so without it the retry's own death would read as handled."""
    if state is None:
        tail = "?"
    else:
        last = state.history[-1].at_ms if state.history else 0
        tail = f"{state.attempt}\x1f{last}"
    parts = (queue, identity, tail, replayed or "", *((f"fate={fate}",) if fate else ()))
    return _digest(*parts, *((delivery,) if delivery is not None else ()))


def burial_key(queue: str, identity: str, replayed: str | None) -> str:
    """The obituary id of a message with a provable identity: one per message, queue and replay.

    No failure time goes in: both lineages of an original redelivered after a crash must name one
    obituary (a reused message id reuses it too: the burial reads as already written).
    """
    return _digest("buried", queue, identity, replayed or "")


def _digest(*parts: str) -> str:
    raw = "\x1f".join(parts).encode("utf-8", "replace")
    return hashlib.sha1(raw, usedforsecurity=False).hexdigest()[:20]


def _worker_fate(headers: Mapping[str, Any]) -> tuple[str | None, float | None]:
    """The fate a worker asked the DLX service to carry out, and its delay; (None, None) when
    none, or unreadable (the letter is then decided as any other)."""
    fate = text_or_none(headers.get(FATE_HEADER))
    if fate not in (PARKED, REQUEUED):
        return None, None
    if fate == REQUEUED:
        return fate, None
    try:
        delay = float(text_or_none(headers.get(DELAY_HEADER)) or "nan")
    except ValueError:
        return None, None
    if not math.isfinite(delay) or delay < 0:
        return None, None
    return fate, delay


def _parse(
    parse: Callable[[Mapping[str, Any]], T], headers: Mapping[str, Any], what: str
) -> tuple[T | None, str | None]:
    """``parse(headers)``, or None and why not."""
    try:
        return parse(headers), None
    except MalformedHeader as exc:
        return None, f"undecodable: {exc}"
    except Exception as exc:  # the parsers promise MalformedHeader; a letter must survive anyway
        return None, f"undecodable: {what}: {type(exc).__name__}: {exc}"


def _shape_problems(body: object, headers: object) -> list[str]:
    """What is wrong with the body's or the header table's type (a client's bug)."""
    problems = []
    if not isinstance(body, (bytes, bytearray, memoryview)):
        problems.append(f"undecodable: body is {type(body).__name__}, not bytes")
    if headers is not None and not isinstance(headers, Mapping):
        problems.append(f"undecodable: headers are {type(headers).__name__}, not a table")
    return problems


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

    ``delivery`` (connection and delivery tag; random when not given) keys a message without a
    provable identity, so a settle retried on the same delivery gives no second fate.
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
    if undecodable is not None:  # its raw bytes are kept (x-dlx-raw-properties)
        problems.append(f"undecodable: AMQP properties: {undecodable}")
    parsed_deaths, death_problem = _parse(parse_x_death, hdrs, "x-death")
    deaths = parsed_deaths or []
    state, state_problem = _parse(read_state, hdrs, "celery_dlx headers")
    problems += [p for p in (death_problem, state_problem) if p]
    provable = provable_identity(props, hdrs) is not None
    identity = message_identity(props, hdrs, raw_body)
    bury_reason = text_or_none(hdrs.get(REASON_HEADER))
    queue = (
        (deaths[0].queue if deaths else None)
        or text_or_none(hdrs.get(QUEUE_HEADER))
        or (state.queue if state else None)
        or routing_key
    )
    if not queue:
        problems.append("undecodable: no x-death, x-dlx-queue or routing key names its queue")
        queue = "unknown"
    worker_fate, worker_delay = _worker_fate(hdrs) if bury_reason is None else (None, None)
    published = bury_reason is not None or worker_fate is not None
    death_reason = deaths[0].reason if deaths else (PUBLISHED if published else UNKNOWN)
    replayed = text_or_none(hdrs.get(REPLAYED_HEADER))
    if provable:
        key = letter_key(queue, identity, state, replayed, fate=worker_fate)
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
        death_ms=int(deaths[0].time.timestamp() * 1000) if deaths and deaths[0].time else None,
        x_death=list(raw_x_death)
        if isinstance(raw_x_death, (list, tuple))
        else ([] if raw_x_death is None else [raw_x_death]),
        provable=provable,
        burial_key=burial_key(queue, identity, replayed) if provable else key,
        worker_fate=worker_fate,
        worker_delay=worker_delay,
    )
