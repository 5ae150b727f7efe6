"""The app the P1-P3 and P10 benchmark workers run: plain Celery or celery_dlx, by environment.

``BENCH_MODE`` is ``dlx`` (celery_dlx installed and enabled) or ``plain`` (Celery alone, with
``task_acks_late=True``: the same delivery guarantee as celery_dlx, which acks after the fate is
settled; a failing ``bench.work`` uses Celery's ``autoretry_for`` with its default retry delay and
budget); ``BENCH_UID`` names the queue and keys; ``BENCH_PREFETCH`` sets the prefetch multiplier.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery
from celery.exceptions import Ignore

import celery_dlx

try:
    from benchmarks._common import BROKER_URL, REDIS_URL
except ImportError:  # run as a worker with benchmarks/ on the path
    from _common import BROKER_URL, REDIS_URL  # type: ignore[no-redef]

MODE = os.environ.get("BENCH_MODE", "dlx")
UID = os.environ.get("BENCH_UID", "bench")
PREFIX = f"bench-{UID}"


def make_app(mode: str, uid: str, prefetch: int = 10) -> Celery:
    """The benchmark app for ``mode`` (publishers use it too, so queues are declared alike)."""
    app = Celery(f"bench-{uid}", broker=BROKER_URL, set_as_current=False)
    if mode == "dlx":
        celery_dlx.install(app)
    app.conf.update(
        task_default_queue=f"bench-{uid}",
        worker_prefetch_multiplier=prefetch,
        task_ignore_result=True,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        # The same guarantee on both sides: a message is acked after its run, not before.
        task_acks_late=True,
    )
    if mode == "dlx":
        app.conf.update(
            dlx_enabled=True,
            dlx_redis_url=REDIS_URL,
            dlx_key_prefix=f"bench-{uid}",
            dlx_exchange=f"bench-dlx-{uid}",
            dlx_service_queue=f"bench-dead-{uid}",
            dlx_backoff=[3600.0],
        )
        # Set by p2_instructions.py only: under valgrind the wall clock (and with it the drain's
        # once-a-second poll) stretches some fifty times, which no task pays for.
        drain_interval = os.environ.get("BENCH_DRAIN_INTERVAL")
        if drain_interval:
            app.conf.dlx_drain_interval = float(drain_interval)
    return app


app = make_app(MODE, UID, int(os.environ.get("BENCH_PREFETCH", "10")))

#: Experiments (``BENCH_EXPERIMENTS``, comma separated): variants of celery_dlx's worker patched
#: into this worker only, to measure them (see ``bench_experiments``; ``no_events``).
EXPERIMENTS = {e for e in os.environ.get("BENCH_EXPERIMENTS", "").split(",") if e}
if MODE == "dlx" and EXPERIMENTS:
    import bench_experiments

    bench_experiments.apply(app, EXPERIMENTS)
_redis = redis.Redis.from_url(REDIS_URL)

if os.environ.get("BENCH_PROBE_TICKS"):
    from celery.signals import worker_ready

    @worker_ready.connect(weak=False)
    def _probe_ticks(**_: Any) -> None:
        """Record each long wait of the worker's event loop (``solo_stall.py``): the gap between
        two of its turns, and what was already waiting to run (kombu's ``call_soon`` queue)
        when it went to wait. Read only, on this benchmark worker's loop."""
        from kombu.asynchronous import get_event_loop

        hub = get_event_loop()
        if hub is None:
            return
        threshold = float(os.environ["BENCH_PROBE_TICKS"])
        last: list[Any] = [None, 0, ""]

        def tick() -> None:
            now = time.monotonic()
            if last[0] is not None and now - last[0] > threshold:
                _redis.rpush(
                    key("stalls"),
                    json.dumps({"gap": now - last[0], "ready": last[1], "what": last[2]}),
                )
            ready = list(hub._ready)
            last[:] = [now, len(ready), _names(ready) if ready else ""]

        def _names(ready: list[Any]) -> str:
            counts: dict[str, int] = {}
            for item in ready:
                fun = getattr(item, "fun", item)
                fun = getattr(fun, "func", fun)  # a partial's function
                name = getattr(fun, "__qualname__", type(fun).__name__)
                counts[name] = counts.get(name, 0) + 1
            return ", ".join(f"{n} x{c}" for n, c in sorted(counts.items()))

        hub.on_tick.add(tick)


def key(name: str) -> str:
    return "{" + PREFIX + "}:bench:" + name


def _mark(total: int) -> None:
    n = _redis.incr(key("done"))
    if n == 1:
        _redis.set(key("first"), repr(time.time()), nx=True)
    if n == total:
        _redis.set(key("last"), repr(time.time()))


@app.task(name="bench.noop")
def noop(total: int) -> None:
    """Does nothing but count itself (the same cost in both modes)."""
    _mark(total)


#: Celery's own answer to a failing task: autoretry (default delay 180 s, 3 retries).
_WORK_OPTIONS: dict[str, Any] = {} if MODE == "dlx" else {"autoretry_for": (ValueError,)}


@app.task(name="bench.work", **_WORK_OPTIONS)
def work(poison: bool, total: int) -> None:
    """A good message counts itself; a poison message always fails."""
    if _redis.get(key("first")) is None:
        _redis.set(key("first"), repr(time.time()), nx=True)
    if poison:
        raise ValueError("poison message: cannot parse payload")
    _mark(total)


@app.task(name="bench.park_hour", bind=True, max_retries=None)
def park_hour(self: Any) -> None:
    """Fails with a retry due in one hour: parked in Redis (dlx) or an ETA message (plain)."""
    _redis.incr(key("runs"))
    if self.request.retries:
        return
    raise self.retry(countdown=3600, exc=TimeoutError("supplier API rate limited"))


@app.task(name="bench.count_run")
def count_run() -> None:
    """Succeeds at once, counted like park_hour (the memory baseline of P3)."""
    _redis.incr(key("runs"))


@app.task(name="bench.count_ignore")
def count_ignore() -> None:
    """Counted like park_hour, then ends as Celery's ``Ignore`` (acked, no result, no retry):
    the cheapest way a run can end other than success, through Celery's own failure path."""
    _redis.incr(key("runs"))
    raise Ignore()


def _write_park(task: Any) -> None:
    """The least a durable park writes: the message in a hash and its due time in a sorted set,
    one ``MULTI``/``EXEC`` round trip."""
    body = {"id": task.request.id, "task": task.name, "args": "[]", "kwargs": "{}"}
    with _redis.pipeline(transaction=True) as pipe:
        pipe.hset(key("floor:messages"), task.request.id, json.dumps(body))
        pipe.zadd(key("floor:due"), {task.request.id: time.time() + 3600})
        pipe.execute()


@app.task(name="bench.count_write_ignore", bind=True)
def count_write_ignore(self: Any) -> None:
    """``count_ignore`` after the least a durable park writes, in the run itself."""
    _redis.incr(key("runs"))
    _write_park(self)
    raise Ignore()


@app.task(name="bench.count_write", bind=True)
def count_write(self: Any) -> None:
    """A success that first writes the least a durable park writes (``_write_park``)."""
    _redis.incr(key("runs"))
    _write_park(self)


@app.task(name="bench.fresh")
def fresh(sent_at: float) -> None:
    """Records how long it waited between publish and run."""
    _redis.rpush(key("latency"), repr(time.time() - sent_at))
