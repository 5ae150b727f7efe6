"""``DLXRequest``: the worker's request of a DLX task (Celery's ``Task.Request``).

A run that handed its park or requeue over (:class:`celery_dlx.compat.HandedOver`) is acked by
the :class:`~celery_dlx.worker.settler.Settler` once its copy is written; on the solo pool an ack
or reject also wakes the event loop (:mod:`celery_dlx.worker.loopwake`).
"""

from __future__ import annotations

from typing import Any

from celery_dlx.compat.celery import (
    HandedOver,
    NotifyingRequest,
    divert_acknowledge,
    set_request_header,
)
from celery_dlx.worker.events import TASK_EVENTS_KEY, sends_task_events
from celery_dlx.worker.loopwake import loop_wake_of
from celery_dlx.worker.settler import ParkHandover, RequeueHandover, Settler, settler_of


class DLXRequest(NotifyingRequest):
    """A request whose handed-over copy the settler writes, telling its run whether the worker
    sends task events (:data:`~celery_dlx.worker.events.TASK_EVENTS_KEY`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        set_request_header(
            self, TASK_EVENTS_KEY, bool(self.task.send_events and sends_task_events(self.eventer))
        )

    def after_ack_or_reject(self) -> None:
        """On the solo pool, make the loop write the ack or reject on its next turn."""
        wake = loop_wake_of(self.task.app)
        if wake is not None:
            wake.nudge()

    def on_failure(
        self, exc_info: Any, send_failed_event: bool = True, return_ok: bool = False
    ) -> Any:
        exc = getattr(exc_info, "exception", None)
        if isinstance(exc, HandedOver) and isinstance(exc.handover, ParkHandover | RequeueHandover):
            # Celery acks an Ignore after its bookkeeping: this acknowledge hands over instead.
            handover = exc.handover
            divert_acknowledge(self, lambda: _hand_over(self, handover))
        return super().on_failure(
            exc_info, send_failed_event=send_failed_event, return_ok=return_ok
        )


def _hand_over(request: DLXRequest, handover: ParkHandover | RequeueHandover) -> None:
    """``request.acknowledge()`` of a handed-over run: the settler writes the copy, then acks."""
    if request.acknowledged:
        return
    # No running settler cannot happen (a pool hands over only to one): an idle one writes now.
    settler = settler_of(request.task.app) or Settler(request.task.app)
    settler.submit(request, handover)
