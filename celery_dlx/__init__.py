"""celery_dlx: dead-letter handling for Celery on RabbitMQ.

Failures become fates: requeued at the tail, parked in Redis and drained back by the workers, or buried in a
graveyard that can be inspected and replayed. Start with :func:`install` and ``dlx_enabled``.

Everything in ``__all__`` is the public API; the subpackages (``message``, ``policy``, ``broker``,
``store``, ``worker``, ``service``, ``ops``, ``cli``) are the implementation and may change. The
graveyard, replay, export, counter and ladder functions are loaded on first use, so importing
celery_dlx in a worker costs only the task path.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from celery_dlx.broker.topology import (
    dead_letter_arguments,
    declare_topology,
    dlx_exchange,
    dlx_queue,
    service_queue,
)
from celery_dlx.errors import (
    ConfigurationError,
    DLXError,
    MalformedHeader,
    PublishError,
    StoreError,
    TopologyError,
)
from celery_dlx.fates import Bury, Park, Requeue
from celery_dlx.install import install
from celery_dlx.policy.decide import ExponentialBackoff, ListBackoff
from celery_dlx.wiring.runtime import Runtime, get_runtime
from celery_dlx.worker.task import DLXTask

if TYPE_CHECKING:
    from celery_dlx.broker.ladder import delay_queue_name
    from celery_dlx.message.graveyard import Group
    from celery_dlx.message.obituary import Obituary
    from celery_dlx.ops.canary import ReplayRun, replay_run
    from celery_dlx.ops.ladders import ladder_depths
    from celery_dlx.ops.obituaries import count as count_obituaries
    from celery_dlx.ops.obituaries import get_obituary, list_obituaries
    from celery_dlx.ops.obituaries import groups as obituary_groups
    from celery_dlx.ops.purge import PurgeReport, purge
    from celery_dlx.ops.replay import ReplayReport, replay, resolve_targets
    from celery_dlx.results import dlx_details
    from celery_dlx.store.counters import Threshold, breaches, read_window
    from celery_dlx_spark.launch import ExportError, ExportResult, run_export

__version__ = "0.1.0"

#: Public names loaded on first use: name -> (module, attribute).
_LAZY: dict[str, tuple[str, str]] = {
    "Obituary": ("celery_dlx.message.obituary", "Obituary"),
    "Group": ("celery_dlx.message.graveyard", "Group"),
    "list_obituaries": ("celery_dlx.ops.obituaries", "list_obituaries"),
    "get_obituary": ("celery_dlx.ops.obituaries", "get_obituary"),
    "obituary_groups": ("celery_dlx.ops.obituaries", "groups"),
    "count_obituaries": ("celery_dlx.ops.obituaries", "count"),
    "replay": ("celery_dlx.ops.replay", "replay"),
    "replay_run": ("celery_dlx.ops.canary", "replay_run"),
    "resolve_targets": ("celery_dlx.ops.replay", "resolve_targets"),
    "ReplayReport": ("celery_dlx.ops.replay", "ReplayReport"),
    "ReplayRun": ("celery_dlx.ops.canary", "ReplayRun"),
    "purge": ("celery_dlx.ops.purge", "purge"),
    "PurgeReport": ("celery_dlx.ops.purge", "PurgeReport"),
    "run_export": ("celery_dlx_spark.launch", "run_export"),
    "ExportResult": ("celery_dlx_spark.launch", "ExportResult"),
    "ExportError": ("celery_dlx_spark.launch", "ExportError"),
    "read_window": ("celery_dlx.store.counters", "read_window"),
    "breaches": ("celery_dlx.store.counters", "breaches"),
    "Threshold": ("celery_dlx.store.counters", "Threshold"),
    "delay_queue_name": ("celery_dlx.broker.ladder", "delay_queue_name"),
    "ladder_depths": ("celery_dlx.ops.ladders", "ladder_depths"),
    "dlx_details": ("celery_dlx.results", "dlx_details"),
}


def __getattr__(name: str) -> object:
    try:
        module, attribute = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'celery_dlx' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


__all__ = [
    "Bury",
    "ConfigurationError",
    "DLXError",
    "DLXTask",
    "ExponentialBackoff",
    "ExportError",
    "ExportResult",
    "Group",
    "ListBackoff",
    "MalformedHeader",
    "Obituary",
    "Park",
    "PublishError",
    "PurgeReport",
    "ReplayReport",
    "ReplayRun",
    "Requeue",
    "Runtime",
    "StoreError",
    "Threshold",
    "TopologyError",
    "breaches",
    "count_obituaries",
    "dead_letter_arguments",
    "declare_topology",
    "delay_queue_name",
    "dlx_details",
    "dlx_exchange",
    "dlx_queue",
    "get_obituary",
    "get_runtime",
    "install",
    "ladder_depths",
    "list_obituaries",
    "obituary_groups",
    "purge",
    "read_window",
    "replay",
    "replay_run",
    "resolve_targets",
    "run_export",
    "service_queue",
]
