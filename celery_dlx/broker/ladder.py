"""Broker-only delay backend (``dlx_delay_backend = "ttl"``): a ladder of TTL delay queues.

A parked retry is published to the delay queue ``<queue>_dlq_<seconds>`` of its step: a queue
with a queue-wide ``x-message-ttl`` whose dead-letter exchange is the default exchange with
routing key ``<queue>``, so RabbitMQ itself returns the message to the queue that failed when the
TTL runs out. One queue per delay, because a per-message TTL only expires at the queue head (a
long delay would hold every shorter one behind it). Delays between steps round **up** to the next
step of ``dlx_ttl_ladder``; delays beyond the last step wait the last step (logged once per queue).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import amqp
from amqp.exceptions import PreconditionFailed

from celery_dlx.broker.publish import ConfirmingPublisher
from celery_dlx.broker.topology import QUORUM_AT_LEAST_ONCE
from celery_dlx.docs_url import doc_url
from celery_dlx.errors import PublishError, TopologyError
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.durations import EXPIRES_MARGIN_MS, ladder_ms

if TYPE_CHECKING:
    from celery_dlx.roles import Parking

logger = logging.getLogger(__name__)

#: Separator between a work queue's name and a delay queue's delay.
DELAY_QUEUE_INFIX = "_dlq_"
#: Longest queue name RabbitMQ accepts, in UTF-8 bytes.
MAX_QUEUE_NAME = 255
#: Seconds a process trusts a delay queue it declared before a park declares it again. Every
#: declare re-arms the queue's ``x-expires``; publishing does not.
DECLARE_REFRESH = 60.0
#: Seconds an unused delay queue outlives its TTL (``x-expires`` is TTL + this). RabbitMQ deletes
#: an expired queue even if it holds messages, so this must comfortably exceed
#: :data:`DECLARE_REFRESH`: the last message published after the last declare leaves first
#: (:func:`~celery_dlx.policy.durations.ladder_ms` keeps TTL + this within RabbitMQ's limit).
EXPIRES_MARGIN = EXPIRES_MARGIN_MS / 1000


@dataclass(frozen=True)
class DelayQueue:
    """One rung of a work queue's ladder: its name, delay and declaration arguments."""

    name: str
    queue: str
    step_ms: int
    arguments: dict[str, Any]


def format_seconds(ms: int) -> str:
    """``ms`` as seconds, the stable delay part of a delay queue's name: ``5000`` -> ``"5"``,
    ``200`` -> ``"0.2"``, ``1250`` -> ``"1.25"``.

    Raises:
        ValueError: ``ms`` is not a positive integer.
    """
    if isinstance(ms, bool) or not isinstance(ms, int) or ms < 1:
        raise ValueError(f"a delay queue's delay must be a positive number of ms, got {ms!r}")
    whole, frac = divmod(ms, 1000)
    return str(whole) if not frac else f"{whole}.{frac:03d}".rstrip("0")


def delay_queue_name(queue: str, ms: int) -> str:
    """The delay queue of ``queue`` for ``ms`` milliseconds: ``<queue>_dlq_<seconds>``; past
    RabbitMQ's 255 bytes, a prefix of ``queue`` plus a digest of all of it (unique and stable).

    Raises:
        ValueError: ``queue`` is empty or ``ms`` is not a positive integer.
    """
    if not queue:
        raise ValueError("a delay queue needs the name of its work queue")
    suffix = DELAY_QUEUE_INFIX + format_seconds(ms)
    name = queue + suffix
    if len(name.encode("utf-8")) <= MAX_QUEUE_NAME:
        return name
    digest = hashlib.sha1(queue.encode("utf-8"), usedforsecurity=False).hexdigest()[:12]
    room = MAX_QUEUE_NAME - len(suffix) - len(digest) - 1
    prefix = queue.encode("utf-8")[:room].decode("utf-8", errors="ignore")
    return f"{prefix}~{digest}{suffix}"


def expires_ms(ms: int) -> int:
    """``x-expires`` of a delay queue whose TTL is ``ms``: TTL + :data:`EXPIRES_MARGIN`."""
    return ms + EXPIRES_MARGIN_MS


def delay_queue_arguments(queue: str, ms: int, *, quorum: bool = False) -> dict[str, str | int]:
    """Arguments of the delay queue returning messages to ``queue`` after ``ms`` milliseconds;
    ``quorum``: at-least-once dead-lettering (classic queues: at-most-once).

    Raises:
        ValueError: ``queue`` is empty or ``ms`` is not a positive integer.
    """
    delay_queue_name(queue, ms)  # validates queue and ms
    args: dict[str, str | int] = {
        "x-message-ttl": ms,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": queue,
        "x-expires": expires_ms(ms),
    }
    if quorum:
        args.update(QUORUM_AT_LEAST_ONCE)
    return args


def round_up(delay_ms: int, steps: Sequence[int]) -> tuple[int, bool]:
    """``(step, clamped)``: the smallest step at least ``delay_ms`` long, or the last step
    with ``clamped`` True when the delay exceeds it."""
    for step in steps:
        if step >= delay_ms:
            return step, False
    return steps[-1], True


class DeclareCache:
    """Which delay queues this process declared less than ``refresh`` seconds ago (thread-safe)."""

    def __init__(
        self, refresh: float = DECLARE_REFRESH, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.refresh = refresh
        self.clock = clock
        self._at: dict[str, float] = {}
        self._lock = threading.Lock()

    def fresh(self, name: str) -> bool:
        with self._lock:
            at = self._at.get(name)
        return at is not None and self.clock() - at < self.refresh

    def mark(self, name: str) -> None:
        with self._lock:
            self._at[name] = self.clock()

    def forget(self, name: str) -> None:
        with self._lock:
            self._at.pop(name, None)


class Ladder:
    """Parks messages in the TTL delay queues of ``steps`` (``dlx_ttl_ladder``, seconds), quorum
    ones with ``quorum`` (``dlx_quorum``); one per process, thread-safe.

    Raises:
        ConfigurationError: ``steps`` is not a usable ladder.
    """

    def __init__(
        self, steps: Iterable[float], *, quorum: bool = False, cache: DeclareCache | None = None
    ) -> None:
        self.steps = ladder_ms(steps)
        self.quorum = quorum
        self.cache = cache or DeclareCache()
        self._clamped: set[str] = set()

    def plan(self, queue: str, delay_ms: int) -> DelayQueue:
        """The delay queue a park of ``delay_ms`` for ``queue`` goes to (no I/O); a delay beyond
        the last step is logged once per queue."""
        step, clamped = round_up(delay_ms, self.steps)
        if clamped and queue not in self._clamped:
            self._clamped.add(queue)
            logger.warning(
                "a %.3fs delay for queue %s is longer than the last step of dlx_ttl_ladder "
                "(%ss): such delays wait %ss (add a longer step to dlx_ttl_ladder; logged once "
                "per queue)",
                delay_ms / 1000,
                queue,
                format_seconds(step),
                format_seconds(step),
            )
        return DelayQueue(
            name=delay_queue_name(queue, step),
            queue=queue,
            step_ms=step,
            arguments=delay_queue_arguments(queue, step, quorum=self.quorum),
        )

    def park(self, publisher: ConfirmingPublisher, message: ParkedMessage) -> None:
        self.park_many(publisher, [message])

    def park_many(self, publisher: ConfirmingPublisher, messages: Sequence[ParkedMessage]) -> None:
        """Publish each message, headers as they are, to the delay queue of its delay
        (``due_ms - parked_ms``), declared first unless this process did within
        :data:`DECLARE_REFRESH`; a publish the broker returns (its queue vanished) is retried once
        after declaring the queue again.

        Raises:
            PublishError: the broker did not confirm every message (some may be parked: a retry
                of the whole batch parks those twice, never loses one).
            TopologyError: a delay queue exists with other arguments (406).
            amqp/kombu connection errors: the broker is unreachable.
        """
        if not messages:
            return
        # The declares use the publisher's connection: no other thread's batch in between.
        with publisher.exclusive():
            targets = [self.plan(m.queue, max(0, m.due_ms - m.parked_ms)) for m in messages]
            self._declare(publisher, targets, force=False)
            copies = [m.outgoing(t.name) for m, t in zip(messages, targets, strict=True)]
            flags = publisher.publish_many(copies)
            missed = [i for i, ok in enumerate(flags) if not ok]
            if not missed:
                return
            self._declare(publisher, [targets[i] for i in missed], force=True)
            again = publisher.publish_many([copies[i] for i in missed])
            if not all(again):
                names = sorted(
                    {targets[i].name for i, ok in zip(missed, again, strict=True) if not ok}
                )
                raise PublishError(
                    f"broker did not accept {again.count(False)} parked retries for delay queue(s) "
                    f"{', '.join(names)} (nacked or unroutable)"
                )

    def _declare(
        self, publisher: ConfirmingPublisher, targets: Sequence[DelayQueue], *, force: bool
    ) -> None:
        todo = {t.name: t for t in targets if force or not self.cache.fresh(t.name)}
        if not todo:
            return
        publisher.connect()
        channel = publisher.connection.connection.channel()
        try:
            for target in todo.values():
                try:
                    channel.queue_declare(
                        target.name,
                        durable=True,
                        auto_delete=False,
                        arguments=target.arguments,
                    )
                except PreconditionFailed as exc:
                    self.cache.forget(target.name)
                    raise TopologyError(_mismatch_hint(target, exc)) from exc
                self.cache.mark(target.name)
        finally:
            close_quietly(channel)


def _mismatch_hint(target: DelayQueue, exc: BaseException) -> str:
    return (
        f"delay queue {target.name!r} exists with other arguments ({exc}); was dlx_quorum "
        f"changed? It is deleted by RabbitMQ {format_seconds(expires_ms(target.step_ms))}s after "
        f"its last use (x-expires); or delete it once it is empty. Parks for "
        f"{target.queue!r} fail until then (the DLX service keeps them). See {doc_url('delays')}"
    )


def close_quietly(channel: amqp.Channel) -> None:
    try:
        if getattr(channel, "is_open", False):
            channel.close()
    except Exception:  # closing a broken channel is best effort
        logger.debug("closing a delay-queue declare channel failed", exc_info=True)


class LadderParking:
    """The ``Parking`` role with ``dlx_delay_backend = "ttl"``: retries wait in the broker's
    delay queues, which give them back by themselves. Reads and drain calls go to ``stored``, the
    Redis parking store, so what was parked there before the backend changed still drains."""

    def __init__(
        self,
        ladder: Ladder,
        publisher: Callable[[], ConfirmingPublisher],
        stored: Callable[[], Parking],
    ) -> None:
        self.ladder = ladder
        self.publisher = publisher
        self.stored = stored

    def park(self, message: ParkedMessage) -> bool:
        """Always True: a delay queue has no dedup id."""
        self.ladder.park(self.publisher(), message)
        return True

    def park_many(
        self, messages: Sequence[ParkedMessage], *, pipeline: object = None
    ) -> list[bool]:
        """No Redis ``pipeline`` is ever given: :meth:`transaction` makes none."""
        self.ladder.park_many(self.publisher(), messages)
        return [True] * len(messages)

    def transaction(self, queue: Callable[[Any], None], what: str) -> None:
        """None: a park in the broker and a write to Redis share no transaction."""
        return None

    def claim(self, limit: int, lease_ms: int, now: int | None = None) -> list[ParkedMessage]:
        return list(self.stored().claim(limit, lease_ms, now))

    def ack(self, messages: Iterable[ParkedMessage]) -> int:
        return int(self.stored().ack(messages))

    def release(self, messages: Iterable[ParkedMessage], due_ms: int | None = None) -> None:
        self.stored().release(messages, due_ms)

    def count(self) -> int:
        return int(self.stored().count())

    def due_count(self, now: int | None = None) -> int:
        return int(self.stored().due_count(now))

    def peek(self, limit: int = 100, offset: int = 0) -> list[ParkedMessage]:
        return list(self.stored().peek(limit, offset))

    def soonest(self, limit: int, batch: int = 1000) -> Iterator[ParkedMessage]:
        return iter(self.stored().soonest(limit, batch))

    def entry(self, entry_id: str) -> ParkedMessage | None:
        return self.stored().entry(entry_id)

    def remove(self, entry_ids: Sequence[str]) -> int:
        return int(self.stored().remove(entry_ids))

    def load_scripts(self) -> None:
        self.stored().load_scripts()
