"""Replays for people on call: targets resolved first, a canary that must succeed, then the rest.

:func:`celery_dlx.ops.replay.replay_targets` does the publishing, the ledger, the rate and the
redirect to another queue. This module adds what the command line needs around it: the list of
targets up front (so progress has a total), and the canary: replay one obituary, wait for its
fate, go on only if it succeeded.

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
    """What ``celery dlx replay --json`` prints (and the console's replay answers).

    ``replayed`` lists what was published; a dry run publishes nothing, so its ``replayed`` is
    empty and ``would_replay`` lists what a real run would publish (empty on a real run).
    """

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

    def to_json(self) -> RedirectedReplayJSON:
        """The run as ``--json`` prints it; a redirected replay adds ``to_queue`` and
        ``from_queues`` (queue it died in -> replays)."""
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
    where it was replayed to, when not the queue it died in."""
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
    """Replay ``targets`` (obituary ids), through a canary first when ``canary``.

    The canary is the first target the ledger allows (a replayed one is skipped unless
    ``force``). When it does not succeed, nothing else is replayed: ``stopped`` is True and
    ``not_replayed`` lists the rest. On a dry run the canary is chosen but not replayed.
    ``to_queue`` sends every replay (the canary's too) to that queue instead of the one each
    message died in (see :func:`~celery_dlx.ops.replay.replay`).

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
        how = Canary(keep_attempts, force, canary_timeout, canary_settle, to_queue)
        rest = _canary_first(runtime, run, rest, how, progress)
        if run.stopped:
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


@dataclass(frozen=True)
class Canary:
    """How the canary is replayed and watched."""

    keep_attempts: bool
    force: bool
    timeout: float
    settle: float
    to_queue: str | None


def _canary_first(
    runtime: Runtime,
    run: ReplayRun,
    targets: list[str],
    how: Canary,
    progress: Callable[[int], None] | None,
) -> list[str]:
    """Replay targets one by one until one is actually published, then watch it; the rest."""
    yard = runtime.graveyard
    for i, oid in enumerate(targets):
        after = runtime.history.tail()
        report = replay_targets(
            runtime, [oid], keep_attempts=how.keep_attempts, force=how.force, to_queue=how.to_queue
        )
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
        run.canary = watch_canary(
            runtime, ob, after, timeout=how.timeout, settle=how.settle, queue=how.to_queue
        )
        run.stopped = not run.canary.succeeded
        return targets[i + 1 :]
    return []


def _merge(into: ReplayReport, report: ReplayReport) -> None:
    into.replayed.extend(report.replayed)
    into.skipped.extend(report.skipped)
    into.failed.extend(report.failed)
    into.missing.extend(report.missing)
    for queue, n in report.from_queues.items():
        into.from_queues[queue] = into.from_queues.get(queue, 0) + n
