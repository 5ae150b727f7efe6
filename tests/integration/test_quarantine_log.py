"""A non-Celery message on a DLX queue is quarantined with one line, not also "deleted"."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Producer

from celery_dlx.message.names import REASON_HEADER
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import get_all, queue_depth, wait_until


@pytest.fixture
def app(uid: str, key_prefix: str, cleanup_queues: list[str]) -> Iterator[Any]:
    app = make_app(uid)
    yield app
    cleanup_queues.extend([*queue_names(app), f"exchange:dlx-{uid}"])


def test_quarantined_foreign_message_is_not_reported_as_deleted(
    app: Any, uid: str, broker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    @app.task(name=f"ok-{uid}")
    def ok() -> None:
        return None

    ok.delay()  # declares the queue with its arguments
    channel = broker.channel()
    wait_until(lambda: queue_depth(channel, f"work-{uid}") == 1)
    Producer(channel).publish(
        {"order": 42}, routing_key=f"work-{uid}", exchange="", serializer="json"
    )  # no task header: not a Celery task message
    caplog.set_level(logging.INFO)
    with worker(app):
        wait_until(lambda: queue_depth(channel, f"dead-{uid}") == 1, what="the quarantined copy")
        wait_until(lambda: queue_depth(channel, f"work-{uid}") == 0, what="the queue emptied")
    [copy] = get_all(channel, f"dead-{uid}")
    assert copy.headers[REASON_HEADER].startswith("undecodable: not a Celery task message")
    text = caplog.text
    assert f"quarantined a message from work-{uid}" in text, "the one line it gets"
    assert "Received and deleted unknown message" not in text, text
