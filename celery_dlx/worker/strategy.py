"""Worker strategy that tells a DLX task which queue its message came from.

AMQP deliveries do not name their queue (nor does a fanout or topic routing key); the main
process knows each queue's consumer tag, and writes the queue into the delivery's headers so a
retry goes back to exactly that queue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery, Task
from celery.worker.consumer import Consumer

from celery_dlx.compat.celery import default_strategy as default
from celery_dlx.compat.celery import task_queue_tags
from celery_dlx.message.names import DELIVERY_QUEUE_HEADER

#: kombu's ``Message`` as Celery's consumer hands it over.
Message = Any


def _queue_of(consumer: Consumer, message: Message) -> str | None:
    tag = (message.delivery_info or {}).get("consumer_tag")
    tags = task_queue_tags(consumer) if tag else {}
    return next((queue for queue, active_tag in tags.items() if active_tag == tag), None)


def dlx_strategy(
    task: Task[..., object], app: Celery, consumer: Consumer, **kwargs: Any
) -> Callable[..., object]:
    """Celery's default strategy, with the delivery's queue name added to its headers."""
    handler = default(task, app, consumer, **kwargs)
    # kombu numbers consumer tags from one counter per process: a tag never names another queue
    # later, so only a new tag looks at the consumer.
    queue_of_tag: dict[str, str] = {}

    def task_message_handler(
        message: Message,
        body: Any,
        ack: Callable[..., Any],
        reject: Callable[..., Any],
        callbacks: set[Callable[..., Any]],
        **kw: Any,
    ) -> Any:
        headers = message.headers
        if isinstance(headers, dict):
            tag = (message.delivery_info or {}).get("consumer_tag")
            queue = queue_of_tag.get(tag) if tag else None
            if queue is None:
                queue = _queue_of(consumer, message)
                if queue and tag:
                    queue_of_tag[tag] = queue
            if queue:
                headers[DELIVERY_QUEUE_HEADER] = queue
        return handler(message, body, ack, reject, callbacks, **kw)

    return task_message_handler
