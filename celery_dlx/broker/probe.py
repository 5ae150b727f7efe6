"""Passive looks at the broker: does an exchange or a queue exist, what does a queue hold.

Every function here declares passively (nothing is created or changed) on a connection of its
own. A passive declare of a queue counts as a use of it: it re-arms the queue's ``x-expires``.
A refused declare (404) closes its channel, so the next declare opens a fresh one.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

from amqp.exceptions import NotFound
from celery import Celery

from celery_dlx.broker.ladder import close_quietly


class Missing(NamedTuple):
    """What :func:`missing_entities` did not find: name -> the broker's answer, per kind."""

    exchanges: dict[str, str]
    queues: dict[str, str]


def queue_counts(
    app: Celery, names: Iterable[str], *, retries: int = 3
) -> dict[str, tuple[int, int]]:
    """Queue name -> ``(ready messages, consumers)``, for the queues of ``names`` that exist.

    Raises:
        kombu/amqp connection errors: the broker is unreachable.
    """
    counts: dict[str, tuple[int, int]] = {}
    with app.connection_for_read() as conn:
        conn.ensure_connection(max_retries=retries)
        channel = conn.connection.channel()
        try:
            for name in names:
                try:
                    ok = channel.queue_declare(name, passive=True)
                except NotFound:
                    channel = conn.connection.channel()  # a 404 closes the channel
                    continue
                counts[name] = (int(ok.message_count), int(ok.consumer_count))
        finally:
            close_quietly(channel)
    return counts


def ready_messages(app: Celery, queue: str) -> int | None:
    """Ready messages in ``queue``, or None when it cannot be read (no such queue, or the broker
    is unreachable)."""
    try:
        found = queue_counts(app, [queue], retries=1).get(queue)
    except Exception:  # an unreachable broker: no evidence either way
        return None
    return None if found is None else found[0]


def missing_entities(
    app: Celery, *, exchanges: Iterable[str] = (), queues: Iterable[str] = ()
) -> Missing:
    """The exchanges and queues among those named that the broker refuses to declare passively:
    name -> the broker's answer (``NOT_FOUND - no queue 'q' in vhost '/'``), per kind.

    Raises:
        kombu/amqp connection errors: the broker is unreachable.
    """
    missing = Missing({}, {})
    with app.connection_for_read() as conn:
        conn.ensure_connection(max_retries=3)
        channel = conn.connection.channel()
        try:
            for name in exchanges:
                try:
                    # passive: RabbitMQ checks only that the exchange exists, not its type
                    channel.exchange_declare(name, "topic", passive=True)
                except Exception as exc:
                    missing.exchanges[name] = str(exc)
                    channel = conn.connection.channel()  # a refusal closes the channel
            for name in queues:
                try:
                    channel.queue_declare(name, passive=True)
                except Exception as exc:
                    missing.queues[name] = str(exc)
                    channel = conn.connection.channel()
        finally:
            close_quietly(channel)
    return missing
