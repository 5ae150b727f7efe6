"""QueueConsumer.wait reads a backlog in bursts, in order, and leaves the socket as it found it."""

from __future__ import annotations

import uuid

from celery import Celery
from kombu import Connection, Producer, Queue

from celery_dlx.broker import consume
from celery_dlx.broker.consume import QueueConsumer
from tests.conftest import BROKER_URL

COUNT = 600


def test_a_backlog_arrives_in_bursts_in_order_and_whole() -> None:
    name = f"burst-{uuid.uuid4().hex[:10]}"
    app = Celery(name, broker=BROKER_URL, set_as_current=False)
    queue = Queue(name, durable=False, auto_delete=False)
    inbox: list[object] = []
    with Connection(BROKER_URL) as conn:
        channel = conn.channel()
        try:
            queue(channel).declare()
            producer = Producer(channel)
            # Bodies of several frames' worth now and then: a burst's pause may cut a message
            # between its frames, and the next call must read it whole.
            for i in range(COUNT):
                body = (b"%06d" % i) + (b"x" * (200_000 if i % 97 == 0 else 100))
                producer.publish(body, routing_key=name, message_id=str(i))
            with QueueConsumer(app, name, lambda ch: queue(ch).declare(), COUNT, inbox) as c:
                sock = c._conn.connection.transport.sock
                before = sock.gettimeout()
                calls = 0
                while len(inbox) < COUNT and calls < COUNT:
                    c.wait(2.0)
                    calls += 1
                    assert sock.gettimeout() == before
                    assert len(inbox) <= calls * (consume.BURST_LIMIT + 1)
                ids = [int(m.properties["message_id"]) for m in inbox]
                assert ids == list(range(COUNT))
                assert all(bytes(m.body[:6]) == b"%06d" % i for i, m in enumerate(inbox))
                assert [len(m.body) for m in inbox[::97]] == [200_006] * len(inbox[::97])
                # Bursts: far fewer calls than deliveries (one per delivery before).
                assert calls < COUNT // 3, calls
                consume.ack_all(inbox)
        finally:
            queue(conn.channel()).delete()
