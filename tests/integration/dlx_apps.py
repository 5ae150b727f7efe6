"""Test apps on the real services: a DLX-enabled Celery app per test, with unique names."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from celery import Celery
from celery.contrib.testing.worker import start_worker

import celery_dlx
from celery_dlx.broker.ladder import delay_queue_name
from celery_dlx.drain.core import run_drain
from celery_dlx.policy.durations import ladder_ms
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL, REDIS_URL

#: The delay backends the fate tests run with.
DELAY_BACKENDS = ("redis", "ttl")
#: Sub-second ladder of the test apps: the test backoff [0.2, 0.3] waits 0.2 and 0.5 s.
TEST_LADDER = [0.2, 0.5, 1.0]


def make_app(uid: str, **conf: Any) -> Celery:
    """A DLX-enabled app whose queue, exchange, service queue and key prefix are unique to ``uid``."""
    app = Celery(f"dlxtest-{uid}", broker=BROKER_URL, set_as_current=False)
    celery_dlx.install(app)
    settings: dict[str, Any] = {
        "task_default_queue": f"work-{uid}",
        "dlx_enabled": True,
        "dlx_redis_url": REDIS_URL,
        "dlx_key_prefix": f"test-{uid}",
        "dlx_exchange": f"dlx-{uid}",
        "dlx_service_queue": f"dead-{uid}",
        "dlx_max_requeues": 2,
        "dlx_max_parks": 2,
        "dlx_backoff": [0.2, 0.3],
        "dlx_drain_interval": 0.2,
        "dlx_ttl_ladder": TEST_LADDER,
        "worker_prefetch_multiplier": 1,
        "broker_connection_retry_on_startup": True,
        "worker_hijack_root_logger": False,
        "task_ignore_result": True,
    }
    settings.update(conf)
    app.conf.update(settings)
    return app


def queue_names(app: Celery) -> list[str]:
    """Every queue the test app declares (for cleanup), its delay queues with the ttl backend."""
    conf = app.conf
    work = [conf.task_default_queue, *(q.name for q in conf.task_queues or ())]
    names = [*work, conf.dlx_service_queue]
    if conf.get("dlx_delay_backend") == "ttl":
        steps = ladder_ms(conf.get("dlx_ttl_ladder") or TEST_LADDER)
        names.extend(delay_queue_name(q, step) for q in work for step in steps)
    return names


def expected_fates(fates: list[str], backend: str) -> list[str]:
    """``fates`` as the history records them with ``backend``: the ttl backend has no drain, so
    no ``drained`` entries (the broker returns the message)."""
    return [f for f in fates if backend == "redis" or f != "drained"]


@contextlib.contextmanager
def delays_returning(app: Celery, interval: float = 0.1) -> Iterator[None]:
    """Parked retries come back while the block runs: a drain thread for the Redis backend;
    nothing for the ttl backend (the broker returns them)."""
    if app.conf.get("dlx_delay_backend") == "ttl":
        yield
        return
    with drain_thread(app, interval):
        yield


@contextlib.contextmanager
def drain_thread(app: Celery, interval: float = 0.1) -> Iterator[None]:
    """Drain due parked retries every ``interval`` seconds, as beat would, until the block ends."""
    stop = threading.Event()
    runtime = get_runtime(app)

    def loop() -> None:
        while not stop.is_set():
            run_drain(runtime, budget_seconds=interval)
            stop.wait(interval)

    thread = threading.Thread(target=loop, name="test-drain", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


@contextlib.contextmanager
def worker(app: Celery, **kwargs: Any) -> Iterator[Any]:
    """A real worker in a thread (a one-thread pool) consuming the app's queues."""
    # The solo pool waits ~2 s for the next delivery after a task that ends in Ignore or Reject
    # under acks_late at prefetch 1 (a Celery solo-pool artifact); one thread behaves like prefork.
    kwargs.setdefault("pool", "threads")
    kwargs.setdefault("concurrency", 1)
    kwargs.setdefault("perform_ping_check", False)
    kwargs.setdefault("loglevel", "WARNING")
    kwargs.setdefault("shutdown_timeout", 30.0)
    with start_worker(app, **kwargs) as w:
        try:
            yield w
        finally:
            # The worker's event loop only sees the stop flag when it wakes: a ping wakes it now
            # instead of at its next timer, seconds later.
            from celery.worker import state

            state.should_terminate = 0
            app.control.ping(destination=[w.hostname], timeout=0.05)


@contextlib.contextmanager
def service_thread(app: Celery, **kwargs: Any) -> Iterator[Any]:
    """The app's DLX service running in a thread; stopped (and proven stopped) on exit."""
    from celery_dlx.service.loop import DLXService

    svc = DLXService(app, **kwargs)
    thread = threading.Thread(target=svc.run, daemon=True)
    thread.start()
    try:
        yield svc
    finally:
        svc.stop()
        thread.join(30)
        assert not thread.is_alive(), "the service did not stop"
