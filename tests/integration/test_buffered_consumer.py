"""The DLX service's consumer reads the real RabbitMQ in chunks and loses no byte of any delivery.

Bodies from empty to several frames long (RabbitMQ splits a body at its ``frame_max``, 128 KiB),
header tables of every size, a backlog of thousands: each delivery arrives whole, in order, with
its headers, and a batch ack takes them all.
"""

from __future__ import annotations

import hashlib
from typing import Any

import amqp
from celery import Celery
from kombu import Connection

from celery_dlx.broker.buffered import BufferedTransport
from celery_dlx.broker.consume import QueueConsumer, ack_all
from tests.conftest import BROKER_URL

COUNT = 3000


def body_of(i: int) -> bytes:
    """Mostly small bodies, now and then one of several frames, and empty ones."""
    size = 0 if i % 97 == 0 else (300_000 + i if i % 501 == 0 else 40 + (i * 37) % 2000)
    return hashlib.sha256(str(i).encode()).digest() * (size // 32) + b"x" * (size % 32)


def test_a_backlog_arrives_whole_and_in_order_through_chunked_reads(
    uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    queue = f"chunked-{uid}"
    cleanup_queues.append(queue)
    raw = broker.connection
    channel = raw.channel()
    channel.queue_declare(queue, auto_delete=False)
    for i in range(COUNT):
        headers = {"i": i, "pad": "h" * (i % 300), "nested": {"list": [i, str(i)]}}
        channel.basic_publish(
            amqp.Message(body_of(i), message_id=str(i), application_headers=headers),
            exchange="",
            routing_key=queue,
        )
    app = Celery(f"chunked-{uid}", broker=BROKER_URL, set_as_current=False)
    inbox: list[Any] = []
    with QueueConsumer(app, queue, lambda ch: None, 1000, inbox) as consumer:
        transport = consumer._conn.connection.transport
        assert isinstance(transport, BufferedTransport)  # the service's connection reads so
        got: list[Any] = []
        while len(got) < COUNT:
            assert consumer.wait(10.0), f"only {len(got)} of {COUNT} arrived"
            if len(inbox) >= 300 or len(got) + len(inbox) >= COUNT:
                ack_all(inbox)
                got.extend(inbox)
                inbox.clear()
    assert [int(m.properties["message_id"]) for m in got] == list(range(COUNT))
    for i, message in enumerate(got):
        body = message.body or b""  # py-amqp gives an empty body as "" (the service knows)
        assert body == body_of(i), i
        assert message.headers["i"] == i and message.headers["nested"] == {"list": [i, str(i)]}
    with Connection(BROKER_URL) as conn:
        left = conn.channel().queue_declare(queue, passive=True).message_count
    assert left == 0  # every batch ack reached the broker
