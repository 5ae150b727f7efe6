"""Which dispatcher states of a worker count as "sends task events" (Celery's own rule: the
dispatcher enabled, and the ``task`` group among its groups, or no groups named)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from celery_dlx.worker.events import sends_task_events


@pytest.mark.parametrize(
    ("dispatcher", "sends"),
    [
        (None, False),  # the worker's consumer has not started its dispatcher yet
        (SimpleNamespace(enabled=False, groups=None), False),  # no -E, no gossip or heartbeat
        (SimpleNamespace(enabled=True, groups={"worker"}), False),  # no -E: heartbeats only
        (SimpleNamespace(enabled=True, groups={"worker", "task"}), True),  # enable_events
        (SimpleNamespace(enabled=True, groups=None), True),  # -E
    ],
)
def test_a_worker_sends_task_events_when_celery_would(dispatcher: object, sends: bool) -> None:
    assert sends_task_events(dispatcher) is sends
