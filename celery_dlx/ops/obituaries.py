"""Reading the graveyard: list, get, group and count obituaries without consuming anything."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta

from celery_dlx.errors import DLXError
from celery_dlx.fates import now_ms
from celery_dlx.message.graveyard import CHUNK, Filters, Group, When, chunks
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.status import STATUSES
from celery_dlx.wiring.runtime import Runtime


def to_ms(value: When | None) -> int | None:
    """Epoch milliseconds of a ``since``/``until`` value.

    Raises:
        DLXError: the value is none of datetime, timedelta or epoch seconds.
    """
    if value is None:
        return None
    if isinstance(value, datetime):
        return int(value.timestamp() * 1000)
    if isinstance(value, timedelta):
        return now_ms() - int(value.total_seconds() * 1000)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value * 1000)
    raise DLXError(f"since/until must be a datetime, a timedelta or epoch seconds, got {value!r}")


def make_filters(
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    message_id: str | None = None,
    since: When | None = None,
    until: When | None = None,
    status: str | None = None,
) -> Filters:
    """A :class:`Filters` from the keyword filters of this module (``status``: one of
    :data:`~celery_dlx.message.status.STATUSES`, or ``all`` / None for any).

    Raises:
        DLXError: an unknown status.
    """
    if status is not None and status not in (*STATUSES, "all"):
        raise DLXError(f"unknown status {status!r}: one of {', '.join((*STATUSES, 'all'))}")
    chosen = None if status in (None, "all") else status
    return Filters(queue, task, cause, message_id, to_ms(since), to_ms(until), chosen)


def resolve_targets(
    runtime: Runtime,
    ids: Sequence[str] | None = None,
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    since: When | None = None,
    until: When | None = None,
    everything: bool = False,
    what: str = "replay",
) -> list[str]:
    """Obituary ids to act on: ``ids`` as given (deduplicated), else the filters' matches, oldest
    first; ``what`` names the operation in the error.

    Raises:
        DLXError: neither ids nor a filter, without ``everything``.
    """
    filters = make_filters(queue=queue, task=task, cause=cause, since=since, until=until)
    if ids:
        return list(dict.fromkeys(ids))
    if filters.empty() and not everything:
        raise DLXError(
            f"{what} needs obituary ids or a filter (--queue, --task, --cause/--group, --since), "
            "or --all (everything=True)"
        )
    return runtime.graveyard.ids(filters, limit=None, oldest_first=True)


def list_obituaries(
    runtime: Runtime,
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    message_id: str | None = None,
    since: When | None = None,
    until: When | None = None,
    limit: int | None = 100,
    oldest_first: bool = False,
    with_payload: bool = False,
    status: str | None = None,
) -> list[Obituary]:
    """Obituaries matching every given filter, newest first, without consuming anything.

    Args:
        queue, task, cause, message_id: exact matches.
        since, until: burial time bounds (datetime, timedelta ago, or epoch seconds).
        limit: most obituaries returned (None: all).
        with_payload: load the payload bytes too (the listing leaves them out by default).
        status: only obituaries of this status (``unresolved``, ``replayed``, ``resolved``,
            ``failed-again``); None or ``all``: any.
    """
    filters = make_filters(
        queue=queue,
        task=task,
        cause=cause,
        message_id=message_id,
        since=since,
        until=until,
        status=status,
    )
    yard = runtime.graveyard
    ids = yard.ids(filters, limit=limit, oldest_first=oldest_first)
    out: list[Obituary] = []
    for chunk in chunks(ids, CHUNK):
        out.extend(ob for ob in yard.load(chunk, with_payload=with_payload) if ob is not None)
    return out


def get_obituary(runtime: Runtime, ident: str, *, with_payload: bool = True) -> Obituary | None:
    """One obituary by its id, or the latest obituary of a message id; None if there is none."""
    yard = runtime.graveyard
    found = yard.load([ident], with_payload=with_payload)[0]
    if found is not None:
        return found
    latest = yard.latest_of_message(ident)
    return None if latest is None else yard.load([latest], with_payload=with_payload)[0]


def groups(runtime: Runtime) -> list[Group]:
    """The graveyard grouped by cause fingerprint, most recently seen first."""
    return runtime.graveyard.groups()


def queues(runtime: Runtime) -> list[tuple[str, int, int]]:
    """``(queue, obituaries, last burial ms)`` for every queue with obituaries."""
    return runtime.graveyard.names("queue")


def count(runtime: Runtime) -> int:
    """How many obituaries the graveyard holds."""
    return runtime.graveyard.count()
