"""``celery dlx list/show/groups/parked/stats/purge`` on real RabbitMQ and Redis.

The graveyard is filled the way production fills it: a foreign consumer rejects base64 protobuf
events (several types sharing field numbers, compiled from tests/fixtures/protos with
grpcio-tools) into the DLX, and the real DLX service buries them; Celery obituaries with
tracebacks are written as the service writes them. The JSON output is checked field by field.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis as redis_lib

from celery_dlx.fates import PURGED, REQUEUED, FateEvent, now_ms
from celery_dlx.message.obituary import Attempt, Obituary
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.ops import obituaries
from celery_dlx.ops.render import iso
from celery_dlx.service.runner import run_service
from celery_dlx.service.settle import buried_event
from celery_dlx.store.graveyard import Graveyard
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import REDIS_URL, ROOT
from tests.integration.cli_helpers import (
    b64,
    declare_foreign_queue,
    publish_and_reject,
    run,
    run_json,
    shop_protos,
)
from tests.integration.dlx_apps import make_app

TRACEBACK = 'Traceback (most recent call last):\n  File "shop/tasks.py", line 12\nshop.errors.Declined: card declined'


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A graveyard holding foreign protobuf burials (two queues) and Celery burials."""
    uid = uuid.uuid4().hex[:10]
    descriptor_set, pb = shop_protos(tmp_path_factory.mktemp("protos"))
    payments, counters = f"payments-{uid}", f"counters-{uid}"
    no_retry = {"max_requeues": 0, "max_parks": 0}
    conf = {
        "dlx_protobuf_descriptor_sets": [str(descriptor_set)],
        "dlx_queues": {payments: no_retry, counters: no_retry},
    }
    app = make_app(uid, **conf)
    runtime = get_runtime(app)
    events = {
        "shop.events.v1.PaymentFailed": [
            pb.PaymentFailed(order_id=f"o-{i}", reason="card declined", code=51) for i in range(3)
        ],
        "shop.events.v1.OrderPlaced": [
            pb.OrderPlaced(order_id="o-9", amount_cents=1250, currency="EUR")
        ],
        "shop.events.v1.CounterIncrement": [pb.CounterIncrement(name="orders", by=3)],
    }
    type_of: dict[str, str] = {}
    body_of: dict[str, bytes] = {}
    conn = app.connection_for_write()
    try:
        declare_foreign_queue(conn, app, payments)
        declare_foreign_queue(conn, app, counters)
        for type_name, messages in events.items():
            queue = counters if "Counter" in type_name else payments
            bodies = [(b64(m), "application/octet-stream") for m in messages]
            for mid, (body, _) in zip(publish_and_reject(conn, queue, bodies), bodies, strict=True):
                type_of[mid], body_of[mid] = type_name, body
        run_service(app, idle_timeout=1.0, install_signals=False)
        assert obituaries.count(runtime) == 5
        celery_obits = [celery_obituary(i) for i in range(2)]
        Graveyard(runtime.redis, runtime.keys).write_many(
            [(ob, buried_event(ob)) for ob in celery_obits]
        )
        yield {
            "uid": uid,
            "app": app,
            "runtime": runtime,
            "conf": conf,
            "type_of": type_of,
            "body_of": body_of,
            "queues": (payments, counters),
            "celery": celery_obits,
            "descriptor_set": descriptor_set,
        }
    finally:
        channel = conn.channel()
        for name in (payments, counters, app.conf.dlx_service_queue):
            channel.queue_delete(name)
        channel.exchange_delete(app.conf.dlx_exchange)
        conn.release()
        runtime.reset_publisher()
        client = redis_lib.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match="{" + f"test-{uid}" + "}*", count=1000):
            client.delete(key)


def celery_obituary(i: int) -> Obituary:
    at = now_ms() - 60_000 + i
    body = json.dumps([[f"o-{i}"], {"amount": 10 + i}, {"callbacks": None}]).encode()
    return Obituary.from_fields(
        id=f"celery-ob-{i}",
        message_id=f"task-{i}",
        queue="orders",
        reason="retry budget spent: 2 requeues, 2 parks",
        buried_ms=at,
        task="shop.charge",
        origin="celery",
        cause="charge-declined",
        exc_type="shop.errors.Declined",
        exc_message="card declined",
        traceback=TRACEBACK,
        importance="page",
        attempt=5,
        attempts=[
            Attempt(at - 10, "requeued", "charge-declined"),
            Attempt(at, "buried", "charge-declined"),
        ],
        first_failure_ms=at - 10,
        last_failure_ms=at,
        headers={"task": "shop.charge", "id": f"task-{i}", "x-dlx-attempt": 4},
        properties={"content_type": "application/json", "content_encoding": "utf-8"},
        payload=body,
        payload_size=len(body),
    )


def test_list_json_rows_are_the_obituaries_with_decoded_protobuf(shop: dict[str, Any]) -> None:
    runtime = shop["runtime"]
    data = run_json(shop["app"], "list")
    assert data["count"] == data["total"] == 7
    expected = obituaries.list_obituaries(runtime, limit=None)
    assert [r["id"] for r in data["obituaries"]] == [ob.id for ob in expected]
    for row, ob in zip(data["obituaries"], expected, strict=True):
        assert row["message_id"] == ob.message_id and row["queue"] == ob.queue
        assert row["task"] == ob.task and row["origin"] == ob.origin and row["cause"] == ob.cause
        assert row["exc_type"] == ob.exc_type and row["exc_message"] == ob.exc_message
        assert row["reason"] == ob.reason and row["importance"] == ob.importance
        assert row["attempt"] == ob.attempt and row["buried_ms"] == ob.buried_ms
        assert row["buried_at"] == iso(ob.buried_ms) and row["replays"] == []
        assert row["replayed_from"] is None
        assert row["payload"]["size"] == ob.payload_size
        assert row["payload"]["content_type"] == ob.content_type
        if ob.origin == "foreign":
            type_name = shop["type_of"][ob.message_id]
            assert row["payload"]["kind"] == "protobuf"
            assert row["payload"]["type_name"] == type_name
            assert row["payload"]["preview"].startswith(type_name.rsplit(".", 1)[-1] + " {")
        else:
            assert row["payload"]["kind"] == "celery" and row["payload"]["type_name"] is None
            assert '"kwargs":{"amount":' in row["payload"]["preview"]


def test_list_filters(shop: dict[str, Any]) -> None:
    app = shop["app"]
    payments, counters = shop["queues"]

    def ids(*args: str) -> list[str]:
        return [r["id"] for r in run_json(app, "list", *args)["obituaries"]]

    everything = ids()
    assert set(ids("--queue", payments)) == {
        ob.id for ob in obituaries.list_obituaries(shop["runtime"], queue=payments)
    }
    assert len(ids("--queue", payments)) == 4 and len(ids("--queue", counters)) == 1
    assert ids("--task", "shop.charge") == ["celery-ob-1", "celery-ob-0"]
    assert ids("--cause", "charge-declined", "--limit", "1") == ["celery-ob-1"]
    assert ids("--group", "charge-declined", "--oldest-first", "-n", "1") == ["celery-ob-0"]
    assert ids("--limit", "2") == everything[:2]
    assert ids("--since", "1h") == everything
    assert ids("--since", "@" + str(now_ms() // 1000 + 3600)) == []
    assert set(ids("--until", "30s")) == {"celery-ob-0", "celery-ob-1"}
    bad = run(app, "list", "--since", "yesterday-ish")
    assert bad.exit_code == 2 and "--since" in bad.stderr


def test_list_table_shows_the_decoded_type(shop: dict[str, Any]) -> None:
    result = run(shop["app"], "list", "--queue", shop["queues"][1])
    assert result.exit_code == 0
    header, row, footer = result.stdout.splitlines()
    assert header.split()[:3] == ["ID", "BURIED", "QUEUE"]
    assert row.endswith('CounterIncrement {"name":"orders","by":3}')
    assert footer == "1 shown of 7 in the graveyard"


def test_show_json_has_every_field_and_the_decoded_payload(shop: dict[str, Any]) -> None:
    runtime = shop["runtime"]
    mid = next(m for m, t in shop["type_of"].items() if t.endswith("PaymentFailed"))
    ob = obituaries.get_obituary(runtime, mid)
    assert ob is not None
    data = run_json(shop["app"], "show", ob.id)
    record = ob.record()
    for name in ("id", "message_id", "queue", "reason", "buried_ms", "task", "origin", "cause"):
        assert data[name] == record[name], name
    for name in ("exc_type", "traceback", "attempt", "death_reason", "exchange", "routing_key"):
        assert data[name] == record[name], name
    assert data["headers"] == record["headers"] and data["properties"] == record["properties"]
    assert data["x_death"] == record["x_death"] and data["x_death"][0]["reason"] == "rejected"
    assert data["buried_at"] == iso(ob.buried_ms)
    assert [(a["at_ms"], a["fate"], a["at"]) for a in data["attempts"]] == [
        (a.at_ms, a.fate, iso(a.at_ms)) for a in ob.attempts
    ]
    payload = data["payload"]
    assert payload["size"] == len(shop["body_of"][mid]) and payload["base64"] is None
    decoded = payload["decoded"]
    assert decoded["kind"] == "protobuf" and decoded["layers"] == ["base64"]
    assert decoded["type_name"] == "shop.events.v1.PaymentFailed" and decoded["score"] == 1.0
    assert decoded["data"]["reason"] == "card declined" and decoded["data"]["code"] == 51
    raw = run_json(shop["app"], "show", ob.message_id, "--raw")
    assert raw["id"] == ob.id
    assert base64.b64decode(raw["payload"]["base64"]) == shop["body_of"][mid]


def test_show_text_and_celery_traceback(shop: dict[str, Any]) -> None:
    result = run(shop["app"], "show", "celery-ob-1")
    assert result.exit_code == 0
    text = result.stdout
    assert "obituary celery-ob-1  message task-1" in text
    assert "exception:     shop.errors.Declined: card declined" in text
    assert "decoded as celery" in text and '"amount": 11' in text
    assert text.rstrip().endswith(TRACEBACK)
    missing = run(shop["app"], "show", "no-such-id")
    assert missing.exit_code == 3 and "no obituary" in missing.stderr
    assert run_json(shop["app"], "show", "no-such-id", code=3) == {
        "error": "not found",
        "id": "no-such-id",
    }


def test_show_with_a_descriptor_set_given_on_the_command_line(shop: dict[str, Any]) -> None:
    plain = make_app(shop["uid"], dlx_queues=shop["conf"]["dlx_queues"])
    mid = next(m for m, t in shop["type_of"].items() if t.endswith("OrderPlaced"))
    without = run_json(plain, "show", mid)["payload"]["decoded"]
    assert without["kind"] == "protobuf-wire" and without["type_name"] is None
    given = run_json(plain, "show", mid, "--proto", str(shop["descriptor_set"]))
    decoded = given["payload"]["decoded"]
    assert decoded["type_name"] == "shop.events.v1.OrderPlaced"
    assert decoded["data"] == {"order_id": "o-9", "amount_cents": 1250, "currency": "EUR"}


def test_groups_json(shop: dict[str, Any]) -> None:
    data = run_json(shop["app"], "groups")
    expected = obituaries.groups(shop["runtime"])
    assert data["total"] == 7 and data["count"] == len(expected) >= 3
    for row, group in zip(data["groups"], expected, strict=True):
        assert row["cause"] == group.cause and row["count"] == group.count
        assert row["total"] == group.total and row["example_id"] == group.example_id
        assert (row["first_ms"], row["last_ms"]) == (group.first_ms, group.last_ms)
        assert (row["first_seen"], row["last_seen"]) == (iso(group.first_ms), iso(group.last_ms))
        assert (row["exc_type"], row["exc_message"]) == (group.exc_type, group.exc_message)
        assert (row["task"], row["queue"]) == (group.task, group.queue)
    charge = next(r for r in data["groups"] if r["cause"] == "charge-declined")
    assert charge["count"] == 2 and charge["example_id"] == "celery-ob-1"
    assert sum(r["count"] for r in data["groups"]) == 7
    text = run(shop["app"], "groups").stdout
    assert "charge-declined   2" in text and text.endswith(
        f"{len(expected)} causes, 7 obituaries\n"
    )


def test_entry_points_in_real_subprocesses(shop: dict[str, Any]) -> None:
    env = dict(os.environ)
    env.update(
        DLX_CLI_UID=shop["uid"],
        DLX_CLI_CONF=json.dumps(shop["conf"]),
        PYTHONPATH=str(ROOT),
    )
    bindir = Path(sys.executable).parent
    listed = subprocess.run(
        [str(bindir / "celery"), "-A", "tests.integration.cli_app", "dlx", "list", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)["obituaries"]
    assert [r["id"] for r in rows] == [
        ob.id for ob in obituaries.list_obituaries(shop["runtime"], limit=None)
    ]
    assert {r["payload"]["type_name"] for r in rows if r["origin"] == "foreign"} == set(
        shop["type_of"].values()
    )
    grouped = subprocess.run(
        [str(bindir / "celery-dlx"), "-A", "tests.integration.cli_app", "groups", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert grouped.returncode == 0, grouped.stderr
    assert [g["cause"] for g in json.loads(grouped.stdout)["groups"]] == [
        g.cause for g in obituaries.groups(shop["runtime"])
    ]


def test_parked_json(uid: str, key_prefix: str) -> None:
    app = make_app(uid)
    runtime = get_runtime(app)
    now = now_ms()
    for i, due in enumerate((now - 1000, now + 60_000, now + 5_000)):
        runtime.park(
            ParkedMessage(
                message_id=f"p-{i}",
                attempt=i + 1,
                queue="orders",
                body=b"{}",
                due_ms=due,
                parked_ms=now - 2000,
                task="shop.charge",
                cause=f"c{i}",
            )
        )
    data = run_json(app, "parked")
    assert data["backend"] == "redis" and data["ladder"] is None
    assert data["count"] == 3 and data["due_now"] == 1
    assert [m["message_id"] for m in data["messages"]] == ["p-0", "p-2", "p-1"]
    first = data["messages"][0]
    assert first == {
        "entry_id": "p-0:1",
        "message_id": "p-0",
        "task": "shop.charge",
        "queue": "orders",
        "attempt": 1,
        "cause": "c0",
        "parked_ms": now - 2000,
        "parked_at": iso(now - 2000),
        "due_ms": now - 1000,
        "due_at": iso(now - 1000),
        "due_in_s": first["due_in_s"],
        "claimed": False,
    }
    assert first["due_in_s"] < 0 < data["messages"][1]["due_in_s"]
    claimed = runtime.store.claim(1, lease_ms=30_000)
    assert [m.message_id for m in claimed] == ["p-0"]
    again = run_json(app, "parked", "--limit", "3")["messages"]
    # A claimed entry is scored by its lease end (now + 30 s) until the drain deletes it.
    assert [(m["message_id"], m["claimed"]) for m in again] == [
        ("p-2", False),
        ("p-0", True),
        ("p-1", False),
    ]
    text = run(app, "parked").stdout
    assert "3 parked (0 due now), 3 shown; backend redis" in text


def test_stats_json(uid: str, key_prefix: str) -> None:
    app = make_app(uid)
    runtime = get_runtime(app)
    old = celery_obituary(0)
    old.buried_ms -= 3_600_000
    new = celery_obituary(1)
    new.queue = "billing"
    Graveyard(runtime.redis, runtime.keys).write_many([(ob, buried_event(ob)) for ob in (old, new)])
    # As the DLX service does: the graveyard script appended the history, record() counts.
    runtime.record_many([buried_event(old), buried_event(new)], history=False)
    for _ in range(3):
        runtime.record(
            FateEvent.from_fields(fate=REQUEUED, queue="orders", message_id="x", attempt=1)
        )
    runtime.park(
        ParkedMessage(message_id="p", attempt=1, queue="orders", body=b"", due_ms=now_ms() + 9000)
    )
    data = run_json(app, "stats", "--window", "10m")
    assert data["window_s"] == 600
    assert data["fates"]["orders"]["requeued"] == 3 and data["totals"]["requeued"] == 3
    assert data["totals"]["buried"] == 1  # the old burial is outside the window
    g = data["graveyard"]
    assert (
        g["count"] == 2 and g["oldest_ms"] == old.buried_ms and g["oldest_at"] == iso(old.buried_ms)
    )
    assert g["oldest_age_s"] >= 3600
    assert {q["queue"]: (q["count"], q["oldest_ms"]) for q in g["queues"]} == {
        "orders": (1, old.buried_ms),
        "billing": (1, new.buried_ms),
    }
    assert data["parked"]["count"] == 1 and data["parked"]["due_now"] == 0
    assert data["history_length"] == 5 and data["malformed_counters"] == []
    runtime.redis.hset(f"{runtime.keys.counter_prefix}{now_ms() // 60000}", "garbage", "x")
    bad = run_json(app, "stats")["malformed_counters"]
    assert [b["field"] for b in bad] == ["garbage"]


def test_purge_asks_writes_history_and_filters(uid: str, key_prefix: str) -> None:
    app = make_app(uid)
    runtime = get_runtime(app)
    obits = [celery_obituary(i) for i in range(2)]
    other = celery_obituary(5)
    other.cause, other.id = "other", "other-ob"
    Graveyard(runtime.redis, runtime.keys).write_many(
        [(ob, buried_event(ob)) for ob in [*obits, other]]
    )
    declined = run(app, "purge", "--cause", "charge-declined", input="n\n")
    assert declined.exit_code == 1 and "Purge 2 obituaries?" in declined.stderr
    assert obituaries.count(runtime) == 3
    dry = run_json(app, "purge", "--cause", "charge-declined", "--dry-run")
    assert dry == {
        "dry_run": True,
        "targets": 2,
        "purged": ["celery-ob-0", "celery-ob-1"],
        "missing": [],
    }
    accepted = run(app, "purge", "--cause", "charge-declined", "--keep-whole", input="y\n")
    assert accepted.exit_code == 0 and "purged 2 of 2" in accepted.stdout
    assert [ob.id for ob in obituaries.list_obituaries(runtime)] == ["other-ob"]
    purged = [f for _, f in runtime.history.read() if f["fate"] == PURGED]
    assert sorted(f["message_id"] for f in purged) == ["task-0", "task-1"]
    assert json.loads(purged[0]["obituary"])["traceback"] == TRACEBACK
    gone = run_json(app, "purge", "-y", "other-ob", "celery-ob-0", code=5)
    assert gone == {
        "dry_run": False,
        "targets": 2,
        "purged": ["other-ob"],
        "missing": ["celery-ob-0"],
    }
    nothing = run(app, "purge", "--yes")
    assert nothing.exit_code == 2 and "--all" in nothing.stderr  # usage error (docs/cli.md)


def test_list_table_fits_the_terminal(shop: dict[str, Any]) -> None:
    wide = run(shop["app"], "list", columns=400).stdout.splitlines()
    assert max(len(line) for line in wide) > 120  # the previews alone are wider
    lines = run(shop["app"], "list", columns=120).stdout.splitlines()
    assert all(len(line) <= 120 for line in lines), lines
    assert [line.split()[0] for line in lines[1:-1]] == [line.split()[0] for line in wide[1:-1]]
    assert any(line.endswith("…") for line in lines[1:-1])


def test_parked_purge_deletes_one_retry_and_keeps_it_in_the_history(
    uid: str, key_prefix: str
) -> None:
    from celery_dlx.store.history import History

    app = make_app(uid)
    runtime = get_runtime(app)
    now = now_ms()
    for i in range(2):
        runtime.park(
            ParkedMessage(
                message_id=f"p-{i}", attempt=1, queue="orders", body=b'{"order": 7}',
                due_ms=now + 60_000, parked_ms=now, task="shop.charge", cause="c",
            )
        )  # fmt: skip
    report = run_json(app, "parked", "--purge", "p-0:1", "--purge", "nope:1", "--yes", code=3)
    assert report == {"purged": ["p-0:1"], "missing": ["nope:1"]}
    assert [m["entry_id"] for m in run_json(app, "parked")["messages"]] == ["p-1:1"]
    [entry] = [f for _, f in History(runtime.redis, runtime.keys).read() if f["fate"] == "purged"]
    assert entry["message_id"] == "p-0" and entry["queue"] == "orders"
    kept = json.loads(entry["obituary"])
    assert kept["task"] == "shop.charge" and kept["body_b64"] == "eyJvcmRlciI6IDd9"
