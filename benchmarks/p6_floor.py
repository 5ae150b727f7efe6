"""P6 floors: how fast one bare Python process (py-amqp, redis-py) gets through a dead-letter backlog.

Used by ``p6_service.py`` (``--no-floor`` skips them), over a service queue holding the round's
``N`` dead letters, filled and dead-lettered as the round's backlog (x-death and all). Each floor
runs in a process of its own (forked, like the service's), so the harness's CPU is not counted:

- bare consumer: py-amqp (kombu's transport, stock frame reader, bodies left undecoded),
  ``basic_qos`` prefetch = the service's, ``basic_consume``; per delivery it only keeps the
  delivery tag, and per batch (the service's batch size) sends one ``basic.ack(multiple=True)``:
  the ceiling of receiving alone;
- + minimal writes: the same, plus per batch one redis-py pipeline (``transaction=False``) with,
  per message, the least a burial or park stores (``HSET <prefix>:floor:msgs <message id>
  <body>`` and ``ZADD <prefix>:floor:due {<message id>: now}``), executed before the batch's ack;
  each message's headers and message id are read (py-amqp decoded them already).

The clock runs from the first delivery to the last ack of all ``N``; one thread does it all.
"""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import redis
from _common import BROKER_URL, REDIS_URL
from kombu import Connection

#: Seconds a floor waits for any one delivery before it gives up (the backlog is already queued).
WAIT = 60.0


def _consume(
    queue: str, total: int, prefetch: int, batch: int, prefix: str | None, out: Any
) -> None:
    """In the child: consume ``total`` deliveries of ``queue``; puts ``(seconds, with x-death)``."""
    try:
        client = redis.Redis.from_url(REDIS_URL) if prefix is not None else None
        msgs, due = f"{prefix}:floor:msgs", f"{prefix}:floor:due"
        with Connection(BROKER_URL) as conn:
            raw: Any = conn.connection
            channel: Any = raw.channel()
            channel.auto_decode = False  # keep bodies as bytes, as the service does
            channel.basic_qos(0, prefetch, False)
            pending: list[Any] = []

            def keep_tag(message: Any) -> None:
                pending.append(message.delivery_tag)

            channel.basic_consume(queue, callback=keep_tag if client is None else pending.append)
            acked = deaths = 0
            start: float | None = None
            while acked < total:
                raw.drain_events(timeout=WAIT)
                if start is None:
                    start = time.perf_counter()
                if len(pending) < batch and acked + len(pending) < total:
                    continue
                if client is None:
                    last = pending[-1]
                else:
                    now = time.time()
                    pipe = client.pipeline(transaction=False)
                    for message in pending:
                        headers = message.headers
                        if headers and "x-death" in headers:
                            deaths += 1
                        message_id = message.properties["message_id"]
                        pipe.hset(msgs, message_id, message.body)
                        pipe.zadd(due, {message_id: now})
                    pipe.execute()
                    last = pending[-1].delivery_tag
                channel.basic_ack(last, multiple=True)
                acked += len(pending)
                pending.clear()
            elapsed = time.perf_counter() - (start or time.perf_counter())
            channel.close()
        out.put((elapsed, deaths))
    except BaseException as exc:  # report it to the parent rather than leave it waiting
        out.put(exc)
        raise


def floor_run(queue: str, total: int, prefetch: int, batch: int, prefix: str | None) -> float:
    """Seconds one process takes to consume and ack the ``total`` dead letters in ``queue``:
    the bare consumer when ``prefix`` is None, else with the minimal writes under ``prefix``
    (checked afterwards: ``total`` stored, every one with x-death; the two keys are deleted)."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    proc = ctx.Process(target=_consume, args=(queue, total, prefetch, batch, prefix, out))
    proc.start()
    result = out.get(timeout=WAIT * 4)
    proc.join(30)
    if isinstance(result, BaseException):
        raise RuntimeError(f"floor consumer failed on {queue}: {result!r}") from result
    elapsed, deaths = result
    if prefix is not None:
        client = redis.Redis.from_url(REDIS_URL)
        msgs, due = f"{prefix}:floor:msgs", f"{prefix}:floor:due"
        stored = (int(client.hlen(msgs)), int(client.zcard(due)), int(deaths))
        assert stored == (total, total, total), stored
        client.delete(msgs, due)
    return float(elapsed)
