"""Closing a breaker from the console over plain HTTP (real uvicorn server, real Redis): an
operator's close with a CSRF token releases what it held and is audited; a close of a breaker
that is not open does nothing and says so; malformed or unauthorised posts change nothing."""

from __future__ import annotations

from typing import Any

from celery_dlx.fates import now_ms
from celery_dlx.policy.breaker import BreakerSettings
from celery_dlx_console.audit import read_audit
from tests.web.helpers import OPERATOR, Client


def test_operator_closes_a_breaker_and_it_is_audited(console: dict[str, Any]) -> None:
    runtime, queue = console["runtime"], console["app"].conf.task_default_queue
    op, viewer = console["op"], console["viewer"]
    settings = BreakerSettings(failures=1, hold=60, probe=10)
    for i in range(3):
        runtime.breakers.fail(queue, "cafe02", settings, now_ms(), entry_id=f"m{i}:0")
    assert 'action="/actions/close-breaker"' in op.get("/").text
    assert 'action="/actions/close-breaker"' not in viewer.get("/").text

    refused = [
        viewer.post(
            "/actions/close-breaker",
            form={"csrf": viewer.csrf(), "cause": "cafe02", "queue": queue},
        ),
        op.post("/actions/close-breaker", form={"cause": "cafe02", "queue": queue}),
        op.post(
            "/actions/close-breaker", form={"csrf": "forged", "cause": "cafe02", "queue": queue}
        ),
        console["nobody"].post("/actions/close-breaker", form={"cause": "cafe02", "queue": queue}),
        # another site's page, with the operator's credentials and token: the origin check
        Client(console["url"], OPERATOR, origin="http://attacker.example").post(
            "/actions/close-breaker", form={"csrf": op.csrf(), "cause": "cafe02", "queue": queue}
        ),
    ]
    assert [r.status for r in refused] == [403, 403, 403, 401, 403]
    missing = op.post("/actions/close-breaker", form={"csrf": op.csrf(), "cause": "cafe02"})
    assert missing.status == 400
    assert runtime.breakers.is_open(queue, "cafe02")
    assert read_audit(runtime) == []

    closed = op.post(
        "/actions/close-breaker", form={"csrf": op.csrf(), "cause": "cafe02", "queue": queue}
    )
    assert (closed.status, closed.headers["location"]) == (303, "/")
    assert not runtime.breakers.is_open(queue, "cafe02")
    again = op.post(
        "/actions/close-breaker",
        form={"csrf": op.csrf(), "cause": "cafe02", "queue": queue, "back": "group"},
    )
    assert (again.status, again.headers["location"]) == (303, "/group?cause=cafe02")
    latest, first = read_audit(runtime)
    assert (first["user"], first["role"], first["action"]) == ("op", "operator", "close breaker")
    assert first["target"] == f"cause cafe02 on {queue}"
    # the breaker held 2 entries (the opening failure and the next): both released
    assert (first["status"], first["summary"]) == ("done", "closed, 2 held messages released")
    assert first["result"]["closed"] == [{"queue": queue, "cause": "cafe02", "released": 2}]
    assert (latest["status"], latest["summary"]) == ("noop", "was not open")
