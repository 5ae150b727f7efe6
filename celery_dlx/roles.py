"""The roles :class:`~celery_dlx.wiring.Runtime` hands out, as protocols: everything outside
``store/`` and ``broker/`` (where they are implemented) reaches Redis and RabbitMQ through these,
never holding a client, a key name or a channel."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

from celery_dlx.fates import FateEvent
from celery_dlx.message.cause import CauseRecord
from celery_dlx.message.counts import Counts
from celery_dlx.message.graveyard import CausePage, Filters, Group
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.outgoing import Outgoing
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.breaker import BreakerSettings, Hold

#: A ``store/`` Redis pipeline that writes are queued in (opaque: the roles import no client).
Pipe = Any


class Parking(Protocol):
    """Where parked retries wait until they are due, and how the drain takes them back."""

    def park(self, message: ParkedMessage) -> bool:
        """Park ``message`` until its due time; False if that id and attempt are parked already."""

    def park_many(self, messages: Sequence[ParkedMessage], *, pipeline: Pipe = None) -> list[bool]:
        """:meth:`park` each, in one round trip where the store allows it; in ``pipeline`` (one
        :meth:`transaction` hands out) queued as one command whose reply is that list, [] now."""

    def transaction(self, queue: Callable[[Pipe], None], what: str) -> list[Any] | None:
        """Run the writes ``queue`` adds to a pipeline (a park, the history's) in one
        transaction that counts as parks do: the replies in order, an error in place of a
        refused command. None, without calling ``queue``, where no transaction can hold a park
        and the history (per-queue layout, Redis Cluster, the broker's delay queues)."""

    def claim(self, limit: int, lease_ms: int, now: int | None = None) -> list[ParkedMessage]:
        """Take up to ``limit`` due retries for ``lease_ms`` (claimable again after that)."""

    def ack(self, messages: Iterable[ParkedMessage]) -> int:
        """Delete claimed retries whose republish was confirmed; how many were still ours."""

    def release(self, messages: Iterable[ParkedMessage], due_ms: int | None = None) -> None:
        """Give claimed retries back (due at ``due_ms``, default their own due time)."""

    def count(self) -> int: ...
    def due_count(self, now: int | None = None) -> int: ...

    def peek(self, limit: int = 100, offset: int = 0) -> list[ParkedMessage]:
        """Retries in due order, with their bodies, without claiming them."""

    def soonest(self, limit: int, batch: int = 1000) -> Iterator[ParkedMessage]:
        """The ``limit`` soonest-due retries, without bodies."""

    def entry(self, entry_id: str) -> ParkedMessage | None: ...
    def remove(self, entry_ids: Sequence[str]) -> int: ...

    def load_scripts(self) -> None:
        """Prepare the store now rather than at the first park."""


class ParkedStore(Parking, Protocol):
    """The Redis side of parking (every delay backend drains it), with an operator's actions."""

    def make_due(self, message: ParkedMessage, now: int | None = None) -> bool:
        """Make a parked retry due now; False if it was gone."""

    def take(self, message: ParkedMessage) -> bool:
        """Delete a parked retry unless a drain claimed it; True if it was taken."""


class Graveyard(Protocol):
    """Obituaries of buried messages: written by the DLX service, read and replayed by operators."""

    def write_many(
        self,
        items: Sequence[tuple[Obituary, FateEvent]],
        *,
        drop_causes: bool = True,
        over_cap: list[int] | None = None,
    ) -> list[bool]:
        """Write obituaries with their ``buried`` history entries; per obituary, True if written
        now (False: there already, or over its cause's cap, its index then in ``over_cap``)."""

    def remove(self, ob: Obituary, event: FateEvent | None) -> bool:
        """Delete ``ob`` with ``event`` in the history; False if it was gone."""

    def load(self, ids: Sequence[str], *, with_payload: bool = False) -> list[Obituary | None]:
        """The obituaries of ``ids`` (None where missing or unreadable), in order."""

    def ids(self, filters: Filters, *, limit: int | None, oldest_first: bool = False) -> list[str]:
        """Obituary ids matching ``filters``, newest first unless ``oldest_first``."""

    def count(self) -> int: ...
    def used_bytes(self) -> int: ...
    def latest_of_message(self, message_id: str) -> str | None: ...

    def add_replays(self, replayed: Sequence[tuple[str, int]], *, to_queue: str = "") -> None:
        """Add ``(obituary id, ms)`` replay times to the replay ledger."""

    def redirects(self, ids: Sequence[str]) -> list[dict[int, str]]:
        """Per id, its redirected replays: replay ms -> the queue it went to."""

    def mark_replayed(self, ids: Sequence[str], at: int) -> list[str]: ...
    def unmark_replayed(self, ids: Sequence[str], at: int) -> None: ...
    def resolve(self, ids: Sequence[str], at: int, by: str) -> list[str]: ...
    def note_failed_again(self, buried: Sequence[Obituary], at: int) -> None: ...

    def since(self, kind: str, cutoff_ms: int, limit: int) -> list[str]:
        """Ids ``replayed`` or ``resolved`` (``kind``) at or before ``cutoff_ms``, oldest first."""

    def older_than(self, cutoff_ms: int, limit: int) -> list[str]:
        """Ids buried at or before ``cutoff_ms``, oldest first."""

    def top_causes(self, limit: int) -> list[str]: ...
    def cause_names(self, offset: int, limit: int) -> tuple[int, list[str]]: ...
    def groups(self) -> list[Group]: ...
    def groups_of(self, causes: list[str]) -> list[Group]: ...
    def cause_page(self, cause: str, filters: Filters, offset: int, limit: int) -> CausePage: ...
    def version_times(self) -> dict[str, int]: ...

    def names(self, kind: str) -> list[tuple[str, int, int]]:
        """``(name, obituaries, last burial ms)`` per queue (``kind="queue"``) or task."""


class History(Protocol):
    """The failure history (every fate change), the per-minute fate counters and the operators'
    audit stream."""

    def write(
        self, events: Sequence[FateEvent], *, history: bool = True, pipeline: Pipe = None
    ) -> bool:
        """Append ``events``, count them and mark their retries, in ``pipeline`` (queued: the
        append's replies first) or in one round trip now: whether the counters and markers went
        in. Raises the append's error."""

    def forget_copies(self, events: Sequence[FateEvent]) -> None:
        """Delete the retry markers :meth:`write` queued for ``events`` (their parks failed)."""

    def append_audit(self, fields: Mapping[str, str], event: FateEvent, *, maxlen: int) -> str:
        """An operator action in the audit stream and its ``audit`` history entry; the audit
        entry's id."""

    def audit(self, limit: int = 100) -> list[tuple[str, dict[str, str]]]: ...

    def tail(self) -> str: ...

    def after(
        self, last: str, *, count: int = 1000, block_ms: int | None = None
    ) -> list[tuple[str, dict[str, str]]]: ...

    def length(self) -> int: ...

    def counts(self, window_s: float, *, at_ms: int | None = None) -> Counts:
        """The per-minute fate counters over the last ``window_s`` seconds."""


class Causes(Protocol):
    """Cause records a worker leaves for the DLX service, and its own-requeue markers."""

    def stash(self, message_id: str, record: CauseRecord, ttl_seconds: float) -> None: ...
    def note_requeue(self, message_id: str, ttl_seconds: int) -> None: ...
    def take_requeue(self, message_id: str) -> bool: ...
    def claim_run(self, step: str, ttl_seconds: float) -> bool: ...
    def finish_run(self, step: str, ttl_seconds: float) -> None: ...
    def run_finished(self, step: str) -> bool: ...
    def was_copied(self, queue: str, message_id: str, attempt: int, lineage: str) -> bool: ...
    def mark_copied_many(self, retries: Sequence[tuple[str, str, int, str]]) -> None: ...

    def mark_pending_many(
        self, retries: Sequence[tuple[str, str, int, str]], ttl_seconds: float
    ) -> None: ...


class Letters(Protocol):
    """The DLX service's markers of settled dead letters, and its lookup of stashed causes."""

    def lookup(
        self, letter_keys: Sequence[str], identities: Sequence[str]
    ) -> tuple[list[bool], list[CauseRecord | None]]: ...

    def mark(
        self, letter_keys: Sequence[str], ttl_ms: int = ..., *, drop_causes: Sequence[str] = ()
    ) -> None: ...


class DrainLease(Protocol):
    """One drainer's hold on the drain lease of its key prefix."""

    def acquire(self) -> bool:
        """Take the lease if free, renew it if ours; True when held."""

    def release(self) -> bool: ...


class WindowBudget(Protocol):
    """At most a number of uses per key within a time window, shared by every process."""

    def spend(self, what: str) -> tuple[bool, int]:
        """Use one unit for ``what``: ``(allowed, uses in this window including this one)``."""


class Consumerless(Protocol):
    """Queues seen with messages and no consumer, and since when (``dlx check``)."""

    def remember(self, queues: Iterable[Mapping[str, object]], now: int) -> dict[str, int]: ...


class Refusals(Protocol):
    """Copies workers could not write (per fate), counted by the DLX service that wrote them."""

    def add(self, counts: Mapping[str, int]) -> None: ...
    def read(self) -> dict[str, int]: ...


class Publisher(Protocol):
    """Publishes copies and learns, per copy, whether the broker routed and confirmed it."""

    def publish(self, message: Outgoing) -> None: ...
    def publish_many(self, messages: Sequence[Outgoing]) -> list[bool]: ...
    def connect(self) -> None: ...
    def close(self) -> None: ...


class Breakers(Protocol):
    """Per-cause breakers shared by every worker (``dlx_breaker``)."""

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

    def close(self, queue: str, cause: str) -> tuple[bool, list[str]]:
        """Close the breaker: whether it was open, and the entry ids it held."""

    def list_open(self) -> Sequence[OpenBreaker]:
        """The open breakers, oldest first."""


class OpenBreaker(Protocol):
    """One open breaker as :meth:`Breakers.list_open` lists it (times in epoch ms)."""

    @property
    def queue(self) -> str: ...

    @property
    def cause(self) -> str: ...

    def as_dict(self) -> dict[str, object]:
        """queue, cause, task, exc_type, opened_ms, probe_ms and held."""
