"""Which copy of a message a redelivered original already became (it stopped between park and
ack): a retry of its own would start a second lineage, each running its budget. A copy and its
delivery share the message id; the park of attempt ``n`` is stored under ``<message id>:<n + 1>``,
its history the delivery's plus one entry."""

from __future__ import annotations

from celery_dlx.message.headers import DLXState
from celery_dlx.message.names import HISTORY_LIMIT

#: A marker's value that names no lineage (the DLX service's, or an earlier release's): it
#: matches every delivery but a replayed one.
ANY_LINEAGE = "?"


def lineage(state: DLXState, replayed: str | None) -> str:
    """What every copy of one lineage of a message shares: the obituary it was replayed from (a
    replay starts a lineage of its own under the same message id) and the time of its first
    failure (carried by every copy after it; none before the first failure)."""
    return f"{replayed or ''}:{state.first_failure_ms or ''}"


def same_lineage(marker: str, delivery_lineage: str) -> bool:
    """True when a copy marker written with ``marker`` (:func:`lineage`, or
    :data:`ANY_LINEAGE`) was made from a delivery of ``delivery_lineage``."""
    if marker == delivery_lineage:
        return True
    replayed = delivery_lineage.split(":", 1)[0]
    return marker in (ANY_LINEAGE, "1") and not replayed


def park_entry_id(message_id: str, attempt: int) -> str:
    """The entry id (:attr:`~celery_dlx.message.parked.ParkedMessage.entry_id`) of the park of
    ``message_id`` whose copy carries ``attempt``."""
    if attempt < 0:
        raise ValueError(f"an attempt is a count of failed runs (>= 0), got {attempt}")
    return f"{message_id}:{attempt}"


def next_park_id(message_id: str, delivery: DLXState) -> str:
    """The entry id the park of a failure of this delivery is stored under."""
    return park_entry_id(message_id, delivery.attempt + 1)


def follows(copy: DLXState, copy_queue: str, delivery: DLXState, queue: str) -> bool:
    """True when ``copy`` (a parked entry's state) is the retry of a failure of ``delivery``:
    same queue, one attempt more, the delivery's history (capped at :data:`HISTORY_LIMIT`, oldest
    dropped) with one entry more. Another lineage of the same id has another history."""
    if copy_queue != queue or copy.attempt != delivery.attempt + 1 or not copy.history:
        return False
    kept = len(copy.history) - 1
    expected = (*delivery.history,)[-kept:] if kept else ()
    if kept < min(len(delivery.history), HISTORY_LIMIT - 1):
        return False
    return copy.history[:-1] == expected
