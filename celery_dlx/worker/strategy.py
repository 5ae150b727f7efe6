"""Worker strategy that tells a DLX task which queue its message came from.

AMQP deliveries do not name their queue, and a routing key does not either when the queue is
bound to a fanout or topic exchange. The worker's main process knows the consumer tag of each
queue; this strategy writes the queue name into the delivery's headers before Celery builds the
request, so the task can return a retry to exactly that queue.
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
    if not tag:
        return None
    for queue, active_tag in task_queue_tags(consumer).items():
        if active_tag == tag:
            return queue
    return None


def dlx_strategy(
    task: Task[..., object], app: Celery, consumer: Consumer, **kwargs: Any
) -> Callable[..., object]:
    """Celery's default strategy, with the delivery's queue name added to its headers."""
    handler = default(task, app, consumer, **kwargs)
    # Consumer tag to queue, as seen so far. kombu numbers its consumer tags from one counter
    # per process, so a tag never names another queue later: a tag seen once stays right, and
    # only a tag not seen yet (a new consumer, a reconnection) looks at the consumer again.
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
