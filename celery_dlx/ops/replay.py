"""Replay: put buried messages back on the queue that failed, once each, at a rate, with a ledger.

A copy is published (default exchange, publisher confirms, a fresh attempt budget unless
``keep_attempts``) and a ``replayed`` fate recorded; the obituary stays in the graveyard. A copy
redirected to another existing queue (``to_queue``) names it in ``x-dlx-queue``, so a failure
there requeues, parks and buries it there, never back in the queue it first died in; the ledger
keeps that queue. The canary is in :mod:`celery_dlx.ops.canary`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from celery_dlx.broker import probe
from celery_dlx.broker.errors import BROKER_ERRORS
from celery_dlx.errors import DLXError
from celery_dlx.fates import REPLAYED, FateEvent, now_ms
from celery_dlx.message.failure import Failure
from celery_dlx.message.graveyard import CHUNK, When, chunks
from celery_dlx.message.headers import clean_headers
from celery_dlx.message.names import OWN_HEADERS, QUEUE_HEADER, REPLAYED_HEADER
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.outgoing import Outgoing, copy_properties
from celery_dlx.ops.obituaries import resolve_targets as resolve_targets  # public here too
from celery_dlx.ops.render import iso
from celery_dlx.wiring.runtime import Runtime


@dataclass
class ReplayReport:
    """What :func:`replay` did (or would do, on a dry run)."""

    replayed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dry_run: bool = False
    #: The queue every replay went to instead of the one it died in (None: not redirected).
    to_queue: str | None = None
    #: With ``to_queue``: the queues the replayed messages died in, and how many from each.
    from_queues: dict[str, int] = field(default_factory=dict)


#: Longest queue name AMQP allows (a short string), in UTF-8 bytes.
QUEUE_NAME_LIMIT = 255


def check_target_queue(runtime: Runtime, name: str) -> str:
    """``name``, once the broker says the queue exists (a passive declare: nothing is created).

    Raises:
        DLXError: an empty or too long name, no such queue, or an unreachable broker.
    """
    if not name or not name.strip():
        raise DLXError("--to-queue needs a queue name")
    if len(name.encode("utf-8")) > QUEUE_NAME_LIMIT:
        raise DLXError(f"--to-queue: a queue name has at most {QUEUE_NAME_LIMIT} bytes")
    try:
        missing = probe.missing_entities(runtime.app, queues=[name]).queues
    except BROKER_ERRORS as exc:
        raise DLXError(f"cannot check that queue {name!r} exists: {exc}") from exc
    if name in missing:
        raise DLXError(
            f"not replayed: queue {name!r} does not exist ({missing[name]}); declare it first "
            "(celery_dlx never creates a queue for a replay), or correct --to-queue"
        )
    return name


def replay_copy(
    ob: Obituary, *, keep_attempts: bool = False, to_queue: str | None = None
) -> Outgoing:
    """The message a replay of ``ob`` publishes: its payload to its queue (or ``to_queue``)
    through the default exchange, with its producer's headers, ``x-dlx-replayed`` naming the
    obituary, without broker ``x-death*`` headers, and without celery_dlx's attempt headers (a
    fresh budget) unless ``keep_attempts``."""
    headers = clean_headers(ob.headers)
    if not keep_attempts:
        headers = {k: v for k, v in headers.items() if k not in OWN_HEADERS}
    headers[REPLAYED_HEADER] = ob.id
    if to_queue:
        headers[QUEUE_HEADER] = to_queue
    return Outgoing(
        body=ob.payload or b"",
        routing_key=to_queue or ob.queue,
        exchange="",
        headers=headers,
        properties=copy_properties(ob.properties),
    )


def _replayed_event(
    ob: Obituary, keep_attempts: bool, force: bool, at: int, to_queue: str | None = None
) -> FateEvent:
    reason = f"replayed from obituary {ob.id}"
    extra: dict[str, object] = {
        "obituary_id": ob.id,
        "keep_attempts": keep_attempts,
        "forced": force,
    }
    if to_queue:
        reason += f" to queue {to_queue} (died in {ob.queue})"
        extra.update(from_queue=ob.queue, to_queue=to_queue)
    return _event(ob, reason, extra, at, ob.attempt if keep_attempts else 0)


def _event(
    ob: Obituary, reason: str, extra: dict[str, object], at: int, attempt: int = 0
) -> FateEvent:
    failure = Failure(
        task=ob.task,
        queue=ob.queue,
        message_id=ob.message_id,
        attempt=attempt,
        cause=ob.cause,
        exc_type=ob.exc_type,
        reason=reason,
        importance=ob.importance,
        first_failure_ms=ob.first_failure_ms,
        at_ms=at,
    )
    return FateEvent.of(REPLAYED, failure, extra=extra)


def _publish(runtime: Runtime, obs: Sequence[Obituary], copies: list[Outgoing]) -> list[bool]:
    """Publish ``copies`` of ``obs`` with confirms. The obituaries are marked replayed before
    and unmarked when their copy is not confirmed, so two replays of one never run at once.

    Raises:
        the broker's errors (every obituary unmarked, the publisher reset).
    """
    yard = runtime.graveyard
    marked = yard.mark_replayed([ob.id for ob in obs], now_ms())
    try:
        results = runtime.publisher.publish_many(copies)
    except BROKER_ERRORS:
        runtime.reset_publisher()
        yard.unmark_replayed(marked, now_ms())
        raise
    refused = {ob.id for ob, ok in zip(obs, results, strict=True) if not ok}
    if refused:
        yard.unmark_replayed([oid for oid in marked if oid in refused], now_ms())
    return list(results)


class NotReplayed(DLXError):
    """:func:`replay_one`'s copy was not confirmed: ``refused`` by the broker (its queue
    missing?), or the publish failed (the error is ``__cause__``)."""

    def __init__(self, detail: str, *, refused: bool) -> None:
        super().__init__(detail)
        self.refused = refused


def replay_one(
    runtime: Runtime,
    ob: Obituary,
    copy: Outgoing,
    *,
    to_queue: str | None,
    reason: str,
    extra: dict[str, object],
) -> int:
    """Publish ``copy`` (of :func:`replay_copy`, then changed) as the replay of ``ob``, with a
    confirm, and record it in the ledger and as a ``replayed`` history entry (``reason``,
    ``extra``, attempt 0). Returns when it was recorded (epoch ms).

    Raises:
        NotReplayed: the broker did not confirm the copy (nothing recorded).
    """
    try:
        confirmed = _publish(runtime, [ob], [copy])
    except BROKER_ERRORS as exc:
        raise NotReplayed(f"not confirmed ({exc})", refused=False) from exc
    if not all(confirmed):
        raise NotReplayed("the broker refused it", refused=True)
    at = now_ms()
    runtime.graveyard.add_replays([(ob.id, at)], to_queue=to_queue or "")
    runtime.record(_event(ob, reason, extra, at))
    return at


class _Pacer:
    """Spaces operations to at most ``rate`` per second (None: no limit)."""

    def __init__(self, rate: float | None) -> None:
        if rate is not None and rate <= 0:
            raise DLXError(f"replay rate must be a positive number per second, got {rate}")
        self.rate = rate
        self.start = time.monotonic()
        self.done = 0

    def wait(self, n: int) -> None:
        if self.rate is not None:
            ahead = self.start + self.done / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)
        self.done += n

    def chunk(self) -> int:
        return CHUNK if self.rate is None else max(1, min(CHUNK, int(self.rate / 10) or 1))


def replay(
    runtime: Runtime,
    ids: Sequence[str] | None = None,
    *,
    queue: str | None = None,
    task: str | None = None,
    cause: str | None = None,
    since: When | None = None,
    until: When | None = None,
    everything: bool = False,
    rate: float | None = None,
    keep_attempts: bool = False,
    force: bool = False,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    to_queue: str | None = None,
) -> ReplayReport:
    """Replay obituaries (see the module's docstring); one already in the ledger is skipped
    unless ``force``.

    Args:
        ids: obituary ids; otherwise the filters (``cause`` replays one group) select them.
        everything: allow replaying the whole graveyard when neither ids nor filters are given.
        rate: most replays per second (None: as fast as the broker confirms).
        keep_attempts: keep celery_dlx's attempt headers instead of a fresh budget.
        force: replay obituaries already replayed.
        dry_run: report what would be replayed, publish and record nothing.
        progress: called with the number of obituaries handled after each chunk.
        to_queue: publish to this queue instead of the one each message died in; it must exist
            (checked first, by a passive declare, on dry runs too).

    Raises:
        DLXError: neither ids nor a filter (without ``everything``), a bad ``rate``, or
            ``to_queue`` does not exist (then nothing is replayed).
    """
    _Pacer(rate)  # a bad rate is refused before anything else
    if to_queue is not None:
        to_queue = check_target_queue(runtime, to_queue)
    targets = resolve_targets(
        runtime,
        ids,
        queue=queue,
        task=task,
        cause=cause,
        since=since,
        until=until,
        everything=everything,
        what="replay",
    )
    return replay_targets(
        runtime,
        targets,
        rate=rate,
        keep_attempts=keep_attempts,
        force=force,
        dry_run=dry_run,
        progress=progress,
        to_queue=to_queue,
    )


def replay_targets(
    runtime: Runtime,
    targets: Sequence[str],
    *,
    rate: float | None = None,
    keep_attempts: bool = False,
    force: bool = False,
    dry_run: bool = False,
    progress: Callable[[int], None] | None = None,
    to_queue: str | None = None,
) -> ReplayReport:
    """:func:`replay` of obituary ids already chosen, ``to_queue`` (if any) already checked
    (:func:`check_target_queue`)."""
    yard = runtime.graveyard
    pacer = _Pacer(rate)
    report = ReplayReport(dry_run=dry_run, to_queue=to_queue or None)
    for chunk in chunks(list(dict.fromkeys(targets)), pacer.chunk()):
        todo: list[Obituary] = []
        for oid, ob in zip(chunk, yard.load(chunk, with_payload=True), strict=True):
            if ob is None:
                report.missing.append(oid)
            elif ob.replays and not force:
                report.skipped.append(
                    (oid, f"already replayed at {iso(ob.replays[-1])} (--force replays it again)")
                )
            else:
                todo.append(ob)
        if dry_run:
            report.replayed.extend(ob.id for ob in todo)
            _count_from(report, todo)
        elif todo:
            pacer.wait(len(todo))
            _replay_chunk(runtime, todo, keep_attempts, force, report)
        if progress is not None:
            progress(len(chunk))
    return report


def _replay_chunk(
    runtime: Runtime, todo: list[Obituary], keep_attempts: bool, force: bool, report: ReplayReport
) -> None:
    to = report.to_queue
    copies = [replay_copy(ob, keep_attempts=keep_attempts, to_queue=to) for ob in todo]
    try:
        results = _publish(runtime, todo, copies)
    except BROKER_ERRORS as exc:
        report.failed.extend((ob.id, f"not confirmed: {exc}") for ob in todo)
        return
    at = now_ms()
    done = [ob for ob, ok in zip(todo, results, strict=True) if ok]
    report.failed.extend(
        (ob.id, f"broker refused it: queue {(to or ob.queue)!r} missing?")
        for ob, ok in zip(todo, results, strict=True)
        if not ok
    )
    runtime.graveyard.add_replays([(ob.id, at) for ob in done], to_queue=to or "")
    for ob in done:
        runtime.record(_replayed_event(ob, keep_attempts, force, at, to))
        report.replayed.append(ob.id)
    _count_from(report, done)


def _count_from(report: ReplayReport, replayed: Sequence[Obituary]) -> None:
    """Count, for a redirected replay, the queues the replayed messages died in."""
    if report.to_queue:
        for ob in replayed:
            report.from_queues[ob.queue] = report.from_queues.get(ob.queue, 0) + 1
