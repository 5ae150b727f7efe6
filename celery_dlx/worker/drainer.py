"""The drainer as a worker bootstep."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from celery import bootsteps

from celery_dlx.drain.drainer import DrainerThread
from celery_dlx.wiring.runtime import get_runtime

if TYPE_CHECKING:
    from celery.worker import WorkController


class DrainerStep(bootsteps.StartStopStep):
    """Worker bootstep running a :class:`DrainerThread` for the worker's lifetime."""

    name = "celery_dlx.worker.drainer"
    # After the pool forks: its children never see the thread.
    requires = ("celery.worker.components:Pool",)

    def __init__(self, parent: WorkController, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.running: DrainerThread | None = None

    def include_if(self, parent: WorkController) -> bool:
        config = get_runtime(parent.app).config
        return bool(config.enabled or config.service_in_worker)

    def start(self, parent: WorkController) -> None:
        if self.running is not None and self.running.is_alive():
            return
        self.running = DrainerThread(parent.app, name=getattr(parent, "hostname", None))
        self.running.start()

    def stop(self, parent: WorkController) -> None:
        if self.running is None:
            return
        self.running.stop()
        self.running = None

    def terminate(self, parent: WorkController) -> None:
        self.stop(parent)
