"""P9 sizing: Redis memory per parked retry, per obituary and per history entry, measured.

Starts its own ``redis-server`` (no persistence: memory is what is measured) on a free port,
reads ``INFO memory`` (``used_memory``), parks N copies of a realistic Celery task message
(protocol 2 headers as Celery writes them, celery_dlx's attempt headers after one requeue and
one park, a JSON body of ``--body-bytes``), reads it again, and divides. Then the same for N
obituaries (the graveyard with its indexes, one cause) and for the failure history stream.
Parking is idempotent per message id and attempt, so every message gets its own id.

Run: .venv/bin/python benchmarks/p9_sizing.py [--parked 100000] [--body-bytes 1024 ...]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import summary
from celery import Celery

from celery_dlx.fates import BURIED, PARKED, REQUEUED, FateEvent
from celery_dlx.message.headers import DLXState, clean_headers
from celery_dlx.message.names import Keys
from celery_dlx.message.obituary import Attempt, Obituary
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.service.settle import buried_event
from celery_dlx.store.graveyard import Graveyard
from celery_dlx.store.history import History
from celery_dlx.store.parking import ParkingStore
from tests.chaos.servers import own_redis

BATCH = 1000
MIB = 1024 * 1024


def celery_message(app: Celery, body_bytes: int, i: int) -> tuple[dict[str, Any], bytes, dict]:
    """Headers, body and properties of a Celery task message, as a producer sends it."""
    task_id = str(uuid.uuid4())
    payload = {"order_id": f"o-{i}", "note": "x" * max(0, body_bytes - 120)}
    message = app.amqp.as_task_v2(task_id, "shop.tasks.charge", args=(i,), kwargs=payload)
    body = json.dumps(message.body, separators=(",", ":")).encode()
    properties = {
        "correlation_id": task_id,
        "reply_to": "",
        "content_type": "application/json",
        "content_encoding": "utf-8",
        "delivery_mode": 2,
        "priority": 0,
    }
    return dict(message.headers), body, properties


def after_two_failures(at: int) -> DLXState:
    state = DLXState().after_failure(
        fate=REQUEUED,
        at_ms=at - 2000,
        cause="3f2a9c01d4e5b6a7",
        queue="shop.charge",
        exc_type="requests.exceptions.ConnectionError",
        exc_message="gateway unavailable",
    )
    return state.after_failure(
        fate=PARKED,
        at_ms=at,
        cause="3f2a9c01d4e5b6a7",
        queue="shop.charge",
        exc_type="requests.exceptions.ConnectionError",
        exc_message="gateway unavailable",
    )


def used(client: Any) -> int:
    return int(client.info("memory")["used_memory"])


def measure_parked(client: Any, app: Celery, n: int, body_bytes: int) -> dict[str, float]:
    store = ParkingStore(client, Keys(f"p9-{uuid.uuid4().hex[:6]}"))
    now = int(time.time() * 1000)
    state = after_two_failures(now)
    before = used(client)
    sample = 0
    for start in range(0, n, BATCH):
        batch = []
        for i in range(start, min(n, start + BATCH)):
            headers, body, props = celery_message(app, body_bytes, i)
            sample = sample or len(body) + len(json.dumps(headers, default=str))
            batch.append(
                ParkedMessage(
                    message_id=headers["id"],
                    attempt=state.attempt,
                    queue="shop.charge",
                    body=body,
                    headers=clean_headers(headers, state),
                    properties=props,
                    due_ms=now + 3_600_000 + i,
                    parked_ms=now,
                    task="shop.tasks.charge",
                    cause="3f2a9c01d4e5b6a7",
                )
            )
        store.park_many(batch)
    assert store.count() == n
    delta = used(client) - before
    return {"n": n, "bytes_each": delta / n, "total_mib": delta / MIB, "message_bytes": sample}


def measure_graveyard(client: Any, n: int, body_bytes: int) -> dict[str, float]:
    keys = Keys(f"p9-{uuid.uuid4().hex[:6]}")
    yard = Graveyard(client, keys)
    now = int(time.time() * 1000)
    traceback = (
        'Traceback (most recent call last):\n  File "shop/tasks.py", line 42, in charge\n' * 4
    )
    before = used(client)
    for start in range(0, n, BATCH):
        items = []
        for i in range(start, min(n, start + BATCH)):
            ob = Obituary.from_fields(
                id=uuid.uuid4().hex[:20],
                message_id=str(uuid.uuid4()),
                queue="shop.charge",
                reason="retry budget spent: 2 requeues, 2 parks",
                buried_ms=now + i,
                task="shop.tasks.charge",
                origin="celery",
                cause="3f2a9c01d4e5b6a7",
                exc_type="shop.errors.Declined",
                exc_message=f"card declined for order o-{i}",
                traceback=traceback,
                importance="notify",
                attempt=5,
                attempts=[Attempt(now - 5000 + k, "requeued", "3f2a9c01d4e5b6a7") for k in range(4)]
                + [Attempt(now, BURIED, "3f2a9c01d4e5b6a7")],
                headers={"task": "shop.tasks.charge", "id": f"t-{i}", "x-dlx-attempt": 4},
                properties={"content_type": "application/json", "delivery_mode": 2},
                payload=b"x" * body_bytes,
                payload_size=body_bytes,
            )
            items.append((ob, buried_event(ob)))
        yard.write_many(items)
    history_bytes = client.memory_usage(keys.history) or 0
    delta = used(client) - before
    return {
        "n": n,
        "bytes_each": delta / n,
        "total_mib": delta / MIB,
        "of_which_history_each": history_bytes / n,
    }


def measure_history(client: Any, n: int) -> dict[str, float]:
    history = History(client, Keys(f"p9-{uuid.uuid4().hex[:6]}"))
    now = int(time.time() * 1000)
    before = used(client)
    for start in range(0, n, BATCH):
        history.append_many(
            FateEvent.from_fields(
                fate=PARKED,
                queue="shop.charge",
                message_id=str(uuid.uuid4()),
                attempt=2,
                task="shop.tasks.charge",
                cause="3f2a9c01d4e5b6a7",
                exc_type="requests.exceptions.ConnectionError",
                exc_message="gateway unavailable",
                reason="parked: attempt 2 of 5",
                delay=20.0,
                importance="notify",
                first_failure_ms=now - 2000,
                at_ms=now + i,
            )
            for i in range(start, min(n, start + BATCH))
        )
    delta = used(client) - before
    return {"n": n, "bytes_each": delta / n, "total_mib": delta / MIB}


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--parked", type=int, default=100_000)
    p.add_argument("--obituaries", type=int, default=20_000)
    p.add_argument("--history", type=int, default=100_000)
    p.add_argument("--body-bytes", type=int, nargs="+", default=[256, 1024, 4096])
    args = p.parse_args(argv)
    app = Celery("p9", set_as_current=False)
    with (
        tempfile.TemporaryDirectory(prefix="p9-") as tmp,
        own_redis(tmp, appendfsync="no", args=["--appendonly", "no"]) as server,
    ):
        client = server.client()
        info = client.info("server")
        print(f"redis {info['redis_version']}, allocator {client.info('memory')['mem_allocator']}")
        parked = []
        for size in args.body_bytes:
            r = measure_parked(client, app, args.parked, size)
            parked.append(f"{r['bytes_each']:,.0f} B with {r['message_bytes']:,.0f} B of message")
            print(
                f"SIZE parked retry, {size} B args ({r['message_bytes']:.0f} B body+headers as "
                f"JSON), n={r['n']:,}: {r['bytes_each']:,.0f} B each, {r['total_mib']:,.1f} MiB"
            )
        obituary = measure_graveyard(client, args.obituaries, 1024)
        r = obituary
        print(
            f"SIZE obituary, 1024 B payload with traceback and indexes, n={r['n']:,}: "
            f"{r['bytes_each']:,.0f} B each (history entry {r['of_which_history_each']:,.0f} B "
            f"of it), {r['total_mib']:,.1f} MiB"
        )
        r = measure_history(client, args.history)
        print(
            f"SIZE history entry (a fate change), n={r['n']:,}: {r['bytes_each']:,.0f} B each, "
            f"{r['total_mib']:,.1f} MiB"
        )
    summary(
        "P9",
        "Redis memory per parked retry, obituary (1 KB payload), history entry "
        "(sizing; deterministic, one run)",
        "measured",
        f"parked: {'; '.join(parked)}; obituary {obituary['bytes_each']:,.0f} B; history entry "
        f"{r['bytes_each']:,.0f} B",
        "measured",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
