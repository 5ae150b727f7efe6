"""The failure history: every fate change appended to a Redis stream, in order, never trimmed here.

The Spark exporter trims it only after a checkpointed export. Entries are appended by
:meth:`History.append_many` and by the graveyard's Lua scripts (:func:`history_args`), both
encoded by :func:`history_fields`; each entry's fields are flat strings:

========================  ==========================================================
field                     meaning
========================  ==========================================================
``fate``                  requeued, parked, drained, buried, replayed, purged, recovered, archived
``at_ms``                 epoch milliseconds of the change
``queue``                 queue the message failed in (or is returned to)
``task``                  Celery task name, empty for foreign messages
``message_id``            stable message id
``attempt``               failed runs so far
``cause``                 cause fingerprint (empty when unknown)
``exc_type``              exception type of the failure
``reason``                free-text reason (burial reason, x-death reason...)
``delay``                 park delay in seconds, empty when not parked
``importance``            page, notify or ignore
``first_failure_ms``      epoch ms of the message's first failure, empty if unknown
``obituary``              JSON of the whole obituary (``archived`` entries only)
========================  ==========================================================
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from celery_dlx.fates import PARKED, REQUEUED, FateEvent
from celery_dlx.message.counts import Counts
from celery_dlx.message.lineage import ANY_LINEAGE
from celery_dlx.message.names import Keys
from celery_dlx.store.client import RedisClient, text
from celery_dlx.store.counters import add_counts, read_window

if TYPE_CHECKING:
    from redis.client import Pipeline
    from redis.cluster import ClusterPipeline
    from redis.typing import EncodableT, FieldT

logger = logging.getLogger(__name__)

#: How long a retry's marker (``Keys.copied``) is kept: past any redelivery of its original.
COPIED_TTL_MS = 24 * 3600 * 1000


def mark_copies(pipe: Any, keys: Keys, events: Iterable[FateEvent]) -> None:
    """Queue in ``pipe`` the marker of each requeue and park of ``events``: the retry of that
    attempt exists, so a redelivery of an original whose ack the broker lost gets no second one
    (``DLXTask._retried_before``). Its value is the lineage of the delivery the retry was made
    from (``extra["lineage"]``; :data:`~celery_dlx.message.lineage.ANY_LINEAGE` if none)."""
    for event in events:
        if event.fate in (REQUEUED, PARKED):
            marker = keys.copied(event.queue, event.message_id, event.attempt)
            pipe.set(marker, event.extra.get("lineage", ANY_LINEAGE), px=COPIED_TTL_MS)


#: Fields every history entry has, in order.
HISTORY_FIELDS = (
    "fate",
    "at_ms",
    "queue",
    "task",
    "message_id",
    "attempt",
    "cause",
    "exc_type",
    "reason",
    "delay",
    "importance",
    "first_failure_ms",
)


def history_fields(event: FateEvent) -> dict[str, str]:
    """The stream fields of one fate event, in :data:`HISTORY_FIELDS` order."""
    delay, first = event.delay, event.first_failure_ms
    fields = {
        "fate": event.fate,
        "at_ms": str(event.at_ms),
        "queue": event.queue,
        "task": event.task or "",
        "message_id": event.message_id,
        "attempt": str(event.attempt),
        "cause": event.cause,
        "exc_type": event.exc_type,
        "reason": event.reason[:500],
        "delay": "" if delay is None else f"{delay:.3f}",
        "importance": event.importance,
        "first_failure_ms": "" if first is None else str(first),
    }
    obituary = event.extra.get("obituary")
    if obituary is not None:
        fields["obituary"] = json.dumps(obituary, separators=(",", ":"), default=str)
    return fields


def history_args(event: FateEvent) -> list[str]:
    """:func:`history_fields` flat (``field, value, ...``), for a Lua script's ``XADD``."""
    return [item for pair in history_fields(event).items() for item in pair]


class History:
    """The failure history stream: the one place entries are appended from Python, and read."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.keys = keys

    def append_many(
        self, events: Iterable[FateEvent], pipe: Pipeline | ClusterPipeline | None = None
    ) -> int:
        """Append ``events`` in ``pipe`` (not executed) or in one round trip now; how many
        ``XADD`` were queued."""
        target = self.client.pipeline(transaction=False) if pipe is None else pipe
        queued = 0
        for event in events:
            # redis-py types xadd's fields as a dict of every key and value type (invariant)
            fields = cast("dict[FieldT, EncodableT]", history_fields(event))
            target.xadd(self.keys.history, fields)
            queued += 1
        if pipe is None:
            target.execute()
        return queued

    def append_audit(self, fields: Mapping[str, str], event: FateEvent, *, maxlen: int) -> str:
        """Append an operator action to the audit stream (capped at about ``maxlen``) and its
        ``audit`` entry to the history, in one round trip; the audit entry's id."""
        pipe = self.client.pipeline(transaction=False)
        entry: dict[Any, Any] = dict(fields)
        pipe.xadd(self.keys.web_audit, entry, maxlen=maxlen, approximate=True)
        self.append_many([event], pipe=pipe)
        entry_id = pipe.execute()[0]
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    def read(
        self, start: str = "-", end: str = "+", count: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Entries between ``start`` and ``end`` (stream ids), decoded to text."""
        return _decoded(self.client.xrange(self.keys.history, start, end, count=count))

    def length(self) -> int:
        return int(self.client.xlen(self.keys.history))

    def dump(self, path: str, *, after: str | None = None, page: int = 10000) -> int:
        """Write the entries after ``after`` (or all) to a JSON-lines file, ``id`` plus fields
        each; how many."""
        start = "-" if after is None else "(" + after
        written = 0
        with open(path, "w", encoding="utf-8") as handle:
            while True:
                rows = self.read(start, "+", count=page)
                for entry_id, fields in rows:
                    line = {"id": entry_id, **fields}
                    handle.write(json.dumps(line, separators=(",", ":"), ensure_ascii=False) + "\n")
                written += len(rows)
                if len(rows) < page:
                    return written
                start = "(" + rows[-1][0]

    def tail(self) -> str:
        """The id of the stream's last entry (``0-0`` when empty)."""
        last: Any = self.client.xrevrange(self.keys.history, "+", "-", count=1)
        return text(last[0][0]) if last else "0-0"

    def after(
        self, last: str, *, count: int = 1000, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]:
        """Entries appended after the entry ``last``, waiting up to ``block_ms`` for one."""
        reply: Any = self.client.xread({self.keys.history: last}, count=count, block=block_ms)
        return [row for _, entries in reply or () for row in _decoded(entries)]

    def audit(self, limit: int = 100) -> list[tuple[str, dict[str, str]]]:
        """The latest ``limit`` entries of the operators' audit stream, newest first."""
        return _decoded(self.client.xrevrange(self.keys.web_audit, "+", "-", count=limit))

    def counts(self, window_s: float, *, at_ms: int | None = None) -> Counts:
        """The per-minute fate counters over the last ``window_s`` seconds."""
        return read_window(self.client, self.keys, window_s, at_ms=at_ms)

    def write(
        self,
        events: Sequence[FateEvent],
        *,
        history: bool = True,
        pipeline: Pipeline | ClusterPipeline | None = None,
    ) -> bool:
        """Append ``events`` (unless ``history`` is False: the caller did), count them and mark
        their retries (:func:`mark_copies`), queued in ``pipeline`` (an ``XADD`` per event
        first; True is returned) or in one round trip now.

        Returns:
            Whether the counters and markers went in (best effort: the caller logs a failure).

        Raises:
            redis.RedisError: the append was refused, or the round trip failed and ``history``
                is True.
        """
        pipe = self.client.pipeline(transaction=False) if pipeline is None else pipeline
        appended = self.append_many(events, pipe) if history else 0
        add_counts(pipe, self.keys, events)
        mark_copies(pipe, self.keys, events)
        if pipeline is not None:
            return True
        try:
            results = pipe.execute(raise_on_error=False)
        except Exception:
            if history:
                raise
            return False
        failed = next((r for r in results[:appended] if isinstance(r, Exception)), None)
        if failed is not None:
            raise failed
        return not any(isinstance(r, Exception) for r in results[appended:])

    def forget_copies(self, events: Sequence[FateEvent]) -> None:
        """Delete the markers :meth:`write` queued for ``events`` whose writes failed (best
        effort)."""
        try:
            self.client.delete(
                *(self.keys.copied(e.queue, e.message_id, e.attempt) for e in events)
            )
        except Exception:
            logger.warning(
                "could not take back the retry markers of %d failed park(s): a redelivery of one "
                "of them within a day would be acked unrun",
                len(events),
                exc_info=True,
            )


def _decoded(rows: Any) -> list[tuple[str, dict[str, str]]]:
    """Stream entries ``(id, fields)`` as text."""
    return [(text(i), {text(k): text(v) for k, v in f.items()}) for i, f in rows]
