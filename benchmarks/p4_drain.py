"""P4: how fast the drain republishes due parked retries, against raw kombu publishing.

Each round publishes N copies of one realistic parked Celery message (protocol 2 headers plus
celery_dlx's attempt headers, a JSON body of ``--body-size`` bytes, persistent, to a durable
queue) twice:

- baseline: ``kombu.Producer.publish`` without confirms, straight to the queue;
- drain: the same messages parked in Redis, all due, republished by ``run_drain`` (claim, publish
  with pipelined confirms, delete after confirm, history and counters per message).

It also times a loop of ``drain_once`` (one batch at a time, no overlap) for reference. Every
phase checks that the queue then holds exactly N messages. The raw side stops its clock when the
broker holds all N (the drain's confirms wait for the same). The ratio is the median of the
rounds' drain/raw ratios (target >= 0.4x).

Run: ``.venv/bin/python benchmarks/p4_drain.py [--messages 30000] [--rounds 3]``
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from _common import (
    BROKER_URL,
    REDIS_URL,
    delete_keys,
    load,
    median,
    paired_ratio_line,
    rounds_list,
    scratch_queues,
    summary,
    unique,
)
from celery import Celery
from kombu import Connection, Producer

from celery_dlx.drain.core import drain_once, run_drain
from celery_dlx.fates import now_ms
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.wiring.runtime import Runtime, get_runtime

TARGET = 0.4


def message_parts(
    queue: str, index: int, body_size: int
) -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    """Body, headers and properties of one parked Celery task message."""
    task_id = f"{index:08d}-bench-4a1b-9c2d-{queue[-12:]}"
    body = json.dumps([[index, "x" * max(0, body_size - 80)], {}, {"callbacks": None}]).encode()
    headers: dict[str, Any] = {
        "lang": "py",
        "task": "proj.tasks.charge_card",
        "id": task_id,
        "shadow": None,
        "eta": None,
        "expires": None,
        "group": None,
        "group_index": None,
        "retries": 0,
        "timelimit": [None, None],
        "root_id": task_id,
        "parent_id": None,
        "argsrepr": f"({index}, '...')",
        "kwargsrepr": "{}",
        "origin": "gen4242@bench-host",
        "ignore_result": False,
        "x-dlx-attempt": 3,
        "x-dlx-requeues": 2,
        "x-dlx-parks": 1,
        "x-dlx-history": '[[1700000000000,"requeued","3f2a"],[1700000001000,"parked","3f2a"]]',
        "x-dlx-queue": queue,
        "x-dlx-first-failure-ms": 1700000000000,
        "x-dlx-cause": "3f2a9c0d1e2b4a5f",
        "x-dlx-exc-type": "requests.exceptions.ConnectionError",
        "x-dlx-exc-message": "HTTPSConnectionPool(host='api.example.com', port=443): timed out",
    }
    properties = {
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "correlation_id": task_id,
        "delivery_mode": 2,
    }
    return body, headers, properties


def raw_publish(conn: Connection, queue: str, n: int, body_size: int) -> tuple[float, float]:
    """Kombu ``Producer.publish`` (no confirms) of N messages: (per second, CPU us per message)."""
    channel = conn.channel()
    producer = Producer(channel)
    parts = [message_parts(queue, i, body_size) for i in range(n)]
    cpu = time.process_time()
    start = time.perf_counter()
    for body, headers, props in parts:
        producer.publish(
            body,
            routing_key=queue,
            exchange="",
            headers=headers,
            declare=[],
            retry=False,
            **props,
        )
    # The broker must hold them all before the clock stops, as the drain's confirms ensure.
    while channel.queue_declare(queue, passive=True).message_count < n:
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu
    channel.close()
    return n / elapsed, cpu / n * 1e6


def park_all(runtime: Runtime, queue: str, n: int, body_size: int) -> float:
    """Park N due messages; returns parks per second."""
    store = runtime.store
    due = now_ms() - 1000
    start = time.perf_counter()
    for i in range(n):
        body, headers, props = message_parts(queue, i, body_size)
        store.park(
            ParkedMessage(
                message_id=headers["id"],
                attempt=3,
                queue=queue,
                body=body,
                headers=headers,
                properties=props,
                due_ms=due,
                task=headers["task"],
                cause=headers["x-dlx-cause"],
            )
        )
    return n / (time.perf_counter() - start)


def timed_drain(runtime: Runtime, pipelined: bool) -> tuple[float, float]:
    """Drain the store empty; returns (messages per second, CPU us per message)."""
    published = 0
    cpu = time.process_time()
    start = time.perf_counter()
    while True:
        result = run_drain(runtime, budget_seconds=3600) if pipelined else drain_once(runtime)
        published += result.published
        if result.failed:
            raise SystemExit(f"drain failed: {result}")
        if result.claimed == 0:
            break
    elapsed = time.perf_counter() - start
    return published / elapsed, (time.process_time() - cpu) / max(published, 1) * 1e6


def check_and_purge(conn: Connection, queue: str, n: int, what: str) -> None:
    channel = conn.channel()
    count = channel.queue_declare(queue, passive=True).message_count
    channel.queue_purge(queue)
    channel.close()
    if count != n:
        raise SystemExit(f"{what}: queue holds {count} messages, expected {n}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=30000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body-size", type=int, default=512)
    parser.add_argument("--batch", type=int, default=500, help="dlx_drain_batch")
    args = parser.parse_args()
    n = args.messages
    prefix = unique("bench-p4")
    queue = prefix
    app = Celery("bench_p4", broker=BROKER_URL, set_as_current=False)
    app.conf.update(dlx_redis_url=REDIS_URL, dlx_key_prefix=prefix, dlx_drain_batch=args.batch)
    runtime = get_runtime(app)
    print(
        f"P4 drain throughput: {n} messages x {args.rounds} rounds, body {args.body_size} B, "
        f"dlx_drain_batch={args.batch}, durable queue, persistent messages"
    )
    raw: list[float] = []
    pipelined: list[float] = []
    sequential: list[float] = []
    parks: list[float] = []
    cpu: dict[str, list[float]] = {"raw": [], "run_drain": []}
    with Connection(BROKER_URL) as conn, scratch_queues(conn) as queues:
        channel = conn.channel()
        channel.queue_declare(queue, durable=True, auto_delete=False)
        channel.close()
        queues.append(queue)
        try:
            for rnd in range(1, args.rounds + 1):
                rate, us = raw_publish(conn, queue, n, args.body_size)
                raw.append(rate)
                cpu["raw"].append(us)
                check_and_purge(conn, queue, n, "raw publish")
                parks.append(park_all(runtime, queue, n, args.body_size))
                rate, us = timed_drain(runtime, pipelined=True)
                pipelined.append(rate)
                cpu["run_drain"].append(us)
                check_and_purge(conn, queue, n, "run_drain")
                park_all(runtime, queue, n, args.body_size)
                rate, _ = timed_drain(runtime, pipelined=False)
                sequential.append(rate)
                check_and_purge(conn, queue, n, "drain_once loop")
                print(
                    f"round {rnd}: raw kombu publish {raw[-1]:,.0f}/s | run_drain "
                    f"{pipelined[-1]:,.0f}/s ({pipelined[-1] / raw[-1]:.2f}x) | drain_once loop "
                    f"{sequential[-1]:,.0f}/s | park {parks[-1]:,.0f}/s  [load {load()}]",
                    flush=True,
                )
        finally:
            runtime.reset_publisher()
            delete_keys(runtime.redis, prefix)
    print(f"median raw kombu publish (no confirms): {median(raw):,.0f} msg/s")
    print(f"median run_drain (pipelined):           {median(pipelined):,.0f} msg/s")
    print(f"median drain_once loop (sequential):    {median(sequential):,.0f} msg/s")
    print(f"median park (store.park, one by one):   {median(parks):,.0f} msg/s")
    print(
        f"this process's CPU per message: raw publish {median(cpu['raw']):.0f} us, "
        f"run_drain {median(cpu['run_drain']):.0f} us"
    )
    ratios = [d / r for d, r in zip(pipelined, raw, strict=True)]
    print(paired_ratio_line("P4 run_drain / raw kombu publish", ratios, TARGET))
    summary(
        "P4",
        f"due retries republished per second by run_drain vs. raw kombu publish ({n:,} messages)",
        f">= {TARGET}x",
        f"{median(ratios):.2f}x ({rounds_list(ratios)}); drain {median(pipelined):,.0f}/s, "
        f"raw {median(raw):,.0f}/s",
        "met" if median(ratios) >= TARGET else "not met",
    )


if __name__ == "__main__":
    main()
