"""Per-item costs for the capacity model of docs/operations.md (issue 24, item 5).

Starts a private Redis (a free port, a temp dir, no persistence) so nothing else counts, and runs
real fates through a real Celery worker (threads pool) and the DLX service on the shared
RabbitMQ (unique queue names), then reports:

- bytes per parked retry and per obituary, with a 1 KiB and a 10 KiB payload: ``MEMORY USAGE``
  summed over the keys of the prefix, before and after, divided by the messages (the history
  stream and counters counted apart);
- Redis commands per failure for each fate (requeued, parked, buried, drained), from ``MONITOR``:
  commands clients sent (pipelined ones counted each) and commands Lua scripts ran. The script's
  own polling (``ZCARD`` for parks and burials, ``XRANGE`` for requeues) is in the client counts
  at 0.1-0.3 per item; the per-command breakdown shows it apart.

    .venv/bin/python benchmarks/capacity.py [--messages 200] [--json]

Takes about a minute on the 2-core development machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis  # noqa: E402
from _common import PrivateRedis  # noqa: E402
from celery import Celery  # noqa: E402
from celery.contrib.testing.worker import start_worker  # noqa: E402
from kombu import Connection  # noqa: E402

import celery_dlx  # noqa: E402
from celery_dlx import Bury, Park, Requeue  # noqa: E402
from celery_dlx.drain.core import run_drain  # noqa: E402
from celery_dlx.fates import now_ms  # noqa: E402
from celery_dlx.message.parked import ParkedMessage  # noqa: E402
from celery_dlx.ops import obituaries  # noqa: E402
from celery_dlx.service.loop import DLXService  # noqa: E402
from celery_dlx.wiring.runtime import get_runtime  # noqa: E402

BROKER_URL = "amqp://guest:guest@127.0.0.1:5672//"


def key_bytes(client: redis.Redis, prefix: str) -> dict[str, int]:
    """``MEMORY USAGE`` (exact) per kind of key of ``prefix``."""
    out: Counter[str] = Counter()
    for key in client.scan_iter(match="{" + prefix + "*", count=1000):
        name = key.decode()
        kind = name.split("}", 1)[1].split(":")[1] if "}:" in name else name
        out[kind] += int(client.memory_usage(key, samples=0) or 0)
    return dict(out)


class Monitor:
    """Counts the commands Redis runs while the block lasts, by origin (client or Lua)."""

    def __init__(self, client: redis.Redis) -> None:
        self.client = client
        self.counts: Counter[str] = Counter()
        self.commands: Counter[str] = Counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with self.client.monitor() as m:
            self._ready.set()
            while not self._stop.is_set():
                try:
                    cmd = m.next_command()
                except Exception:
                    return
                text = str(cmd.get("command", ""))
                if "CAPACITY-MARK" in text:
                    if "end" in text:
                        return
                    continue
                origin = "lua" if cmd.get("client_type") == "lua" else "client"
                self.counts[origin] += 1
                self.commands[f"{origin}:{text.split(' ', 1)[0].upper()}"] += 1

    def __enter__(self) -> Monitor:
        self._ready = threading.Event()
        self._thread.start()
        self._ready.wait(5)
        time.sleep(0.2)
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.echo("CAPACITY-MARK end")
        self._thread.join(10)
        self._stop.set()


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def history_fates(client: redis.Redis, prefix: str) -> Counter[str]:
    rows = client.xrange("{" + prefix + "}:history")
    return Counter(f[b"fate"].decode() for _, f in rows if b"fate" in f)


def run(messages: int) -> dict[str, Any]:
    private = PrivateRedis()
    uid = uuid.uuid4().hex[:8]
    prefix = f"cap-{uid}"
    app = Celery(f"capacity-{uid}", broker=BROKER_URL, set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(
        task_default_queue=f"cap-work-{uid}",
        dlx_enabled=True,
        dlx_redis_url=private.url,
        dlx_key_prefix=prefix,
        dlx_exchange=f"cap-dlx-{uid}",
        dlx_service_queue=f"cap-dead-{uid}",
        dlx_drain_interval=3600,  # the drain is run by hand, measured apart
        worker_prefetch_multiplier=1,
        task_acks_late=True,
    )
    client = private.client
    results: dict[str, Any] = {"machine": "see docs/operations.md", "messages": messages}

    seen: set[str] = set()

    @app.task(name=f"requeue-{uid}")
    def requeue_once(key: str) -> None:
        if key not in seen:
            seen.add(key)
            raise Requeue("once")

    @app.task(name=f"park-{uid}")
    def park(payload: str, delay: float) -> None:
        raise Park(delay)

    @app.task(name=f"bury-{uid}")
    def bury(payload: str) -> None:
        raise Bury("capacity")

    runtime = get_runtime(app)
    service = DLXService(app)
    svc = threading.Thread(target=service.run, daemon=True)
    svc.start()
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=1,
            perform_ping_check=False,
            loglevel="WARNING",
            shutdown_timeout=30.0,
        ):
            time.sleep(1.0)  # the worker's and the service's start-up commands are not counted
            for size in (1024, 10 * 1024):
                payload = "x" * size
                label = f"{size // 1024}KiB"
                # parked (for an hour): bytes and commands
                before = key_bytes(client, prefix)
                with Monitor(redis.Redis(port=private.port)) as mon:
                    for _ in range(messages):
                        park.delay(payload, 3600)
                    wait(lambda: runtime.parking.count() >= messages, 120, "parks")
                after = key_bytes(client, prefix)
                results[f"parked_{label}"] = {
                    "bytes_per_item": (after.get("parked", 0) - before.get("parked", 0)) / messages,
                    "history_bytes_per_item": (after.get("history", 0) - before.get("history", 0))
                    / messages,
                    "client_commands_per_item": mon.counts["client"] / messages,
                    "lua_commands_per_item": mon.counts["lua"] / messages,
                    "commands": dict(mon.commands),
                }
                # drained: retries parked straight into the store (due now) for a queue with no
                # consumer, republished by run_drain
                sink = f"cap-sink-{uid}"
                with Connection(BROKER_URL) as conn:
                    conn.default_channel.queue_declare(sink, durable=True)
                due = [
                    ParkedMessage(f"d{i}-{size}", 1, sink, payload.encode(), due_ms=now_ms() - 1)
                    for i in range(messages)
                ]
                runtime.parking.park_many(due)
                with Monitor(redis.Redis(port=private.port)) as mon:
                    wait(
                        lambda: (
                            run_drain(runtime, budget_seconds=5) is not None
                            and runtime.parking.count()
                            == len(runtime.parking.peek(limit=10 * messages))
                            and runtime.parking.due_count() == 0
                        ),
                        120,
                        "drain",
                    )
                results[f"drained_{label}"] = {
                    "client_commands_per_item": mon.counts["client"] / messages,
                    "lua_commands_per_item": mon.counts["lua"] / messages,
                    "commands": dict(mon.commands),
                }
                with Connection(BROKER_URL) as conn:
                    conn.default_channel.queue_delete(sink)
                runtime.parking.remove([m.entry_id for m in runtime.parking.peek(limit=messages)])
                # buried
                before = key_bytes(client, prefix)
                count0 = obituaries.count(runtime)
                with Monitor(redis.Redis(port=private.port)) as mon:
                    for _ in range(messages):
                        bury.delay(payload)
                    target = count0 + messages
                    wait(lambda: obituaries.count(runtime) >= target, 120, "burials")  # noqa: B023
                    time.sleep(0.5)
                after = key_bytes(client, prefix)
                results[f"buried_{label}"] = {
                    "bytes_per_item": (after.get("graveyard", 0) - before.get("graveyard", 0))
                    / messages,
                    "history_bytes_per_item": (after.get("history", 0) - before.get("history", 0))
                    / messages,
                    "client_commands_per_item": mon.counts["client"] / messages,
                    "lua_commands_per_item": mon.counts["lua"] / messages,
                    "commands": dict(mon.commands),
                }
            # requeued (once, then done)
            with Monitor(redis.Redis(port=private.port)) as mon:
                n0 = history_fates(client, prefix)["requeued"]
                for i in range(messages):
                    requeue_once.delay(f"r{i}")
                wait(
                    lambda: history_fates(client, prefix)["requeued"] >= n0 + messages,
                    120,
                    "requeues",
                )
                time.sleep(0.5)
            results["requeued"] = {
                "client_commands_per_item": mon.counts["client"] / messages,
                "lua_commands_per_item": mon.counts["lua"] / messages,
                "commands": dict(mon.commands),
            }
    finally:
        service.stop()
        svc.join(30)
        with Connection(BROKER_URL) as conn:
            channel = conn.channel()
            for name in (app.conf.task_default_queue, app.conf.dlx_service_queue):
                try:
                    channel.queue_delete(name)
                except Exception:
                    channel = conn.channel()
            with contextlib.suppress(Exception):
                channel.exchange_delete(app.conf.dlx_exchange)
        private.stop()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results = run(args.messages)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for name, row in results.items():
        if not isinstance(row, dict):
            continue
        line = ", ".join(f"{k} {v:,.1f}" for k, v in row.items() if isinstance(v, float | int))
        print(f"{name}: {line}")
        print(
            "    "
            + ", ".join(f"{k} {v / args.messages:.2f}" for k, v in sorted(row["commands"].items()))
        )


if __name__ == "__main__":
    main()
