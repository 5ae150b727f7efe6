"""A Celery app for running the DLX service as a subprocess in tests (``celery-dlx -A``).

Its names come from the environment, so each test gets its own exchange, service queue and key
prefix: ``DLX_SVC_UID`` (required), ``DLX_SVC_CONF`` (JSON of extra settings).
"""

from __future__ import annotations

import json
import os

from celery import Celery

from tests.conftest import BROKER_URL, REDIS_URL


def service_settings(uid: str) -> dict[str, object]:
    """The settings a test's in-process app shares with the subprocess's app."""
    return {
        "dlx_redis_url": REDIS_URL,
        "dlx_key_prefix": f"test-{uid}",
        "dlx_exchange": f"dlx-{uid}",
        "dlx_service_queue": f"dead-{uid}",
        "broker_connection_retry_on_startup": True,
    }


def make_service_app(uid: str, conf: dict[str, object]) -> Celery:
    app = Celery(f"svc-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(service_settings(uid))
    app.conf.update(conf)
    return app


# Only the subprocess (which sets DLX_SVC_UID) builds the app; tests import the helpers above.
if "DLX_SVC_UID" in os.environ:
    app = make_service_app(
        os.environ["DLX_SVC_UID"], json.loads(os.environ.get("DLX_SVC_CONF") or "{}")
    )
