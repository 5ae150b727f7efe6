"""``celery dlx check``: is the dead-letter topology in place, and is any queue left unconsumed?

Checked, each failure a :class:`Problem` (the command exits non-zero when there is one):

* the DLX exchange and the DLX service queue exist, bound with ``#`` (over AMQP, and the
  binding through the management API);
* every queue of the app that should dead-letter (all of them under ``dlx_enabled``, those
  declared with a dead-letter exchange otherwise, and every queue named in ``dlx_queues``) exists
  and routes its dead letters to ``dlx_exchange``, by queue argument or by policy;
* ``celery_dlx.install(app)`` was called if ``dlx_enabled`` is set (its own problem; the app's
  queues then lacking a dead-letter exchange are not reported as needing a migration);
* orphan queues (the seeds' alert): messages ready and no consumer for longer than ``for_seconds``.
  How long a queue has had no consumer is the earlier of the broker's ``idle_since`` and the
  first ``check`` that saw it without consumers (kept in Redis, so a ``check`` run from cron
  measures it even while producers keep the queue busy).
"""

from __future__ import annotations

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
)
from celery_dlx.broker.probe import missing_entities
from celery_dlx.fates import now_ms
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
NOT_INSTALLED = "not-installed"


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
    #: The management API used (the first that answered among those tried).
    management_url: str | None = None
    #: The candidate management APIs, in order (one per broker URL of a failover list by
    #: default); those before :attr:`management_url` did not answer.
    management_tried: list[str] = field(default_factory=list)
    #: The Celery app checked (its ``main`` name): ``check`` says which.
    app: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

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
        }


def expected_queues(app: Celery, config: DLXConfig) -> dict[str, str]:
    """Queue name -> why it must dead-letter to ``dlx_exchange``."""
    out: dict[str, str] = {}
    for queue in app.amqp.queues.values():
        if queue.exclusive or queue.auto_delete:
            continue
        declared = (queue.queue_arguments or {}).get("x-dead-letter-exchange")
        if config.enabled:
            out[queue.name] = "an app queue (dlx_enabled)"
        elif declared:
            out[queue.name] = "declared with a dead-letter exchange"
    for name in config.queues:
        out.setdefault(name, "named in dlx_queues")
    return out


def classify_queue(
    name: str, info: Mapping[str, Any] | None, exchange: str, why: str
) -> list[Problem]:
    """The problems of one queue that must dead-letter to ``exchange`` (``info``: the API's view)."""
    if info is None:
        return [
            Problem(
                MISSING_QUEUE,
                name,
                f"queue {name!r} ({why}) does not exist: start a worker or declare it",
            )
        ]
    target, _ = dead_letter_exchange_of(dict(info))
    if target is None:
        return [
            Problem(
                NO_DLX,
                name,
                f"queue {name!r} ({why}) has no dead-letter exchange: failures are dropped; "
                f"run `celery dlx migrate {name} --policy` (or --rename)",
            )
        ]
    if target != exchange:
        return [
            Problem(
                WRONG_DLX,
                name,
                f"queue {name!r} ({why}) dead-letters to {target!r}, not dlx_exchange={exchange!r}",
            )
        ]
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
    """Queues with ready messages and no consumer for longer than ``for_seconds``.

    Args:
        queues: queues as the management API lists them.
        now: epoch ms.
        first_seen: queue -> epoch ms a ``check`` first saw it without consumers.
    """
    out = []
    for q in queues:
        name = str(q.get("name"))
        if q.get("consumers") or not q.get("messages_ready"):
            continue
        evidence = [t for t in (_ms(q.get("idle_since")), first_seen.get(name)) if t is not None]
        if not evidence:
            continue
        since = min(evidence)
        if now - since < for_seconds * 1000:
            continue
        minutes = (now - since) / 60000
        out.append(
            Problem(
                ORPHAN,
                name,
                f"queue {name!r} holds {q.get('messages_ready')} ready messages and has had no "
                f"consumer for {minutes:.0f} min (more than --for {for_seconds:g}s): a consumer "
                "was moved away (migration, deploy) while producers still publish here",
            )
        )
    return out


def _amqp_checks(app: Celery, config: DLXConfig) -> list[Problem]:
    """The DLX exchange and service queue exist (passive declares)."""
    missing = missing_entities(app, exchanges=[config.exchange], queues=[config.service_queue])
    problems = []
    if config.exchange in missing.exchanges:
        problems.append(
            Problem(
                MISSING_EXCHANGE,
                config.exchange,
                f"dead-letter exchange {config.exchange!r} (dlx_exchange) is missing "
                f"({missing.exchanges[config.exchange]}): "
                "dead letters are dropped; start a worker or the DLX service to declare it",
            )
        )
    if config.service_queue in missing.queues:
        problems.append(
            Problem(
                MISSING_QUEUE,
                config.service_queue,
                f"DLX service queue {config.service_queue!r} (dlx_service_queue) is missing "
                f"({missing.queues[config.service_queue]}): "
                "start the DLX service (`celery dlx service`)",
            )
        )
    return problems


def _binding_problem(api: Management, exchange: str, service: str) -> list[Problem]:
    bindings = api.bindings_between(exchange, service)
    if any(b.get("routing_key") == "#" for b in bindings):
        return []
    return [
        Problem(
            MISSING_BINDING,
            service,
            f"DLX service queue {service!r} is not bound to {exchange!r} with '#': dead letters "
            "are not routed to it; start the DLX service to declare the binding",
        )
    ]


def run_check(
    runtime: Runtime,
    api: Management | Sequence[Management] | None,
    *,
    for_seconds: float = 900.0,
    all_queues: bool = False,
    at_ms: int | None = None,
) -> CheckReport:
    """Check the topology and look for orphan queues (see the module's docstring).

    Args:
        runtime: the app's runtime (its app, settings and Redis).
        api: the management API, or several to try in order (the nodes of a cluster: the
            first that answers is used, named in the report), or None to check over AMQP only
            (no arguments, bindings or orphans: said in the report).
        for_seconds: how long a queue may have ready messages and no consumer.
        all_queues: look for orphans among every queue of the virtual host, not only the app's
            queues, ``dlx_queues`` and queues dead-lettering to ``dlx_exchange``.
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
    expected = expected_queues(runtime.app, config)
    if api is None:
        report.queues = [
            {"name": n, "why": w, "dead_letter_exchange": None} for n, w in expected.items()
        ]
        return report
    candidates = [api] if isinstance(api, Management) else list(api)
    report.management_tried = [c.url for c in candidates]
    try:
        api = first_answering(candidates)
    except ManagementError as exc:
        report.problems.append(Problem(UNREACHABLE, ", ".join(report.management_tried), str(exc)))
        return report
    report.management_url = api.url
    try:
        listed = [q for q in api.queues() if not q.get("exclusive") and not q.get("auto_delete")]
        if not any(
            p.kind == MISSING_QUEUE and p.subject == config.service_queue for p in report.problems
        ):
            report.problems.extend(_binding_problem(api, config.exchange, config.service_queue))
    except ManagementError as exc:
        report.problems.append(Problem(UNREACHABLE, api.url, str(exc)))
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
    first_seen = runtime.consumerless.remember(scope, now)
    report.problems.extend(
        find_orphans(scope, for_seconds=for_seconds, now=now, first_seen=first_seen)
    )
    return report


def _in_scope(queue: Mapping[str, Any], expected: Mapping[str, str], config: DLXConfig) -> bool:
    name = str(queue.get("name"))
    if name in expected or name == config.service_queue:
        return True
    return bool(dead_letter_exchange_of(dict(queue))[0] == config.exchange)
