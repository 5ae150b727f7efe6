"""Replays for people on call: targets resolved first, a canary that must succeed, then the rest.

:func:`replay` does the publishing, the ledger and the rate. This module adds
what the command line needs around it: the list of targets up front (so progress has a total),
and the canary: replay one obituary, wait for its fate, go on only if it succeeded.

How the canary's fate is known (watching the failure history for the message id, after the
history's last entry before the replay):

* ``recovered``: a DLX task ran the replayed message successfully (DLXTask records ``recovered``
  for a replayed message even though the replay reset its attempts). Success.
* ``requeued``, ``parked`` or ``buried``: it failed again. The canary failed; nothing more is
  replayed (its new fate is already in the graveyard or the parking store).
* ``consumed`` (only for foreign messages, whose consumers record no success): the queue shows no
  ready message and no failure arrived within ``settle`` seconds after. Weaker: a consumer
  slower than ``settle`` that fails afterwards is missed. Counts as success.
* ``timeout``: none of the above within ``timeout`` seconds. Not a success.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_dlx.errors import DLXError, PublishError
from celery_dlx.fates import BURIED, PARKED, RECOVERED, REPLAYED, REQUEUED, FateEvent, now_ms
from celery_dlx.message.headers import clean_headers
from celery_dlx.message.names import OWN_HEADERS, REPLAYED_HEADER
from celery_dlx.message.obituary import ORIGIN_FOREIGN, Obituary
from celery_dlx.message.outgoing import Outgoing, copy_properties
from celery_dlx.ops import obituaries
from celery_dlx.ops.obituaries import make_filters
from celery_dlx.ops.render import iso
from celery_dlx.store.graveyard import CHUNK, Graveyard, When, chunks


@dataclass
class ReplayReport:
    """What :func:`replay` did (or would do, on a dry run)."""

    replayed: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    dry_run: bool = False


def replay_copy(ob: Obituary, *, keep_attempts: bool = False) -> Outgoing:
    """The message to publish for a replay of ``ob``: its payload to its queue, default exchange.

    celery_dlx's attempt headers are dropped (a fresh budget) unless ``keep_attempts``; broker
    ``x-death*`` headers always are. ``x-dlx-replayed`` names the obituary.
    """
    headers = clean_headers(ob.headers)
    if not keep_attempts:
        headers = {k: v for k, v in headers.items() if k not in OWN_HEADERS}
    headers[REPLAYED_HEADER] = ob.id
    return Outgoing(
        body=ob.payload or b"",
        routing_key=ob.queue,
        exchange="",
        headers=headers,
        properties=copy_properties(ob.properties),
    )


def _replayed_event(ob: Obituary, keep_attempts: bool, force: bool, at: int) -> FateEvent:
    return FateEvent(
        fate=REPLAYED,
        queue=ob.queue,
        message_id=ob.message_id,
        attempt=ob.attempt if keep_attempts else 0,
        task=ob.task,
        cause=ob.cause,
        exc_type=ob.exc_type,
        reason=f"replayed from obituary {ob.id}",
        importance=ob.importance,
        first_failure_ms=ob.first_failure_ms,
        at_ms=at,
        extra={"obituary_id": ob.id, "keep_attempts": keep_attempts, "forced": force},
    )


class _Pacer:
    """Spaces operations to at most ``rate`` per second (None: no limit)."""

    def __init__(self, rate: float | None, sleep: Callable[[float], None] = time.sleep) -> None:
        if rate is not None and rate <= 0:
            raise DLXError(f"replay rate must be a positive number per second, got {rate}")
        self.rate = rate
        self.sleep = sleep
        self.start = time.monotonic()
        self.done = 0

    def wait(self, n: int) -> None:
        if self.rate is not None:
            ahead = self.start + self.done / self.rate - time.monotonic()
            if ahead > 0:
                self.sleep(ahead)
        self.done += n

    def chunk(self) -> int:
        return CHUNK if self.rate is None else max(1, min(CHUNK, int(self.rate / 10) or 1))


def replay(
    runtime: Any,
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
) -> ReplayReport:
    """Put buried messages back on their queues (default exchange, publisher confirms).

    Each obituary is replayed once: one already in the replay ledger is skipped unless
    ``force``. The obituary stays in the graveyard; a ``replayed`` fate is recorded.

    Args:
        runtime: the app's runtime (its publisher and Redis are used).
        ids: obituary ids; otherwise the filters (``cause`` replays one group) select them.
        everything: allow replaying the whole graveyard when neither ids nor filters are given.
        rate: most replays per second (None: as fast as the broker confirms).
        keep_attempts: keep celery_dlx's attempt headers instead of a fresh budget.
        force: replay obituaries already replayed.
        dry_run: report what would be replayed, publish and record nothing.
        progress: called with the number of obituaries handled after each chunk.

    Raises:
        DLXError: neither ids nor a filter (without ``everything``), or a bad ``rate``.
    """
    filters = make_filters(queue=queue, task=task, cause=cause, since=since, until=until)
    targets = obituaries.targets(runtime, ids, filters, everything, "replay")
    yard = Graveyard(runtime.redis, runtime.keys)
    pacer = _Pacer(rate)
    report = ReplayReport(dry_run=dry_run)
    for chunk in chunks(targets, pacer.chunk()):
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
        elif todo:
            pacer.wait(len(todo))
            _replay_chunk(runtime, yard, todo, keep_attempts, force, report)
        if progress is not None:
            progress(len(chunk))
    return report


def _replay_chunk(
    runtime: Any,
    yard: Graveyard,
    todo: list[Obituary],
    keep_attempts: bool,
    force: bool,
    report: ReplayReport,
) -> None:
    copies = [replay_copy(ob, keep_attempts=keep_attempts) for ob in todo]
    try:
        results = runtime.publisher.publish_many(copies)
    except (PublishError, OSError) as exc:
        runtime.reset_publisher()
        report.failed.extend((ob.id, f"not confirmed: {exc}") for ob in todo)
        return
    at = now_ms()
    done = [ob for ob, ok in zip(todo, results, strict=True) if ok]
    report.failed.extend(
        (ob.id, f"broker refused it: queue {ob.queue!r} missing?")
        for ob, ok in zip(todo, results, strict=True)
        if not ok
    )
    yard.add_replays([(ob.id, at) for ob in done])
    for ob in done:
        runtime.record(_replayed_event(ob, keep_attempts, force, at))
        report.replayed.append(ob.id)


#: Fates that mean the canary failed again.
FAILURE_FATES = (REQUEUED, PARKED, BURIED)
#: Canary outcomes that let the replay go on.
SUCCESS_OUTCOMES = ("recovered", "consumed")


@dataclass
class CanaryResult:
    """The fate of the canary replay."""

    obituary_id: str
    message_id: str
    queue: str
    outcome: str
    fate: str | None = None
    detail: str = ""
    waited_s: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.outcome in SUCCESS_OUTCOMES

    def to_json(self) -> dict[str, Any]:
        return {
            "obituary_id": self.obituary_id,
            "message_id": self.message_id,
            "queue": self.queue,
            "outcome": self.outcome,
            "succeeded": self.succeeded,
            "fate": self.fate,
            "detail": self.detail,
            "waited_s": round(self.waited_s, 3),
        }


@dataclass
class ReplayRun:
    """What ``celery dlx replay`` did: the graveyard's report, the canary, and whether it stopped."""

    targets: int
    report: ReplayReport
    canary: CanaryResult | None = None
    stopped: bool = False
    not_replayed: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Nothing failed, nothing was missing, the canary (if any) succeeded."""
        return not (self.report.failed or self.report.missing or self.stopped)

    def to_json(self) -> dict[str, Any]:
        r = self.report
        return {
            "dry_run": r.dry_run,
            "targets": self.targets,
            "replayed": list(r.replayed),
            "skipped": [{"id": i, "reason": why} for i, why in r.skipped],
            "failed": [{"id": i, "reason": why} for i, why in r.failed],
            "missing": list(r.missing),
            "canary": self.canary.to_json() if self.canary else None,
            "stopped": self.stopped,
            "not_replayed": list(self.not_replayed),
        }


def resolve_targets(
    runtime: Any,
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
    first.

    Raises:
        DLXError: neither ids nor a filter, without ``everything``.
    """
    if ids:
        return list(dict.fromkeys(ids))
    filters = make_filters(queue=queue, task=task, cause=cause, since=since, until=until)
    if filters.empty() and not everything:
        raise DLXError(
            f"{what} needs obituary ids, a filter (--queue, --task, --cause/--group, --since) "
            "or --all"
        )
    return Graveyard(runtime.redis, runtime.keys).ids(filters, limit=None, oldest_first=True)


def history_tail(runtime: Any) -> str:
    """The id of the history stream's last entry (``0-0`` when empty)."""
    last = runtime.redis.xrevrange(runtime.keys.history, "+", "-", count=1)
    if not last:
        return "0-0"
    raw = last[0][0]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


class FateWatch:
    """Reads the history entries of one message appended after ``after`` (blocking reads)."""

    def __init__(self, runtime: Any, message_id: str, after: str) -> None:
        self.redis = runtime.redis
        self.key = runtime.keys.history
        self.message_id = message_id
        self.last = after

    def next_fate(self, block_ms: int) -> str | None:
        """The first fate of the message appended since the last call, waiting up to ``block_ms``."""
        reply = self.redis.xread({self.key: self.last}, count=1000, block=block_ms)
        for _, entries in reply or ():
            for entry_id, fields in entries:
                self.last = _text(entry_id)
                decoded = {_text(k): _text(v) for k, v in fields.items()}
                if (
                    decoded.get("message_id") == self.message_id
                    and decoded.get("fate") != "replayed"
                ):
                    return decoded.get("fate")
        return None


def ready_messages(runtime: Any, queue: str) -> int | None:
    """Ready messages in ``queue`` (passive declare), or None when it cannot be read."""
    try:
        with runtime.app.connection_for_read() as conn:
            conn.ensure_connection(max_retries=1)
            channel = conn.connection.channel()
            try:
                return int(channel.queue_declare(queue, passive=True).message_count)
            finally:
                channel.close()
    except Exception:  # a missing queue or an unreachable broker: no evidence either way
        return None


def watch_canary(
    runtime: Any,
    ob: Obituary,
    after: str,
    *,
    timeout: float = 120.0,
    settle: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
) -> CanaryResult:
    """Wait for the fate of ``ob``'s replayed message (see the module's docstring)."""
    watch = FateWatch(runtime, ob.message_id, after)
    start = clock()
    empty_since: float | None = None
    foreign = ob.origin == ORIGIN_FOREIGN
    while True:
        elapsed = clock() - start
        if elapsed >= timeout:
            return CanaryResult(
                ob.id,
                ob.message_id,
                ob.queue,
                "timeout",
                detail=f"no fate within {timeout:g}s (--canary-timeout): is a consumer running?",
                waited_s=elapsed,
            )
        block = int(min(500.0, max(1.0, (timeout - elapsed) * 1000)))
        fate = watch.next_fate(block)
        if fate == RECOVERED:
            return CanaryResult(
                ob.id,
                ob.message_id,
                ob.queue,
                "recovered",
                fate,
                "the replayed message ran successfully",
                clock() - start,
            )
        if fate in FAILURE_FATES:
            return CanaryResult(
                ob.id,
                ob.message_id,
                ob.queue,
                "failed",
                fate,
                f"the replayed message failed again ({fate}): the cause is not fixed",
                clock() - start,
            )
        if not foreign:
            continue
        if empty_since is None:
            if ready_messages(runtime, ob.queue) == 0:
                empty_since = clock()
        elif clock() - empty_since >= settle:
            return CanaryResult(
                ob.id,
                ob.message_id,
                ob.queue,
                "consumed",
                None,
                f"taken from {ob.queue!r} with no failure within {settle:g}s (--canary-settle)",
                clock() - start,
            )


def replay_run(
    runtime: Any,
    targets: Sequence[str],
    *,
    rate: float | None = None,
    keep_attempts: bool = False,
    force: bool = False,
    dry_run: bool = False,
    canary: bool = False,
    canary_timeout: float = 120.0,
    canary_settle: float = 5.0,
    progress: Callable[[int], None] | None = None,
) -> ReplayRun:
    """Replay ``targets`` (obituary ids), through a canary first when ``canary``.

    The canary is the first target the ledger allows (a replayed one is skipped unless
    ``force``). When it does not succeed, nothing else is replayed: ``stopped`` is True and
    ``not_replayed`` lists the rest. On a dry run the canary is chosen but not replayed.

    Raises:
        DLXError: a bad ``rate``.
    """
    if rate is not None and rate <= 0:
        raise DLXError(f"--rate must be a positive number per second, got {rate}")
    run = ReplayRun(targets=len(targets), report=ReplayReport(dry_run=dry_run))
    rest = list(targets)
    if canary and not dry_run:
        rest = _canary_first(
            runtime, run, rest, keep_attempts, force, canary_timeout, canary_settle, progress
        )
        if run.stopped:
            run.not_replayed = rest
            return run
    if rest:
        report = replay(
            runtime,
            rest,
            rate=rate,
            keep_attempts=keep_attempts,
            force=force,
            dry_run=dry_run,
            progress=progress,
        )
        _merge(run.report, report)
    return run


def _canary_first(
    runtime: Any,
    run: ReplayRun,
    targets: list[str],
    keep_attempts: bool,
    force: bool,
    timeout: float,
    settle: float,
    progress: Callable[[int], None] | None,
) -> list[str]:
    """Replay targets one by one until one is actually published, then watch it; the rest."""
    yard = Graveyard(runtime.redis, runtime.keys)
    for i, oid in enumerate(targets):
        after = history_tail(runtime)
        report = replay(runtime, [oid], keep_attempts=keep_attempts, force=force)
        _merge(run.report, report)
        if progress is not None:
            progress(1)
        if not report.replayed:
            continue
        ob = yard.load([oid])[0]
        if ob is None:  # purged meanwhile: its message is on its way all the same
            run.canary = CanaryResult(oid, "", "", "timeout", detail="obituary vanished")
            run.stopped = True
            return targets[i + 1 :]
        run.canary = watch_canary(runtime, ob, after, timeout=timeout, settle=settle)
        run.stopped = not run.canary.succeeded
        return targets[i + 1 :]
    return []


def _merge(into: ReplayReport, report: ReplayReport) -> None:
    into.replayed.extend(report.replayed)
    into.skipped.extend(report.skipped)
    into.failed.extend(report.failed)
    into.missing.extend(report.missing)
