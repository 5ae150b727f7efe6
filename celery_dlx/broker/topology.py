"""Kombu declarations for dead-lettering: work queues with a DLX, the DLX exchange and service queue.

A :class:`DLXQueue` declares its dead-letter target before itself wherever kombu declares it
(worker or producer): RabbitMQ silently drops a classic queue's dead letter when its DLX is missing.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from amqp.channel import Channel as AMQPChannel
from amqp.exceptions import PreconditionFailed
from kombu import Exchange, Queue

from celery_dlx.broker.management import (
    Management,
    ManagementError,
    dead_letter_exchange_of,
    management_for,
)
from celery_dlx.compat import queue_attrs
from celery_dlx.docs_url import doc_url
from celery_dlx.errors import ConfigurationError, TopologyError
from celery_dlx.message.names import DEFAULT_DLX_EXCHANGE, DEFAULT_SERVICE_QUEUE

if TYPE_CHECKING:
    from celery import Celery
    from kombu.transport.base import StdChannel

logger = logging.getLogger(__name__)

#: A quorum queue dead-lettering at-least-once, which RabbitMQ allows only with reject-publish.
QUORUM_AT_LEAST_ONCE: Mapping[str, str] = {
    "x-queue-type": "quorum",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
}


def dead_letter_arguments(
    queue_name: str,
    exchange: str = DEFAULT_DLX_EXCHANGE,
    *,
    quorum: bool = False,
    delivery_limit: int | None = None,
) -> dict[str, str | int]:
    """Queue arguments routing ``queue_name``'s dead letters to ``exchange`` with key
    ``queue_name``; with ``quorum``, a quorum queue dead-lettering at-least-once, whose
    ``delivery_limit`` sets ``x-delivery-limit``.

    Raises:
        ValueError: a delivery limit without ``quorum``, or a non-positive one.
    """
    if not queue_name:
        raise ValueError("queue name must not be empty")
    if not exchange:
        raise ValueError(
            "dead-letter exchange name must not be empty (the default exchange cannot be a DLX here)"
        )
    args: dict[str, str | int] = {
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
        args.update(QUORUM_AT_LEAST_ONCE)
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


def overflow_queue(service: str = DEFAULT_SERVICE_QUEUE, *, quorum: bool = False) -> Queue:
    """The durable queue, bound to nothing, where the DLX service puts dead letters by name while
    their cause holds ``dlx_graveyard_max_per_cause`` obituaries (``dlx overflow --requeue``)."""
    args = {"x-queue-type": "quorum"} if quorum else None
    return Queue(overflow_name(service), durable=True, auto_delete=False, queue_arguments=args)


def overflow_name(service: str) -> str:
    return f"{service}.overflow"


#: Queue arguments a policy's ``dead-letter-exchange``/``dead-letter-routing-key`` stand for.
POLICY_DLX_ARGUMENTS = ("x-dead-letter-exchange", "x-dead-letter-routing-key")


def policy_name(queue: str) -> str:
    """The policy ``celery dlx migrate QUEUE --policy`` writes for ``queue``."""
    return f"celery-dlx-{queue}"


def app_reference(main: str | None, argv: Sequence[str] | None = None) -> str:
    """How the user names the app on the command line: the ``-A``/``--app`` value of this
    process (``celery -A proj worker``), else the app's ``main`` name, else ``proj``."""
    args = list(sys.argv if argv is None else argv)
    for i, arg in enumerate(args):
        if arg in ("-A", "--app") and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--app="):
            return arg[len("--app=") :]
        if arg.startswith("-A") and len(arg) > 2:
            return arg[2:]
    return main if main and main != "__main__" else "proj"


def management_of_app(app: Celery) -> Management:
    """The management API of ``app``'s broker: ``http://<broker host>:15672`` with the broker's
    credentials, or ``$CELERY_DLX_MANAGEMENT_URL``/``_USER``/``_PASSWORD``."""
    url, user, password = (
        os.environ.get(f"CELERY_DLX_MANAGEMENT_{name}") or None
        for name in ("URL", "USER", "PASSWORD")
    )
    conn = app.connection_for_write()
    try:
        return management_for(conn, url=url, user=user, password=password, timeout=5.0)
    finally:
        conn.release()


def vhost_of(channel: Any) -> str:
    """The virtual host of ``channel``'s connection ("/" when it cannot say)."""
    vhost = getattr(getattr(channel, "connection", None), "virtual_host", None)
    return vhost if isinstance(vhost, str) and vhost else "/"


def migration_hint(
    queue: str, exchange: str, app: str = "proj", detail: str = "", vhost: str = "/"
) -> str:
    """The 406 error's text: what happened and the two ways out (the ``rabbitmqctl`` line needs
    its ``-p`` vhost, or the policy would go into ``/``)."""
    policy = policy_name(queue)
    return (
        f"queue {queue!r} already exists with other arguments (RabbitMQ answered 406 "
        f"PRECONDITION_FAILED){detail}. To add the dead-letter exchange without losing messages "
        f"either: (1) add a policy: `celery -A {app} dlx migrate {queue} --policy` (or rabbitmqctl "
        f"set_policy -p {shlex.quote(vhost)} {policy} '^{queue}$' "
        f'\'{{"dead-letter-exchange":"{exchange}",'
        f'"dead-letter-routing-key":"{queue}"}}\' --apply-to queues), which changes nothing else; '
        f"the app then declares the queue as it is, no code change; or (2) rename: "
        f"`celery -A {app} dlx migrate {queue} --rename`, which declares a new queue and moves the "
        f"messages (then consume the new queue). See {doc_url('migration')}"
    )


def _renamed_exchange(target: str | None, exchange: str) -> str:
    """What to say when ``target`` is the exchange an app with a key prefix of its own used
    before its default exchange followed the prefix (``celery_dlx`` -> ``celery_dlx.PREFIX``)."""
    if target != DEFAULT_DLX_EXCHANGE or not exchange.startswith(f"{DEFAULT_DLX_EXCHANGE}."):
        return ""
    return (
        f" (the exchange of earlier versions: an app with a dlx_key_prefix of its own now "
        f"dead-letters to {exchange!r}; to keep the old names set dlx_exchange = "
        f"{DEFAULT_DLX_EXCHANGE!r} and dlx_service_queue = {DEFAULT_SERVICE_QUEUE!r})"
    )


def _probe(channel: Any, queue: Queue, arguments: Mapping[str, Any]) -> bool:
    """Declare ``queue`` with ``arguments`` on a throwaway channel of ``channel``'s connection:
    False when RabbitMQ answers 406 (which closes only that channel).

    Anything else raised (a timeout or Ctrl-C mid-frame) leaves the probe as it is: py-amqp
    loses its place in the byte stream when a read is interrupted by anything but a socket
    timeout, and closing the probe would then wait forever (seen in Celery's own suite).
    """
    probe = channel.connection.channel()
    try:
        copy = queue.bind(probe)
        copy.queue_arguments = dict(arguments)
        Queue.queue_declare(copy)
    except PreconditionFailed:
        if probe.is_open:
            probe.close()
        return False
    probe.close()
    return True


def _is_amqp(channel: Any) -> bool:
    return isinstance(channel, AMQPChannel)


def without_policy_arguments(arguments: Mapping[str, object]) -> dict[str, object]:
    """``arguments`` less those a dead-letter policy provides."""
    return {k: v for k, v in arguments.items() if k not in POLICY_DLX_ARGUMENTS}


class DLXQueue(Queue):
    """A kombu ``Queue`` that declares its dead-letter exchange and service queue first."""

    # In ``attrs`` so kombu's copies (every bind makes one) keep them.
    attrs = queue_attrs(
        ("dlx_service_queue", None),
        ("dlx_quorum_service", bool),
        ("dlx_app", None),
        ("dlx_management", None),
    )
    #: kombu sets it from ``attrs`` (celery-types does not declare it).
    no_declare: bool | None
    dlx_service_queue: str = DEFAULT_SERVICE_QUEUE
    dlx_quorum_service: bool = False
    #: How the error names the app (``celery -A <dlx_app> dlx migrate ...``).
    dlx_app: str | None = None
    #: The management API asked whether a policy gives the queue its dead-letter exchange.
    dlx_management: Management | None = None

    def as_dict(self, recurse: bool = False) -> dict[str, object]:
        """kombu's fields: a report (``recurse=True``: ``celery inspect active_queues``, sent as
        JSON) leaves out celery_dlx's, which only kombu's copies (``recurse=False``) need."""
        data: dict[str, object] = super().as_dict(recurse)
        if recurse:
            for name, _ in self.attrs[len(Queue.attrs) :]:  # celery_dlx's own
                data.pop(name, None)
        return data

    def declare(self, nowait: bool = False, channel: StdChannel | None = None) -> str:
        """Declare the dead-letter target, then the queue, its exchange and bindings.

        On a RabbitMQ channel the queue is first probed on a throwaway channel. When RabbitMQ
        refuses its arguments (406) but a policy already sends its dead letters to the same
        exchange (``dlx migrate QUEUE --policy``), the queue is declared as it is, without them.
        Otherwise the 406 becomes a :class:`TopologyError` saying how to migrate, and the
        caller's channel stays open.
        """
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
        dlx = str(exchange or DEFAULT_DLX_EXCHANGE)
        if exchange and _is_amqp(channel) and not _probe(channel, self, args):
            self._check_policy(channel, dlx)
            copy = self.bind(channel)
            copy.queue_arguments = without_policy_arguments(args)
            logger.info(
                "queue %s exists without dead-letter arguments; its dead letters go to %s by "
                "policy, so it is declared as it is",
                self.name,
                dlx,
            )
            return str(Queue.declare(copy, nowait=nowait, channel=channel))
        try:
            return str(super().declare(nowait=nowait, channel=channel))
        except PreconditionFailed as exc:
            raise TopologyError(
                migration_hint(
                    str(self.name), dlx, app_reference(self.dlx_app), vhost=vhost_of(channel)
                )
            ) from exc

    def _check_policy(self, channel: Any, exchange: str) -> None:
        """Raise the migration error unless a policy sends the queue's dead letters to
        ``exchange`` and the queue takes a declaration without the dead-letter arguments."""
        name = str(self.name)
        app = app_reference(self.dlx_app)
        vhost = vhost_of(channel)
        if self.dlx_management is None:
            raise TopologyError(migration_hint(name, exchange, app, vhost=vhost))
        try:
            info = self.dlx_management.queue(name) or {}
        except ManagementError as exc:
            detail = f" and the management API could not say whether a policy covers it ({exc})"
            raise TopologyError(migration_hint(name, exchange, app, detail, vhost)) from exc
        target, where = dead_letter_exchange_of(info)
        if target == exchange and where == "argument":
            detail = (
                f"; it already dead-letters to {exchange!r} by argument, but other properties "
                f"differ: the broker has durable={info.get('durable')}, "
                f"auto_delete={info.get('auto_delete')}, arguments={info.get('arguments')}"
            )
            raise TopologyError(migration_hint(name, exchange, app, detail, vhost))
        if target != exchange or where not in ("policy", "operator-policy"):
            shown = f"to {target!r} by {where}" if target else "nowhere"
            detail = f"; its dead letters go {shown}{_renamed_exchange(target, exchange)}"
            raise TopologyError(migration_hint(name, exchange, app, detail, vhost))
        if not _probe(channel, self, without_policy_arguments(self.queue_arguments or {})):
            raise TopologyError(
                f"queue {name!r} gets its dead-letter exchange from policy "
                f"{info.get('policy')!r}, but other arguments differ too (queue type, "
                f"length limit...): declare it as it is, Queue({name!r}, no_declare=True), or "
                f"`celery -A {app} dlx migrate {name} --rename`. See {doc_url('migration')}"
            )


def dlx_queue(
    name: str,
    exchange: Exchange | str | None = None,
    routing_key: str | None = None,
    *,
    dlx: str = DEFAULT_DLX_EXCHANGE,
    service: str = DEFAULT_SERVICE_QUEUE,
    quorum: bool = False,
    delivery_limit: int | None = None,
    queue_arguments: Mapping[str, object] | None = None,
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
    app: str | None = None,
    management: Management | None = None,
) -> Queue:
    """``queue`` with celery_dlx's dead-letter arguments, keeping its exchange and bindings;
    ``app`` and ``management`` go to the :class:`DLXQueue`. A queue that names another
    dead-letter exchange (its owner routes its dead letters), an exclusive or an auto-delete one
    is returned unchanged.
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
        "dlx_app": app,
        "dlx_management": management,
    }
    return DLXQueue(channel=None, on_declared=queue.on_declared, **fields)


def declare_topology(
    channel: StdChannel,
    queues: Iterable[Queue],
    *,
    exchange: str = DEFAULT_DLX_EXCHANGE,
    service: str = DEFAULT_SERVICE_QUEUE,
    quorum: bool = False,
) -> list[str]:
    """Declare the DLX exchange and service queue, then ``queues``, on ``channel``; the names
    declared, in order.

    Raises:
        TopologyError: a queue exists with other arguments (406), with how to migrate it.
    """
    declared = [str(service_queue(service, exchange, quorum=quorum)(channel).declare())]
    for queue in queues:
        bound = queue(channel)
        try:
            declared.append(str(bound.declare()))
        except PreconditionFailed as exc:
            raise TopologyError(
                migration_hint(queue.name, exchange, app_reference(None), vhost=vhost_of(channel))
            ) from exc
    return declared
