"""``celery_dlx.install(app)``: the one line that brings celery_dlx into a Celery app.

With ``dlx_enabled = True`` it makes every task of the app a DLX task, gives every queue of the
app (``task_queues``, the default queue and queues created on demand) its dead-letter arguments
at configuration time (so producers and workers declare them alike), buries undecodable
messages instead of dropping them, and runs the drain in the workers (a bootstep under a Redis
lease, see ``celery_dlx.worker.drainer``).
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals
from celery.app.amqp import AMQP, Queues

from celery_dlx.broker.topology import as_dlx_queue, management_of_app
from celery_dlx.errors import ConfigurationError
from celery_dlx.worker.runtime import get_runtime

logger = logging.getLogger(__name__)

#: Celery's default worker consumer; replaced only when the app has not chosen its own.
DEFAULT_CONSUMER = "celery.worker.consumer:Consumer"
DLX_CONSUMER = "celery_dlx.worker.consumer:DLXConsumer"


class DLXQueues(Queues):  # type: ignore[misc]
    """Celery's queue map, with every queue given celery_dlx's dead-letter arguments."""

    dlx_options: dict[str, Any] = {}

    def __setitem__(self, name: str, queue: Any) -> None:
        if self.dlx_options:
            queue = as_dlx_queue(queue, **self.dlx_options)
        super().__setitem__(name, queue)

    def _add(self, queue: Any) -> Any:
        # Celery returns the queue it was given; return the converted one that was stored, so
        # a queue created on demand (routing, `worker -Q`) is declared with its arguments.
        super()._add(queue)
        return dict.__getitem__(self, queue.name)


class DLXAMQP(AMQP):  # type: ignore[misc]
    """Celery's AMQP helper whose queue map adds dead-letter arguments when ``dlx_enabled``."""

    def Queues(self, queues: Any, *args: Any, **kwargs: Any) -> Any:
        config = get_runtime(self.app).config
        options: dict[str, Any] = {}
        if config.enabled:
            options = {
                "dlx": config.exchange,
                "service": config.service_queue,
                "quorum": config.quorum,
                "delivery_limit": config.delivery_limit,
                # a queue migrated by policy is declared as it is (DLXQueue.declare)
                "app": self.app.main,
                "management": management_of_app(self.app),
            }
        self.queues_cls = type("DLXQueues", (DLXQueues,), {"dlx_options": options})
        return super().Queues(queues, *args, **kwargs)


def install(app: Any) -> None:
    """Bring celery_dlx into ``app``; call it right after creating the app, before its tasks.

    Whether it acts is decided by the ``dlx_enabled`` setting, read (and every ``dlx_*`` setting
    validated) when the app's configuration is first loaded.

    Raises:
        ConfigurationError: the app's task base class or AMQP helper was already created, so
            tasks defined so far would not be DLX tasks.
    """
    if "Task" in app.__dict__ or "amqp" in app.__dict__:
        raise ConfigurationError(
            "celery_dlx.install(app) must run before the app's tasks or queues are used: call it "
            "right after `app = Celery(...)`"
        )
    app.task_cls = "celery_dlx.worker.task:AutoDLXTask"
    app.amqp_cls = "celery_dlx.install:DLXAMQP"
    app._celery_dlx_installed = True

    def on_configure(sender: Any = None, source: Any = None, **_: Any) -> None:
        configure(app)

    app.on_after_configure.connect(on_configure, weak=False)
    if app.configured:
        configure(app)
    _warm_on_start(app)


def _warm_on_start(app: Any) -> None:
    """Connect each worker process to Redis and the broker when it starts, not at its first failure.

    Pool processes start with ``worker_process_init``; solo and thread pools run tasks in the
    worker process itself (``worker_ready``). Signals are global, so each handler checks its app.
    """

    def warm(sender: Any = None, **_: Any) -> None:
        owner = getattr(sender, "app", None)
        if owner is not None and owner is not app:
            return
        if get_runtime(app).config.enabled:
            get_runtime(app).warm()

    signals.worker_process_init.connect(warm, weak=False)
    signals.worker_ready.connect(warm, weak=False)


def configure(app: Any) -> None:
    """Apply the validated settings to ``app`` (called once its configuration is loaded)."""
    runtime = get_runtime(app)
    config = runtime.config
    from celery_dlx.worker.drain import register_drain_task

    # The drain task is registered even when disabled, so `celery dlx` tools and a beat of
    # another app can send it; it only runs if scheduled.
    register_drain_task(app)
    if not config.enabled:
        return
    if app.conf.worker_consumer in (None, DEFAULT_CONSUMER):
        app.conf.worker_consumer = DLX_CONSUMER
    else:
        logger.warning(
            "worker_consumer is %s: undecodable messages are handled by it, not by celery_dlx",
            app.conf.worker_consumer,
        )
    from celery_dlx.worker.drainer import install_drainer_step

    # The drain runs in the workers under a Redis lease: no beat entry, no tick messages.
    install_drainer_step(app)
    _install_optional(app, runtime)


def _install_optional(app: Any, runtime: Any) -> None:
    """Hook in the DLX service bootstep and the integrations when their modules are present."""
    if runtime.config.service_in_worker:
        from celery_dlx.service.bootstep import install_service_step

        install_service_step(app)
    try:
        from celery_dlx.integrations import install_integrations
    except ImportError:  # the integrations package is optional in a minimal install
        return
    install_integrations(app, runtime)
