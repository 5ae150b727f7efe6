"""P1 clog: poison messages (10, and a storm of 100) ahead of 1000 good at prefetch 10, one worker.

For each system (celery_dlx; plain Celery with ``task_acks_late=True`` and ``autoretry_for``, its
default retry delay and budget; Dramatiq with its default ``Retries``), each round times, from the
first run to the 1000th good message, a run of the good messages alone and one run per poison count
with the poison messages at the head of the queue, in fresh workers; the round's figure per poison
count is the ratio clogged / all good (the system against itself, so a load change between systems
does not move it). ``dramatiq_confirm`` is Dramatiq with ``confirm_delivery=True``: its retries'
copies confirmed by the broker before the originals are acked, the guarantee celery_dlx gives
(``benchmarks/dramatiq_app.py``). Rounds alternate the systems. Figure: the median of the
rounds' ratios, every round printed with the load average. Targets (issue 23 item 3), on the
prefork pool (Celery's default, one child): celery_dlx <= 1.05x with 10 poison and <= 1.10x with
100, and below Dramatiq's ratio in the same run; ``--pools prefork,solo,threads`` adds rows for
the other pools.

Run: .venv/bin/python benchmarks/p1_clog.py [--good 1000] [--poison 10,100] [--rounds 3]
     [--pools prefork] [--systems dlx,plain,dramatiq,dramatiq_confirm]
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
from _workers import LABELS, bench_worker, cleanup, is_dramatiq, publish, wait_key

#: The good messages' completion time with N poison ahead / all good: the target per N.
TARGETS = {10: 1.05, 100: 1.10}


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
    parser.add_argument(
        "--poison", default="10,100", help="poison counts ahead of the good ones, one row each"
    )
    parser.add_argument(
        "--pools", default="prefork", help="Celery pools, the first is the headline"
    )
    parser.add_argument("--systems", default="dlx,plain,dramatiq,dramatiq_confirm")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    pools = args.pools.split(",")
    systems = args.systems.split(",")
    poisons = [int(p) for p in str(args.poison).split(",")]
    # Dramatiq has one worker model (processes x threads): it runs once, beside the headline pool.
    cells = [(s, pools[0]) for s in systems] + [
        ("dlx", pool) for pool in pools[1:] if "dlx" in systems
    ]
    say(
        f"P1 clog: {' and '.join(map(str, poisons))} poison ahead of {args.good} good, "
        f"prefetch 10, load {load()}"
    )
    ratios: dict[tuple[str, str, int], list[float]] = {
        (mode, pool, p): [] for mode, pool in cells for p in poisons
    }
    for n in range(1, args.rounds + 1):
        for mode, pool in cells:
            # One all-good run per round and system is the baseline of every poison count.
            clean = run(mode, args.good, 0, pool)
            parts = [f"all good {clean:.2f}s"]
            for poison in poisons:
                clogged = run(mode, args.good, poison, pool)
                ratios[(mode, pool, poison)].append(clogged / clean)
                parts.append(f"{poison} poison {clogged:.2f}s -> {clogged / clean:.3f}x")
            round_line(f"{LABELS[mode]}{where(mode, pool)}", n, ", ".join(parts))
    for (mode, pool, poison), values in ratios.items():
        say(
            f"{LABELS[mode]}{where(mode, pool)}, {poison} poison: clog ratio "
            f"{rounds_text(values, '{:.3f}')}"
        )
    if "dlx" not in systems:
        return
    for poison in poisons:
        target = TARGETS.get(poison, TARGETS[max(TARGETS)])
        head = ratios[("dlx", pools[0], poison)]
        dlx = median(head)
        peers = {m: median(ratios[(m, pools[0], poison)]) for m in systems if m != "dlx"}
        peer_text = ", ".join(f"{LABELS[m]} {v:.2f}x" for m, v in peers.items())
        met = dlx <= target and all(dlx < v for v in peers.values())
        say(
            f"RATIO P1 clog, {poison} poison ({pools[0]}): celery_dlx {dlx:.3f}x; {peer_text} "
            f"(target <= {target}x and below Dramatiq) {'OK' if met else 'ABOVE'}"
        )
        summary(
            "P1",
            f"clog: {poison} poison + {args.good} good vs. all good, prefetch 10, {pools[0]}",
            f"<= {target:.2f}x and below Dramatiq",
            f"{dlx:.2f}x ({rounds_list(head)}); {peer_text}",
            "met" if met else "not met",
        )
        for pool in pools[1:]:
            values = ratios[("dlx", pool, poison)]
            summary(
                "P1",
                f"clog, {poison} poison, celery_dlx on the {pool} pool",
                f"<= {target:.2f}x",
                f"{median(values):.2f}x ({rounds_list(values)})",
                "met" if median(values) <= target else "not met",
            )


def where(mode: str, pool: str) -> str:
    return "" if is_dramatiq(mode) else f" ({pool})"


if __name__ == "__main__":
    main()
