"""The console marks a cause first seen with the newest code version ("new in v2") on the causes
page and the cause page, and shows the cause's obituaries per code version."""

from __future__ import annotations

import html
import re
from typing import Any

from celery_dlx.fates import now_ms
from tests.web.helpers import bury, task_obituary


def test_causes_and_cause_pages_mark_a_cause_new_in_the_newest_version(
    console: dict[str, Any],
) -> None:
    app, runtime, name = console["app"], console["runtime"], console["task"].name
    base = now_ms() - 60_000

    def obituary(order: int, cause: str, version: str | None) -> Any:
        ob = task_obituary(app, name, order, cause=cause, at=base + order * 1000)
        ob.code_version = version
        return ob

    bury(runtime, [obituary(0, "old-cause", None), obituary(1, "old-cause", "v1")])
    bury(runtime, [obituary(2, "old-cause", "v2"), obituary(3, "new-cause", "v2")])
    page = console["viewer"].get("/causes")
    assert page.status == 200
    rows = re.findall(r'<tr class="cause">(.*?)</tr>', page.text, re.S)
    by_cause = {re.search(r"cause=([\w-]+)", r).group(1): r for r in rows}  # type: ignore[union-attr]
    assert "new in v2" in by_cause["new-cause"]
    assert "new in" not in by_cause["old-cause"]

    new = console["viewer"].get("/group", params={"cause": "new-cause"}).text
    assert "new in v2" in re.search(r'id="group-version">(.*?)</dd>', new, re.S).group(1)  # type: ignore[union-attr]
    old = console["viewer"].get("/group", params={"cause": "old-cause"}).text
    version = re.search(r'id="group-version">(.*?)</dd>', old, re.S).group(1)  # type: ignore[union-attr]
    assert "new in" not in version and "v2" in version
    # The first burial had no version: the cause was first seen with an unknown one.
    assert 'first seen with <span class="mono">unknown</span>' in version
    table = re.search(r'<table id="group-versions">(.*?)</table>', old, re.S).group(1)  # type: ignore[union-attr]
    cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>([^<]*)</td>", table)]
    # Oldest version first (by first sighting, not by name), unknown first of all.
    assert cells == ["unknown", "1", "v1", "1", "v2", "1"]

    # A later deploy: v2 is no longer the newest, so nothing is "new in v2" any more.
    bury(runtime, [obituary(4, "old-cause", "v3")])
    assert "new in" not in console["viewer"].get("/causes").text


def test_api_groups_new_since(console: dict[str, Any]) -> None:
    app, runtime, name = console["app"], console["runtime"], console["task"].name
    old = task_obituary(app, name, 0, cause="old-cause", at=now_ms() - 5000)
    old.code_version = "v1"
    new = task_obituary(app, name, 1, cause="new-cause", at=now_ms() - 1000)
    new.code_version = "v2"
    bury(runtime, [old, new])
    data = console["viewer"].get("/api/groups", params={"new_since": "v2"}).json()
    assert [g["cause"] for g in data["groups"]] == ["new-cause"] and data["new_since"] == "v2"
    assert len(console["viewer"].get("/api/groups").json()["groups"]) == 2
    unknown = console["viewer"].get("/api/groups", params={"new_since": "v9"})
    assert unknown.status == 400 and "'v9' was never seen" in unknown.json()["error"]
