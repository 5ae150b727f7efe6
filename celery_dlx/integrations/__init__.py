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
    """Add the listeners ``dlx_sentry``, ``dlx_send_events`` and ``dlx_breaker`` enable to
    ``runtime.listeners`` and quiet Celery's echo of handled runs; idempotent. Returns the
    listeners added (empty when already installed).

    Raises:
        ValueError: ``runtime`` belongs to another app.
    """
    if runtime.app is not app:
        raise ValueError("install_integrations: runtime belongs to another app")
    present = {type(listener) for listener in runtime.listeners}
    added: list[Listener] = []
    makers: tuple[tuple[Callable[[Runtime], Listener | None], type], ...] = (
        (lambda _: install_log_filter(app), CeleryEchoFilter),
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
