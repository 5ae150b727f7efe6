"""pytest plugin that runs Celery's own integration suite with celery_dlx switched on.

Loaded by ``scripts/celery_compat.py`` with ``-p tests.compat.plugin`` into a run of Celery's
``t/integration`` (from the sdist of the installed Celery). No Celery file is changed: every app
the suite makes through ``celery.contrib.testing.app.TestApp`` (its session app, whose worker
runs the tasks, and its per-test app) gets ``celery_dlx.install(app)`` and the ``dlx_*`` settings
below, as a user switching celery_dlx on would. With ``CELERY_DLX_COMPAT=plain`` (or unset) the
plugin does nothing, so the same command gives the plain baseline.

The plugin runs no drain of its own: parked retries come back through the drainer bootstep that
``celery_dlx.install`` adds to the app's worker, running inside the suite's session worker
(``celery.contrib.testing.worker``) as in any worker. When that worker has started, the plugin
notes whether the bootstep's thread is running, and writes one line per worker
(``tests.compat.gate.drainer_line``) in the terminal summary, which the script reads.

Environment (set by the script):
    CELERY_DLX_COMPAT: ``dlx`` to switch celery_dlx on.
    CELERY_DLX_COMPAT_PREFIX: the ``dlx_key_prefix`` of the run (unique, deleted afterwards).
    CELERY_DLX_COMPAT_REDIS: ``dlx_redis_url``.
    CELERY_DLX_COMPAT_BUDGETS: if set, ``dlx_max_requeues`` and ``dlx_max_parks`` (e.g. 0).
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.compat.gate import drainer_line

MODE_ENV = "CELERY_DLX_COMPAT"
#: The drainer lines of the session's workers (:func:`tests.compat.gate.drainer_line`).
WORKERS = pytest.StashKey[list[str]]()


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
    from celery.contrib.testing.worker import test_worker_started

    import celery_dlx

    make = testing_app.TestApp

    def dlx_test_app(*args: Any, **kwargs: Any) -> Any:
        app = make(*args, **kwargs)
        celery_dlx.install(app)
        app.add_defaults(dlx_settings())
        return app

    # celery.contrib.pytest imports TestApp from this module each time it makes an app.
    testing_app.TestApp = dlx_test_app

    workers: list[str] = []
    config.stash[WORKERS] = workers

    def on_worker_started(sender: Any = None, worker: Any = None, **_: Any) -> None:
        workers.append(drainer_line(worker.hostname, drainer_running(worker)))

    # Sent once the worker's consumer is up, after its bootsteps (the drainer's too) started.
    test_worker_started.connect(on_worker_started, weak=False)


def pytest_report_header(config: Any) -> str:
    if not enabled():
        return "celery_dlx compat: plain Celery (baseline)"
    return f"celery_dlx compat: celery_dlx on {dlx_settings()}"


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    for line in config.stash.get(WORKERS, []):
        terminalreporter.write_line(line)


def drainer_running(worker: Any) -> bool:
    """True when ``worker`` (a started WorkController) has celery_dlx's drainer thread running."""
    from celery_dlx.worker.drainer import DrainerStep

    steps = [s for s in worker.blueprint.order if isinstance(s, DrainerStep)]
    return any(s.running is not None and s.running.is_alive() for s in steps)
