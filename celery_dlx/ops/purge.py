"""Purging obituaries: each leaves a ``purged`` history entry holding its summary."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from celery_dlx.fates import PURGED
from celery_dlx.message.graveyard import CHUNK, When, chunks
from celery_dlx.ops.obituaries import resolve_targets
from celery_dlx.wiring.retention import remove_all
from celery_dlx.wiring.runtime import Runtime


class PurgeJSON(TypedDict):
    """What ``celery dlx purge --json`` prints (and the console's purge answers): a dry run
    lists under ``would_purge`` what a real run lists under ``purged``."""

    dry_run: bool
    targets: int
    purged: list[str]
    would_purge: list[str]
    missing: list[str]


@dataclass
class PurgeReport:
    """What :func:`purge` did (or, on a dry run, would do)."""

    purged: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dry_run: bool = False
    targets: int = 0

    def to_json(self) -> PurgeJSON:
        return {
            "dry_run": self.dry_run,
            "targets": self.targets,
            "purged": [] if self.dry_run else list(self.purged),
            "would_purge": list(self.purged) if self.dry_run else [],
            "missing": list(self.missing),
        }


def purge(
    runtime: Runtime,
    ids: Sequence[str] | None = None,
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    since: When | None = None,
    until: When | None = None,
    everything: bool = False,
    dry_run: bool = False,
    keep_whole: bool = False,
) -> PurgeReport:
    """Delete obituaries; each leaves a ``purged`` history entry with its identity and facts
    (no traceback, headers or payload, so a purge frees what it removes), or with ``keep_whole``
    its whole JSON.

    Raises:
        DLXError: neither ids nor a filter (without ``everything``).
    """
    targets = resolve_targets(
        runtime,
        ids,
        queue=queue,
        task=task,
        cause=cause,
        since=since,
        until=until,
        everything=everything,
        what="purge",
    )
    return purge_targets(runtime, targets, dry_run=dry_run, keep_whole=keep_whole)


def purge_targets(
    runtime: Runtime,
    targets: Sequence[str],
    *,
    dry_run: bool = False,
    keep_whole: bool = False,
    progress: Callable[[int], None] | None = None,
) -> PurgeReport:
    """:func:`purge` of obituary ids already chosen; ``progress`` is called with the number
    handled after each chunk."""
    report = PurgeReport(dry_run=dry_run, targets=len(targets))
    for chunk in chunks(targets, CHUNK):
        removed, missing = remove_all(
            runtime, chunk, PURGED, "purged by operator", dry_run, keep_whole=keep_whole
        )
        report.purged.extend(removed)
        report.missing.extend(missing)
        if progress is not None:
            progress(len(chunk))
    return report
