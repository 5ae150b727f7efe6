"""Publishing raw messages with pipelined publisher confirms: every republish celery_dlx makes
goes ``mandatory`` through :class:`ConfirmingPublisher`, and a message the broker returned
(unroutable: its queue is gone) or nacked counts as not published, so the caller keeps it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any

from kombu import Connection
from kombu.transport.pyamqp import Channel as AMQPChannel

from celery_dlx.compat.amqp import EncodedMessage
from celery_dlx.errors import PublishError
from celery_dlx.message.outgoing import INT32_MAX, PUBLISH_SEQ_HEADER, Outgoing, copy_properties

logger = logging.getLogger(__name__)


def amqp_message(message: Outgoing, seq: int) -> EncodedMessage:
    """``message`` as py-amqp publishes it (see :meth:`Outgoing.encode`)."""
    encoded = message.encode(seq)
    return EncodedMessage(encoded.body, encoded.properties_bytes, **encoded.properties)


class ConfirmingPublisher:
    """Publishes on a dedicated confirm-mode channel of ``connection`` (py-amqp), confirms
    pipelined, waiting up to ``timeout`` seconds for a batch's; with ``owns_connection``,
    :meth:`close` releases the connection too."""

    def __init__(
        self, connection: Connection, timeout: float = 30.0, *, owns_connection: bool = False
    ) -> None:
        self.connection = connection
        self.timeout = timeout
        self.owns_connection = owns_connection
        self._channel: AMQPChannel | None = None
        # Wraps inside 32 bits: a larger header integer would go out as text (issue 12), and
        # seqs need only be unique within one batch (returns are matched per batch).
        self._seq = itertools.cycle(range(1, INT32_MAX + 1))
        self._next_tag = 1
        self._acked: dict[int, bool] = {}
        self._returned: set[int] = set()
        self._returned_unsequenced = False
        # One batch at a time: the threads of a thread pool share the runtime's publisher, and
        # interleaved batches would take each other's confirms (lost, then "not confirmed").
        # Reentrant: a caller that also declares on the connection holds it (exclusive()).
        self._lock = threading.RLock()

    def exclusive(self) -> AbstractContextManager[Any]:
        """Hold the publisher (and its connection) for a sequence of calls (a declare, then a
        batch), so no other thread's batch interleaves."""
        return self._lock

    def connect(self) -> None:
        self._ensure_channel()

    def _ensure_channel(self) -> AMQPChannel:
        if self._channel is None or not getattr(self._channel, "is_open", False):
            self.connection.ensure_connection(max_retries=3)
            raw = self.connection.connection
            channel = raw.channel()
            channel.confirm_select()
            channel.events["basic_ack"].add(self._on_ack)
            channel.events["basic_nack"].add(self._on_nack)
            channel.events["basic_return"].add(self._on_return)
            self._channel = channel
            self._next_tag = 1
            self._acked.clear()
        return self._channel

    def _settle(self, tag: int, multiple: bool, ok: bool) -> None:
        if multiple:
            # The batch's tags in publish order (ascending): a confirm of many settles them from
            # the front, each tag looked at once per batch (a scan of every pending tag per
            # confirm made a batch's confirms cost its size squared).
            order = self._order
            while order and order[0] <= tag:
                pending = order.popleft()
                if pending in self._pending:
                    self._acked[pending] = ok
                    self._pending.discard(pending)
        elif tag in self._pending:
            self._acked[tag] = ok
            self._pending.discard(tag)

    def _on_ack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, True)

    def _on_nack(self, tag: int, multiple: bool) -> None:
        self._settle(tag, multiple, False)

    def _on_return(self, exc: Exception, exchange: str, routing_key: str, message: Any) -> None:
        seq = (message.headers or {}).get(PUBLISH_SEQ_HEADER) if message is not None else None
        if isinstance(seq, int):
            self._returned.add(seq)
        else:  # a message sent with raw properties: every such one of the batch counts as lost
            self._returned_unsequenced = True
        logger.warning(
            "broker returned a message for %r (%s): its queue does not exist", routing_key, exc
        )

    _pending: set[int]
    _order: deque[int]

    def publish_many(self, messages: Sequence[Outgoing]) -> list[bool]:
        """Publish ``messages`` and wait for their confirms; per message, True only if the broker
        routed and confirmed it.

        Raises:
            PublishError: the confirms did not all arrive within ``timeout``; nothing may be
                assumed published.
        """
        if not messages:
            return []
        with self._lock:
            return self._publish_many(messages)

    def _publish_many(self, messages: Sequence[Outgoing]) -> list[bool]:
        channel = self._ensure_channel()
        self._pending = set()
        self._order = deque()
        self._returned_unsequenced = False
        tags: list[tuple[int, int]] = []
        for msg in messages:
            seq = next(self._seq)
            tag = self._next_tag
            self._next_tag += 1
            self._pending.add(tag)
            self._order.append(tag)
            channel.basic_publish(
                amqp_message(msg, seq),
                exchange=msg.exchange,
                routing_key=msg.routing_key,
                mandatory=True,
            )
            tags.append((tag, seq))
        deadline = time.monotonic() + self.timeout
        raw = self.connection.connection
        while self._pending:
            left = deadline - time.monotonic()
            if left <= 0:
                self._channel = None
                raise PublishError(
                    f"{len(self._pending)} of {len(messages)} publishes not confirmed in {self.timeout}s"
                )
            try:
                raw.drain_events(timeout=min(left, 1.0))
            except TimeoutError:
                continue
        out = [self._acked.pop(tag, False) and seq not in self._returned for tag, seq in tags]
        if self._returned_unsequenced:
            out = [ok and m.raw_properties is None for ok, m in zip(out, messages, strict=True)]
        self._returned.difference_update(seq for _, seq in tags)
        return out

    def publish(self, message: Outgoing) -> None:
        """Publish one message and wait for its confirm.

        Raises:
            PublishError: the broker nacked or returned it, or did not confirm in time.
        """
        if not self.publish_many([message])[0]:
            raise PublishError(
                f"broker did not accept the message for {message.routing_key!r} (nacked or unroutable)"
            )

    def close(self) -> None:
        if self._channel is not None:
            try:
                self._channel.close()
            except Exception:  # closing a broken channel is best effort
                logger.debug("closing confirm channel failed", exc_info=True)
            self._channel = None
        if self.owns_connection:
            try:
                self.connection.release()
            except Exception:  # a dead connection may fail to close
                logger.debug("releasing a publisher connection failed", exc_info=True)


def outgoing_copies(
    items: Iterable[tuple[bytes, Mapping[str, object], Mapping[str, object], str]],
    exchange: str = "",
) -> list[Outgoing]:
    """Build :class:`Outgoing` copies from ``(body, headers, properties, routing_key)`` tuples."""
    return [
        Outgoing(
            body=b,
            routing_key=rk,
            exchange=exchange,
            headers=dict(h),
            properties=copy_properties(p),
        )
        for b, h, p, rk in items
    ]
