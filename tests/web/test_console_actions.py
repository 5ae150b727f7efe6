"""Operator actions through the console against a real worker: replay a group (rate and
canary) from the page and see the messages run, replay through the API with the CLI's JSON,
purge with a typed confirmation, the rate limit, one action at a time, the audit log and the
failure history."""

from __future__ import annotations

import re
from typing import Any

from celery_dlx.ops.inspection import groups_data
from tests.integration.dlx_apps import worker
from tests.integration.helpers import wait_until
from tests.web.helpers import bury, task_obituary


def _job_id(reply: Any) -> str:
    assert reply.status == 303, (reply.status, reply.text)
    match = re.fullmatch(r"/jobs/(\w+)", reply.headers["location"])
    assert match, reply.headers["location"]
    return match.group(1)


def _finished(client: Any, job_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        data: dict[str, Any] = client.get(f"/api/jobs/{job_id}").json()
        return data if data["status"] != "running" else None

    return wait_until(done, timeout=180, interval=0.2, what=f"job {job_id}")  # type: ignore[no-any-return]


def test_replay_group_from_the_page_with_canary_runs_the_messages(console: dict[str, Any]) -> None:
    app, runtime = console["app"], console["runtime"]
    obits = [task_obituary(app, console["task"].name, i) for i in range(5)]
    bury(runtime, obits)
    op = console["op"]
    page = op.get("/group", params={"cause": "backend-down"}).text
    token = re.search(r'name="csrf" value="(\w+)"', page).group(1)  # type: ignore[union-attr]
    runtime.redis.set(console["fixed"], 1)
    with worker(app):
        reply = op.post(
            "/actions/replay",
            form={"csrf": token, "cause": "backend-down", "rate": "20", "canary": "1"},
        )
        job = _finished(op, _job_id(reply))
        assert job["status"] == "done", job
        result = job["result"]
        assert result["targets"] == 5 and sorted(result["replayed"]) == sorted(o.id for o in obits)
        assert result["canary"]["outcome"] == "recovered"
        wait_until(lambda: runtime.redis.llen(console["done"]) == 5, timeout=60, what="5 runs")
    assert sorted(int(x) for x in runtime.redis.lrange(console["done"], 0, -1)) == list(range(5))
    job_page = op.get(f"/jobs/{job['id']}").text
    assert 'id="job-status" class="status-done">done<' in job_page
    assert "Replayed 5 of 5" in job_page and "recovered" in job_page
    # The audit log (page, API) and the failure history say who did it.
    audit = op.get("/api/audit").json()
    assert audit[0]["user"] == "op" and audit[0]["action"] == "replay"
    assert audit[0]["target"] == "cause backend-down" and audit[0]["status"] == "done"
    assert audit[0]["params"]["rate"] == 20 and audit[0]["params"]["canary"] is True
    assert "op (operator)" in op.get("/audit").text
    history = [f for _, f in runtime.history.read() if f["fate"] == "audit"]
    assert len(history) == 1 and history[0]["reason"].startswith(
        "op (operator) replay cause backend-down"
    )
    replayed = [f for _, f in runtime.history.read() if f["fate"] == "replayed"]
    assert len(replayed) == 5
    # The ledger shows on the obituary page.
    assert 'id="ledger">Never' not in op.get("/obituary", params={"id": obits[0].id}).text


def test_api_replay_returns_the_cli_json_and_honours_the_rate_limit(
    console: dict[str, Any],
) -> None:
    app, runtime = console["app"], console["runtime"]
    obits = [task_obituary(app, console["task"].name, i) for i in range(3)]
    bury(runtime, obits)
    op = console["op"]
    token = op.csrf()
    headers = {"X-CSRF-Token": token}
    over = op.post("/api/replay", json_body={"cause": "backend-down", "rate": 51}, headers=headers)
    assert over.status == 400 and "dlx_web_max_replay_rate" in over.json()["error"]
    zero = op.post("/api/replay", json_body={"cause": "backend-down", "rate": 0}, headers=headers)
    assert zero.status == 400 and "'rate' must be more than 0" in zero.json()["error"]
    both = op.post(
        "/api/replay", json_body={"cause": "backend-down", "ids": [obits[0].id]}, headers=headers
    )
    assert both.status == 400
    runtime.redis.set(console["fixed"], 1)
    with worker(app):
        reply = op.post("/api/replay", json_body={"ids": [obits[1].id], "rate": 5}, headers=headers)
        assert reply.status == 200, reply.text
        data = reply.json()
        assert set(data) == {
            "dry_run",
            "targets",
            "replayed",
            "would_replay",
            "skipped",
            "failed",
            "missing",
            "canary",
            "stopped",
            "not_replayed",
        }
        assert data["replayed"] == [obits[1].id] and data["targets"] == 1
        assert data["would_replay"] == [] and data["dry_run"] is False
        wait_until(lambda: runtime.redis.llen(console["done"]) == 1, timeout=60, what="1 run")
        again = op.post(
            "/api/replay", json_body={"ids": [obits[1].id], "rate": 5}, headers=headers
        ).json()
        assert again["replayed"] == [] and again["skipped"][0]["id"] == obits[1].id


def test_purge_needs_the_typed_confirmation(console: dict[str, Any]) -> None:
    app, runtime = console["app"], console["runtime"]
    obits = [task_obituary(app, console["task"].name, i) for i in range(4)]
    bury(runtime, obits)
    op = console["op"]
    page = op.get("/group", params={"cause": "backend-down"}).text
    assert "<code>purge 4</code>" in page
    token = op.csrf()
    for typed in ("", "purge", "purge 3", "PURGE 4"):
        reply = op.post(
            "/actions/purge", form={"csrf": token, "cause": "backend-down", "confirm": typed}
        )
        assert reply.status == 400 and "not purged" in reply.text
    assert groups_data(runtime)["total"] == 4
    selected = [("csrf", token), ("ids", obits[0].id), ("ids", obits[1].id), ("confirm", "purge 2")]
    job = _finished(op, _job_id(op.post("/actions/purge", form=selected)))
    assert job["status"] == "done" and sorted(job["result"]["purged"]) == sorted(
        [obits[0].id, obits[1].id]
    )
    assert groups_data(runtime)["total"] == 2
    reply = op.post(
        "/actions/purge", form={"csrf": token, "cause": "backend-down", "confirm": "purge 2"}
    )
    job = _finished(op, _job_id(reply))
    assert job["result"]["purged"] and groups_data(runtime)["total"] == 0
    purged = [f for _, f in runtime.history.read() if f["fate"] == "purged"]
    assert len(purged) == 4
    audits = op.get("/api/audit").json()
    assert [a["action"] for a in audits] == ["purge", "purge"]
    assert (
        audits[0]["target"] == "cause backend-down"
        and audits[1]["target"] == "2 selected obituaries"
    )
    # API purge needs "yes": true.
    bury(runtime, [task_obituary(app, console["task"].name, 9)])
    headers = {"X-CSRF-Token": token}
    assert op.post("/api/purge", json_body={"cause": "backend-down"}, headers=headers).status == 400
    done = op.post("/api/purge", json_body={"cause": "backend-down", "yes": True}, headers=headers)
    assert done.status == 200 and done.json()["targets"] == 1 and len(done.json()["purged"]) == 1
    assert done.json()["would_purge"] == [] and done.json()["dry_run"] is False


def test_one_action_at_a_time(console: dict[str, Any]) -> None:
    """A replay whose canary waits (no worker) holds the console; a second action gets 409."""
    app, runtime = console["app"], console["runtime"]
    obits = [task_obituary(app, console["task"].name, i) for i in range(3)]
    bury(runtime, obits)
    with app.connection_for_write() as conn:  # the queue exists, no worker consumes it
        app.amqp.queues[app.conf.task_default_queue](conn.default_channel).declare()
    op = console["op"]
    token = op.csrf()
    first = op.post(
        "/actions/replay",
        form={
            "csrf": token,
            "cause": "backend-down",
            "rate": "5",
            "canary": "1",
            "canary_timeout": "3",
        },
    )
    job_id = _job_id(first)
    second = op.post(
        "/actions/purge", form={"csrf": token, "ids": obits[2].id, "confirm": "purge 1"}
    )
    assert second.status == 409 and "another operator action is running" in second.text
    job = _finished(op, job_id)
    assert job["status"] == "stopped" and job["result"]["canary"]["outcome"] == "timeout"
    assert len(job["result"]["not_replayed"]) == 2
