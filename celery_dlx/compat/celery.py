"""Celery internals celery_dlx relies on (checked on Celery 5.7.0, installed here, and 5.3.0, the
lowest stack's in ``tests/constraints/lowest.txt``, by reading its sources).

What is here is what Celery's public extension points (a ``Task`` subclass and its
``Task.Request``, bootsteps, the ``worker_consumer`` setting, ``Ignore``/``Reject``) do not offer.
Canaries: ``tests/unit/test_compat.py`` (Celery section) and ``tests/unit/test_compat_canaries.py``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import celery
from billiard.einfo import ExceptionInfo
from celery import Celery, Task
from celery.exceptions import Ignore
from celery.worker.consumer import Consumer
from celery.worker.request import Request
from kombu.message import Message

from celery_dlx.compat.kombu import consumer_tags

if TYPE_CHECKING:
    from celery.worker import WorkController

#: Celery's release as ``(major, minor)``.
CELERY_RELEASE = (int(celery.VERSION[0]), int(celery.VERSION[1]))


# -- the app ---------------------------------------------------------------------------------------


def app_task_or_amqp_made(app: Celery) -> bool:
    """True once ``app.Task`` (the base task class) or ``app.amqp`` (its AMQP helper) was made.

    Internal: both are cached properties of ``Celery``, stored in the instance ``__dict__`` on
    first use; Celery has no public way to ask whether they exist yet, and ``install(app)`` can
    only replace their classes (``task_cls``, ``amqp_cls``) before that.
    """
    return "Task" in app.__dict__ or "amqp" in app.__dict__


# -- the worker ------------------------------------------------------------------------------------


def worker_pool_name(worker: WorkController) -> str:
    """The name of the pool ``worker`` runs (``prefork``, ``solo``, ``thread``...).

    Internal: ``WorkController.pool_cls``, the class ``-P`` or ``worker_pool`` resolved to (``-P``
    does not change the setting, so the setting alone may be wrong).
    """
    pool = getattr(worker, "pool_cls", None)
    return str(getattr(pool, "__module__", "") or "").rsplit(".", 1)[-1]


def task_queue_tags(consumer: object) -> Mapping[str, str]:
    """Queue name to consumer tag of the task queues Celery's worker ``consumer`` consumes.

    Internal: ``Consumer.task_consumer``, the kombu ``Consumer`` the ``Tasks`` bootstep sets.
    """
    return consumer_tags(getattr(consumer, "task_consumer", None))


def default_strategy(task: Task[..., Any], app: Celery, consumer: Any, **kwargs: Any) -> Any:
    """Celery's default strategy of ``task``: the handler of its messages, called as
    ``handler(message, body, ack, reject, callbacks, **kwargs)``.

    Internal: ``celery.worker.strategy.default`` and its handler's signature. ``Task.Strategy``
    names a task's strategy, but what a strategy is called with and returns is not documented.
    """
    from celery.worker.strategy import default

    return default(task, app, consumer, **kwargs)


class ConsumerHooks(Consumer):
    """Celery's worker consumer (the ``worker_consumer`` setting's class) whose hooks call
    celery_dlx's ``dlx_*`` methods of the same purpose.

    Internal: Celery calls these ``Consumer`` methods (none documented as a hook):
    ``connection_for_read``, ``create_task_handler`` (the callback of every delivery),
    ``on_decode_error`` (Celery acks the message: lost), ``on_unknown_message``,
    ``on_unknown_task`` and ``on_invalid_task`` (both reject it into the dead-letter exchange:
    :func:`divert_reject`). Same names and arguments on Celery 5.3.0 and 5.7.0.
    """

    def connection_for_read(self, heartbeat: float | None = None) -> Any:
        connection = self.app.connection_for_read(heartbeat=heartbeat)
        return self.ensure_connected(self.dlx_read_connection(connection))

    def create_task_handler(self, *args: Any, **kwargs: Any) -> Callable[..., object]:
        return self.dlx_task_handler(super().create_task_handler(*args, **kwargs))

    def on_decode_error(self, message: Message, exc: Exception) -> None:
        self.dlx_decode_error(message, exc)

    def on_unknown_message(self, body: object, message: Message) -> None:
        if not self.dlx_unknown_message(message):
            super().on_unknown_message(body, message)

    def on_unknown_task(self, body: object, message: Message, exc: Exception) -> None:
        self.dlx_unknown_task(message, exc)
        super().on_unknown_task(body, message, exc)

    def on_invalid_task(self, body: object, message: Message, exc: Exception) -> None:
        self.dlx_invalid_task(message, exc)
        super().on_invalid_task(body, message, exc)

    # celery_dlx's side: Celery's behaviour unless a subclass says otherwise.

    def dlx_read_connection(self, connection: Any) -> Any:
        """The consuming connection (not yet connected) to use instead of ``connection``."""
        return connection

    def dlx_task_handler(self, handler: Callable[..., object]) -> Callable[..., object]:
        """The callback of every delivery, given Celery's (``handler(message)``)."""
        return handler

    def dlx_decode_error(self, message: Message, exc: Exception) -> None:
        """``message``'s body could not be decoded (Celery logs it and acks it)."""
        super().on_decode_error(message, exc)

    def dlx_unknown_message(self, message: Message) -> bool:
        """``message`` is not a task message; True if handled (Celery's handling then skipped)."""
        return False

    def dlx_unknown_task(self, message: Message, exc: Exception) -> None:
        """Before Celery's handling of a message naming a task it does not know."""

    def dlx_invalid_task(self, message: Message, exc: Exception) -> None:
        """Before Celery's handling of an invalid task message."""


def divert_reject(message: Message, reject: Callable[..., None]) -> None:
    """Make Celery's coming ``message.reject_log_error(logger, errors)`` call ``reject`` instead.

    Internal: Celery's ``Consumer.on_unknown_message``, ``on_unknown_task`` and
    ``on_invalid_task`` reject the message with ``reject_log_error`` in the middle of their work
    (logging, result state, events, signals), with no hook to decide otherwise; only the reject
    is replaced, on this one message, by ``reject(logger, errors, requeue=False)``.
    """
    message.reject_log_error = reject  # type: ignore[method-assign]  # the patch itself


# -- the request of a task -------------------------------------------------------------------------


class NotifyingRequest(Request):
    """Celery's ``Request`` (a task's ``Task.Request``) that calls :meth:`after_ack_or_reject`
    once it has asked for its message's ack or reject.

    Internal: ``Request.acknowledge`` and ``Request.reject``, which Celery calls itself when a
    run ends; its docs offer ``on_timeout`` and ``on_failure`` of a custom request, not these.
    """

    def acknowledge(self) -> None:
        super().acknowledge()
        self.after_ack_or_reject()

    def reject(self, requeue: bool = False) -> None:
        super().reject(requeue=requeue)
        self.after_ack_or_reject()

    def after_ack_or_reject(self) -> None:
        """Called once the ack or reject is asked for (scheduled on the worker's event loop)."""


def set_request_header(request: Request, name: str, value: object) -> None:
    """Give the run of ``request`` a header ``name`` (its ``task.request.<name>``).

    Internal: ``Request.request_dict``, the message's headers that Celery turns into the run's
    ``task.request`` (the same dict on Celery 5.3.0 and 5.7.0).
    """
    request.request_dict[name] = value


def divert_acknowledge(request: Request, instead: Callable[[], None]) -> None:
    """Make the next ``request.acknowledge()`` call ``instead()``, once; later calls are
    Celery's (or the request class's) own ``acknowledge`` again.

    Internal: Celery acks a run that ended with ``Ignore`` inside ``Request.on_failure``, with no
    argument to hold the ack back; the method is shadowed on this request object only, and the
    shadow removed before ``instead`` runs.
    """

    def once() -> None:
        del request.__dict__["acknowledge"]
        instead()

    request.__dict__["acknowledge"] = once


def acknowledge_from_thread(request: Request) -> None:
    """Ack ``request``'s message from a thread of celery_dlx's, not the worker's event loop.

    Internal: ``Request.acknowledge`` hands the ack to the event loop with ``Consumer.call_soon``
    (``call_soon_ack`` in later releases), kombu's ``Hub.call_soon``, not documented as safe from
    other threads: it appends to a deque (atomic), and from kombu 5.7 wakes the loop
    (:func:`~celery_dlx.compat.kombu.hub_wakes_for_other_threads`; before,
    ``celery_dlx.worker.loopwake`` wakes it).
    """
    request.acknowledge()


def reject_from_thread(request: Request, *, requeue: bool) -> None:
    """Reject ``request``'s message from a thread of celery_dlx's (as
    :func:`acknowledge_from_thread`)."""
    request.reject(requeue=requeue)


# -- the task --------------------------------------------------------------------------------------


def push_request_keeping_fields(task: Task[..., Any], *args: Any, **kwargs: Any) -> None:
    """Celery 5.5's ``Task.push_request``: the pushed request keeps the current one's fields.

    Version gate (Celery 5.3.0 and 5.7.0 checked): from 5.5, Celery's own ``push_request`` does
    this. Before, the task body run by a ``__call__`` of its own (as DLXTask's) saw an empty
    request (id None, retries 0) in eager mode and in-process workers, so the fields are copied
    from the current request's ``__dict__`` (internal: where ``Context`` keeps them), as 5.5 does.
    """
    if CELERY_RELEASE >= (5, 5):
        Task.push_request(task, *args, **kwargs)
        return
    from celery.app.task import Context

    task.request_stack.push(Context(*args, **{**task.request.__dict__, **kwargs}))


#: Where :class:`TracerHook` keeps the tracer Celery gives a task (the task's own attribute).
_TRACER_KEY = "_dlx_tracer"


class TracerHook:
    """A ``Task`` mixin: the tracer Celery's worker gives the task becomes
    :func:`settling_tracer` of it when :meth:`_dlx_settles_runs` says so.

    Internal: ``Task.__trace__``, which the worker sets to ``build_tracer(...)`` before a task's
    first run and calls for each run (``celery.app.trace``); a property sees it as it is set.
    """

    def _dlx_settles_runs(self) -> bool:
        """Whether this task's runs may end settled (acked without a traceback); False here."""
        return False

    @property
    def __trace__(self) -> Tracer | None:
        """Celery's tracer of this task in a worker (see :class:`TracerHook`)."""
        return tracer_of(self)

    @__trace__.setter
    def __trace__(self, tracer: Tracer | None) -> None:
        if tracer is not None and self._dlx_settles_runs():
            tracer = settling_tracer(tracer)
        self.__dict__[_TRACER_KEY] = tracer


def tracer_of(task: object) -> Tracer | None:
    """The tracer Celery's worker set on ``task`` (a :class:`TracerHook`), if any."""
    tracer: Tracer | None = task.__dict__.get(_TRACER_KEY)
    return tracer


# -- a requeued or parked run ends without a traceback ---------------------------------------------


class RunSettled(BaseException):
    """Ends a DLX task's run once celery_dlx has carried out its requeue or park.

    Celery's tracer turns an exception that ends a run into billiard ``ExceptionInfo``s (two for
    an ``Ignore``, one for a ``Retry``), each copying every position of Celery's long
    ``trace_task`` and formatting the traceback, and a prefork pool process pickles one (about
    35 KB) to its parent. A ``BaseException`` is let through instead, after the tracer's own
    cleanup (``task_postrun``, the task and request stacks, ``process_cleanup``), to
    :func:`settling_tracer`. Raised only under that tracer.

    ``handover``: what the pool's parent still has to do before the message is acked (a park,
    batched: ``celery_dlx.worker.settler``); it reaches the parent's ``Request.on_failure`` as a
    :class:`HandedOver` (an ``Ignore``).
    """

    def __init__(self, handover: object = None) -> None:
        super().__init__()
        self.handover = handover


class HandedOver(Ignore):
    """The ``Ignore`` that ends a settled run whose settling the pool's parent finishes: its
    ``handover`` goes with the run's result to the parent (pickled by a prefork pool process)."""

    def __init__(self, handover: object = None) -> None:
        super().__init__(handover)
        self.handover = handover


class _IgnoredInfo(ExceptionInfo):
    """billiard's ``ExceptionInfo`` of an ``Ignore``, without a traceback to copy or format."""

    def __init__(self, handover: object = None) -> None:
        self.type = Ignore  # type: ignore[misc]  # billiard-stubs: a class attribute, not a property
        self.exception = Ignore() if handover is None else HandedOver(handover)
        self.tb = None
        self.traceback = ""
        self.internal = True


_SETTLING_ATTR = "celery_dlx_settling"
#: A Celery tracer: ``(task_id, args, kwargs, request) -> trace_ok_t``.
Tracer = Callable[..., Any]


def settling_tracer(tracer: Tracer) -> Tracer:
    """``tracer`` (Celery's tracer of one task), reporting a run ended by :class:`RunSettled` as
    a run ended by ``Ignore``: the pool's parent acks the message, and does nothing else.

    Internals: the worker runs a task through ``task.__trace__(uuid, args, kwargs, request)``,
    set to ``build_tracer(...)``; a tracer returns ``trace_ok_t(retval, info, runtime, retstr)``;
    a run with an ``info`` is reported as failed, and the parent's ``Request.on_failure`` reads
    ``retval.exception``: an ``Ignore`` is acked. Unlike Celery's ``Ignore``: ``task_postrun``
    receivers see ``state=None``, no ``Task ... ignored`` line is logged (celery_dlx logs the
    fate), and sentry-sdk marks the run's transaction ``internal_error``, not ``aborted``.
    """
    from celery import states
    from celery.app.trace import TraceInfo, trace_ok_t

    if settles(tracer):
        return tracer

    def trace(uuid: str, args: Any, kwargs: Any, request: Any = None) -> Any:
        started = time.monotonic()
        try:
            return tracer(uuid, args, kwargs, request)
        except RunSettled as settled:
            info = TraceInfo(states.IGNORED, Ignore())
            einfo = _IgnoredInfo(settled.handover)
            return trace_ok_t(einfo, info, time.monotonic() - started, None)

    setattr(trace, _SETTLING_ATTR, True)
    return trace


def settles(tracer: object) -> bool:
    """True for a tracer made by :func:`settling_tracer` (one that catches :class:`RunSettled`)."""
    return bool(getattr(tracer, _SETTLING_ATTR, False))
