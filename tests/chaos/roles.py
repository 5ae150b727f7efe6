"""Processes of a chaos run that are not Celery workers: ``python -m tests.chaos.roles <role>``.

- ``drain``: republishes due parked retries in a loop, as beat's drain task would (several may
  run at once; each may be killed -9 between its claim and its confirm).
- ``foreign``: a consumer that is not Celery (pika): it rejects a message (``requeue=False``)
  while the message's own attempt header is below the ``fails`` of its JSON body, else counts
  it done in the ledger and acks it. It reconnects when the broker goes away.

Both take the run's settings from the environment (see :mod:`tests.chaos.chaos_app`).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from tests.chaos.chaos_app import BROKER_URL, LEDGER_URL, Names, record


def drain_forever() -> None:
    from celery_dlx.drain.core import run_drain
    from celery_dlx.wiring.runtime import get_runtime
    from tests.chaos.chaos_app import app

    runtime = get_runtime(app)
    interval = float(runtime.config.drain_interval)
    while True:
        # run_drain logs and survives broker and Redis outages itself.
        run_drain(runtime, budget_seconds=0.8 * interval)
        time.sleep(interval)


def _pika_url() -> str:
    # kombu writes the default vhost as "//", pika as "/%2F".
    return BROKER_URL[:-2] + "/%2F" if BROKER_URL.endswith("//") else BROKER_URL


def consume_foreign() -> None:
    import pika
    import redis

    from celery_dlx.message.names import ATTEMPT_HEADER

    names = Names(os.environ["CHAOS_UID"])
    ledger = redis.Redis.from_url(LEDGER_URL, socket_timeout=10)

    def on_message(channel: Any, method: Any, props: Any, body: bytes) -> None:
        spec = json.loads(body)
        attempt = int((props.headers or {}).get(ATTEMPT_HEADER, 0))
        message_id = str(spec["id"])
        run = ledger.hincrby(names.runs, message_id, 1)
        if attempt < int(spec["fails"]):
            record(ledger, names, message_id, run, attempt, "failed")
            channel.basic_reject(method.delivery_tag, requeue=False)
            return
        record(ledger, names, message_id, run, attempt, "done")
        channel.basic_ack(method.delivery_tag)

    while True:
        try:
            conn = pika.BlockingConnection(pika.URLParameters(_pika_url()))
            channel = conn.channel()
            channel.basic_qos(prefetch_count=20)
            channel.basic_consume(names.foreign, on_message)
            channel.start_consuming()
        except (pika.exceptions.AMQPError, OSError) as exc:
            logging.getLogger("chaos.foreign").warning("broker lost (%r); reconnecting", exc)
            time.sleep(0.5)


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s %(name)s] %(message)s")
    roles = {"drain": drain_forever, "foreign": consume_foreign}
    if len(argv) != 1 or argv[0] not in roles:
        raise SystemExit(f"usage: python -m tests.chaos.roles {{{'|'.join(roles)}}}")
    roles[argv[0]]()


if __name__ == "__main__":
    main(sys.argv[1:])
