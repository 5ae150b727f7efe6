"""The celery_dlx tour: ``python -m example_project.demo``.

Starts a Celery worker (with beat, which schedules the drain, and the DLX service in a thread)
and the fulfilment service, publishes a mix of good, flaky and poison messages and protobuf
events, prints every fate change as it happens, then a table of each message's final fate, and
stops everything. Exit code 0 when every message reached the fate its story expects in time.

Each run uses its own names (``--run``, default ``demo-<random>``): queues, exchanges and Redis
keys of other runs and other programs are never touched. Nothing is flushed.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

#: Seconds a kept run's Redis keys live (the graveyard stays around for the walkthrough).
KEEP_SECONDS = 24 * 3600
#: Seconds between "still waiting" lines.
PROGRESS_EVERY = 5.0


def say(text: str = "") -> None:
    print(text, flush=True)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m example_project.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--run", help="name of the run (default: demo-<random>)")
    parser.add_argument(
        "--timeout",
        type=float,
        default=90.0,
        help="seconds every message gets to reach its final fate (default: 90)",
    )
    parser.add_argument(
        "--cleanup",
        action="store_true",
        help="delete the run's queues, exchanges and Redis keys at the end",
    )
    parser.add_argument(
        "--web",
        action="store_true",
        help="at the end, serve the web console (and a worker) on 127.0.0.1:5566 until Ctrl-C",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    run = args.run or f"demo-{uuid.uuid4().hex[:8]}"
    # The app reads its names from the environment when it is imported: set them first.
    os.environ["EXAMPLE_RUN"] = run
    from . import app as names

    say(f"celery_dlx demo, run {run!r}")
    say(f"  broker {names.BROKER_URL}   redis {names.REDIS_URL}")
    problem = _check_services(names)
    if problem:
        say(f"cannot start: {problem}")
        say("start RabbitMQ and Redis (bash scripts/ensure-services.sh, or docker compose up)")
        return 2
    rundir = Path(tempfile.mkdtemp(prefix=f"celery_dlx-{run}-"))
    try:
        ok = _tour(names, run, rundir, args.timeout)
        if args.web:
            _console(names, run, rundir)
    finally:
        if args.cleanup:
            _cleanup(names, run)
            shutil.rmtree(rundir, ignore_errors=True)
            say(f"removed the run's queues, exchanges and Redis keys ({run})")
        else:
            _keep(names, run, rundir, generated=args.run is None)
    return 0 if ok else 1


def _check_services(names: Any) -> str | None:
    from kombu import Connection

    from .world import client

    try:
        client(names.REDIS_URL).ping()
    except Exception as exc:
        return f"Redis at {names.REDIS_URL} does not answer ({exc})"
    try:
        with Connection(names.BROKER_URL, connect_timeout=5) as conn:
            conn.ensure_connection(max_retries=1)
    except Exception as exc:
        return f"RabbitMQ at {names.BROKER_URL} does not answer ({exc})"
    return None


def _tour(names: Any, run: str, rundir: Path, timeout: float) -> bool:
    from celery_dlx.wiring.runtime import get_runtime

    from . import processes, schema, story
    from .report import table
    from .world import Database, Gateway, Ledger, client

    say(f"  protobuf schema compiled to {schema.descriptor_set()}")
    app = names.app
    runtime = get_runtime(app)
    world = client(names.REDIS_URL)
    services = [processes.start_worker(run, rundir), processes.start_fulfilment(run, rundir)]
    say(f"starting a worker (-B, DLX service inside) and the fulfilment service; logs in {rundir}")
    try:
        with app.connection_for_write() as conn:
            processes.wait_ready(
                conn,
                [names.ORDERS, names.SHIPPING, names.DEAD, names.FULFILMENT],
                services,
                timeout=60.0,
                say=say,
            )
        since = f"{int(time.time() * 1000)}-0"
        tracked = story.publish_orders(app, Gateway(world, run), Database(world, run))
        tracked.append(story.publish_undecodable(app, names.ORDERS))
        tracked += story.publish_events(app, names.FULFILMENT)
        say(f"published {len(tracked)} messages; fates as they happen:")
        ledger = Ledger(world, run)
        final = _watch(runtime, tracked, ledger, since, timeout, Database(world, run))
    except RuntimeError as exc:
        say(f"the demo could not run: {exc}")
        return False
    finally:
        say("stopping the worker and the fulfilment service...")
        for service in services:
            service.stop()
    say()
    say(table(final))
    say()
    _show_event(runtime, final)
    missing = [f for f in final if not f.final]
    wrong = [f for f in final if f.final and not f.as_expected]
    if missing:
        say(f"{len(missing)} message(s) did not reach a fate within {timeout:g}s")
    if wrong:
        say(f"{len(wrong)} message(s) met another fate than the story expects")
    if not missing and not wrong:
        done = sum(1 for f in final if f.fate == story.DONE)
        recovered = sum(1 for f in final if f.fate == story.RECOVERED)
        buried = sum(1 for f in final if f.fate == story.BURIED)
        say(f"every message reached its fate: {done} done, {recovered} recovered, {buried} buried")
    return not missing and not wrong


def _watch(
    runtime: Any, tracked: list[Any], ledger: Any, since: str, timeout: float, database: Any
) -> list[Any]:
    """Print fate changes until every message has its final fate (or ``timeout``)."""
    from .report import fates

    labels = {t.message_id: t.label for t in tracked}
    late_row = next(t for t in tracked if t.kind == "late row").message_id
    published_ms = int(since.split("-")[0])
    start = last_progress = time.monotonic()
    last_id = since
    while True:
        reply = runtime.redis.xread({runtime.keys.history: last_id}, count=100, block=500)
        batch = []
        for _, entries in reply or []:
            for entry_id, raw in entries:
                last_id = _text(entry_id)
                batch.append({_text(k): _text(v) for k, v in raw.items()})
        if _show(batch, labels, published_ms, late_row):
            # The other service commits the row while the task waits in Redis.
            database.insert("A-1006", {"order_id": "A-1006", "customer": "c-6"})
            say("           (another service commits the row of order A-1006 now)")
        current = fates(runtime, tracked, ledger, since)
        now = time.monotonic()
        if all(f.final for f in current) or now - start > timeout:
            return current
        if now - last_progress >= PROGRESS_EVERY:
            last_progress = now
            waiting = [f.tracked.label for f in current if not f.final]
            say(f"  +{now - start:5.1f}s  waiting for {len(waiting)}: {', '.join(waiting)}")


def _show(batch: list[dict[str, str]], labels: dict[str, str], t0_ms: int, late_row: str) -> bool:
    """Print the history entries of tracked messages; True when the late row's first park shows."""
    from .report import describe

    # Processes append concurrently: show a batch in the order the changes happened.
    batch.sort(key=lambda f: (int(f.get("at_ms") or 0), f.get("fate") != "drained"))
    parked_late_row = False
    for fields in batch:
        label = labels.get(fields.get("message_id", ""))
        if label is None:
            continue
        at = (int(fields.get("at_ms") or t0_ms) - t0_ms) / 1000
        say(describe(fields, label, at))
        if fields.get("message_id") == late_row and fields.get("fate") == "parked":
            parked_late_row = fields.get("attempt") == "1"
    return parked_late_row


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _show_event(runtime: Any, final: list[Any]) -> None:
    """Decode the buried protobuf event the way ``celery dlx show`` does."""
    from celery_dlx.codecs import decode_payload, registry_from_config
    from celery_dlx.ops.obituaries import get_obituary

    buried = [f.obituary for f in final if f.tracked.kind == "foreign poison" and f.obituary]
    ob = get_obituary(runtime, buried[0].id, with_payload=True) if buried else None
    if ob is None:
        return
    decoded = decode_payload(
        ob.payload or b"",
        content_type=ob.content_type,
        content_encoding=ob.content_encoding,
        headers=ob.headers,
        registry=registry_from_config(runtime.config),
    )
    say(f"the buried fulfilment event, decoded with the descriptor set: {decoded.type_name}")
    say(f"  {decoded.data}")
    say()


def _keep(names: Any, run: str, rundir: Path, *, generated: bool) -> None:
    """Leave the run's graveyard for the walkthrough; say how to look at it."""
    if generated:
        from .world import client

        redis = client(names.REDIS_URL)
        for key in redis.scan_iter(match="{" + run + "}*", count=1000):
            redis.expire(key, KEEP_SECONDS)
    celery = _celery_command()
    kept = "its Redis keys expire in a day" if generated else "nothing expires"
    say(f"the run is kept ({kept}); look around as example_project/README.md shows:")
    say(f"  export EXAMPLE_RUN={run}")
    for command in (
        "list",
        "groups",
        "show <obituary id>",
        "replay --cause <cause> --canary",
        "web   (the console on http://127.0.0.1:5566/)",
    ):
        say(f"  {celery} -A example_project.app dlx {command}")
    say(f"  logs: {rundir}")


def _console(names: Any, run: str, rundir: Path) -> None:
    """Serve the web console over the run's graveyard, with a worker to replay to, until Ctrl-C."""
    try:
        from celery_dlx.wiring.runtime import get_runtime
        from celery_dlx_console.console import WebSettings
        from celery_dlx_console.server import Background

        from . import processes

        server = Background(get_runtime(names.app), WebSettings()).start()
    except Exception as exc:  # the web extra missing, the port taken: the tour is done anyway
        say(f"the console could not start ({exc}); pip install 'celery-dlx[web]'")
        return
    worker = processes.start_worker(run, rundir)
    say(f"console: {server.url}/causes  (a worker runs for replays; Ctrl-C to stop)")
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        say("stopping the console and the worker...")
    finally:
        server.stop()
        worker.stop()


def _celery_command() -> str:
    """How to call this interpreter's ``celery`` (``.venv/bin/celery`` from the repository)."""
    path = Path(sys.executable).parent / "celery"
    if not path.exists():
        return "celery"
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _cleanup(names: Any, run: str) -> None:
    """Delete what this run declared and wrote, and nothing else."""
    from .world import client

    with names.app.connection_for_write() as conn:
        channel = conn.channel()
        for queue in (names.ORDERS, names.SHIPPING, names.FULFILMENT, names.DEAD):
            try:
                channel.queue_delete(queue)
            except Exception:  # never declared: the broker closed the channel
                channel = conn.channel()
        for exchange in (names.DLX_EXCHANGE, names.ORDERS, names.SHIPPING):
            try:
                channel.exchange_delete(exchange)
            except Exception:
                channel = conn.channel()
    redis = client(names.REDIS_URL)
    for key in redis.scan_iter(match="{" + run + "}*", count=1000):
        redis.delete(key)


if __name__ == "__main__":
    sys.exit(main())
