"""``celery_dlx.install(app)``: the one line that brings celery_dlx into a Celery app.

With ``dlx_enabled = True`` it makes every task of the app a DLX task, gives every queue of the
app (``task_queues``, the default queue and queues created on demand) its dead-letter arguments
at configuration time (so producers and workers declare them alike), buries undecodable
messages instead of dropping them, and runs the drain in the workers (a bootstep under a Redis
lease, see ``celery_dlx.worker.drainer``).
"""

from __future__ import annotations

import logging
import weakref
from typing import Any

from celery import Celery, signals
from celery.app import app_or_default
from celery.app.amqp import AMQP, Queues
from kombu import Queue

from celery_dlx.broker.topology import as_dlx_queue, management_of_app
from celery_dlx.compat import app_task_or_amqp_made
from celery_dlx.errors import ConfigurationError
from celery_dlx.integrations import install_integrations
from celery_dlx.wiring.installed import mark_installed, not_installed, not_installed_message
from celery_dlx.wiring.runtime import get_runtime

logger = logging.getLogger(__name__)

#: Celery's default worker consumer; replaced only when the app has not chosen its own.
DEFAULT_CONSUMER = "celery.worker.consumer:Consumer"
DLX_CONSUMER = "celery_dlx.worker.consumer:DLXConsumer"


class DLXQueues(Queues):
    """Celery's queue map, with every queue given celery_dlx's dead-letter arguments."""

    dlx_options: dict[str, Any] = {}

    def __setitem__(self, name: str, queue: Queue) -> None:
        if self.dlx_options:
            queue = as_dlx_queue(queue, **self.dlx_options)
        super().__setitem__(name, queue)

    # Celery's `add`/`add_compat` return the queue given; return the converted one stored (by
    # name, not through Celery's aliases), so a queue created on demand (`__missing__`, `worker
    # -Q`) is declared with its arguments. celery-types declares `add(queue: Queue) -> None`;
    # Celery also takes a name.
    def add(self, queue: Queue | str, **kwargs: Any) -> Queue:  # type: ignore[override]
        added: Queue = super().add(queue, **kwargs)  # type: ignore[arg-type, assignment]
        return dict.__getitem__(self, added.name)

    def add_compat(self, name: str, **options: Any) -> Queue:
        return dict.__getitem__(self, super().add_compat(name, **options).name)


class DLXAMQP(AMQP):
    """Celery's AMQP helper whose queue map adds dead-letter arguments when ``dlx_enabled``."""

    def Queues(self, queues: list[Queue] | dict[str, Queue], *args: Any, **kwargs: Any) -> Queues:
        config = get_runtime(self.app).config
        options: dict[str, Any] = {}
        if config.enabled:
            options = {
                "dlx": config.exchange,
                "service": config.service_queue,
                "quorum": config.quorum,
                "delivery_limit": config.delivery_limit,
                "app": self.app.main,
                "management": management_of_app(self.app),
            }
        self.queues_cls = type("DLXQueues", (DLXQueues,), {"dlx_options": options})
        return super().Queues(queues, *args, **kwargs)


def install(app: Celery) -> None:
    """Bring celery_dlx into ``app``; call it right after creating the app, before its tasks.

    Whether it acts is decided by the ``dlx_enabled`` setting, read (and every ``dlx_*`` setting
    validated) when the app's configuration is first loaded.

    Raises:
        ConfigurationError: the app's task base class or AMQP helper was already created, so
            tasks defined so far would not be DLX tasks.
    """
    if app_task_or_amqp_made(app):
        raise ConfigurationError(
            "celery_dlx.install(app) must run before the app's tasks or queues are used: call it "
            "right after `app = Celery(...)`"
        )
    app.task_cls = "celery_dlx.worker.task:AutoDLXTask"
    app.amqp_cls = "celery_dlx.install:DLXAMQP"
    app.on_after_configure.connect(lambda **_: configure(app), weak=False)
    mark_installed(app)
    if app.configured:  # type: ignore[attr-defined]  # celery-types omits Celery.configured
        configure(app)
    _INSTALLED.add(app)


#: The apps install() was called on, for the (global) worker start signals, which connect each
#: worker process to Redis and the broker at start: pool processes at ``worker_process_init``,
#: solo and thread pools at ``worker_ready``. Weak: a dropped app is not kept alive.
_INSTALLED: weakref.WeakSet[Celery] = weakref.WeakSet()


def _warm(sender: Any = None, signal: Any = None, **_: Any) -> None:
    # worker_process_init has no sender, but the pool process made its app the current one.
    # Another app of the same process must not connect anywhere.
    app = getattr(sender, "app", None) or app_or_default()
    if app not in _INSTALLED:
        return
    runtime = get_runtime(app)
    if runtime.config.enabled:
        # Fate listeners warm where tasks run (not a prefork main process, unless it writes the
        # parks: dlx_parent_parks).
        from celery.concurrency.prefork import TaskPool

        from celery_dlx.worker.settler import hands_over

        prefork = isinstance(getattr(sender, "pool", None), TaskPool)
        runtime.warm(
            listeners=signal is signals.worker_process_init or not prefork or hands_over(app)
        )


signals.worker_process_init.connect(_warm, dispatch_uid="celery_dlx.install.warm")
signals.worker_ready.connect(_warm, dispatch_uid="celery_dlx.install.warm")


# An app that imports celery_dlx (the `celery` command's `dlx` entry point does) but never calls
# install(): the worker says so once at start (ERROR), a producer at its first publish (warning).

#: Apps a producer has looked at (one look per app and process).
_LOOKED_AT: weakref.WeakSet[Celery] = weakref.WeakSet()


def _worker_starting(sender: Any = None, instance: Any = None, **_: Any) -> None:
    app = getattr(instance, "app", None)
    if app is not None and not_installed(app):
        logger.error("%s", not_installed_message(app))


def _first_publish(sender: Any = None, **_: Any) -> None:
    app = app_or_default()
    if app in _INSTALLED or app in _LOOKED_AT:
        return
    _LOOKED_AT.add(app)
    if not_installed(app):
        logger.warning("%s", not_installed_message(app))


signals.celeryd_after_setup.connect(_worker_starting, dispatch_uid="celery_dlx.install.forgotten")
signals.before_task_publish.connect(_first_publish, dispatch_uid="celery_dlx.install.forgotten")


def configure(app: Celery) -> None:
    """Apply the validated settings to ``app`` (called once its configuration is loaded)."""
    runtime = get_runtime(app)
    config = runtime.config
    from celery_dlx.drain.core import register_drain_task

    # Registered even when disabled: `celery dlx` tools and another app's beat may send it.
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
    from celery_dlx.worker.drainer import DrainerStep
    from celery_dlx.worker.events import TaskEventsStep
    from celery_dlx.worker.loopwake import LoopWakeStep
    from celery_dlx.worker.settler import SettlerStep
    from celery_dlx.worker.startup import StartupStep

    # Step registries are sets: configure running again adds nothing.
    app.steps["worker"].update({StartupStep, DrainerStep, SettlerStep, LoopWakeStep})
    app.steps["consumer"].add(TaskEventsStep)
    if config.service_in_worker:
        from celery_dlx.service.bootstep import install_service_step

        install_service_step(app)
    install_integrations(app, runtime)
