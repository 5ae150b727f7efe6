"""pytest plugin that runs Celery's own integration suite with celery_dlx switched on.

Loaded by ``scripts/celery_compat.py`` with ``-p tests.compat.plugin`` into a run of Celery's
``t/integration`` (from the sdist of the installed Celery). No Celery file is changed: every app
the suite makes through ``celery.contrib.testing.app.TestApp`` (its session app, whose worker
runs the tasks, and its per-test app) gets ``celery_dlx.install(app)`` and the ``dlx_*`` settings
below, as a user switching celery_dlx on would. With ``CELERY_DLX_COMPAT=plain`` (or unset) the
plugin does nothing, so the same command gives the plain baseline.

Environment (set by the script):
    CELERY_DLX_COMPAT: ``dlx`` to switch celery_dlx on.
    CELERY_DLX_COMPAT_PREFIX: the ``dlx_key_prefix`` of the run (unique, deleted afterwards).
    CELERY_DLX_COMPAT_REDIS: ``dlx_redis_url``.
    CELERY_DLX_COMPAT_BUDGETS: if set, ``dlx_max_requeues`` and ``dlx_max_parks`` (e.g. 0).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest

MODE_ENV = "CELERY_DLX_COMPAT"


def enabled() -> bool:
    return os.environ.get(MODE_ENV, "plain") == "dlx"


def dlx_settings() -> dict[str, Any]:
    """The settings a user adopting celery_dlx would add (short backoff: the suite waits ~10 s)."""
    settings: dict[str, Any] = {
        "dlx_enabled": True,
        "dlx_redis_url": os.environ.get("CELERY_DLX_COMPAT_REDIS", "redis://127.0.0.1:6379/0"),
        "dlx_key_prefix": os.environ.get("CELERY_DLX_COMPAT_PREFIX", "celery-dlx-compat"),
        "dlx_backoff": [1.0],
        "dlx_drain_interval": 0.5,
        "dlx_service_in_worker": True,
    }
    budgets = os.environ.get("CELERY_DLX_COMPAT_BUDGETS")
    if budgets:
        settings["dlx_max_requeues"] = settings["dlx_max_parks"] = int(budgets)
    return settings


def pytest_configure(config: Any) -> None:
    if not enabled():
        return
    from celery.contrib.testing import app as testing_app

    import celery_dlx

    make = testing_app.TestApp

    def dlx_test_app(*args: Any, **kwargs: Any) -> Any:
        app = make(*args, **kwargs)
        celery_dlx.install(app)
        app.add_defaults(dlx_settings())
        return app

    # celery.contrib.pytest imports TestApp from this module each time it makes an app.
    testing_app.TestApp = dlx_test_app


def pytest_report_header(config: Any) -> str:
    if not enabled():
        return "celery_dlx compat: plain Celery (baseline)"
    return f"celery_dlx compat: celery_dlx on {dlx_settings()}"


@pytest.fixture(scope="session", autouse=True)
def celery_dlx_drain(request: Any) -> Iterator[None]:
    """Drain due parked retries while the session runs, as beat's drain entry does in a worker -B
    (the suite's worker runs in a thread, without beat)."""
    if not enabled():
        yield
        return
    from celery_dlx.worker.drain import run_drain
    from celery_dlx.worker.runtime import get_runtime

    runtime = get_runtime(request.getfixturevalue("celery_session_app"))
    interval = float(runtime.config.drain_interval)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            # A Redis hiccup: the next tick tries again, as beat would.
            with contextlib.suppress(Exception):
                run_drain(runtime, budget_seconds=interval)
            stop.wait(interval)

    thread = threading.Thread(target=loop, name="celery_dlx-compat-drain", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)
