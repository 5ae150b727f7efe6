"""The operations: plain functions over an app's runtime that return data, one module per concern;
the command line and the console are thin layers over them. The names below are what their
callers need beside them.

The optional products, the console (:mod:`celery_dlx_console`), payload editing
(:mod:`celery_dlx_edit`), protobuf fitting (:mod:`celery_dlx.codecs.fit`) and the Spark
launcher (:mod:`celery_dlx_spark.launch`), import nothing of celery_dlx but
:mod:`celery_dlx`, :mod:`celery_dlx.errors`, this package and its modules, and the payload codecs
(:mod:`celery_dlx.codecs`): a contract in ``pyproject.toml`` says so, and ``lint-imports``
checks it.
"""

from __future__ import annotations

from celery_dlx.fates import now_ms
from celery_dlx.message.graveyard import Filters
from celery_dlx.message.names import BROKER_HEADER_PREFIXES, BROKER_HEADERS
from celery_dlx.message.obituary import Obituary
from celery_dlx.message.outgoing import Outgoing
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.message.status import STATUSES, UNRESOLVED
from celery_dlx.policy.config import DLXConfig
from celery_dlx.policy.settings import SETTINGS
from celery_dlx.wiring.errors import STORE_ERRORS
from celery_dlx.wiring.runtime import Runtime, get_runtime

__all__ = [
    "BROKER_HEADERS",
    "BROKER_HEADER_PREFIXES",
    "SETTINGS",
    "STATUSES",
    "STORE_ERRORS",
    "UNRESOLVED",
    "DLXConfig",
    "Filters",
    "Obituary",
    "Outgoing",
    "ParkedMessage",
    "Runtime",
    "get_runtime",
    "now_ms",
]
