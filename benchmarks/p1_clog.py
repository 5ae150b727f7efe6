"""P1 clog: 10 poison + 1000 good messages at prefetch 10 in one worker process.

For each system (celery_dlx; plain Celery with ``task_acks_late=True`` and ``autoretry_for``, its
default retry delay and budget; Dramatiq with its default ``Retries``), each round times, from the
first run to the 1000th good message, a run with the poison messages at the head of the queue and
a run of the good messages alone, in fresh workers; the round's figure is the ratio of the two
(the system against itself, so a load change between systems does not move it). Rounds alternate
the systems. Figure: the median of the rounds' ratios, every round printed with the load average.
Target: celery_dlx <= 1.05x and below Dramatiq's in the same run, on the prefork pool (Celery's
default, one child); ``--pools prefork,solo,threads`` adds rows for the other pools.

Run: .venv/bin/python benchmarks/p1_clog.py [--good 1000] [--poison 10] [--rounds 3]
     [--pools prefork] [--systems dlx,plain,dramatiq]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import redis
from _common import (
    REDIS_URL,
    load,
    median,
    round_line,
    rounds_list,
    rounds_text,
    say,
    summary,
    unique,
)
from _workers import LABELS, bench_worker, cleanup, publish, wait_key

TARGET = 1.05


def run(mode: str, good: int, poison: int, pool: str = "prefork") -> float:
    """Seconds from the first run to the ``good``-th good message."""
    uid = unique("p1")[3:]
    client = redis.Redis.from_url(REDIS_URL)
    prefix = f"bench-{uid}"
    key = lambda name: "{" + prefix + "}:bench:" + name  # noqa: E731
    try:
        publish(mode, uid, "bench.work", [(True, good)] * poison + [(False, good)] * good)
        with bench_worker(mode, uid, prefetch=10, pool=pool):
            last = float(wait_key(client, key("last"), timeout=900))
        first = float(client.get(key("first")))
        return last - first
    finally:
        cleanup(uid)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--good", type=int, default=1000)
    parser.add_argument("--poison", type=int, default=10)
    parser.add_argument(
        "--pools", default="prefork", help="Celery pools, the first is the headline"
    )
    parser.add_argument("--systems", default="dlx,plain,dramatiq")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pools = args.pools.split(",")
    systems = args.systems.split(",")
    # Dramatiq has one worker model (processes x threads): it runs once, beside the headline pool.
    cells = [(s, pools[0]) for s in systems] + [
        ("dlx", pool) for pool in pools[1:] if "dlx" in systems
    ]
    say(f"P1 clog: {args.poison} poison + {args.good} good, prefetch 10, load {load()}")
    ratios: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
    for n in range(1, args.rounds + 1):
        for mode, pool in cells:
            clean = run(mode, args.good, 0, pool)
            clogged = run(mode, args.good, args.poison, pool)
            ratios[(mode, pool)].append(clogged / clean)
            where = "" if mode == "dramatiq" else f" ({pool})"
            round_line(
                f"{LABELS[mode]}{where}",
                n,
                f"all good {clean:.2f}s, with poison {clogged:.2f}s -> {clogged / clean:.3f}x",
            )
    for (mode, pool), values in ratios.items():
        where = "" if mode == "dramatiq" else f" ({pool})"
        say(f"{LABELS[mode]}{where}: clog ratio {rounds_text(values, '{:.3f}')}")
    head = ratios.get(("dlx", pools[0]))
    if head:
        dlx = median(head)
        peers = {mode: median(ratios[(mode, pools[0])]) for mode in systems if mode != "dlx"}
        peer_text = ", ".join(f"{LABELS[m]} {v:.2f}x" for m, v in peers.items())
        met = dlx <= TARGET and all(dlx < v for v in peers.values())
        say(
            f"RATIO P1 clog ({pools[0]}): celery_dlx {dlx:.3f}x; {peer_text} "
            f"(target <= {TARGET}x and below Dramatiq) {'OK' if met else 'ABOVE'}"
        )
        summary(
            "P1",
            f"clog: {args.poison} poison + {args.good} good vs. all good, prefetch 10, {pools[0]}",
            "<= 1.05x and below Dramatiq",
            f"{dlx:.2f}x ({rounds_list(head)}); {peer_text}",
            "met" if met else "not met",
        )
        for pool in pools[1:]:
            values = ratios[("dlx", pool)]
            summary(
                "P1",
                f"clog, celery_dlx on the {pool} pool",
                "<= 1.05x",
                f"{median(values):.2f}x ({rounds_list(values)})",
                "met" if median(values) <= TARGET else "not met",
            )


if __name__ == "__main__":
    main()
