"""P6's CPU per dead letter: one DLX service process over a P6 backlog, timed by its own CPU clock.

The P6 ratio moves with the broker's rate and the machine's load; the CPU time the service process
itself spends per dead letter moves much less, so it is the figure to compare two versions of the
code by. Each round builds the backlog as ``p6_service.py`` does (``--messages`` foreign dead
letters with their ``x-death``, half buried, half parked), then runs a fresh process that
imports celery_dlx from one tree and runs ``DLXService`` until the backlog is settled and it has
been idle a second; the process prints its CPU time (user + system) from the start of ``run()`` to
its end, per dead letter, and its wall time from its first batch.

``--compare PATH`` alternates, round by round, this tree with another checkout of the project
(e.g. ``git worktree add /tmp/base <commit>``): an A/B in the same machine state.

``--instructions LOW,HIGH`` counts instead of timing: the service process runs under valgrind's
callgrind (Debian's ``valgrind``) over a backlog of LOW and then of HIGH dead letters, and the
difference of the two counts over ``HIGH - LOW`` is the instructions of one dead letter, start-up
and shut-down left out. The same count for the same code whatever else the machine runs (to about
a percent: batch sizes follow the receiving thread's pace), so a change of a few percent shows,
where the CPU clock of a loaded machine moves by 15%. ``--floor`` counts P6's floor with the least
storage (``p6_floor.py``: receive, one hash field and one sorted-set member per dead letter, an
ack per batch) the same way, beside the service.

Run: ``.venv/bin/python benchmarks/p6_cpu.py [--messages 10000] [--rounds 3] [--compare PATH]
[--instructions 500,2500 [--floor]]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import redis
from _common import (
    BROKER_URL,
    REDIS_URL,
    ROOT,
    callgrind,
    collected,
    delete_keys,
    load,
    median,
    say,
    unique,
)
from kombu import Connection
from p6_service import broker_dead_letters, fill

from celery_dlx.broker.topology import dlx_queue

#: The service process: reads its settings as JSON from argv, prints one JSON line.
CHILD = """
import json, sys, time
from celery import Celery
from celery_dlx.service.loop import DLXService
settings = json.loads(sys.argv[1])
app = Celery(settings.pop("name"), broker=settings.pop("broker"), set_as_current=False)
app.conf.update(settings)
first = []
class Timed(DLXService):
    def settle(self, messages):
        if not first:
            first.append(time.perf_counter())
        super().settle(messages)
service = Timed(app)
cpu = time.process_time()
service.run(idle_timeout=1.0)
cpu = time.process_time() - cpu
print(json.dumps({"cpu": cpu, "end": time.perf_counter(), "first": first[0],
                  "stats": service.stats.as_dict()}))
"""


#: P6's floor with the least storage (``p6_floor.py``) in a process of its own, for a count: it
#: consumes the service queue as the service would (its prefetch, batches of a third), writes a
#: hash field and a sorted-set member per dead letter, acks per batch; prints the service's line.
FLOOR_CHILD = """
import json, sys
settings = json.loads(sys.argv[1])
sys.path.insert(0, settings["benchmarks"])
from p6_floor import _consume
class Out:
    def put(self, value):
        self.value = value
out = Out()
total = settings["total"]
_consume(settings["dlx_service_queue"], total, 1000, 333, "{" + settings["name"] + "}", out)
print(json.dumps({"stats": {"buried": total, "parked": 0}}))
"""


def one_round(
    tree: Path, total: int, body_size: int, *, counted: bool = False, program: str = CHILD
) -> tuple[float, float]:
    """CPU µs per dead letter and dead letters per second of wall time, for code of ``tree``;
    ``counted``: instructions of the whole process and 0, under callgrind. ``program``: the
    service (:data:`CHILD`), or the floor (:data:`FLOOR_CHILD`, counted only)."""
    uid = unique("p6cpu")
    bury_q, park_q, dead, exchange = f"{uid}-bury", f"{uid}-park", f"{uid}-dead", f"{uid}-dlx"
    settings = {
        "name": uid,
        "broker": BROKER_URL,
        "dlx_redis_url": REDIS_URL,
        "dlx_key_prefix": uid,
        "dlx_exchange": exchange,
        "dlx_service_queue": dead,
        "dlx_queues": {
            bury_q: {"max_requeues": 0, "max_parks": 0},
            park_q: {"max_requeues": 0, "backoff": [3600]},
        },
    }
    client = redis.Redis.from_url(REDIS_URL)
    with Connection(BROKER_URL) as conn:
        channel: Any = conn.channel()
        try:
            for queue in (bury_q, park_q):
                dlx_queue(queue, dlx=exchange, service=dead)(channel).declare()
            fill(conn, bury_q, total - total // 2, body_size)
            fill(conn, park_q, total // 2, body_size)
            broker_dead_letters(conn, [bury_q, park_q], dead, total)
            env = {**os.environ, "PYTHONPATH": str(tree)}
            with tempfile.TemporaryDirectory(prefix="p6i-") as logs:
                log = f"{logs}/callgrind.log"
                out = subprocess.run(
                    [
                        *(callgrind(log) if counted else []),
                        sys.executable,
                        "-c",
                        program,
                        json.dumps(
                            {**settings, "total": total, "benchmarks": str(ROOT / "benchmarks")}
                            if program is FLOOR_CHILD
                            else settings
                        ),
                    ],
                    env=env,
                    cwd="/tmp",
                    capture_output=True,
                    text=True,
                    check=True,
                )
                result = json.loads(out.stdout.strip().splitlines()[-1])
                stats = result["stats"]
                assert stats["buried"] + stats["parked"] == total, stats
                if counted:
                    text = Path(log).read_text()
                    count = collected(text)
                    if count is None:
                        raise RuntimeError(f"callgrind counted nothing: {text[-500:]}")
                    return float(count), 0.0
        finally:
            for queue in (bury_q, park_q, dead):
                channel.queue_delete(queue)
            channel.exchange_delete(exchange)
            delete_keys(client, uid)
    return result["cpu"] / total * 1e6, total / (result["end"] - result["first"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--body-size", type=int, default=1024)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout to alternate")
    parser.add_argument(
        "--instructions", default=None, help="LOW,HIGH: count instructions (callgrind) instead"
    )
    parser.add_argument(
        "--floor", action="store_true", help="with --instructions: count P6's floor too"
    )
    args = parser.parse_args()
    trees = [("this tree", ROOT)] + ([("compared", args.compare.resolve())] if args.compare else [])
    if args.instructions:
        count_instructions(trees, args.instructions, args.rounds, args.body_size, floor=args.floor)
        return
    say(f"P6 CPU per dead letter: {args.messages:,} per round, load {load()}")
    cpu: dict[str, list[float]] = {name: [] for name, _ in trees}
    for n in range(1, args.rounds + 1):
        for name, tree in trees:
            per_letter, rate = one_round(tree, args.messages, args.body_size)
            cpu[name].append(per_letter)
            say(
                f"round {n}: {name} ({tree}): {per_letter:,.0f} µs of CPU per dead letter, "
                f"{rate:,.0f}/s [load {load()}]"
            )
    say_medians(cpu, "µs of CPU per dead letter")


def count_instructions(
    trees: list[tuple[str, Path]], sizes: str, rounds: int, body_size: int, *, floor: bool = False
) -> None:
    """Instructions per dead letter of each tree, by the difference of two backlogs' counts;
    ``floor``: P6's floor with the least storage counted the same way, beside them."""
    low, high = (int(n) for n in sizes.split(","))
    say(f"P6 instructions per dead letter ({low:,} and {high:,} dead letters), load {load()}")
    programs = [(name, tree, CHILD) for name, tree in trees]
    if floor:
        programs.append(("floor, least storage", ROOT, FLOOR_CHILD))
    counts: dict[str, list[float]] = {name: [] for name, _, _ in programs}
    for n in range(1, rounds + 1):
        for name, tree, program in programs:
            a = one_round(tree, low, body_size, counted=True, program=program)[0]
            b = one_round(tree, high, body_size, counted=True, program=program)[0]
            counts[name].append((b - a) / (high - low))
            say(
                f"round {n}: {name} ({tree}): {counts[name][-1]:,.0f} instructions per dead "
                f"letter (runs {a:,.0f} and {b:,.0f}) [load {load()}]"
            )
    say_medians(counts, "instructions per dead letter")


def say_medians(values_of: dict[str, list[float]], unit: str) -> None:
    """One line per tree: the median of its rounds, and every round."""
    for name, values in values_of.items():
        listed = ", ".join(f"{v:,.0f}" for v in values)
        say(f"{name}: median {median(values):,.0f} {unit} (rounds {listed})")


if __name__ == "__main__":
    main()
