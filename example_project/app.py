"""The orders service's Celery app, with celery_dlx switched on by one setting.

Everything that names a queue or a Redis key comes from ``EXAMPLE_RUN`` (default ``example``), so
several runs of the demo can share one RabbitMQ and one Redis without seeing each other:

===========================  ============================================================
name                         what
===========================  ============================================================
``<run>.orders``             payments and order imports (Celery tasks)
``<run>.shipping``           shipping, which looks up an order row that may not exist yet
``<run>.fulfilment``         protobuf events for the fulfilment service (not Celery)
``<run>.dlx``                the dead-letter exchange every queue above routes to
``<run>.dead``               the DLX service's queue
``{<run>}:...``              celery_dlx's Redis keys (parked retries, graveyard, history)
===========================  ============================================================

Run a worker (with beat for the drain, and the DLX service inside it)::

    EXAMPLE_RUN=example celery -A example_project.app worker -B -l INFO

and look at the graveyard with ``celery -A example_project.app dlx ...`` (same ``EXAMPLE_RUN``).
"""

from __future__ import annotations

import logging
import os

from celery import Celery
from kombu import Exchange, Queue

import celery_dlx

from . import schema

logger = logging.getLogger(__name__)

#: The run's name: every queue, exchange and Redis key of the run starts with it.
RUN = os.environ.get("EXAMPLE_RUN", "example")
BROKER_URL = os.environ.get("EXAMPLE_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("EXAMPLE_REDIS_URL", "redis://127.0.0.1:6379/0")

ORDERS = f"{RUN}.orders"
SHIPPING = f"{RUN}.shipping"
FULFILMENT = f"{RUN}.fulfilment"
DLX_EXCHANGE = f"{RUN}.dlx"
DEAD = f"{RUN}.dead"
#: Queues of a demo run delete themselves after a day without use (shared brokers stay tidy).
QUEUE_EXPIRES = 24 * 3600


def _descriptor_sets() -> list[str]:
    # Compiled from protos/events.proto on first use, so `celery dlx show` decodes the events.
    try:
        return [str(schema.descriptor_set())]
    except ImportError:  # grpcio-tools absent: payloads are still shown, as a schema-less dump
        logger.warning("grpcio-tools is not installed: protobuf events are shown without schema")
        return []


app = Celery("example_project", broker=BROKER_URL, include=["example_project.tasks"])
# Before any task is defined: from here on every task of the app is a DLX task when enabled.
celery_dlx.install(app)
app.conf.update(
    # celery_dlx: one flag, then the failure policy.
    dlx_enabled=True,
    dlx_redis_url=REDIS_URL,
    dlx_key_prefix=RUN,
    dlx_exchange=DLX_EXCHANGE,
    dlx_service_queue=DEAD,
    # The DLX service runs in a thread of the worker (or: `celery -A example_project.app dlx
    # service` as its own process, with this setting off).
    dlx_service_in_worker=True,
    # Requeue twice at the tail, then park three times (1 s, 2 s, 4 s), then bury. Short
    # delays so the demo ends in seconds; production delays are minutes.
    dlx_max_requeues=2,
    dlx_max_parks=3,
    dlx_backoff=[1, 2, 4],
    dlx_drain_interval=0.5,
    # The fulfilment queue belongs to a service in another language: its consumer only rejects.
    # The DLX service applies this policy to its dead letters.
    dlx_queues={
        FULFILMENT: {"max_requeues": 1, "max_parks": 1, "backoff": [1], "importance": "page"},
    },
    dlx_protobuf_descriptor_sets=_descriptor_sets(),
    # Plain Celery settings.
    task_default_queue=ORDERS,
    task_queues=[
        Queue(name, Exchange(name, type="direct"), routing_key=name, expires=QUEUE_EXPIRES)
        for name in (ORDERS, SHIPPING)
    ],
    task_routes={"orders.ship": {"queue": SHIPPING}},
    result_backend=REDIS_URL,
    # Results under the run's hash tag too, so one SCAN finds everything a run wrote.
    result_backend_transport_options={"global_keyprefix": "{" + RUN + "}:"},
    result_expires=24 * 3600,
    broker_connection_retry_on_startup=True,
)
