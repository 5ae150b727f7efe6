"""Chaos run: 10k messages under kill -9, Redis restarts and RabbitMQ restarts; lost must be 0.

Good, flaky, poison and foreign-consumer messages flow through prefork workers, DLX services,
drains and a foreign (pika) consumer, all subprocesses, while a monkey kills -9 workers, pool
children, DLX services, drains and the foreign consumer at random, restarts celery_dlx's own
Redis (a private ``redis-server`` with AOF, ``appendfsync always``, SIGKILL then start) and
restarts the RabbitMQ node (``rabbitmqctl stop_app``/``start_app``). Then every message id is
accounted for: done (executed, counted in a ledger on the shared Redis, which no chaos touches),
buried (in the graveyard), pending (still parked or queued when the settle time ran out) or lost.
Duplicates are executions beyond the first.

Crash points (``DLX_FAULT``) also kill the drains and the DLX service once in each window where a
crash could lose or double a message (claimed/unpublished, published/unacked, buried/unacked).
The fates are then checked against the ledger each task run writes itself (id, run, attempt,
outcome), independent of celery_dlx: good and flaky messages done and never buried, poison buried
exactly once, and every message no chaos event touched ran exactly as often as its kind says.
Exit status 1 if anything was lost or left pending, or the ledger check found a violation.

The RabbitMQ restart disturbs every user of the node: run this by hand, not in CI. The node is
started again (``start_app`` + ``await_startup``) before the script exits, even on failure or
Ctrl-C.

Run: .venv/bin/python benchmarks/chaos.py [--messages 10000] [--rabbit-restarts 2] [--quorum]
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.chaos.harness import PROCESS_ACTIONS, ChaosPlan, run_chaos
from tests.chaos.processes import RESTART_RABBITMQ


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=10_000)
    p.add_argument("--workers", type=int, default=2, help="prefork workers (each -c 2)")
    p.add_argument("--services", type=int, default=2, help="DLX service processes")
    p.add_argument("--drains", type=int, default=2, help="drain processes")
    p.add_argument("--publish-seconds", type=float, default=60.0, help="spread publishing over")
    p.add_argument("--chaos-seconds", type=float, default=120.0, help="monkey active for")
    p.add_argument("--settle-seconds", type=float, default=300.0, help="then wait at most")
    p.add_argument("--gap", type=float, nargs=2, default=(1.0, 4.0), help="seconds between acts")
    p.add_argument("--rabbit-restarts", type=int, default=2, help="0: never restart RabbitMQ")
    p.add_argument("--quorum", action="store_true", help="quorum queues (at-least-once DLX)")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--keep-logs", action="store_true", help="keep the processes' logs")
    p.add_argument("--json", type=Path, help="also write the report as JSON to this file")
    return p.parse_args(argv)


def _terminate(signum: int, _: Any) -> None:
    # Unwind like Ctrl-C, so the run stops its processes and starts RabbitMQ again.
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str]) -> int:
    args = parse(argv)
    logging.basicConfig(level=logging.WARNING, format="[%(asctime)s %(name)s] %(message)s")
    signal.signal(signal.SIGTERM, _terminate)
    actions = PROCESS_ACTIONS + ((RESTART_RABBITMQ,) if args.rabbit_restarts else ())
    plan = ChaosPlan(
        messages=args.messages,
        workers=args.workers,
        services=args.services,
        drains=args.drains,
        publish_seconds=args.publish_seconds,
        chaos_seconds=args.chaos_seconds,
        settle_seconds=args.settle_seconds,
        gap=(args.gap[0], args.gap[1]),
        actions=actions,
        rabbit_restarts=args.rabbit_restarts,
        quorum=args.quorum,
        seed=args.seed,
        keep_logs=args.keep_logs,
    )
    report = run_chaos(plan)
    print("\n".join(report.lines()))
    if report.logdir:
        print(f"logs: {report.logdir}")
    if args.json:
        args.json.write_text(json.dumps(report.as_dict(), indent=2, sort_keys=True))
    ok = (
        report.lost == 0
        and report.pending == 0
        and report.unsent == 0
        and not report.violations
        and report.good_buried == 0
    )
    print(
        f"RESULT lost={report.lost} pending={report.pending} duplicates={report.duplicates} "
        f"good_buried={report.good_buried} ledger_violations={len(report.violations)} "
        f"exact_checked={report.exact_checked}: {'OK' if ok else 'FAILED'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
