"""The markers that keep a failure's budget exact while copies go out and Redis may restart.

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
the crash it was. Redis that does not answer is waited for (:func:`patiently`: a restart); a
longer outage, or a full Redis, is not: copies then go out unmarked and retries run unclaimed,
so the work goes on (a kill in that time may run a failure once more).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from celery_dlx.fates import FateEvent
from celery_dlx.message.lineage import ANY_LINEAGE
from celery_dlx.outages import OutageLog, outage_log
from celery_dlx.wiring.errors import STORE_ERRORS, is_full
from celery_dlx.wiring.runtime import Runtime

logger = logging.getLogger(__name__)

#: Seconds a retry marked pending stays so without its marker (its original, if redelivered
#: meanwhile, waits in its queue): past a broker restart and the DLX service's backlog.
PENDING_TTL = 120.0

#: Seconds a write that keeps a failure's budget exact is tried again while Redis does not
#: answer (:func:`patiently`): past a Redis restart, whose AOF replay takes a second or two.
STORE_PATIENCE = 10.0

T = TypeVar("T")

#: Whether this process spent its patience in the current outage: later writes then try once
#: (a pool process must not wait per failure through a long outage) until one succeeds.
_outage = {"spent": False}


def patiently(call: Callable[[], T], patience: float = STORE_PATIENCE) -> T:
    """``call()``, tried again while Redis does not answer, for up to ``patience`` seconds once
    per outage and process (a restart is waited for, a long outage only once).

    For the markers that tell a second copy of a retry, or a redelivered original, from a new
    failure: written late they would be missing when that copy comes back. A full Redis
    (:func:`~celery_dlx.wiring.errors.is_full`) is not waited for: it refuses the write at once
    and will for a while.

    Raises:
        redis.RedisError: the last error, once ``patience`` is spent or Redis is full.
    """
    deadline = time.monotonic() + (0.0 if _outage["spent"] else patience)
    pause = 0.1
    while True:
        try:
            found = call()
        except STORE_ERRORS as err:
            if is_full(err):
                raise
            if time.monotonic() + pause > deadline:
                _outage["spent"] = _outage["spent"] or patience > 0
                raise
        else:
            _outage["spent"] = False
            return found
        time.sleep(pause)
        pause = min(pause * 2, 1.0)


def patience_of(runtime: Runtime) -> float:
    """How long :func:`patiently` waits for ``runtime``'s Redis: not at all with the ``ttl``
    delay backend, where Redis is optional (one try)."""
    return 0.0 if runtime.history_optional else STORE_PATIENCE


def _retry_of(event: FateEvent) -> tuple[str, str, int, str]:
    return (
        event.queue,
        event.message_id,
        event.attempt,
        str(event.extra.get("lineage", ANY_LINEAGE)),
    )


def mark_pending(runtime: Runtime, events: Sequence[FateEvent]) -> bool:
    """Mark the retries ``events`` announce pending, before their copies go out; False when
    Redis did not answer in time, or is full (the copies then go out unmarked: one line per
    outage says so). With the ``ttl`` delay backend (Redis optional) one try, unlogged."""
    if not events:
        return True
    retries = [_retry_of(event) for event in events]
    try:
        patiently(
            lambda: runtime.causes.mark_pending_many(retries, PENDING_TTL), patience_of(runtime)
        )
    except STORE_ERRORS as err:
        if not runtime.history_optional:
            _refusals(runtime, "pending").failed(err, "copies go out unmarked")
        return False
    _refusals(runtime, "pending").succeeded()
    return True


def mark_made(runtime: Runtime, events: Sequence[FateEvent]) -> None:
    """Mark the retries ``events`` announce as made (their copies are out), where the history
    write that carries the marker failed. Waits for Redis as :func:`mark_pending` does; without
    the marker a redelivered original waits out :data:`PENDING_TTL`, then counts as a crash
    (one line per outage says so)."""
    if not events:
        return
    retries = [_retry_of(event) for event in events]
    try:
        patiently(lambda: runtime.causes.mark_copied_many(retries))
    except STORE_ERRORS as err:
        _refusals(runtime, "made").failed(
            err,
            f"a redelivery of {events[0].message_id}'s original waits {PENDING_TTL:.0f} s, "
            "then counts as a crash",
        )
    else:
        _refusals(runtime, "made").succeeded()


def _refusals(runtime: Runtime, kind: str) -> OutageLog:
    what = {"pending": "pending marks of retries", "made": "markers of retries"}[kind]
    return outage_log(runtime, f"_celery_dlx_refused_{kind}_marks", logger, what)
