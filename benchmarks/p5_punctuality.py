"""P5: how late parked retries arrive, with the drain run by a real ``celery worker -B``.

The script starts ``celery -A p5_punctuality worker -B --pool solo`` on the real broker (this
module's ``app``, with the drain registered by ``register_drain_task`` and scheduled by
``beat_entry`` every ``dlx_drain_interval`` seconds), waits until a probe retry comes through,
parks ``--messages`` retries with due times spread evenly over ``--spread`` seconds, consumes the
failed queue and measures each retry's lateness at arrival (arrival time - due time). Beat is real,
not emulated. Target: p99 <= interval + 100 ms.

Run: ``.venv/bin/python benchmarks/p5_punctuality.py [--messages 3000] [--spread 20]``
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import (
    BROKER_URL,
    REDIS_URL,
    ROOT,
    delete_keys,
    limit_line,
    load,
    median,
    percentile,
    rounds_list,
    scratch_queues,
    summary,
    unique,
)
from celery import Celery
from kombu import Connection, Consumer, Queue

from celery_dlx.drain.core import beat_entry, register_drain_task
from celery_dlx.fates import now_ms
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.policy.config import load_config
from celery_dlx.wiring.runtime import get_runtime

#: Header carrying a bench retry's due time (epoch ms), read at arrival.
DUE_HEADER = "bench-due-ms"
#: Slack over the interval allowed at p99.
SLACK_MS = 100.0


def make_app(prefix: str, interval: float) -> Celery:
    """The worker's app: the drain registered and scheduled, ticks on a queue of their own."""
    app = Celery("bench_p5", broker=BROKER_URL, set_as_current=False)
    app.conf.update(
        dlx_redis_url=REDIS_URL,
        dlx_key_prefix=prefix,
        dlx_drain_interval=interval,
        task_default_queue=f"{prefix}-ticks",
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
    )
    app.conf.beat_schedule = beat_entry(load_config(app.conf))
    register_drain_task(app)
    return app


if os.environ.get("DLX_P5_PREFIX"):  # imported by the celery worker this script starts
    app = make_app(os.environ["DLX_P5_PREFIX"], float(os.environ["DLX_P5_INTERVAL"]))


def start_worker(prefix: str, interval: float, workdir: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "DLX_P5_PREFIX": prefix,
        "DLX_P5_INTERVAL": str(interval),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "benchmarks"), str(ROOT)]),
    }
    celery = Path(sys.executable).with_name("celery")
    command = [
        str(celery),
        "-A",
        "p5_punctuality",
        "worker",
        "-B",
        "--pool",
        "solo",
        "-Q",
        f"{prefix}-ticks",
        "-s",
        str(workdir / "beat-schedule"),
        "--loglevel",
        "WARNING",
        "--without-gossip",
        "--without-mingle",
        "--without-heartbeat",
    ]
    log = (workdir / "worker.log").open("wb")
    return subprocess.Popen(
        command, env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )


def stop_worker(worker: subprocess.Popen[bytes]) -> None:
    """Stop the worker and its embedded beat (the process group this script started)."""
    if worker.poll() is not None:
        return
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)


def park(runtime: Any, queue: str, message_id: str, due: int) -> None:
    runtime.store.park(
        ParkedMessage(
            message_id=message_id,
            attempt=1,
            queue=queue,
            body=b'[[42], {}, {"callbacks": null}]',
            headers={"task": "proj.tasks.retry_me", "id": message_id, DUE_HEADER: due},
            properties={"content_type": "application/json", "delivery_mode": 2},
            due_ms=due,
            task="proj.tasks.retry_me",
        )
    )


def collect(conn: Connection, queue: str, expected: int, deadline: float) -> dict[str, float]:
    """Consume ``queue`` until ``expected`` distinct retries arrived; message id -> lateness ms."""
    lateness: dict[str, float] = {}

    def on_message(message: Any) -> None:
        arrived = time.time() * 1000.0
        headers = message.headers
        lateness.setdefault(str(headers["id"]), arrived - float(headers[DUE_HEADER]))

    with Consumer(conn, queues=[Queue(queue, no_declare=True)], on_message=on_message, no_ack=True):
        while len(lateness) < expected and time.monotonic() < deadline:
            try:
                conn.drain_events(timeout=1.0)
            except TimeoutError:
                continue
    return lateness


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=3000)
    parser.add_argument("--spread", type=float, default=20.0, help="seconds the due times span")
    parser.add_argument("--interval", type=float, default=1.0, help="dlx_drain_interval")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    limit = args.interval * 1000.0 + SLACK_MS
    p99s, maxes = [], []
    for n in range(1, args.rounds + 1):
        values = one_round(args)
        p99s.append(percentile(values, 99))
        maxes.append(max(values))
        print(
            f"round {n}: lateness p99 {p99s[-1]:.0f} ms, max {maxes[-1]:.0f} ms  [load {load()}]",
            flush=True,
        )
    print(limit_line("P5 lateness p99 (median of rounds)", median(p99s), limit, " ms"))
    summary(
        "P5",
        f"retry lateness p99, {args.messages:,} retries over {args.spread:.0f} s, drain every "
        f"{args.interval:g} s",
        f"<= {limit:,.0f} ms",
        f"p99 {median(p99s):.0f} ms ({rounds_list(p99s, '{:.0f}')}), max {median(maxes):.0f} ms",
        "met" if median(p99s) <= limit else "not met",
    )


def one_round(args: argparse.Namespace) -> list[float]:
    """One worker, one batch of parked retries; their lateness at arrival (ms)."""
    prefix = unique("bench-p5")
    queue = f"{prefix}-work"
    runtime = get_runtime(make_app(prefix, args.interval))
    limit = args.interval * 1000.0 + SLACK_MS
    print(
        f"P5 punctuality: {args.messages} retries due over {args.spread:.0f}s, drained by a real "
        f"celery worker -B (solo pool), dlx_drain_interval={args.interval}s"
    )
    with (
        tempfile.TemporaryDirectory(prefix="p5-") as tmp,
        Connection(BROKER_URL) as conn,
        scratch_queues(conn) as queues,
    ):
        channel = conn.channel()
        channel.queue_declare(queue, durable=True, auto_delete=False)
        channel.close()
        queues += [queue, f"{prefix}-ticks"]
        worker = start_worker(prefix, args.interval, Path(tmp))
        try:
            started = time.monotonic()
            park(runtime, queue, "probe", now_ms())
            if not collect(conn, queue, 1, time.monotonic() + 120):
                raise SystemExit("worker never drained the probe:\n" + worker_log(tmp))
            print(f"worker up, probe drained after {time.monotonic() - started:.1f}s")
            first_due = now_ms() + 2000
            step = args.spread * 1000.0 / args.messages
            for i in range(args.messages):
                park(runtime, queue, f"r{i}", first_due + int(i * step))
            if now_ms() >= first_due:
                print("warning: parking took longer than the 2 s head start")
            deadline = time.monotonic() + args.spread + 60
            lateness = collect(conn, queue, args.messages, deadline)
        finally:
            stop_worker(worker)
            leftover = runtime.store.count()
            delete_keys(runtime.redis, prefix)
        if len(lateness) < args.messages:
            raise SystemExit(
                f"only {len(lateness)} of {args.messages} retries arrived ({leftover} still parked)"
                f":\n{worker_log(tmp)}"
            )
    values = list(lateness.values())
    print(f"arrived: {len(values)} of {args.messages}, {leftover} left parked")
    print(
        "lateness at arrival (ms): "
        + ", ".join(
            f"{name} {percentile(values, pct):.0f}"
            for name, pct in (("min", 0), ("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))
        )
    )
    print(limit_line("P5 lateness p99", percentile(values, 99), limit, " ms"), flush=True)
    return values


def worker_log(tmp: str) -> str:
    path = Path(tmp) / "worker.log"
    return path.read_text(errors="replace")[-4000:] if path.exists() else "(no worker log)"


if __name__ == "__main__":
    main()
