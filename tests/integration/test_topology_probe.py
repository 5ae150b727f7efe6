"""The queue probe on the real RabbitMQ: an interrupt never turns into a blocking close.

``DLXQueue.declare`` first declares a queue on a throwaway channel (RabbitMQ's 406 closes only
that channel). py-amqp loses its place in the byte stream when a read is interrupted by anything
but a socket timeout (a pytest timeout, Ctrl-C): closing the probe channel then waits forever for
an answer it cannot read. That hang was seen in Celery's own integration suite under the compat
gate. An interrupt must reach the caller at once, with no close attempted.
"""

from __future__ import annotations

from typing import Any

import pytest
from kombu import Connection, Queue

from celery_dlx.broker import topology
from celery_dlx.broker.topology import dlx_queue

pytestmark = pytest.mark.integration


class Interrupted(BaseException):
    """Stands for a timeout signal or Ctrl-C raised mid-read."""


def _probes(conn: Connection, monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Record each channel the probe opens; its close calls are counted on it."""
    opened: list[Any] = []
    amqp_conn = conn.connection
    real_channel = amqp_conn.channel

    def channel(*args: Any, **kwargs: Any) -> Any:
        made = real_channel(*args, **kwargs)
        made.closes = 0
        real_close = made.close

        def close(*a: Any, **k: Any) -> Any:
            made.closes += 1
            return real_close(*a, **k)

        made.close = close
        opened.append(made)
        return made

    monkeypatch.setattr(amqp_conn, "channel", channel)
    return opened


@pytest.fixture
def probe_setup(
    uid: str, broker: Connection, cleanup_queues: list[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, Any, list[Any]]:
    """A DLX work queue (deleted after the test), the caller's channel, the probes opened."""
    name = f"probe-{uid}"
    cleanup_queues.extend([name, f"probe-dead-{uid}", f"exchange:probe-dlx-{uid}"])
    queue = dlx_queue(name, dlx=f"probe-dlx-{uid}", service=f"probe-dead-{uid}")
    channel = broker.channel()
    return queue, channel, _probes(broker, monkeypatch)


def test_an_interrupted_probe_is_not_closed_and_the_interrupt_reaches_the_caller(
    probe_setup: tuple[Any, Any, list[Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    queue, channel, opened = probe_setup

    def interrupted(self: Queue, *args: Any, **kwargs: Any) -> Any:
        raise Interrupted

    monkeypatch.setattr(Queue, "queue_declare", interrupted)
    with pytest.raises(Interrupted):
        topology._probe(channel, queue, queue.queue_arguments or {})
    (probe,) = opened
    assert probe.closes == 0  # before: the finally closed it, and on a real interrupt hung


def test_a_probe_that_declares_or_meets_a_406_is_closed(
    probe_setup: tuple[Any, Any, list[Any]], uid: str
) -> None:
    queue, channel, opened = probe_setup
    arguments = dict(queue.queue_arguments or {})
    assert topology._probe(channel, queue, arguments) is True
    other = {**arguments, "x-dead-letter-exchange": f"another-{uid}"}
    assert topology._probe(channel, queue, other) is False  # 406: RabbitMQ closed the probe
    first, second = opened
    assert first.closes == 1 and not first.is_open
    assert not second.is_open
    assert channel.is_open  # the caller's channel survives both
