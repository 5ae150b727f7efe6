"""schemathesis fuzzes the console's JSON API from its own OpenAPI document, against a real
console (uvicorn on a free port), RabbitMQ (a virtual host of this test alone) and Redis (a key
prefix of its own), seeded with obituaries of two causes, an editable one and parked retries.

1. Writes without their confirmation: every write sent by an editor with a wrong CSRF token, and
   by a viewer with theirs, is refused (403) and nothing under the key prefix or in the queue
   changes.
2. An editor with the token: every operation with data that fits the document (positive) and
   data that does not (negative: wrong types, unknown keys, out of range). No answer is a 5xx;
   every answer's status, content type and body match the document; negative data is refused
   (4xx); a write without its confirmation (a purge without ``"yes": true``, an edit without
   ``"replay": true``, any ``dry_run``) changes nothing in Redis or the queue; a positive write
   body with one unknown key added is a 400 that names it, and changes nothing.

Before the fuzz, each write is sent a few bodies that lack their confirmation in the ways that
matter most (a dry run with "yes": true, an edit with "replay" and "dry_run"), through the same
checks, so those are never left to chance.

For positive data the test narrows the published document: ``ids``, ``cause`` and ``id`` are
chosen among the seeded obituaries (and one that does not exist), an edit sets paths and
headers the editable message has, ``to_queue`` is none, the work queue or a missing one, so
confirmed writes really replay, purge and edit; ``canary_timeout`` is always given and at most
1 s and ``rate`` at least 20 per second, so a canary (no worker runs) and the rate limit stay
short. Negative data is generated from the document as published.
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import schemathesis
import schemathesis.checks
from hypothesis import HealthCheck, Phase, given, settings
from kombu import Connection

from celery_dlx.fates import now_ms
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.dlx_apps import make_app
from tests.web.conftest import serve
from tests.web.helpers import VIEWER, Client, bury, redis_state, task_obituary
from tests.web.test_console_edit_browser import EDITOR, buried_charge

#: Examples per read and per write, for each generation mode (the whole test takes well under a
#: minute).
READS, WRITES = 10, 50
#: The checks every answer must pass.
CHECKS = [
    schemathesis.checks.not_a_server_error,
    schemathesis.checks.status_code_conformance,
    schemathesis.checks.content_type_conformance,
    schemathesis.checks.response_schema_conformance,
    schemathesis.checks.negative_data_rejection,
]
NOT_FOUND_ID = "ob-does-not-exist"
#: Every Redis key under the test's prefix with its content, and the work queue's depth.
State = tuple[dict[bytes, object], int]


@pytest.fixture
def console(uid: str, vhost: str, key_prefix: str) -> Iterator[dict[str, Any]]:
    app = make_app(uid, broker_url=vhost)
    runtime = get_runtime(app)

    @app.task(name=f"charge-{uid}")
    def charge(order: Any) -> None:
        raise RuntimeError("card declined")

    queue = app.conf.task_default_queue
    obits = [task_obituary(app, charge.name, i) for i in range(4)]
    obits += [task_obituary(app, charge.name, i, cause="declined") for i in range(4, 6)]
    obits.append(buried_charge(app, charge.name, "bad"))
    bury(runtime, obits)
    for i in range(3):
        due = now_ms() + (i - 1) * 60_000
        runtime.store.park(ParkedMessage(f"p{i}", 1, queue, b"{}", due_ms=due, cause="slow"))
    conn = Connection(vhost)
    channel = conn.channel()
    app.amqp.queues[queue](channel).declare()
    server = serve(runtime, editors=(":".join(EDITOR),))
    try:
        yield {
            "app": app,
            "runtime": runtime,
            "url": server.url,
            "ids": [o.id for o in obits],
            "causes": sorted({o.cause for o in obits}),
            "editable": obits[-1].id,
            "queue": queue,
            "depth": lambda: int(channel.queue_declare(queue, passive=True).message_count),
        }
    finally:
        server.stop()
        runtime.reset_publisher()
        conn.release()


def _named_values(*names: str) -> dict[str, Any]:
    """An object of some of ``names``, each with any JSON value."""
    return {
        "type": "object",
        "properties": {name: {} for name in names},
        "additionalProperties": False,
    }


def _narrowed(
    doc: dict[str, Any], ids: list[str], causes: list[str], editable: str, queue: str
) -> dict[str, Any]:
    """``doc`` with the write bodies' ids, causes, canary wait and rate narrowed (see the
    module's docstring)."""
    doc = copy.deepcopy(doc)
    known = {"type": "string", "enum": [*ids, NOT_FOUND_ID]}
    for path in ("/api/replay", "/api/purge", "/api/edit"):
        body = doc["paths"][path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        props = body["properties"]
        if "ids" in props:
            props["ids"] = {**props["ids"], "items": known, "maxItems": 3}
        if "cause" in props:
            props["cause"] = {"enum": [*causes, "no-such-cause", None]}
        if "id" in props:  # the editable message, with paths and headers it has
            props["id"] = {"enum": [editable, NOT_FOUND_ID]}
            props["set"] = _named_values("kwargs.x", "kwargs.order_id")
            props["headers"] = _named_values("x-tenant", "x-note")
        if "canary_timeout" in props:  # given always: the default waits 120 s
            props["canary_timeout"] = {"type": "number", "minimum": 1, "maximum": 1}
            body["required"] = ["canary_timeout"]
        if "to_queue" in props:
            props["to_queue"] = {"enum": [None, queue, "no-such-queue"]}
        if "rate" in props:
            props["rate"] = {"type": "number", "minimum": 20, "maximum": 50}
    for param in doc["paths"]["/api/obituary"]["get"]["parameters"]:
        if param["name"] == "id":
            param["schema"] = known
    return doc


def _changes(was: State, now: State) -> str:
    """What changed between two :func:`state` s."""
    keys = sorted(set(was[0]) | set(now[0]))
    changed = [k.decode() for k in keys if was[0].get(k) != now[0].get(k)]
    return f"Redis keys changed: {changed}; queue depth {was[1]} -> {now[1]}"


def _confirmed(case: Any) -> bool:
    """Whether a write case carries its confirmation (see the module's docstring)."""
    body = case.body if isinstance(case.body, dict) else {}
    if body.get("dry_run") is True:
        return False
    if case.path == "/api/purge":
        return body.get("yes") is True
    if case.path == "/api/edit":
        return body.get("replay") is True
    return case.path == "/api/replay"


def _fuzz(
    schema: Any,
    mode: schemathesis.GenerationMode,
    each: Callable[[Any], None],
    *,
    writes_only: bool = False,
) -> int:
    """Run ``each`` on up to :data:`READS` or :data:`WRITES` cases of every operation; how many
    ran."""
    ran = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        if writes_only and operation.method.upper() == "GET":
            continue

        @settings(
            max_examples=READS if operation.method.upper() == "GET" else WRITES,
            deadline=None,
            database=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        @given(case=operation.as_strategy(generation_mode=mode))
        def run(case: Any) -> None:
            nonlocal ran
            ran += 1
            each(case)

        run()
    return ran


def _load(doc: dict[str, Any], account: tuple[str, str], token: str | None = None) -> Any:
    """The schema of ``doc``, whose cases carry ``account``'s credentials and ``token`` as their
    X-CSRF-Token (schemathesis leaves them out of the cases that test their absence)."""
    schemes: dict[str, Any] = {"basic": {"username": account[0], "password": account[1]}}
    if token is not None:
        schemes["csrf"] = {"api_key": token}
    # refusals the document declares: 413 is the console's answer to a body over 64 KiB
    refused = {"expected-statuses": [400, 401, 403, 404, 405, 413]}
    config = schemathesis.Config.from_dict(
        {"auth": {"openapi": schemes}, "checks": {"negative_data_rejection": refused}}
    )
    return schemathesis.openapi.from_dict(doc, config=config)


def test_the_api_survives_schemathesis(console: dict[str, Any]) -> None:
    url, runtime = console["url"], console["runtime"]
    editor, viewer = Client(url, EDITOR), Client(url, VIEWER)
    doc = viewer.get("/api/openapi.json").json()

    def state() -> State:
        return redis_state(runtime), console["depth"]()

    def send(case: Any, headers: dict[str, str] | None = None) -> Any:
        # the Origin of the console's own pages, as a browser (and scripts) send it
        sent = {"Origin": url, **(headers or {})}
        response = case.call(base_url=url, headers=sent, timeout=60)
        case.validate_response(response, checks=CHECKS, headers=sent)
        return response

    # 1. Writes without their confirmation: refused, nothing changes.
    before = state()
    refusals: list[int] = []

    def refused(case: Any) -> None:
        refusals.append(send(case).status_code)

    for schema in (_load(doc, EDITOR, "0" * 64), _load(doc, VIEWER, viewer.csrf())):
        _fuzz(schema, schemathesis.GenerationMode.POSITIVE, refused, writes_only=True)
    assert refusals and set(refusals) == {403}, sorted(set(refusals))
    assert state() == before, "a write without its CSRF token, or by a viewer, changed state"

    # 2. An editor with the token.
    token = editor.csrf()
    statuses: dict[str, set[int]] = {}

    def checked(case: Any, headers: dict[str, str] | None = None) -> None:
        write = case.method.upper() == "POST"
        if write and not _confirmed(case):
            was = state()
        response = send(case, headers)
        statuses.setdefault(f"{case.method} {case.path}", set()).add(response.status_code)
        if write and not _confirmed(case):
            now = state()
            assert now == was, f"{case.method} {case.path} {case.body!r}: {_changes(was, now)}"
        if write and isinstance(case.body, dict) and response.status_code == 200:
            extra = {**case.body, "unexpected_key": True}
            was = state()
            reply = editor.post(case.path, json_body=extra, headers={"X-CSRF-Token": token})
            assert reply.status == 400, (case.path, extra, reply.status, reply.text)
            assert "unknown key 'unexpected_key'" in reply.json()["error"]
            assert state() == was

    explicit = _load(doc, EDITOR, token)
    basic = "Basic " + base64.b64encode(":".join(EDITOR).encode()).decode()
    ids, causes, editable = console["ids"], console["causes"], console["editable"]
    unconfirmed = {
        "/api/purge": [
            {"ids": ids[:3], "yes": True, "dry_run": True},
            {"cause": causes[0], "dry_run": True},
            {"ids": ids[:3]},
            {"ids": ids[:3], "yes": False},
        ],
        "/api/replay": [
            {"cause": causes[0], "dry_run": True, "canary": True, "canary_timeout": 1},
            {"ids": ids, "dry_run": True, "to_queue": console["queue"], "force": True},
        ],
        "/api/edit": [
            {"id": editable, "set": {"kwargs.x": 5}, "replay": True, "dry_run": True},
            {"id": editable, "set": {"kwargs.x": 5}, "headers": {"x-tenant": None}},
        ],
    }
    for path, bodies in unconfirmed.items():
        for body in bodies:
            case = explicit[path]["POST"].Case(body=body, media_type="application/json")
            assert not _confirmed(case)
            checked(case, {"Authorization": basic, "X-CSRF-Token": token})
    assert statuses == {
        "POST /api/purge": {200, 400},  # 400: a purge without "yes": true
        "POST /api/replay": {200},
        "POST /api/edit": {200},
    }

    narrowed = _narrowed(
        doc, console["ids"], console["causes"], console["editable"], console["queue"]
    )
    ran = _fuzz(_load(narrowed, EDITOR, token), schemathesis.GenerationMode.POSITIVE, checked)
    ran += _fuzz(_load(doc, EDITOR, token), schemathesis.GenerationMode.NEGATIVE, checked)
    assert ran > len(doc["paths"]) * 3
    # The fuzz reached the handlers: successes and refusals of each write.
    for write in ("POST /api/replay", "POST /api/purge", "POST /api/edit"):
        assert 200 in statuses[write] and 400 in statuses[write], (write, statuses[write])
