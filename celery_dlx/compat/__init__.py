"""The only place celery_dlx touches private internals of other projects.

One module per project: :mod:`~celery_dlx.compat.celery`, :mod:`~celery_dlx.compat.kombu`,
:mod:`~celery_dlx.compat.amqp` (py-amqp), :mod:`~celery_dlx.compat.billiard`,
:mod:`~celery_dlx.compat.redis` (redis-py), :mod:`~celery_dlx.compat.sentry` (sentry-sdk) and
:mod:`~celery_dlx.compat.python` (the standard library); pyspark's are in
``celery_dlx_spark/compat.py``. Each use names the internal, why no public API does the job, and
the releases checked; a version gate where releases differ. ``tests/unit/test_compat.py``,
``test_amqp_compat.py``, ``test_compat_versions.py`` and ``test_compat_canaries.py`` check each
against the installed libraries; ``tests/unit/test_private_names.py`` fails on any use of
another project's private name outside these modules. None of them is replaced process-wide
(``docs/upstream.md`` proposes fixes upstream).

The names below stay importable from this package.
"""

from __future__ import annotations

from celery_dlx.compat.celery import (
    HandedOver,
    RunSettled,
    app_task_or_amqp_made,
    divert_reject,
    settles,
    settling_tracer,
)
from celery_dlx.compat.kombu import (
    consumer_tags,
    hub_wakes_for_other_threads,
    queue_attrs,
    serializer_name,
)
from celery_dlx.compat.redis import (
    _accepts_keyword,
    _requires_argument,
    pool_connection,
    read_reply,
)
from celery_dlx.compat.sentry import add_sentry_event_processor_once

__all__ = [
    "HandedOver",
    "RunSettled",
    "_accepts_keyword",
    "_requires_argument",
    "add_sentry_event_processor_once",
    "app_task_or_amqp_made",
    "consumer_tags",
    "divert_reject",
    "hub_wakes_for_other_threads",
    "pool_connection",
    "queue_attrs",
    "read_reply",
    "serializer_name",
    "settles",
    "settling_tracer",
]
