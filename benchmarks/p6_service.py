"""P6: dead letters the DLX service handles per second, against the broker's own dead-lettering.

Each round fills two durable work queues (dead-lettering to a unique DLX exchange and service
queue) with ``--messages`` foreign messages in all (1 KB JSON bodies with a message id), half of
them in a queue whose policy buries at once and half in one whose policy parks (``--park-share``),
then measures back to back:

- baseline: the broker dead-lettering them: a consumer with a large prefetch rejects every
  delivery with one ``basic.nack(multiple=True, requeue=False)`` per batch, so the client costs
  next to nothing; the clock runs from the first nack until the service queue holds every message;
- service: a :class:`~celery_dlx.service.loop.DLXService` consuming that backlog: read, one Redis
  lookup per batch, park (Redis store) or bury (obituary + indexes + history), fate events, seen
  markers, ack; the clock runs from its first batch until every dead letter is acked.

It checks that the graveyard and the parking store then hold exactly the messages of each queue.
The ratio is the median of the rounds' service/broker ratios (target >= 1.0x, issue 23 item 4).
The service runs with the default ``dlx_service_prefetch`` unless ``--prefetch`` is given;
``--services 1,2`` runs one and two service processes (``celery dlx service --processes N``),
each against its own broker baseline measured just before it (rounds interleave baseline and
service).

Floors (``benchmarks/p6_floor.py``; on by default, ``--no-floor`` skips them): where the ceiling
of any single Python process using py-amqp (the service's client, through kombu) and redis-py
lies. In each round, after the service (with the first ``--services`` count), the same queues are
filled and dead-lettered again as for the baseline (same ``N``, bodies, headers, x-death), and one
process of its own consumes the service queue with the service's prefetch:

- bare consumer: keeps each delivery tag and sends one ``basic.ack(multiple=True)`` per batch of
  the service's size (a third of the prefetch, at most 500): the ceiling of receiving alone;
- + minimal writes: the same, plus per batch one redis-py pipeline (``transaction=False``) with,
  per message, ``HSET <prefix>:floor:msgs <message id> <body>`` and ``ZADD <prefix>:floor:due
  {<message id>: now}`` (the least a burial or park stores), executed before the batch's ack.

Each clock runs from the first delivery to the last ack of all ``N``. A round prints one ``floor``
line (both rates, each as a ratio to that round's broker baseline); the end prints one ``RATIO P6
floor ...`` line per floor (median of the rounds' ratios, "(floor, no target)") and no SUMMARY row.

Run: ``.venv/bin/python benchmarks/p6_service.py [--messages 10000] [--rounds 3] [--services 1,2]
[--no-floor]``
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import time
from typing import Any

import pika  # type: ignore[import-untyped]
import redis
from _common import (
    BROKER_URL,
    REDIS_URL,
    delete_keys,
    load,
    median,
    paired_ratio_line,
    round_line,
    rounds_list,
    say,
    scratch_queues,
    summary,
    unique,
)
from celery import Celery
from kombu import Connection, Producer
from p6_floor import floor_run

from celery_dlx.broker.topology import dlx_queue
from celery_dlx.ops import obituaries
from celery_dlx.policy.config import load_config
from celery_dlx.service.loop import BATCH_LIMIT, SETTLERS, DLXService
from celery_dlx.wiring.runtime import get_runtime

logging.basicConfig(level=logging.INFO, stream=open(os.devnull, "w"))  # noqa: SIM115

TARGET = 1.0


class TimedService(DLXService):
    """The DLX service, noting when its first batch started."""

    first_batch: float | None = None

    def settle(self, messages: Any) -> None:
        if self.first_batch is None:
            self.first_batch = time.perf_counter()
        super().settle(messages)


def depth(conn: Connection, queue: str) -> int:
    channel: Any = conn.channel()
    try:
        return int(channel.queue_declare(queue, passive=True).message_count)
    finally:
        channel.close()


def fill(conn: Connection, queue: str, count: int, body_size: int) -> None:
    producer = Producer(conn.channel())
    pad = "x" * max(0, body_size - 60)
    for i in range(count):
        body = json.dumps({"invoice": i, "customer": f"c-{i % 977}", "pad": pad}).encode()
        producer.publish(
            body,
            routing_key=queue,
            message_id=f"{queue}-{i}",
            content_type="application/json",
            content_encoding="utf-8",
            headers={"source": "billing-go", "trace-id": f"{i:016x}"},
            delivery_mode=2,
        )


def broker_dead_letters(conn: Connection, queues: list[str], dead: str, total: int) -> float:
    """Reject everything in ``queues`` in bulk; seconds until ``dead`` holds ``total``.

    pika, because py-amqp has no ``basic.nack`` (only single ``basic.reject``).
    """
    url = BROKER_URL[:-2] + "/%2F" if BROKER_URL.endswith("//") else BROKER_URL
    pconn = pika.BlockingConnection(pika.URLParameters(url))
    channel = pconn.channel()
    channel.basic_qos(prefetch_count=2000)
    last: dict[str, int] = {}

    def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
        last["tag"] = method.delivery_tag

    for queue in queues:
        channel.basic_consume(queue, on_message)
    start: float | None = None
    while depth(conn, dead) < total:
        pconn.process_data_events(time_limit=0.005)
        if "tag" in last:
            if start is None:
                start = time.perf_counter()
            channel.basic_nack(last.pop("tag"), multiple=True, requeue=False)
    elapsed = time.perf_counter() - (start or time.perf_counter())
    pconn.close()
    return elapsed


def _service_process(app: Celery, out: Any) -> None:
    service = TimedService(app)
    service.run(idle_timeout=1.0)
    out.put((service.first_batch, service.stats.as_dict()))


def service_run(app: Celery, total: int, instances: int) -> tuple[float, dict[str, int]]:
    """Run ``instances`` service processes over the backlog; seconds from the first batch of any
    until the store and the graveyard hold every dead letter (each is acked right after)."""
    runtime = get_runtime(app)
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    procs = [ctx.Process(target=_service_process, args=(app, out)) for _ in range(instances)]
    for proc in procs:
        proc.start()
    while obituaries.count(runtime) + runtime.store.count() < total:
        time.sleep(0.005)
    done = time.perf_counter()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(30)
    first = min(r[0] for r in results if r[0] is not None)
    stats: dict[str, int] = {}
    for _, part in results:
        for key, value in part.items():
            stats[key] = stats.get(key, 0) + value
    return done - first, stats


def one_round(
    total: int,
    park_share: float,
    body_size: int,
    instances: int = 1,
    prefetch: int | None = None,
    floor_prefetch: int | None = None,
) -> tuple[float, float, dict[str, int], list[float]]:
    """Baseline and service over one backlog; with ``floor_prefetch``, then the two floors (bare
    consumer, + minimal writes), each over the backlog made again. Rates per second: broker,
    service, statistics, floors."""
    uid = unique("p6")
    bury_q, park_q, dead, exchange = f"{uid}-bury", f"{uid}-park", f"{uid}-dead", f"{uid}-dlx"
    parks = int(total * park_share)
    app = Celery(uid, broker=BROKER_URL, set_as_current=False)
    app.conf.update(
        dlx_redis_url=REDIS_URL,
        dlx_key_prefix=uid,
        dlx_exchange=exchange,
        dlx_service_queue=dead,
        dlx_queues={
            bury_q: {"max_requeues": 0, "max_parks": 0},
            park_q: {"max_requeues": 0, "backoff": [3600]},
        },
    )
    if prefetch is not None:
        app.conf.dlx_service_prefetch = prefetch
    runtime = get_runtime(app)
    client = redis.Redis.from_url(REDIS_URL)
    with Connection(BROKER_URL) as conn, scratch_queues(conn) as scratch:
        scratch.extend([bury_q, park_q, dead, f"exchange:{exchange}"])
        scratch.extend([f"exchange:{bury_q}", f"exchange:{park_q}"])
        channel = conn.channel()
        for queue in (bury_q, park_q):
            dlx_queue(queue, dlx=exchange, service=dead)(channel).declare()
        fill(conn, bury_q, total - parks, body_size)
        fill(conn, park_q, parks, body_size)
        try:
            broker_s = broker_dead_letters(conn, [bury_q, park_q], dead, total)
            service_s, stats = service_run(app, total, instances)
            buried = obituaries.count(runtime)
            parked = runtime.store.count()
            assert (buried, parked) == (total - parks, parks), (buried, parked)
            assert depth(conn, dead) == 0
            floors: list[float] = []
            if floor_prefetch is not None:
                batch = max(1, min(BATCH_LIMIT, floor_prefetch // (SETTLERS + 1)))
                for prefix in (None, "{" + uid + "}"):
                    fill(conn, bury_q, total - parks, body_size)
                    fill(conn, park_q, parks, body_size)
                    broker_dead_letters(conn, [bury_q, park_q], dead, total)  # untimed refill
                    floor_s = floor_run(dead, total, floor_prefetch, batch, prefix)
                    assert depth(conn, dead) == 0
                    floors.append(total / floor_s)
        finally:
            delete_keys(client, uid)
            runtime.reset_publisher()
    return total / broker_s, total / service_s, stats, floors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000, help="dead letters per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--park-share", type=float, default=0.5, help="share parked, rest buried")
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--services", default="1,2", help="DLX service processes, one row each")
    parser.add_argument(
        "--prefetch", type=int, default=None, help="dlx_service_prefetch (default: the setting's)"
    )
    parser.add_argument(
        "--no-floor",
        action="store_true",
        help="skip the floors (bare py-amqp consumer, + minimal Redis writes)",
    )
    args = parser.parse_args()
    counts = [int(c) for c in args.services.split(",")]
    prefetch = args.prefetch or int(load_config({}).service_prefetch)
    say(
        f"P6 DLX service vs. broker dead-lettering: {args.messages:,} dead letters per round, "
        f"{args.park_share:.0%} parked, prefetch {prefetch}"
        f"{'' if args.prefetch else ' (the default)'}, load {load()}"
    )
    ratios: dict[int, list[float]] = {c: [] for c in counts}
    broker_rates: dict[int, list[float]] = {c: [] for c in counts}
    service_rates: dict[int, list[float]] = {c: [] for c in counts}
    floor_names = ("bare py-amqp consumer", "bare py-amqp consumer + minimal Redis writes")
    floor_ratios: list[list[float]] = [[] for _ in floor_names]
    floor_rates: list[list[float]] = [[] for _ in floor_names]
    for n in range(1, args.rounds + 1):
        for count in counts:
            with_floors = not args.no_floor and count == counts[0]
            broker_rate, service_rate, stats, floors = one_round(
                args.messages,
                args.park_share,
                args.body_size,
                count,
                args.prefetch,
                prefetch if with_floors else None,
            )
            ratios[count].append(service_rate / broker_rate)
            broker_rates[count].append(broker_rate)
            service_rates[count].append(service_rate)
            round_line(
                f"{count} service process(es)",
                n,
                f"broker dead-letters {broker_rate:,.0f}/s, service handles {service_rate:,.0f}/s "
                f"({stats['batches']} batches, {stats['buried']} buried, {stats['parked']} parked) "
                f"-> {service_rate / broker_rate:.2f}x",
            )
            for i, rate in enumerate(floors):
                floor_ratios[i].append(rate / broker_rate)
                floor_rates[i].append(rate)
            if floors:
                bare, writes = floors
                round_line(
                    "floor",
                    n,
                    f"bare py-amqp consumer {bare:,.0f}/s -> {bare / broker_rate:.2f}x of the "
                    f"broker; + minimal Redis writes {writes:,.0f}/s -> "
                    f"{writes / broker_rate:.2f}x",
                )
    for count in counts:
        say(
            f"{count} process(es): median broker {median(broker_rates[count]):,.0f}/s, service "
            f"{median(service_rates[count]):,.0f}/s"
        )
        say(
            paired_ratio_line(
                f"P6 DLX service ({count} process(es)) / broker", ratios[count], TARGET
            )
        )
        ratio = median(ratios[count])
        summary(
            "P6",
            f"DLX service vs. the broker's own dead-lettering, {count} service process"
            f"{'es' if count > 1 else ''}, prefetch {prefetch}",
            f">= {TARGET}x" if count == 1 else "measured (scaling)",
            f"{ratio:.2f}x ({rounds_list(ratios[count])}); broker "
            f"{median(broker_rates[count]):,.0f}/s, service {median(service_rates[count]):,.0f}/s",
            ("met" if ratio >= TARGET else "not met") if count == 1 else "measured",
        )
    for name, f_ratios, rates in zip(floor_names, floor_ratios, floor_rates, strict=True):
        if f_ratios:
            say(
                f"RATIO P6 floor, {name} / broker: {median(f_ratios):.2f}x median of per-round "
                f"ratios ({', '.join(f'{r:.2f}' for r in f_ratios)}); {median(rates):,.0f}/s, "
                f"prefetch {prefetch} (floor, no target)"
            )


if __name__ == "__main__":
    main()
