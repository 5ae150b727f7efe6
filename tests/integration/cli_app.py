"""A Celery app for running ``celery dlx`` / ``celery-dlx`` as a subprocess in tests.

Its names come from the environment so each test gets its own exchange, service queue and key
prefix: ``DLX_CLI_UID`` (required), ``DLX_CLI_CONF`` (JSON of extra settings). The same settings
as :func:`tests.integration.dlx_apps.make_app`, so a test's in-process app and the subprocess's
app see the same graveyard.
"""

from __future__ import annotations

import json
import os

from tests.integration.dlx_apps import make_app

# Only the subprocess (which sets DLX_CLI_UID) builds the app; tests import nothing from here.
if "DLX_CLI_UID" in os.environ:
    app = make_app(os.environ["DLX_CLI_UID"], **json.loads(os.environ.get("DLX_CLI_CONF") or "{}"))
