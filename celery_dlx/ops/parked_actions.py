"""Parked retries one by one: "retry now" and "bury now", by entry id or by cause, audited.

A retry made due now is drained at the drain's next tick; one a drain holds (claimed) is left
to it. A retry buried now leaves the parked set for the graveyard through the obituary the DLX
service would write (reason "buried by <who>"); if a drain claims it meanwhile, the burial is
taken back, so it never has two fates. Each action is one ``audit`` entry (the console's pages,
which audit with the operator's role and job, pass ``audit=False``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TypedDict, cast

from celery_dlx.errors import DLXError
from celery_dlx.fates import now_ms
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.ops.audit import record_audit
from celery_dlx.policy.deadletter import read_dead_letter
from celery_dlx.policy.verdicts import build_obituary, bury_verdict
from celery_dlx.service.settle import buried_event
from celery_dlx.wiring.runtime import Runtime

#: Parked retries read to find those of a cause.
CAUSE_SCAN = 100_000


class ParkedActionJSON(TypedDict):
    """:class:`ParkedActionReport` as JSON (``dlx parked --retry-now/--bury-now --json``)."""

    action: str
    dry_run: bool
    done: list[str]
    claimed: list[str]
    missing: list[str]
    obituaries: list[str]


@dataclass
class ParkedActionReport:
    """What :func:`retry_now` or :func:`bury_now` did (or, dry, would do), by entry id:
    ``claimed``: being drained right now, left to the drain; ``missing``: not parked (any more).
    """

    action: str
    dry_run: bool = False
    done: list[str] = field(default_factory=list)
    claimed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    obituaries: list[str] = field(default_factory=list)

    def as_dict(self) -> ParkedActionJSON:
        return cast(ParkedActionJSON, asdict(self))


def _act(
    runtime: Runtime,
    action: str,
    entry_ids: Sequence[str] | None,
    cause: str | None,
    by: str,
    dry_run: bool,
    audit: bool,
    one: Callable[[ParkedMessage, ParkedActionReport], bool],
) -> ParkedActionReport:
    """Read every target, then run ``one`` on each (True: done, False: a drain holds it), then
    audit."""
    if bool(entry_ids) == (cause is not None):
        raise DLXError("name parked retries by entry id or by --cause (one of the two)")
    parking = runtime.parking
    if cause is not None:
        ids = [m.entry_id for m in parking.soonest(CAUSE_SCAN) if m.cause == cause]
    else:
        ids = list(dict.fromkeys(entry_ids or ()))
    report = ParkedActionReport(action, dry_run)
    found = {entry_id: parking.entry(entry_id) for entry_id in ids}
    for entry_id, target in found.items():
        if target is None:
            report.missing.append(entry_id)
        elif dry_run or one(target, report):
            report.done.append(target.entry_id)
        else:
            report.claimed.append(target.entry_id)
    if audit:
        _audit(runtime, report, by, cause)
    return report


def retry_now(
    runtime: Runtime,
    entry_ids: Sequence[str] | None = None,
    *,
    cause: str | None = None,
    by: str = "operator",
    dry_run: bool = False,
    audit: bool = True,
) -> ParkedActionReport:
    """Make parked retries due now; ``audit=False`` leaves the audit entry to the caller.

    Raises:
        DLXError: neither ids nor a cause, or both.
    """
    now = now_ms()

    def make_due(target: ParkedMessage, _: ParkedActionReport) -> bool:
        return runtime.store.make_due(target, now)

    return _act(runtime, "retry-now", entry_ids, cause, by, dry_run, audit, make_due)


def bury_now(
    runtime: Runtime,
    entry_ids: Sequence[str] | None = None,
    *,
    cause: str | None = None,
    by: str = "operator",
    dry_run: bool = False,
    audit: bool = True,
) -> ParkedActionReport:
    """Bury parked retries now: an obituary each (reason "buried by ``by``"), the retry gone;
    ``audit=False`` leaves the audit entry to the caller.

    Raises:
        DLXError: neither ids nor a cause, or both.
    """
    now = now_ms()
    yard = runtime.graveyard

    def bury(target: ParkedMessage, report: ParkedActionReport) -> bool:
        ob = _obituary(runtime, target, f"buried by {by}", now)
        event = buried_event(ob)
        written = yard.write_many([(ob, event)])[0]
        if not runtime.store.take(target):
            # A drain claimed it meanwhile: it goes back to its queue, so no burial.
            if written:
                yard.remove(ob, None)
            return False
        report.obituaries.append(ob.id)
        if written:
            runtime.record(event, history=False)
        return True

    return _act(runtime, "bury-now", entry_ids, cause, by, dry_run, audit, bury)


def _obituary(runtime: Runtime, message: ParkedMessage, reason: str, now: int) -> Obituary:
    letter = read_dead_letter(
        message.body, message.headers, message.properties, routing_key=message.queue
    )
    verdict = bury_verdict(letter, runtime.config, reason, now, failed=False)
    return build_obituary(
        letter, verdict, buried_ms=now, code_version=runtime.config.code_version, hostname=None
    )


def _audit(runtime: Runtime, report: ParkedActionReport, by: str, cause: str | None) -> None:
    if report.dry_run or not (report.done or report.claimed):
        return
    target = f"cause {cause}" if cause else ", ".join(report.done + report.claimed)
    summary = f"{len(report.done)} {report.action}, {len(report.claimed)} claimed by a drain"
    at = now_ms()
    fields = {
        "at_ms": str(at),
        "user": by,
        "role": "operator",
        "action": f"parked-{report.action}",
        "target": target[:500],
        "params": json.dumps({"cause": cause}, sort_keys=True),
        "status": "done",
        "summary": summary,
        "result": json.dumps(report.as_dict(), sort_keys=True),
        "job": "",
    }
    record_audit(
        runtime,
        fields,
        queue="*",
        cause=cause or "",
        message_id=f"audit:parked-{report.action}:{at}",
        reason=f"{by} {report.action} {target[:200]}: {summary}",
        at_ms=at,
    )
