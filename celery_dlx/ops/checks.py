"""``celery dlx check``: is the dead-letter topology in place, and is any queue left unconsumed?

Each finding is a :class:`Problem` (the command exits non-zero when there is one): the DLX
exchange or service queue missing or not bound with ``#``; a queue that should dead-letter (every
app queue under ``dlx_enabled``, those declared with a dead-letter exchange, those in
``dlx_queues``) missing or not routing to ``dlx_exchange`` (by argument or policy);
``install(app)`` not called; orphan queues; a stall (:data:`STALL_KINDS`: Redis refusing writes
or unreadable, the graveyard at its budget, a service queue past ``max_backlog``); a
``maxmemory-policy`` that may evict parked retries.

How long an orphan has had no consumer is the earlier of the broker's ``idle_since`` and the
first ``check`` that saw it without consumers, kept in Redis so that a ``check`` run from cron
measures it even while producers keep the queue busy.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from celery import Celery

from celery_dlx.broker.management import (
    Management,
    ManagementError,
    dead_letter_exchange_of,
    first_answering,
    management_for,
    other_services,
)
from celery_dlx.broker.probe import missing_entities, queue_counts
from celery_dlx.fates import now_ms
from celery_dlx.message.graveyard import RESERVE
from celery_dlx.message.memory import RedisMemory
from celery_dlx.policy.config import DLXConfig
from celery_dlx.wiring.installed import not_installed, not_installed_message
from celery_dlx.wiring.runtime import Runtime

logger = logging.getLogger(__name__)

#: Problem kinds.
MISSING_EXCHANGE = "missing-exchange"
MISSING_QUEUE = "missing-queue"
MISSING_BINDING = "missing-binding"
NO_DLX = "no-dead-letter-exchange"
WRONG_DLX = "wrong-dead-letter-exchange"
ORPHAN = "orphan-queue"
UNREACHABLE = "management-unreachable"
REDIS_FULL = "redis-full"
REDIS_EVICTS = "redis-evicts"
REDIS_UNREADABLE = "redis-unreadable"
GRAVEYARD_FULL = "graveyard-full"
BACKLOG = "dlx-backlog"
#: Problems of a stall (the CLI exits 7 for them, 4 for the others).
STALL_KINDS = frozenset({REDIS_FULL, BACKLOG, REDIS_UNREADABLE, GRAVEYARD_FULL})
#: Share of ``maxmemory`` from which Redis counts as full (a write may be refused any moment).
FULL_SHARE = 0.95
#: Default of ``--max-backlog``: dead letters waiting in the service queue that make a problem.
MAX_BACKLOG = 10_000
NOT_INSTALLED = "not-installed"
SHARED_EXCHANGE = "shared-dlx"


@dataclass(frozen=True)
class Problem:
    """One thing wrong: its kind, the queue or exchange concerned, and what to do."""

    kind: str
    subject: str
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "subject": self.subject, "detail": self.detail}


@dataclass
class CheckReport:
    """What ``check`` looked at and what it found wrong."""

    exchange: str
    service_queue: str
    queues: list[dict[str, Any]] = field(default_factory=list)
    orphan_scope: int = 0
    problems: list[Problem] = field(default_factory=list)
    management: bool = True
    #: The management API used: the first that answered of :attr:`management_tried`.
    management_url: str | None = None
    management_tried: list[str] = field(default_factory=list)
    #: Redis memory (:meth:`~celery_dlx.message.memory.RedisMemory.to_json`), None if unread.
    redis: dict[str, object] | None = None
    #: The graveyard's budget (``dlx_graveyard_max_bytes``; None: unlimited) and the bytes it
    #: holds (None: unread).
    graveyard_budget: int | None = None
    graveyard_bytes: int | None = None
    #: The service queue's ``messages``, ``consumers`` and ``oldest_age_s`` (None: unknown).
    backlog: dict[str, object] | None = None
    #: Parks workers could not write (Redis refused them) that the DLX service wrote, per fate.
    refused: dict[str, int] = field(default_factory=dict)
    #: The ``main`` name of the Celery app checked.
    app: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def stalled(self) -> bool:
        """True when a problem is a stall (:data:`STALL_KINDS`)."""
        return any(p.kind in STALL_KINDS for p in self.problems)

    def to_json(self) -> dict[str, object]:
        return {
            "ok": self.ok,
            "app": self.app,
            "exchange": self.exchange,
            "service_queue": self.service_queue,
            "queues": self.queues,
            "orphan_scope": self.orphan_scope,
            "management": self.management,
            "management_url": self.management_url,
            "management_tried": self.management_tried,
            "problems": [p.to_json() for p in self.problems],
            "stalled": self.stalled,
            "redis": self.redis,
            "graveyard_budget": self.graveyard_budget,
            "graveyard_bytes": self.graveyard_bytes,
            "backlog": self.backlog,
            "refused": self.refused,
        }


def expected_queues(app: Celery, config: DLXConfig) -> dict[str, str]:
    """Queue name -> why it must dead-letter to ``dlx_exchange``."""
    out: dict[str, str] = {}
    for queue in app.amqp.queues.values():
        if queue.exclusive or queue.auto_delete:
            continue
        if config.enabled:
            out[queue.name] = "an app queue (dlx_enabled)"
        elif (queue.queue_arguments or {}).get("x-dead-letter-exchange"):
            out[queue.name] = "declared with a dead-letter exchange"
    for name in config.queues:
        out.setdefault(name, "named in dlx_queues")
    return out


def classify_queue(
    name: str, info: Mapping[str, Any] | None, exchange: str, why: str
) -> list[Problem]:
    """The problems of one queue that must dead-letter to ``exchange`` (``info``: the API's view)."""
    queue = f"queue {name!r} ({why})"
    if info is None:
        return [
            Problem(MISSING_QUEUE, name, f"{queue} does not exist: start a worker or declare it")
        ]
    target, _ = dead_letter_exchange_of(dict(info))
    if target is None:
        detail = (
            f"{queue} has no dead-letter exchange: failures are dropped; "
            f"run `celery dlx migrate {name} --policy` (or --rename)"
        )
        return [Problem(NO_DLX, name, detail)]
    if target != exchange:
        detail = f"{queue} dead-letters to {target!r}, not dlx_exchange={exchange!r}"
        return [Problem(WRONG_DLX, name, detail)]
    return []


def _ms(text: Any) -> int | None:
    if not isinstance(text, str) or not text:
        return None
    try:
        return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)
    except ValueError:
        return None


def find_orphans(
    queues: Iterable[Mapping[str, Any]],
    *,
    for_seconds: float,
    now: int,
    first_seen: Mapping[str, int],
) -> list[Problem]:
    """Queues (as the management API lists them) with ready messages and no consumer for
    longer than ``for_seconds``; ``first_seen``: queue -> when a ``check`` first saw it without
    consumers (epoch ms, as ``now``)."""
    out = []
    for q in queues:
        name = str(q.get("name"))
        if q.get("consumers") or not q.get("messages_ready"):
            continue
        evidence = [t for t in (_ms(q.get("idle_since")), first_seen.get(name)) if t is not None]
        since = min(evidence, default=None)
        if since is None or now - since < for_seconds * 1000:
            continue
        detail = (
            f"queue {name!r} holds {q.get('messages_ready')} ready messages and has had no "
            f"consumer for {(now - since) / 60000:.0f} min (more than --for {for_seconds:g}s): a "
            "consumer was moved away (migration, deploy) while producers still publish here"
        )
        out.append(Problem(ORPHAN, name, detail))
    return out


def _amqp_checks(app: Celery, config: DLXConfig) -> list[Problem]:
    missing = missing_entities(app, exchanges=[config.exchange], queues=[config.service_queue])
    exchange, queue = config.exchange, config.service_queue
    problems = []
    if exchange in missing.exchanges:
        detail = (
            f"dead-letter exchange {exchange!r} (dlx_exchange) is missing "
            f"({missing.exchanges[exchange]}): "
            "dead letters are dropped; start a worker or the DLX service to declare it"
        )
        problems.append(Problem(MISSING_EXCHANGE, exchange, detail))
    if queue in missing.queues:
        detail = (
            f"DLX service queue {queue!r} (dlx_service_queue) is missing "
            f"({missing.queues[queue]}): start the DLX service (`celery dlx service`)"
        )
        problems.append(Problem(MISSING_QUEUE, queue, detail))
    return problems


def _binding_problem(api: Management, exchange: str, service: str) -> list[Problem]:
    bindings = api.bindings_between(exchange, service)
    if any(b.get("routing_key") == "#" for b in bindings):
        return []
    detail = (
        f"DLX service queue {service!r} is not bound to {exchange!r} with '#': dead letters "
        "are not routed to it; start the DLX service to declare the binding"
    )
    return [Problem(MISSING_BINDING, service, detail)]


def _shared_problems(api: Management, config: DLXConfig) -> list[Problem]:
    others = other_services(api, config.exchange, config.service_queue, config.key_prefix)
    return [
        Problem(
            SHARED_EXCHANGE,
            queue,
            f"the DLX service of another app (dlx_key_prefix {prefix!r}) consumes {queue!r}, "
            f"bound to this app's dead-letter exchange {config.exchange!r}: both services park "
            "and bury every dead letter, each in its own Redis; give each app its own "
            "dlx_exchange and dlx_service_queue (unset, they derive from dlx_key_prefix)",
        )
        for queue, prefix in others.items()
    ]


def _mb(n: int) -> str:
    return f"{n / 1048576:.1f} MB"


def memory_problems(memory: RedisMemory) -> list[Problem]:
    """Redis full (refusing writes, or within :data:`FULL_SHARE` of ``maxmemory``), or set to
    evict keys."""
    out = []
    node = memory.node or "redis"
    if memory.writable is False or (memory.share is not None and memory.share >= FULL_SHARE):
        limit = _mb(memory.maxmemory) if memory.maxmemory else "no maxmemory"
        why = f": {memory.refusal}" if memory.refusal else ""
        detail = (
            f"Redis is full ({_mb(memory.used)} used of {limit}; "
            f"{memory.refused_writes:,} writes refused for memory since it started{why}): "
            "parks, cause records and burials are refused and dead letters wait in the "
            "service queue; make room (`celery dlx purge`, a shorter dlx_graveyard_retention) "
            "or raise maxmemory"
        )
        out.append(Problem(REDIS_FULL, node, detail))
    if memory.maxmemory and memory.policy not in ("noeviction", ""):
        detail = (
            f"maxmemory-policy is {memory.policy}: Redis may evict parked retries and "
            "obituaries when full (lost messages); set maxmemory-policy noeviction"
        )
        out.append(Problem(REDIS_EVICTS, node, detail))
    return out


def graveyard_problems(used_bytes: int, budget: int | None, memory: RedisMemory) -> list[Problem]:
    """The graveyard within :data:`FULL_SHARE` of its budget (the next obituaries, a few KB
    each, no longer fit), or Redis past the ``1 - RESERVE`` of ``maxmemory`` burials may take."""
    over_budget = budget is not None and used_bytes >= budget * FULL_SHARE
    over_memory = bool(memory.maxmemory) and memory.used > memory.maxmemory * (1 - RESERVE)
    if not (over_budget or over_memory):
        return []
    why = (
        f"the graveyard holds {_mb(used_bytes)} of its {_mb(budget or 0)} budget "
        "(dlx_graveyard_max_bytes)"
        if over_budget
        else f"Redis uses {_mb(memory.used)}, past the {1 - RESERVE:.0%} of maxmemory burials may "
        "take"
    )
    detail = (
        f"{why}: the DLX service buries nothing and dead letters wait in its queue (parks "
        "and drains go on); make room with `celery dlx purge` or a shorter "
        "dlx_graveyard_retention, or raise the budget"
    )
    return [Problem(GRAVEYARD_FULL, "graveyard", detail)]


def backlog_problems(
    queue: str, messages: int, oldest_age_s: float | None, max_backlog: int
) -> list[Problem]:
    """The DLX service queue holding more than ``max_backlog`` dead letters (0: not checked)."""
    if not max_backlog or messages <= max_backlog:
        return []
    age = f", the oldest {oldest_age_s:.0f} s old" if oldest_age_s is not None else ""
    detail = (
        f"{messages:,} dead letters wait in the DLX service queue{age} (more than "
        f"--max-backlog {max_backlog:,}): is the DLX service running, and is Redis full?"
    )
    return [Problem(BACKLOG, queue, detail)]


def management_of(runtime: Runtime) -> Management | None:
    """The management API of the app's broker, or None when it cannot be had."""
    try:
        with runtime.app.connection_for_write() as conn:
            return management_for(conn)
    except Exception:  # no management API
        return None


def redis_memory(runtime: Runtime) -> RedisMemory:
    """The memory of the app's Redis (without the probe write of :func:`run_check`)."""
    return runtime.redis_memory()


def refused_copies(runtime: Runtime) -> dict[str, int]:
    """Parks and requeues workers could not write, which the DLX service wrote, per fate."""
    return runtime.refusals.read()


def service_queue_counts(runtime: Runtime) -> tuple[int, int] | None:
    """Ready messages and consumers of the DLX service queue (a passive declare, retried
    once), or None when it is missing; the broker's errors when it cannot be reached."""
    queue = runtime.config.service_queue
    return queue_counts(runtime.app, [queue], retries=1).get(queue)


def _check_redis(runtime: Runtime, report: CheckReport) -> None:
    try:
        memory = runtime.redis_memory(probe=True)
    except Exception as exc:  # reported as a problem, not a traceback
        detail = f"Redis (dlx_redis_url) did not answer: {type(exc).__name__}: {exc}"
        report.problems.append(Problem(REDIS_UNREADABLE, "redis", detail))
        return
    report.redis = memory.to_json()
    report.problems.extend(memory_problems(memory))
    try:
        report.graveyard_budget = runtime.graveyard_limit()
        report.graveyard_bytes = runtime.graveyard.used_bytes()
    except Exception as exc:  # the rest of the report stands
        logger.debug("could not read the graveyard's bytes: %s", exc)
    else:
        full = graveyard_problems(report.graveyard_bytes, report.graveyard_budget, memory)
        if not any(p.kind == REDIS_FULL for p in report.problems):
            report.problems.extend(full)
    try:
        report.refused = refused_copies(runtime)
    except Exception:  # a count, never a reason to fail the check
        logger.debug("could not read the refused-write counts", exc_info=True)


def _check_backlog(
    runtime: Runtime, report: CheckReport, api: Management | None, max_backlog: int
) -> None:
    """The service queue's backlog: from the management API (ready and unacked, and the oldest
    message's age when messages carry a timestamp), else from a passive declare (ready only)."""
    queue = runtime.config.service_queue
    info = None
    if api is not None:
        with contextlib.suppress(ManagementError):
            info = api.queue(queue)
    oldest: float | None = None
    if info is not None:
        messages = int(str(info.get("messages") or 0))
        consumers = int(str(info.get("consumers") or 0))
        head = info.get("head_message_timestamp")
        if isinstance(head, (int, float)) and head > 0:
            oldest = max(0.0, now_ms() / 1000 - float(head))
    else:
        counts = service_queue_counts(runtime)
        if counts is None:
            return  # missing: reported by the AMQP checks
        messages, consumers = counts
    report.backlog = {"messages": messages, "consumers": consumers, "oldest_age_s": oldest}
    report.problems.extend(backlog_problems(queue, messages, oldest, max_backlog))


def run_check(
    runtime: Runtime,
    api: Management | Sequence[Management] | None,
    *,
    for_seconds: float = 900.0,
    all_queues: bool = False,
    at_ms: int | None = None,
    max_backlog: int = MAX_BACKLOG,
) -> CheckReport:
    """Check the topology and look for orphan queues (see the module's docstring).

    Args:
        api: the management API, or several to try in order (a cluster's nodes: the first
            that answers is used), or None to check over AMQP only (no arguments, bindings or
            orphans).
        for_seconds: how long a queue may have ready messages and no consumer.
        all_queues: look for orphans among every queue of the virtual host, not only the app's
            queues, ``dlx_queues`` and queues dead-lettering to ``dlx_exchange``.
        max_backlog: dead letters in the DLX service queue that make a problem (0: none do).
    """
    config = runtime.config
    now = now_ms() if at_ms is None else at_ms
    report = CheckReport(
        config.exchange,
        config.service_queue,
        management=api is not None,
        app=runtime.app.main or "",
    )
    forgotten = not_installed(runtime.app)
    if forgotten:
        # The cause of everything else wrong: its queues lack the dead-letter exchange because
        # nothing of celery_dlx declared them, not because they need a migration.
        report.problems.append(
            Problem(NOT_INSTALLED, runtime.app.main or "app", not_installed_message(runtime.app))
        )
    report.problems.extend(_amqp_checks(runtime.app, config))
    _check_redis(runtime, report)
    expected = expected_queues(runtime.app, config)
    mgmt = None
    if api is None:
        report.queues = [
            {"name": n, "why": w, "dead_letter_exchange": None} for n, w in expected.items()
        ]
    else:
        candidates = [api] if isinstance(api, Management) else list(api)
        report.management_tried = [c.url for c in candidates]
        try:
            mgmt = first_answering(candidates)
        except ManagementError as exc:
            tried = ", ".join(report.management_tried)
            report.problems.append(Problem(UNREACHABLE, tried, str(exc)))
    _check_backlog(runtime, report, mgmt, max_backlog)
    if mgmt is None:
        return report
    report.management_url = mgmt.url
    try:
        listed = [q for q in mgmt.queues() if not q.get("exclusive") and not q.get("auto_delete")]
        if not any(
            p.kind == MISSING_QUEUE and p.subject == config.service_queue for p in report.problems
        ):
            report.problems.extend(_binding_problem(mgmt, config.exchange, config.service_queue))
        report.problems.extend(_shared_problems(mgmt, config))
    except ManagementError as exc:
        report.problems.append(Problem(UNREACHABLE, mgmt.url, str(exc)))
        return report
    by_name = {str(q["name"]): q for q in listed}
    for name, why in expected.items():
        info = by_name.get(name)
        target, where = dead_letter_exchange_of(info) if info else (None, "none")
        report.queues.append(
            {"name": name, "why": why, "dead_letter_exchange": target, "set_by": where}
        )
        found = classify_queue(name, info, config.exchange, why)
        if forgotten:
            found = [p for p in found if p.kind != NO_DLX]  # install() first, then see
        report.problems.extend(found)
    scope = listed if all_queues else [q for q in listed if _in_scope(q, expected, config)]
    report.orphan_scope = len(scope)
    try:
        first_seen = runtime.consumerless.remember(scope, now)
    except Exception as exc:  # a full Redis refuses the write: the broker's idle_since only
        logger.debug("could not remember consumerless queues: %s", exc)
        first_seen = {}
    report.problems.extend(
        find_orphans(scope, for_seconds=for_seconds, now=now, first_seen=first_seen)
    )
    return report


def _in_scope(queue: Mapping[str, Any], expected: Mapping[str, str], config: DLXConfig) -> bool:
    name = str(queue.get("name"))
    if name in expected or name == config.service_queue:
        return True
    return bool(dead_letter_exchange_of(dict(queue))[0] == config.exchange)
