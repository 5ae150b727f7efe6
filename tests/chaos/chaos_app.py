"""The Celery app of a chaos run, shared by its worker, DLX service, drain and foreign processes.

Its names come from the environment (``CHAOS_UID``), so every process of one run uses the same
queues and keys: ``CHAOS_REDIS`` is celery_dlx's Redis (the run's own AOF server, restarted
during the run), ``CHAOS_LEDGER`` the Redis that counts executions (the shared one, never
restarted: the ledger must outlive the chaos it measures), ``CHAOS_QUORUM=1`` makes the queues
quorum queues.

Tasks (each counts its runs, and its successful executions in the ledger before it returns):

- ``chaos.good``: succeeds.
- ``chaos.flaky``: fails ``fails`` times (transient errors), then succeeds.
- ``chaos.poison``: always fails; ends buried.
"""

from __future__ import annotations

import os
from typing import Any

import redis
from celery import Celery

import celery_dlx

BROKER_URL = os.environ.get("DLX_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
LEDGER_URL = os.environ.get(
    "CHAOS_LEDGER", os.environ.get("DLX_TEST_REDIS", "redis://127.0.0.1:6379/0")
)


class Names:
    """Queue, exchange and key names of one chaos run."""

    def __init__(self, uid: str) -> None:
        self.uid = uid
        self.work = f"chaos-{uid}"
        self.foreign = f"chaos-foreign-{uid}"
        self.exchange = f"chaos-dlx-{uid}"
        self.service = f"chaos-dead-{uid}"
        self.key_prefix = f"chaos-{uid}"
        ledger = "{chaos-ledger-" + uid + "}"
        #: Hash: message id -> successful executions.
        self.done = f"{ledger}:done"
        #: Hash: message id -> runs (executions, failed or not).
        self.runs = f"{ledger}:runs"

    @property
    def ledger_keys(self) -> list[str]:
        return [self.done, self.runs]

    @property
    def queues(self) -> list[str]:
        return [self.work, self.foreign, self.service]

    @property
    def exchanges(self) -> list[str]:
        return [self.exchange, self.work]


def chaos_settings(names: Names, redis_url: str, *, quorum: bool) -> dict[str, Any]:
    """The settings every process of the run shares."""
    return {
        "task_default_queue": names.work,
        "dlx_enabled": True,
        "dlx_redis_url": redis_url,
        "dlx_key_prefix": names.key_prefix,
        "dlx_exchange": names.exchange,
        "dlx_service_queue": names.service,
        "dlx_quorum": quorum,
        "dlx_max_requeues": 2,
        "dlx_max_parks": 2,
        "dlx_backoff": [0.5, 1.0],
        "dlx_drain_interval": 0.5,
        # A killed drain's claim comes back after the lease: short, so a run settles quickly.
        "dlx_drain_lease": 5.0,
        "dlx_queues": {
            names.foreign: {"max_requeues": 1, "max_parks": 2, "backoff": [0.5, 1.0]},
        },
        "worker_prefetch_multiplier": 4,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "broker_transport_options": {"confirm_publish": True},
        "worker_hijack_root_logger": False,
    }


def make_chaos_app(uid: str, redis_url: str, *, quorum: bool = False) -> Celery:
    """The app of chaos run ``uid``; celery_dlx's Redis is ``redis_url``."""
    names = Names(uid)
    app = Celery(f"chaos-{uid}", broker=BROKER_URL, set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(chaos_settings(names, redis_url, quorum=quorum))
    ledger = redis.Redis.from_url(LEDGER_URL, socket_timeout=10)

    @app.task(name="chaos.good", bind=True, shared=False)
    def good(self: Any, message_id: str) -> None:
        ledger.hincrby(names.runs, message_id, 1)
        ledger.hincrby(names.done, message_id, 1)

    @app.task(name="chaos.flaky", bind=True, shared=False)
    def flaky(self: Any, message_id: str, fails: int) -> None:
        run = ledger.hincrby(names.runs, message_id, 1)
        if run <= fails:
            raise ConnectionError(f"upstream unavailable (run {run} of {message_id})")
        ledger.hincrby(names.done, message_id, 1)

    @app.task(name="chaos.poison", bind=True, shared=False)
    def poison(self: Any, message_id: str) -> None:
        ledger.hincrby(names.runs, message_id, 1)
        raise ValueError(f"order {message_id} refers to no customer")

    return app


# Worker, service and drain subprocesses load the app by module (`celery -A tests.chaos.chaos_app`).
if "CHAOS_UID" in os.environ:
    app = make_chaos_app(
        os.environ["CHAOS_UID"],
        os.environ["CHAOS_REDIS"],
        quorum=os.environ.get("CHAOS_QUORUM") == "1",
    )
