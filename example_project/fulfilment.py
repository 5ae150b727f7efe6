"""The fulfilment service: a consumer in "another language" that knows nothing of Celery.

It stands for a Go service. It declares its queue with a dead-letter exchange (two queue
arguments, nothing else), reads protobuf ``OrderPlaced`` events, acks the ones it can fulfil and
rejects the others with ``requeue=false``. RabbitMQ dead-letters a rejected event to celery_dlx's
exchange; the DLX service then applies the ``dlx_queues`` policy of this queue (requeue once,
park once, bury) without any change to this consumer.

Run: ``EXAMPLE_RUN=<run> python -m example_project.fulfilment``; stops on SIGTERM or SIGINT.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

import pika

from .app import BROKER_URL, DLX_EXCHANGE, FULFILMENT, QUEUE_EXPIRES, REDIS_URL, RUN
from .schema import message_class
from .world import Ledger, client

logger = logging.getLogger("fulfilment")

#: Warehouses this service can ship from; an event naming another one is rejected.
WAREHOUSES = frozenset({"AMS", "BER"})


def queue_arguments() -> dict[str, Any]:
    """What any producer or consumer, in any language, declares for a queue celery_dlx serves."""
    return {
        "x-dead-letter-exchange": DLX_EXCHANGE,
        "x-dead-letter-routing-key": FULFILMENT,
        "x-expires": QUEUE_EXPIRES * 1000,
    }


def pika_url(url: str) -> str:
    """``url`` for pika: kombu writes the default vhost ``/`` as ``//``, pika as ``/%2F``."""
    return url[:-1] + "%2F" if url.endswith("//") else url


def declare(channel: Any) -> None:
    """Declare the fulfilment queue (durable, dead-lettering to celery_dlx's exchange)."""
    channel.queue_declare(FULFILMENT, durable=True, arguments=queue_arguments())


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="[fulfilment] %(message)s", stream=sys.stdout)
    logging.getLogger("pika").setLevel(logging.WARNING)
    order_placed = message_class()
    ledger = Ledger(client(REDIS_URL), RUN)
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())

    connection = pika.BlockingConnection(pika.URLParameters(pika_url(BROKER_URL)))
    channel = connection.channel()
    declare(channel)
    channel.basic_qos(prefetch_count=10)

    def on_event(ch: Any, method: Any, properties: Any, body: bytes) -> None:
        message_id = properties.message_id or "?"
        try:
            event = order_placed.FromString(body)
        except Exception as exc:  # the Go service's json/proto decode error
            logger.info("event %s is not an OrderPlaced (%s): rejecting", message_id, exc)
            ch.basic_reject(method.delivery_tag, requeue=False)
            ledger.note(message_id, "rejected")
            return
        if event.warehouse not in WAREHOUSES:
            logger.info(
                "order %s names warehouse %r, which does not exist: rejecting",
                event.order_id,
                event.warehouse,
            )
            ch.basic_reject(method.delivery_tag, requeue=False)
            ledger.note(message_id, "rejected")
            return
        ledger.note(message_id, "acked")
        ch.basic_ack(method.delivery_tag)
        logger.info("order %s handed to warehouse %s", event.order_id, event.warehouse)

    channel.basic_consume(FULFILMENT, on_event)
    logger.info("consuming %s", FULFILMENT)
    while not stop.is_set():
        connection.process_data_events(time_limit=0.2)
    connection.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
