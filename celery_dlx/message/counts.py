"""Fate counts read back from the per-minute counters (:mod:`celery_dlx.store.counters`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Count:
    """How many messages of ``queue`` met ``fate`` during one epoch ``minute``."""

    minute: int
    queue: str
    fate: str
    count: int


@dataclass
class Counts:
    """Counter rows read from Redis, and the fields that could not be read (kept, with a reason)."""

    start_minute: int
    end_minute: int
    rows: list[Count] = field(default_factory=list)
    #: ``(key, field, reason)`` of each hash field that is not ``<queue>|<fate>`` -> integer.
    malformed: list[tuple[str, str, str]] = field(default_factory=list)

    def totals(self) -> dict[tuple[str, str], int]:
        """``(queue, fate) -> count`` over the whole window."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for row in self.rows:
            out[(row.queue, row.fate)] += row.count
        return dict(out)

    def by_fate(self) -> dict[str, int]:
        """``fate -> count`` over every queue."""
        out: dict[str, int] = defaultdict(int)
        for row in self.rows:
            out[row.fate] += row.count
        return dict(out)

    def queues(self) -> list[str]:
        return sorted({row.queue for row in self.rows})

    def series(self, queue: str, fate: str) -> list[tuple[int, int]]:
        """``(minute, count)`` for every minute of the window, zeros included, oldest first."""
        found = {r.minute: r.count for r in self.rows if r.queue == queue and r.fate == fate}
        return [(m, found.get(m, 0)) for m in range(self.start_minute, self.end_minute + 1)]
