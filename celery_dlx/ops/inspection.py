"""What ``celery dlx list/show/groups/parked/stats`` show, as JSON-safe dicts (the command line
prints them as tables or JSON). Payloads are shown through :func:`celery_dlx.codecs.decode_payload`
(pickle is never loaded).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypedDict

from celery_dlx.codecs import Decoded, ProtobufRegistry, decode_payload, registry_from_config
from celery_dlx.fates import PURGED, FateEvent, now_ms
from celery_dlx.message.failure import Failure
from celery_dlx.message.graveyard import Group, When
from celery_dlx.message.obituary import Obituary
from celery_dlx.ops import deploys, obituaries
from celery_dlx.ops.ladders import ladder_depths
from celery_dlx.ops.render import iso, preview
from celery_dlx.wiring.runtime import Runtime

if TYPE_CHECKING:  # typing.Unpack is Python 3.11+; only annotations use it
    from typing_extensions import Unpack

#: Bytes of each payload decoded for a listing (``show`` decodes up to the codecs' default).
LIST_DECODE_LIMIT = 4096
#: Characters of the one-line payload preview in a listing.
PREVIEW_WIDTH = 120


class ObituaryFilters(TypedDict, total=False):
    """Filters of :func:`list_rows` (those of :func:`celery_dlx.ops.obituaries.list_obituaries`)."""

    queue: str | None
    task: str | None
    cause: str | None
    message_id: str | None
    since: When | None
    until: When | None
    limit: int | None
    oldest_first: bool
    status: str | None


class RowPayload(TypedDict):
    """What a listing row says of the payload."""

    size: int
    content_type: str | None
    kind: str | None
    type_name: str | None
    preview: str | None


class ObituaryRow(TypedDict):
    """One obituary in a listing (:func:`obituary_row`)."""

    id: str
    message_id: str
    queue: str
    task: str | None
    origin: str
    cause: str
    exc_type: str
    exc_message: str
    reason: str
    importance: str
    attempt: int
    buried_ms: int
    buried_at: str | None
    replayed_from: str | None
    replays: list[int]
    #: What became of it after a replay: unresolved, replayed, resolved or failed-again.
    status: str
    #: The obituary of its failure again (failed-again), or None.
    next: str | None
    #: Failures of its message before this one, replays included (0: its first).
    repeats: int
    payload: RowPayload


class ObituaryList(TypedDict):
    """A listing (:func:`list_rows`): the rows, how many are shown, the graveyard's size."""

    obituaries: list[ObituaryRow]
    count: int
    total: int


class GroupRow(TypedDict):
    """One cause group (:func:`group_row`)."""

    cause: str
    count: int
    total: int
    first_ms: int
    first_seen: str | None
    last_ms: int
    last_seen: str | None
    example_id: str
    exc_type: str
    exc_message: str
    task: str | None
    queue: str
    first_seen_ms: int | None
    first_seen_version: str | None
    last_seen_version: str | None
    versions: dict[str, int]
    #: Of ``count``: nobody replayed them (or their replay failed again, as another).
    unresolved: int
    #: Of ``count``: replayed, waiting for the outcome; resolved; failed again.
    replayed: int
    resolved: int
    failed_again: int


class CodeVersion(TypedDict):
    """A code version and when it was first seen in the graveyard."""

    version: str
    first_seen_ms: int
    first_seen: str | None


class GroupList(TypedDict):
    """:func:`groups_data`: the cause groups, how many, the graveyard's size, the code versions
    seen (oldest first), the newest, and the ``--new-since`` filter (None: not filtered)."""

    groups: list[GroupRow]
    count: int
    total: int
    code_versions: list[CodeVersion]
    newest_version: str | None
    new_since: str | None


class ParkedRow(TypedDict):
    """One parked retry (:func:`parked_data`)."""

    entry_id: str
    message_id: str
    task: str | None
    queue: str
    attempt: int
    cause: str
    parked_ms: int
    parked_at: str | None
    due_ms: int
    due_at: str | None
    due_in_s: float
    claimed: bool


class ParkedData(TypedDict):
    """Parked retries by due time and the TTL ladder's depths (:func:`parked_data`)."""

    backend: str
    count: int
    due_now: int
    messages: list[ParkedRow]
    #: Rows of :func:`celery_dlx.ops.ladders.ladder_depths`, None without the TTL ladder.
    ladder: list[dict[str, Any]] | None


class PurgeReport(TypedDict):
    """Entry ids purged and not found (:func:`purge_parked`)."""

    purged: list[str]
    missing: list[str]


class QueueDeaths(TypedDict):
    """One queue's obituaries in :func:`stats_data`."""

    queue: str
    count: int
    last_ms: int
    last_at: str | None
    oldest_ms: int | None
    oldest_at: str | None


class GraveyardStats(TypedDict):
    """The graveyard in :func:`stats_data`."""

    count: int
    oldest_ms: int | None
    oldest_at: str | None
    oldest_age_s: float | None
    queues: list[QueueDeaths]


class ParkedStats(TypedDict):
    """The parking store in :func:`stats_data`."""

    count: int
    due_now: int
    next_due_ms: int | None
    next_due_at: str | None


class MalformedCounter(TypedDict):
    """A counter field :func:`stats_data` could not read, and why."""

    key: str
    field: str
    reason: str


class Stats(TypedDict):
    """What :func:`stats_data` returns."""

    window_s: float
    fates: dict[str, dict[str, int]]
    totals: dict[str, int]
    graveyard: GraveyardStats
    parked: ParkedStats
    history_length: int
    malformed_counters: list[MalformedCounter]


def registry_for(runtime: Runtime, extra_sets: Sequence[str] = ()) -> ProtobufRegistry:
    """The protobuf registry of the app's settings, plus descriptor sets from the command line.

    Raises:
        ConfigurationError: a descriptor set or module cannot be loaded.
    """
    registry = registry_from_config(runtime.config)
    for path in extra_sets:
        registry.add_descriptor_set(path)
    return registry


def decode_obituary(
    ob: Obituary, registry: ProtobufRegistry | None, limit: int | None = None
) -> Decoded | None:
    """The decoded payload of ``ob`` (None when it was loaded without its payload)."""
    if ob.payload is None:
        return None
    options: dict[str, int] = {} if limit is None else {"limit": limit}
    return decode_payload(
        ob.payload,
        content_type=ob.content_type,
        content_encoding=ob.content_encoding,
        headers=ob.headers,
        registry=registry,
        **options,
    )


def payload_preview(decoded: Decoded, width: int = PREVIEW_WIDTH) -> str:
    """One line saying what a payload holds: ``PaymentFailed {"order_id":...}``, ``celery ...``."""
    data = decoded.data
    if decoded.kind == "protobuf" and decoded.type_name:
        short = decoded.type_name.rsplit(".", 1)[-1]
        return f"{short} {preview(data, width - len(short) - 1)}"
    if decoded.kind == "celery" and isinstance(data, dict):
        inner = data.get("decoded")
        if isinstance(inner, dict) and inner:
            shown = {
                where: {str(v.get("type_name", "")).rsplit(".", 1)[-1]: v.get("data")}
                if isinstance(v, dict)
                else v
                for where, v in inner.items()
            }
            return preview(shown, width)
        return preview({"args": data.get("args"), "kwargs": data.get("kwargs")}, width)
    return preview(data, width)


def obituary_row(ob: Obituary, registry: ProtobufRegistry | None = None) -> ObituaryRow:
    """One obituary as a listing row (``celery dlx list --json``)."""
    decoded = decode_obituary(ob, registry, LIST_DECODE_LIMIT)
    return {
        "id": ob.id,
        "message_id": ob.message_id,
        "queue": ob.queue,
        "task": ob.task,
        "origin": ob.origin,
        "cause": ob.cause,
        "exc_type": ob.exc_type,
        "exc_message": ob.exc_message,
        "reason": ob.reason,
        "importance": ob.importance,
        "attempt": ob.attempt,
        "buried_ms": ob.buried_ms,
        "buried_at": iso(ob.buried_ms),
        "replayed_from": ob.replayed_from,
        "replays": list(ob.replays),
        "status": ob.status_name,
        "next": ob.status.get("next") or None,
        "repeats": int(ob.status.get("repeats") or 0),
        "payload": {
            "size": ob.payload_size,
            "content_type": ob.content_type,
            "kind": decoded.kind if decoded else None,
            "type_name": decoded.type_name if decoded else None,
            "preview": payload_preview(decoded) if decoded else None,
        },
    }


def list_rows(
    runtime: Runtime,
    *,
    registry: ProtobufRegistry | None = None,
    decode: bool = True,
    **filters: Unpack[ObituaryFilters],
) -> ObituaryList:
    """Obituaries matching ``filters`` (see :func:`celery_dlx.ops.obituaries.list_obituaries`),
    how many, and the graveyard's size."""
    found = obituaries.list_obituaries(runtime, with_payload=decode, **filters)
    rows = [obituary_row(ob, registry) for ob in found]
    return {"obituaries": rows, "count": len(rows), "total": obituaries.count(runtime)}


def show_data(
    ob: Obituary, registry: ProtobufRegistry | None, *, raw: bool = False
) -> dict[str, object]:
    """Every stored field of the obituary, JSON-safe, plus ``*_at`` ISO times, its payload
    decoded as ``payload.decoded``, and with ``raw`` its bytes as ``payload.base64``
    (``celery dlx show --json``)."""
    data = ob.json_safe()
    payload = data["payload"]
    if isinstance(payload, dict):  # always: json_safe's payload view
        if not raw:
            payload["base64"] = None
        decoded = decode_obituary(ob, registry)
        payload["decoded"] = decoded.to_json() if decoded else None
    data["buried_at"] = iso(ob.buried_ms)
    data["first_failure_at"] = iso(ob.first_failure_ms)
    data["last_failure_at"] = iso(ob.last_failure_ms)
    data["attempts"] = [
        {"at_ms": a.at_ms, "fate": a.fate, "cause": a.cause, "at": iso(a.at_ms)}
        for a in ob.attempts
    ]
    data["replays"] = [{"at_ms": at, "at": iso(at)} for at in ob.replays]
    return data


def group_row(group: Group) -> GroupRow:
    """One cause group (``celery dlx groups --json``)."""
    return {
        "cause": group.cause,
        "count": group.count,
        "total": group.total,
        "first_ms": group.first_ms,
        "first_seen": iso(group.first_ms),
        "last_ms": group.last_ms,
        "last_seen": iso(group.last_ms),
        "example_id": group.example_id,
        "exc_type": group.exc_type,
        "exc_message": group.exc_message,
        "task": group.task,
        "queue": group.queue,
        "first_seen_ms": group.first_seen_ms,
        "first_seen_version": group.first_version,
        "last_seen_version": group.last_version,
        "versions": dict(group.versions),
        "unresolved": group.unresolved,
        "replayed": group.statuses.get("replayed", 0),
        "resolved": group.statuses.get("resolved", 0),
        "failed_again": group.statuses.get("failed-again", 0),
    }


def groups_data(runtime: Runtime, *, new_since: str | None = None) -> GroupList:
    """Every cause in the graveyard, most recently seen first; with ``new_since``, only those
    new since that code version (:func:`celery_dlx.ops.deploys.new_since`).

    Raises:
        UnknownVersion: ``new_since`` was never seen in this graveyard.
    """
    found = obituaries.groups(runtime)
    first_seen = runtime.graveyard.version_times()
    if new_since is not None:
        found = deploys.new_since(found, first_seen, new_since)
    rows = [group_row(g) for g in found]
    return {
        "groups": rows,
        "count": len(rows),
        "total": obituaries.count(runtime),
        "code_versions": [
            {"version": v, "first_seen_ms": first_seen[v], "first_seen": iso(first_seen[v])}
            for v in deploys.version_order(first_seen)
        ],
        "newest_version": deploys.newest_version(first_seen),
        "new_since": new_since,
    }


def parked_data(runtime: Runtime, *, limit: int = 50, at_ms: int | None = None) -> ParkedData:
    """Parked retries by due time (``celery dlx parked --json``), and the TTL ladder's depths.
    ``claimed``: a drain holds it right now (its score is the lease's end, not its due time).
    """
    now = now_ms() if at_ms is None else at_ms
    messages: list[ParkedRow] = [
        {
            "entry_id": m.entry_id,
            "message_id": m.message_id,
            "task": m.task,
            "queue": m.queue,
            "attempt": m.attempt,
            "cause": m.cause,
            "parked_ms": m.parked_ms,
            "parked_at": iso(m.parked_ms),
            "due_ms": m.due_ms,
            "due_at": iso(m.due_ms),
            "due_in_s": round((m.due_ms - now) / 1000, 3),
            "claimed": m.lease_score != m.due_ms,
        }
        for m in runtime.parking.peek(limit)
    ]
    return {
        "backend": runtime.config.delay_backend,
        "count": runtime.parking.count(),
        "due_now": runtime.parking.due_count(now),
        "messages": messages,
        "ladder": ladder_depths(runtime) if runtime.config.delay_backend == "ttl" else None,
    }


def purge_parked(runtime: Runtime, entry_ids: Sequence[str]) -> PurgeReport:
    """Delete parked retries by entry id (``<message id>:<attempt>``, as ``parked`` shows); each
    leaves a ``purged`` history entry with its whole record (body in base64) under ``obituary``.
    """
    parking = runtime.parking
    purged: list[str] = []
    missing: list[str] = []
    for entry_id in entry_ids:
        message = parking.entry(entry_id)
        if message is None or not parking.remove([entry_id]):
            missing.append(entry_id)
            continue
        record: dict[str, object] = json.loads(message.meta_json())
        record["body_b64"] = base64.b64encode(message.body).decode("ascii")
        failure = Failure(
            task=message.task,
            queue=message.queue,
            message_id=message.message_id,
            attempt=message.attempt,
            cause=message.cause,
            reason="parked retry purged by an operator",
            importance=runtime.config.importance(message.queue),
        )
        runtime.record(FateEvent.of(PURGED, failure, extra={"obituary": record}))
        purged.append(entry_id)
    return {"purged": purged, "missing": missing}


def stats_data(runtime: Runtime, *, window_s: float = 3600.0, at_ms: int | None = None) -> Stats:
    """Fate counts per queue over the last ``window_s`` (``fates``: queue -> fate -> count), the
    graveyard and the parking store (:class:`Stats`)."""
    now = now_ms() if at_ms is None else at_ms
    counts = runtime.history.counts(window_s, at_ms=now)
    fates: dict[str, dict[str, int]] = {}
    for (queue, fate), n in sorted(counts.totals().items()):
        fates.setdefault(queue, {})[fate] = n
    per_queue: list[QueueDeaths] = []
    for queue, n, last_ms in obituaries.queues(runtime):
        oldest = obituaries.list_obituaries(runtime, queue=queue, limit=1, oldest_first=True)
        oldest_ms = oldest[0].buried_ms if oldest else None
        per_queue.append(
            {
                "queue": queue,
                "count": n,
                "last_ms": last_ms,
                "last_at": iso(last_ms),
                "oldest_ms": oldest_ms,
                "oldest_at": iso(oldest_ms),
            }
        )
    oldest_all = obituaries.list_obituaries(runtime, limit=1, oldest_first=True)
    oldest_ms = oldest_all[0].buried_ms if oldest_all else None
    parking = runtime.parking
    nxt = parking.peek(1)
    return {
        "window_s": window_s,
        "fates": fates,
        "totals": dict(sorted(counts.by_fate().items())),
        "graveyard": {
            "count": obituaries.count(runtime),
            "oldest_ms": oldest_ms,
            "oldest_at": iso(oldest_ms),
            "oldest_age_s": None if oldest_ms is None else round((now - oldest_ms) / 1000, 3),
            "queues": per_queue,
        },
        "parked": {
            "count": parking.count(),
            "due_now": parking.due_count(now),
            "next_due_ms": nxt[0].due_ms if nxt else None,
            "next_due_at": iso(nxt[0].due_ms) if nxt else None,
        },
        "history_length": runtime.history.length(),
        "malformed_counters": [
            {"key": key, "field": name, "reason": reason} for key, name, reason in counts.malformed
        ],
    }
