"""A P6 dead letter's own work, counted: instructions per dead letter of each step, no I/O.

The per-dead-letter path of the DLX service without its broker and Redis round trips, on the
two letters of a P6 backlog (``p6_service.py``: a 1 KiB JSON body, two user headers, the
``x-death`` and ``x-first-death-*``/``x-last-death-*`` headers RabbitMQ adds, here written by
py-amqp's encoder; one letter of a queue that buries, one of a queue that parks). ``--part`` picks the steps:

- ``receive``: the content header frame decoded by celery_dlx's frame reader
  (``broker.frames.decode_content_header``);
- ``read``: the dead letter read and decided (``read_dead_letter``, ``decide_letter``): the
  letter, its ``x-death``, state and history, the verdict and its failure records;
- ``write``: what is stored: the buried letter's obituary and fate event, its record's JSON
  (``Obituary.record_json``); the parked letter's entry and its JSON (``ParkedMessage.meta_json``);
- ``all``: the three in a row, from the frame to the JSON (the service's per-letter work
  without I/O).

Each count runs a fresh process under valgrind's callgrind (Debian's ``valgrind``) that imports
celery_dlx from one tree, builds the inputs, and runs the steps over the two letters ``LOW`` and
then ``HIGH`` times; the difference of the two counts over ``2 * (HIGH - LOW)`` is one dead
letter's instructions, imports and set-up left out. ``--compare PATH`` counts another checkout
of the project the same way, round by round (``git worktree add /tmp/base <commit>``): the two
codes on the same inputs.

Run: ``.venv/bin/python benchmarks/tricks_cpu.py [--part all] [--iterations 200,1200]
[--rounds 2] [--compare PATH]``
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import ROOT, callgrind, collected, load, median, say

#: The counted process: argv is ``PART ITERATIONS``; imports celery_dlx from ``PYTHONPATH``.
CHILD = """
import json, struct, sys
from datetime import datetime, timezone
import amqp
from celery_dlx.broker.frames import decode_content_header
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.message.outgoing import copy_properties
from celery_dlx.policy.config import load_config
from celery_dlx.policy.deadletter import read_dead_letter
from celery_dlx.policy.verdicts import BuryVerdict, build_obituary, decide_letter
from celery_dlx.service.settle import buried_event

part, iterations = sys.argv[1], int(sys.argv[2])
config = load_config({"dlx_queues": {
    "p6-bury": {"max_requeues": 0, "max_parks": 0},
    "p6-park": {"max_requeues": 0, "backoff": [3600]},
}})
NOW = 1_790_000_000_000
WHEN = datetime(2026, 9, 21, 7, 8, 9, tzinfo=timezone.utc)

def frame(queue, i):
    body = json.dumps({"invoice": i, "customer": f"c-{i % 977}", "pad": "x" * 964}).encode()
    death = {"count": 1, "reason": "rejected", "queue": queue, "time": WHEN, "exchange": "",
             "routing-keys": [queue]}
    headers = {"source": "billing-go", "trace-id": f"{i:016x}", "x-death": [death]}
    for end in ("first", "last"):
        headers.update({f"x-{end}-death-exchange": "", f"x-{end}-death-queue": queue,
                        f"x-{end}-death-reason": "rejected"})
    props = amqp.Message(body, application_headers=headers, message_id=f"{queue}-{i}",
                         content_type="application/json", content_encoding="utf-8",
                         delivery_mode=2)._serialize_properties()
    return body, struct.pack(">HHQ", 60, 0, len(body)) + bytes(props)

letters = [(queue,) + frame(queue, 7) for queue in ("p6-bury", "p6-park")]

def receive(item):
    queue, body, header = item
    return decode_content_header(header)[2]

def read(item, props):
    queue, body, header = item
    letter = read_dead_letter(body, props.get("application_headers"), props,
                              exchange="p6-dlx", routing_key=queue, delivery="c1:1")
    return letter, decide_letter(letter, config, None, NOW)

def write(letter, verdict):
    if isinstance(verdict, BuryVerdict):
        ob = build_obituary(letter, verdict, buried_ms=NOW, code_version=None, hostname="h")
        buried_event(ob, traceback_logged=False)
        return ob.record_json()
    return ParkedMessage(
        message_id=letter.identity, attempt=verdict.state.attempt, queue=letter.queue,
        body=letter.body, headers=letter.copy_headers(verdict.state),
        properties=copy_properties(letter.properties),
        due_ms=NOW + int(verdict.delay * 1000), parked_ms=NOW, task=letter.task,
        cause=verdict.cause,
    ).meta_json()

props = [receive(item) for item in letters]
decided = [read(item, p) for item, p in zip(letters, props)]
kinds = sorted(type(v).__name__ for _, v in decided)
assert kinds == ["BuryVerdict", "ParkVerdict"], kinds
if part == "receive":
    for _ in range(iterations):
        for item in letters:
            receive(item)
elif part == "read":
    for _ in range(iterations):
        for item, p in zip(letters, props):
            read(item, p)
elif part == "write":
    for _ in range(iterations):
        for letter, verdict in decided:
            write(letter, verdict)
elif part == "all":
    for _ in range(iterations):
        for item in letters:
            write(*read(item, receive(item)))
else:
    raise SystemExit(f"unknown part {part!r}: receive, read, write or all")
"""

PARTS = ("receive", "read", "write", "all")


def count(tree: Path, part: str, iterations: int) -> int:
    """Instructions of one process running ``part`` ``iterations`` times with ``tree``'s code."""
    with tempfile.TemporaryDirectory(prefix="tricks-") as logs:
        log = f"{logs}/callgrind.log"
        subprocess.run(
            [*callgrind(log), sys.executable, "-c", CHILD, part, str(iterations)],
            env={**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"},
            cwd="/tmp",
            check=True,
        )
        text = Path(log).read_text()
    found = collected(text)
    if found is None:
        raise RuntimeError(f"callgrind counted nothing: {text[-500:]}")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=PARTS, default="all")
    parser.add_argument("--iterations", default="200,1200", help="LOW,HIGH runs of the steps")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--compare", type=Path, default=None, help="another checkout to count")
    args = parser.parse_args()
    low, high = (int(n) for n in args.iterations.split(","))
    if not 0 <= low < high:
        parser.error("--iterations needs LOW,HIGH with 0 <= LOW < HIGH")
    trees = [("this tree", ROOT)] + ([("compared", args.compare.resolve())] if args.compare else [])
    say(f"{args.part}: instructions per P6 dead letter ({low:,} and {high:,} runs), load {load()}")
    per: dict[str, list[float]] = {name: [] for name, _ in trees}
    for n in range(1, args.rounds + 1):
        for name, tree in trees:
            a, b = count(tree, args.part, low), count(tree, args.part, high)
            per[name].append((b - a) / (2 * (high - low)))
            say(f"round {n}: {name} ({tree}): {per[name][-1]:,.0f} (runs {a:,} and {b:,})")
    for name, values in per.items():
        listed = ", ".join(f"{v:,.0f}" for v in values)
        say(f"{name}: median {median(values):,.0f} instructions per dead letter ({listed})")


if __name__ == "__main__":
    main()
