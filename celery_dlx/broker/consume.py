"""Consuming one queue in raw deliveries, for the DLX service (celery_dlx's frame reader): all
:mod:`celery_dlx.service.loop` needs of the broker (connect and declare, wait, ack a batch)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from amqp.exceptions import PreconditionFailed
from celery import Celery
from kombu.transport.pyamqp import Channel as AMQPChannel

from celery_dlx.broker.buffered import drain_buffered
from celery_dlx.broker.frames import connection_for
from celery_dlx.errors import TopologyError

#: A delivery as py-amqp hands it over (``amqp.Message``: body, headers, properties,
#: delivery_info, channel, delivery_tag), undecoded.
Delivery = Any


class QueueConsumer:
    """Raw deliveries of ``queue`` appended to ``inbox``, on a connection of its own, after
    ``declare`` declared the queue on its channel; ``mismatch`` names the settings in the 406
    error, an empty ``tag`` lets the broker make one up.

    Raises (on entering):
        TopologyError: the queue exists with other arguments (its message names the settings).
        kombu/amqp connection errors: the broker is unreachable.
    """

    def __init__(
        self,
        app: Celery,
        queue: str,
        declare: Callable[[AMQPChannel], object],
        prefetch: int,
        inbox: list[Delivery],
        *,
        mismatch: str = "",
        tag: str = "",
    ) -> None:
        self.app = app
        self.queue = queue
        self.declare = declare
        self.prefetch = prefetch
        self.inbox = inbox
        self.mismatch = mismatch
        self.tag = tag
        self._conn: Any = None

    def __enter__(self) -> QueueConsumer:
        conn = connection_for(self.app, chunked=True)
        try:
            conn.ensure_connection(max_retries=1)
            # Raw py-amqp deliveries (amqp:// brokers only): nothing decoded, no wrapper.
            channel = cast(AMQPChannel, conn.channel())
            # py-amqp decodes a body with a content_encoding to text; the graveyard keeps bytes.
            channel.auto_decode = False
            try:
                self.declare(channel)
            except PreconditionFailed as exc:
                raise TopologyError(f"{self.mismatch or self.queue}: {exc}") from exc
            channel.basic_qos(0, self.prefetch, False)
            channel.basic_consume(self.queue, consumer_tag=self.tag, callback=self.inbox.append)
        except BaseException:
            conn.release()
            raise
        self._conn = conn
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._conn is not None:
            self._conn.release()
            self._conn = None

    def wait(self, timeout: float) -> bool:
        """Receive for up to ``timeout`` seconds (every delivery one read brought in whole);
        False when nothing came (the heartbeat is checked then)."""
        try:
            self._conn.drain_events(timeout=timeout)
        except TimeoutError:
            self._conn.heartbeat_check()
            return False
        drain_buffered(self._conn.connection)
        return True


def ack_all(messages: Sequence[Delivery]) -> None:
    """Ack a batch with one ``basic.ack(multiple)`` per channel (a batch holds every delivery
    received before it, so nothing outside it is acked)."""
    last: dict[Any, int] = {}
    for m in messages:
        last[m.channel] = max(last.get(m.channel, 0), int(m.delivery_tag))
    for channel, tag in last.items():
        channel.basic_ack(tag, multiple=True)
