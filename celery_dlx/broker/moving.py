"""Moving a queue's messages to another queue with publisher confirms (``celery dlx migrate
--rename``), and the declares and bindings that come before.

A message is acked on the old queue only once the new one has it: each batch is fetched unacked
with ``basic.get``, published with ``mandatory`` and confirms, then acked (or requeued where the
broker did not confirm). Messages are received with celery_dlx's frame reader
(:func:`celery_dlx.broker.frames.connection_for`), so no message of the old queue stops the move.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from amqp.protocol import queue_declare_ok_t
from celery import Celery
from kombu import Queue
from kombu.transport.pyamqp import Channel as AMQPChannel

from celery_dlx.broker.frames import connection_for
from celery_dlx.broker.publish import ConfirmingPublisher
from celery_dlx.errors import DLXError
from celery_dlx.message.names import RAW_PROPERTIES_PROPERTY
from celery_dlx.message.outgoing import Outgoing, copy_properties


class MoveRefused(DLXError):
    """The broker did not confirm part of a batch; the message says how many moved and what
    stays where."""


def declare_renamed(
    app: Celery,
    queue: str,
    new_queue: str,
    *,
    durable: bool,
    arguments: Mapping[str, Any],
    bind: Sequence[Mapping[str, Any]] = (),
    unbind: Sequence[Mapping[str, Any]] = (),
    first: Iterable[Queue] = (),
) -> None:
    """Declare ``new_queue`` with ``arguments``, bind it, and unbind ``queue`` (bindings are
    ``source``, ``routing_key`` and ``arguments``); ``first``: queues declared before (the DLX
    service queue the new queue's dead letters go to).

    Raises:
        kombu/amqp errors: the broker is unreachable or refuses a declare (406 when
        ``new_queue`` exists with other arguments).
    """
    with connection_for(app, write=True) as conn:
        conn.ensure_connection(max_retries=3)
        channel = cast(AMQPChannel, conn.default_channel)  # RabbitMQ: a py-amqp channel
        for declared in first:
            declared(channel).declare()
        # py-amqp declares auto_delete=True unless told: the new queue must outlive its consumers
        channel.queue_declare(
            new_queue, durable=durable, auto_delete=False, arguments=dict(arguments)
        )
        for b in bind:
            channel.queue_bind(new_queue, b["source"], b["routing_key"], arguments=b["arguments"])
        for b in unbind:
            channel.queue_unbind(queue, b["source"], b["routing_key"], arguments=b["arguments"])


def move_queue(
    app: Celery,
    source: str,
    target: str,
    *,
    batch: int = 200,
    progress: Callable[[int], None] | None = None,
    first: Iterable[Queue] = (),
    move: bool = True,
) -> tuple[int, int]:
    """Declare the ``first`` queues, then move every ready message of ``source`` to ``target``
    (:func:`move_messages`, unless not ``move``), on a connection of its own.

    Returns:
        How many messages moved, and how many ready messages ``source`` holds after.

    Raises:
        MoveRefused: the broker did not confirm a batch (the rest stays on ``source``).
        kombu/amqp errors: the broker is unreachable, or ``source`` no longer exists.
    """
    with connection_for(app, write=True) as conn:
        conn.ensure_connection(max_retries=3)
        channel = cast(AMQPChannel, conn.default_channel)
        for declared in first:
            declared(channel).declare()
        moved = move_messages(conn, source, target, batch, progress) if move else 0
        # celery-types: py-amqp answers a queue_declare_ok_t (a named tuple), not a plain tuple.
        left = cast(queue_declare_ok_t, channel.queue_declare(source, passive=True))
        return moved, int(left.message_count)


def move_messages(
    connection: Any, source: str, target: str, batch: int, progress: Callable[[int], None] | None
) -> int:
    """Move the ready messages of ``source`` to ``target`` (default exchange) over
    ``connection`` (connected, best with celery_dlx's frame reader); how many moved. A message
    the broker did not confirm is requeued on ``source`` and the move stops; broker ``x-death``
    headers are stripped (as on every celery_dlx republish).

    Raises:
        MoveRefused: the broker did not confirm a batch (the rest stays on ``source``).
    """
    publisher = ConfirmingPublisher(connection)
    channel = connection.connection.channel()
    # py-amqp decodes a body with a content_encoding to text; the moved copy keeps the bytes.
    channel.auto_decode = False
    moved = 0
    try:
        while True:
            taken = _take(channel, source, batch)
            if not taken:
                break
            copies = [
                Outgoing(
                    # An empty body comes as "" whatever auto_decode says.
                    body=m.body.encode() if isinstance(m.body, str) else bytes(m.body),
                    routing_key=target,
                    headers=dict(m.headers or {}),
                    properties=copy_properties(m.properties),
                    # properties celery_dlx could not decode move exactly as they came
                    raw_properties=m.properties.get(RAW_PROPERTIES_PROPERTY),
                )
                for m in taken
            ]
            results = publisher.publish_many(copies)
            for msg, ok in zip(taken, results, strict=True):
                if ok:
                    channel.basic_ack(msg.delivery_tag)
                else:
                    channel.basic_reject(msg.delivery_tag, requeue=True)
            done = sum(results)
            moved += done
            if progress is not None:
                progress(done)
            if done < len(taken):
                raise MoveRefused(
                    f"the broker refused {len(taken) - done} messages for {target!r} (moved "
                    f"{moved}; the rest stays on {source!r}): does {target!r} exist?"
                )
    finally:
        publisher.close()
        channel.close()
    return moved


def _take(channel: Any, queue: str, n: int) -> list[Any]:
    out: list[Any] = []
    while len(out) < n:
        msg = channel.basic_get(queue, no_ack=False)
        if msg is None:
            break
        out.append(msg)
    return out


def drain_overflow(
    app: Celery, service_queue: str, *, quorum: bool = False, requeue: bool = False
) -> tuple[int, int]:
    """The overflow queue of ``service_queue`` (declared if missing): with ``requeue``, move its
    messages back to ``service_queue`` first. How many moved, and how many wait there after."""
    from celery_dlx.broker.topology import overflow_name, overflow_queue

    overflow = overflow_queue(service_queue, quorum=quorum)
    return move_queue(
        app, overflow_name(service_queue), service_queue, first=[overflow], move=requeue
    )
