"""Purging obituaries: each leaves a ``purged`` history entry holding its summary."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from celery_dlx.fates import PURGED
from celery_dlx.ops import obituaries
from celery_dlx.ops.obituaries import make_filters
from celery_dlx.store.graveyard import When
from celery_dlx.wiring.retention import remove_all
from celery_dlx.wiring.runtime import Runtime


@dataclass
class PurgeReport:
    """What :func:`purge` did (or would do, on a dry run)."""

    purged: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dry_run: bool = False


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
    """Delete obituaries; each leaves a ``purged`` history entry holding its identity and facts
    (:meth:`~celery_dlx.message.obituary.Obituary.leaving_note`: no traceback, headers or payload),
    or with ``keep_whole`` its whole JSON, so by default a purge frees what it removes.

    Raises:
        DLXError: neither ids nor a filter (without ``everything``).
    """
    filters = make_filters(queue=queue, task=task, cause=cause, since=since, until=until)
    targets = obituaries.targets(runtime, ids, filters, everything, "purge")
    removed, missing = remove_all(
        runtime, targets, PURGED, "purged by operator", dry_run, keep_whole=keep_whole
    )
    return PurgeReport(purged=removed, missing=missing, dry_run=dry_run)
