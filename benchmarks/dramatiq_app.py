"""The peer the P1, P3 and P10 benchmarks compare with: the same tasks as Dramatiq actors.

Dramatiq (``dramatiq[rabbitmq]``, the ``bench`` extra) on the same RabbitMQ, counting its runs in the
same Redis keys as ``benchmarks/bench_app.py``, so one harness times all three systems. Run by
``benchmarks/_workers.py`` as ``dramatiq dramatiq_app --processes 1 --threads 1``; ``BENCH_UID``
names the queue (``bench-<uid>``; Dramatiq adds ``.DQ`` for delayed and ``.XQ`` for dead messages)
and the keys. ``BENCH_PREFETCH`` sets Dramatiq's queue prefetch (its default is 2 per thread)
to the prefetch the Celery workers get, 10.

Dramatiq's own behaviour is kept: a failing actor is retried by its ``Retries`` middleware
(exponential backoff from 15 s, 20 retries); ``raise dramatiq.Retry(delay=ms)`` retries after
``delay``: the message goes to the delay queue, which the worker consumes and holds in memory
until due (at most 1000 per thread, the rest wait in RabbitMQ). Publishes are not confirmed
(Dramatiq's default), unless ``BENCH_DRAMATIQ_CONFIRM=1`` (the ``dramatiq_confirm`` system of
``_workers.py``): then the broker is ``RabbitmqBroker(confirm_delivery=True)``, and a retry's
copy in the delay queue is confirmed by RabbitMQ before the original is acked, the guarantee
celery_dlx gives a park (acked once Redis has it). Its loggers are set to ERROR, as the Celery
workers run with ``-l ERROR``.
"""

from __future__ import annotations

import logging
import os
import time

import dramatiq
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker

try:
    from benchmarks._common import BROKER_URL, REDIS_URL
except ImportError:  # run as a worker with benchmarks/ on the path
    from _common import BROKER_URL, REDIS_URL  # type: ignore[no-redef]

UID = os.environ.get("BENCH_UID", "bench")
PREFIX = f"bench-{UID}"
QUEUE = f"bench-{UID}"
os.environ.setdefault("dramatiq_queue_prefetch", os.environ.get("BENCH_PREFETCH", "10"))

logging.getLogger("dramatiq").setLevel(logging.ERROR)


def broker_url() -> str:
    """``BROKER_URL`` as pika spells the default vhost."""
    return BROKER_URL[:-2] + "/%2F" if BROKER_URL.endswith("//") else BROKER_URL


#: Whether this worker's publishes wait for RabbitMQ's confirm (``BENCH_DRAMATIQ_CONFIRM=1``).
CONFIRM = os.environ.get("BENCH_DRAMATIQ_CONFIRM") == "1"
broker = RabbitmqBroker(url=broker_url(), confirm_delivery=CONFIRM)
dramatiq.set_broker(broker)
_redis = redis.Redis.from_url(REDIS_URL)


def key(name: str) -> str:
    return "{" + PREFIX + "}:bench:" + name


def _mark(total: int) -> None:
    n = _redis.incr(key("done"))
    if n == 1:
        _redis.set(key("first"), repr(time.time()), nx=True)
    if n == total:
        _redis.set(key("last"), repr(time.time()))


@dramatiq.actor(actor_name="bench_noop", queue_name=QUEUE)
def noop(total: int) -> None:
    """Does nothing but count itself."""
    _mark(total)


@dramatiq.actor(actor_name="bench_work", queue_name=QUEUE)
def work(poison: bool, total: int) -> None:
    """A good message counts itself; a poison message always fails (Dramatiq retries it)."""
    if _redis.get(key("first")) is None:
        _redis.set(key("first"), repr(time.time()), nx=True)
    if poison:
        raise ValueError("poison message: cannot parse payload")
    _mark(total)


@dramatiq.actor(actor_name="bench_park_hour", queue_name=QUEUE)
def park_hour() -> None:
    """Fails with a retry due in one hour (a delayed message the worker holds until due)."""
    _redis.incr(key("runs"))
    raise dramatiq.Retry("supplier API rate limited", delay=3_600_000)


@dramatiq.actor(actor_name="bench_count_run", queue_name=QUEUE)
def count_run() -> None:
    """Succeeds at once, counted like park_hour."""
    _redis.incr(key("runs"))


@dramatiq.actor(actor_name="bench_fresh", queue_name=QUEUE)
def fresh(sent_at: float) -> None:
    """Records how long it waited between publish and run."""
    _redis.rpush(key("latency"), repr(time.time() - sent_at))


def publish(uid: str, actor: str, calls: list[tuple[object, ...]]) -> None:
    """Enqueue one message to ``actor`` (``bench_work``...) per args tuple, on ``bench-<uid>``."""
    pub = RabbitmqBroker(url=broker_url())
    try:
        queue = f"bench-{uid}"
        pub.declare_queue(queue, ensure=True)
        for args in calls:
            pub.enqueue(
                dramatiq.Message(
                    queue_name=queue, actor_name=actor, args=args, kwargs={}, options={}
                )
            )
    finally:
        pub.close()
