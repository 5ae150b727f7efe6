"""Burials reach Sentry once per cause: a local HTTP server is the DSN, real envelopes decoded.

The rate limit is kept in the real Redis, so it holds across processes.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import sentry_sdk
from celery import Celery
from celery.app.trace import LOG_FAILURE
from sentry_sdk.integrations.logging import LoggingIntegration

from celery_dlx.fates import BURIED, PARKED, REQUEUED, FateEvent
from celery_dlx.integrations import CeleryEchoFilter, SentryReporter, install_integrations
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL, REDIS_URL, ROOT
from tests.sentry_sink import SentrySink


@pytest.fixture
def sink() -> Iterator[SentrySink]:
    with SentrySink() as running:
        yield running
    sentry_sdk.init()  # leave no client behind for other tests


def _init(sink: SentrySink, **kw: Any) -> None:
    sentry_sdk.init(
        dsn=sink.dsn,
        integrations=[LoggingIntegration(level=logging.INFO, event_level=logging.ERROR)],
        **kw,
    )


def _app(uid: str, key_prefix: str, **conf: Any) -> Celery:
    app = Celery(f"sentry-test-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(
        dlx_key_prefix=key_prefix, dlx_redis_url=REDIS_URL, dlx_send_events=False, **conf
    )
    return app


def _burial(cause: str, i: int, importance: str = "page", **kw: Any) -> FateEvent:
    return FateEvent.from_fields(
        fate=BURIED,
        queue="orders",
        message_id=f"{cause}-{i}",
        attempt=8,
        task="shop.charge",
        cause=cause,
        exc_type="shop.errors.BadOrder",
        exc_message=f"order {i} is bad",
        reason="park budget spent",
        importance=importance,
        traceback=(
            "Traceback (most recent call last):\n"
            '  File "/srv/shop/tasks.py", line 31, in charge\n'
            "    raise BadOrder(f'order {order_id} is bad')\n"
            f"shop.errors.BadOrder: order {i} is bad\n"
        ),
        extra={"history": [[1000, REQUEUED, cause], [2000, PARKED, cause], [3000, BURIED, cause]]},
        **kw,
    )


def _settled(sink: SentrySink, expected: int) -> list[dict[str, Any]]:
    """The events once ``expected`` arrived and the client has nothing more in flight."""
    sentry_sdk.flush(timeout=10)
    sink.wait_for(lambda evs: len(evs) >= expected)
    sentry_sdk.flush(timeout=10)  # a flushed client has nothing more in flight
    return list(sink.events)


def test_poison_storm_of_two_causes_makes_one_event_per_cause(
    sink: SentrySink, uid: str, key_prefix: str
) -> None:
    _init(sink)
    app = _app(uid, key_prefix, dlx_sentry_rate_limit=1, dlx_sentry_rate_window=600)
    runtime = get_runtime(app)
    install_integrations(app, runtime)
    for i in range(10):
        runtime.record(_burial(f"cause-a-{uid}", i), history=False)
        runtime.record(_burial(f"cause-b-{uid}", i, importance="notify"), history=False)
    runtime.record(_burial(f"cause-c-{uid}", 0, importance="ignore"), history=False)
    events = _settled(sink, 2)
    assert len(events) == 2, [e.get("fingerprint") for e in events]
    by_cause = {e["fingerprint"][0]: e for e in events}
    assert set(by_cause) == {f"cause-a-{uid}", f"cause-b-{uid}"}
    page, notify = by_cause[f"cause-a-{uid}"], by_cause[f"cause-b-{uid}"]
    assert (page["level"], notify["level"]) == ("fatal", "warning")
    assert page["tags"] == {
        "queue": "orders",
        "task": "shop.charge",
        "attempts": "8",
        "importance": "page",
        "fate": "buried",
    }
    (exc,) = page["exception"]["values"]
    assert (exc["type"], exc["module"], exc["value"]) == (
        "BadOrder",
        "shop.errors",
        "order 0 is bad",
    )
    assert exc["stacktrace"]["frames"][-1]["function"] == "charge"
    crumbs = [c["data"]["fate"] for c in page["breadcrumbs"]["values"]]
    assert crumbs == ["requeued", "parked", "buried"]
    assert "payload" not in page.get("extra", {})


def test_rate_limit_holds_across_processes(sink: SentrySink, uid: str, key_prefix: str) -> None:
    script = textwrap.dedent(
        f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        import sentry_sdk
        from celery import Celery
        from celery_dlx.integrations import install_integrations
        from celery_dlx.wiring.runtime import get_runtime
        from tests.integration.test_sentry import _burial

        sentry_sdk.init(dsn={sink.dsn!r}, default_integrations=False)
        app = Celery("child", broker={BROKER_URL!r}, set_as_current=False)
        app.conf.update(dlx_key_prefix={key_prefix!r}, dlx_redis_url={REDIS_URL!r},
                        dlx_send_events=False, dlx_sentry_rate_limit=3)
        runtime = get_runtime(app)
        install_integrations(app, runtime)
        for i in range(10):
            runtime.record(_burial("shared-{uid}", i), history=False)
        sentry_sdk.flush(timeout=10)
        """
    )
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=ROOT) for _ in range(3)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0]
    events = sink.wait_for(lambda evs: len(evs) >= 3)
    assert len(events) == 3  # every child flushed before exiting: no more can arrive
    assert {e["fingerprint"][0] for e in events} == {f"shared-{uid}"}
    used = sorted(e["contexts"]["celery_dlx"]["events_of_cause_in_window"] for e in events)
    assert used == [1, 2, 3]


def test_payload_only_when_the_setting_opts_in(sink: SentrySink, uid: str, key_prefix: str) -> None:
    _init(sink)
    app = _app(uid, key_prefix, dlx_sentry_include_payload=True, dlx_sentry_payload_limit=64)
    runtime = get_runtime(app)
    install_integrations(app, runtime)
    body = b'{"order_id": 42, "note": "' + b"n" * 500 + b'"}'
    extra = {"payload": body, "content_type": "application/json", "content_encoding": "utf-8"}
    event = _burial(f"payload-{uid}", 0)
    event.extra.update(extra)
    runtime.record(event, history=False)
    (sent,) = _settled(sink, 1)
    assert sent["extra"]["payload_bytes"] == len(body)
    assert sent["extra"]["payload_truncated"] is True
    assert len(sent["extra"]["payload"].encode()) <= 64
    assert "42" in sent["extra"]["payload"]


def test_listener_is_installed_once_and_only_when_enabled(uid: str, key_prefix: str) -> None:
    app = _app(uid, key_prefix)
    runtime = get_runtime(app)
    first = install_integrations(app, runtime)
    assert [type(x) for x in first] == [CeleryEchoFilter, SentryReporter]
    assert install_integrations(app, runtime) == []
    off = _app(uid, key_prefix, dlx_sentry=False)
    assert [type(x) for x in install_integrations(off, get_runtime(off))] == [CeleryEchoFilter]


def test_celery_integration_on_real_worker_reports_each_cause_once(
    sink: SentrySink,
    uid: str,
    redis_client: Any,
    vhost: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """sentry-sdk's CeleryIntegration on, DLX tasks failing through requeues, parks and burial:
    only the burial events arrive, one per cause, from the DLX service; the logs have one line
    per fate change and the traceback once, at burial. In its own vhost: every ERROR line of the
    process is an event, and on a shared vhost any client's broadcast the worker cannot handle
    logs one."""
    caplog.set_level(logging.INFO)
    import threading

    from sentry_sdk.integrations.celery import CeleryIntegration

    from celery_dlx.message.headers import fingerprint
    from celery_dlx.service.loop import DLXService
    from celery_dlx.store.graveyard import Graveyard
    from tests.integration.dlx_apps import drain_thread, make_app, worker

    _init(sink)  # default integrations too: logging (events from ERROR lines), threading...
    sentry_sdk.init(
        dsn=sink.dsn,
        integrations=[
            CeleryIntegration(),
            LoggingIntegration(level=logging.INFO, event_level=logging.ERROR),
        ],
    )
    app = make_app(uid, broker_url=vhost, dlx_sentry_rate_limit=1, task_acks_late=True)
    runtime = get_runtime(app)

    @app.task(name=f"charge-{uid}", dlx_importance="page")
    def charge(order_id: int) -> None:
        raise ValueError(f"order {order_id} is bad")

    @app.task(name=f"ship-{uid}")
    def ship(sku: str) -> None:
        raise LookupError(f"no stock for sku {sku}")

    service = DLXService(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        with worker(app, loglevel="INFO"), drain_thread(app):
            for i in range(3):
                charge.delay(i)
                ship.delay(f"s{i}")
            graveyard = Graveyard(redis_client, runtime.keys)
            deadline = time.monotonic() + 90
            while graveyard.count() < 6 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert graveyard.count() == 6, "six poison messages should be buried"
    finally:
        service.stop()
        thread.join(30)
    events = _settled(sink, 2)
    want = {
        fingerprint(f"charge-{uid}", "ValueError", "order 0 is bad"): "fatal",
        fingerprint(f"ship-{uid}", "LookupError", "no stock for sku s0"): "warning",
    }
    got = {e["fingerprint"][0]: e["level"] for e in events}
    assert got == want, [(e.get("logger"), e.get("exception", {}).get("values")) for e in events]
    assert all(e["tags"]["fate"] == "buried" for e in events)
    assert all(e["tags"]["attempts"] == "5" for e in events)
    crumbs = [c["data"]["fate"] for c in events[0]["breadcrumbs"]["values"]]
    assert crumbs == ["requeued", "requeued", "parked", "parked", "buried"]

    ids = {r.message.split("[", 1)[1].split("]", 1)[0] for r in caplog.records
           if r.name == "celery_dlx" and r.message.startswith("buried ")}  # fmt: skip
    assert len(ids) == 6
    mine = [r for r in caplog.records if any(i in r.getMessage() for i in ids)]
    fates = Counter(r.getMessage().split(" ", 1)[0] for r in mine if r.name == "celery_dlx")
    # One line per failed attempt (the drain's republish is logged at DEBUG): attempts lines each.
    assert fates == {"requeued": 12, "parked": 12, "buried": 6}
    # Requeued and parked runs leave no Celery line; the burying run fails as in plain Celery,
    # with Celery's own failure line (and traceback), once per message.
    echoes = [r for r in mine if r.name == "celery.app.trace"]
    assert [(r.levelname, r.msg) for r in echoes] == [("ERROR", LOG_FAILURE)] * 6, echoes[:3]
    with_traceback = [r for r in mine if r.exc_info or "Traceback (most recent" in r.getMessage()]
    # One traceback per burial: Celery's line prints it, the burial line only names the cause.
    assert sorted((r.name, r.levelname) for r in with_traceback) == sorted(
        [("celery.app.trace", "ERROR")] * 6
    )
