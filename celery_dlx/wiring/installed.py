"""Whether ``celery_dlx.install(app)`` was called on an app whose settings ask for celery_dlx:
forgetting it is silent otherwise (plain Celery tasks, whose failures are acked and lost).
"""

from __future__ import annotations

from celery import Celery

from celery_dlx.policy.config import enabled_setting

#: The attribute ``install()`` sets on the app it was called on.
INSTALLED_ATTR = "_celery_dlx_installed"


def mark_installed(app: Celery) -> None:
    """Record that ``celery_dlx.install(app)`` was called (by ``install()`` itself)."""
    app.__dict__[INSTALLED_ATTR] = True


def installed(app: Celery) -> bool:
    """True when ``celery_dlx.install(app)`` was called on ``app``."""
    return bool(app.__dict__.get(INSTALLED_ATTR))


def not_installed(app: Celery) -> bool:
    """True when ``app``'s settings turn celery_dlx on (``dlx_enabled``) but
    ``celery_dlx.install(app)`` was not called on it."""
    if installed(app):
        return False
    try:
        return enabled_setting(app.conf, getattr(app, "namespace", None))
    except Exception:  # a configuration that cannot be read is Celery's to report
        return False


def not_installed_message(app: Celery) -> str:
    """What to tell the user of an app :func:`not_installed` is true of."""
    return (
        f"dlx_enabled is set on the Celery app {app.main!r}, but celery_dlx.install(app) was not "
        "called on it: its tasks are plain Celery tasks and their failures are acked and lost. "
        "Call celery_dlx.install(app) right after `app = Celery(...)`, before the tasks are defined"
    )
