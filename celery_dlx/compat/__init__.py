"""The only place celery_dlx touches private internals of other projects.

One module per project: :mod:`~celery_dlx.compat.celery`, :mod:`~celery_dlx.compat.kombu`,
:mod:`~celery_dlx.compat.amqp` (py-amqp), :mod:`~celery_dlx.compat.billiard`,
:mod:`~celery_dlx.compat.redis` (redis-py), :mod:`~celery_dlx.compat.sentry` (sentry-sdk) and
:mod:`~celery_dlx.compat.python` (the standard library); pyspark's are in
``celery_dlx_spark/compat.py`` (that package imports nothing of celery_dlx). Each function or
class names the internal it relies on, why no public API does the job, and the releases it was
checked on; a version gate where releases differ. ``tests/unit/test_compat.py``,
``tests/unit/test_amqp_compat.py``, ``tests/unit/test_compat_versions.py`` and
``tests/unit/test_compat_canaries.py`` check each against the installed libraries, so an upgrade
that removes or changes one fails there, with the library and version named, instead of in
production; ``tests/unit/test_private_names.py`` fails on any use of another project's private
name outside these modules.

Internals replaced by public APIs (and no longer used): Celery's ``Queues._add``
(``Queues.add``/``add_compat`` are overridden instead), ``celery._state``
(``celery.current_task``), redis-py's ``Script.sha`` (redis-py computes it; ``script_load``
alone loads the script), and Celery's ``Backend._get_result_meta``, which celery_dlx wrapped
class-wide to add its details of a run to the stored meta (the task stores them itself beside the
result: ``celery_dlx.results``).

celery_dlx replaces no function of the standard library, Celery, kombu, billiard, py-amqp or
redis-py process-wide; where their code is slow or wrong for celery_dlx, it works around it in
its own code (``docs/upstream.md`` proposes the fixes upstream). Gone for that reason, besides
the wrap above: the shared and sparse code positions of billiard's traceback copies and the
cached positions and carets of ``traceback`` (a requeue or park no longer makes Celery build a
traceback at all: :func:`~celery_dlx.compat.celery.settling_tracer`), and py-amqp's
basic-properties decoder, which celery_dlx replaced for the whole process to survive properties
that are not UTF-8: its own frame reader now goes to its own connections only
(``celery_dlx/broker/frames.py``, through py-amqp's ``Connection(frame_handler=...)``).

The names below were this module's before it was split, and stay importable from it.
"""

from __future__ import annotations

from celery_dlx.compat.celery import (
    HandedOver,
    RunSettled,
    Tracer,
    app_task_or_amqp_made,
    divert_reject,
    settles,
    settling_tracer,
)
from celery_dlx.compat.kombu import (
    AttrType,
    QueueAttrs,
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
    "AttrType",
    "HandedOver",
    "QueueAttrs",
    "RunSettled",
    "Tracer",
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
