"""P11 console: p95 of the causes and group pages with 100k obituaries in the graveyard.

Starts its own ``redis-server`` (so 100k obituaries never touch the shared Redis), writes
``--obituaries`` obituaries straight through :class:`celery_dlx.store.graveyard.Graveyard`'s
writer in pipelined batches (realistic Celery task messages, ``--causes`` causes with a skewed
distribution: the biggest holds about half), starts the console (a real uvicorn server), then
times ``--requests`` requests of each page from a client on the same machine:

* ``/causes`` (first page of 50 causes, most recently seen first),
* ``/group?cause=<biggest>`` (first page of 50 obituaries, payload previews decoded),
* ``/group?cause=<biggest>&offset=<deep>`` (a page 40,000 obituaries down),
* ``/group?cause=<biggest>&task=<task>`` (a task filter: ids checked against the task's index),
* ``/group?cause=<biggest>&task=no.such.task`` (the worst case: 10,000 ids checked for nothing),
* ``/api/obituary?id=...`` and ``/obituary?id=...`` (one obituary decoded).

Target: p95 under 300 ms for the causes and group pages.

Run: .venv/bin/python benchmarks/p11_console.py [--obituaries 100000] [--requests 200]
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._common import BROKER_URL, percentile

#: Obituaries written per pipelined round trip.
BATCH = 1000
TARGET_MS = 300.0


def make_obituaries(app: Any, n: int, causes: int, start: int) -> Any:
    from celery_dlx.message.obituary import Attempt, Obituary

    weights = [1.0 / (i + 1) ** 1.2 for i in range(causes)]
    weights[0] = sum(weights[1:])  # the biggest cause holds about half
    names = [f"{uuid.uuid4().hex[:16]}" for _ in range(causes)]
    rng = random.Random(11)
    chosen = rng.choices(range(causes), weights, k=n)
    now = int(time.time() * 1000)
    for i, c in enumerate(chosen):
        task_id = str(uuid.uuid4())
        task = f"shop.tasks.t{c % 40}"
        message = app.amqp.as_task_v2(task_id, task, args=(i,), kwargs={"order_id": f"o-{i}"})
        body = json.dumps(message.body, separators=(",", ":")).encode()
        at = now - (n - i) * 20 - start
        yield Obituary.from_fields(
            id=f"ob-{i}-{task_id[:8]}",
            message_id=task_id,
            queue=f"work-{c % 6}",
            reason="retry budget spent",
            buried_ms=at,
            task=task,
            origin="celery",
            cause=names[c],
            exc_type="shop.errors.BackendDown",
            exc_message=f"backend {c} down after {i % 97} ms",
            traceback="Traceback (most recent call last):\n  ...\nshop.errors.BackendDown\n",
            attempt=5,
            attempts=[Attempt(at - 1000, "parked", names[c]), Attempt(at, "buried", names[c])],
            headers=dict(message.headers),
            properties={"content_type": "application/json", "content_encoding": "utf-8"},
            payload=body,
            payload_size=len(body),
        )


def timed(host: str, port: int, path: str, auth: str, n: int) -> list[float]:
    out = []
    for _ in range(n):
        conn = http.client.HTTPConnection(host, port, timeout=60)
        started = time.perf_counter()
        conn.request("GET", path, headers={"Authorization": auth})
        resp = conn.getresponse()
        resp.read()
        out.append((time.perf_counter() - started) * 1000)
        conn.close()
        if resp.status != 200:
            raise SystemExit(f"{path}: HTTP {resp.status}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--obituaries", type=int, default=100_000)
    parser.add_argument("--causes", type=int, default=200)
    parser.add_argument("--requests", type=int, default=200)
    args = parser.parse_args()

    import base64
    from urllib.parse import urlencode

    from celery import Celery

    import celery_dlx
    from celery_dlx.service.settle import buried_event
    from celery_dlx.store.graveyard import Filters, Graveyard
    from celery_dlx.wiring.runtime import get_runtime
    from celery_dlx_console.console import WebSettings
    from celery_dlx_console.server import Background
    from tests.chaos.servers import own_redis
    from tests.web.helpers import free_port

    with own_redis() as redis_server:
        app = Celery("p11", broker=BROKER_URL, set_as_current=False)
        celery_dlx.install(app)
        app.conf.update(dlx_redis_url=redis_server.url, dlx_key_prefix="p11")
        runtime = get_runtime(app)
        yard = Graveyard(runtime.redis, runtime.keys)
        started = time.perf_counter()
        batch: list[Any] = []
        for ob in make_obituaries(app, args.obituaries, args.causes, 0):
            batch.append((ob, buried_event(ob)))
            if len(batch) == BATCH:
                yard.write_many(batch)
                batch = []
        if batch:
            yard.write_many(batch)
        wrote = time.perf_counter() - started
        count = yard.count()
        used = runtime.redis.info("memory")["used_memory"]
        print(
            f"wrote {count} obituaries in {wrote:.1f}s ({count / wrote:,.0f}/s); "
            f"redis used_memory {used / 1024 / 1024:.0f} MiB"
        )
        groups = sorted(yard.groups(), key=lambda g: -g.count)
        big = groups[0]
        print(f"{len(groups)} causes; the biggest holds {big.count}")
        example = yard.ids(Filters(cause=big.cause), limit=1)[0]
        port = free_port()
        server = Background(runtime, WebSettings(port=port, operators=("op:pw",))).start()
        auth = "Basic " + base64.b64encode(b"op:pw").decode()
        pages = {
            "causes": "/causes",
            "group": "/group?" + urlencode({"cause": big.cause}),
            "group deep": "/group?"
            + urlencode({"cause": big.cause, "offset": min(40_000, big.count - 50)}),
            "group task filter": "/group?"
            + urlencode({"cause": big.cause, "task": big.task or ""}),
            "group filter, no match": "/group?"
            + urlencode({"cause": big.cause, "task": "no.such.task"}),
            "obituary": "/obituary?" + urlencode({"id": example}),
            "api obituary": "/api/obituary?" + urlencode({"id": example}),
        }
        try:
            for path in pages.values():  # warm: templates compiled, scripts loaded
                timed("127.0.0.1", port, path, auth, 3)
            rows = []
            for name, path in pages.items():
                times = timed("127.0.0.1", port, path, auth, args.requests)
                rows.append((name, percentile(times, 50), percentile(times, 95), max(times)))
        finally:
            server.stop()
        print(f"\n{args.requests} requests per page, {count} obituaries, {len(groups)} causes")
        print("| page | p50 ms | p95 ms | max ms | target |")
        print("| --- | --- | --- | --- | --- |")
        for name, p50, p95, top in rows:
            target = (
                f"p95 < {TARGET_MS:.0f} ms: {'met' if p95 < TARGET_MS else 'MISSED'}"
                if name.startswith(("causes", "group"))
                else "-"
            )
            print(f"| {name} | {p50:.1f} | {p95:.1f} | {top:.1f} | {target} |")


if __name__ == "__main__":
    main()
