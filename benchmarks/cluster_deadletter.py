"""What a 3-node RabbitMQ cluster sustains for dead-lettering (issue 24 item 5's capacity model).

Starts three private RabbitMQ 3.10 nodes joined into one cluster (``tests.chaos.servers``, their
own ports and folder, stopped by name or PID), and one more private node alone, then measures,
in rounds that alternate the layouts, how fast the broker dead-letters ``--messages`` 1 KB
messages from a work queue into a dead-letter queue (the DLX service's queue in a celery_dlx
deployment):

- ``single classic``: the lone node, classic queues (the P6 baseline's layout, on a private node);
- ``cluster classic``: classic queues on the cluster, the work queue on node 0, the dead-letter
  queue on node 1 (a dead letter crosses nodes);
- ``cluster quorum at-most-once``: quorum queues on 3 members (``dlx_quorum`` without
  at-least-once);
- ``cluster quorum at-least-once``: quorum queues on 3 members with
  ``x-dead-letter-strategy: at-least-once`` and ``x-overflow: reject-publish``, what
  ``dlx_quorum = True`` declares.

A round publishes the backlog with publisher confirms, then a pika consumer (prefetch 2,000)
rejects every delivery with one ``basic.nack(multiple=True, requeue=False)`` per batch; the clock
runs from the first nack until the dead-letter queue holds every message. The figure is the
median of the rounds; each round is printed with the load.

Run: .venv/bin/python benchmarks/cluster_deadletter.py [--messages 10000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT))

import pika  # noqa: E402
from _common import load, median, round_line, rounds_text, say, summary, unique  # noqa: E402

from tests.chaos.servers import RabbitCluster, RabbitNode  # noqa: E402

#: Layouts measured, in the order each round runs them.
LAYOUTS = (
    "single classic",
    "cluster classic",
    "cluster quorum at-most-once",
    "cluster quorum at-least-once",
)


def _params(url: str) -> pika.URLParameters:
    return pika.URLParameters(url[:-2] + "/%2F" if url.endswith("//") else url)


def _arguments(layout: str, dead: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The work queue's and the dead-letter queue's arguments for ``layout``."""
    work: dict[str, Any] = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dead}
    dead_args: dict[str, Any] = {}
    if "quorum" in layout:
        quorum = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}
        work.update(quorum)
        dead_args.update(quorum)
        if "at-least-once" in layout:
            work.update({"x-dead-letter-strategy": "at-least-once", "x-overflow": "reject-publish"})
    return work, dead_args


def one_round(layout: str, urls: list[str], messages: int, body: bytes) -> float:
    """Dead letters per second of one round of ``layout`` (urls: work queue's node first)."""
    uid = unique("cdl")
    work, dead = f"{uid}-work", f"{uid}-dead"
    work_args, dead_args = _arguments(layout, dead)
    # each queue declared on its own node: classic queues live where they are declared, a
    # quorum queue's leader too
    conns = [pika.BlockingConnection(_params(u)) for u in urls[:2]]
    try:
        c0, c1 = conns[0].channel(), conns[-1].channel()
        c1.queue_declare(dead, durable=True, arguments=dead_args)
        c0.queue_declare(work, durable=True, arguments=work_args)
        c0.confirm_delivery()
        props = pika.BasicProperties(delivery_mode=2, content_type="application/json")
        for _ in range(messages):
            c0.basic_publish("", work, body, props)
        consumer = conns[0].channel()
        consumer.basic_qos(prefetch_count=2000)
        last: dict[str, int] = {}

        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            last["tag"] = method.delivery_tag

        consumer.basic_consume(work, on_message)
        probe = conns[-1].channel()
        start: float | None = None
        deadline = time.monotonic() + 600
        while probe.queue_declare(dead, passive=True).method.message_count < messages:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{layout}: the dead letters did not all arrive in 600 s")
            conns[0].process_data_events(time_limit=0.005)
            if "tag" in last:
                if start is None:
                    start = time.perf_counter()
                consumer.basic_nack(last.pop("tag"), multiple=True, requeue=False)
        elapsed = time.perf_counter() - (start or time.perf_counter())
        c0.queue_delete(work)
        c1.queue_delete(dead)
        return messages / elapsed
    finally:
        for conn in conns:
            if conn.is_open:
                conn.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    body = b'{"pad": "' + b"x" * 1000 + b'"}'
    with tempfile.TemporaryDirectory(prefix="cdl-") as tmp:
        cluster = RabbitCluster(Path(tmp) / "cluster", 3)
        single = RabbitNode(Path(tmp) / "single", f"{unique('cdls')[:12]}", "c" * 20)
        try:
            started = time.monotonic()
            cluster.start()
            single.launch()
            single.await_startup()
            say(
                f"cluster dead-lettering: 3 private RabbitMQ nodes and a lone one up in "
                f"{time.monotonic() - started:.0f} s, {args.messages:,} messages of "
                f"{len(body):,} B per round, load {load()}"
            )
            rates: dict[str, list[float]] = {layout: [] for layout in LAYOUTS}
            for n in range(1, args.rounds + 1):
                for layout in LAYOUTS:
                    urls = [single.url] if layout.startswith("single") else cluster.urls
                    rate = one_round(layout, urls, args.messages, body)
                    rates[layout].append(rate)
                    round_line(layout, n, f"{rate:,.0f} dead letters/s")
            for layout, values in rates.items():
                say(f"{layout}: dead letters/s {rounds_text(values, '{:,.0f}')}")
                summary(
                    "PDL",
                    f"broker dead-lettering, {layout}, {args.messages:,} messages of 1 KB, "
                    "private RabbitMQ 3.10 nodes",
                    "measured",
                    f"{median(values):,.0f}/s (rounds {', '.join(f'{v:,.0f}' for v in values)})",
                    "measured",
                )
        finally:
            single.stop()
            cluster.stop()


if __name__ == "__main__":
    main()
