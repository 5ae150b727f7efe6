"""The console's pages catch up with the API: the causes and cause pages filter by obituary
status (default unresolved, as ``dlx groups``/``dlx list``), show each obituary's status with
the link to its failure again and its repeat count, count what a replay resolved; the Parked
page makes retries due now or buries them, by entry and by cause, after a dry-run preview,
as a job of the operator recorded once in the audit log. Real console, RabbitMQ and Redis."""

from __future__ import annotations

import html
import re
from typing import Any

from celery_dlx.fates import now_ms
from celery_dlx.message.parked import ParkedMessage
from tests.web.helpers import bury, redis_state, task_obituary
from tests.web.test_console_actions import _finished, _job_id


def _ids(page: str) -> list[str]:
    return re.findall(r'<td><a class="mono" href="/obituary\?id=([^"]+)"', page)


def graveyard_with_statuses(console: dict[str, Any]) -> dict[str, Any]:
    """``backend-down``: ob0 failed again (as ``again``, unresolved, repeat 1), ob1 resolved,
    ob2 replayed, ob3 unresolved; ``fixed-cause``: both resolved."""
    app, runtime, name = console["app"], console["runtime"], console["task"].name
    obits = [task_obituary(app, name, i) for i in range(4)]
    fixed = [task_obituary(app, name, 10 + i, cause="fixed-cause") for i in range(2)]
    bury(runtime, obits + fixed)
    yard, at = runtime.graveyard, now_ms()
    yard.mark_replayed([obits[0].id, obits[1].id, obits[2].id] + [f.id for f in fixed], at)
    yard.resolve([obits[1].id] + [f.id for f in fixed], at, "success")
    again = task_obituary(app, name, 20)  # the copy of ob0's replay, buried again
    again.replayed_from = obits[0].id
    bury(runtime, [again])
    yard.note_failed_again([again], at)
    return {"obits": obits, "fixed": fixed, "again": again}


def test_causes_and_cause_pages_filter_by_status(console: dict[str, Any]) -> None:
    made = graveyard_with_statuses(console)
    obits, again = made["obits"], made["again"]
    viewer = console["viewer"]

    default = viewer.get("/causes").text
    assert "fixed-cause" not in default  # every obituary of it was resolved
    assert '<option value="unresolved" selected>' in default
    assert "1 cause, 7 obituaries" in default
    row = re.search(r'<tr class="cause">.*?</tr>', default, re.S).group(0)  # type: ignore[union-attr]
    assert "backend-down" in row and '<td class="num">5</td>' in row
    resolved = re.search(r'<td class="num resolved" title="([^"]+)">(\d+)</td>', row)
    assert resolved and resolved.group(2) == "1"
    assert html.unescape(resolved.group(1)) == (
        "2 unresolved, 1 replayed (waiting), 1 resolved, 1 failed again"
    )
    every = viewer.get("/causes", params={"status": "all"}).text
    assert "fixed-cause" in every and "2 causes, 7 obituaries" in every
    assert viewer.get("/causes", params={"status": "resolved"}).status == 400  # as dlx groups

    group = viewer.get("/group", params={"cause": "backend-down"}).text
    assert sorted(_ids(group)) == sorted([obits[3].id, again.id])
    assert "2 matching (unresolved)" in group
    assert '<span id="group-resolved">1</span> resolved' in group
    assert "repeat 1" in group  # the failure again counts the one before it
    failed = viewer.get("/group", params={"cause": "backend-down", "status": "failed-again"}).text
    assert _ids(failed) == [obits[0].id] and "1 matching (failed-again)" in failed
    assert f'href="/obituary?id={again.id}"' in failed  # the link to the new obituary
    assert '<option value="failed-again" selected>' in failed
    waiting = viewer.get("/group", params={"cause": "backend-down", "status": "replayed"}).text
    assert _ids(waiting) == [obits[2].id]
    # Another filter with the status: the status is checked per obituary, not counted.
    queue = console["app"].conf.task_default_queue
    both = viewer.get(
        "/group", params={"cause": "backend-down", "status": "resolved", "queue": queue}
    ).text
    assert _ids(both) == [obits[1].id]
    assert (
        len(_ids(viewer.get("/group", params={"cause": "backend-down", "status": "all"}).text)) == 5
    )
    assert viewer.get("/group", params={"cause": "backend-down", "status": "x"}).status == 400

    page = viewer.get("/obituary", params={"id": obits[0].id}).text
    assert 'class="badge status-failed-again">failed-again<' in page
    assert f'id="status-next" href="/obituary?id={again.id}"' in page
    new = viewer.get("/obituary", params={"id": again.id}).text
    assert '<span id="repeats">repeat 1</span>' in new and obits[0].id in new


def _park(runtime: Any, queue: str, n: int, *, cause: str, due_in_ms: int) -> list[str]:
    now = now_ms()
    for i in range(n):
        runtime.store.park(
            ParkedMessage(f"{cause}-{i}", 2, queue, b"{}", due_ms=now + due_in_ms, cause=cause)
        )
    return [f"{cause}-{i}:2" for i in range(n)]


def _token(client: Any) -> str:
    page = client.get("/parked").text
    return re.search(r'name="csrf" value="(\w+)"', page).group(1)  # type: ignore[union-attr]


def test_parked_page_retries_and_buries_after_a_preview(console: dict[str, Any]) -> None:
    runtime, op, viewer = console["runtime"], console["op"], console["viewer"]
    queue = console["app"].conf.task_default_queue
    later = _park(runtime, queue, 2, cause="later-cause", due_in_ms=3_600_000)
    doomed = _park(runtime, queue, 3, cause="doomed-cause", due_in_ms=3_600_000)

    page = op.get("/parked").text
    assert page.count('value="retry-now"') == 2 + 5  # per cause and per retry
    assert 'data-cause="doomed-cause"' in page
    assert 'value="retry-now"' not in viewer.get("/parked").text
    token = _token(op)
    refused = viewer.post(
        "/actions/parked", form={"csrf": token, "action": "bury-now", "ids": later[0]}
    )
    assert refused.status == 403
    no_csrf = op.post("/actions/parked", form={"action": "bury-now", "ids": later[0]})
    assert no_csrf.status == 403
    assert (
        op.post("/actions/parked", form={"csrf": token, "action": "kill", "ids": later[0]}).status
        == 400
    )
    both = op.post(
        "/actions/parked",
        form={"csrf": token, "action": "bury-now", "ids": later[0], "cause": "doomed-cause"},
    )
    assert both.status == 400

    # The preview is a dry run: nothing changes, and it carries the confirming form.
    before = redis_state(runtime)
    preview = op.post(
        "/actions/parked", form={"csrf": token, "action": "bury-now", "cause": "doomed-cause"}
    )
    assert preview.status == 200 and redis_state(runtime) == before
    assert "Dry run: <strong>3</strong> parked retries would be buried now" in preview.text
    assert "buried by web:op" in preview.text
    assert all(e in preview.text for e in doomed)
    assert 'name="step" value="confirm"' in preview.text

    # Retry now, one retry: due now, still parked until a drain takes it.
    job = _finished(
        op,
        _job_id(
            op.post(
                "/actions/parked",
                form={"csrf": token, "action": "retry-now", "ids": later[0], "step": "confirm"},
            )
        ),
    )
    assert job["status"] == "done" and job["result"]["done"] == [later[0]], job
    assert "Retried now 1 of 1" in op.get(f"/jobs/{job['id']}").text
    due = {m.entry_id: m.due_ms for m in runtime.parking.soonest(100)}
    assert due[later[0]] <= now_ms() < due[later[1]]
    assert f'data-entry="{later[0]}" class="due"' in op.get("/parked").text

    # Bury now, the whole cause: an obituary each, the retries gone.
    job = _finished(
        op,
        _job_id(
            op.post(
                "/actions/parked",
                form={
                    "csrf": token,
                    "action": "bury-now",
                    "cause": "doomed-cause",
                    "step": "confirm",
                },
            )
        ),
    )
    assert job["status"] == "done" and sorted(job["result"]["done"]) == sorted(doomed), job
    buried = job["result"]["obituaries"]
    assert len(buried) == 3 and runtime.parking.count() == 2
    job_page = op.get(f"/jobs/{job['id']}").text
    assert "Buried now 3 of 3" in job_page and buried[0] in job_page
    shown = op.get("/obituary", params={"id": buried[0]}).text
    assert "buried by web:op" in shown
    assert "doomed-cause" not in op.get("/parked").text

    # One audit entry per action, with the operator's name, role and job.
    audit = op.get("/api/audit").json()
    parked = [a for a in audit if a["action"].startswith("parked-")]
    assert [a["action"] for a in parked] == ["parked-bury-now", "parked-retry-now"]
    assert parked[0]["user"] == "op" and parked[0]["role"] == "operator"
    assert parked[0]["target"] == "parked retries of cause doomed-cause"
    assert parked[0]["job"] == job["id"] and parked[0]["status"] == "done"
    assert "parked-bury-now" in op.get("/audit").text

    # A retry gone meanwhile is reported missing, not an error.
    gone = op.post(
        "/actions/parked",
        form={"csrf": token, "action": "retry-now", "ids": doomed[0], "step": "confirm"},
    )
    job = _finished(op, _job_id(gone))
    assert job["status"] == "incomplete" and job["result"]["missing"] == [doomed[0]]
