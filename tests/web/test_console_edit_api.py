"""``POST /api/edit`` on a real console, Redis and RabbitMQ: an editor's dry run and replay (the
edited copy waits in the queue with its new id and value), operators, viewers and posts without
the CSRF token refused, pickle and unknown ids refused; nothing published by a refusal."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from celery_dlx_edit.edit import EDITED_FROM_HEADER, edits_of
from tests.integration.helpers import queue_depth
from tests.web.conftest import serve
from tests.web.helpers import OPERATOR, VIEWER, Client, bury, foreign_obituary, pickle_bomb
from tests.web.test_console_edit_browser import EDITOR, buried_charge


@pytest.fixture
def api(shop: dict[str, Any], broker: Any) -> Iterator[dict[str, Any]]:
    channel = broker.channel()
    shop["app"].amqp.queues[shop["app"].conf.task_default_queue](channel).declare()
    server = serve(shop["runtime"], editors=(":".join(EDITOR),))
    try:
        yield {**shop, "url": server.url, "channel": channel}
    finally:
        server.stop()


def test_an_editor_previews_then_replays_through_the_api(api: dict[str, Any]) -> None:
    app, runtime, channel = api["app"], api["runtime"], api["channel"]
    queue = app.conf.task_default_queue
    ob = buried_charge(app, api["task"].name, "bad")
    bury(runtime, [ob])
    ed = Client(api["url"], EDITOR)
    headers = {"X-CSRF-Token": ed.csrf()}
    body = {"id": ob.id, "set": {"kwargs.x": 5}, "headers": [["x-tenant", "globex"]]}
    dry = ed.post("/api/edit", json_body={**body, "replay": True, "dry_run": True}, headers=headers)
    assert dry.status == 200, dry.text
    assert dry.json()["replayed"] is False and dry.json()["changes"][0]["after"] == 5
    assert queue_depth(channel, queue) == 0

    done = ed.post("/api/edit", json_body={**body, "replay": True}, headers=headers)
    assert done.status == 200, done.text
    data = done.json()
    assert data["replayed"] is True and data["task_id"] == data["new_message_id"] != ob.message_id
    got = channel.basic_get(queue, no_ack=True)
    assert got is not None
    assert json.loads(got.body)[1] == {"order_id": 1, "x": 5}
    assert got.headers["id"] == data["new_message_id"] and got.headers["x-tenant"] == "globex"
    assert got.headers[EDITED_FROM_HEADER] == ob.id
    assert [e["user"] for e in edits_of(runtime, ob.id)] == ["ed"]


def test_the_api_refuses_non_editors_and_bad_edits(api: dict[str, Any]) -> None:
    app, runtime, channel = api["app"], api["runtime"], api["channel"]
    ob = buried_charge(app, api["task"].name, "bad")
    pickled = foreign_obituary(
        app.conf.task_default_queue,
        pickle_bomb("/nonexistent/never"),
        "application/x-python-serialize",
        cause="pickled",
    )
    bury(runtime, [ob, pickled])
    body = {"id": ob.id, "set": {"kwargs.x": 5}, "replay": True}
    for who in (OPERATOR, VIEWER):
        client = Client(api["url"], who)
        refused = client.post("/api/edit", json_body=body, headers={"X-CSRF-Token": client.csrf()})
        assert refused.status == 403 and "only editors" in refused.json()["error"]
    ed = Client(api["url"], EDITOR)
    assert ed.post("/api/edit", json_body=body).status == 403  # no CSRF token
    headers = {"X-CSRF-Token": ed.csrf()}
    pickle = ed.post(
        "/api/edit", json_body={**body, "id": pickled.id, "set": {"x": 1}}, headers=headers
    )
    assert pickle.status == 400 and "pickle" in pickle.json()["error"]
    missing = ed.post("/api/edit", json_body={**body, "id": "nope"}, headers=headers)
    assert missing.status == 404
    bad = ed.post("/api/edit", json_body={**body, "headers": {"x-dlx-attempt": 0}}, headers=headers)
    assert bad.status == 400 and "cannot be edited" in bad.json()["error"]
    assert ed.post("/api/edit", json_body=[1], headers=headers).status == 400
    assert queue_depth(channel, app.conf.task_default_queue) == 0
    assert edits_of(runtime, ob.id) == []
