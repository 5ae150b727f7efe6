"""The console's pages and API on a real uvicorn server over a real graveyard: causes, a group
paged and filtered, an obituary decoded (JSON, Celery arguments, protobuf best fit and runner-up,
wire dump, hex), pickle shown opaque and never loaded, every name escaped, parked retries, the
overview, ``/metrics``, and the API's shapes equal to the CLI's ``--json``."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

from celery_dlx.fates import FateEvent, now_ms
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.ops.inspection import (
    groups_data,
    list_rows,
    parked_data,
    registry_for,
    show_data,
    stats_data,
)
from celery_dlx.ops.obituaries import get_obituary
from tests.web.helpers import XSS, b64, bury, foreign_obituary, pickle_bomb, task_obituary


def test_causes_page_lists_groups_with_counts_and_links(console: dict[str, Any]) -> None:
    app, runtime, name = console["app"], console["runtime"], console["task"].name
    bury(runtime, [task_obituary(app, name, i) for i in range(4)])
    bury(
        runtime,
        [
            task_obituary(
                app,
                name,
                10 + i,
                cause="timeout-cause",
                exc_type="TimeoutError",
                exc_message="upstream timed out after <n>s",
            )
            for i in range(2)
        ],
    )
    page = console["viewer"].get("/causes")
    assert page.status == 200
    rows = re.findall(r'<tr class="cause">(.*?)</tr>', page.text, re.S)
    assert len(rows) == 2
    by_cause = {re.search(r"cause=([\w-]+)", r).group(1): r for r in rows}  # type: ignore[union-attr]
    assert '<td class="num">4</td>' in by_cause["backend-down"]
    assert '<td class="num">2</td>' in by_cause["timeout-cause"]
    assert "TimeoutError" in by_cause["timeout-cause"]
    assert html.escape("upstream timed out after <n>s") in by_cause["timeout-cause"]
    assert name in by_cause["backend-down"] and "notify" in by_cause["backend-down"]
    assert "2 causes, 6 obituaries" in page.text


def test_group_page_is_paged_newest_first_and_filtered(console: dict[str, Any]) -> None:
    app, runtime, name = console["app"], console["runtime"], console["task"].name
    base = now_ms() - 100_000
    obits = [task_obituary(app, name, i, at=base + i * 1000) for i in range(7)]
    bury(runtime, obits)
    client = console["viewer"]
    first = client.get("/group", params={"cause": "backend-down", "limit": 3})
    ids = re.findall(r'href="/obituary\?id=([^"]+)"', first.text)
    newest = [ob.id for ob in reversed(obits)]
    assert ids == newest[:3]
    assert "7 matching" in first.text
    older = re.search(r'id="older" href="([^"]+)"', first.text).group(1)  # type: ignore[union-attr]
    second = client.get(html.unescape(older))
    assert re.findall(r'href="/obituary\?id=([^"]+)"', second.text) == newest[3:6]
    # Time filter: only the three oldest.
    until = client.get(
        "/group", params={"cause": "backend-down", "until": f"@{(base + 2500) / 1000}"}
    )
    assert re.findall(r'href="/obituary\?id=([^"]+)"', until.text) == newest[-3:][::1]
    assert "3 matching" in until.text
    # Queue and task filters (post-filters): all match, then none.
    same = client.get(
        "/group", params={"cause": "backend-down", "queue": app.conf.task_default_queue}
    )
    assert len(re.findall(r'href="/obituary\?id=', same.text)) == 7
    none = client.get("/group", params={"cause": "backend-down", "task": "other.task"})
    assert len(re.findall(r'href="/obituary\?id=', none.text)) == 0
    exc = client.get(
        "/group", params={"cause": "backend-down", "exception": "RuntimeError", "limit": 5}
    )
    assert re.findall(r'href="/obituary\?id=([^"]+)"', exc.text) == newest[:5]
    # Mixed queues in one cause: the queue and task filters pick their own, newest first.
    others = [
        foreign_obituary(
            "other",
            b"{}",
            "application/json",
            cause="backend-down",
            exc_type="RuntimeError",
            order=i,
        )
        for i in range(3)
    ]
    bury(runtime, others)
    other = client.get("/group", params={"cause": "backend-down", "queue": "other"})
    assert re.findall(r'href="/obituary\?id=([^"]+)"', other.text) == [
        o.id for o in reversed(others)
    ]
    by_task = client.get("/group", params={"cause": "backend-down", "task": name, "limit": 4})
    assert re.findall(r'href="/obituary\?id=([^"]+)"', by_task.text) == newest[:4]
    nxt = re.search(r'id="older" href="([^"]+)"', by_task.text).group(1)  # type: ignore[union-attr]
    rest = client.get(html.unescape(nxt))
    assert re.findall(r'href="/obituary\?id=([^"]+)"', rest.text) == newest[4:]
    assert client.get("/group", params={"cause": "nope"}).status == 404
    assert (
        client.get("/group", params={"cause": "backend-down", "since": "yesterday"}).status == 400
    )


def test_obituary_page_decodes_celery_json_and_protobuf(console: dict[str, Any]) -> None:
    app, runtime, events = console["app"], console["runtime"], console["events"]
    celery_ob = task_obituary(
        app, console["task"].name, 1, args=({"order_id": "A-17", "cents": 1250},)
    )
    failed = events.PaymentFailed(order_id="A-17", reason="card declined", code=51)
    proto_ob = foreign_obituary(
        "payments",
        b64(failed),
        "application/x-protobuf",
        cause="pay-declined",
        headers={"x-proto-type": "shop.events.v1.PaymentFailed"},
    )
    json_ob = foreign_obituary(
        "orders",
        json.dumps({"order": {"id": 7, "lines": [1, 2]}}).encode(),
        "application/json",
        cause="orders-json",
    )
    bury(runtime, [celery_ob, proto_ob, json_ob])
    client = console["viewer"]

    page = client.get("/obituary", params={"id": celery_ob.id}).text
    assert "decoded as <strong>celery</strong>" in page
    args = html.unescape(re.search(r'<pre id="celery-args">(.*?)</pre>', page, re.S).group(1))  # type: ignore[union-attr]
    assert "args = [" in args and '"order_id": "A-17"' in args
    assert "kwargs = {}" in args
    assert "RuntimeError: payment backend down" in page  # traceback
    assert "requeued" in re.search(r'id="timeline">(.*?)</ol>', page, re.S).group(1)  # type: ignore[union-attr]

    page = client.get("/obituary", params={"id": proto_ob.id}).text
    assert 'id="type-name">shop.events.v1.PaymentFailed<' in page
    assert "inside base64" in page
    decoded = html.unescape(re.search(r'<pre id="decoded">(.*?)</pre>', page, re.S).group(1))  # type: ignore[union-attr]
    assert json.loads(decoded) == {"order_id": "A-17", "reason": "card declined", "code": 51}
    assert 'id="runner-up"' in page
    assert '<pre id="wire">' in page and '<pre id="hex">' in page

    page = client.get("/obituary", params={"id": json_ob.id}).text
    assert "decoded as <strong>json</strong>" in page
    decoded = html.unescape(re.search(r'<pre id="decoded">(.*?)</pre>', page, re.S).group(1))  # type: ignore[union-attr]
    assert json.loads(decoded) == {"order": {"id": 7, "lines": [1, 2]}}
    assert client.get("/obituary", params={"id": "nope"}).status == 404


def test_pickle_is_shown_opaque_and_never_loaded(console: dict[str, Any], tmp_path: Path) -> None:
    marker = tmp_path / "pickle-was-loaded"
    ob = foreign_obituary(
        "legacy", pickle_bomb(str(marker)), "application/x-python-serialize", cause="legacy-pickle"
    )
    bury(console["runtime"], [ob])
    for path in ("/obituary", "/api/obituary"):
        reply = console["op"].get(path, params={"id": ob.id})
        assert reply.status == 200
    page = console["op"].get("/obituary", params={"id": ob.id}).text
    assert "opaque-unsafe" in page and 'id="opaque"' in page
    assert console["op"].get("/group", params={"cause": "legacy-pickle"}).status == 200
    assert console["op"].get("/api/obituaries", params={"cause": "legacy-pickle"}).status == 200
    assert not marker.exists()


def test_payload_headers_names_and_traceback_are_escaped(console: dict[str, Any]) -> None:
    ob = foreign_obituary(
        f"q{XSS}",
        XSS.encode(),
        "text/html",
        cause="xss-cause",
        exc_type=f"Bad{XSS}",
        exc_message=XSS,
        headers={XSS: XSS, "x-note": XSS},
    )
    ob.traceback = XSS
    ob.task = XSS
    bury(console["runtime"], [ob])
    client = console["op"]
    for path, params in (
        ("/causes", {}),
        ("/group", {"cause": "xss-cause"}),
        ("/obituary", {"id": ob.id}),
        ("/", {}),
    ):
        page = client.get(path, params=params).text
        assert "<script>" not in page and "<img src=x" not in page, path
        assert "&lt;script&gt;" in page or "\\u003cscript\\u003e" in page, path


def test_parked_page_and_overview(console: dict[str, Any]) -> None:
    runtime = console["runtime"]
    now = now_ms()
    for i, (queue, due) in enumerate(
        [
            ("alpha", now - 30_000),
            ("alpha", now + 60_000),
            ("beta", now - 5_000),
            ("beta", now + 5_000),
        ]
    ):
        runtime.store.park(ParkedMessage(f"p{i}", 1, queue, b"{}", due_ms=due, cause="c"))
    bury(runtime, [task_obituary(console["app"], console["task"].name, 1)])
    runtime.record_many(
        [
            FateEvent.from_fields("requeued", queue="alpha", message_id=f"r{i}", attempt=1)
            for i in range(3)
        ]
    )
    page = console["viewer"].get("/parked").text
    assert '<span id="parked-count">4</span> parked, <span id="parked-due">2</span> due now' in page
    rows = re.findall(
        r"<tr><td>(alpha|beta)</td><td class=\"num\">(\d+)</td><td class=\"num\">(\d+)</td>", page
    )
    assert rows == [("alpha", "2", "1"), ("beta", "2", "1")]
    late = re.search(r"oldest due is ([\d.]+) s late", page)
    assert late and 29 <= float(late.group(1)) < 120
    overview = console["viewer"].get("/").text
    assert '<span class="big" id="graveyard-total">1</span>' in overview
    assert '<span class="big" id="parked-total">4</span>' in overview
    assert '<svg id="fate-chart"' in overview
    assert '<polyline class="fate fate-requeued"' in overview
    assert '<span class="key fate-requeued">requeued 3</span>' in overview
    assert (
        'id="problems"' in overview or 'id="check-ok"' in overview or 'id="check-error"' in overview
    )


def test_metrics_read_redis_at_scrape_time(console: dict[str, Any]) -> None:
    app, runtime = console["app"], console["runtime"]
    queue = app.conf.task_default_queue
    bury(runtime, [task_obituary(app, console["task"].name, i) for i in range(3)])
    runtime.record_many(
        [
            FateEvent.from_fields("buried", queue=queue, message_id=f"b{i}", attempt=5)
            for i in range(3)
        ]
    )
    runtime.store.park(ParkedMessage("p1", 1, queue, b"{}", due_ms=now_ms() - 10_000))
    reply = console["viewer"].get("/metrics")
    assert reply.status == 200 and reply.headers["content-type"].startswith("text/plain")
    text = reply.text
    assert f'celery_dlx_graveyard_obituaries{{queue="{queue}"}} 3.0' in text
    assert (
        f'celery_dlx_graveyard_cause_obituaries{{cause="backend-down",exc_type="RuntimeError",queue="{queue}"}} 3.0'
        in text
    )
    assert f'celery_dlx_parked{{queue="{queue}"}} 1.0' in text
    assert f'celery_dlx_parked_due{{queue="{queue}"}} 1.0' in text
    lateness = re.search(rf'celery_dlx_parked_lateness_seconds{{queue="{queue}"}} ([\d.]+)', text)
    assert lateness and float(lateness.group(1)) >= 10
    assert f'celery_dlx_fate_changes{{fate="buried",queue="{queue}",window="1h"}} 3.0' in text
    assert "celery_dlx_scrape_error 0.0" in text
    # Read at scrape time: a new burial shows on the next scrape.
    bury(runtime, [task_obituary(app, console["task"].name, 9)])
    assert (
        f'celery_dlx_graveyard_obituaries{{queue="{queue}"}} 4.0'
        in console["viewer"].get("/metrics").text
    )


def _without_volatile(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _without_volatile(v) for k, v in data.items() if k not in {"waited_s"}}
    if isinstance(data, list):
        return [_without_volatile(v) for v in data]
    return data


def test_api_has_the_shapes_of_the_cli_json(console: dict[str, Any]) -> None:
    app, runtime = console["app"], console["runtime"]
    obits = [task_obituary(app, console["task"].name, i) for i in range(3)]
    bury(runtime, obits)
    runtime.store.park(ParkedMessage("p1", 1, "alpha", b"{}", due_ms=now_ms() + 60_000))
    client = console["viewer"]
    registry = registry_for(runtime)
    assert client.get("/api/groups").json() == json.loads(json.dumps(groups_data(runtime)))
    listed = client.get("/api/obituaries", params={"cause": "backend-down", "limit": 2}).json()
    expected = list_rows(runtime, registry=registry, cause="backend-down", limit=2)
    assert listed == json.loads(json.dumps(expected))
    shown = client.get("/api/obituary", params={"id": obits[0].id}).json()
    ob = get_obituary(runtime, obits[0].id)
    assert ob is not None
    assert shown == json.loads(json.dumps(show_data(ob, registry)))
    missing = client.get("/api/obituary", params={"id": "nope"})
    assert missing.status == 404 and missing.json() == {"error": "not found", "id": "nope"}
    parked = client.get("/api/parked").json()
    assert set(parked) == set(parked_data(runtime))
    assert parked["count"] == 1 and parked["messages"][0]["queue"] == "alpha"
    stats = client.get("/api/stats").json()
    assert stats["graveyard"]["count"] == 3 and stats["parked"]["count"] == 1
    cli_stats = stats_data(runtime)
    assert set(stats) == set(cli_stats) and set(stats["graveyard"]) == set(cli_stats["graveyard"])
    assert stats["graveyard"]["queues"][0]["count"] == 3
    check = client.get("/api/check").json()
    assert {"ok", "problems", "management"} <= set(check)
    assert client.get("/api/obituaries", params={"limit": 100000}).status == 400
