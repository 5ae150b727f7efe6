"""The console in a real browser (Playwright driving Debian's Chromium, no browser download)
against a real worker, Redis and RabbitMQ: a viewer reads causes and a decoded protobuf; an
operator replays a group and sees its messages run again, and purges with the typed
confirmation; XSS payloads stay inert. Screenshots of every page go to ``$DLX_CONSOLE_SHOTS``
(``docs/console`` regenerates the documentation's), else to a temporary directory."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.fates import FateEvent, now_ms
from celery_dlx.message.parked import ParkedMessage
from tests.integration.dlx_apps import worker
from tests.integration.helpers import wait_until
from tests.web.helpers import (
    OPERATOR,
    VIEWER,
    XSS,
    b64,
    bury,
    foreign_obituary,
    pickle_bomb,
    task_obituary,
)

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]

# Skipped only on a developer's machine without Chromium; under CI (CI=true, where
# scripts/setup.sh installed it) a missing browser is a failure, never a silent skip.
pytestmark = pytest.mark.skipif(
    not Path(CHROMIUM).exists() and not os.environ.get("CI"),
    reason="needs Debian's chromium (scripts/setup.sh installs it)",
)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright import sync_api

    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield chromium
        chromium.close()


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    where = os.environ.get("DLX_CONSOLE_SHOTS")
    path = Path(where) if where else tmp_path / "shots"
    path.mkdir(parents=True, exist_ok=True)
    return path


class Watch:
    """Dialogs, console messages and page errors of one page (an XSS would show in them)."""

    def __init__(self, page: Any) -> None:
        self.dialogs: list[str] = []
        self.console: list[str] = []
        self.errors: list[str] = []
        page.on("dialog", lambda d: (self.dialogs.append(d.message), d.dismiss()))
        page.on("console", lambda m: self.console.append(m.text))
        page.on("pageerror", lambda e: self.errors.append(str(e)))


def open_as(browser: Any, url: str, who: tuple[str, str]) -> tuple[Any, Any, Watch]:
    context = browser.new_context(
        base_url=url,
        http_credentials={"username": who[0], "password": who[1]},
        viewport={"width": 1280, "height": 900},
    )
    page = context.new_page()
    return context, page, Watch(page)


def populate(console: dict[str, Any]) -> dict[str, Any]:
    """A graveyard with a Celery cause, a protobuf cause, a JSON cause, a pickle cause, parked
    retries and an hour of fate counters."""
    app, runtime, events, name = (
        console["app"],
        console["runtime"],
        console["events"],
        console["task"].name,
    )
    celery = [task_obituary(app, name, i) for i in range(4)]
    proto = [
        foreign_obituary(
            "payments",
            b64(events.PaymentFailed(order_id=f"A-{i}", reason="card declined", code=51)),
            "application/x-protobuf",
            cause="3f1c9a07d2b8e4f1",
            exc_type="PaymentDeclined",
            exc_message="card declined for order <str>",
            order=i,
        )
        for i in range(3)
    ]
    orders = [
        foreign_obituary(
            "orders",
            json.dumps({"order_id": 17, "lines": [{"sku": "X-1", "qty": 2}]}).encode(),
            "application/json",
            cause="9b0e44d1a6c35f20",
            exc_type="KeyError",
            exc_message="'customer'",
            order=5,
        )
    ]
    legacy = [
        foreign_obituary(
            "legacy",
            pickle_bomb("/tmp/never-loaded"),
            "application/x-python-serialize",
            cause="5e2d7f3b19a0c864",
            exc_type="UnpicklingRefused",
            exc_message="pickle payload",
        )
    ]
    bury(runtime, celery + proto + orders + legacy)
    now = now_ms()
    queue = app.conf.task_default_queue
    for i, due in enumerate((now - 42_000, now - 3_000, now + 90_000, now + 600_000)):
        runtime.store.park(
            ParkedMessage(
                f"parked-{i}",
                2,
                "payments" if i % 2 else queue,
                b"{}",
                due_ms=due,
                cause="3f1c9a07d2b8e4f1",
            )
        )
    events_ = []
    for minute in range(60):
        at = now - minute * 60_000
        for fate, n in (
            ("requeued", 6 + minute % 7),
            ("parked", 3 + minute % 4),
            ("buried", minute % 3),
        ):
            events_.extend(
                FateEvent.from_fields(
                    fate, queue=queue, message_id=f"c-{minute}-{fate}-{k}", attempt=1, at_ms=at
                )
                for k in range(n)
            )
    runtime.record_many(events_)
    return {"celery": celery, "proto": proto, "orders": orders, "legacy": legacy}


def test_viewer_reads_causes_and_a_decoded_protobuf(
    browser: Any, console: dict[str, Any], shots: Path
) -> None:
    data = populate(console)
    context, page, watch = open_as(browser, console["url"], VIEWER)
    try:
        page.goto("/")
        assert page.inner_text("#who") == "viewer · viewer"
        assert page.inner_text("#graveyard-total") == "9"
        assert page.locator("#fate-chart polyline").count() >= 3
        page.screenshot(path=str(shots / "overview.png"), full_page=True)
        page.click("nav >> text=Causes")
        assert page.locator("tr.cause").count() == 4
        page.screenshot(path=str(shots / "causes.png"), full_page=True)
        page.click("a:text('3f1c9a07d2b8e4f1')")
        assert page.inner_text("#group-count") == "3"
        assert page.locator("#group-actions").count() == 0  # a viewer gets no action forms
        page.click(f"a:text('{data['proto'][0].id}')")
        assert page.inner_text("#type-name") == "shop.events.v1.PaymentFailed"
        decoded = json.loads(page.inner_text("#decoded"))
        assert decoded == {"order_id": "A-0", "reason": "card declined", "code": 51}
        assert "base64" in page.inner_text("#payload-kind")
        page.screenshot(path=str(shots / "obituary-protobuf.png"), full_page=True)
        page.goto("/obituary?id=" + data["legacy"][0].id)
        assert page.locator("#opaque").is_visible()
        assert not Path("/tmp/never-loaded").exists()
        page.goto("/obituary?id=" + data["celery"][0].id)
        assert "args = [" in page.inner_text("#celery-args")
        page.screenshot(path=str(shots / "obituary-celery.png"), full_page=True)
        page.goto("/parked")
        assert page.inner_text("#parked-count") == "4" and page.inner_text("#parked-due") == "2"
        page.screenshot(path=str(shots / "parked.png"), full_page=True)
        # A viewer posting anyway (a hand-made form from the console's origin) is refused.
        response = page.request.post(
            "/actions/purge",
            form={"cause": "3f1c9a07d2b8e4f1"},
            headers={"Origin": console["url"]},
        )
        assert response.status == 403 and "viewer" in response.text()
        assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
    finally:
        context.close()


def test_operator_replays_a_group_and_the_messages_run(
    browser: Any, console: dict[str, Any], shots: Path
) -> None:
    app, runtime = console["app"], console["runtime"]
    data = populate(console)
    context, page, watch = open_as(browser, console["url"], OPERATOR)
    try:
        page.goto("/causes")
        page.click("a:text('backend-down')")
        page.screenshot(path=str(shots / "group.png"), full_page=True)
        runtime.redis.set(console["fixed"], 1)  # the cause is fixed
        with worker(app):
            form = page.locator("#replay-group")
            form.locator("input[name=rate]").fill("20")
            form.locator("input[name=canary]").check()
            form.locator("button[type=submit]").click()
            page.wait_for_url(re.compile(r"/jobs/\w+"))
            page.wait_for_selector("#job-status.status-done", timeout=120_000)
            assert "Replayed 4 of 4" in page.inner_text("#job-summary")
            assert "recovered" in page.inner_text("#canary")
            page.screenshot(path=str(shots / "job.png"), full_page=True)
            wait_until(lambda: runtime.redis.llen(console["done"]) == 4, timeout=60, what="4 runs")
        ran = sorted(int(x) for x in runtime.redis.lrange(console["done"], 0, -1))
        assert ran == [0, 1, 2, 3]
        page.goto("/obituary?id=" + data["celery"][0].id)
        assert page.locator("#ledger li").count() == 1
        page.goto("/audit")
        row = page.locator("#audit tbody tr").first.inner_text()
        assert "op (operator)" in row and "replay" in row and "cause backend-down" in row
        page.screenshot(path=str(shots / "audit.png"), full_page=True)
        assert not watch.dialogs and not watch.errors
    finally:
        context.close()


def test_operator_purges_with_typed_confirmation(
    browser: Any, console: dict[str, Any], shots: Path
) -> None:
    runtime = console["runtime"]
    populate(console)
    context, page, watch = open_as(browser, console["url"], OPERATOR)
    try:
        page.goto("/group?cause=9b0e44d1a6c35f20")
        form = page.locator("#purge-group")
        form.locator("input[name=confirm]").fill("purge everything")
        form.locator("button[type=submit]").click()
        assert "not purged: type 'purge 1'" in page.inner_text("#error")
        page.goto("/group?cause=9b0e44d1a6c35f20")
        form = page.locator("#purge-group")
        form.locator("input[name=confirm]").fill("purge 1")
        page.screenshot(path=str(shots / "purge-confirm.png"), full_page=True)
        form.locator("button[type=submit]").click()
        page.wait_for_selector("#job-status.status-done", timeout=60_000)
        assert "Purged 1 of 1" in page.inner_text("#job-summary")
        purged = [f for _, f in runtime.history.read() if f["fate"] == "purged"]
        assert len(purged) == 1 and purged[0]["queue"] == "orders"
        page.goto("/causes")
        assert page.locator("a:text('9b0e44d1a6c35f20')").count() == 0
        # Selected obituaries: the select-all box (JavaScript) and the phrase hint.
        page.goto("/group?cause=3f1c9a07d2b8e4f1")
        page.check("input[data-enhance=select-all]")
        assert page.locator("input[name=ids]:checked").count() == 3
        hint = page.locator("#selected input[name=confirm]")
        assert hint.get_attribute("placeholder") == "purge 3"
        hint.fill("purge 3")
        page.click("#purge-selected")
        page.wait_for_selector("#job-status.status-done", timeout=60_000)
        assert "Purged 3 of 3" in page.inner_text("#job-summary")
        assert not watch.dialogs and not watch.errors
    finally:
        context.close()


def test_xss_payloads_are_inert(browser: Any, console: dict[str, Any], shots: Path) -> None:
    runtime = console["runtime"]
    ob = foreign_obituary(
        f"q{XSS}",
        XSS.encode(),
        "text/html",
        cause="xss-cause",
        exc_type=f"Bad{XSS}",
        exc_message=XSS,
        headers={XSS: XSS},
    )
    ob.traceback = XSS
    ob.task = XSS
    bury(runtime, [ob])
    runtime.store.park(
        ParkedMessage("xss-1", 1, f"q{XSS}", XSS.encode(), due_ms=now_ms(), task=XSS)
    )
    context, page, watch = open_as(browser, console["url"], OPERATOR)
    try:
        for path in ("/", "/causes", "/group?cause=xss-cause", f"/obituary?id={ob.id}", "/parked"):
            page.goto(path)
            page.wait_for_load_state("load")
            assert page.evaluate("typeof window.__xss") == "undefined", path
            assert page.locator("script:not([src])").count() == 0, path
        page.goto(f"/obituary?id={ob.id}")
        assert XSS in page.inner_text("#exc-message")  # shown as text
        assert XSS in page.inner_text("#traceback")
        page.screenshot(path=str(shots / "xss-inert.png"), full_page=True)
        assert not watch.dialogs, watch.dialogs
        assert not watch.errors, watch.errors
    finally:
        context.close()
