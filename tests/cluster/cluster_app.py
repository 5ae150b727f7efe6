"""The chaos app (:mod:`tests.chaos.chaos_app`) for the cluster run's A/B measurement: with
``CLUSTER_NO_DELAYED_DELIVERY=1`` the worker's consumer leaves out Celery's native delayed
delivery step (``celery.worker.consumer.delayed_delivery:DelayedDelivery``, which Celery adds when
the app has quorum queues), through Celery's own ``worker_consumer`` setting of this app alone
(celery_dlx's consumer class, its blueprint one step shorter).

That step's set-up runs at every consumer (re)start and tries every URL of ``broker_url`` four
times, sleeping 1, 3 and 5 s between tries: with one node of a cluster dead, about 17 s in which
the worker consumes nothing. Leaving it out measures what the stall is without it; celery_dlx
does not use native delayed delivery (it parks retries in Redis), but ETA/countdown tasks of an
app with quorum queues do, so this is not celery_dlx's default.
"""

from __future__ import annotations

import os

from celery_dlx.worker.consumer import DLXConsumer
from tests.chaos.chaos_app import app as chaos

#: Celery's step left out.
DELAYED_DELIVERY = "celery.worker.consumer.delayed_delivery:DelayedDelivery"


class ConsumerWithoutDelayedDelivery(DLXConsumer):
    """celery_dlx's consumer (which ``dlx_enabled`` installs), its blueprint without
    :data:`DELAYED_DELIVERY`."""

    class Blueprint(DLXConsumer.Blueprint):
        default_steps = [s for s in DLXConsumer.Blueprint.default_steps if s != DELAYED_DELIVERY]


app = chaos
if os.environ.get("CLUSTER_NO_DELAYED_DELIVERY") == "1":
    app.conf.worker_consumer = f"{__name__}:ConsumerWithoutDelayedDelivery"
