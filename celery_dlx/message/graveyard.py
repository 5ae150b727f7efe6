"""The graveyard's pure records: which obituaries an operation reads (:class:`Filters`), a
cause's group (:class:`Group`), a page of a cause (:class:`CausePage`), and the budget's shares."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from celery_dlx.message.obituary import Obituary

#: Obituaries loaded per round trip when listing, replaying, purging or sweeping.
CHUNK = 100

#: The share of Redis' ``maxmemory`` the graveyard may hold by default: half, so a storm of
#: burials leaves the other half to parked retries and the history.
DEFAULT_SHARE = 0.5

#: The share of ``maxmemory`` burials never take, whatever the budget: the parked retries' room.
RESERVE = 0.1


@dataclass
class Group:
    """The obituaries of one cause fingerprint still in the graveyard.

    ``count`` is how many are there now; ``total``, ``first_seen_ms``, ``first_version`` and
    ``last_version`` count and date the burials since the group was last empty (None: before
    version stats were kept); ``versions`` counts those here per code version (``""``: none);
    ``example_id`` is the latest obituary.
    """

    cause: str
    count: int
    total: int
    first_ms: int
    last_ms: int
    example_id: str
    exc_type: str
    exc_message: str
    task: str | None
    queue: str
    first_seen_ms: int | None = None
    first_version: str | None = None
    last_version: str | None = None
    versions: dict[str, int] = field(default_factory=dict)
    #: Obituaries here per status but ``unresolved``: ``replayed``, ``resolved``, ``failed-again``.
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def unresolved(self) -> int:
        """Obituaries nobody replayed, or whose replay failed again as another."""
        return self.count - sum(self.statuses.values())


@dataclass
class Filters:
    """Which obituaries an operation applies to; every given filter must match."""

    queue: str | None = None
    task: str | None = None
    cause: str | None = None
    message_id: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    #: An obituary status (:data:`celery_dlx.message.status.STATUSES`); None: any.
    status: str | None = None

    def empty(self) -> bool:
        given = (self.queue, self.task, self.cause, self.message_id, self.since_ms, self.until_ms)
        return all(v is None for v in given)

    def matches(self, ob: Obituary) -> bool:
        return (
            (self.queue is None or ob.queue == self.queue)
            and (self.task is None or ob.task == self.task)
            and (self.cause is None or ob.cause == self.cause)
            and (self.message_id is None or ob.message_id == self.message_id)
        )


@dataclass
class CausePage:
    """One page of a cause's obituary ids: ``next_offset`` None at the end, ``matching`` None
    where not counted, ``capped`` when the scan stopped before the page was full."""

    ids: list[str] = field(default_factory=list)
    next_offset: int | None = None
    matching: int | None = None
    scanned: int = 0
    capped: bool = False


def chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]


#: What ``since`` and ``until`` accept: a datetime, a timedelta (that long ago), or epoch seconds.
When = datetime | timedelta | float | int
