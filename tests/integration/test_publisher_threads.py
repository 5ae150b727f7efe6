"""One ConfirmingPublisher shared by the threads of a thread pool (the runtime's publisher):
every confirm reaches the thread that published, none is lost to another thread."""

from __future__ import annotations

import threading
from typing import Any

from kombu import Connection

from celery_dlx.broker.publish import ConfirmingPublisher
from celery_dlx.message.outgoing import Outgoing
from tests.conftest import BROKER_URL
from tests.integration.helpers import queue_depth


def test_threads_sharing_one_publisher_all_get_their_confirms(
    uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    queue = f"threads-{uid}"
    broker.channel().queue_declare(queue, durable=True, auto_delete=False)
    cleanup_queues.append(queue)
    connection = Connection(BROKER_URL)
    publisher = ConfirmingPublisher(connection, timeout=30.0)
    results: list[bool] = []
    errors: list[BaseException] = []

    def publish(n: int) -> None:
        try:
            for i in range(40):
                batch = [
                    Outgoing(body=f"{n}-{i}-{k}".encode(), routing_key=queue) for k in range(3)
                ]
                results.extend(publisher.publish_many(batch))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    publisher.close()
    connection.release()
    assert errors == []
    assert len(results) == 4 * 40 * 3 and all(results), results.count(False)
    assert queue_depth(broker.channel(), queue) == 4 * 40 * 3
