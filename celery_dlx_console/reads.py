"""What the console pages read, a page at a time from the graveyard's indexes (never the whole
graveyard), in the row shapes of :mod:`celery_dlx.ops.inspection` (the CLI's ``--json``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, TypedDict

from celery_dlx import Group, Runtime
from celery_dlx.codecs import ProtobufRegistry
from celery_dlx.ops import UNRESOLVED, Filters, ParkedMessage, deploys, now_ms
from celery_dlx.ops.breakers import open_breakers
from celery_dlx.ops.inspection import GroupRow, ObituaryRow, group_row, obituary_row
from celery_dlx.ops.render import iso

#: Most rows on one page.
MAX_PAGE = 200
#: Most parked retries read to count them per queue.
PARKED_SCAN = 20000
#: Most causes read to find those with an unresolved obituary.
CAUSE_SCAN = 100_000
#: The status filter's value for any status (as ``--status all``).
ALL = "all"


def status_count(group: Group, status: str) -> int:
    return group.unresolved if status == UNRESOLVED else group.statuses.get(status, 0)


def _unresolved_causes(runtime: Runtime, offset: int, limit: int) -> tuple[int, list[Group]]:
    """How many causes have an unresolved obituary, and a page of their groups (every group is
    read, :data:`MAX_PAGE` causes a round trip, as ``dlx groups`` does)."""
    yard = runtime.graveyard
    _, names = yard.cause_names(0, CAUSE_SCAN)
    matching: list[Group] = []
    for start in range(0, len(names), MAX_PAGE):
        matching += [g for g in yard.groups_of(names[start : start + MAX_PAGE]) if g.unresolved]
    return len(matching), matching[offset : offset + limit]


def causes_page(
    runtime: Runtime, *, offset: int = 0, limit: int = 50, status: str = UNRESOLVED
) -> dict[str, object]:
    """One page of cause groups, most recently seen first (rows of ``dlx groups --json``, plus
    ``importance`` of the latest obituary). ``status``: ``unresolved`` (the causes with an
    obituary nobody replayed, as ``dlx groups``) or ``all``."""
    yard = runtime.graveyard
    limit = max(1, min(limit, MAX_PAGE))
    if status == UNRESOLVED:
        causes_total, groups = _unresolved_causes(runtime, offset, limit)
    else:
        causes_total, causes = yard.cause_names(offset, limit)
        groups = yard.groups_of(causes)
    total = yard.count()
    examples = yard.load([g.example_id for g in groups])
    newest = deploys.newest_version(yard.version_times())
    rows = [
        {
            **group_row(group),
            "importance": example.importance if example is not None else None,
            "new_in": deploys.new_in(group, newest),
        }
        for group, example in zip(groups, examples, strict=True)
    ]
    return {
        "newest_version": newest,
        "groups": rows,
        "count": len(rows),
        "causes": int(causes_total),
        "total": int(total),
        "offset": offset,
        "limit": limit,
        "status": status,
    }


def group_info(runtime: Runtime, cause: str) -> GroupRow | None:
    """One cause group as ``dlx groups --json`` shows it, or None when it is empty."""
    found = runtime.graveyard.groups_of([cause])
    return group_row(found[0]) if found else None


def group_versions(runtime: Runtime, group: GroupRow) -> dict[str, object]:
    """The cause page's code versions: ``new_in`` (the newest version, when the cause was first
    seen with it, else None) and ``versions``, ``(version, obituaries)`` oldest version first."""
    first_seen = runtime.graveyard.version_times()
    order = {v: i for i, v in enumerate(deploys.version_order(first_seen))}
    newest = deploys.newest_version(first_seen)
    counts = sorted(group["versions"].items(), key=lambda vc: (order.get(vc[0], len(order)), vc[0]))
    new_in = newest if newest and group["first_seen_version"] == newest else None
    return {"new_in": new_in, "versions": counts}


@dataclass
class GroupFilters:
    """Filters of a group page: exact queue, task and exception type, burial time bounds (ms)."""

    queue: str | None = None
    task: str | None = None
    exception: str | None = None
    since_ms: int | None = None
    until_ms: int | None = None
    #: An obituary status (:data:`~celery_dlx.store.status.STATUSES`), or ``all``.
    status: str = UNRESOLVED


@dataclass
class GroupPage:
    rows: list[ObituaryRow] = field(default_factory=list)
    offset: int = 0
    next_offset: int | None = None
    matching: int | None = None
    scanned: int = 0
    capped: bool = False


def group_page(
    runtime: Runtime,
    cause: str,
    filters: GroupFilters,
    *,
    offset: int = 0,
    limit: int = 50,
    registry: ProtobufRegistry | None = None,
) -> GroupPage:
    """Obituaries of one cause, newest first, ``limit`` from ``offset``.

    Without a queue or task filter the page is one ``ZREVRANGEBYSCORE ... LIMIT`` on the
    cause's index and ``matching`` is exact. A queue or task filter checks the ids against that
    queue's or task's index (``ZMSCORE``, no record read), at most
    :data:`~celery_dlx.store.graveyard.SCAN_CAP` ids for one page (``capped`` says so), and
    ``offset`` then counts the cause's ids, not matches. The exception type is part of the
    fingerprint and the cause's status counts are known, so those filters keep all or nothing
    without a scan (and give ``matching`` for a status filter alone).
    """
    yard = runtime.graveyard
    limit = max(1, min(limit, MAX_PAGE))
    page = GroupPage(offset=offset)
    found_group = yard.groups_of([cause])
    group = found_group[0] if found_group else None
    status_of = None if filters.status == ALL else filters.status
    having = None if status_of is None or group is None else status_count(group, status_of)
    other_type = filters.exception and (group is None or group.exc_type != filters.exception)
    if other_type or having == 0:
        page.matching = 0
        return page
    if group is not None and having == group.count:  # all have it: no filter, the count stays
        status_of = None
    f = filters
    wanted = Filters(f.queue, f.task, since_ms=f.since_ms, until_ms=f.until_ms, status=status_of)
    found = yard.cause_page(cause, wanted, offset, limit)
    page.next_offset, page.matching = found.next_offset, found.matching
    alone = (filters.queue, filters.task, filters.since_ms, filters.until_ms) == (None,) * 4
    if status_of is not None and alone and group is not None:
        page.matching = status_count(group, status_of)
    page.scanned, page.capped = found.scanned, found.capped
    obits = yard.load(found.ids, with_payload=True)
    page.rows = [obituary_row(ob, registry) for ob in obits if ob is not None]
    return page


class QueueParked(TypedDict):
    queue: str
    count: int
    due_now: int
    next_due_ms: int | None
    oldest_due_ms: int | None
    lateness_s: float | None
    next_due_at: str | None
    oldest_due_at: str | None


class CauseParked(TypedDict):
    cause: str
    count: int
    due_now: int
    task: str | None
    queue: str


class ParkedSummary(TypedDict):
    count: int
    due_now: int
    sampled: int
    complete: bool
    oldest_lateness_s: float | None
    queues: list[QueueParked]
    #: Per cause, most parked first (among the ``sampled`` retries).
    causes: list[CauseParked]


def _tally(per: dict[str, QueueParked], message: ParkedMessage, now: int) -> None:
    q = per.setdefault(
        message.queue,
        {
            "queue": message.queue,
            "count": 0,
            "due_now": 0,
            "next_due_ms": None,
            "oldest_due_ms": None,
            "lateness_s": None,  # this and the times: once every retry is counted
            "next_due_at": None,
            "oldest_due_at": None,
        },
    )
    q["count"] += 1
    due = message.due_ms
    if due <= now:
        q["due_now"] += 1
        if q["oldest_due_ms"] is None or due < q["oldest_due_ms"]:
            q["oldest_due_ms"] = due
    elif q["next_due_ms"] is None or due < q["next_due_ms"]:
        q["next_due_ms"] = due


def _tally_cause(per: dict[str, CauseParked], message: ParkedMessage, now: int) -> None:
    c = per.setdefault(
        message.cause,
        {
            "cause": message.cause,
            "count": 0,
            "due_now": 0,
            "task": message.task,
            "queue": message.queue,
        },
    )
    c["count"] += 1
    c["due_now"] += message.due_ms <= now


def parked_summary(runtime: Runtime) -> ParkedSummary:
    """Parked retries per queue: count, due now, next due, oldest lateness (seconds past due).

    The store has one index by due time, so per-queue numbers come from reading the
    :data:`PARKED_SCAN` soonest-due retries (``sampled`` says how many were read; every due
    retry is among them while fewer than that are due). ``count`` and ``due_now`` are exact.
    """
    now = now_ms()
    per: dict[str, QueueParked] = {}
    causes: dict[str, CauseParked] = {}
    read = 0
    for message in runtime.parking.soonest(PARKED_SCAN):
        _tally(per, message, now)
        _tally_cause(causes, message, now)
        read += 1
    queues = sorted(per.values(), key=lambda r: r["queue"])
    for q in queues:
        oldest = q["oldest_due_ms"]
        q["lateness_s"] = None if oldest is None else round((now - oldest) / 1000, 3)
        q["next_due_at"] = iso(q["next_due_ms"])
        q["oldest_due_at"] = iso(oldest)
    total = runtime.parking.count()
    lateness = [q["lateness_s"] for q in queues if q["lateness_s"] is not None]
    return {
        "count": total,
        "due_now": runtime.parking.due_count(now),
        "sampled": read,
        "complete": read >= total,
        "oldest_lateness_s": max(lateness) if lateness else None,
        "queues": queues,
        "causes": sorted(causes.values(), key=lambda c: (-c["count"], c["cause"])),
    }


#: Fates drawn on the overview's chart, in this order.
CHART_FATES = ("requeued", "parked", "drained", "buried", "replayed", "recovered", "purged")


def fate_chart(runtime: Runtime) -> dict[str, object]:
    """Per-minute fate counts of the last hour as SVG polyline points (numbers only), with totals
    per queue and fate."""
    width, height = 720, 160
    counts = runtime.history.counts(3600.0)
    minutes = list(range(counts.start_minute, counts.end_minute + 1))
    per_fate: dict[str, list[int]] = {}
    for row in counts.rows:
        series = per_fate.setdefault(row.fate, [0] * len(minutes))
        series[row.minute - counts.start_minute] += row.count
    peak = max((max(s) for s in per_fate.values()), default=0)
    scale = peak or 1
    step = width / max(1, len(minutes) - 1)
    lines = []
    rank = {f: i for i, f in enumerate(CHART_FATES)}
    for fate in sorted(per_fate, key=lambda f: (rank.get(f, len(rank)), f)):
        series = per_fate[fate]
        points = " ".join(
            f"{i * step:.1f},{height - (n / scale) * (height - 4) - 2:.1f}"
            for i, n in enumerate(series)
        )
        lines.append({"fate": fate, "points": points, "total": sum(series)})
    totals = [
        {"queue": queue, "fate": fate, "count": n}
        for (queue, fate), n in sorted(counts.totals().items())
    ]
    return {
        "width": width,
        "height": height,
        "peak": peak,
        "start_at": iso(counts.start_minute * 60000),
        "end_at": iso(counts.end_minute * 60000),
        "lines": lines,
        "totals": totals,
    }


def graveyard_queues(runtime: Runtime) -> list[dict[str, object]]:
    """``{queue, count, last_at}`` for every queue with obituaries."""
    return [
        {"queue": q, "count": n, "last_ms": last, "last_at": iso(last)}
        for q, n, last in runtime.graveyard.names("queue")
    ]


def overview_breakers(runtime: Runtime) -> list[dict[str, Any]]:
    """The open breakers, each with ``has_group``: whether its cause has obituaries (a held
    cause usually has none and its cause page would be a 404: the overview links it only then)."""
    rows = open_breakers(runtime)
    if not rows:
        return rows
    buried = {g.cause for g in runtime.graveyard.groups_of(sorted({r["cause"] for r in rows}))}
    return [{**r, "has_group": r["cause"] in buried} for r in rows]


def cause_breakers(runtime: Runtime, cause: str) -> list[dict[str, Any]]:
    """The open breakers of ``cause`` (one per queue it burns on)."""
    return [r for r in open_breakers(runtime) if r["cause"] == cause]
