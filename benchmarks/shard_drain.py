"""Drain rate with parked retries in one slot (``dlx_redis_shards = "none"``) and sharded by
queue (``"queue"``), on the shared Redis node and RabbitMQ: 5,000 due retries of 1 KiB over 10
queues, ``run_drain`` until none is left, two rounds each, alternating.

    .venv/bin/python benchmarks/shard_drain.py

On one node sharding buys nothing and costs the drain a count per bucket and a claim per bucket
with due entries; the figures in docs/operations.md say how much.
"""

from __future__ import annotations

import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
from celery import Celery  # noqa: E402
from kombu import Connection  # noqa: E402

from celery_dlx.drain.core import run_drain  # noqa: E402
from celery_dlx.fates import now_ms  # noqa: E402
from celery_dlx.message.parked import ParkedMessage  # noqa: E402
from celery_dlx.wiring.runtime import get_runtime  # noqa: E402

BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"
REDIS_URL = "redis://127.0.0.1:6379/0"
RETRIES = 5000
QUEUES = 10


def one_round(shards: str) -> float:
    uid = uuid.uuid4().hex[:8]
    app = Celery(f"shard-drain-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(dlx_redis_url=REDIS_URL, dlx_redis_shards=shards, dlx_key_prefix=f"sd-{uid}")
    runtime = get_runtime(app)
    queues = [f"sd-{uid}-{i}" for i in range(QUEUES)]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        with Connection(BROKER_URL) as conn:
            channel = conn.channel()
            for queue in queues:
                channel.queue_declare(queue, durable=False, auto_delete=False)
            due = now_ms() - 1000
            retries = [
                ParkedMessage(f"m{i}", 1, queues[i % QUEUES], b"x" * 1024, due_ms=due)
                for i in range(RETRIES)
            ]
            for i in range(0, RETRIES, 500):
                runtime.parking.park_many(retries[i : i + 500])
            start = time.monotonic()
            while runtime.parking.count():
                run_drain(runtime, budget_seconds=5)
            rate = RETRIES / (time.monotonic() - start)
            for queue in queues:
                channel.queue_delete(queue)
    finally:
        for pattern in ("{sd-" + uid + "}*", "{sd-" + uid + ":q:*"):
            for key in client.scan_iter(match=pattern, count=1000):
                client.delete(key)
        client.close()
        runtime.reset_publisher()
    return rate


def main() -> None:
    for shards in ("none", "queue", "none", "queue"):
        print(f"dlx_redis_shards={shards}: {one_round(shards):,.0f} retries/s", flush=True)


if __name__ == "__main__":
    main()
