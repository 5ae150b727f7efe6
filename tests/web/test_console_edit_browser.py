"""The edit page in a real browser (Playwright driving Debian's Chromium): an editor changes a
buried Celery task's ``kwargs.x`` and a header, sees the diff, confirms, and the edited copy runs
on a real worker as a new task; operators and viewers get no edit link and are refused (403);
an XSS string as an edited value stays inert text in the diff. Screenshots go to
``$DLX_CONSOLE_SHOTS`` (``docs/console`` regenerates the documentation's)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu.serialization import dumps

from celery_dlx.message.obituary import Obituary
from celery_dlx.ops import obituaries
from celery_dlx_console.server import Background
from celery_dlx_edit.edit import edits_of
from tests.integration.dlx_apps import worker
from tests.integration.helpers import queue_depth, wait_until
from tests.web.conftest import serve
from tests.web.helpers import OPERATOR, VIEWER, XSS, Client, bury, task_obituary
from tests.web.test_console_browser import (  # the module's browser, shots and skip rule
    browser,
    open_as,
    pytestmark,
    shots,
)

__all__ = ["browser", "pytestmark", "shots"]

EDITOR = ("ed", "ed-secret")


@pytest.fixture
def edit_shop(shop: dict[str, Any], broker: Any) -> Iterator[dict[str, Any]]:
    """The shop of the console tests with a task that buries unless ``x`` is a number, and a
    console with an operator, an editor and a viewer."""
    app, runtime = shop["app"], shop["runtime"]
    done = f"{shop['done']}:charge"

    @app.task(bind=True, name=f"charge-{shop['uid']}")
    def charge(self: Any, order_id: int, x: Any = None) -> None:
        if not isinstance(x, int):
            raise ValueError(f"x must be a number, got {x!r}")
        runtime.redis.rpush(done, json.dumps([self.request.id, order_id, x]))

    channel = broker.channel()
    app.amqp.queues[app.conf.task_default_queue](channel).declare()
    server: Background = serve(runtime, editors=(":".join(EDITOR),))
    try:
        yield {**shop, "charge": charge, "charge_done": done, "url": server.url, "channel": channel}
    finally:
        server.stop()


def buried_charge(app: Any, name: str, x: Any) -> Obituary:
    """An obituary of a real protocol 2 message of ``name`` with ``kwargs`` order_id and x."""
    ob = task_obituary(app, name, 1, cause="bad-x", exc_type="ValueError")
    message = app.amqp.as_task_v2(ob.message_id, name, args=(), kwargs={"order_id": 1, "x": x})
    _ct, _enc, body = dumps(message.body, serializer="json")
    raw = body if isinstance(body, bytes) else body.encode()
    ob.payload, ob.payload_size = raw, len(raw)
    ob.headers = {**dict(message.headers), "x-tenant": "acme"}
    return ob


def test_editor_edits_previews_and_replays_and_it_runs(
    browser: Any, edit_shop: dict[str, Any], shots: Path
) -> None:
    app, runtime = edit_shop["app"], edit_shop["runtime"]
    ob = buried_charge(app, edit_shop["charge"].name, "bad")
    bury(runtime, [ob])
    context, page, watch = open_as(browser, edit_shop["url"], EDITOR)
    try:
        page.goto(f"/obituary?id={ob.id}")
        page.locator("#edit-link").click()
        page.wait_for_selector("#edit-form")
        assert "kwargs = " in page.inner_text("#current-args")
        form = page.locator("#edit-form")
        form.locator("input[name=path]").first.fill("kwargs.x")
        form.locator("input[name=value]").first.fill("5")
        form.locator("input[name=header]").first.fill("x-tenant")
        form.locator("input[name=header_value]").first.fill('"globex"')
        page.screenshot(path=str(shots / "edit-form.png"), full_page=True)
        form.locator("button[type=submit]").click()
        page.wait_for_selector("#edit-confirm")
        rows = page.locator("#diff tbody tr")
        assert rows.count() == 3
        assert rows.nth(0).inner_text().split("\t") == ["payload", "kwargs.x", '"bad"', "5"]
        assert rows.nth(1).inner_text().split("\t") == ["header", "x-tenant", '"acme"', '"globex"']
        # Celery's display header follows the arguments
        assert rows.nth(2).inner_text().split("\t") == [
            "header",
            "kwargsrepr",
            json.dumps("{'order_id': 1, 'x': 'bad'}"),
            json.dumps("{'order_id': 1, 'x': 5}"),
        ]
        page.screenshot(path=str(shots / "edit-preview.png"), full_page=True)
        # the preview published nothing
        assert queue_depth(edit_shop["channel"], app.conf.task_default_queue) == 0
        assert obituaries.get_obituary(runtime, ob.id).replays == []  # type: ignore[union-attr]

        with worker(app):
            page.locator("#edit-confirm button[type=submit]").click()
            page.wait_for_selector("#edit-done")
            new_id = page.inner_text("#new-message-id")
            wait_until(
                lambda: runtime.redis.llen(edit_shop["charge_done"]) == 1,
                timeout=60,
                what="the edited task's run",
            )
        ran = json.loads(runtime.redis.lrange(edit_shop["charge_done"], 0, -1)[0])
        assert ran == [new_id, 1, 5] and new_id != ob.message_id
        assert str(uuid.UUID(new_id)) == new_id
        page.screenshot(path=str(shots / "edit-done.png"), full_page=True)

        edits = edits_of(runtime, ob.id)
        assert [(e["user"], e["role"], e["paths"], e["headers"]) for e in edits] == [
            ("ed", "editor", ["kwargs.x"], ["x-tenant", "kwargsrepr"])
        ]
        page.goto(f"/obituary?id={ob.id}")
        assert new_id in page.inner_text("#edits")
        page.goto("/audit")
        assert (
            f"edited kwargs.x, header x-tenant, header kwargsrepr; replayed as message {new_id}"
            in page.inner_text("#audit")
        )
        assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
    finally:
        context.close()


@pytest.mark.parametrize("who", [OPERATOR, VIEWER], ids=["operator", "viewer"])
def test_operators_and_viewers_cannot_edit(
    browser: Any, edit_shop: dict[str, Any], who: tuple[str, str]
) -> None:
    app, runtime = edit_shop["app"], edit_shop["runtime"]
    ob = buried_charge(app, edit_shop["charge"].name, "bad")
    bury(runtime, [ob])
    context, page, watch = open_as(browser, edit_shop["url"], who)
    try:
        page.goto(f"/obituary?id={ob.id}")
        assert page.locator("#edit-link").count() == 0
        response = page.goto(f"/edit?id={ob.id}")
        assert response is not None and response.status == 403
        assert "only editors" in page.inner_text("#error")
        # a hand-made post with a valid CSRF token of this user is refused too
        token = Client(edit_shop["url"], who).get("/api/csrf").json()["token"]
        posted = page.request.post(
            "/actions/edit",
            form={"csrf": token, "id": ob.id, "path": "kwargs.x", "value": "5", "step": "replay"},
            headers={"Origin": edit_shop["url"]},
        )
        assert posted.status == 403
        assert queue_depth(edit_shop["channel"], app.conf.task_default_queue) == 0
        assert edits_of(runtime, ob.id) == []
        assert not watch.dialogs and not watch.errors
    finally:
        context.close()


def test_an_xss_value_stays_text_in_the_diff(browser: Any, edit_shop: dict[str, Any]) -> None:
    app, runtime = edit_shop["app"], edit_shop["runtime"]
    ob = buried_charge(app, edit_shop["charge"].name, XSS)
    bury(runtime, [ob])
    context, page, watch = open_as(browser, edit_shop["url"], EDITOR)
    try:
        page.goto(f"/edit?id={ob.id}")
        form = page.locator("#edit-form")
        form.locator("input[name=path]").first.fill("kwargs.note")
        form.locator("input[name=value]").first.fill(json.dumps(XSS))
        form.locator("button[type=submit]").click()
        page.wait_for_selector("#edit-confirm")
        before = page.locator("#diff tbody tr").first
        assert before.locator("td.after").inner_text() == json.dumps(XSS, ensure_ascii=False)
        assert page.evaluate("typeof window.__xss") == "undefined"
        assert page.locator("script:not([src])").count() == 0
        assert page.locator("img[src=x]").count() == 0
        # the XSS in the current payload (kwargs.x) is text as well
        assert json.dumps(XSS) in page.inner_text("#current-args")
        # a CSRF-less post is refused
        posted = page.request.post(
            "/actions/edit",
            form={"id": ob.id, "path": "kwargs.x", "value": "5", "step": "replay"},
            headers={"Origin": edit_shop["url"]},
        )
        assert posted.status == 403
        assert queue_depth(edit_shop["channel"], app.conf.task_default_queue) == 0
        assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
    finally:
        context.close()
