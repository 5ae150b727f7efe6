"""Removing obituaries with their fate recorded: an operator's purge, the retention sweep."""

from __future__ import annotations

from collections.abc import Iterable

from celery_dlx.fates import ARCHIVED, now_ms
from celery_dlx.message.graveyard import CHUNK, chunks
from celery_dlx.wiring.runtime import Runtime


def remove_all(
    runtime: Runtime,
    ids: Iterable[str],
    fate: str,
    reason: str,
    dry_run: bool,
    *,
    keep_whole: bool = False,
) -> tuple[list[str], list[str]]:
    """Remove the obituaries ``ids`` from the graveyard, each with its ``fate`` (``purged``,
    ``archived``) in the history; ``(removed, missing)``. ``dry_run`` removes nothing.

    The history entry holds the obituary's facts without traceback, headers or payload (with
    ``keep_whole``, its whole JSON), so a purge makes room on a full Redis."""
    yard = runtime.graveyard
    removed: list[str] = []
    missing: list[str] = []
    with_payload = keep_whole and not dry_run
    for chunk in chunks(list(ids), CHUNK):
        for oid, ob in zip(chunk, yard.load(chunk, with_payload=with_payload), strict=True):
            if ob is None:
                missing.append(oid)
                continue
            if dry_run:
                removed.append(oid)
                continue
            event = ob.fate_event(
                fate,
                now_ms(),
                reason=reason,
                extra={
                    "obituary_id": ob.id,
                    "obituary": ob.json_safe() if keep_whole else ob.leaving_note(),
                },
            )
            if yard.remove(ob, event):
                runtime.record(event, history=False)
                removed.append(oid)
            else:
                missing.append(oid)
    return removed, missing


def sweep_retention(runtime: Runtime, *, now: int | None = None, limit: int = 1000) -> int:
    """Move obituaries older than ``dlx_graveyard_retention``, and resolved ones older than
    ``dlx_resolved_retention``, to the history (``archived``); first, replayed obituaries whose
    message was not buried again within ``dlx_resolve_after`` become resolved.

    Safe to run from several processes at once: each obituary is archived exactly once.

    Returns:
        How many obituaries were archived (at most ``limit`` of each kind).
    """
    config, yard = runtime.config, runtime.graveyard
    at = now_ms() if now is None else now
    quiet = yard.since("replayed", at - int(config.resolve_after * 1000), limit)
    yard.resolve(quiet, at, "quiet")
    retention = config.graveyard_retention
    old = yard.older_than(at - int(retention * 1000), limit)
    reason = f"older than dlx_graveyard_retention ({retention:g}s)"
    removed, _ = remove_all(runtime, old, ARCHIVED, reason, dry_run=False)
    kept = config.resolved_retention
    resolved = yard.since("resolved", at - int(kept * 1000), limit)
    reason = f"resolved more than dlx_resolved_retention ({kept:g}s) ago"
    gone, _ = remove_all(runtime, resolved, ARCHIVED, reason, dry_run=False)
    return len(removed) + len(gone)
