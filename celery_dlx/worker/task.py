"""``DLXTask``: a Celery task whose failures become fates (requeued, parked or buried).

:func:`celery_dlx.policy.decide.plan_failure` decides without I/O; ``DLXTask._fail`` carries it
out in the worker child. A requeue publishes a confirmed copy at the tail of the queue, a park
stores it in Redis (both are Celery retries: the copy's ``request.retries`` is one more) and the
run ends as ``Ignore`` does, without a traceback (:class:`celery_dlx.compat.RunSettled`). A
burial stashes the cause for the DLX service and fails the run with the task's own exception
(FAILURE, errbacks, ``task_failure`` once, as plain Celery), rejecting it into the dead-letter
exchange.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import socket
import time
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn

from billiard.einfo import ExceptionInfo
from celery import Celery, Task, signals
from celery.backends.base import DisabledBackend
from celery.exceptions import Ignore, MaxRetriesExceededError, Reject, Retry
from celery.utils.imports import symbol_by_name

from celery_dlx import fates, faults
from celery_dlx.broker.copies import celery_copy
from celery_dlx.compat.celery import (
    RunSettled,
    TracerHook,
    push_request_keeping_fields,
    settles,
    tracer_of,
)
from celery_dlx.errors import MalformedHeader
from celery_dlx.fates import BURIED, Bury, FateEvent, now_ms
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.failure import Failure
from celery_dlx.message.headers import DLXState, HistoryEntry, fingerprint, read_state
from celery_dlx.message.lineage import follows, lineage, next_park_id
from celery_dlx.message.names import (
    EXC_MESSAGE_LIMIT,
    HISTORY_LIMIT,
    HOLDS_HEADER,
    QUEUE_HEADER,
    REASON_HEADER,
    REPLAYED_HEADER,
)
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.outages import OutageLog, outage_log
from celery_dlx.policy.breaker import HELD_HEADER
from celery_dlx.policy.decide import FailurePlan, ToBury, plan_failure
from celery_dlx.policy.options import TaskOptions, resolve_task_options
from celery_dlx.results import store_details
from celery_dlx.wiring.errors import STORE_ERRORS, RetryPending
from celery_dlx.wiring.runtime import Runtime, get_runtime
from celery_dlx.worker.breaker import Held, close_breaker, hold_failure
from celery_dlx.worker.delivery import Delivery, read_delivery
from celery_dlx.worker.einfo import LazyExceptionInfo, task_traceback
from celery_dlx.worker.marks import mark_made, mark_pending, patience_of, patiently
from celery_dlx.worker.retrying import RetryPark, retry_arguments, signature_error
from celery_dlx.worker.settler import (
    Handover,
    ParkHandover,
    RequeueHandover,
    hands_over,
    send_to_service,
)

if TYPE_CHECKING:
    from datetime import datetime

logger = logging.getLogger(__name__)


#: Marks an exception whose failure became a fate (``integrations.sentry.HANDLED_ATTR``, which
#: this layer cannot import).
HANDLED_FATE_ATTR = "__celery_dlx_fate__"

#: Attribute of ``self.request`` holding the run's details until stored (``celery_dlx.results``).
DETAILS_ATTR = "dlx_details"

#: Tasks with these name prefixes are never DLX tasks through the ``dlx_enabled`` flag.
INTERNAL_TASK_PREFIXES = ("celery.", "celery_dlx.")


class Redelivered(Exception):
    """The broker redelivered this message: its worker died or lost its connection."""


def _options(task: DLXTask, runtime: Runtime, queue: str) -> TaskOptions:
    cache = task.__class__.__dict__.get("_dlx_options_cache")
    if cache is None:
        cache = task.__class__._dlx_options_cache = {}
    key = (id(runtime.config), queue)
    options: TaskOptions | None = cache.get(key)
    if options is None:
        options = cache[key] = resolve_task_options(task.__class__, runtime.config, queue)
    return options


#: Seconds a redelivered message waits before it goes back to its queue when Redis cannot say
#: whether its retry exists (:meth:`DLXTask._wait_for_store`).
STORE_WAIT = 1.0

#: What the outage log says while redelivered messages wait (:meth:`DLXTask._wait_for_store`).
REDIS_WAIT = "redelivered messages wait in their queues until Redis (dlx_redis_url) answers"
PENDING_WAIT = (
    "redelivered messages wait in their queues until the DLX service writes the retries their "
    "workers handed to it"
)

#: Seconds a task's own ``Reject(requeue=True)`` is remembered until its redelivery arrives.
OWN_REDELIVERY_TTL = 86400


@functools.cache
def _settling_request(request_cls: object) -> bool:
    """True when a task's ``Request`` hands parks to the main process."""
    from celery_dlx.worker.request import DLXRequest

    resolved = symbol_by_name(request_cls) if isinstance(request_cls, str) else request_cls
    return isinstance(resolved, type) and issubclass(resolved, DLXRequest)


#: What each kind of refused write is called in the outage log lines.
_REFUSED_WRITES = {
    fates.BURIED: "cause records of burials (stashed for the DLX service)",
    fates.PARKED: "parks",
    fates.REQUEUED: "requeued copies",
    fates.RECOVERED: "recoveries (history entries of tasks that succeeded)",
    "breaker": "breaker closings (after a held task succeeded)",
    "requeue-note": "notes of a task's own Reject(requeue=True)",
    "redelivery": "look-ups of redelivered messages' retries",
    "run-done": "notes of retries that succeeded",
    "claim": "claims of retries' runs",
}


def _replayed(delivery: Delivery) -> str | None:
    """The obituary a delivery was replayed from (its own lineage), or None."""
    found = delivery.headers.get(REPLAYED_HEADER)
    if isinstance(found, bytes):
        return found.decode("utf-8", "replace")
    return None if found is None else str(found)


def _step(delivery: Delivery) -> str:
    """A retry step: queue, message, attempt, lineage (a replay starts one) and holds (a held copy
    runs again at the same attempt), not who made the copy or when."""
    state = delivery.state
    holds = delivery.headers.get(HOLDS_HEADER, 0)
    line = lineage(state, _replayed(delivery))
    return f"{delivery.queue}:{delivery.message_id}:{state.attempt}:{line}:{holds}"


def _refusals(app: Celery, fate: str) -> OutageLog:
    return outage_log(app, f"_celery_dlx_refused_{fate}", logger, _REFUSED_WRITES[fate])


def _permanent(exc: BaseException, reason: str) -> Bury:
    bury = Bury(reason)
    bury.__cause__ = exc
    return bury


if TYPE_CHECKING:
    _Task = Task[Any, Any]
else:  # Celery's Task is subscriptable (generic) only from 5.7.0; celery-types makes it so for mypy
    _Task = Task


class DLXTask(TracerHook, _Task):
    """A task whose failures are requeued at the tail, parked in Redis, or buried.

    Options (class attributes or ``@app.task(...)`` keywords; each falls back to the ``dlx_*``
    setting of the same name): ``dlx_requeue_on``, ``dlx_park_on``, ``dlx_bury_on`` (exception
    classes or predicates), ``dlx_backoff``, ``dlx_max_requeues``, ``dlx_max_parks``,
    ``dlx_importance``, ``dlx_breaker``. Task code may raise :class:`celery_dlx.Requeue`,
    :class:`celery_dlx.Park` or :class:`celery_dlx.Bury`; ``self.retry(countdown=...)`` parks.
    """

    #: Ack only after the fate is settled; a crash redelivers the message (counted as an attempt).
    # None (AutoDLXTask) reads the app's config, as in Celery's Task; celery-types says bool.
    acks_late: bool | None = True  # type: ignore[assignment]
    reject_on_worker_lost: bool | None = True
    acks_on_failure_or_timeout: bool | None = False  # type: ignore[assignment]
    acks_on_failure: bool | None = False
    acks_on_timeout: bool | None = False
    Strategy = "celery_dlx.worker.strategy:dlx_strategy"
    #: Celery's request, which lets the worker's main process settle a handed-over park.
    Request = "celery_dlx.worker.request:DLXRequest"

    #: True on DLXTask (explicit opt-in); AutoDLXTask follows the ``dlx_enabled`` setting.
    _dlx_always = True

    #: Resolved options per (config, queue), on each task class itself (``_options``).
    _dlx_options_cache: ClassVar[dict[tuple[int, str], TaskOptions]]

    dlx_requeue_on: object = None
    dlx_park_on: object = None
    dlx_bury_on: object = None
    dlx_backoff: object = None
    dlx_max_requeues: object = None
    dlx_max_parks: object = None
    dlx_importance: object = None
    dlx_breaker: object = None

    def _dlx_settles_runs(self) -> bool:
        """Settled runs end without a traceback (:class:`~celery_dlx.compat.celery.TracerHook`)."""
        return self._dlx_enabled_for(self.app)

    @classmethod
    def on_bound(cls, app: Celery) -> None:
        # Validate options when the task is bound (worker start, first producer use), not at the
        # first failure in production.
        if getattr(cls, "name", None) and cls._dlx_enabled_for(app):
            resolve_task_options(cls, get_runtime(app).config)

    @classmethod
    def fates_enabled_for(cls, app: Celery) -> bool:
        """True when ``app`` runs this task as a DLX task: its failures become fates, and its
        worker rejects a message into the dead-letter exchange only to bury it (the DLX service
        reads a rejection without a cause record as a burial)."""
        return cls._dlx_enabled_for(app)

    @classmethod
    def _dlx_enabled_for(cls, app: Celery, runtime: Runtime | None = None) -> bool:
        if cls._dlx_always:
            return True
        # Celery's built-in tasks and celery_dlx's own keep plain Celery semantics.
        name = getattr(cls, "name", None) or ""
        if name.startswith(INTERNAL_TASK_PREFIXES):
            return False
        return bool((runtime or get_runtime(app)).config.enabled)

    def push_request(self, *args: Any, **kwargs: Any) -> None:
        """Celery 5.5's ``Task.push_request``, keeping the current request's fields: before 5.5,
        ``Task.__call__`` pushed an empty one over the run's (eager mode, in-process workers)."""
        push_request_keeping_fields(self, *args, **kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        req = self.request
        if req.called_directly or req.is_eager:
            return super().__call__(*args, **kwargs)
        runtime = get_runtime(self.app)
        if not self._dlx_enabled_for(self.app, runtime):
            return super().__call__(*args, **kwargs)
        delivery = read_delivery(self, req)
        if delivery.problem:
            try:
                self._quarantine(runtime, delivery, delivery.problem)
            except Ignore:
                # In the graveyard: the run fails for Celery too (FAILURE, errbacks, chord error)
                # instead of leaving the result PENDING and a workflow waiting forever.
                self._fail_without_running(MalformedHeader(delivery.problem))
                raise
        unrun = False
        if delivery.redelivered and not self._redelivery_was_asked(runtime, delivery):
            known = False
            try:  # each look-up raises a Redis error when Redis does not answer
                known = (
                    self._succeeded_before(runtime, delivery)
                    or self._parked_before(runtime, delivery)
                    or self._retried_before(runtime, delivery)
                )
                unrun = not known and self._never_ran(runtime, delivery)
            except RetryPending as err:  # its copy is on its way to the DLX service
                self._wait_for_store(runtime, err, PENDING_WAIT)
            except STORE_ERRORS as err:  # waits in its queue until Redis answers (or ttl: a crash)
                self._wait_for_store(runtime, err, REDIS_WAIT)
            if known:
                self._end_settled()
            if not unrun:
                self._fail(
                    runtime,
                    delivery,
                    Redelivered(
                        "redelivered by the broker: the worker died or lost its connection mid-task"
                    ),
                    None,
                )
        # A retried copy runs once (a redelivery has its own rules above).
        retried = delivery.state.attempt > 0 and not delivery.redelivered
        if retried and not unrun and not self._first_run_of_copy(runtime, delivery):
            self._end_settled()
        try:
            result = super().__call__(*args, **kwargs)
        except Reject as exc:
            # The task's own Reject keeps Celery's meaning; its redelivery is not a crash.
            if getattr(exc, "requeue", False):
                self._expect_redelivery(runtime, delivery)
            raise
        except (Ignore, Retry):
            raise
        except Exception as exc:
            failure: BaseException = exc
            if signature_error(self, exc, args, kwargs):
                failure = _permanent(exc, "permanent failure: the call does not match the task")
            self._fail(runtime, delivery, failure, LazyExceptionInfo())
        # A replay resets the attempts; its success is a recovery all the same (the canary of
        # `celery dlx replay --canary` waits for it).
        if delivery.state.attempt > 0 or REPLAYED_HEADER in delivery.headers:
            self._set_details(
                fate=fates.RECOVERED,
                attempt=delivery.state.attempt,
                queue=delivery.queue,
                replayed=REPLAYED_HEADER in delivery.headers,
                first_failure_ms=delivery.state.first_failure_ms,
            )
            self._store_details(failure=False)
            self._record_recovery(runtime, delivery)
            if delivery.state.attempt > 0:
                self._finish_step(runtime, delivery)
        if HELD_HEADER in delivery.headers:
            self._close_breaker(runtime, delivery)
        return result

    def retry(
        self,
        args: tuple[Any, ...] | None = None,
        kwargs: dict[str, Any] | None = None,
        exc: Exception | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Park the message instead of holding an ETA retry in worker memory.

        ``countdown`` (or ``eta``) becomes the park delay (None: the task's backoff schedule);
        ``max_retries`` keeps Celery's meaning: once ``request.retries`` (which counts every
        requeue and park) reaches it, the task fails with ``exc`` or ``MaxRetriesExceededError``
        and is buried, as plain Celery fails it. Outside a DLX worker run (eager, direct call)
        this is Celery's retry.
        """
        req = self.request
        if req.called_directly or req.is_eager or not self._dlx_enabled_for(self.app):
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        limit = self.max_retries if max_retries is None else max_retries
        if limit is not None and (req.retries or 0) >= limit:
            final = (
                exc
                if isinstance(exc, BaseException)
                else MaxRetriesExceededError(
                    f"Can't retry {self.name}[{req.id}] args:{req.args} kwargs:{req.kwargs}",
                    task_args=req.args,
                    task_kwargs=req.kwargs,
                )
            )
            raise _permanent(final, f"max_retries exceeded: {limit}")
        call_args, call_kwargs = retry_arguments(self.run, req.args, req.kwargs, args, kwargs)
        delay = countdown
        if delay is None and eta is not None:
            delay = max(0.0, (eta - self.app.now()).total_seconds())
        park = RetryPark(
            countdown=delay,
            message=str(exc) if exc else "retry requested",
            call_args=call_args,
            call_kwargs=call_kwargs,
        )
        if isinstance(exc, BaseException):
            raise park from exc
        raise park

    def _redelivery_was_asked(self, runtime: Runtime, delivery: Delivery) -> bool:
        """True when this redelivery follows the task's own ``Reject(requeue=True)``."""
        try:
            return runtime.causes.take_requeue(delivery.message_id)
        except Exception:  # Redis down: count it as a crash, the safe side of the budget
            logger.debug("could not check the redelivery of %s", delivery.message_id, exc_info=True)
            return False

    def _expect_redelivery(self, runtime: Runtime, delivery: Delivery) -> None:
        try:
            runtime.causes.note_requeue(delivery.message_id, OWN_REDELIVERY_TTL)
        except Exception as err:
            _refusals(self.app, "requeue-note").failed(err, "their redeliveries count as crashes")

    def _parked_before(self, runtime: Runtime, delivery: Delivery) -> bool:
        """True when this redelivered message's failure was parked already (the broker lost the
        ack after the park): a second retry of the original would start a second lineage."""
        entry_id = next_park_id(delivery.message_id, delivery.state)
        try:
            entry = runtime.parking.entry(entry_id)
            if entry is None:
                return False
            parked = read_state(entry.headers)
        except STORE_ERRORS:
            raise
        except Exception:  # unreadable: a crash it is
            logger.debug("could not read the park %s", entry_id, exc_info=True)
            return False
        if not follows(parked, entry.queue, delivery.state, delivery.queue):
            return False
        logger.info(
            "%s redelivered after its park was written (entry %s): acked without a second retry",
            self._who(delivery),
            entry_id,
        )
        return True

    def _succeeded_before(self, runtime: Runtime, delivery: Delivery) -> bool:
        """True when a run of this redelivered retry's step succeeded already: a second copy
        of the retry (a drain or the DLX service published it again) that its first worker lost
        before running it, or this copy whose ack the broker lost. Counted as a crash, it would
        be given a retry of its own and could be buried although its task succeeded."""
        if delivery.state.attempt == 0 or not runtime.causes.run_finished(_step(delivery)):
            return False
        logger.info(
            "%s redelivered after a run of this retry succeeded: acked without running it again",
            self._who(delivery),
        )
        return True

    def _finish_step(self, runtime: Runtime, delivery: Delivery) -> None:
        """Note that this retry's step succeeded (:meth:`_succeeded_before`), waiting for Redis
        a while; without the note a redelivered copy of the step counts as a crash."""
        step, ttl = _step(delivery), runtime.config.cause_ttl
        try:
            patiently(lambda: runtime.causes.finish_run(step, ttl), patience_of(runtime))
        except Exception as err:
            _refusals(self.app, "run-done").failed(err, "a redelivered copy counts as a crash")

    def _first_run_of_copy(self, runtime: Runtime, delivery: Delivery) -> bool:
        """False for a second copy of one retry step, acked unrun (it would run the failure past
        its budget): a drain or the DLX service died between a retry's confirmed publish and its
        delete, or a worker's copy and the one it handed to the DLX service both went out. Every
        run of a retry claims its :func:`_step` first (so :meth:`_never_ran` can tell). Redis that
        does not answer is waited for (a restart); through a longer outage, a full Redis, or with
        the ``ttl`` delay backend (Redis optional) it runs unclaimed."""
        step = _step(delivery)
        try:
            first = patiently(
                lambda: runtime.causes.claim_run(step, runtime.config.cause_ttl),
                patience_of(runtime),
            )
        except STORE_ERRORS as err:
            if not runtime.history_optional:
                _refusals(self.app, "claim").failed(err, "retries run unclaimed")
            return True
        if not first:
            logger.warning(
                "%s: a second copy of this retry (a drain or the DLX service published it again "
                "after a crash); acked without running it",
                self._who(delivery),
            )
        return first

    def _never_ran(self, runtime: Runtime, delivery: Delivery) -> bool:
        """True when this redelivered copy of a retry never started a run (no run claimed its
        step): its worker died, or its copy went back to its queue, before running it. It then
        runs as the step's first run (claimed now) instead of counting as a crash."""
        if delivery.state.attempt == 0 or runtime.history_optional:
            return False
        if not runtime.causes.claim_run(_step(delivery), runtime.config.cause_ttl):
            return False
        logger.info(
            "%s redelivered before any run of it started: runs as its first", self._who(delivery)
        )
        return True

    def _retried_before(self, runtime: Runtime, delivery: Delivery) -> bool:
        """True when this redelivered message's failure has its retry already (published, parked
        or sent to the DLX service, then the broker lost the ack): a second one would start a
        second lineage and run the failure past its budget."""
        copied = runtime.causes.was_copied(
            delivery.queue,
            delivery.message_id,
            delivery.state.attempt + 1,
            lineage(delivery.state, _replayed(delivery)),
        )
        if copied:
            logger.info(
                "%s redelivered after its retry was made: acked without a second retry",
                self._who(delivery),
            )
        return copied

    def _wait_for_store(self, runtime: Runtime, err: BaseException, why: str) -> None:
        """Whether this redelivered message's retry exists is not known yet (Redis did not
        answer, or its copy is on its way to the DLX service): counted as a crash, it could get a
        second retry beside its first worker's and run past its budget, so it waits in its queue
        (rejected with requeue after :data:`STORE_WAIT` seconds, so a pool does not spin). With
        the ``ttl`` delay backend (Redis optional) the redelivery counts as a crash."""
        if runtime.history_optional:
            return
        _refusals(self.app, "redelivery").failed(err, why)
        time.sleep(STORE_WAIT)
        raise Reject(str(err), requeue=True)

    def _who(self, delivery: Delivery) -> str:
        """``name[id] attempt=N queue=Q``: how a fate's log line names the run."""
        state = delivery.state
        return f"{self.name}[{delivery.message_id}] attempt={state.attempt} queue={delivery.queue}"

    def _end_settled(self, handover: Handover | None = None) -> NoReturn:
        """End a run whose fate is settled, acking its message (or handing ``handover`` to the
        settler), without a traceback."""
        if settles(tracer_of(self)):
            raise RunSettled(handover) from None
        # Without the failure as context: Celery's tracer formats the Ignore's traceback.
        raise Ignore() from None

    def _fail(
        self, runtime: Runtime, delivery: Delivery, exc: BaseException, einfo: ExceptionInfo | None
    ) -> NoReturn:
        """Carry out the fate of a failed run; ends the run (settled, or the task's own failure)."""
        options = _options(self, runtime, delivery.queue)
        plan = plan_failure(
            exc,
            delivery.state,
            options.policy,
            task=self.name,
            queue=delivery.queue,
            retries=int(self.request.retries or 0),
            at_ms=now_ms(),
        )
        held: Held | None = None
        if options.breaker is not None and not isinstance(exc, Redelivered):
            held = hold_failure(
                runtime,
                options.breaker,
                delivery,
                plan,
                exc,
                options.policy,
                task=self.name,
                retries=int(self.request.retries or 0),
            )
            if held is not None:
                plan = held.plan
        self._set_plan_details(delivery, plan)
        if plan.buried:
            self._settle_burial(runtime, delivery, options, plan, exc)
        event = self._fate_event(delivery, options, plan, held)
        handover = self._send_copy(runtime, delivery, plan, exc, event, held)
        self._mark_retry(plan.root, einfo)
        self._end_settled(handover)

    def _close_breaker(self, runtime: Runtime, delivery: Delivery) -> None:
        """A held message (the canary, usually) succeeded: close its cause's breaker."""
        options = _options(self, runtime, delivery.queue)
        cause = delivery.headers.get(HELD_HEADER)
        if options.breaker is None or not cause:
            return  # breaker turned off since: held messages come back at their hold time
        if isinstance(cause, bytes):
            cause = cause.decode("utf-8", "replace")
        try:
            close_breaker(runtime, delivery.queue, str(cause), options.breaker.release_rate)
        except Exception as err:  # no traceback for a task that succeeded
            _refusals(self.app, "breaker").failed(err, "held messages come back after their hold")

    def _set_details(self, **details: Any) -> None:
        """celery_dlx's details of this run, stored with its state (``_store_details``)."""
        setattr(self.request, DETAILS_ATTR, details)

    def _stores_result(self, *, failure: bool) -> bool:
        """Whether this run's state is stored (Celery's ignore_result rules)."""
        req = self.request
        if isinstance(self.backend, DisabledBackend):
            return False
        ignored = self.ignore_result or req.ignore_result
        return not ignored or (failure and bool(self.store_errors_even_if_ignored))

    def _store_details(self, *, failure: bool) -> None:
        """Store this run's details just before its state, so whoever reads the state can too."""
        req = self.request
        details = getattr(req, DETAILS_ATTR, None)
        if not details or not self._stores_result(failure=failure):
            return
        try:
            store_details(self.backend, str(req.id), details)
        except Exception:  # a result backend outage must not change the fate
            logger.debug("could not store the details of %s", req.id, exc_info=True)

    def _set_plan_details(self, delivery: Delivery, plan: FailurePlan) -> None:
        extra: dict[str, Any] = {}
        if plan.delay is not None:
            extra = {"delay": plan.delay, "due_ms": plan.at_ms + int(plan.delay * 1000)}
        self._set_details(
            fate=plan.fate,
            attempt=delivery.state.attempt + 1,
            queue=delivery.queue,
            reason=plan.decision.reason,
            cause=plan.cause,
            exc_type=plan.exc_type,
            first_failure_ms=delivery.state.first_failure_ms or plan.at_ms,
            at_ms=plan.at_ms,
            **extra,
        )

    def _settle_burial(
        self,
        runtime: Runtime,
        delivery: Delivery,
        options: TaskOptions,
        plan: FailurePlan,
        exc: BaseException,
    ) -> NoReturn:
        """Stash the cause, then fail the run with the task's own exception, as plain Celery does
        (FAILURE, errbacks and chord errors once); the message is rejected into the dead-letter
        exchange (acks_late without acks_on_failure)."""
        published = self._bury(runtime, delivery, options, plan)
        root = plan.root
        # The DLX service reports the burial once, with the obituary (integrations.sentry drops
        # what Celery and sentry-sdk's CeleryIntegration report of the task's own exception).
        with contextlib.suppress(AttributeError, TypeError):  # __slots__: cannot carry the mark
            setattr(root, HANDLED_FATE_ATTR, BURIED)
        if root is not exc:
            # Raised from here, it would print the fate request as its context.
            root.__suppress_context__ = True
        if published:
            # Acked, not rejected (a second dead letter); the run fails for Celery all the same.
            self._fail_without_running(
                root if isinstance(root, Exception) else RuntimeError(repr(root))
            )
            raise Ignore() from None
        self._store_details(failure=True)
        raise root

    def _send_copy(
        self,
        runtime: Runtime,
        delivery: Delivery,
        plan: FailurePlan,
        exc: BaseException,
        event: FateEvent,
        held: Held | None = None,
    ) -> Handover | None:
        """Publish the requeued copy, or park it (a park, or a hold of an open breaker), with its
        fate recorded; or return it for the main process's settler to write
        (``celery_dlx.worker.settler``), which acks the original only then."""
        hand_over = self._hands_over()
        copy = celery_copy(
            self.request,
            state=plan.state,
            routing_key=delivery.queue,
            default_serializer=self.serializer or self.app.conf.task_serializer,
            retries=plan.retries,
            args=exc.call_args if isinstance(exc, RetryPark) else None,
            kwargs=exc.call_kwargs if isinstance(exc, RetryPark) else None,
            extra_headers=held.headers if held is not None else None,
        )
        try:
            if plan.delay is not None:
                parked = ParkedMessage(
                    message_id=delivery.message_id if held is None else held.entry_message_id,
                    attempt=plan.state.attempt,
                    queue=delivery.queue,
                    body=copy.body,
                    headers=copy.headers,
                    properties=copy.properties,
                    due_ms=plan.at_ms + int(plan.delay * 1000),
                    parked_ms=plan.at_ms,
                    task=self.name,
                    cause=plan.cause,
                )
                if hand_over:
                    return ParkHandover(parked, event)
                runtime.park_recorded(parked, event)
                faults.point("worker.parked")
                _refusals(self.app, plan.fate).succeeded()
                return None
            if hand_over:
                return RequeueHandover(copy, event)
            mark_pending(runtime, [event])
            runtime.publisher.publish(copy)
        except Exception as err:
            delay = plan.delay if plan.fate == fates.PARKED else None
            refusals = _refusals(self.app, plan.fate)
            refused = send_to_service(
                runtime, copy, plan.fate, delivery.queue, delay, event, refusals, err
            )
            if refused is not None:
                raise Reject(refused, requeue=True) from None
            return None
        _refusals(self.app, plan.fate).succeeded()
        if not runtime.record_settled(event):
            mark_made(runtime, [event])
        faults.point("worker.requeued")
        return None

    def _hands_over(self) -> bool:
        """True when the main process settles this run's copy: ``dlx_parent_parks``, a
        :class:`DLXRequest` and celery_dlx's tracer."""
        return hands_over(self.app) and settles(tracer_of(self)) and _settling_request(self.Request)

    def _failure(self, delivery: Delivery, importance: str, **facts: Any) -> Failure:
        return Failure(
            task=self.name,
            queue=delivery.queue,
            message_id=delivery.message_id,
            importance=importance,
            **facts,
        )

    def _burial(
        self, runtime: Runtime, delivery: Delivery, importance: str, **facts: Any
    ) -> Failure:
        """:meth:`_failure` naming the deciding host and the failed code version (the obituary's)."""
        return self._failure(
            delivery,
            importance,
            hostname=self.request.hostname or socket.gethostname(),
            code_version=runtime.config.code_version,
            **facts,
        )

    def _fate_event(
        self, delivery: Delivery, options: TaskOptions, plan: FailurePlan, held: Held | None = None
    ) -> FateEvent:
        failure = plan.failure.but(
            message_id=delivery.message_id,
            importance=options.importance,
            exc_message=plan.exc_message[:500],
        )
        extra = {"lineage": lineage(delivery.state, _replayed(delivery))}
        if held is not None:
            extra["breaker"] = "opened" if held.opened else ("canary" if held.canary else "held")
        return FateEvent.of(plan.fate, failure, delay=plan.delay, extra=extra)

    def _bury(
        self,
        runtime: Runtime,
        delivery: Delivery,
        options: TaskOptions,
        plan: FailurePlan,
    ) -> bool:
        """Stash the cause record of a burial; True when Redis refused it and the message was
        buried by publishing instead (it must then be acked, not rejected)."""
        assert isinstance(plan.decision, ToBury)
        reason, cause, at = plan.decision.reason, plan.cause, plan.at_ms
        exc_type, exc_message = plan.exc_type, plan.exc_message
        failure = self._burial(
            runtime,
            delivery,
            options.importance,
            attempt=delivery.state.attempt + 1,
            cause=cause,
            exc_type=exc_type,
            exc_message=exc_message,
            reason=reason,
            # The task's failure from its own frames on (not celery_dlx's, nor Celery's).
            traceback=task_traceback(plan.root),
            first_failure_ms=delivery.state.first_failure_ms or at,
            at_ms=at,
        )
        history = (*delivery.state.history, HistoryEntry(at, fates.BURIED, cause))
        record = CauseRecord(failure, history)
        refusals = _refusals(self.app, fates.BURIED)
        try:
            runtime.causes.stash(delivery.message_id, record, runtime.config.cause_ttl)
        except Exception as err:
            if delivery.x_death_problem:  # published below in any case
                refusals.failed(err)
            else:
                # Rejected without its record, it would read as a plain rejection.
                refusals.failed(err, "buried by publishing to the DLX service instead")
                state = DLXState(
                    attempt=delivery.state.attempt + 1,
                    requeues=delivery.state.requeues,
                    parks=delivery.state.parks,
                    history=history[-HISTORY_LIMIT:],
                    queue=delivery.queue,
                    first_failure_ms=delivery.state.first_failure_ms or at,
                    cause=cause,
                    exc_type=exc_type,
                    exc_message=exc_message[:EXC_MESSAGE_LIMIT] if exc_message else None,
                )
                self._send_to_graveyard(runtime, delivery, reason, state, requeue=False)
                return True
        else:
            refusals.succeeded()
            faults.point("worker.stashed")
        if delivery.x_death_problem:
            self._publish_to_graveyard(runtime, delivery, reason)
        return False

    def _quarantine(self, runtime: Runtime, delivery: Delivery, reason: str) -> None:
        """Bury a message whose headers cannot be trusted, by publishing a clean copy."""
        at = now_ms()
        failure = self._burial(
            runtime,
            delivery,
            _options(self, runtime, delivery.queue).importance,
            attempt=delivery.state.attempt,
            cause=fingerprint(self.name, "Quarantined", reason),
            exc_type="Quarantined",
            exc_message=reason,
            reason=f"undecodable: {reason}",
            first_failure_ms=at,
            at_ms=at,
        )
        record = CauseRecord(failure, (HistoryEntry(at, fates.BURIED, "quarantined"),))
        self._set_details(
            fate=fates.BURIED,
            attempt=record.attempt,
            queue=delivery.queue,
            reason=record.reason,
            cause=record.cause,
            exc_type=record.exc_type,
            first_failure_ms=at,
            at_ms=at,
        )
        try:
            runtime.causes.stash(delivery.message_id, record, runtime.config.cause_ttl)
        except Exception as err:
            logger.warning(
                "could not stash the cause of %s[%s]: %r", self.name, delivery.message_id, err
            )
        self._publish_to_graveyard(runtime, delivery, f"undecodable: {reason}")

    def _send_to_graveyard(
        self, runtime: Runtime, delivery: Delivery, reason: str, state: DLXState, *, requeue: bool
    ) -> None:
        """Publish the burial copy (``reason`` in its bury-reason header) to the DLX service; if
        the broker refuses it, ``Reject`` sends the original back to its queue (``requeue``) or to
        the dead-letter exchange, where the service buries a DLX task's rejection."""
        copy = celery_copy(
            self.request,
            state=state,
            routing_key=delivery.queue,
            exchange=runtime.config.exchange,
            default_serializer=self.serializer or self.app.conf.task_serializer,
            extra_headers={REASON_HEADER: reason, QUEUE_HEADER: delivery.queue},
        )
        try:
            runtime.publisher.publish(copy)
        except Exception as err:
            logger.warning(
                "could not bury %s[%s] by publishing (%r); %s",
                self.name,
                delivery.message_id,
                err,
                "returning it to its queue" if requeue else "rejecting it to the DLX service",
            )
            runtime.reset_publisher()
            raise Reject(err, requeue=requeue) from err

    def _publish_to_graveyard(self, runtime: Runtime, delivery: Delivery, reason: str) -> None:
        # Never rejected (its x-death is malformed): back to its queue if the broker refuses.
        state = DLXState(attempt=delivery.state.attempt, queue=delivery.queue)
        self._send_to_graveyard(runtime, delivery, reason, state, requeue=True)
        # The DLX service logs (and alerts on) the burial itself, once, with the obituary.
        logger.warning(
            "quarantined %s reason=%s: sent to the graveyard", self._who(delivery), reason
        )
        raise Ignore()

    def _fail_without_running(self, exc: Exception) -> None:
        """FAILURE and ``task_failure`` for a message buried by publishing: its original is
        acked, so Celery's own failure handling does not run."""
        req = self.request
        self._store_details(failure=True)
        try:
            self.backend.mark_as_failure(
                str(req.id),
                exc,
                None,
                request=req,
                store_result=self.store_errors_even_if_ignored
                or not (self.ignore_result or req.ignore_result),
            )
        except Exception:  # a result backend outage must not change the fate
            logger.debug("could not store FAILURE for %s", req.id, exc_info=True)
        signals.task_failure.send(
            sender=self,
            task_id=req.id,
            exception=exc,
            args=req.args,
            kwargs=req.kwargs,
            traceback=None,
            einfo=None,
        )

    def _mark_retry(self, exc: BaseException, einfo: ExceptionInfo | None) -> None:
        """Result state RETRY and the ``task_retry`` signal, as for Celery's own retry."""
        req = self.request
        if self._stores_result(failure=False):
            self._store_details(failure=False)
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
            failure = self._failure(
                delivery,
                _options(self, runtime, delivery.queue).importance,
                attempt=delivery.state.attempt,
                cause=delivery.state.cause or "",
                exc_type=delivery.state.exc_type or "",
                first_failure_ms=delivery.state.first_failure_ms,
            )
            runtime.record(FateEvent.of(fates.RECOVERED, failure))
            replayed = delivery.headers.get(REPLAYED_HEADER)
            if replayed:
                runtime.graveyard.resolve([str(replayed)], failure.at_ms or now_ms(), "success")
            _refusals(self.app, fates.RECOVERED).succeeded()
        except Exception as err:  # a history outage must not fail a task that succeeded
            _refusals(self.app, fates.RECOVERED).failed(err, "the task's success is not recorded")


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
            for attr in (
                "acks_late",
                "reject_on_worker_lost",
                "acks_on_failure_or_timeout",
                "acks_on_failure",
                "acks_on_timeout",
                "Strategy",
            ):
                setattr(cls, attr, getattr(DLXTask, attr))
        super().on_bound(app)
