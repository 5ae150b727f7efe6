"""The markers that keep a failure's budget exact while copies go out and Redis may die.

A retry's copy and the marker saying it exists (``Keys.copied``) are written to two servers, so
one can be in without the other. The order makes that safe:

1. :func:`mark_pending` before the copy goes out: a redelivery of its original (the worker died,
   or the broker lost the ack, after the publish) waits in its queue while the mark says
   pending, instead of being counted as a crash beside a copy that may exist;
2. the copy (a requeued copy at the tail of its queue, or a copy for the DLX service);
3. the marker itself, with the ``requeued`` history entry, or :func:`mark_made` when that write
   failed: a redelivery of the original is then acked unrun.

A step a crash leaves undone errs on the side of a run more, never of a loss: a pending mark
whose copy never went out expires after :data:`PENDING_TTL`, and the redelivery then counts as
the crash it was. Redis that does not answer is waited for (:func:`patiently`); if it still
does not, the copy does not go out and the original goes back to its queue (:class:`NotMarked`),
where its redelivery is counted as this failure once Redis answers. A full Redis is not waited
for: copies go out unmarked, so a storm drains into RabbitMQ instead of stalling.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from celery_dlx.fates import FateEvent
from celery_dlx.message.lineage import ANY_LINEAGE
from celery_dlx.outages import outage_log
from celery_dlx.store.errors import STORE_ERRORS, is_full
from celery_dlx.wiring.runtime import Runtime

logger = logging.getLogger(__name__)

#: Seconds a retry marked pending stays so without its marker (its original, if redelivered
#: meanwhile, waits in its queue): past a broker restart and the DLX service's backlog.
PENDING_TTL = 120.0

#: Seconds a write that keeps a failure's budget exact is tried again while Redis does not
#: answer (:func:`patiently`): past a Redis restart, whose AOF replay takes a second or two.
STORE_PATIENCE = 10.0

T = TypeVar("T")


def patiently(call: Callable[[], T], patience: float = STORE_PATIENCE) -> T:
    """``call()``, tried again while Redis does not answer, for up to ``patience`` seconds.

    For the markers that tell a second copy of a retry, or a redelivered original, from a new
    failure: written late they would be missing when that copy comes back. A full Redis
    (:func:`is_full`) is not waited for: it refuses the write at once and will for a while.

    Raises:
        redis.RedisError: the last error, once ``patience`` is spent or Redis is full.
    """
    deadline = time.monotonic() + patience
    pause = 0.1
    while True:
        try:
            return call()
        except STORE_ERRORS as err:
            if is_full(err) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


class NotMarked(Exception):
    """Redis did not answer the pending mark: the copy must not go out, and the original goes
    back to its queue (its redelivery is counted as this failure once Redis answers)."""


def _retry_of(event: FateEvent) -> tuple[str, str, int, str]:
    return (
        event.queue,
        event.message_id,
        event.attempt,
        str(event.extra.get("lineage", ANY_LINEAGE)),
    )


def mark_pending(runtime: Runtime, events: Sequence[FateEvent]) -> None:
    """Mark the retries ``events`` announce pending, before their copies go out.

    Raises:
        NotMarked: Redis did not answer within :data:`STORE_PATIENCE`.
            Not raised when Redis is full (the copies go out unmarked) or optional (the ``ttl``
            delay backend: the broker holds every fate).
    """
    if not events:
        return
    retries = [_retry_of(event) for event in events]
    try:
        if runtime.history_optional:
            runtime.causes.mark_pending_many(retries, PENDING_TTL)
        else:
            patiently(lambda: runtime.causes.mark_pending_many(retries, PENDING_TTL))
    except STORE_ERRORS as err:
        if runtime.history_optional or is_full(err):
            logger.debug("retries of %s not marked pending", events[0].message_id, exc_info=True)
            return
        raise NotMarked(f"Redis did not answer the pending mark: {err}") from err


def mark_made(runtime: Runtime, events: Sequence[FateEvent]) -> None:
    """Mark the retries ``events`` announce as made (their copies are out), where the history
    write that carries the marker failed. Waits for Redis as :func:`mark_pending` does; without
    the marker a redelivered original waits out :data:`PENDING_TTL`, then counts as a crash
    (one line per outage says so)."""
    if not events:
        return
    retries = [_retry_of(event) for event in events]
    refusals = outage_log(runtime, "_celery_dlx_unmarked_retries", logger, "retry markers")
    try:
        patiently(lambda: runtime.causes.mark_copied_many(retries))
    except STORE_ERRORS as err:
        refusals.failed(
            err,
            f"a redelivery of {events[0].message_id}'s original waits {PENDING_TTL:.0f} s, "
            "then counts as a crash",
        )
    else:
        refusals.succeeded()
