"""Test apps on the real services: a DLX-enabled Celery app per test, with unique names."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
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


def _where_everything_stands(w: Any) -> str:
    """Every thread's stack in this process, then each pool process's (py-spy, when installed):
    what a worker that would not stop was doing."""
    import io
    import shutil
    import subprocess
    import sys
    import traceback

    out = io.StringIO()
    names = {t.ident: t.name for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        out.write(f"--- thread {names.get(ident, ident)}\n")
        out.write("".join(traceback.format_stack(frame)))
    pool = getattr(getattr(w, "pool", None), "_pool", None)
    pids = [p.pid for p in getattr(pool, "_pool", None) or ()]
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    for pid in pids:
        out.write(f"--- pool process {pid}\n")
        try:
            run = subprocess.run(
                [spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20
            )
            out.write(run.stdout + run.stderr)
        except Exception as err:  # a diagnosis must not hide the failure
            out.write(f"(py-spy: {err!r})\n")
    return out.getvalue()


@contextlib.contextmanager
def worker(app: Celery, **kwargs: Any) -> Iterator[Any]:
    """A real worker in a thread (a one-thread pool) consuming the app's queues."""
    # One thread, not the solo pool: on the solo pool a run's ack (Celery's call_soon_ack, from
    # the loop's own thread) can wait for the loop's next timer (kombu#1587, docs/upstream.md),
    # which celery_dlx works around for DLX tasks only; a pool thread's ack wakes the loop, as
    # prefork's does. Tests that are about the solo pool ask for it.
    kwargs.setdefault("pool", "threads")
    kwargs.setdefault("concurrency", 1)
    kwargs.setdefault("perform_ping_check", False)
    kwargs.setdefault("loglevel", "WARNING")
    kwargs.setdefault("shutdown_timeout", 30.0)
    from celery.worker import state

    holder: list[Any] = []
    try:
        with start_worker(app, **kwargs) as w:
            holder.append(w)
            try:
                yield w
            finally:
                # The worker's event loop only sees the stop flag when it wakes: a ping wakes it
                # now instead of at its next timer, seconds later.
                state.should_terminate = 0
                app.control.ping(destination=[w.hostname], timeout=0.05)
    except RuntimeError as err:
        if "failed to exit" not in str(err):
            raise
        # Celery leaves its stop flag set when the worker thread outlives the timeout: every
        # later worker of this process would stop before it is ready, and its test wait for
        # ever. Clear it, and say where each thread (and each pool process) stands.
        state.should_terminate = None
        where = _where_everything_stands(holder[0] if holder else None)
        raise RuntimeError(f"{err}\n{where}") from err


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
