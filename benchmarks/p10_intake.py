"""P10 failure intake: how fast a worker takes in a flood of failures (a bad deploy, an outage).

``--tasks`` messages (20,000) that each fail once with ``self.retry(countdown=3600)`` are
published, then one worker (prefork, one child, prefetch 10) starts; the clock runs from the first
run until every first attempt has run. celery_dlx parks each retry in Redis and acks; plain
Celery (``task_acks_late=True``) publishes an ETA copy that the worker then holds unacked; Dramatiq
(1 process, 1 thread) raises ``dramatiq.Retry(delay=3600000)``: a message in its delay queue.
The baseline ``success`` is plain Celery (``task_acks_late=True``, the same worker shape) running
as many no-op tasks that succeed (``bench.count_run``): the framework's own limit.
``dramatiq_confirm`` is Dramatiq with ``confirm_delivery=True``: the retry's copy is confirmed by
RabbitMQ before the original is acked, the guarantee celery_dlx gives a park (acked once Redis has
it); Dramatiq as it ships (``dramatiq``) acks after an unconfirmed publish, so a broker failure
at that moment loses the retry. Both are printed; the target names Dramatiq as it ships.
Rounds alternate the systems, each in a fresh worker; the figure is the median of the rounds'
failures per second, and each ratio is the median of the rounds' ratios. Targets (issue 23 item
2), prefork: celery_dlx >= 0.80x plain Celery's success rate and >= 1.0x Dramatiq's failure rate.

Run: .venv/bin/python benchmarks/p10_intake.py [--tasks 20000] [--rounds 3] [--pools prefork]
     [--systems dlx,success,plain,dramatiq,dramatiq_confirm]
"""

from __future__ import annotations

import argparse
import sys
import time
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
from _workers import LABELS, bench_worker, cleanup, is_dramatiq, publish, wait_count

#: celery_dlx's failure intake / Dramatiq's, and / plain Celery's success rate.
TARGET = 1.0
#: The failing task every system but ``success`` runs.
TASK = "bench.park_hour"
SUCCESS_TARGET = 0.80
#: How each system is named; ``success`` is the baseline, plain Celery's no-op successes.
NAMES = {**LABELS, "success": "plain Celery success (acks_late)"}


def run(mode: str, tasks: int, pool: str = "prefork", experiments: str = "") -> float:
    """Failures taken in per second, from the first run to the last first attempt."""
    uid = unique("p10")[4:]
    client = redis.Redis.from_url(REDIS_URL)
    runs = "{bench-" + uid + "}:bench:runs"
    try:
        system, task = ("plain", "bench.count_run") if mode == "success" else (mode, TASK)
        publish(system, uid, task, [()] * tasks)
        env = {"BENCH_EXPERIMENTS": experiments} if experiments else None
        with bench_worker(system, uid, prefetch=10, pool=pool, extra_env=env) as proc:
            wait_count(client, runs, 1, 300, proc)
            started = time.monotonic()
            wait_count(client, runs, tasks, 7200, proc)
            elapsed = time.monotonic() - started
        return (tasks - 1) / elapsed
    finally:
        cleanup(uid)


def unit(mode: str) -> str:
    return "successes" if mode == "success" else "failures"


def label(mode: str, pool: str) -> str:
    base, _, experiment = mode.partition(":")
    where = "" if is_dramatiq(base) else f" ({pool})"
    return NAMES[base] + where + (f" + experiment {experiment}" if experiment else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--pools", default="prefork", help="Celery pools, the first is the headline"
    )
    parser.add_argument("--systems", default="dlx,success,plain,dramatiq,dramatiq_confirm")
    parser.add_argument(
        "--experiments",
        default="",
        help="adds celery_dlx rows with variants patched in (benchmarks/bench_experiments.py): "
        "e.g. no_events (',' between rows, '+' within one)",
    )
    args = parser.parse_args()
    pools = args.pools.split(",")
    systems = args.systems.split(",")
    # Dramatiq and Celery's ETA retry run beside the headline pool only; the other pools get
    # celery_dlx and its own baseline (plain Celery's successes on that pool).
    cells = [(s, pools[0]) for s in systems] + [
        (s, pool) for pool in pools[1:] for s in ("dlx", "success") if s in systems
    ]
    cells += [(f"dlx:{e}", pools[0]) for e in args.experiments.split(",") if e]
    say(
        f"P10 failure intake: {args.tasks:,} tasks failing once with a one-hour retry, load {load()}"
    )
    rates: dict[tuple[str, str], list[float]] = {cell: [] for cell in cells}
    for n in range(1, args.rounds + 1):
        for mode, pool in cells:
            base, _, experiment = mode.partition(":")
            rate = run(base, args.tasks, pool, experiment.replace("+", ","))
            rates[(mode, pool)].append(rate)
            round_line(
                label(mode, pool),
                n,
                f"{rate:,.0f} {unit(mode)}/s ({args.tasks / rate:.1f}s, {1000 / rate:.2f} ms each)",
            )
    for (mode, pool), values in rates.items():
        say(f"{label(mode, pool)}: {unit(mode)}/s {rounds_text(values, '{:,.0f}')}")
    head = rates.get(("dlx", pools[0]))
    if not head:
        return
    text = "; ".join(f"{NAMES[m]} {median(rates[(m, pools[0])]):,.0f}/s" for m in systems)
    if "success" in systems:
        ratios = [d / s for d, s in zip(head, rates[("success", pools[0])], strict=True)]
        ratio = median(ratios)
        met = ratio >= SUCCESS_TARGET
        say(
            f"RATIO P10 failure intake celery_dlx / plain Celery success ({pools[0]}): "
            f"{ratio:.2f}x ({rounds_text(ratios)}) (target >= {SUCCESS_TARGET:.2f}x) "
            f"{'OK' if met else 'BELOW'}"
        )
        summary(
            "P10",
            f"failure intake: {args.tasks:,} tasks failing once with retry(countdown=3600), "
            f"{pools[0]}, celery_dlx / plain Celery's success rate (no-op, acks_late)",
            f">= {SUCCESS_TARGET:.2f}x",
            f"{ratio:.2f}x ({rounds_list(ratios)}); {text}",
            "met" if met else "not met",
        )
    for peer in ("dramatiq", "dramatiq_confirm"):
        if peer not in systems:
            continue
        ratios = [d / q for d, q in zip(head, rates[(peer, pools[0])], strict=True)]
        ratio = median(ratios)
        met = ratio >= TARGET
        say(
            f"RATIO P10 failure intake celery_dlx / {NAMES[peer]} ({pools[0]}): {ratio:.2f}x "
            f"({rounds_text(ratios)}) (target >= {TARGET:.2f}x) {'OK' if met else 'BELOW'}"
        )
        summary(
            "P10",
            f"failure intake: {args.tasks:,} tasks failing once with retry(countdown=3600), "
            f"{pools[0]}, celery_dlx / {NAMES[peer]}",
            ">= 1.0x",
            f"{ratio:.2f}x ({rounds_list(ratios)}); {text}",
            "met" if met else "not met",
        )
    for pool in pools[1:]:
        values = rates[("dlx", pool)]
        success = rates.get(("success", pool))
        ratios = [d / s for d, s in zip(values, success or values, strict=True)]
        if success:
            say(
                f"RATIO P10 failure intake celery_dlx / plain Celery success ({pool}): "
                f"{median(ratios):.2f}x ({rounds_text(ratios)})"
            )
        summary(
            "P10",
            f"failure intake, celery_dlx on the {pool} pool"
            + (" / plain Celery's success rate on it" if success else ""),
            "measured",
            (f"{median(ratios):.2f}x ({rounds_list(ratios)}); " if success else "")
            + f"celery_dlx {median(values):,.0f}/s ({rounds_list(values, '{:,.0f}')})"
            + (f"; plain Celery success {median(success):,.0f}/s" if success else ""),
            "measured",
        )


if __name__ == "__main__":
    main()
