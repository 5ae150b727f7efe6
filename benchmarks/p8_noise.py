"""P8: the noise of a poison storm: log lines and Sentry events, celery_dlx against plain Celery.

Twenty poison messages, 10 with one cause (``charge``: ``ValueError("order <n> is bad")``) and 10
with another (``ship``: ``LookupError("no stock for sku <n>")``), run on the real broker by a real
worker (solo pool, in this process), with ``sentry_sdk.init`` pointing at a local HTTP server
(the DSN; it decodes the envelopes the SDK really sends) and sentry-sdk's CeleryIntegration and
LoggingIntegration (events from ERROR lines) on. Every log record of the process is tallied.

Phases, each on its own queue:

- ``celery_dlx``: ``dlx_enabled``, 2 requeues then 2 parks (0.2 s, 0.3 s), so 5 attempts per
  message; the drain and the DLX service run in threads. The phase lasts until all 20 are
  buried; that duration is the window ``W``.
- ``plain-retry``: plain Celery, ``autoretry_for=(Exception,)``, ``max_retries=None``, countdown 0:
  Celery's own retry loop, for ``W`` seconds.
- ``plain-reject``: plain Celery, ``acks_late``, the task logs the failure with
  ``logger.exception`` and raises ``Reject(requeue=True)``: the broker requeue loop, for ``W``.

Log records are attributed to a message when they name its task id; per-message figures divide
by 20. A record's physical lines include its traceback. Sentry events are counted as the SDK
built them (``before_send``) and as the DSN server received them (the SDK's queue drops
events past 100 in flight), per cause (fingerprint, else exception type).

Targets (celery_dlx phase): failure log records per message <= attempts + 1 (6), counting every
logger at INFO except Celery's per-delivery ``Task x[id] received`` line (logged for every task,
failing or not, in both worlds); the same at WARNING, Celery's default worker log level; one
traceback per message; Sentry events per cause <= 1 per window. celery_dlx's counts are final
once all are buried, while the plain loops grow with time: ``--window`` runs them longer.

The DSN server is the tests' (``tests/sentry_sink.py``; ``_common`` puts the repository on the
path).

Run: ``.venv/bin/python benchmarks/p8_noise.py [--messages 10] [--window SECONDS] [--dump FILE]``
"""

from __future__ import annotations

import argparse
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from _common import (
    BROKER_URL,
    REDIS_URL,
    ROOT,
    delete_keys,
    limit_line,
    scratch_queues,
    summary,
    unique,
)
from celery import Celery
from celery.contrib.testing.worker import start_worker
from celery.exceptions import Reject
from kombu import Connection

import celery_dlx
from celery_dlx.drain.core import run_drain
from celery_dlx.policy.config import load_config
from celery_dlx.service.loop import DLXService
from celery_dlx.store.graveyard import Graveyard
from celery_dlx.wiring.runtime import get_runtime
from tests.sentry_sink import SentrySink

ATTEMPTS = 5
BENCH_LOGGER = "p8"


@dataclass
class Record:
    logger: str
    level: int
    lines: int
    text: str
    traceback: bool


class Tally(logging.Handler):
    """Keeps every log record of the process (formatted as a worker would print it)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(
            logging.Formatter("[%(asctime)s: %(levelname)s/%(processName)s] %(message)s")
        )
        self.records: list[Record] = []
        self.lock2 = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == BENCH_LOGGER or record.name.startswith(("sentry_sdk", "urllib3")):
            return
        text = self.format(record)
        with self.lock2:
            self.records.append(
                Record(
                    record.name,
                    record.levelno,
                    text.count("\n") + 1,
                    text,
                    "Traceback (most recent call last)" in text,
                )
            )

    def take(self) -> list[Record]:
        with self.lock2:
            out, self.records = self.records, []
        return out


@dataclass
class Result:
    name: str
    seconds: float
    messages: int
    runs: int
    records: list[Record]
    ids: set[str]
    sent: list[dict[str, Any]]
    received: list[dict[str, Any]]
    notes: list[str] = field(default_factory=list)

    def attributed(self, min_level: int = logging.INFO, loggers: str | None = None) -> list[Record]:
        return [
            r
            for r in self.records
            if r.level >= min_level
            and (loggers is None or r.logger == loggers)
            and any(i in r.text for i in self.ids)
        ]

    def causes(self, events: list[dict[str, Any]]) -> Counter[str]:
        out: Counter[str] = Counter()
        for e in events:
            if e.get("fingerprint") and e["fingerprint"] != ["{{ default }}"]:
                out[e["fingerprint"][0]] += 1
            else:
                values = (e.get("exception") or {}).get("values") or [{}]
                out[str(values[-1].get("type") or e.get("logentry", {}).get("message"))] += 1
        return out


def sentry_init(sink: SentrySink, built: list[dict[str, Any]]) -> None:
    import sentry_sdk
    from sentry_sdk.integrations.celery import CeleryIntegration
    from sentry_sdk.integrations.logging import LoggingIntegration

    def before_send(event: dict[str, Any], hint: dict[str, Any]) -> dict[str, Any]:
        built.append(event)
        return event

    sentry_sdk.init(
        dsn=sink.dsn,
        integrations=[
            CeleryIntegration(),
            LoggingIntegration(level=logging.INFO, event_level=logging.ERROR),
        ],
        before_send=before_send,
    )


@contextmanager
def running_worker(app: Celery) -> Iterator[Any]:
    with start_worker(
        app,
        pool="threads",  # an in-thread solo worker stalls ~10 s on a burst; threads does not
        concurrency=1,
        perform_ping_check=False,
        loglevel="INFO",
        shutdown_timeout=30.0,
    ) as worker:
        try:
            yield worker
        finally:
            from celery.worker import state

            state.should_terminate = 0
            app.control.ping(destination=[worker.hostname], timeout=0.05)


@contextmanager
def background(loop: Callable[[threading.Event], None]) -> Iterator[None]:
    stop = threading.Event()
    thread = threading.Thread(target=loop, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(30)


def base_conf(queue: str) -> dict[str, Any]:
    return {
        "task_default_queue": queue,
        "worker_prefetch_multiplier": 1,
        "worker_hijack_root_logger": False,
        "task_ignore_result": True,
        "broker_connection_retry_on_startup": True,
    }


def publish(app: Celery, charge: Any, ship: Any, n: int) -> set[str]:
    ids = set()
    for i in range(n):
        ids.add(charge.delay(i).id)
        ids.add(ship.delay(f"s{i}").id)
    return ids


def phase_dlx(
    tally: Tally, sink: SentrySink, n: int, cleanup: list[str], rate_limit: int | None = None
) -> Result:
    uid = unique("p8")[3:]
    queue = f"p8-work-{uid}"
    app = Celery(f"p8-dlx-{uid}", broker=BROKER_URL, set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(
        base_conf(queue),
        dlx_enabled=True,
        dlx_redis_url=REDIS_URL,
        dlx_key_prefix=f"p8-{uid}",
        dlx_exchange=f"p8-dlx-{uid}",
        dlx_service_queue=f"p8-dead-{uid}",
        dlx_max_requeues=2,
        dlx_max_parks=2,
        dlx_backoff=[0.2, 0.3],
    )
    if rate_limit is not None:  # else celery_dlx's default Sentry settings
        app.conf.update(dlx_sentry_rate_limit=rate_limit, dlx_sentry_rate_window=3600)
    cleanup += [queue, f"p8-dead-{uid}", f"exchange:p8-dlx-{uid}"]
    runtime = get_runtime(app)
    runs = Counter[str]()

    @app.task(name=f"shop.charge.{uid}", dlx_importance="page")
    def charge(order_id: int) -> None:
        runs["x"] += 1
        raise ValueError(f"order {order_id} is bad")

    @app.task(name=f"shop.ship.{uid}")
    def ship(sku: str) -> None:
        runs["x"] += 1
        raise LookupError(f"no stock for sku {sku}")

    def drain(stop: threading.Event) -> None:
        while not stop.is_set():
            run_drain(runtime, budget_seconds=0.1)
            stop.wait(0.1)

    service = DLXService(app)
    built: list[dict[str, Any]] = []
    received_before = len(sink.events)
    sentry_init(sink, built)
    svc = threading.Thread(target=service.run, daemon=True)
    svc.start()
    tally.take()
    try:
        with running_worker(app), background(drain):
            graveyard = Graveyard(runtime.redis, runtime.keys)
            started = time.monotonic()
            ids = publish(app, charge, ship, n)
            deadline = started + 300
            while graveyard.count() < 2 * n and time.monotonic() < deadline:
                time.sleep(0.05)
            seconds = time.monotonic() - started
            buried = graveyard.count()
    finally:
        service.stop()
        svc.join(30)
    import sentry_sdk

    sentry_sdk.flush(timeout=30)
    delete_keys(runtime.redis, f"p8-{uid}")
    app.close()
    result = Result("celery_dlx", seconds, 2 * n, runs["x"], tally.take(), ids, built,
                    sink.events[received_before:])  # fmt: skip
    if buried != 2 * n:
        result.notes.append(f"only {buried} of {2 * n} buried within the deadline")
    return result


def phase_plain(
    kind: str, seconds: float, tally: Tally, sink: SentrySink, n: int, cleanup: list[str]
) -> Result:
    uid = unique("p8")[3:]
    queue = f"p8-plain-{uid}"
    app = Celery(f"p8-plain-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(base_conf(queue), task_acks_late=(kind == "reject"))
    cleanup.append(queue)
    runs = Counter[str]()
    task_log = logging.getLogger("shop.tasks")

    if kind in ("retry", "budget"):
        # budget: Celery's autoretry with celery_dlx's attempt budget (ATTEMPTS runs, then the
        # failure is final) and its delays; retry: unlimited, at once.
        retry: dict[str, Any] = (
            {"autoretry_for": (Exception,), "max_retries": ATTEMPTS - 1, "default_retry_delay": 0.2}
            if kind == "budget"
            else {"autoretry_for": (Exception,), "max_retries": None, "default_retry_delay": 0}
        )

        @app.task(name=f"shop.charge.{uid}", **retry)
        def charge(order_id: int) -> None:
            runs["x"] += 1
            raise ValueError(f"order {order_id} is bad")

        @app.task(name=f"shop.ship.{uid}", **retry)
        def ship(sku: str) -> None:
            runs["x"] += 1
            raise LookupError(f"no stock for sku {sku}")

    else:

        @app.task(name=f"shop.charge.{uid}", bind=True)
        def charge(self: Any, order_id: int) -> None:
            runs["x"] += 1
            try:
                raise ValueError(f"order {order_id} is bad")
            except ValueError as exc:
                task_log.exception("charge %s failed, requeueing", self.request.id)
                raise Reject(exc, requeue=True) from exc

        @app.task(name=f"shop.ship.{uid}", bind=True)
        def ship(self: Any, sku: str) -> None:
            runs["x"] += 1
            try:
                raise LookupError(f"no stock for sku {sku}")
            except LookupError as exc:
                task_log.exception("ship %s failed, requeueing", self.request.id)
                raise Reject(exc, requeue=True) from exc

    built: list[dict[str, Any]] = []
    received_before = len(sink.events)
    sentry_init(sink, built)
    tally.take()
    with running_worker(app):
        started = time.monotonic()
        ids = publish(app, charge, ship, n)
        if kind == "budget":  # until every message spent its budget
            deadline = started + 300
            while runs["x"] < 2 * n * ATTEMPTS and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(1.0)  # the last failures' log lines and events
            seconds = time.monotonic() - started
        else:
            time.sleep(max(0.0, started + seconds - time.monotonic()))
    import sentry_sdk

    sentry_sdk.flush(timeout=30)
    with app.connection_for_write() as conn:
        conn.default_channel.queue_purge(queue)
    app.close()
    return Result(f"plain-{kind}", seconds, 2 * n, runs["x"], tally.take(), ids, built,
                  sink.events[received_before:])  # fmt: skip


def report(result: Result) -> None:
    per = result.messages
    info_all = result.attributed(logging.INFO)
    warn_all = result.attributed(logging.WARNING)
    own = result.attributed(logging.INFO, "celery_dlx")
    tracebacks = sum(r.traceback for r in info_all)
    print(
        f"\n== {result.name}: {result.messages} messages, {result.runs} runs in {result.seconds:.1f}s"
    )
    for label, rows in (("INFO, all loggers", info_all), ("WARNING, all loggers", warn_all),
                        ("INFO, celery_dlx fate lines", own)):  # fmt: skip
        lines = sum(r.lines for r in rows)
        print(f"  log records ({label}): {len(rows)} = {len(rows) / per:.1f}/message; "
              f"physical lines {lines} = {lines / per:.1f}/message")  # fmt: skip
    print(f"  records with a traceback: {tracebacks} = {tracebacks / per:.1f}/message")
    by_logger = Counter((r.logger, logging.getLevelName(r.level)) for r in info_all)
    for (name, level), count in sorted(by_logger.items(), key=lambda kv: -kv[1]):
        print(f"    {count:7d}  {level:8s} {name}")
    causes_built = result.causes(result.sent)
    causes_received = result.causes(result.received)
    print(f"  Sentry events built by the SDK: {len(result.sent)} {dict(causes_built)}")
    print(f"  Sentry events received by the DSN: {len(result.received)} {dict(causes_received)}")
    for note in result.notes:
        print(f"  NOTE {note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10, help="poison messages per cause")
    parser.add_argument("--dump", help="write every log record to this file")
    parser.add_argument(
        "--sentry-rate-limit",
        type=int,
        default=None,
        help="dlx_sentry_rate_limit for celery_dlx (default: the setting's default)",
    )
    parser.add_argument(
        "--unlimited", action="store_true", help="also run the unlimited plain-retry loop"
    )
    parser.add_argument(
        "--window",
        type=float,
        default=None,
        help="seconds the plain-Celery loops run (default: the time celery_dlx took to bury all)",
    )
    args = parser.parse_args()
    tally = Tally()
    root = logging.getLogger()
    root.addHandler(tally)
    root.setLevel(logging.INFO)
    print(f"P8 noise: {args.messages} + {args.messages} poison messages, two causes ({ROOT.name})")
    with SentrySink() as sink, Connection(BROKER_URL) as conn, scratch_queues(conn) as cleanup:
        dlx = phase_dlx(tally, sink, args.messages, cleanup, args.sentry_rate_limit)
        window = args.window if args.window is not None else dlx.seconds
        budget = phase_plain("budget", window, tally, sink, args.messages, cleanup)
        baselines = [budget]
        if args.unlimited:
            baselines.append(phase_plain("retry", window, tally, sink, args.messages, cleanup))
        baselines.append(phase_plain("reject", window, tally, sink, args.messages, cleanup))
    for result in (dlx, *baselines):
        report(result)
    if args.dump:
        with open(args.dump, "w") as out:
            for result in (dlx, *baselines):
                out.write(f"===== {result.name}\n")
                for record in result.records:
                    out.write(record.text + "\n")
    per = dlx.messages
    failure = [r for r in dlx.attributed(logging.INFO) if r.logger != "celery.worker.strategy"]
    print()
    print(limit_line("celery_dlx failure log records/message at INFO (all loggers but Celery's "
                     "per-delivery 'received')", len(failure) / per, ATTEMPTS + 1))  # fmt: skip
    print(limit_line("celery_dlx log records/message at WARNING (Celery's default worker level)",
                     len(dlx.attributed(logging.WARNING)) / per, ATTEMPTS + 1))  # fmt: skip
    print(limit_line("celery_dlx tracebacks/message", sum(r.traceback for r in failure) / per, 1))
    worst = max(dlx.causes(dlx.received).values(), default=0)
    limit = args.sentry_rate_limit or int(load_config({}).sentry_rate_limit)
    print(limit_line("celery_dlx Sentry events per cause per window", worst, limit))
    for base in baselines:
        print(
            f"BASELINE {base.name}: {len(base.attributed(logging.INFO)) / per:.1f} records/message "
            f"at INFO, {len(base.attributed(logging.WARNING)) / per:.1f} at WARNING, "
            f"{len(base.sent)} Sentry events built, {len(base.received)} received, "
            f"{base.runs / per:.1f} runs/message in {base.seconds:.1f}s",
            flush=True,
        )
    dlx_info = len(failure) / per
    dlx_tb = sum(r.traceback for r in failure) / per
    base_info = (
        len([r for r in budget.attributed(logging.INFO) if r.logger != "celery.worker.strategy"])
        / per
    )
    base_tb = sum(r.traceback for r in budget.attributed(logging.INFO)) / per
    met = dlx_info <= ATTEMPTS + 1 and dlx_tb <= 1
    summary(
        "P8",
        f"poison storm ({per} messages, {ATTEMPTS} attempts each): failure log records and "
        "tracebacks per message at INFO, vs. plain Celery autoretry with the same budget",
        f"<= {ATTEMPTS + 1} records, 1 traceback",
        f"celery_dlx {dlx_info:.1f} records, {dlx_tb:.1f} tracebacks; Celery autoretry (max_retries="
        f"{ATTEMPTS - 1}) {base_info:.1f} records, {base_tb:.1f} tracebacks",
        "met" if met else "not met",
    )
    summary(
        "P8",
        "poison storm: Sentry events per cause (default Sentry settings on both sides"
        + (f"; dlx_sentry_rate_limit={args.sentry_rate_limit}" if args.sentry_rate_limit else "")
        + ")",
        f"<= {limit} per cause (dlx_sentry_rate_limit)",
        f"celery_dlx {len(dlx.received)} events ({dict(dlx.causes(dlx.received))}); Celery "
        f"autoretry {len(budget.received)} events",
        "met" if worst <= limit else "not met",
    )


if __name__ == "__main__":
    main()
