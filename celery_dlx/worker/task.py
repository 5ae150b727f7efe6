"""``DLXTask``: a Celery task whose failures become fates (requeued, parked or buried).

The decision is :func:`celery_dlx.policy.decide.decide`; this module carries it out inside the worker
child: a requeue publishes a confirmed copy at the tail of the same queue, a park stores the copy
in Redis, a burial stashes the cause for the DLX service and rejects the message into the queue's
dead-letter exchange. The run then ends with ``Ignore`` (the original is acked) or ``Reject``.
"""

from __future__ import annotations

import logging
import socket
import traceback as tb
from dataclasses import dataclass
from typing import Any, ClassVar

from billiard.einfo import ExceptionInfo
from celery import Celery, Task, signals
from celery.exceptions import Ignore, Reject, Retry

from celery_dlx import fates
from celery_dlx.errors import MalformedHeader
from celery_dlx.fates import FateEvent, FateRequest, Park, now_ms
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.copies import celery_copy, delivery_headers
from celery_dlx.message.headers import (
    DLXState,
    HistoryEntry,
    dead_letter_refusal,
    exception_type_name,
    fingerprint,
    message_identity,
    read_state,
)
from celery_dlx.message.names import (
    DELIVERY_QUEUE_HEADER,
    QUEUE_HEADER,
    REASON_HEADER,
    REPLAYED_HEADER,
)
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.decide import ToBury, ToPark, ToRequeue, decide
from celery_dlx.policy.options import TaskOptions, resolve_task_options
from celery_dlx.store.causes import stash_cause
from celery_dlx.worker.runtime import Runtime, get_runtime

logger = logging.getLogger(__name__)


#: Tasks with these name prefixes are never DLX tasks through the ``dlx_enabled`` flag.
INTERNAL_TASK_PREFIXES = ("celery.", "celery_dlx.")


class Redelivered(Exception):
    """The broker redelivered this message: the worker running it died or lost its connection."""


@dataclass
class Delivery:
    """What the worker knows about the message being run."""

    headers: dict[str, Any]
    queue: str
    message_id: str
    redelivered: bool
    state: DLXState
    problem: str | None
    x_death_problem: str | None


def _delivery(task: Task[Any, Any]) -> Delivery:
    req = task.request
    headers = delivery_headers(req)
    info = req.delivery_info or {}
    problem = None
    try:
        state = read_state(headers)
    except MalformedHeader as exc:
        state, problem = DLXState(), f"malformed header: {exc}"
    x_problem = dead_letter_refusal(headers)
    queue = (
        headers.get(DELIVERY_QUEUE_HEADER)
        or state.queue
        or (info.get("routing_key") if not info.get("exchange") else None)
        or task.app.conf.task_default_queue
    )
    if isinstance(queue, bytes):
        queue = queue.decode("utf-8", "replace")
    return Delivery(
        headers=headers,
        queue=str(queue),
        message_id=str(req.id or message_identity(req.properties, headers, b"")),
        redelivered=bool(info.get("redelivered")),
        state=state,
        problem=problem or x_problem,
        x_death_problem=x_problem,
    )


def _options(task: DLXTask, runtime: Runtime, queue: str) -> TaskOptions:
    cache = task.__class__.__dict__.get("_dlx_options_cache")
    if cache is None:
        cache = {}
        task.__class__._dlx_options_cache = cache
    key = (id(runtime.config), queue)
    options: TaskOptions | None = cache.get(key)
    if options is None:
        options = cache[key] = resolve_task_options(task.__class__, runtime.config, queue)
    return options


def _root(exc: BaseException) -> BaseException:
    """The failure to name: the exception a ``Park`` from ``retry(exc=...)`` wraps, else ``exc``."""
    if isinstance(exc, FateRequest) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


class DLXTask(Task[Any, Any]):
    """A task whose failures are requeued at the tail, parked in Redis, or buried.

    Options (class attributes or ``@app.task(...)`` keywords; each falls back to the ``dlx_*``
    setting of the same name): ``dlx_requeue_on``, ``dlx_park_on``, ``dlx_bury_on`` (exception
    classes or predicates), ``dlx_backoff``, ``dlx_max_requeues``, ``dlx_max_parks``,
    ``dlx_importance``. Task code may raise :class:`celery_dlx.Requeue`,
    :class:`celery_dlx.Park` or :class:`celery_dlx.Bury`; ``self.retry(countdown=...)`` parks.
    """

    #: Ack only after the fate is settled; a crash redelivers the message (counted as an attempt).
    # celery-types says bool for two of them; Celery's Task defaults them to None (read from the
    # app's config), as AutoDLXTask does.
    acks_late: bool | None = True  # type: ignore[assignment]
    reject_on_worker_lost: bool | None = True
    acks_on_failure_or_timeout: bool | None = False  # type: ignore[assignment]
    acks_on_failure: bool | None = False
    acks_on_timeout: bool | None = False
    Strategy = "celery_dlx.worker.strategy:dlx_strategy"

    #: True on DLXTask (explicit opt-in); AutoDLXTask follows the ``dlx_enabled`` setting.
    _dlx_always = True

    #: Resolved options per (config, queue), kept on each task class itself (see ``_options``).
    _dlx_options_cache: ClassVar[dict[tuple[int, str], TaskOptions]]

    dlx_requeue_on: object = None
    dlx_park_on: object = None
    dlx_bury_on: object = None
    dlx_backoff: object = None
    dlx_max_requeues: object = None
    dlx_max_parks: object = None
    dlx_importance: object = None

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        # Validate options when the task is bound (worker start, first producer use), not at the
        # first failure in production.
        if getattr(cls, "name", None) and cls._dlx_enabled_for(app):
            resolve_task_options(cls, get_runtime(app).config)

    @classmethod
    def _dlx_enabled_for(cls, app: Celery) -> bool:
        if cls._dlx_always:
            return True
        # Celery's built-in tasks and celery_dlx's own keep plain Celery semantics.
        name = getattr(cls, "name", None) or ""
        if name.startswith(INTERNAL_TASK_PREFIXES):
            return False
        return bool(get_runtime(app).config.enabled)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        req = self.request
        if req.called_directly or req.is_eager or not self._dlx_enabled_for(self.app):
            return super().__call__(*args, **kwargs)
        runtime = get_runtime(self.app)
        delivery = _delivery(self)
        if delivery.problem:
            self._quarantine(runtime, delivery, delivery.problem)
        if delivery.redelivered:
            self._fail(
                runtime,
                delivery,
                Redelivered(
                    "redelivered by the broker: the worker died or lost its connection mid-task"
                ),
                None,
            )
        try:
            result = super().__call__(*args, **kwargs)
        except (Ignore, Reject, Retry):
            raise
        except Exception as exc:
            self._fail(runtime, delivery, exc, ExceptionInfo())
        # A replay resets the attempts; its success is a recovery all the same (the canary of
        # `celery dlx replay --canary` waits for it).
        if delivery.state.attempt > 0 or REPLAYED_HEADER in delivery.headers:
            self._record_recovery(runtime, delivery)
        return result

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Any = None,
        throw: bool = True,
        eta: Any = None,
        countdown: Any = None,
        max_retries: Any = None,
        **options: Any,
    ) -> Any:
        """Park the message instead of holding an ETA retry in worker memory.

        ``countdown`` (or ``eta``) becomes the park delay; the park budget replaces
        ``max_retries``. Outside a DLX worker run (eager, direct call) this is Celery's retry.
        """
        req = self.request
        if req.called_directly or req.is_eager or not self._dlx_enabled_for(self.app):
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        delay = countdown
        if delay is None and eta is not None:
            delay = max(0.0, (eta - self.app.now()).total_seconds())
        park = Park(countdown=delay, message=str(exc) if exc else "retry requested")
        if isinstance(exc, BaseException):
            raise park from exc
        raise park

    def _fail(
        self, runtime: Runtime, delivery: Delivery, exc: BaseException, einfo: ExceptionInfo | None
    ) -> None:
        options = _options(self, runtime, delivery.queue)
        decision = decide(exc, delivery.state, options.policy)
        root = _root(exc)
        exc_type = exception_type_name(root)
        exc_message = str(root)
        cause = fingerprint(self.name, exc_type, exc_message)
        at = now_ms()
        if isinstance(decision, ToBury):
            self._bury(
                runtime,
                delivery,
                options,
                decision.reason,
                exc_type,
                exc_message,
                cause,
                einfo,
                at,
                root,
            )
        fate = fates.REQUEUED if isinstance(decision, ToRequeue) else fates.PARKED
        state = delivery.state.after_failure(
            fate=fate,
            at_ms=at,
            cause=cause,
            queue=delivery.queue,
            exc_type=exc_type,
            exc_message=exc_message,
        )
        copy = celery_copy(
            self.request,
            state=state,
            routing_key=delivery.queue,
            default_serializer=self.serializer or self.app.conf.task_serializer,
        )
        delay: float | None = None
        try:
            if isinstance(decision, ToPark):
                delay = decision.delay
                runtime.park(
                    ParkedMessage(
                        message_id=delivery.message_id,
                        attempt=state.attempt,
                        queue=delivery.queue,
                        body=copy.body,
                        headers=copy.headers,
                        properties=copy.properties,
                        due_ms=at + int(delay * 1000),
                        parked_ms=at,
                        task=self.name,
                        cause=cause,
                    )
                )
            else:
                runtime.publisher.publish(copy)
        except Exception as err:
            self._fallback(runtime, delivery, fate, err)
        event = FateEvent(
            fate=fate,
            queue=delivery.queue,
            message_id=delivery.message_id,
            attempt=state.attempt,
            task=self.name,
            cause=cause,
            exc_type=exc_type,
            exc_message=exc_message[:500],
            reason=decision.reason,
            delay=delay,
            importance=options.importance,
            first_failure_ms=state.first_failure_ms,
            at_ms=at,
        )
        try:
            runtime.record(event)
        except Exception as err:
            # The copy is out (published or parked): failing the run now would dead-letter the
            # original as well, and the message would live twice.
            logger.warning(
                "could not record the %s fate of %s[%s] in the history: %r",
                fate,
                self.name,
                delivery.message_id,
                err,
            )
        self._mark_retry(root, einfo)
        raise Ignore()

    def _fallback(self, runtime: Runtime, delivery: Delivery, fate: str, err: Exception) -> None:
        """The copy could not be stored or published: hand the original to the dead-letter path.

        The DLX service applies the queue's policy once Redis and the broker answer again, so
        nothing is lost. A message with a malformed x-death must never be dead-lettered by
        reject (RabbitMQ 3.10 crashes the queue on it): it goes back to its queue instead.
        """
        logger.warning(
            "could not %s %s[%s] (%r); handing it to the dead-letter path",
            "park" if fate == fates.PARKED else "requeue",
            self.name,
            delivery.message_id,
            err,
        )
        runtime.reset_publisher()
        if delivery.x_death_problem:
            raise Reject(err, requeue=True)
        raise Reject(err, requeue=False)

    def _bury(
        self,
        runtime: Runtime,
        delivery: Delivery,
        options: TaskOptions,
        reason: str,
        exc_type: str,
        exc_message: str,
        cause: str,
        einfo: ExceptionInfo | None,
        at: int,
        root: BaseException,
    ) -> None:
        record = CauseRecord(
            task=self.name,
            queue=delivery.queue,
            message_id=delivery.message_id,
            attempt=delivery.state.attempt + 1,
            cause=cause,
            exc_type=exc_type,
            exc_message=exc_message,
            reason=reason,
            importance=options.importance,
            traceback=(einfo.traceback or "")
            if einfo is not None
            else "".join(tb.format_exception_only(type(root), root)),
            history=(*delivery.state.history, HistoryEntry(at, fates.BURIED, cause)),
            first_failure_ms=delivery.state.first_failure_ms or at,
            at_ms=at,
            hostname=self.request.hostname or socket.gethostname(),
        )
        try:
            stash_cause(
                runtime.redis, runtime.keys, delivery.message_id, record, runtime.config.cause_ttl
            )
        except Exception as err:  # the DLX service still buries it, with the x-death reason only
            logger.warning(
                "could not stash the cause of %s[%s]: %r", self.name, delivery.message_id, err
            )
        if delivery.x_death_problem:
            self._publish_to_graveyard(runtime, delivery, reason)
        raise Reject(root, requeue=False)  # type: ignore[arg-type]  # Celery takes any reason

    def _quarantine(self, runtime: Runtime, delivery: Delivery, reason: str) -> None:
        """Bury a message whose headers cannot be trusted, by publishing a clean copy."""
        at = now_ms()
        record = CauseRecord(
            task=self.name,
            queue=delivery.queue,
            message_id=delivery.message_id,
            attempt=delivery.state.attempt,
            cause=fingerprint(self.name, "Quarantined", reason),
            exc_type="Quarantined",
            exc_message=reason,
            reason=f"undecodable: {reason}",
            importance=_options(self, runtime, delivery.queue).importance,
            traceback="",
            history=(HistoryEntry(at, fates.BURIED, "quarantined"),),
            first_failure_ms=at,
            at_ms=at,
            hostname=self.request.hostname or socket.gethostname(),
        )
        try:
            stash_cause(
                runtime.redis, runtime.keys, delivery.message_id, record, runtime.config.cause_ttl
            )
        except Exception as err:
            logger.warning(
                "could not stash the cause of %s[%s]: %r", self.name, delivery.message_id, err
            )
        self._publish_to_graveyard(runtime, delivery, f"undecodable: {reason}")

    def _publish_to_graveyard(self, runtime: Runtime, delivery: Delivery, reason: str) -> None:
        copy = celery_copy(
            self.request,
            state=DLXState(attempt=delivery.state.attempt, queue=delivery.queue),
            routing_key=delivery.queue,
            exchange=runtime.config.exchange,
            default_serializer=self.serializer or self.app.conf.task_serializer,
            extra_headers={REASON_HEADER: reason, QUEUE_HEADER: delivery.queue},
        )
        try:
            runtime.publisher.publish(copy)
        except Exception as err:
            # Never reject it into a dead-letter exchange; put it back and try again later.
            logger.warning(
                "could not bury %s[%s] by publishing (%r); returning it to its queue",
                self.name,
                delivery.message_id,
                err,
            )
            runtime.reset_publisher()
            raise Reject(err, requeue=True) from err
        # The DLX service logs (and alerts on) the burial itself, once, with the obituary.
        logger.warning(
            "quarantined %s[%s] attempt=%d queue=%s reason=%s: sent to the graveyard",
            self.name,
            delivery.message_id,
            delivery.state.attempt,
            delivery.queue,
            reason,
        )
        raise Ignore()

    def _mark_retry(self, exc: BaseException, einfo: ExceptionInfo | None) -> None:
        """Result state RETRY and the ``task_retry`` signal, as for Celery's own retry."""
        req = self.request
        if not (self.ignore_result or req.ignore_result):
            try:
                # celery-types: Celery stores any exception; a worker run always has an id.
                self.backend.mark_as_retry(
                    req.id,  # type: ignore[arg-type]
                    exc,  # type: ignore[arg-type]
                    einfo.traceback if einfo else None,
                    request=req,
                )
            except Exception:  # a result backend outage must not change the fate
                logger.debug("could not store RETRY state for %s", req.id, exc_info=True)
        signals.task_retry.send(sender=self, request=req, reason=exc, einfo=einfo)

    def _record_recovery(self, runtime: Runtime, delivery: Delivery) -> None:
        try:
            runtime.record(
                FateEvent(
                    fate=fates.RECOVERED,
                    queue=delivery.queue,
                    message_id=delivery.message_id,
                    attempt=delivery.state.attempt,
                    task=self.name,
                    cause=delivery.state.cause or "",
                    exc_type=delivery.state.exc_type or "",
                    importance=_options(self, runtime, delivery.queue).importance,
                    first_failure_ms=delivery.state.first_failure_ms,
                )
            )
        except Exception:  # the task succeeded; a history outage must not fail it
            logger.warning(
                "could not record recovery of %s[%s]", self.name, delivery.message_id, exc_info=True
            )


class AutoDLXTask(DLXTask):
    """The app's base task under ``celery_dlx.install(app)``: a DLX task when ``dlx_enabled``."""

    _dlx_always = False
    acks_late = None
    reject_on_worker_lost = None
    acks_on_failure_or_timeout = None
    acks_on_failure = None
    acks_on_timeout = None
    Strategy = "celery.worker.strategy:default"

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        if cls._dlx_enabled_for(app):
            for attr, value in (
                ("acks_late", True),
                ("reject_on_worker_lost", True),
                ("acks_on_failure_or_timeout", False),
                ("acks_on_failure", False),
                ("acks_on_timeout", False),
                ("Strategy", DLXTask.Strategy),
            ):
                setattr(cls, attr, value)
        super().on_bound(app)
