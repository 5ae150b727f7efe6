"""Whether a worker sends task events now, for celery_dlx's fate events to follow.

Celery sends task events only while the worker's dispatcher is enabled for the ``task`` group
(``-E``, ``worker_send_task_events``, or ``celery control enable_events``, as Flower does). Fate
events follow the same switch (``dlx_events_follow_worker``), so an unmonitored worker does not
publish an event per failure. :class:`TaskEventsStep` (a consumer bootstep: the dispatcher is
made again on each reconnection) tells the runtime how to read the switch; each request carries
what it said (:data:`TASK_EVENTS_KEY`), for a run in a pool process, which cannot see it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import bootsteps

from celery_dlx.wiring.runtime import get_runtime

if TYPE_CHECKING:
    from celery.worker.consumer import Consumer

#: Key of a task request (``task.request.<key>`` in the run): True when the worker that received
#: it was sending task events.
TASK_EVENTS_KEY = "celery_dlx_task_events"


def sends_task_events(dispatcher: Any) -> bool:
    """True when Celery's event ``dispatcher`` (a worker's) sends task events now."""
    if dispatcher is None or not getattr(dispatcher, "enabled", False):
        return False
    groups = getattr(dispatcher, "groups", None)
    return not groups or "task" in groups


class TaskEventsStep(bootsteps.StartStopStep):
    """Consumer bootstep: the runtime reads the worker's task-event switch through it."""

    name = "celery_dlx.worker.events"
    requires = ("celery.worker.consumer.events:Events",)

    def start(self, parent: Consumer) -> None:
        get_runtime(parent.app).follow_worker_events(
            lambda: sends_task_events(getattr(parent, "event_dispatcher", None))
        )
