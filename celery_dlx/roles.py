"""The roles the composition root (:mod:`celery_dlx.wiring`) hands out, as small protocols.

Everything outside ``store/`` and ``broker/`` reaches Redis and RabbitMQ through these: the parts
that decide and report (worker, DLX service, operations, console, command line) never hold a
client, a key name or a channel. Each role has its implementations in ``store/`` or ``broker/``;
which one an app gets is chosen once, by its settings, in :class:`~celery_dlx.wiring.Runtime`.

====================  ==========================================  ====================================
role                  what it keeps                               implementations
====================  ==========================================  ====================================
:class:`Parking`      retries waiting for their due time          ``store.parking.ParkingStore``
                                                                  (Redis sorted sets, one shard
                                                                  or per queue bucket),
                                                                  ``broker.ladder.LadderParking``
                                                                  (the broker's TTL delay queues)
``Graveyard``         obituaries, their indexes and cause groups  ``store.graveyard.Graveyard``
:class:`History`      the failure history stream and counters     ``store.history.History``
:class:`Causes`       what a worker knows of a burial             ``store.causes.Causes``
:class:`Publisher`    confirmed copies                            ``broker.publish.ConfirmingPublisher``
:class:`Breakers`     per-cause breakers (automatic hold)         ``store.breaker.Breakers``
====================  ==========================================  ====================================
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Protocol

from celery_dlx.fates import FateEvent
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.outgoing import Outgoing
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.breaker import BreakerSettings, Hold


class Parking(Protocol):
    """Where parked retries wait until they are due, and how the drain takes them back."""

    def park(self, message: ParkedMessage) -> bool:
        """Park ``message`` until its due time; False if that id and attempt are parked already."""
        ...

    def park_many(self, messages: Sequence[ParkedMessage]) -> list[bool]:
        """:meth:`park` each, in one round trip where the store allows it."""
        ...

    def park_recorded(
        self, message: ParkedMessage, events: Sequence[FateEvent]
    ) -> bool | BaseException:
        """Park ``message`` and record ``events`` with it where one transaction can hold both:
        True (both in), the history's error (parked, not recorded), or False (parked; the caller
        records the events)."""
        ...

    def park_recorded_many(
        self, messages: Sequence[ParkedMessage], events: Sequence[FateEvent]
    ) -> tuple[list[BaseException | None], bool | BaseException]:
        """:meth:`park_recorded` for a batch, in one transaction where the store allows it: per
        message None (parked, or parked already) or the error that kept it out, and whether the
        events were recorded with them, as :meth:`park_recorded` says it."""
        ...

    def claim(self, limit: int, lease_ms: int, now: int | None = None) -> list[ParkedMessage]:
        """Take up to ``limit`` due retries for ``lease_ms`` (claimed again after that)."""
        ...

    def ack(self, messages: Iterable[ParkedMessage]) -> int:
        """Delete claimed retries whose republish was confirmed; how many were still ours."""
        ...

    def release(self, messages: Iterable[ParkedMessage], due_ms: int | None = None) -> None:
        """Give claimed retries back (due at ``due_ms``, default their own due time)."""
        ...

    def count(self) -> int: ...

    def due_count(self, now: int | None = None) -> int: ...

    def peek(self, limit: int = 100, offset: int = 0) -> list[ParkedMessage]:
        """Retries in due order, with their bodies, without claiming them."""
        ...

    def soonest(self, limit: int, batch: int = 1000) -> Iterator[ParkedMessage]:
        """The ``limit`` soonest-due retries, without bodies."""
        ...

    def entry(self, entry_id: str) -> ParkedMessage | None:
        """One parked retry with its body, or None."""
        ...

    def remove(self, entry_ids: Sequence[str]) -> int:
        """Delete retries by entry id; how many were there."""
        ...

    def load_scripts(self) -> None:
        """Prepare the store now rather than at the first park."""
        ...


class History(Protocol):
    """The failure history (every fate change) and the per-minute fate counters."""

    def write(
        self, events: Sequence[FateEvent], *, history: bool = True
    ) -> tuple[BaseException | None, bool]: ...

    def append_many(self, events: Iterable[FateEvent], pipe: object = None) -> int: ...

    def tail(self) -> str: ...

    def after(
        self, last: str, *, count: int = 1000, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]: ...

    def length(self) -> int: ...


class Causes(Protocol):
    """Cause records a worker leaves for the DLX service, and its own-requeue markers."""

    def stash(self, message_id: str, record: CauseRecord, ttl_seconds: float) -> None: ...

    def read(self, message_id: str) -> CauseRecord | None: ...

    def drop(self, message_id: str) -> None: ...

    def note_requeue(self, message_id: str, ttl_seconds: int) -> None: ...

    def take_requeue(self, message_id: str) -> bool: ...

    def claim_run(self, step: str, ttl_seconds: float) -> bool: ...

    def was_copied(self, queue: str, message_id: str, attempt: int, lineage: str) -> bool: ...

    def mark_copied(self, queue: str, message_id: str, attempt: int, lineage: str) -> None: ...


class Publisher(Protocol):
    """Publishes copies and learns, per copy, whether the broker routed and confirmed it."""

    def publish(self, message: Outgoing) -> None: ...

    def publish_many(self, messages: Sequence[Outgoing]) -> list[bool]: ...

    def connect(self) -> None: ...

    def close(self) -> None: ...


class Breakers(Protocol):
    """Per-cause breakers shared by every worker (``dlx_breaker``, see
    :mod:`celery_dlx.policy.breaker`)."""

    def fail(
        self,
        queue: str,
        cause: str,
        settings: BreakerSettings,
        now_ms: int,
        *,
        entry_id: str,
        task: str = "",
        exc_type: str = "",
    ) -> Hold | None:
        """Count one failure of ``cause`` on ``queue``: a :class:`Hold` while the breaker is open
        (``entry_id`` is then remembered as held), else None."""
        ...

    def close(self, queue: str, cause: str) -> tuple[bool, list[str]]:
        """Close the breaker: whether it was open, and the entry ids it held."""
        ...

    def list_open(self) -> Sequence[OpenBreaker]:
        """The open breakers, oldest first."""
        ...


class OpenBreaker(Protocol):
    """One open breaker as :meth:`Breakers.list_open` lists it (times in epoch ms)."""

    @property
    def queue(self) -> str: ...

    @property
    def cause(self) -> str: ...

    @property
    def opened_ms(self) -> int: ...

    @property
    def probe_ms(self) -> int:
        """When the next canary is due."""
        ...

    @property
    def held(self) -> int:
        """Messages held since it opened."""
        ...

    def as_dict(self) -> dict[str, object]:
        """queue, cause, task, exc_type, opened_ms, probe_ms and held."""
        ...
