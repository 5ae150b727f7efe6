"""The JSON API refuses what it does not understand, on a real console, Redis and RabbitMQ:
unknown keys and mistyped values of every write are a 400 naming them (and change nothing), an
unknown query parameter of a read too; ``dry_run`` on replay, purge and edit answers what the
CLI's ``--dry-run --json`` prints and changes nothing in Redis or the queue; the OpenAPI document
at ``/api/openapi.json`` is built from the same declarations the handlers check with."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from celery_dlx_console.actions import MAX_IDS
from celery_dlx_console.app import API_ROUTES
from tests.integration.cli_helpers import run_json
from tests.integration.helpers import queue_depth
from tests.web.conftest import serve
from tests.web.helpers import Client, bury, redis_state, task_obituary
from tests.web.test_console_edit_browser import EDITOR, buried_charge


@pytest.fixture
def api(shop: dict[str, Any], broker: Any) -> Iterator[dict[str, Any]]:
    """The shop's console with an editor, its work queue declared, three obituaries buried."""
    app, runtime = shop["app"], shop["runtime"]
    channel = broker.channel()
    app.amqp.queues[app.conf.task_default_queue](channel).declare()
    obits = [task_obituary(app, shop["task"].name, i) for i in range(3)]
    bury(runtime, obits)
    server = serve(runtime, editors=(":".join(EDITOR),))
    try:
        editor = Client(server.url, EDITOR)
        yield {
            **shop,
            "channel": channel,
            "obits": obits,
            "ids": [o.id for o in obits],
            "ed": editor,
            "headers": {"X-CSRF-Token": editor.csrf()},
            "server": server,
        }
    finally:
        server.stop()


def _depth(api: dict[str, Any]) -> int:
    return queue_depth(api["channel"], api["app"].conf.task_default_queue)


def test_unknown_keys_and_wrong_types_are_refused_and_change_nothing(api: dict[str, Any]) -> None:
    ed, headers, ids, runtime = api["ed"], api["headers"], api["ids"], api["runtime"]
    before = redis_state(runtime)
    # The report's case: a misspelt dry-run key next to a real confirmation.
    typo = ed.post(
        "/api/purge", json_body={"ids": ids, "dryrun": True, "yes": True}, headers=headers
    )
    assert typo.status == 400, typo.text
    assert typo.json()["error"] == (
        "POST /api/purge: unknown key 'dryrun'; it accepts: ids, cause, yes, dry_run"
    )
    two = ed.post("/api/replay", json_body={"ids": ids, "dry": 1, "zz": 2}, headers=headers)
    assert two.status == 400 and "unknown keys 'dry', 'zz'" in two.json()["error"]
    assert (
        "it accepts: ids, cause, rate, canary, canary_timeout, force, to_queue, dry_run"
        in (two.json()["error"])
    )
    edit = ed.post(
        "/api/edit", json_body={"id": ids[0], "replay": True, "sets": {}}, headers=headers
    )
    assert edit.status == 400 and "unknown key 'sets'" in edit.json()["error"]
    refused = {
        "/api/purge": [
            ({"ids": ids[0], "yes": True}, "'ids' must be a list, got"),
            ({"ids": [ids[0], 5], "yes": True}, "'ids'[1] must be a string, got 5"),
            ({"ids": ids, "yes": "true"}, "'yes' must be true or false, got \"true\""),
            ({"ids": ids, "yes": True, "dry_run": 1}, "'dry_run' must be true or false, got 1"),
            # null only where the document allows it (schemathesis found a dry_run: null taken
            # for "not given")
            (
                {"ids": ids, "yes": True, "dry_run": None},
                "'dry_run' must be true or false, got null",
            ),
            ({"ids": ["x"] * (MAX_IDS + 1), "yes": True}, "'ids' holds at most 500 items"),
        ],
        "/api/replay": [
            ({"ids": ids, "rate": "fast"}, "'rate' must be a number or null, got \"fast\""),
            ({"ids": ids, "canary": "yes"}, "'canary' must be true or false"),
            ({"ids": ids, "canary_timeout": 601}, "'canary_timeout' must be at most 600, got 601"),
            ({"ids": ids, "to_queue": ["q"]}, "'to_queue' must be a string or null"),
            ({"cause": 3}, "'cause' must be a string or null, got 3"),
        ],
        "/api/edit": [
            ({"set": {"kwargs.x": 5}}, "'id' is required"),
            ({"id": 5}, "'id' must be a string, got 5"),
            ({"id": ids[0], "set": [["kwargs.x"]]}, "'set'[0] holds at least 2 items, got 1"),
            ({"id": ids[0], "set": "kwargs.x=5"}, "'set' must be an object or a list or null"),
            ({"id": ids[0], "headers": [[1, 2]]}, "'headers'[0][0] must be a string, got 1"),
            ({"id": ids[0], "replay": "true"}, "'replay' must be true or false"),
        ],
    }
    for path, cases in refused.items():
        for body, said in cases:
            reply = ed.post(path, json_body=body, headers=headers)
            assert reply.status == 400, (path, body, reply.status, reply.text)
            assert said in reply.json()["error"], (path, body, reply.json())
            assert reply.json()["error"].startswith(f"POST {path}: ")
    for raw in (b"[1]", b"not json", b'{"ids": NaN}', b'"x"'):
        reply = ed.post("/api/purge", body=raw, headers={**headers, "Content-Type": "text/plain"})
        assert reply.status == 400 and "must be a JSON object" in reply.json()["error"]
    assert redis_state(runtime) == before and _depth(api) == 0
    # Reads refuse an unknown or mistyped query parameter (a misspelt filter would list all).
    viewer = api["ed"]
    wrong = viewer.get("/api/obituaries", params={"queu": "x"})
    assert wrong.status == 400 and "unknown query parameter 'queu'" in wrong.json()["error"]
    assert "it accepts: queue, task, cause, since, until, limit" in wrong.json()["error"]
    assert viewer.get("/api/parked", params={"limit": "many"}).status == 400
    assert viewer.get("/api/stats", params={"window": "0"}).status == 400
    empty = viewer.get("/api/stats?window=")  # schemathesis: "" is no number
    assert empty.status == 400
    assert empty.json()["error"] == "GET /api/stats: 'window' must be a number, got \"\""
    assert viewer.get("/api/obituaries?queue=&limit=1").json()["count"] == 1
    long_ago = viewer.get("/api/obituaries", params={"since": "9" * 30})  # a 500 once
    assert long_ago.status == 400 and "is too long ago" in long_ago.json()["error"]
    flags = viewer.get("/api/obituaries", params={"oldest_first": "maybe"})
    assert flags.status == 400 and "'oldest_first' must be true or false" in flags.text
    listed = viewer.get("/api/obituaries", params={"limit": "2", "oldest_first": "true"})
    assert [o["id"] for o in listed.json()["obituaries"]] == ids[:2]


def test_dry_runs_answer_the_cli_json_and_change_nothing(api: dict[str, Any]) -> None:
    ed, headers, ids, runtime, app = (
        api["ed"],
        api["headers"],
        api["ids"],
        api["runtime"],
        api["app"],
    )
    before = redis_state(runtime)
    audit_before = ed.get("/api/audit").json()

    purge = ed.post("/api/purge", json_body={"ids": ids, "dry_run": True}, headers=headers)
    assert purge.status == 200, purge.text
    assert purge.json() == {
        "dry_run": True,
        "targets": 3,
        "purged": [],
        "would_purge": ids,
        "missing": [],
    }
    # The confirmation changes nothing on a dry run; the CLI's --dry-run prints the same.
    confirmed = ed.post(
        "/api/purge", json_body={"ids": ids, "dry_run": True, "yes": True}, headers=headers
    )
    assert confirmed.json() == purge.json() == run_json(app, "purge", *ids, "--dry-run")

    replay = ed.post(
        "/api/replay",
        json_body={"cause": "backend-down", "dry_run": True, "canary": True, "rate": 1},
        headers=headers,
    )
    assert replay.status == 200, replay.text
    data = replay.json()
    assert data["dry_run"] is True and data["replayed"] == [] and data["would_replay"] == ids
    assert data["canary"] is None and data["stopped"] is False
    assert data == run_json(app, "replay", "--cause", "backend-down", "--canary", "--dry-run")

    assert redis_state(runtime) == before, "a dry run wrote to Redis"
    assert _depth(api) == 0, "a dry run published"

    charge = buried_charge(app, api["task"].name, "bad")
    bury(runtime, [charge])
    before = redis_state(runtime)
    body = {"id": charge.id, "set": {"kwargs.x": 5}, "replay": True, "dry_run": True}
    edit = ed.post("/api/edit", json_body=body, headers=headers)
    assert edit.status == 200, edit.text
    shown = edit.json()
    assert shown["dry_run"] is True and shown["replayed"] is False
    assert shown["changes"][0]["path"] == "kwargs.x" and shown["changes"][0]["after"] == 5
    cli = run_json(app, "edit", charge.id, "--set", "kwargs.x=5", "--replay", "--dry-run")
    fresh = ("new_message_id", "task_id")  # each plan draws a new message id
    assert {k: v for k, v in cli.items() if k not in fresh} == {
        k: v for k, v in shown.items() if k not in fresh
    }

    assert redis_state(runtime) == before, "a dry run wrote to Redis"
    assert _depth(api) == 0, "a dry run published"
    assert ed.get("/api/audit").json() == audit_before

    # Without dry_run the same bodies act: the replay publishes, the purge deletes.
    done = ed.post("/api/replay", json_body={"ids": ids[:1], "rate": 50}, headers=headers)
    assert done.json()["replayed"] == ids[:1] and done.json()["would_replay"] == []
    assert _depth(api) == 1
    gone = ed.post("/api/purge", json_body={"ids": ids[1:], "yes": True}, headers=headers)
    assert gone.json()["purged"] == ids[1:] and gone.json()["would_purge"] == []
    # The replayed one is no longer unresolved: listed with ?status=all (or replayed).
    assert [o["id"] for o in ed.get("/api/obituaries").json()["obituaries"]] == [charge.id]
    assert [o["id"] for o in ed.get("/api/obituaries?status=all").json()["obituaries"]] == [
        charge.id,
        ids[0],
    ]


def test_the_openapi_document_is_built_from_the_handlers_declarations(api: dict[str, Any]) -> None:
    viewer = Client(api["ed"].origin or "", ("viewer", "viewer-secret"))
    reply = viewer.get("/api/openapi.json")
    assert reply.status == 200 and reply.headers["content-type"] == "application/json"
    doc = reply.json()
    assert doc["openapi"] == "3.1.0"
    declared = {(e.method.lower(), e.path): e for e, _ in API_ROUTES}
    published = {(m, p) for p, ops in doc["paths"].items() for m in ops}
    assert published == set(declared)
    # Every /api/ route the application serves is declared (no route outside the document).
    app_routes = {r.path for r in api["server"].server.config.app.routes}
    assert {p for _, p in declared} == {p for p in app_routes if p.startswith("/api/")}
    for (method, path), endpoint in declared.items():
        op = doc["paths"][path][method]
        assert op["x-dlx-role"] == endpoint.role
        if endpoint.body is not None:
            assert op["requestBody"]["content"]["application/json"]["schema"] == (
                endpoint.body_schema()
            )
            assert op["security"] == [{"basic": [], "csrf": []}]
            assert {"403", "413"} <= set(op["responses"])
        assert {"400", "401"} <= set(op["responses"])
    purge = doc["paths"]["/api/purge"]["post"]
    body = purge["requestBody"]["content"]["application/json"]["schema"]
    assert body["additionalProperties"] is False
    assert set(body["properties"]) == {"ids", "cause", "yes", "dry_run"}
    assert body["properties"]["ids"]["maxItems"] == MAX_IDS
    assert purge["x-dlx-confirmation"] == '"yes": true in the body, unless "dry_run": true'
    result = doc["components"]["schemas"]["PurgeJSON"]
    assert set(result["required"]) == {"dry_run", "targets", "purged", "would_purge", "missing"}
    assert doc["components"]["securitySchemes"]["csrf"]["name"] == "X-CSRF-Token"
    assert doc["paths"]["/api/edit"]["post"]["x-dlx-role"] == "editor"
    assert doc["paths"]["/api/replay"]["post"]["x-dlx-role"] == "operator"
    assert Client(viewer.origin or "").get("/api/openapi.json").status == 401


def test_parked_retries_one_by_one_and_obituaries_by_status(api: dict[str, Any]) -> None:
    """``/api/parked/retry-now`` and ``/api/parked/bury-now`` act as the CLI's ``dlx parked
    --retry-now/--bury-now`` (confirmation, dry run, audit); listings filter by status."""
    from celery_dlx.fates import now_ms
    from celery_dlx.message.parked import ParkedMessage

    ed, headers, runtime, app = api["ed"], api["headers"], api["runtime"], api["app"]
    later = now_ms() + 3_600_000
    for i in range(2):
        runtime.park(
            ParkedMessage(
                message_id=f"p-{i}", attempt=1, queue=app.conf.task_default_queue,
                body=b'{"order": 1}', headers={"task": api["task"].name}, due_ms=later,
                task=api["task"].name, cause="c-parked",
            )
        )  # fmt: skip
    unconfirmed = ed.post("/api/parked/retry-now", json_body={"ids": ["p-0:1"]}, headers=headers)
    assert unconfirmed.status == 400 and '"yes": true' in unconfirmed.json()["error"]
    dry = ed.post(
        "/api/parked/bury-now", json_body={"cause": "c-parked", "dry_run": True}, headers=headers
    )
    assert dry.json()["done"] == ["p-0:1", "p-1:1"] and runtime.parking.count() == 2
    assert dry.json() == run_json(app, "parked", "--bury-now", "--cause", "c-parked", "--dry-run")
    done = ed.post(
        "/api/parked/retry-now", json_body={"ids": ["p-0:1"], "yes": True}, headers=headers
    )
    assert done.status == 200 and done.json()["done"] == ["p-0:1"], done.text
    buried = ed.post(
        "/api/parked/bury-now", json_body={"ids": ["p-1:1"], "yes": True}, headers=headers
    )
    assert buried.json()["done"] == ["p-1:1"] and runtime.parking.count() == 1
    (ob_id,) = buried.json()["obituaries"]
    listed = ed.get("/api/obituaries").json()["obituaries"]
    assert ob_id in [r["id"] for r in listed] and all(r["status"] == "unresolved" for r in listed)
    assert ed.get("/api/obituaries?status=resolved").json()["obituaries"] == []
    assert ed.get("/api/obituaries?status=sometimes").status == 400
    assert ed.get("/api/groups?status=").status == 400  # a choice, not a text filter: no empty one
    assert any("bury-now" in str(a) for a in ed.get("/api/audit").json())
