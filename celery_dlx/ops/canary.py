"""Replays for people on call: targets resolved first, a canary that must succeed, then the rest.

:func:`celery_dlx.ops.replay.replay_targets` publishes and records; this module adds the canary:
replay one obituary, wait for its fate (watching the failure history for its message id, from
the history's last entry before the replay), go on only if it succeeded:

* ``recovered``: a DLX task ran the replayed message successfully (DLXTask records it for a
  replayed message even though the replay reset its attempts). Success.
* ``failed``: it was requeued, parked or buried again. Nothing more is replayed.
* ``consumed`` (foreign messages only, whose consumers record no success): the queue showed no
  ready message and no failure arrived within ``settle`` seconds after. Weaker: a consumer
  slower than ``settle`` that fails afterwards is missed. Counts as success.
* ``timeout``: none of the above within ``timeout`` seconds. Not a success.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypedDict

from celery_dlx.broker import probe
from celery_dlx.errors import DLXError
from celery_dlx.fates import BURIED, PARKED, RECOVERED, REQUEUED
from celery_dlx.message.obituary import ORIGIN_FOREIGN, Obituary
from celery_dlx.ops.replay import ReplayReport, check_target_queue, replay_targets
from celery_dlx.wiring.runtime import Runtime

#: Fates that mean the canary failed again.
FAILURE_FATES = (REQUEUED, PARKED, BURIED)
#: Canary outcomes that let the replay go on.
SUCCESS_OUTCOMES = ("recovered", "consumed")


class CanaryJSON(TypedDict):
    """The canary of ``replay --json``."""

    obituary_id: str
    message_id: str
    queue: str
    outcome: str
    succeeded: bool
    fate: str | None
    detail: str
    waited_s: float


class IdReason(TypedDict):
    """An obituary not replayed, and why."""

    id: str
    reason: str


class ReplayJSON(TypedDict):
    """What ``celery dlx replay --json`` prints (and the console's replay answers): a dry run
    lists under ``would_replay`` what a real run lists under ``replayed``."""

    dry_run: bool
    targets: int
    replayed: list[str]
    would_replay: list[str]
    skipped: list[IdReason]
    failed: list[IdReason]
    missing: list[str]
    canary: CanaryJSON | None
    stopped: bool
    not_replayed: list[str]


class RedirectedReplayJSON(ReplayJSON, total=False):
    """A replay to another queue (``--to-queue``) also says where and from which queues."""

    to_queue: str
    from_queues: dict[str, int]


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

    def to_json(self) -> CanaryJSON:
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
    """What ``celery dlx replay`` did: the report, the canary, and whether it stopped."""

    targets: int
    report: ReplayReport
    canary: CanaryResult | None = None
    stopped: bool = False
    not_replayed: list[str] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        """Nothing failed, nothing was missing, the canary (if any) succeeded."""
        return not (self.report.failed or self.report.missing or self.stopped)

    def to_json(self) -> RedirectedReplayJSON:
        r = self.report
        data: RedirectedReplayJSON = {
            "dry_run": r.dry_run,
            "targets": self.targets,
            "replayed": [] if r.dry_run else list(r.replayed),
            "would_replay": list(r.replayed) if r.dry_run else [],
            "skipped": [{"id": i, "reason": why} for i, why in r.skipped],
            "failed": [{"id": i, "reason": why} for i, why in r.failed],
            "missing": list(r.missing),
            "canary": self.canary.to_json() if self.canary else None,
            "stopped": self.stopped,
            "not_replayed": list(self.not_replayed),
        }
        if r.to_queue:
            data["to_queue"] = r.to_queue
            data["from_queues"] = dict(r.from_queues)
        return data


def watch_canary(
    runtime: Runtime,
    ob: Obituary,
    after: str,
    *,
    timeout: float = 120.0,
    settle: float = 5.0,
    clock: Callable[[], float] = time.monotonic,
    queue: str | None = None,
) -> CanaryResult:
    """Wait for the fate of ``ob``'s replayed message (see the module's docstring); ``queue``:
    where it was replayed to, if not its own."""
    last = after
    start = clock()
    empty_since: float | None = None
    where = queue or ob.queue

    def result(outcome: str, fate: str | None, detail: str) -> CanaryResult:
        return CanaryResult(ob.id, ob.message_id, where, outcome, fate, detail, clock() - start)

    while True:
        elapsed = clock() - start
        if elapsed >= timeout:
            why = f"no fate within {timeout:g}s (--canary-timeout): is a consumer running?"
            return result("timeout", None, why)
        block_ms = int(min(500.0, max(1.0, (timeout - elapsed) * 1000)))
        fate = None
        for entry_id, fields in runtime.history.after(last, count=1000, block_ms=block_ms):
            last = entry_id
            if fields.get("message_id") == ob.message_id and fields.get("fate") != "replayed":
                fate = fields.get("fate")
                break
        if fate == RECOVERED:
            return result("recovered", fate, "the replayed message ran successfully")
        if fate in FAILURE_FATES:
            why = f"the replayed message failed again ({fate}): the cause is not fixed"
            return result("failed", fate, why)
        if ob.origin != ORIGIN_FOREIGN:
            continue
        # a foreign consumer records no success: an empty queue and no failure for ``settle``
        if empty_since is None:
            if probe.ready_messages(runtime.app, where) == 0:
                empty_since = clock()
        elif clock() - empty_since >= settle:
            why = f"taken from {where!r} with no failure within {settle:g}s (--canary-settle)"
            return result("consumed", None, why)


def replay_run(
    runtime: Runtime,
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
    to_queue: str | None = None,
) -> ReplayRun:
    """Replay ``targets`` (obituary ids). With ``canary`` (not on a dry run), the first the
    ledger allows goes alone first; when it does not succeed nothing else is replayed:
    ``stopped`` is True and ``not_replayed`` lists the rest. ``to_queue``: see
    :func:`~celery_dlx.ops.replay.replay`.

    Raises:
        DLXError: a bad ``rate``; ``to_queue`` does not exist (nothing is replayed).
    """
    if rate is not None and rate <= 0:
        raise DLXError(f"--rate must be a positive number per second, got {rate}")
    run = ReplayRun(targets=len(targets), report=ReplayReport(dry_run=dry_run))
    rest = list(targets)
    if to_queue is not None:
        to_queue = run.report.to_queue = check_target_queue(runtime, to_queue)
    if canary and not dry_run:
        rest = []
        for i, oid in enumerate(targets):
            after = runtime.history.tail()
            report = replay_targets(
                runtime, [oid], keep_attempts=keep_attempts, force=force, to_queue=to_queue
            )
            _merge(run.report, report)
            if progress is not None:
                progress(1)
            if report.replayed:
                run.canary = _watch(runtime, oid, after, canary_timeout, canary_settle, to_queue)
                rest = list(targets[i + 1 :])
                break
        if run.canary is not None and not run.canary.succeeded:
            run.stopped = True
            run.not_replayed = rest
            return run
    if rest:
        report = replay_targets(
            runtime,
            rest,
            rate=rate,
            keep_attempts=keep_attempts,
            force=force,
            dry_run=dry_run,
            progress=progress,
            to_queue=to_queue,
        )
        _merge(run.report, report)
    return run


def _watch(
    runtime: Runtime, oid: str, after: str, timeout: float, settle: float, to_queue: str | None
) -> CanaryResult:
    ob = runtime.graveyard.load([oid])[0]
    if ob is None:  # purged meanwhile: its message is on its way all the same
        return CanaryResult(oid, "", "", "timeout", detail="obituary vanished")
    return watch_canary(runtime, ob, after, timeout=timeout, settle=settle, queue=to_queue)


def _merge(into: ReplayReport, report: ReplayReport) -> None:
    into.replayed.extend(report.replayed)
    into.skipped.extend(report.skipped)
    into.failed.extend(report.failed)
    into.missing.extend(report.missing)
    for queue, n in report.from_queues.items():
        into.from_queues[queue] = into.from_queues.get(queue, 0) + n
