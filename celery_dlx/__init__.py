"""celery_dlx: dead-letter handling for Celery on RabbitMQ.

Failures become fates: requeued at the tail, parked in Redis and drained by the workers, or buried
in a graveyard that can be inspected and replayed. Start with :func:`install` and ``dlx_enabled``.
"""

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
from celery_dlx.policy.decide import ExponentialBackoff, ListBackoff, Policy
from celery_dlx.worker.task import AutoDLXTask, DLXTask

__version__ = "0.1.0"

__all__ = [
    "AutoDLXTask",
    "Bury",
    "ConfigurationError",
    "DLXError",
    "DLXTask",
    "ExponentialBackoff",
    "ListBackoff",
    "MalformedHeader",
    "Park",
    "Policy",
    "PublishError",
    "Requeue",
    "StoreError",
    "TopologyError",
    "dead_letter_arguments",
    "declare_topology",
    "dlx_exchange",
    "dlx_queue",
    "install",
    "service_queue",
]
