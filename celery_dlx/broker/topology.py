"""Kombu declarations for dead-lettering: work queues with a DLX, the DLX exchange and service queue.

Pure builders (``dead_letter_arguments``, ``dlx_exchange``, ``service_queue``, ``dlx_queue``) sit
next to one I/O function, :func:`declare_topology`. A :class:`DLXQueue` declares its dead-letter
target before itself wherever kombu declares it (worker or producer), so a dead letter never meets
a missing exchange: RabbitMQ silently drops a classic queue's dead letter when its DLX is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from amqp.exceptions import PreconditionFailed
from kombu import Exchange, Queue

from celery_dlx.compat import queue_attrs
from celery_dlx.errors import ConfigurationError, TopologyError
from celery_dlx.message.names import DEFAULT_DLX_EXCHANGE, DEFAULT_SERVICE_QUEUE

logger = logging.getLogger(__name__)

#: Queue arguments celery_dlx sets; a queue declared elsewhere without them fails with 406.
DLX_ARGUMENT_KEYS = (
    "x-dead-letter-exchange",
    "x-dead-letter-routing-key",
    "x-queue-type",
    "x-delivery-limit",
    "x-dead-letter-strategy",
    "x-overflow",
)


def dead_letter_arguments(
    queue_name: str,
    exchange: str = DEFAULT_DLX_EXCHANGE,
    *,
    quorum: bool = False,
    delivery_limit: int | None = None,
) -> dict[str, Any]:
    """Queue arguments routing ``queue_name``'s dead letters to ``exchange`` with key ``queue_name``.

    With ``quorum``, the queue is a quorum queue dead-lettering at-least-once (which RabbitMQ
    allows only with ``x-overflow: reject-publish``), and ``delivery_limit`` sets
    ``x-delivery-limit``.

    Raises:
        ValueError: a delivery limit without ``quorum``, or a non-positive one.
    """
    if not queue_name:
        raise ValueError("queue name must not be empty")
    if not exchange:
        raise ValueError(
            "dead-letter exchange name must not be empty (the default exchange cannot be a DLX here)"
        )
    args: dict[str, Any] = {
        "x-dead-letter-exchange": exchange,
        "x-dead-letter-routing-key": queue_name,
    }
    if delivery_limit is not None:
        if not quorum:
            raise ValueError("x-delivery-limit needs a quorum queue: pass quorum=True")
        if delivery_limit < 1:
            raise ValueError(f"delivery_limit must be >= 1, got {delivery_limit}")
        args["x-delivery-limit"] = delivery_limit
    if quorum:
        args["x-queue-type"] = "quorum"
        args["x-dead-letter-strategy"] = "at-least-once"
        args["x-overflow"] = "reject-publish"
    return args


def dlx_exchange(name: str = DEFAULT_DLX_EXCHANGE) -> Exchange:
    """The durable topic exchange every DLX queue dead-letters to."""
    return Exchange(name, type="topic", durable=True, auto_delete=False)


def service_queue(
    name: str = DEFAULT_SERVICE_QUEUE, exchange: str = DEFAULT_DLX_EXCHANGE, *, quorum: bool = False
) -> Queue:
    """The durable queue the DLX service consumes: bound to the DLX exchange with ``#``."""
    args = {"x-queue-type": "quorum"} if quorum else None
    return Queue(
        name,
        exchange=dlx_exchange(exchange),
        routing_key="#",
        durable=True,
        auto_delete=False,
        queue_arguments=args,
    )


def migration_hint(queue: str, exchange: str) -> str:
    return (
        f"queue {queue!r} already exists with other arguments (RabbitMQ answered 406 "
        f"PRECONDITION_FAILED). To add the dead-letter exchange without losing messages either: "
        f"(1) add a policy: `celery -A proj dlx migrate {queue} --policy` (or rabbitmqctl set_policy "
        f'dlx-{queue} \'^{queue}$\' \'{{"dead-letter-exchange":"{exchange}","dead-letter-routing-key":"{queue}"}}\' '
        f"--apply-to queues), which changes nothing else; or (2) rename: `celery -A proj dlx migrate "
        f"{queue} --rename`, which declares a new queue and moves the messages. See docs/migration.md."
    )


class DLXQueue(Queue):
    """A kombu ``Queue`` that declares its dead-letter exchange and service queue first."""

    # In ``attrs`` so kombu's copies (every bind makes one) keep them.
    attrs = queue_attrs(("dlx_service_queue", None), ("dlx_quorum_service", bool))
    #: kombu sets it from ``attrs`` (celery-types does not declare it).
    no_declare: bool | None
    dlx_service_queue: str = DEFAULT_SERVICE_QUEUE
    dlx_quorum_service: bool = False

    def declare(self, nowait: bool = False, channel: Any = None) -> str:
        if self.no_declare:
            return str(self.name)
        channel = channel or self.channel
        args = self.queue_arguments or {}
        exchange = args.get("x-dead-letter-exchange")
        if exchange:
            target = service_queue(
                self.dlx_service_queue, str(exchange), quorum=self.dlx_quorum_service
            )
            target(channel).declare()
        try:
            return str(super().declare(nowait=nowait, channel=channel))
        except PreconditionFailed as exc:
            raise TopologyError(
                migration_hint(str(self.name), str(exchange or DEFAULT_DLX_EXCHANGE))
            ) from exc


def dlx_queue(
    name: str,
    exchange: Exchange | str | None = None,
    routing_key: str | None = None,
    *,
    dlx: str = DEFAULT_DLX_EXCHANGE,
    service: str = DEFAULT_SERVICE_QUEUE,
    quorum: bool = False,
    delivery_limit: int | None = None,
    queue_arguments: Mapping[str, Any] | None = None,
    **options: Any,
) -> DLXQueue:
    """A durable work queue whose dead letters go to ``dlx`` (routing key = ``name``).

    ``exchange`` and ``routing_key`` bind it as any kombu ``Queue`` (default: a direct exchange
    named like the queue, as Celery does). Other ``options`` go to ``kombu.Queue``.

    Raises:
        ConfigurationError: ``queue_arguments`` set a dead-letter exchange other than ``dlx``.
    """
    args = dict(queue_arguments or {})
    own = args.get("x-dead-letter-exchange")
    if own is not None and own != dlx:
        raise ConfigurationError(
            f"queue {name!r} sets x-dead-letter-exchange={own!r}; celery_dlx routes dead letters to "
            f"{dlx!r} (dlx_exchange). Remove the argument or set dlx_exchange={own!r}."
        )
    args.update(dead_letter_arguments(name, dlx, quorum=quorum, delivery_limit=delivery_limit))
    if isinstance(exchange, str):
        exchange = Exchange(exchange, type="direct") if exchange else Exchange("")
    options.setdefault("durable", True)
    return DLXQueue(
        name,
        exchange=exchange if exchange is not None else Exchange(name, type="direct"),
        routing_key=routing_key if routing_key is not None else name,
        queue_arguments=args,
        dlx_service_queue=service,
        dlx_quorum_service=quorum,
        **options,
    )


def as_dlx_queue(
    queue: Queue,
    *,
    dlx: str = DEFAULT_DLX_EXCHANGE,
    service: str = DEFAULT_SERVICE_QUEUE,
    quorum: bool = False,
    delivery_limit: int | None = None,
) -> Queue:
    """``queue`` with celery_dlx's dead-letter arguments, keeping its exchange and bindings.

    A queue that already names another dead-letter exchange is returned unchanged (its owner
    routes its dead letters). Exclusive and auto-delete queues are left alone too.
    """
    if isinstance(queue, DLXQueue) or queue.exclusive or queue.auto_delete:
        return queue
    args = dict(queue.queue_arguments or {})
    if args.get("x-dead-letter-exchange") not in (None, dlx):
        logger.info(
            "queue %s keeps its own dead-letter exchange %s",
            queue.name,
            args["x-dead-letter-exchange"],
        )
        return queue
    args.update(
        dead_letter_arguments(
            queue.name,
            dlx,
            quorum=quorum or args.get("x-queue-type") == "quorum",
            delivery_limit=delivery_limit,
        )
    )
    # As kombu copies a queue (``Object.__copy__``): every field in ``attrs``, plus the callback.
    fields = {
        **queue.as_dict(),
        "queue_arguments": args,
        "dlx_service_queue": service,
        "dlx_quorum_service": quorum,
    }
    new = DLXQueue(channel=None, on_declared=queue.on_declared, **fields)
    return new


def declare_topology(
    channel: Any,
    queues: Iterable[Queue],
    *,
    exchange: str = DEFAULT_DLX_EXCHANGE,
    service: str = DEFAULT_SERVICE_QUEUE,
    quorum: bool = False,
) -> list[str]:
    """Declare the DLX exchange and service queue, then ``queues``, on ``channel``.

    Returns the names declared, in order.

    Raises:
        TopologyError: a queue exists with other arguments (406), with how to migrate it.
    """
    # Each name as returned by a declare with nowait=False.
    declared = [str(service_queue(service, exchange, quorum=quorum)(channel).declare())]
    for queue in queues:
        bound = queue(channel)
        try:
            declared.append(str(bound.declare()))
        except PreconditionFailed as exc:
            raise TopologyError(migration_hint(queue.name, exchange)) from exc
    return declared
