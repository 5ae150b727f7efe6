"""The two I/O speed tricks against their plain code, counted: ``--part consume`` or ``linger``.

``consume``: the DLX service consumer's chunked socket reads (``celery_dlx.broker.buffered``)
against py-amqp's own transport. A process under valgrind's callgrind connects to the broker
with celery_dlx's frame reader, consumes a queue of P6-shaped dead letters (a 1 KiB JSON body,
two user headers, ``x-death`` and the ``x-first-death-*``/``x-last-death-*`` headers) with
the service's prefetch (1,000) and one ``basic.ack(multiple=True)`` per 333 deliveries, and
waits as ``QueueConsumer.wait`` does: ``drain_events`` and then, with the chunked transport,
every frame already buffered (``drain_buffered``). It runs over ``LOW`` and then ``HIGH``
messages; the difference of the two counts over ``HIGH - LOW`` is one delivery's instructions,
connecting, declaring and shutting down left out. callgrind counts the process's own
instructions: the kernel's work in ``recv`` (nine calls per delivery with py-amqp's transport)
is not in the count.

``linger``: the settler's linger (``celery_dlx.worker.settler.LINGER``) on and off
(``BENCH_EXPERIMENTS=no_linger``) in a prefork worker at ``-c 1`` and ``-c 2``
(``BENCH_CONCURRENCY``), on a P10 failure flood (``p10_intake.py``: ``--tasks`` tasks each
parked once, prefetch 10) and on P1 (``p1_clog.py``: ``--poison`` poison messages ahead of
``--good`` good ones). The workers write to a private Redis this script starts (a free port, no
persistence), whose ``INFO commandstats`` counts the Redis transactions (``EXEC``) and all
commands the worker sends per failure; the drain runs hourly (``BENCH_DRAIN_INTERVAL``) so its
polls do not count. Beside them, secondary and timed: the worker main process's CPU time
(psutil, user + system, all its threads) from its first run to the last failure's park,
divided by the failures (P10) or by all messages (P1). The rounds alternate the settings.

``history``: ``History.write`` (a batch of fate events appended to the history stream, added to
the counters, their retry markers set, one pipeline: one round trip) on the shared Redis, under a
key prefix of its own deleted after. A process under callgrind writes ``LOW`` and then ``HIGH``
batches of ``--batch`` P10-shaped park events; the difference over ``(HIGH - LOW) * batch`` is
one event's instructions of the Python process (Redis's work is not in the count).

``failure``: one handled failure in a solo worker, every process of it counted (as P2 counts a
task, ``p2_instructions.py``), or with ``--pool prefork`` in a prefork worker's main process
alone (``-c 1``: the consumer, the settler thread and its batch writes; the pool child is left
out): ``bench.park_hour`` fails once with a retry due in an hour, so each
message's first run makes a copy of the Celery task message (``celery_copy``) and parks it with
its fate (``park_recorded_many``: one transaction). Over a backlog of ``LOW`` and then ``HIGH``
tasks; the difference over ``HIGH - LOW`` is one failure, start-up and shut-down left out.

``history`` and ``failure`` count this tree and, with ``--compare PATH``, another checkout of
the project round by round (``git worktree add /tmp/plain <commit>``): a trick against its plain
variant.

Run: ``.venv/bin/python benchmarks/tricks_io.py --part consume [--messages 500,2500]
[--rounds 3]``, ``.venv/bin/python benchmarks/tricks_io.py --part linger [--tasks 5000]
[--good 1000 --poison 100] [--concurrency 1,2] [--rounds 3]``, ``.venv/bin/python
benchmarks/tricks_io.py --part history [--batches 20,120] [--batch 2] [--compare PATH]`` or
``.venv/bin/python benchmarks/tricks_io.py --part failure [--tasks 100,400] [--pool prefork]
[--compare PATH]``;
``--json PATH`` writes every figure to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    BROKER_URL,
    REDIS_URL,
    ROOT,
    PrivateRedis,
    callgrind,
    collected,
    delete_keys,
    load,
    median,
    say,
    unique,
)

# -- consume --------------------------------------------------------------------------------------

#: The counted process: argv is ``QUEUE MESSAGES CHUNKED``; imports celery_dlx from PYTHONPATH.
CONSUMER = """
import sys
from kombu import Connection
from celery_dlx.broker.buffered import BufferedTransport, buffered, drain_buffered
from celery_dlx.broker.consume import ack_all
from celery_dlx.broker.frames import tolerant

url, queue, messages, chunked = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
PREFETCH, ACK_EVERY = 1000, 333
conn = Connection(url)
conn = tolerant(buffered(conn) if chunked else conn)
conn.ensure_connection(max_retries=1)
channel = conn.channel()
channel.auto_decode = False
assert isinstance(conn.connection.transport, BufferedTransport) == chunked
channel.basic_qos(0, PREFETCH, False)
inbox = []
channel.basic_consume(queue, callback=inbox.append)
received = 0
while received < messages:
    try:
        conn.drain_events(timeout=30)
    except TimeoutError:
        raise SystemExit(f"no delivery in 30 s after {received + len(inbox)}")
    drain_buffered(conn.connection)  # QueueConsumer.wait: nothing on py-amqp's transport
    if len(inbox) >= ACK_EVERY or received + len(inbox) >= messages:
        assert "x-dlx-wire-headers" in inbox[-1].properties  # read by celery_dlx's frame reader
        ack_all(inbox)
        received += len(inbox)
        inbox.clear()
conn.release()
"""


def fill(queue: str, messages: int) -> None:
    """Declare ``queue`` and publish ``messages`` P6-shaped dead letters to it."""
    from datetime import datetime, timezone

    import amqp
    from kombu import Connection

    when = datetime(2026, 9, 21, 7, 8, 9, tzinfo=timezone.utc)
    with Connection(BROKER_URL) as conn:
        channel = conn.connection.channel()
        channel.queue_declare(queue, auto_delete=False)
        for i in range(messages):
            body = json.dumps({"invoice": i, "customer": f"c-{i % 977}", "pad": "x" * 964})
            death = {
                "count": 1,
                "reason": "rejected",
                "queue": "p6-bury",
                "time": when,
                "exchange": "",
                "routing-keys": ["p6-bury"],
            }
            headers: dict[str, Any] = {
                "source": "billing-go",
                "trace-id": f"{i:016x}",
                "x-death": [death],
            }
            for end in ("first", "last"):
                headers.update(
                    {
                        f"x-{end}-death-exchange": "",
                        f"x-{end}-death-queue": "p6-bury",
                        f"x-{end}-death-reason": "rejected",
                    }
                )
            message = amqp.Message(
                body.encode(),
                application_headers=headers,
                message_id=f"p6-bury-{i}",
                content_type="application/json",
                content_encoding="utf-8",
                delivery_mode=2,
            )
            channel.basic_publish(message, exchange="", routing_key=queue)
        channel.close()


def delete_queue(queue: str) -> None:
    from kombu import Connection

    with Connection(BROKER_URL) as conn:
        channel = conn.connection.channel()
        channel.queue_delete(queue)
        channel.close()


def count_consume(messages: int, chunked: bool) -> int:
    """Instructions of one consumer process over a fresh queue of ``messages`` dead letters."""
    queue = f"tricks-io-{uuid.uuid4().hex[:10]}"
    fill(queue, messages)
    try:
        with tempfile.TemporaryDirectory(prefix="tricks-io-") as logs:
            log = f"{logs}/callgrind.log"
            subprocess.run(
                [
                    *callgrind(log),
                    sys.executable,
                    "-c",
                    CONSUMER,
                    BROKER_URL,
                    queue,
                    str(messages),
                    "1" if chunked else "0",
                ],
                env={**os.environ, "PYTHONPATH": str(ROOT), "PYTHONHASHSEED": "0"},
                cwd="/tmp",
                check=True,
            )
            text = Path(log).read_text()
    finally:
        delete_queue(queue)
    found = collected(text)
    if found is None:
        raise RuntimeError(f"callgrind counted nothing: {text[-500:]}")
    return found


def consume(args: argparse.Namespace) -> dict[str, Any]:
    low, high = (int(n) for n in args.messages.split(","))
    if not 0 <= low < high:
        raise SystemExit("--messages needs LOW,HIGH with 0 <= LOW < HIGH")
    say(
        f"consume: instructions per delivery ({low:,} and {high:,} dead letters, prefetch 1,000), "
        f"load {load()}"
    )
    names = {True: "chunked (BufferedTransport)", False: "py-amqp's TCPTransport"}
    per: dict[bool, list[float]] = {True: [], False: []}
    for n in range(1, args.rounds + 1):
        for chunked in (False, True):
            a, b = count_consume(low, chunked), count_consume(high, chunked)
            per[chunked].append((b - a) / (high - low))
            say(
                f"round {n}: {names[chunked]}: {per[chunked][-1]:,.0f} per delivery "
                f"(runs {a:,} and {b:,})  [load {load()}]"
            )
    plain, chunked_ = median(per[False]), median(per[True])
    for flag, values in per.items():
        listed = ", ".join(f"{v:,.0f}" for v in values)
        say(f"{names[flag]}: median {median(values):,.0f} instructions per delivery ({listed})")
    say(f"chunked / py-amqp: {chunked_ / plain:.3f} (saves {1 - chunked_ / plain:.1%})")
    return {
        "part": "consume",
        "messages": [low, high],
        "py_amqp": per[False],
        "chunked": per[True],
        "saved": 1 - chunked_ / plain,
    }


# -- linger ---------------------------------------------------------------------------------------


def parked(client: Any, uid: str) -> int:
    """Retries parked under the benchmark's key prefix (every shard's ``parked:due``)."""
    keys = list(client.scan_iter(match="{bench-" + uid + "*:parked:due", count=1000))
    return sum(int(client.zcard(k)) for k in keys)


def main_cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def linger_run(
    server: PrivateRedis, bench: str, experiment: str, args: argparse.Namespace
) -> dict[str, float]:
    """One worker over one backlog: Redis commands and main-process CPU per failure."""
    from _workers import bench_worker, cleanup, publish, wait_count

    uid = uuid.uuid4().hex[:10]
    client = server.client
    if bench == "p10":
        failures, total = args.tasks, args.tasks
        publish("dlx", uid, "bench.park_hour", [()] * args.tasks)
        counter = "{bench-" + uid + "}:bench:runs"
    else:
        failures, total = args.poison, args.poison + args.good
        publish(
            "dlx",
            uid,
            "bench.work",
            [(True, args.good)] * args.poison + [(False, args.good)] * args.good,
        )
        counter = "{bench-" + uid + "}:bench:done"
    env = {"BENCH_DRAIN_INTERVAL": "3600"}
    if experiment:
        env["BENCH_EXPERIMENTS"] = experiment
    try:
        before = server.commands()
        with bench_worker("dlx", uid, prefetch=10, extra_env=env) as proc:
            first = "{bench-" + uid + "}:bench:" + ("runs" if bench == "p10" else "first")
            deadline = time.monotonic() + 300
            while not client.exists(first):
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"worker did not start (rc {proc.poll()})")
                time.sleep(0.01)
            cpu0, t0 = main_cpu(proc.pid), time.monotonic()
            wait_count(client, counter, args.good if bench == "p1" else total, 3600, proc)
            deadline = time.monotonic() + 120
            while parked(client, uid) < failures:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{parked(client, uid)} of {failures} parked after 120 s")
                time.sleep(0.01)
            cpu1, t1 = main_cpu(proc.pid), time.monotonic()
        after = server.commands()
    finally:
        cleanup(uid)
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {
        "exec": delta.get("exec", 0) / failures,
        "evalsha": delta.get("evalsha", 0) / failures,
        "commands": sum(delta.values()) / failures,
        "main_cpu_us": (cpu1 - cpu0) / (failures if bench == "p10" else total) * 1e6,
        "seconds": t1 - t0,
    }


def linger(args: argparse.Namespace) -> dict[str, Any]:
    server = PrivateRedis()
    os.environ["DLX_BENCH_REDIS"] = server.url  # the workers' and the publishers' Redis
    import _common

    _common.REDIS_URL = server.url
    results: dict[str, Any] = {"part": "linger", "cells": {}}
    cells = [
        (bench, c, setting)
        for bench in args.benches.split(",")
        for c in args.concurrency.split(",")
        for setting in ("on", "off")
    ]
    say(
        f"linger: P10 {args.tasks:,} parks; P1 {args.poison} poison + {args.good} good; "
        f"Redis on port {server.port}, load {load()}"
    )
    try:
        for n in range(1, args.rounds + 1):
            for bench, c, setting in cells:
                os.environ["BENCH_CONCURRENCY"] = c
                figures = linger_run(server, bench, "no_linger" if setting == "off" else "", args)
                results["cells"].setdefault(f"{bench} -c {c} linger {setting}", []).append(figures)
                say(
                    f"round {n}: {bench} -c {c} linger {setting}: "
                    f"EXEC {figures['exec']:.3f}, EVALSHA {figures['evalsha']:.3f}, "
                    f"commands {figures['commands']:.2f} per failure; main process "
                    f"{figures['main_cpu_us']:,.0f} us CPU per "
                    f"{'failure' if bench == 'p10' else 'message'} "
                    f"({figures['seconds']:.1f}s)  [load {load()}]"
                )
    finally:
        server.stop()
    for name, rows in results["cells"].items():
        medians = {k: median([r[k] for r in rows]) for k in rows[0]}
        results.setdefault("medians", {})[name] = medians
        say(
            f"{name}: median EXEC {medians['exec']:.3f}, EVALSHA {medians['evalsha']:.3f}, "
            f"commands {medians['commands']:.2f} per failure; main process "
            f"{medians['main_cpu_us']:,.0f} us CPU ("
            + ", ".join(f"{r['main_cpu_us']:,.0f}" for r in rows)
            + ")"
        )
    return results


# -- history and failure: a trick against its plain variant, in instructions ---------------------

#: The counted process: argv is ``REDIS_URL PREFIX BATCHES BATCH``; imports celery_dlx from
#: PYTHONPATH.
HISTORY = """
import sys
import redis
from celery_dlx.fates import PARKED, FateEvent
from celery_dlx.message.names import Keys
from celery_dlx.store.history import History

url, prefix, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
history = History(redis.Redis.from_url(url), Keys(prefix))
events = [
    FateEvent.from_fields(
        PARKED, task="bench.park_hour", queue="bench", message_id=f"{i:032x}", attempt=1,
        cause="9f2c4e1a", exc_type="TimeoutError", reason="supplier API rate limited",
        first_failure_ms=1_790_000_000_000, at_ms=1_790_000_000_000 + i, delay=3600.0,
        extra={"lineage": "r0"},
    )
    for i in range(size)
]
for _ in range(batches):
    failed, counters_failed = history.write(events)
    assert failed is None and not counters_failed, (failed, counters_failed)
assert history.length() == batches * size
"""


def count_history(tree: Path, batches: int, size: int) -> int:
    """Instructions of one process writing ``batches`` batches of ``size`` events."""
    import redis

    prefix = unique("tricks-history")
    sizes = (str(batches), str(size))
    try:
        with tempfile.TemporaryDirectory(prefix="tricks-io-") as logs:
            log = f"{logs}/callgrind.log"
            subprocess.run(
                [*callgrind(log), sys.executable, "-c", HISTORY, REDIS_URL, prefix, *sizes],
                env={**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"},
                cwd="/tmp",
                check=True,
            )
            text = Path(log).read_text()
    finally:
        delete_keys(redis.Redis.from_url(REDIS_URL), prefix)
    found = collected(text)
    if found is None:
        raise RuntimeError(f"callgrind counted nothing: {text[-500:]}")
    return found


def count_failures(tree: Path, tasks: int, pool: str = "solo") -> int:
    """Instructions of a worker running ``tree``'s code over ``tasks`` failing tasks, each parked
    once, from start to shut-down: the solo worker's one process, or the prefork worker's main
    process alone (its pool child, which runs the tasks, left out)."""
    import glob
    import signal

    import redis
    from _workers import cleanup, publish, wait_count, worker_command

    uid = unique("tricks-fail")
    publish("dlx", uid, "bench.park_hour", [()] * tasks)
    client = redis.Redis.from_url(REDIS_URL)
    with tempfile.TemporaryDirectory(prefix="tricks-io-") as logs:
        env = {
            **os.environ,
            "BENCH_MODE": "dlx",
            "BENCH_UID": uid,
            "BENCH_PREFETCH": "10",
            "BENCH_CONCURRENCY": "1",
            "BENCH_DRAIN_INTERVAL": "3600",
            "PYTHONPATH": f"{tree}{os.pathsep}{ROOT / 'benchmarks'}",
            "PYTHONHASHSEED": "0",
        }
        proc = subprocess.Popen(
            [*callgrind(f"{logs}/%p.log"), *worker_command("dlx", uid, pool)],
            cwd=ROOT / "benchmarks",
            env=env,
            start_new_session=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_count(client, "{bench-" + uid + "}:bench:runs", tasks, 3600, proc)
            deadline = time.monotonic() + 600
            while parked(client, uid) < tasks:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError(f"{parked(client, uid)} of {tasks} parked")
                time.sleep(0.05)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(600)
            cleanup(uid)
        main_log = f"{logs}/{proc.pid}.log"  # valgrind runs as the worker's own process
        counts = [
            count
            for path in glob.glob(f"{logs}/*.log")
            if (pool == "solo" or path == main_log)
            and (count := collected(Path(path).read_text())) is not None
        ]
    if len(counts) != 1:
        raise RuntimeError(f"{len(counts)} instruction counts, one worker process expected")
    return counts[0]


def compared(args: argparse.Namespace) -> dict[str, Any]:
    """``history`` or ``failure``: this tree (and ``--compare``'s), round by round."""
    trees = [("this tree", ROOT)]
    if args.compare:
        trees.append(("compared", args.compare.resolve()))
    if args.part == "history":
        low, high = (int(n) for n in args.batches.split(","))
        unit = f"event (batches of {args.batch})"
        per_unit = (high - low) * args.batch
        say(f"history: instructions per {unit}, {low:,} and {high:,} batches, load {load()}")
    else:
        low, high = (int(n) for n in args.tasks.split(","))
        unit, per_unit = "failure", high - low
        say(
            f"failure ({args.pool}{', main process' if args.pool != 'solo' else ''}): "
            f"instructions per {unit}, {low:,} and {high:,} tasks, load {load()}"
        )
    if not 0 <= low < high:
        raise SystemExit(f"--{'batches' if args.part == 'history' else 'tasks'}: LOW,HIGH")
    per: dict[str, list[float]] = {name: [] for name, _ in trees}
    for n in range(1, args.rounds + 1):
        for name, tree in trees:
            if args.part == "history":
                a, b = count_history(tree, low, args.batch), count_history(tree, high, args.batch)
            else:
                a, b = count_failures(tree, low, args.pool), count_failures(tree, high, args.pool)
            per[name].append((b - a) / per_unit)
            say(f"round {n}: {name} ({tree}): {per[name][-1]:,.0f} per {unit} (runs {a:,}, {b:,})")
    for name, values in per.items():
        listed = ", ".join(f"{v:,.0f}" for v in values)
        say(f"{name}: median {median(values):,.0f} instructions per {unit} ({listed})")
    results: dict[str, Any] = {"part": args.part, "sizes": [low, high], "per": per}
    if args.compare:
        this, other = median(per["this tree"]), median(per["compared"])
        say(f"this tree / compared: {this / other:.3f} (saves {1 - this / other:.1%})")
        results["trees"] = {name: str(tree) for name, tree in trees}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--part", choices=("consume", "linger", "history", "failure"), required=True
    )
    parser.add_argument("--messages", default="500,2500", help="consume: LOW,HIGH dead letters")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--benches", default="p10,p1", help="linger: p10, p1 or both")
    parser.add_argument(
        "--tasks", default=None, help="linger: P10's failures (5000); failure: LOW,HIGH (100,400)"
    )
    parser.add_argument("--batches", default="20,120", help="history: LOW,HIGH batches")
    parser.add_argument("--batch", type=int, default=2, help="history: events per batch")
    parser.add_argument("--compare", type=Path, default=None, help="another checkout to count")
    parser.add_argument("--poison", type=int, default=100, help="linger: P1's poison messages")
    parser.add_argument("--good", type=int, default=1000, help="linger: P1's good messages")
    parser.add_argument("--concurrency", default="1,2", help="linger: -c values")
    parser.add_argument(
        "--pool", choices=("solo", "prefork"), default="solo", help="failure: the worker's pool"
    )
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = parser.parse_args()
    if args.part == "linger":
        args.tasks = int(args.tasks or 5000)
        results = linger(args)
    elif args.part == "consume":
        results = consume(args)
    else:
        args.tasks = args.tasks or "100,400"
        results = compared(args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
