"""What waits in the TTL ladder's delay queues (``celery dlx parked`` with ``dlx_delay_backend = "ttl"``)."""

from __future__ import annotations

from collections.abc import Iterable

from celery_dlx.broker.ladder import delay_queue_name
from celery_dlx.broker.probe import queue_counts
from celery_dlx.policy.durations import ladder_ms
from celery_dlx.wiring.runtime import Runtime


def ladder_depths(runtime: Runtime, queues: Iterable[str] | None = None) -> list[dict[str, object]]:
    """A row per existing delay queue of the ladder for ``queues`` (default: the app's queues
    and ``dlx_queues``), by work queue then delay: ``queue``, ``delay_queue``, ``delay_seconds``,
    ``messages`` (ready), ``consumers``. The passive declares that count them re-arm each delay
    queue's ``x-expires``.

    Raises:
        ConfigurationError: ``dlx_ttl_ladder`` is not a usable ladder.
        kombu/amqp connection errors: the broker is unreachable.
    """
    steps = ladder_ms(runtime.config.ttl_ladder)
    if queues is None:
        queues = [*runtime.config.queues, *(str(name) for name in runtime.app.amqp.queues)]
    names = sorted(set(queues))
    ladder = [(queue, step, delay_queue_name(queue, step)) for queue in names for step in steps]
    counts = queue_counts(runtime.app, [name for _, _, name in ladder])
    return [
        {
            "queue": queue,
            "delay_queue": name,
            "delay_seconds": step / 1000,
            "messages": counts[name][0],
            "consumers": counts[name][1],
        }
        for queue, step, name in ladder
        if name in counts
    ]
