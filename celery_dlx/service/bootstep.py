"""Running the DLX service inside a worker: a consumer bootstep, on when ``dlx_service_in_worker``.

The service has its own connections and daemon thread, started with the worker's consumer and
stopped (batch in hand acked) at shutdown; a reconnect of the worker's consumer leaves it be.
"""

from __future__ import annotations

import logging
import threading

from celery import Celery, bootsteps
from celery.worker.consumer import Consumer

from celery_dlx.service.loop import DLXService
from celery_dlx.wiring.runtime import get_runtime

logger = logging.getLogger(__name__)

#: Seconds the worker waits at shutdown for the service to ack its batch and stop.
STOP_TIMEOUT = 30.0


class DLXServiceStep(bootsteps.StartStopStep):
    """Consumer bootstep running the app's DLX service in a thread of the worker."""

    name = "celery_dlx.service.loop"
    service: DLXService | None = None
    thread: threading.Thread | None = None

    def include_if(self, parent: Consumer) -> bool:
        return bool(get_runtime(parent.app).config.service_in_worker)

    def start(self, parent: Consumer) -> None:
        if self.thread is not None and self.thread.is_alive():
            return
        self.service = DLXService(parent.app, hostname=getattr(parent, "hostname", None))
        self.thread = threading.Thread(
            target=self._run, args=(self.service,), name="celery_dlx-service", daemon=True
        )
        self.thread.start()

    @staticmethod
    def _run(service: DLXService) -> None:
        try:
            service.run()
        except Exception:  # the worker keeps running its tasks; the failure must be visible
            logger.exception("the DLX service thread stopped on an error")

    def stop(self, parent: Consumer) -> None:
        """Called on every reconnect of the worker's consumer: the service keeps running."""

    def shutdown(self, parent: Consumer) -> None:
        if self.service is None or self.thread is None:
            return
        self.service.stop()
        self.thread.join(STOP_TIMEOUT)
        if self.thread.is_alive():
            logger.warning(
                "the DLX service did not stop within %ss; its unacked dead letters "
                "return to the queue",
                STOP_TIMEOUT,
            )
        self.service = None
        self.thread = None


def install_service_step(app: Celery) -> None:
    """Add the DLX service bootstep to ``app``'s worker consumer (once)."""
    steps = app.steps["consumer"]
    if DLXServiceStep not in steps:
        steps.add(DLXServiceStep)
