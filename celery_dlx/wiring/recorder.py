"""The fate recorder: every fate change logged (one line), appended to the failure history and
counted (in one Redis round trip, with the park itself where one transaction can hold both), then
told to the listeners (Flower events, Sentry)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from celery_dlx.errors import PublishError, StoreError
from celery_dlx.fates import BURIED, DRAINED, FateEvent
from celery_dlx.message.outgoing import Outgoing
from celery_dlx.message.parked import ParkedMessage, park_each, parks_named
from celery_dlx.outages import outage_log
from celery_dlx.policy.decide import one_line
from celery_dlx.roles import History, Parking, Pipe, Publisher

logger = logging.getLogger("celery_dlx")

#: A fate listener: called once per fate change; its failures are logged, never raised.
Listener = Callable[[FateEvent], None]


class FateRecorder:
    """Records fate changes through the roles it is given (asked for at each use: a forked
    process gets its own).

    Args:
        listeners: the runtime's list of fate listeners.
        history_optional: True when a failed history append is logged, not raised (the broker
            holds every fate: ``dlx_delay_backend = "ttl"``).
    """

    def __init__(
        self,
        *,
        parking: Callable[[], Parking],
        history: Callable[[], History],
        publisher: Callable[[], Publisher],
        reset_publisher: Callable[[], None],
        listeners: list[Listener],
        history_optional: Callable[[], bool],
    ) -> None:
        self._parking = parking
        self._history = history
        self._publisher = publisher
        self._reset_publisher = reset_publisher
        self.listeners = listeners
        self._history_optional = history_optional
        self._history_failing = False

    def park_recorded(self, message: ParkedMessage, event: FateEvent) -> None:
        """Park ``message`` and record ``event`` (its ``parked`` fate) in one ``MULTI``/``EXEC``
        (park, history, counters, the retry's marker), so a park that failed to reach Redis
        leaves no history entry behind; then log it and tell the listeners. Where that cannot be
        one transaction (the ``ttl`` backend, keys per queue), the park, then
        :meth:`record_settled`.

        Raises:
            NotReplicated: the park went to the master, but fewer replicas than
                ``dlx_redis_min_replicas`` confirmed it: it does not count (the caller hands the
                message to the dead-letter path, as for any failed park).
            redis.RedisError, ...: the message is not parked (nothing was recorded, unless Redis
            refused the park itself inside the transaction: then the history may hold it).
        """
        (outcome,) = self.park_recorded_many([(message, event)])
        if outcome is not None:
            raise outcome

    def park_recorded_many(
        self, parks: Sequence[tuple[ParkedMessage, FateEvent]]
    ) -> list[BaseException | None]:
        """:meth:`park_recorded` for a batch (a worker's main process parking what its pool
        handed over), in one transaction where the parking allows it.

        Returns:
            Per park, None when it is in (the fate then logged and the listeners told), or the
            error that kept it out (nothing logged: the caller hands the message to the
            dead-letter path). Never raises.
        """
        if not parks:
            return []
        messages = [message for message, _ in parks]
        events = [event for _, event in parks]
        parking, history = self._parking(), self._history()

        def queue(pipe: Pipe) -> None:
            parking.park_many(messages, pipeline=pipe)
            history.write(events, pipeline=pipe)

        try:
            replies = parking.transaction(queue, parks_named(messages))
        except Exception as err:  # nothing parked (or not replicated): each falls back
            return [err] * len(parks)
        if replies is None:
            outcomes = park_each(parking.park, messages)
            for event, outcome in zip(events, outcomes, strict=True):
                if outcome is None:
                    self.record_settled(event)
            return outcomes
        parked, *record = replies
        if isinstance(parked, Exception):
            history.forget_copies(events)  # their markers went in: a redelivery must retry them
            return [parked] * len(parks)
        # Logged once parked, not before: a failed park falls back to the dead-letter path.
        self.log_fates(events)
        failed = next((r for r in record if isinstance(r, Exception)), None)
        if failed is not None:
            self._unrecorded(events, failed)
        self._notify_many(events)
        return [None] * len(parks)

    def requeue_recorded_many(
        self,
        requeues: Sequence[tuple[Outgoing, FateEvent]],
        *,
        unrecorded: Callable[[Sequence[FateEvent]], None] | None = None,
    ) -> list[BaseException | None]:
        """Publish a batch of requeued copies (confirms pipelined), then record the fates of
        those the broker confirmed in one round trip.

        Returns:
            Per copy, None when the broker confirmed it (its fate then recorded: a failed record
            is logged, as in :meth:`record_settled`, since the copy is out), or the error that
            kept it out (nothing recorded: the caller hands the original to the dead-letter
            path). Never raises. ``unrecorded`` is given the confirmed fates whose record
            failed (their retry markers are missing).
        """
        if not requeues:
            return []
        try:
            confirmed = self._publisher().publish_many([copy for copy, _ in requeues])
        except Exception as err:  # nothing may be assumed published: each falls back
            self._reset_publisher()
            return [err] * len(requeues)
        outcomes: list[BaseException | None] = [
            None
            if ok
            else PublishError(
                f"broker did not accept the message for {copy.routing_key!r} (nacked or unroutable)"
            )
            for (copy, _), ok in zip(requeues, confirmed, strict=True)
        ]
        done = [event for (_, event), ok in zip(requeues, confirmed, strict=True) if ok]
        if done:
            self.log_fates(done)
            try:
                counted = self._history().write(done)
            except Exception as err:
                self._unrecorded(done, err)
                if unrecorded is not None:
                    unrecorded(done)
            else:
                self._counted(len(done), not counted)
                self._notify_many(done)
        return outcomes

    def record_settled(self, event: FateEvent) -> bool:
        """:meth:`record` a fate whose copy is already out (published or parked): a failure is
        logged, not raised, since failing the run now would dead-letter the original as well
        and the message would live twice. False when it was not recorded."""
        try:
            self.record(event)
        except Exception as err:
            self._unrecorded([event], err)
            return False
        return True

    def record(self, event: FateEvent, *, history: bool = True) -> None:
        """Log one fate change, append and count it in one Redis round trip, notify listeners.
        ``history=False``: the caller appended it in its own transaction (logged, counted and
        notified only). With the ``ttl`` delay backend the broker holds every fate, so a failed
        history append is logged (once per outage), not raised.

        Raises:
            redis.RedisError: the history append failed (it is part of the fate).
        """
        if history and self._history_optional():
            self._record_best_effort(event)
            return
        if history:
            self.record_many([event])
            return
        self._log(event)
        try:
            self._history().write([event], history=False)
        except Exception as err:  # counters must never decide a fate
            self._counted(1, True, err)
        self._notify(event)

    def _record_best_effort(self, event: FateEvent) -> None:
        try:
            self.record_many([event])
        except Exception as exc:  # the fate is settled in the broker; history is an extra
            if not self._history_failing:
                logger.warning(
                    "celery_dlx could not append to the failure history (%s: %s); fates go on "
                    "without it until Redis (dlx_redis_url) answers",
                    type(exc).__name__,
                    exc,
                )
            self._history_failing = True
            self._notify(event)
            return
        if self._history_failing:
            logger.warning("celery_dlx failure history is being appended again")
        self._history_failing = False

    def record_many(
        self, events: Sequence[FateEvent], *, history: bool = True, log: bool = True
    ) -> None:
        """Log many fate changes, append and count them in one pipeline, notify each. A failed
        history append propagates after the rest of the batch was sent; counters and listeners
        are best effort. ``history=False`` as in :meth:`record`; ``log=False``: the caller logs
        them with :meth:`log_fates` (the DLX service, once its writes are done).

        Raises:
            redis.RedisError: the pipeline failed or a history append was refused.
        """
        if not events:
            return
        if log:
            self.log_fates(events)
        counted = self._history().write(events, history=history)
        self._counted(len(events), not counted)
        for event in events:
            self._notify(event)

    def _counted(self, n: int, failed: bool, err: BaseException | None = None) -> None:
        """Note whether ``n`` fates were counted: one WARNING per outage (with counts), not one
        per write (a full Redis refuses every write of a storm)."""
        log = outage_log(self, "_counter_outage", logger, "fate counter updates")
        if failed:
            log.failed(err or StoreError("Redis refused the counter update"), f"{n} not counted")
        else:
            log.succeeded()

    def _unrecorded(self, events: Sequence[FateEvent], err: BaseException) -> None:
        """Fates settled but missing from the history: one WARNING per outage, naming the first."""
        first = events[0]
        log = outage_log(self, "_history_outage", logger, "failure history appends")
        log.failed(err, f"{first.fate} of {first.task or '-'}[{first.message_id}] not recorded")

    def log_fates(self, events: Sequence[FateEvent]) -> None:
        """Log ``events`` recorded with ``log=False``, one line per fate change."""
        for event in events:
            self._log(event)

    def _log(self, event: FateEvent) -> None:
        fate = event.fate
        # A drain's republish is routine (the park line said when it comes back): debug.
        level = (
            logging.DEBUG if fate == DRAINED else logging.ERROR if fate == BURIED else logging.INFO
        )
        if not logger.isEnabledFor(level):  # parks and requeues: info, often not logged at all
            return
        line = "%s %s[%s] attempt=%d queue=%s cause=%s%s%s%s"
        args: tuple[object, ...] = (
            fate,
            event.task or "-",
            event.message_id,
            event.attempt,
            event.queue,
            event.cause or "-",
            f" delay={event.delay:.3f}s" if event.delay is not None else "",
            f" reason={event.reason}" if event.reason else "",
            error_part(event.exc_type, event.exc_message),
        )
        if fate == BURIED:
            # One traceback per burial in the logs: not again when Celery's tracer logged it.
            shown = "" if event.extra.get("traceback_logged") else event.traceback
            line, args = line + ("\n%s" if shown else "%s"), (*args, shown or "")
        logger.log(level, line, *args)

    def _notify(self, event: FateEvent) -> None:
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:
                logger.warning("celery_dlx listener %r failed", listener, exc_info=True)

    def _notify_many(self, events: Sequence[FateEvent]) -> None:
        """A listener with ``notify_many`` (the event sender) takes the batch at once."""
        for listener in list(self.listeners):
            many = getattr(listener, "notify_many", None)
            try:
                if many is not None:
                    many(events)
                else:
                    for event in events:
                        listener(event)
            except Exception:
                logger.warning("celery_dlx listener %r failed", listener, exc_info=True)


#: Longest exception message a fate's log line shows.
LOG_MESSAGE_LIMIT = 200


def error_part(exc_type: str | None, exc_message: str | None) -> str:
    """`` error=Type: message`` of a fate's log line (one line, cut to
    :data:`LOG_MESSAGE_LIMIT`); empty without an exception of the task's own (a fate the task
    asked for, ``Park("...")``, is named by the line's reason already)."""
    if not exc_type or exc_type.startswith("celery_dlx."):
        return ""
    message = one_line(exc_message or "", LOG_MESSAGE_LIMIT)
    return f" error={exc_type}: {message}" if message else f" error={exc_type}"
