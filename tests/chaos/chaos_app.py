"""The Celery app of a chaos run, shared by its worker, DLX service, drain and foreign processes.

Its names come from the environment (``CHAOS_UID``), so every process of one run uses the same
queues and keys: ``CHAOS_REDIS`` is celery_dlx's Redis (the run's own AOF server, restarted
during the run), ``CHAOS_LEDGER`` the Redis that counts executions (the shared one, never
restarted: the ledger must outlive the chaos it measures), ``CHAOS_QUORUM=1`` makes the queues
quorum queues.

The ledger is independent of celery_dlx: every run of a task (and of the foreign consumer)
counts itself in ``runs`` when it starts and, when it ends, appends one entry to ``log``: message
id, run number, the attempt header it was delivered with (for the record only), outcome (``done``
or ``failed``), pid and time. A run killed mid-way has a ``runs`` count and no entry. The chaos
check derives each message's expected fate from the ledger alone (see ``harness.py``).

Tasks:

- ``chaos.good``: succeeds.
- ``chaos.flaky``: fails ``fails`` times (transient errors), then succeeds.
- ``chaos.poison``: always fails; ends buried.
"""

from __future__ import annotations

import json
import os
import time
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
        #: Hash: message id -> runs (executions started, failed or not).
        self.runs = f"{ledger}:runs"
        #: List: one JSON entry per finished run (see :func:`record`).
        self.log = f"{ledger}:log"

    @property
    def ledger_keys(self) -> list[str]:
        return [self.done, self.runs, self.log]

    @property
    def queues(self) -> list[str]:
        return [self.work, self.foreign, self.service]

    @property
    def exchanges(self) -> list[str]:
        return [self.exchange, self.work]


def record(
    ledger: Any, names: Names, message_id: str, run: int, attempt: Any, outcome: str
) -> None:
    """Append one finished run to the ledger (and count a ``done`` one in ``done``)."""
    entry = {
        "id": message_id,
        "run": run,
        "attempt": attempt,
        "outcome": outcome,
        "pid": os.getpid(),
        "at": time.time(),
    }
    pipe = ledger.pipeline(transaction=True)
    pipe.rpush(names.log, json.dumps(entry))
    if outcome == "done":
        pipe.hincrby(names.done, message_id, 1)
    pipe.execute()


def delivered_attempt(request: Any) -> Any:
    """The attempt header a task was delivered with, read raw (for the ledger's record only)."""
    properties = getattr(request, "properties", None) or {}
    headers = properties.get("application_headers") or getattr(request, "headers", None) or {}
    value = headers.get("x-dlx-attempt") if isinstance(headers, dict) else None
    return value if isinstance(value, (int, str)) else None


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


def make_chaos_app(
    uid: str, redis_url: str, *, quorum: bool = False, broker_url: str = BROKER_URL
) -> Celery:
    """The app of chaos run ``uid``; celery_dlx's Redis is ``redis_url``, its broker
    ``broker_url`` (a run's processes get it as ``DLX_TEST_BROKER``)."""
    names = Names(uid)
    app = Celery(f"chaos-{uid}", broker=broker_url, set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(chaos_settings(names, redis_url, quorum=quorum))
    ledger = redis.Redis.from_url(LEDGER_URL, socket_timeout=10)

    @app.task(name="chaos.good", bind=True, shared=False)
    def good(self: Any, message_id: str) -> None:
        run = ledger.hincrby(names.runs, message_id, 1)
        record(ledger, names, message_id, run, delivered_attempt(self.request), "done")

    @app.task(name="chaos.flaky", bind=True, shared=False)
    def flaky(self: Any, message_id: str, fails: int) -> None:
        run = ledger.hincrby(names.runs, message_id, 1)
        attempt = delivered_attempt(self.request)
        if run <= fails:
            record(ledger, names, message_id, run, attempt, "failed")
            raise ConnectionError(f"upstream unavailable (run {run} of {message_id})")
        record(ledger, names, message_id, run, attempt, "done")

    @app.task(name="chaos.poison", bind=True, shared=False)
    def poison(self: Any, message_id: str) -> None:
        run = ledger.hincrby(names.runs, message_id, 1)
        record(ledger, names, message_id, run, delivered_attempt(self.request), "failed")
        raise ValueError(f"order {message_id} refers to no customer")

    return app


# Worker, service and drain subprocesses load the app by module (`celery -A tests.chaos.chaos_app`).
if "CHAOS_UID" in os.environ:
    app = make_chaos_app(
        os.environ["CHAOS_UID"],
        os.environ["CHAOS_REDIS"],
        quorum=os.environ.get("CHAOS_QUORUM") == "1",
    )
