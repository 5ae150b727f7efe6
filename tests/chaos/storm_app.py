"""The Celery app of a storm run: poison tasks buried on their first failure while Redis is full.

Its names come from the environment (``STORM_UID``), so the worker, the DLX service and the test
share queues and keys: ``STORM_REDIS`` is celery_dlx's Redis (a private server with a small
``maxmemory`` and ``noeviction``), the ledger lives in the shared Redis (``DLX_TEST_REDIS``), which
the storm never fills: every run of a task counts itself there (``runs``), a success records when
it happened (``done_at``) and a first run when it started (``first_at``). Nothing of celery_dlx's
own counts goes into a verdict.

Tasks:

- ``storm.poison``: always fails with ``ValueError``, in ``dlx_bury_on``: buried at once, must
  run exactly once.
- ``storm.flaky``: fails its first run with ``ConnectionError`` (parked for ``dlx_backoff`` = 1 s),
  then succeeds.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

import celery_dlx

BROKER_URL = os.environ.get("DLX_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
LEDGER_URL = os.environ.get("DLX_TEST_REDIS", "redis://127.0.0.1:6379/0")
#: Park delay of a flaky task's first failure (seconds).
FLAKY_BACKOFF = 1.0


class Names:
    """Queue, exchange and key names of one storm run (all hold the run's ``uid``)."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.work = f"storm-{uid}"
        self.exchange = f"storm-dlx-{uid}"
        self.service = f"storm-dead-{uid}"
        self.key_prefix = f"storm-{uid}"
        # Under the shared test prefix, so tests/conftest.py's forget() deletes it after the test.
        ledger = "{test-" + uid + "}:ledger"
        #: Hash: message id -> runs started.
        self.runs = f"{ledger}:runs"
        #: Hash: message id -> epoch seconds its first run started.
        self.first_at = f"{ledger}:first"
        #: Hash: message id -> epoch seconds of its success.
        self.done_at = f"{ledger}:done"

    @property
    def ledger_keys(self) -> list[str]:
        return [self.runs, self.first_at, self.done_at]


def storm_settings(names: Names, redis_url: str) -> dict[str, Any]:
    return {
        "task_default_queue": names.work,
        "dlx_enabled": True,
        "dlx_redis_url": redis_url,
        "dlx_key_prefix": names.key_prefix,
        "dlx_exchange": names.exchange,
        "dlx_service_queue": names.service,
        # a crash (a redelivery) is requeued first: the second lineage the issue saw
        "dlx_max_requeues": 2,
        "dlx_max_parks": 2,
        "dlx_backoff": [FLAKY_BACKOFF],
        "dlx_drain_interval": 0.2,
        "dlx_service_prefetch": 300,
        "worker_prefetch_multiplier": 8,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "broker_transport_options": {"confirm_publish": True},
        "worker_hijack_root_logger": False,
    }


def make_storm_app(uid: str, redis_url: str) -> Celery:
    """The app of storm run ``uid`` with celery_dlx's Redis at ``redis_url``."""
    names = Names(uid)
    app = Celery(f"storm-{uid}", broker=BROKER_URL, set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(storm_settings(names, redis_url))
    ledger = redis.Redis.from_url(LEDGER_URL, socket_timeout=10)

    def started(message_id: str) -> int:
        pipe = ledger.pipeline(transaction=True)
        pipe.hincrby(names.runs, message_id, 1)
        pipe.hsetnx(names.first_at, message_id, time.time())
        return int(pipe.execute()[0])

    @app.task(name="storm.poison", shared=False, dlx_bury_on=(ValueError,))
    def poison(message_id: str, payload: str) -> None:
        started(message_id)
        raise ValueError(f"order {message_id} refers to no customer ({len(payload)} bytes)")

    @app.task(name="storm.flaky", shared=False, dlx_park_on=(ConnectionError,))
    def flaky(message_id: str) -> None:
        if started(message_id) == 1:
            raise ConnectionError(f"upstream unavailable for {message_id}")
        ledger.hsetnx(names.done_at, message_id, time.time())

    @app.task(name="storm.shaky", shared=False)
    def shaky(message_id: str) -> None:
        """As ``flaky``, but requeued (a ConnectionError's default fate) instead of parked."""
        if started(message_id) == 1:
            raise ConnectionError(f"upstream unavailable for {message_id}")
        ledger.hsetnx(names.done_at, message_id, time.time())

    return app


# Worker and service subprocesses load the app by module (`celery -A tests.chaos.storm_app`).
if "STORM_UID" in os.environ:
    app = make_storm_app(os.environ["STORM_UID"], os.environ["STORM_REDIS"])
