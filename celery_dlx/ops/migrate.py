"""``celery dlx migrate QUEUE``: give an existing queue a dead-letter exchange without a 406.

RabbitMQ refuses to redeclare a queue with other arguments (406 PRECONDITION_FAILED), so a queue
created before celery_dlx cannot simply be declared again with ``x-dead-letter-exchange``. Two
ways out (docs/migration.md weighs them):

* **policy** (:func:`migrate_policy`): a policy matching only this queue sets the dead-letter
  exchange; nothing moves. A queue has one policy in effect (the highest priority), so the one
  that applied before is copied into ours, one priority above, and stays untouched;
* **rename** (:func:`migrate_rename`): a new queue declared with the arguments and given the old
  one's bindings, and the old queue's messages moved to it with publisher confirms.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from celery_dlx.broker import moving
from celery_dlx.broker.management import Management, dead_letter_exchange_of
from celery_dlx.broker.probe import missing_entities
from celery_dlx.broker.topology import (
    dead_letter_arguments,
    policy_name,
    service_queue,
)
from celery_dlx.errors import DLXError
from celery_dlx.wiring.runtime import Runtime

logger = logging.getLogger(__name__)

#: What a policy may apply to for it to be in effect on a queue.
_QUEUE_TARGETS = ("queues", "all", "classic_queues", "quorum_queues")


class MigrationError(DLXError):
    """The queue cannot be migrated as asked; the message says why and what to do."""


class QueueNotFound(MigrationError):
    """The queue to migrate does not exist."""


def effective_policy(queue: str, policies: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The user policy in effect on ``queue`` (highest priority among those matching it)."""
    own = policy_name(queue)
    matching = []
    for p in policies:
        if p.get("name") == own or p.get("apply-to", "all") not in _QUEUE_TARGETS:
            continue
        try:
            if re.search(str(p.get("pattern", "")), queue):
                matching.append(p)
        except re.error:
            logger.warning("policy %s has a pattern Python cannot read; ignored", p.get("name"))
    return max(matching, key=lambda p: int(p.get("priority", 0)), default=None)


@dataclass
class PolicyPlan:
    """The policy to write for one queue, or why none is needed."""

    queue: str
    name: str
    pattern: str
    definition: dict[str, Any]
    priority: int
    apply_to: str = "queues"
    merged_from: str | None = None
    needed: bool = True
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if k != "queue"}


def plan_policy(
    queue: Mapping[str, Any], exchange: str, policies: Sequence[Mapping[str, Any]]
) -> PolicyPlan:
    """The policy giving ``queue`` (the API's view) dead-letter exchange ``exchange``.

    Raises:
        MigrationError: the queue or the policy in effect names another dead-letter exchange.
    """
    name = str(queue["name"])
    plan = PolicyPlan(name, policy_name(name), f"^{re.escape(name)}$", {}, 0)
    args = queue.get("arguments") or {}
    current = args.get("x-dead-letter-exchange")
    if current:
        if current != exchange:
            raise MigrationError(
                f"queue {name!r} already dead-letters to {current!r} by argument (arguments win "
                f"over policies); set dlx_exchange={current!r} or use --rename"
            )
        plan.needed, plan.reason = False, "the queue's own arguments already set the exchange"
        return plan
    base = effective_policy(name, policies)
    definition = dict((base or {}).get("definition") or {})
    if definition.get("dead-letter-exchange") not in (None, exchange):
        raise MigrationError(
            f"policy {base and base.get('name')!r} already sends {name!r}'s dead letters to "
            f"{definition['dead-letter-exchange']!r}; change that policy or set dlx_exchange"
        )
    definition.update({"dead-letter-exchange": exchange, "dead-letter-routing-key": name})
    plan.definition = definition
    if base is not None:
        plan.merged_from = str(base.get("name"))
        plan.priority = int(base.get("priority", 0)) + 1
    return plan


def migrate_policy(
    api: Management,
    queue: str,
    exchange: str,
    *,
    dry_run: bool = False,
    wait: float = 15.0,
) -> dict[str, object]:
    """Add ``exchange`` as ``queue``'s dead-letter exchange with a policy; other policies stay.
    Returns ``queue``, ``method`` (``policy``), ``dry_run``, ``policy`` (the plan), ``applied``,
    and the ``dead_letter_exchange`` and ``set_by`` the broker shows after.

    Raises:
        QueueNotFound: no such queue.
        MigrationError: another dead-letter exchange is set, or the policy did not take effect.
        ManagementError: the API refused or is unreachable.
    """
    info = api.queue(queue)
    if info is None:
        raise QueueNotFound(f"queue {queue!r} does not exist in vhost {api.vhost!r}")
    plan = plan_policy(info, exchange, api.policies())
    applied = False
    if plan.needed and not dry_run:
        api.put_policy(plan.name, plan.pattern, plan.definition, plan.priority, plan.apply_to)
        logger.info("policy %s set on queue %s: dead letters to %s", plan.name, queue, exchange)
        info = _wait_for_policy(api, queue, plan.name, wait)
        applied = True
    target, where = dead_letter_exchange_of(info)
    return {
        "queue": queue,
        "method": "policy",
        "dry_run": dry_run,
        "policy": plan.to_json(),
        "applied": applied,
        "dead_letter_exchange": target,
        "set_by": where,
    }


def _wait_for_policy(api: Management, queue: str, name: str, wait: float) -> dict[str, object]:
    deadline = time.monotonic() + wait
    while True:
        info = api.queue(queue) or {}
        if info.get("policy") == name:
            return info
        if time.monotonic() > deadline:
            raise MigrationError(
                f"policy {name} was written but queue {queue!r} did not show it within {wait}s "
                f"(it shows {info.get('policy')!r}); check `rabbitmqctl list_policies`"
            )
        time.sleep(0.2)


def remove_policy(api: Management, queue: str) -> dict[str, object]:
    """Delete the policy ``migrate --policy`` wrote for ``queue`` (never another one)."""
    removed = api.delete_policy(policy_name(queue))
    return {"queue": queue, "method": "policy", "removed": removed, "policy": policy_name(queue)}


@dataclass
class RenamePlan:
    """What ``migrate --rename`` declares, binds and unbinds."""

    queue: str
    new_queue: str
    arguments: dict[str, Any]
    durable: bool = True
    bind: list[dict[str, Any]] = field(default_factory=list)
    unbind: list[dict[str, Any]] = field(default_factory=list)


def plan_rename(
    info: Mapping[str, Any],
    bindings: Sequence[Mapping[str, Any]],
    *,
    new_queue: str,
    exchange: str,
    quorum: bool = False,
    delivery_limit: int | None = None,
    unbind_old: bool = True,
) -> RenamePlan:
    """The new queue's arguments (the old ones plus the dead-letter ones) and bindings (not the
    default exchange's implicit one).

    Raises:
        MigrationError: the new name is the old one.
    """
    queue = str(info["name"])
    if new_queue == queue:
        raise MigrationError(f"--to must differ from the queue's name ({queue!r})")
    args = {
        k: v for k, v in (info.get("arguments") or {}).items() if not k.startswith("x-dead-letter-")
    }
    quorum = quorum or info.get("type") == "quorum" or args.get("x-queue-type") == "quorum"
    args.update(
        dead_letter_arguments(
            new_queue, exchange, quorum=quorum, delivery_limit=delivery_limit if quorum else None
        )
    )
    real = [
        {
            "source": str(b["source"]),
            "routing_key": str(b.get("routing_key", "")),
            "arguments": dict(b.get("arguments") or {}),
        }
        for b in bindings
        if b.get("source") and b.get("destination_type", "queue") == "queue"
    ]
    return RenamePlan(
        queue,
        new_queue,
        args,
        durable=bool(info.get("durable", True)),
        bind=real,
        unbind=list(real) if unbind_old else [],
    )


def migrate_rename(
    runtime: Runtime,
    api: Management | None,
    queue: str,
    *,
    to: str | None = None,
    copy_bindings: bool = True,
    unbind_old: bool = True,
    dry_run: bool = False,
    batch: int = 200,
    progress: Callable[[int], None] | None = None,
) -> dict[str, object]:
    """Declare ``to`` (default ``QUEUE.dlx``) with the DLX, give it ``queue``'s bindings, move the
    messages; the old queue stays (unbound) for consumers and producers to be cut over. Returns
    ``queue``, ``method`` (``rename``), ``new_queue``, ``arguments``, ``bound``, ``unbound``,
    ``moved``, ``left`` (ready messages still on the old queue) and ``dry_run``.

    Args:
        api: the management API (needed to read the old queue's bindings and arguments).
        copy_bindings: bind the new queue like the old one (exchange producers switch at once).
        unbind_old: then remove those bindings from the old queue (only messages published to
            its name through the default exchange still arrive there).
        dry_run: plan only.
        progress: called with the number of messages moved after each batch.

    Raises:
        QueueNotFound: no such queue. MigrationError: bad ``to``, or an unconfirmed move.
    """
    config = runtime.config
    new = to or f"{queue}.dlx"
    info, bindings = _old_queue(runtime, api, queue, copy_bindings)
    plan = plan_rename(
        info,
        bindings,
        new_queue=new,
        exchange=config.exchange,
        quorum=config.quorum,
        delivery_limit=config.delivery_limit,
        unbind_old=unbind_old and copy_bindings,
    )
    result: dict[str, Any] = {
        "queue": queue,
        "method": "rename",
        "new_queue": new,
        "arguments": plan.arguments,
        "bound": plan.bind,
        "unbound": plan.unbind,
        "moved": 0,
        "left": None,
        "dry_run": dry_run,
    }
    if dry_run:
        return result
    moving.declare_renamed(
        runtime.app,
        queue,
        new,
        durable=plan.durable,
        arguments=plan.arguments,
        bind=plan.bind,
        unbind=plan.unbind,
        first=[service_queue(config.service_queue, config.exchange, quorum=config.quorum)],
    )
    logger.info(
        "queue %s declared with dead-letter exchange %s; moving %s", new, config.exchange, queue
    )
    try:
        result["moved"], result["left"] = moving.move_queue(
            runtime.app, queue, new, batch=batch, progress=progress
        )
    except moving.MoveRefused as exc:
        raise MigrationError(str(exc)) from exc
    return result


def _old_queue(
    runtime: Runtime, api: Management | None, queue: str, copy_bindings: bool
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    if api is not None:
        info = api.queue(queue)
        if info is None:
            raise QueueNotFound(f"queue {queue!r} does not exist in vhost {api.vhost!r}")
        return info, api.queue_bindings(queue) if copy_bindings else []
    if copy_bindings:
        raise MigrationError(
            "copying bindings needs the management API (--management-url); or pass --no-bindings"
        )
    refused = missing_entities(runtime.app, queues=[queue]).queues
    if queue in refused:
        raise QueueNotFound(f"queue {queue!r} does not exist ({refused[queue]})")
    # Without the API the old queue's arguments are unknown: a durable classic queue is assumed.
    return {"name": queue, "arguments": {}, "durable": True}, []
