"""The only place celery_dlx touches private internals of Celery, Kombu, py-amqp and sentry-sdk.

Each function below names the internal it relies on and why no public API does the job.
``tests/unit/test_compat.py`` checks every one of them against the installed libraries, so an
upgrade that removes or changes one fails there, with the library and version named, instead of
in production. Internals replaced by public APIs (and no longer used): Celery's
``Queues._add`` (``Queues.add``/``add_compat`` are overridden instead), ``celery._state``
(``celery.current_task``), redis-py's ``Script.sha`` (redis-py computes it; ``script_load``
alone loads the script), and Celery's ``Backend._get_result_meta``, which celery_dlx wrapped
class-wide to add its details of a run to the stored meta (the task stores them itself beside the
result: ``celery_dlx.results``).

celery_dlx replaces no function of the standard library, Celery, kombu, billiard, py-amqp or
redis-py process-wide; where their code is slow or wrong for celery_dlx, it works around it in
its own code (``docs/upstream.md`` proposes the fixes upstream). Gone for that reason, besides
the wrap above: the shared and sparse code positions of billiard's traceback copies and the
cached positions and carets of ``traceback`` (a requeue or park no longer makes Celery build a
traceback at all: :func:`settling_tracer`), and py-amqp's basic-properties decoder, which
celery_dlx replaced for the whole process to survive properties that are not UTF-8: its own frame
reader now goes to its own connections only (``celery_dlx/broker/frames.py``, through py-amqp's
``Connection(frame_handler=...)``; the py-amqp internals it relies on are checked in
``tests/unit/test_amqp_compat.py``).
"""

from __future__ import annotations

import functools
import inspect
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from billiard.einfo import ExceptionInfo
from celery import Celery
from celery.exceptions import Ignore
from kombu import Queue
from kombu.message import Message

if TYPE_CHECKING:
    from sentry_sdk.types import Event, Hint


#: ``(name, type)`` pairs of kombu ``Object.attrs``: the attributes a copy keeps (kombu's type).
QueueAttrs = tuple[tuple[str, Any], ...]
#: The type of one such attribute: a converter its value goes through, or None to keep it as is.
AttrType = Callable[[object], object] | None


# -- kombu -----------------------------------------------------------------------------------------


def queue_attrs(*extra: tuple[str, AttrType]) -> QueueAttrs:
    """kombu ``Queue.attrs`` followed by ``extra``, for a ``Queue`` subclass with more fields.

    Internal: kombu copies a queue on every bind (``Object.__copy__`` rebuilds it from
    ``as_dict()``, which lists ``attrs``); a subclass attribute not in ``attrs`` is lost by the
    copy the worker declares.
    """
    return (*Queue.attrs, *extra)


def consumer_tags(consumer: object) -> Mapping[str, str]:
    """Queue name to consumer tag of a kombu ``Consumer`` (empty when it consumes nothing).

    Internal: ``kombu.Consumer._active_tags``. AMQP deliveries name their consumer tag, not their
    queue, and kombu keeps the tag it chose per queue only there.
    """
    tags = getattr(consumer, "_active_tags", None)
    return {str(queue): str(tag) for queue, tag in tags.items()} if tags else {}


def serializer_name(content_type: str) -> str | None:
    """kombu's serializer name (``json``, ``pickle``...) for ``content_type``, if registered.

    Internal: ``kombu.serialization.registry.type_to_name``; kombu's public ``dumps`` takes a
    serializer name, and nothing public maps a message's content type back to it.
    """
    from kombu import serialization

    # celery-types omits the module-level `registry` (it is not in kombu's __all__).
    registry = serialization.registry  # type: ignore[attr-defined]
    name = registry.type_to_name.get(content_type)
    return None if name is None else str(name)


# -- celery ----------------------------------------------------------------------------------------


def app_task_or_amqp_made(app: Celery) -> bool:
    """True once ``app.Task`` (the base task class) or ``app.amqp`` (its AMQP helper) was made.

    Internal: both are cached properties of ``Celery``, stored in the instance ``__dict__`` on
    first use; Celery has no public way to ask whether they exist yet, and ``install(app)`` can
    only replace their classes (``task_cls``, ``amqp_cls``) before that.
    """
    return "Task" in app.__dict__ or "amqp" in app.__dict__


def divert_reject(message: Message, reject: Callable[..., None]) -> None:
    """Make Celery's coming ``message.reject_log_error(logger, errors)`` call ``reject`` instead.

    Internal: Celery's ``Consumer.on_unknown_message``, ``on_unknown_task`` and
    ``on_invalid_task`` reject (dead-letter) the message with ``reject_log_error`` in the middle
    of their work (logging, result state, events, signals), with no hook to decide otherwise.
    celery_dlx keeps all that work and replaces only the reject, on this one message object.
    ``reject`` is called as ``reject(logger, errors, requeue=False)``.
    """
    message.reject_log_error = reject  # type: ignore[method-assign]  # the patch itself


# -- sentry-sdk -----------------------------------------------------------------------------------


def add_sentry_event_processor_once(processor: Callable[[Event, Hint], Event | None]) -> None:
    """Add ``processor`` to sentry-sdk's global event processors unless it is there already.

    Internal: ``sentry_sdk.scope.global_event_processors``; the public
    ``add_global_event_processor`` appends unconditionally, and installing celery_dlx into
    several apps of one process must not run the processor several times per event.
    """
    from sentry_sdk import scope

    if processor not in scope.global_event_processors:
        scope.add_global_event_processor(processor)


# -- Celery: a requeued or parked run ends without a traceback ------------------------------------


class RunSettled(BaseException):
    """Ends a DLX task's run once celery_dlx has carried out its requeue or park.

    Celery's tracer turns every exception that ends a run into billiard ``ExceptionInfo``s: two
    for an ``Ignore`` (the run's result, and one for a line logged at INFO), one for a ``Retry``,
    each copying every position of Celery's long ``trace_task`` and formatting the traceback; a
    prefork pool process then pickles one of them (about 35 KB) to its parent. A
    ``BaseException`` is let through instead (``except BaseException: raise``), after the tracer's
    own cleanup (``task_postrun``, the task and request stacks, ``process_cleanup``), to
    :func:`settling_tracer`. Raised only under that tracer.

    ``handover``: what the pool's parent still has to do before the message is acked (a park it
    writes to Redis, batched with other runs' parks: ``celery_dlx.worker.settler``); it reaches
    the parent's ``Request.on_failure`` as a :class:`HandedOver` (an ``Ignore``).
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

    Internals: Celery's worker runs a task through its ``task.__trace__(uuid, args, kwargs,
    request)``, which it sets to ``build_tracer(...)`` (the consumer for the solo and thread
    pools, every prefork pool process when it starts); a tracer returns ``trace_ok_t(retval,
    info, runtime, retstr)``; a run with an ``info`` is reported as failed, and the parent's
    ``Request.on_failure`` reads ``retval.exception``: an ``Ignore`` is acked. What differs from
    Celery's ``Ignore``: ``task_postrun`` receivers see ``state=None`` (as for any
    ``BaseException``), no ``Task ... ignored`` line is logged at INFO (celery_dlx logs the
    fate), and sentry-sdk marks the run's transaction (performance monitoring only)
    ``internal_error`` instead of ``aborted``.
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


# -- version gates: behaviour that differs between the releases setup.cfg allows ------------------
# Each is checked on both sides by the matrix (tox.ini; docs/compatibility.md) and by
# tests/unit/test_compat_versions.py.


@functools.cache
def _requires_argument(function: Callable[..., object], name: str) -> bool:
    parameter = inspect.signature(function).parameters.get(name)
    return parameter is not None and parameter.default is inspect.Parameter.empty


@functools.cache
def _accepts_keyword(function: Callable[..., object], name: str) -> bool:
    return name in inspect.signature(function).parameters


def pool_connection(pool: Any) -> Any:
    """A connection from redis-py's connection ``pool`` (given back with ``pool.release``).

    Version gate (redis-py 5.0.0-8.1.0 checked): before 5.3, ``ConnectionPool.get_connection``
    requires a command name (which it ignores); from 5.3 the name is deprecated and warns.
    """
    if _requires_argument(type(pool).get_connection, "command_name"):
        return pool.get_connection("WAIT")
    return pool.get_connection()


def read_reply(connection: Any, timeout: float) -> Any:
    """The next reply on redis-py ``connection``, waiting at most ``timeout`` seconds for it.

    Version gate (redis-py 5.0.0-8.1.0 checked): ``Connection.read_response(timeout=)`` is new in
    redis-py 8.0; before, ``can_read(timeout)`` waits for the reply, then ``read_response()``
    reads it (with the connection's own socket timeout, the reply being there already).

    Raises:
        redis.TimeoutError: no reply within ``timeout`` seconds.
    """
    if _accepts_keyword(type(connection).read_response, "timeout"):
        return connection.read_response(timeout=timeout)
    if not connection.can_read(timeout=timeout):
        from redis.exceptions import TimeoutError as RedisTimeout

        raise RedisTimeout(f"no reply from Redis within {timeout:g} seconds")
    return connection.read_response()


def hub_wakes_for_other_threads() -> bool:
    """True when kombu's ``Hub.call_soon``, called from another thread than the loop's, makes
    the loop's poll return (so an ack a thread asks for is written at once).

    Feature detection (kombu 5.3.0, 5.3.4 and 5.6.2 checked: no; 5.7.0: yes): kombu 5.7 gave its
    ``Hub`` a socket pair written by ``call_soon`` from other threads (``Hub._create_waker``, a
    private name: no public attribute says so). Before, such a callback waited for the loop's
    next event or timer, up to ten seconds.
    """
    from kombu.asynchronous.hub import Hub

    return hasattr(Hub, "_create_waker")
