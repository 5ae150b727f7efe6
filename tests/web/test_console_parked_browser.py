"""Obituary statuses and parked retries one by one in a real browser (Playwright driving
Debian's Chromium) against a real console, RabbitMQ and Redis: a viewer filters causes and
obituaries by status and follows a failure again to its new obituary; an operator makes a
parked retry due now, buries one, then a whole cause, each after its dry-run preview, and
finds the actions in the audit log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from celery_dlx.ops import obituaries
from tests.web.helpers import OPERATOR, VIEWER
from tests.web.test_console_browser import (  # the module's browser, shots and skip rule
    browser,
    open_as,
    populate,
    pytestmark,
    shots,
)
from tests.web.test_console_status_parked import graveyard_with_statuses

__all__ = ["browser", "pytestmark", "shots"]


def test_viewer_filters_by_status_and_follows_a_failure_again(
    browser: Any, console: dict[str, Any], shots: Path
) -> None:
    made = graveyard_with_statuses(console)
    obits, again = made["obits"], made["again"]
    context, page, watch = open_as(browser, console["url"], VIEWER)
    try:
        page.goto("/causes")
        assert page.locator("tr.cause").count() == 1  # fixed-cause is all resolved
        assert page.locator("a:text('fixed-cause')").count() == 0
        page.select_option("#status-filter select[name=status]", "all")
        page.click("#status-filter button")
        page.wait_for_url("**/causes?status=all")
        assert page.locator("tr.cause").count() == 2
        fixed = page.locator("tr.cause", has=page.locator("a:text('fixed-cause')"))
        assert fixed.locator("td.resolved").inner_text() == "2"
        page.screenshot(path=str(shots / "causes-status.png"), full_page=True)
        page.click("a:text('backend-down')")
        assert page.inner_text("#group-resolved") == "1"
        assert page.locator("#obituaries tbody tr").count() == 5  # status all, from the causes
        page.goto("/group?cause=backend-down")
        assert page.locator("#obituaries tbody tr").count() == 2  # unresolved by default
        page.select_option("#filters select[name=status]", "failed-again")
        page.click("#filters button[type=submit]")
        page.wait_for_url("**status=failed-again**")
        rows = page.locator("#obituaries tbody tr")
        assert rows.count() == 1 and obits[0].id in rows.first.inner_text()
        assert rows.first.locator(".badge").inner_text() == "failed-again"
        page.screenshot(path=str(shots / "group-failed-again.png"), full_page=True)
        rows.first.locator("a.next").click()
        page.wait_for_url(f"**/obituary?id={again.id}")
        assert page.inner_text("#repeats") == "repeat 1"
        assert page.locator("#status .badge").inner_text() == "unresolved"
        assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
    finally:
        context.close()


def _act(page: Any, row: Any, action: str, expect: str) -> str:
    """Click ``action`` in ``row``, check the preview, confirm; the job's summary."""
    row.locator(f"button[value={action}]").click()
    page.wait_for_selector("#preview-summary")
    assert expect in page.inner_text("#preview-summary"), page.inner_text("#preview-summary")
    page.click("#parked-confirm button[type=submit]")
    page.wait_for_selector("#job-status.status-done", timeout=60_000)
    summary: str = page.inner_text("#job-summary")
    return summary


def test_operator_retries_and_buries_parked_retries(
    browser: Any, console: dict[str, Any], shots: Path
) -> None:
    runtime = console["runtime"]
    populate(console)  # parked-0..3 (attempt 2), one cause; parked-2 and -3 due later
    context, page, watch = open_as(browser, console["url"], OPERATOR)
    try:
        page.goto("/parked")
        assert page.inner_text("#parked-due") == "2"
        page.screenshot(path=str(shots / "parked-actions.png"), full_page=True)

        # Retry now: parked-3 (due in ten minutes) is due now, still parked for the drain.
        row = page.locator('tr[data-entry="parked-3:2"]')
        assert row.get_attribute("class") == "later"
        summary = _act(page, row, "retry-now", "1 parked retry would be made due now")
        assert "Retried now 1 of 1" in summary
        page.goto("/parked")
        assert page.locator('tr[data-entry="parked-3:2"]').get_attribute("class") == "due"
        assert page.inner_text("#parked-due") == "3"

        # Bury now, one retry: gone from the parked set, an obituary "buried by web:op".
        row = page.locator('tr[data-entry="parked-2:2"]')
        summary = _act(page, row, "bury-now", "buried now, each with the reason")
        assert "Buried now 1 of 1" in summary
        page.screenshot(path=str(shots / "parked-bury-job.png"), full_page=True)
        page.click("a.obituary-link")
        assert "buried by web:op" in page.inner_text(".facts")
        page.goto("/parked")
        assert page.locator('tr[data-entry="parked-2:2"]').count() == 0
        assert page.inner_text("#parked-count") == "3"

        # Bury now, the whole cause: the preview names every retry; then nothing is parked.
        row = page.locator('#parked-causes tr[data-cause="3f1c9a07d2b8e4f1"]')
        row.locator("button[value=bury-now]").click()
        page.wait_for_selector("#preview-targets")
        assert page.locator("#preview-targets li").count() == 3
        page.screenshot(path=str(shots / "parked-bury-preview.png"), full_page=True)
        assert runtime.parking.count() == 3  # the preview changed nothing
        page.click("#parked-confirm button[type=submit]")
        page.wait_for_selector("#job-status.status-done", timeout=60_000)
        assert "Buried now 3 of 3" in page.inner_text("#job-summary")
        page.goto("/parked")
        assert page.inner_text("#parked-count") == "0" and runtime.parking.count() == 0
        buried = obituaries.list_obituaries(runtime, status="all")
        assert len([ob for ob in buried if ob.reason == "buried by web:op"]) == 4

        page.goto("/audit")
        rows = page.locator("#audit tbody tr")
        actions = [rows.nth(i).inner_text() for i in range(3)]
        assert all("op (operator)" in r for r in actions)
        assert ["parked-bury-now" in actions[0], "parked-bury-now" in actions[1]] == [True, True]
        assert "parked-retry-now" in actions[2] and "retried now 1 of 1" in actions[2]
        assert "parked retries of cause 3f1c9a07d2b8e4f1" in actions[0]
        page.screenshot(path=str(shots / "audit-parked.png"), full_page=True)
        assert not watch.dialogs and not watch.errors, (watch.dialogs, watch.errors)
    finally:
        context.close()
