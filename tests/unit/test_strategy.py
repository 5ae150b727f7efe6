"""The worker strategy's queue lookup: each delivery is told the queue it came from."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from celery_dlx.message.names import DELIVERY_QUEUE_HEADER
from celery_dlx.worker import strategy


class CountingTags(dict[str, str]):
    """kombu's ``Consumer._active_tags`` (queue name to consumer tag), counting its reads."""

    reads = 0

    def items(self) -> Any:
        self.reads += 1
        return super().items()


@pytest.fixture
def handled(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The headers each delivery reached Celery's own strategy with."""
    seen: list[dict[str, Any]] = []

    def default(*_: Any, **__: Any) -> Any:
        return lambda message, *args, **kwargs: seen.append(dict(message.headers))

    monkeypatch.setattr(strategy, "default", default)
    return seen


def deliver(handler: Any, tag: str | None) -> None:
    message = SimpleNamespace(headers={"id": "1"}, delivery_info={"consumer_tag": tag})
    handler(message, None, None, None, set())


def test_each_delivery_names_its_queue_and_tags_are_looked_up_once(
    handled: list[dict[str, Any]],
) -> None:
    tags = CountingTags({"billing": "None1"})
    consumer = SimpleNamespace(task_consumer=SimpleNamespace(_active_tags=tags))
    handler = strategy.dlx_strategy(SimpleNamespace(), SimpleNamespace(), consumer)  # type: ignore[arg-type]

    for _ in range(3):
        deliver(handler, "None1")
    assert [h[DELIVERY_QUEUE_HEADER] for h in handled] == ["billing"] * 3
    assert tags.reads == 1

    # The worker stops consuming from billing and starts on emails (add/cancel_consumer): kombu
    # gives the new consumer a new tag; a delivery still in flight under the old tag came from
    # billing.
    tags.clear()
    tags["emails"] = "None2"
    deliver(handler, "None2")
    deliver(handler, "None1")
    assert [h[DELIVERY_QUEUE_HEADER] for h in handled[3:]] == ["emails", "billing"]
    assert tags.reads == 2

    # An unknown tag, or none: no queue header (the task falls back to the routing key).
    deliver(handler, "None9")
    deliver(handler, None)
    assert [DELIVERY_QUEUE_HEADER in h for h in handled[5:]] == [False, False]
