"""Sentry is told once when a per-cause breaker opens (``dlx_breaker``).

The worker marks the fate event of the failure that opened a breaker with ``extra["breaker"] ==
"opened"`` (one per opening, decided in one Redis transaction); this listener makes it one Sentry
message fingerprinted by queue and cause, so every opening of a breaker groups into one issue.
The opening's WARNING line stays out of Sentry (``celery_dlx.*`` loggers are ignored there).
"""

from __future__ import annotations

from dataclasses import asdict

from celery_dlx.fates import FateEvent
from celery_dlx.integrations.sentry import sentry_active
from celery_dlx.wiring.runtime import Runtime

#: ``extra["breaker"]`` of the fate event whose failure opened a breaker.
OPENED = "opened"


class BreakerAlert:
    """Fate listener: one Sentry message (level warning) per breaker opening."""

    def __init__(self, runtime: Runtime) -> None:
        self.runtime = runtime

    def __call__(self, event: FateEvent) -> None:
        if event.extra.get("breaker") != OPENED or not sentry_active():
            return
        import sentry_sdk

        with sentry_sdk.isolation_scope() as scope:
            scope.fingerprint = ["celery_dlx.breaker", event.queue or "", event.cause or ""]
            for tag, value in (
                ("celery_dlx.breaker", OPENED),
                ("celery_dlx.cause", event.cause),
                ("celery_dlx.queue", event.queue),
                ("celery_dlx.task", event.task),
                ("celery_dlx.exc_type", event.exc_type),
            ):
                if value:
                    scope.set_tag(tag, value)
            settings = self.runtime.config.breaker_for(event.queue)
            context = {"exc_message": event.exc_message, **(asdict(settings) if settings else {})}
            scope.set_context("breaker", context)
            sentry_sdk.capture_message(
                f"celery_dlx breaker opened: {event.exc_type or 'failure'} of "
                f"{event.task or '-'} on {event.queue} held (cause {event.cause})",
                level="warning",
            )


def install_breaker_alert(runtime: Runtime) -> BreakerAlert | None:
    """The listener, or None when ``dlx_sentry`` is off, sentry-sdk is not installed, or no
    breaker is configured in the settings (``dlx_breaker`` or a ``dlx_queues`` entry's
    ``breaker``; a breaker set only as a task option is not reported to Sentry)."""
    config = runtime.config
    configured = config.breaker is not None or any(
        spec.get("breaker") is not None for spec in config.queues.values()
    )
    if not config.sentry or not configured:
        return None
    try:
        import sentry_sdk  # noqa: F401
    except ImportError:
        return None
    return BreakerAlert(runtime)
