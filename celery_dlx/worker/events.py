"""Whether a worker sends task events now, for celery_dlx's fate events to follow.

Celery sends its own task events only while the worker's event dispatcher is enabled for the
``task`` group: ``celery worker -E``, ``worker_send_task_events``, or ``celery control
enable_events`` (which Flower broadcasts every few seconds). celery_dlx's fate events
(``task-requeued``, ``task-parked``...) follow the same switch in a worker
(``dlx_events_follow_worker``, on by default), so a worker nobody monitors does not publish an
event per failure:

- the worker's main process tells the runtime how to read its switch
  (:class:`TaskEventsStep`, a consumer bootstep: the dispatcher is made again on every
  reconnection, so the switch reads the consumer's current one);
- each DLX task request carries what the switch said when the worker received it
  (:data:`TASK_EVENTS_KEY`, set by :class:`~celery_dlx.worker.request.DLXRequest`), so a run
  in a pool process, which cannot see its parent's switch, knows it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import bootsteps

from celery_dlx.wiring.runtime import get_runtime

if TYPE_CHECKING:
    from celery.worker.consumer import Consumer

#: Key of a task request (its ``request_dict``, read in the run as ``task.request.<key>``): True
#: when the worker that received it was sending task events.
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
