"""Running the DLX service: in this process, or in several forked ones sharing the queue.

Each process also runs the drainer, as every worker does, so a shop running only the service
gets its parked retries back (the holder of the Redis drain lease drains, one process at a time
per key prefix, whatever mix of workers and services runs).
"""

from __future__ import annotations

import logging
import os
import signal
from typing import Any

from celery import Celery

from celery_dlx.drain.drainer import DrainerThread
from celery_dlx.errors import DLXError
from celery_dlx.service.loop import DLXService
from celery_dlx.service.stats import ServiceStats

logger = logging.getLogger(__name__)


def run_service(
    app: Celery,
    *,
    prefetch: int | None = None,
    idle_timeout: float | None = None,
    processes: int = 1,
    drain: bool = True,
    install_signals: bool = True,
    announce: bool = True,
) -> ServiceStats:
    """Run the DLX service until SIGTERM/SIGINT (or ``idle_timeout``), in ``processes`` processes.

    One process runs in this thread, more are forked children (one handles a few thousand dead
    letters a second; they share the queue and dedup each other's redeliveries) whose summed
    counts are returned. A signal lets every process ack the batches in hand. With ``drain``,
    each process runs the drainer under the drain lease; with ``announce``, the first log lines
    say what runs (broker, virtual host, Redis, queue).

    Raises:
        DLXError: ``processes`` above 1 where ``fork`` is unavailable, or below 1.
    """
    if processes < 1:
        raise DLXError(f"the DLX service needs at least one process (--processes), got {processes}")
    if announce:
        _log_start(app, drain=drain, processes=processes)
    if processes > 1:
        return _run_processes(
            app, processes, prefetch=prefetch, idle_timeout=idle_timeout, drain=drain
        )
    service = DLXService(app, prefetch=prefetch)
    if install_signals:
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: service.stop())
    drainer = DrainerThread(app) if drain else None
    if drainer is None:
        logger.info("DLX service not draining parked retries: workers or another service must")
    else:
        drainer.start()
        logger.info(
            "DLX service draining parked retries every %ss while it holds the drain lease",
            drainer.drainer.interval,
        )
    try:
        stats = service.run(idle_timeout=idle_timeout)
    finally:
        if drainer is not None:
            drainer.stop()
    logger.info("DLX service stopped: %s", stats.as_dict())
    return stats


def _log_start(app: Celery, *, drain: bool, processes: int) -> None:
    """The service's first lines: broker, virtual host, Redis, queue, drain (no password)."""
    from celery_dlx.wiring.banner import service_lines
    from celery_dlx.wiring.runtime import get_runtime

    try:
        lines = service_lines(app, get_runtime(app).config, drain=drain, processes=processes)
    except Exception:  # a broker URL kombu cannot parse is the consumer's to report
        logger.debug("could not describe the DLX service", exc_info=True)
        return
    for line in lines:
        logger.info("%s", line)


def _child(
    app: Celery, prefetch: int | None, idle_timeout: float | None, drain: bool, out: Any
) -> None:
    stats = run_service(
        app, prefetch=prefetch, idle_timeout=idle_timeout, drain=drain, announce=False
    )
    out.put(stats.as_dict())


def _run_processes(
    app: Celery,
    processes: int,
    *,
    prefetch: int | None,
    idle_timeout: float | None,
    drain: bool,
) -> ServiceStats:
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        raise DLXError("--processes above 1 needs fork; run several `celery dlx service` instead")
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    children = [
        ctx.Process(target=_child, args=(app, prefetch, idle_timeout, drain, out), daemon=False)
        for _ in range(processes)
    ]
    for child in children:
        child.start()

    def forward(signum: int, _: Any) -> None:
        for child in children:
            if child.pid is not None and child.is_alive():
                os.kill(child.pid, signal.SIGTERM)

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    total = ServiceStats(processes=0)
    try:
        for child in children:
            child.join()
        while not out.empty():
            total.add(**out.get())
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    failed = [c.exitcode for c in children if c.exitcode != 0]
    if failed:
        raise DLXError(f"DLX service processes failed (exit codes {failed}); see their logs")
    return total
