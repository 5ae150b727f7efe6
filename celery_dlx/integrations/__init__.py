"""Monitoring integrations: Sentry (burials once per cause) and Celery task events (Flower).

:func:`install_integrations` appends the enabled fate listeners to ``runtime.listeners``;
``celery_dlx.install(app)`` calls it. Each listener is told every fate change after it was
logged, counted and appended to the failure history (see :meth:`celery_dlx.wiring.runtime.Runtime.record`).
"""

from __future__ import annotations

from collections.abc import Callable

from celery import Celery

from celery_dlx.integrations.breakers import BreakerAlert, install_breaker_alert
from celery_dlx.integrations.events import EventSender, install_events
from celery_dlx.integrations.logs import CeleryEchoFilter, install_log_filter
from celery_dlx.integrations.sentry import SentryReporter, install_sentry, mark_handled
from celery_dlx.wiring.runtime import Listener, Runtime

__all__ = [
    "CeleryEchoFilter",
    "EventSender",
    "SentryReporter",
    "install_integrations",
    "mark_handled",
]


def install_integrations(app: Celery, runtime: Runtime) -> list[Listener]:
    """Add the Sentry and task-event listeners that the settings enable, and quiet Celery's echo
    of handled runs; idempotent.

    ``dlx_sentry`` (and sentry-sdk being installed) enables Sentry reporting, which sends only
    when the app's own ``sentry_sdk.init`` ran in the process; ``dlx_send_events`` enables the
    ``task-requeued``/``task-parked``/``task-buried``/``task-replayed`` events. Celery's own
    ``ignored``/``rejected`` line of a run celery_dlx handled goes to DEBUG (see
    :mod:`celery_dlx.integrations.logs`).

    Args:
        app: the Celery app (its event dispatcher carries the task events).
        runtime: the app's runtime, whose ``listeners`` are extended.

    Returns:
        the listeners added by this call (empty when already installed).
    """
    if runtime.app is not app:
        raise ValueError("install_integrations: runtime belongs to another app")
    present = {type(listener) for listener in runtime.listeners}
    added: list[Listener] = []
    if CeleryEchoFilter not in present:
        echo = install_log_filter(app)
        runtime.listeners.append(echo)
        added.append(echo)
    makers: tuple[tuple[Callable[[Runtime], Listener | None], type], ...] = (
        (install_sentry, SentryReporter),
        (install_events, EventSender),
        (install_breaker_alert, BreakerAlert),
    )
    for make, kind in makers:
        if kind in present:
            continue
        listener = make(runtime)
        if listener is not None:
            runtime.listeners.append(listener)
            added.append(listener)
    return added
