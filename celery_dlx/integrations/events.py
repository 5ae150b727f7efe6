"""Celery task events for fate changes (``task-requeued``, ``task-parked``, ``task-buried``,
``task-replayed``, ``uuid`` the message's id), so Flower and other event monitors see them; the
fields and what Flower makes of them are in docs/monitoring.md.

A worker sends them only while it sends task events, as Celery sends its own
(``dlx_events_follow_worker``; see :mod:`celery_dlx.worker.events`); the DLX service and the CLI
whenever ``dlx_send_events`` is on.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Sequence
from typing import Any

from celery_dlx.fates import BURIED, PARKED, REPLAYED, REQUEUED, FateEvent
from celery_dlx.wiring.runtime import Runtime
from celery_dlx.worker.events import TASK_EVENTS_KEY

#: Event type per fate; other fate changes are not sent.
EVENT_TYPES = {
    REQUEUED: "task-requeued",
    PARKED: "task-parked",
    BURIED: "task-buried",
    REPLAYED: "task-replayed",
}
#: Longest traceback sent in an event (events are broadcast; the graveyard keeps it whole).
TRACEBACK_LIMIT = 16384
#: Longest exception message or reason sent in an event.
TEXT_LIMIT = 1000
#: Most events in one ``task.multi`` message (a larger batch goes out in several).
BATCH_EVENTS = 500


def summary(event: FateEvent) -> str:
    """One line naming what happened, for Flower's ``Result`` column."""
    parts = [f"{event.fate} queue={event.queue} attempt={event.attempt}"]
    if event.cause:
        parts.append(f"cause={event.cause}")
    if event.delay is not None:
        parts.append(f"delay={event.delay:.3f}s")
    if event.reason:
        parts.append(f"reason={event.reason[:200]}")
    return " ".join(parts)


def event_fields(event: FateEvent) -> dict[str, object]:
    """The JSON-safe fields of the Celery event for ``event`` (without ``type`` and ``uuid``)."""
    fields: dict[str, object] = {
        "queue": event.queue,
        "attempt": event.attempt,
        "cause": event.cause,
        "exc_type": event.exc_type,
        "reason": event.reason[:TEXT_LIMIT],
        "importance": event.importance,
        "result": summary(event),
    }
    if event.task:
        fields["name"] = event.task
    if event.exc_type:
        fields["exception"] = f"{event.exc_type}({event.exc_message[:TEXT_LIMIT]!r})"
    if event.delay is not None:
        fields["delay"] = round(event.delay, 3)
    if event.fate == BURIED and event.traceback:
        fields["traceback"] = event.traceback[-TRACEBACK_LIMIT:]
    found = obituary_id(event)
    if found:
        fields["obituary_id"] = found
    return fields


def obituary_id(event: FateEvent) -> str | None:
    """The id of the obituary ``event`` names (``obituary_id``, or its ``obituary``'s), if any."""
    obituary = event.extra.get("obituary")
    found = event.extra.get("obituary_id") or (
        obituary.get("id") if isinstance(obituary, dict) else None
    )
    return str(found) if found else None


class EventSender:
    """Fate listener sending ``task-<fate>`` events through the app's event dispatcher.

    One broker connection per process (made by :meth:`warm` or the first event) and one
    dispatcher on it per node name, as Celery's worker keeps its own: a dispatcher per event (a
    pooled producer, the exchange declared again) cost more than the Redis work of a failure.
    Best effort: a failed publish drops the connection and is tried once on a fresh one, then
    the event is lost, never the fate. Thread-safe; a forked child makes its own connection.
    """

    def __init__(self, runtime: Runtime) -> None:
        self.app = runtime.app
        self.runtime = runtime
        self._lock = threading.Lock()
        self._pid = 0
        self._connection: Any = None
        self._dispatchers: dict[tuple[str, bool], Any] = {}

    def __call__(self, event: FateEvent) -> None:
        self.send(event)

    def warm(self) -> None:
        """Connect now (a worker process starting), so the first fate change does not wait; not
        in a worker whose events follow its switch (``dlx_events_follow_worker``) and start off,
        so pool processes hold no idle connection. Raises what connecting raises."""
        if self.runtime.config.events_follow_worker and not self.app.conf.worker_send_task_events:
            return
        with self._lock:
            self._connect()

    def wanted(self) -> bool:
        """Whether fate events go out now: always outside workers; in a worker (with
        ``dlx_events_follow_worker``) only while it sends task events, as the run's request
        says or, outside a run, the worker's switch now."""
        if not self.runtime.config.events_follow_worker:
            return True
        task = getattr(self.app, "current_worker_task", None)
        if task is not None:
            said = getattr(task.request, TASK_EVENTS_KEY, None)
            if said is not None:
                return bool(said)
        switch = self.runtime.worker_sends_task_events()
        return True if switch is None else switch

    def send(self, event: FateEvent) -> bool:
        """Send the event for ``event``; False when its fate has no event type or events are
        not :meth:`wanted` now."""
        if event.fate not in EVENT_TYPES or not self.wanted():
            return False
        self._publish([event], batched=False)
        return True

    def notify_many(self, events: Sequence[FateEvent]) -> int:
        """Send ``events`` (a batch of fate changes) as one Celery ``task.multi`` message, which
        event receivers (Flower's) take apart as if each had come alone; how many were sent."""
        if not self.wanted():
            return 0
        sendable = [e for e in events if e.fate in EVENT_TYPES]
        if len(sendable) <= 1:
            return sum(self.send(event) for event in sendable)
        self._publish(sendable, batched=True)
        return len(sendable)

    def _publish(self, events: Sequence[FateEvent], *, batched: bool) -> None:
        """Send ``events``, tried once more on a fresh connection."""
        hostname = self.runtime.acting_node or self._hostname()
        with self._lock:
            for last in (False, True):
                dispatcher = self._dispatcher(hostname, batched=batched)
                try:
                    for event in events:
                        fields = event_fields(event)
                        dispatcher.send(EVENT_TYPES[event.fate], uuid=event.message_id, **fields)
                    if batched:
                        dispatcher.flush(errors=False)
                    break
                except Exception:
                    self._reset()
                    if last:
                        raise

    def _hostname(self) -> str:
        """The worker's node name inside a task, else ``celery_dlx@host`` (Flower lists each
        hostname as a worker: one stable name per host, not one per process)."""
        task = getattr(self.app, "current_worker_task", None)
        hostname = getattr(getattr(task, "request", None), "hostname", None) if task else None
        return str(hostname) if hostname else f"celery_dlx@{socket.gethostname()}"

    def close(self) -> None:
        """Close the kept connection (a new one is made by the next event)."""
        with self._lock:
            self._reset()

    def _connect(self) -> Any:
        pid = os.getpid()
        if pid != self._pid:  # forked: the parent's connection is not ours to use or close
            self._pid, self._connection, self._dispatchers = pid, None, {}
        if self._connection is None:
            connection = self.app.connection_for_write()
            connection.ensure_connection(max_retries=1, interval_start=0, interval_step=1)
            self._connection = connection
        return self._connection

    def _dispatcher(self, hostname: str, *, batched: bool = False) -> Any:
        """The dispatcher of ``hostname`` (``batched``: buffers task events until flushed)."""
        connection = self._connect()
        key = (hostname, batched)
        dispatcher = self._dispatchers.get(key)
        if dispatcher is None:
            options: dict[str, Any] = {"enabled": True, "buffer_while_offline": False}
            if batched:
                options.update(buffer_group=frozenset({"task"}), buffer_limit=BATCH_EVENTS)
            dispatcher = self._dispatchers[key] = self.app.events.Dispatcher(
                connection, hostname=hostname, **options
            )
        return dispatcher

    def _reset(self) -> None:
        # A failed publish makes the connection suspect: every dispatcher on it goes with it.
        dispatchers, self._dispatchers = self._dispatchers, {}
        for dispatcher in dispatchers.values():
            with contextlib.suppress(Exception):
                dispatcher.close()
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()


def install_events(runtime: Runtime) -> EventSender | None:
    """The event listener for ``runtime``, or None when ``dlx_send_events`` is off."""
    if not runtime.config.send_events:
        return None
    return EventSender(runtime)
