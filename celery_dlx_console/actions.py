"""Operator actions run one at a time in a background thread, each recorded in the audit log.

A replay may take long (a rate, a canary waiting for its fate), so the page that asks for it
returns at once and shows the job; the JSON API waits for it. One action runs at a time: the
runtime's publisher is not shared between threads, and two people replaying the same group at
once is a mistake to refuse, not to serialize.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypedDict

from celery_dlx import DLXError, Runtime
from celery_dlx.ops import now_ms, parked_actions
from celery_dlx.ops import purge as purge_ops
from celery_dlx.ops.breakers import close_breakers
from celery_dlx.ops.canary import replay_run
from celery_dlx.ops.render import iso
from celery_dlx_console.audit import AuditEntry, record_action
from celery_dlx_console.auth import User

logger = logging.getLogger(__name__)

#: Jobs remembered in memory (the audit stream keeps them all).
KEPT_JOBS = 100
#: Most obituary ids one request may name.
MAX_IDS = 500
#: The audit log's action name of a breaker closed from the console.
CLOSE_ACTION = "close breaker"


class Busy(DLXError):
    """Another operator action is running."""


class JobJSON(TypedDict):
    """One action as ``GET /api/jobs/<id>`` shows it; ``result`` is None while it runs."""

    id: str
    user: str
    role: str
    action: str
    target: str
    params: dict[str, Any]
    status: str
    result: dict[str, Any] | None
    started_at: str | None
    finished_at: str | None


@dataclass
class Job:
    """One operator action and, once it ended, its result (the CLI's ``--json`` shape)."""

    id: str
    user: User
    action: str
    target: str
    params: dict[str, Any]
    status: str = "running"
    result: dict[str, Any] | None = None
    started_ms: int = field(default_factory=now_ms)
    finished_ms: int | None = None
    done: threading.Event = field(default_factory=threading.Event)

    def to_json(self) -> JobJSON:
        return {
            "id": self.id,
            "user": self.user.name,
            "role": self.user.role,
            "action": self.action,
            "target": self.target,
            "params": self.params,
            "status": self.status,
            "result": self.result,
            "started_at": iso(self.started_ms),
            "finished_at": iso(self.finished_ms),
        }


def replay_summary(result: dict[str, Any]) -> tuple[str, str]:
    """``(status, one line)`` of a ``replay_run(...).to_json()``."""
    line = f"replayed {len(result['replayed'])} of {result['targets']}"
    canary = result.get("canary")
    if canary:
        line += f"; canary {canary['outcome']}"
    if result["skipped"]:
        line += f"; skipped {len(result['skipped'])}"
    if result["failed"] or result["missing"]:
        line += f"; failed {len(result['failed'])}, missing {len(result['missing'])}"
    if result.get("to_queue"):
        line += f"; to queue {result['to_queue']}"
    if result["stopped"]:
        return "stopped", line + f"; stopped, {len(result['not_replayed'])} not replayed"
    incomplete = result["failed"] or result["missing"]
    return ("incomplete" if incomplete else "done"), line


def purge_summary(result: dict[str, Any]) -> tuple[str, str]:
    """``(status, one line)`` of a ``PurgeReport.to_json()``."""
    missing = result["missing"]
    line = f"purged {len(result['purged'])} of {result['targets']}"
    return ("incomplete", f"{line}; missing {len(missing)}") if missing else ("done", line)


def parked_summary(result: dict[str, Any]) -> tuple[str, str]:
    """``(status, one line)`` of a ``ParkedActionReport.as_dict()``."""
    done, claimed, missing = result["done"], result["claimed"], result["missing"]
    verb = "retried now" if result["action"] == "retry-now" else "buried now"
    line = f"{verb} {len(done)} of {len(done) + len(claimed) + len(missing)}"
    if claimed:
        line += f"; {len(claimed)} claimed by a drain, left to it"
    if missing:
        line += f"; missing {len(missing)}"
    return ("incomplete" if claimed or missing else "done"), line


#: What an action does, as the CLI's ``--json`` shape, and its ``(status, one line)``.
Work = Callable[[], Mapping[str, Any]]
Summary = Callable[[dict[str, Any]], tuple[str, str]]


class Actions:
    """Starts replays, purges and parked-retry actions for the console, one at a time."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime
        self._running = threading.Lock()
        self._jobs: dict[str, Job] = {}
        self._jobs_lock = threading.Lock()

    def job(self, job_id: str) -> Job | None:
        with self._jobs_lock:
            return self._jobs.get(job_id)

    def jobs(self) -> list[Job]:
        with self._jobs_lock:
            return sorted(self._jobs.values(), key=lambda j: j.started_ms, reverse=True)

    def replay(
        self,
        user: User,
        targets: list[str],
        target: str,
        *,
        rate: float,
        canary: bool,
        force: bool = False,
        canary_timeout: float = 120.0,
        cause: str | None = None,
        to_queue: str | None = None,
    ) -> Job:
        """Start :func:`~celery_dlx.ops.canary.replay_run` of ``targets`` at ``rate`` per second
        (to ``to_queue`` instead of the queues they died in, when given).

        Raises:
            Busy: another action is running.
        """
        options: dict[str, Any] = {
            "rate": rate,
            "canary": canary,
            "force": force,
            "canary_timeout": canary_timeout,
        }
        params: dict[str, Any] = {"targets": len(targets), **options, "cause": cause}
        if to_queue:
            params["to_queue"] = to_queue

        def work() -> Mapping[str, Any]:
            return replay_run(self.runtime, targets, to_queue=to_queue, **options).to_json()

        return self._start(user, "replay", target, params, work, replay_summary)

    def purge(
        self, user: User, targets: list[str], target: str, *, cause: str | None = None
    ) -> Job:
        """Start purging ``targets`` (each goes whole to the history as ``purged``).

        Raises:
            Busy: another action is running.
        """
        params = {"targets": len(targets), "cause": cause}

        def work() -> Mapping[str, Any]:
            return purge_ops.purge_targets(self.runtime, targets).to_json()

        return self._start(user, "purge", target, params, work, purge_summary)

    def parked(
        self, user: User, action: str, ids: list[str], cause: str | None, target: str
    ) -> Job:
        """Start ``retry-now`` or ``bury-now`` (:mod:`celery_dlx.ops.parked_actions`) of the
        parked retries ``ids``, or of every one of ``cause``; a burial's reason names the
        operator as the API's does (``buried by web:<name>``).

        Raises:
            Busy: another action is running.
        """
        act = parked_actions.bury_now if action == "bury-now" else parked_actions.retry_now
        params = {"targets": len(ids), "cause": cause}

        def work() -> Mapping[str, Any]:
            return act(
                self.runtime, ids or None, cause=cause, by=f"web:{user.name}", audit=False
            ).as_dict()

        return self._start(user, f"parked-{action}", target, params, work, parked_summary)

    def _start(
        self,
        user: User,
        action: str,
        target: str,
        params: dict[str, Any],
        work: Work,
        summary: Summary,
    ) -> Job:
        if not self._running.acquire(blocking=False):
            running = [j for j in self.jobs() if j.status == "running"]
            who = f" ({running[0].action} by {running[0].user.name})" if running else ""
            raise Busy(f"another operator action is running{who}; wait for it to end")
        job = Job(uuid.uuid4().hex[:12], user, action, target, params)
        with self._jobs_lock:
            self._jobs[job.id] = job
            for old in sorted(self._jobs.values(), key=lambda j: j.started_ms)[:-KEPT_JOBS]:
                self._jobs.pop(old.id, None)
        thread = threading.Thread(
            target=self._run, args=(job, work, summary), name=f"dlx-web-{action}", daemon=True
        )
        try:
            thread.start()
        except BaseException:
            self._running.release()
            raise
        return job

    def _run(self, job: Job, work: Work, summarize: Summary) -> None:
        summary = ""
        try:
            result = dict(work())
            status, summary = summarize(result)
            job.status, job.result = status, result
        except Exception as exc:  # the job's failure is its result, shown and audited
            logger.exception("console %s by %s failed", job.action, job.user.name)
            job.status, summary = "failed", f"{type(exc).__name__}: {exc}"
            job.result = {"error": summary}
        finally:
            job.finished_ms = now_ms()
            self._running.release()
        entry = AuditEntry(
            user=job.user.name,
            role=job.user.role,
            action=job.action,
            target=job.target,
            params=job.params,
            status=job.status,
            result=job.result or {},
            summary=summary,
            at_ms=job.finished_ms,
            job=job.id,
        )
        _audit(self.runtime, entry)
        logger.info("console %s by %s of %s: %s", job.action, job.user.name, job.target, summary)
        job.done.set()


def _audit(runtime: Runtime, entry: AuditEntry) -> None:
    try:
        record_action(runtime, entry)
    except Exception:  # the action is done; a lost audit line is logged, not hidden
        logger.exception("console %s by %s not written to the audit log", entry.action, entry.user)


def close_audited(runtime: Runtime, user: User, cause: str, queue: str) -> str:
    """Close the breaker of ``cause`` on ``queue`` (what ``celery dlx breakers close`` does: its
    held messages released at the queue's ``release_rate``), audited; the entry's summary."""
    closed = close_breakers(runtime, cause, queue)
    released = sum(int(c["released"]) for c in closed)
    summary = f"closed, {released} held messages released" if closed else "was not open"
    entry = AuditEntry(
        user=user.name,
        role=user.role,
        action=CLOSE_ACTION,
        target=f"cause {cause} on {queue}",
        params={"cause": cause, "queue": queue},
        status="done" if closed else "noop",
        result={"closed": closed, "released": released},
        summary=summary,
        at_ms=now_ms(),
    )
    _audit(runtime, entry)
    logger.info("console %s by %s of %s on %s: %s", CLOSE_ACTION, user.name, cause, queue, summary)
    return summary
