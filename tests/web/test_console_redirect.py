"""Replays redirected to another queue from the console: the obituary page's and the group
page's forms and ``POST /api/replay`` (operators only, with the CSRF token), a missing queue
refused before anything starts, and the redirect in the job, the audit log and the ledger."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.integration.dlx_apps import worker
from tests.integration.helpers import queue_depth, wait_until
from tests.web.helpers import bury, task_obituary
from tests.web.redirects import redirect_shop
from tests.web.test_console_actions import _finished, _job_id


@pytest.fixture
def shop(
    uid: str, key_prefix: str, broker: Any, cleanup_queues: list[str]
) -> Iterator[dict[str, Any]]:
    with redirect_shop(uid, key_prefix, broker, cleanup_queues) as made:
        yield made


def _token(page: str) -> str:
    return re.search(r'name="csrf" value="(\w+)"', page).group(1)  # type: ignore[union-attr]


def test_group_form_redirects_and_the_audit_and_ledger_say_so(shop: dict[str, Any]) -> None:
    app, runtime, old, new, op = shop["app"], shop["runtime"], shop["old"], shop["new"], shop["op"]
    obits = [task_obituary(app, shop["task"].name, i) for i in range(3)]
    bury(runtime, obits)
    page = op.get("/group", params={"cause": "backend-down"}).text
    assert page.count('name="to_queue"') == 2  # the whole group, the selected ones
    token = _token(page)
    with worker(app, queues=[new]):
        reply = op.post(
            "/actions/replay",
            form={"csrf": token, "cause": "backend-down", "rate": "20", "to_queue": new},
        )
        job = _finished(op, _job_id(reply))
        wait_until(lambda: runtime.redis.llen(shop["done"]) == 3, timeout=60, what="3 runs")
    assert job["status"] == "done" and job["params"]["to_queue"] == new, job
    assert job["result"]["to_queue"] == new and job["result"]["from_queues"] == {old: 3}
    assert sorted(x.decode() for x in runtime.redis.lrange(shop["done"], 0, -1)) == [
        f"{i}:{new}" for i in range(3)
    ]
    assert queue_depth(shop["channel"], old) == 0
    job_page = op.get(f"/jobs/{job['id']}").text
    assert f'To queue <span class="mono to-queue">{new}</span>, instead of' in job_page
    audit = op.get("/api/audit").json()[0]
    assert audit["params"]["to_queue"] == new and audit["result"]["from_queues"] == {old: 3}
    assert audit["summary"] == f"replayed 3 of 3; to queue {new}"
    audit_page = op.get("/audit").text
    redirect = (
        f'from <span class="mono">{old}</span> (3) to queue <span class="mono to-queue">{new}<'
    )
    assert redirect in audit_page
    ledger = op.get("/obituary", params={"id": obits[0].id}).text
    assert f'from {old} to queue <span class="mono to-queue">{new}</span>' in ledger
    assert f"to {new}" in ledger  # the timeline's replayed entry


def test_api_and_obituary_form_redirect_and_refuse_what_they_must(shop: dict[str, Any]) -> None:
    app, runtime, old, new, op = shop["app"], shop["runtime"], shop["old"], shop["new"], shop["op"]
    viewer = shop["viewer"]
    obits = [task_obituary(app, shop["task"].name, i) for i in range(2)]
    bury(runtime, obits)
    headers = {"X-CSRF-Token": op.csrf()}

    # a missing queue: refused at once (400), nothing started, replayed or audited
    missing = op.post(
        "/api/replay", json_body={"ids": [obits[0].id], "to_queue": "no-such"}, headers=headers
    )
    assert missing.status == 400 and "queue 'no-such' does not exist" in missing.json()["error"]
    page = op.get("/obituary", params={"id": obits[0].id}).text
    assert 'name="to_queue"' in page and f'placeholder="{old}"' in page
    form = {"csrf": _token(page), "ids": obits[0].id, "to_queue": "no-such"}
    refused = op.post("/actions/replay", form=form)
    assert refused.status == 400 and "does not exist" in refused.text
    # a viewer gets no form and is refused; a missing CSRF token is refused
    assert 'name="to_queue"' not in viewer.get("/obituary", params={"id": obits[0].id}).text
    assert viewer.post("/actions/replay", form={**form, "to_queue": new}).status == 403
    assert (
        viewer.post("/api/replay", json_body={"ids": [obits[0].id], "to_queue": new}).status == 403
    )
    assert op.post("/api/replay", json_body={"ids": [obits[0].id], "to_queue": new}).status == 403
    assert op.post("/actions/replay", form={"ids": obits[0].id, "to_queue": new}).status == 403
    assert op.get("/api/audit").json() == []
    assert [f for _, f in runtime.history.read() if f["fate"] == "replayed"] == []
    assert queue_depth(shop["channel"], new) == 0 and queue_depth(shop["channel"], old) == 0

    with worker(app, queues=[new]):
        data = op.post(
            "/api/replay", json_body={"ids": [obits[0].id], "to_queue": new}, headers=headers
        ).json()
        assert data["replayed"] == [obits[0].id] and data["to_queue"] == new
        moved = op.post("/actions/replay", form={**form, "ids": obits[1].id, "to_queue": new})
        assert _finished(op, _job_id(moved))["result"]["from_queues"] == {old: 1}
        wait_until(lambda: runtime.redis.llen(shop["done"]) == 2, timeout=60, what="2 runs")
    assert sorted(x.decode() for x in runtime.redis.lrange(shop["done"], 0, -1)) == [
        f"0:{new}",
        f"1:{new}",
    ]
    # without a target queue, a replay goes where the message died, as before
    plain = op.post(
        "/api/replay", json_body={"ids": [obits[0].id], "force": True}, headers=headers
    ).json()
    assert "to_queue" not in plain and plain["replayed"] == [obits[0].id]
    assert queue_depth(shop["channel"], old) == 1
    assert [e["params"].get("to_queue") for e in op.get("/api/audit").json()] == [None, new, new]
