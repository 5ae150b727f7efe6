"""Replays redirected to another queue, in a real browser (Playwright driving Debian's
Chromium): an operator sends one obituary and then a whole cause group to another queue and
sees them run on a worker of only that queue, with the redirect in the job, the ledger and the
audit log; a viewer gets no form and is refused; a hostile queue name stays text everywhere.
Screenshots go to ``$DLX_CONSOLE_SHOTS`` (``docs/console`` regenerates the documentation's)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.dlx_apps import worker
from tests.integration.helpers import queue_depth, wait_until
from tests.web.helpers import OPERATOR, VIEWER, XSS, bury, task_obituary
from tests.web.redirects import redirect_shop
from tests.web.test_console_browser import (  # the module's browser, shots and skip rule
    browser,
    open_as,
    pytestmark,
    shots,
)

__all__ = ["browser", "pytestmark", "shots"]


@pytest.fixture
def shop(
    uid: str, key_prefix: str, broker: Any, cleanup_queues: list[str]
) -> Iterator[dict[str, Any]]:
    with redirect_shop(uid, key_prefix, broker, cleanup_queues) as made:
        yield made


def test_operator_redirects_one_and_a_group_and_they_run_there(
    browser: Any, shop: dict[str, Any], shots: Path
) -> None:
    app, runtime, old, new = shop["app"], shop["runtime"], shop["old"], shop["new"]
    obits = [task_obituary(app, shop["task"].name, i) for i in range(4)]
    bury(runtime, obits)
    context, page, watch = open_as(browser, shop["url"], OPERATOR)
    try:
        with worker(app, queues=[new]):
            page.goto(f"/obituary?id={obits[0].id}")
            form = page.locator("#replay-one")
            assert form.locator("input[name=to_queue]").get_attribute("placeholder") == old
            form.locator("input[name=to_queue]").fill(new)
            page.screenshot(path=str(shots / "replay-redirect-form.png"))
            form.locator("button[type=submit]").click()
            page.wait_for_url(re.compile(r"/jobs/\w+"))
            page.wait_for_selector("#job-status.status-done", timeout=120_000)
            assert page.inner_text("#redirect") == f"To queue {new}, instead of {old} (1)."
            wait_until(lambda: runtime.redis.llen(shop["done"]) == 1, timeout=60, what="1 run")

            page.goto("/group?cause=backend-down")
            form = page.locator("#replay-group")
            form.locator("input[name=to_queue]").fill(new)
            form.locator("input[name=rate]").fill("20")
            form.locator("input[name=canary]").check()
            form.locator("button[type=submit]").click()
            page.wait_for_url(re.compile(r"/jobs/\w+"))
            page.wait_for_selector("#job-status.status-done", timeout=120_000)
            assert "Replayed 3 of 4, skipped 1" in page.inner_text("#job-summary")
            assert page.inner_text("#redirect") == f"To queue {new}, instead of {old} (3)."
            assert "recovered" in page.inner_text("#canary")
            page.screenshot(path=str(shots / "replay-redirect-job.png"), full_page=True)
            wait_until(lambda: runtime.redis.llen(shop["done"]) == 4, timeout=60, what="4 runs")
        ran = sorted(x.decode() for x in runtime.redis.lrange(shop["done"], 0, -1))
        assert ran == [f"{i}:{new}" for i in range(4)]
        assert queue_depth(shop["channel"], old) == 0
        page.goto(f"/obituary?id={obits[0].id}")
        assert page.inner_text("#ledger li").endswith(f"from {old} to queue {new}")
        page.goto("/audit")
        rows = page.locator("#audit tbody tr")
        assert rows.count() == 2
        assert f"replay from {old} (3) to queue {new}" in rows.first.inner_text()
        assert f"replay from {old} (1) to queue {new}" in rows.nth(1).inner_text()
        page.screenshot(path=str(shots / "audit-redirect.png"), full_page=True)
        assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
    finally:
        context.close()


def test_viewer_gets_no_redirect_form_and_is_refused(browser: Any, shop: dict[str, Any]) -> None:
    app, runtime, new = shop["app"], shop["runtime"], shop["new"]
    ob = task_obituary(app, shop["task"].name, 0)
    bury(runtime, [ob])
    context, page, watch = open_as(browser, shop["url"], VIEWER)
    try:
        page.goto(f"/obituary?id={ob.id}")
        assert page.locator("input[name=to_queue]").count() == 0
        page.goto("/group?cause=backend-down")
        assert page.locator("input[name=to_queue]").count() == 0
        response = page.request.post(
            "/actions/replay",
            form={"ids": ob.id, "to_queue": new},
            headers={"Origin": shop["url"]},
        )
        assert response.status == 403 and "viewer" in response.text()
        assert queue_depth(shop["channel"], new) == 0
        assert [f for _, f in runtime.history.read() if f["fate"] == "replayed"] == []
        assert not watch.dialogs and not watch.errors
    finally:
        context.close()


def test_a_hostile_queue_name_stays_text(
    browser: Any, shop: dict[str, Any], cleanup_queues: list[str]
) -> None:
    app, runtime = shop["app"], shop["runtime"]
    hostile = f"q-{shop['new']}{XSS}"
    cleanup_queues.append(hostile)
    obits = [task_obituary(app, shop["task"].name, i) for i in range(2)]
    bury(runtime, obits)
    context, page, watch = open_as(browser, shop["url"], OPERATOR)
    try:
        # refused while the queue does not exist: the error names it, as text
        page.goto(f"/obituary?id={obits[0].id}")
        page.locator("#replay-one input[name=to_queue]").fill(hostile)
        page.locator("#replay-one button[type=submit]").click()
        page.wait_for_load_state("load")
        assert f"queue {hostile!r} does not exist" in page.inner_text("#error")
        assert page.evaluate("typeof window.__xss") == "undefined"
        # once it exists, a replay goes there and every page shows the name as text
        shop["channel"].queue_declare(hostile, durable=True, auto_delete=False)
        page.goto(f"/obituary?id={obits[0].id}")
        page.locator("#replay-one input[name=to_queue]").fill(hostile)
        page.locator("#replay-one button[type=submit]").click()
        page.wait_for_selector("#job-status.status-done", timeout=60_000)
        assert page.inner_text("#redirect .to-queue") == hostile
        for path in ("/audit", f"/obituary?id={obits[0].id}"):
            page.goto(path)
            page.wait_for_load_state("load")
            assert page.evaluate("typeof window.__xss") == "undefined", path
            assert page.locator("script:not([src])").count() == 0, path
            assert page.locator("img[src=x]").count() == 0, path
            assert page.inner_text(".to-queue") == hostile, path
        assert queue_depth(shop["channel"], hostile) == 1
        assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
    finally:
        context.close()
