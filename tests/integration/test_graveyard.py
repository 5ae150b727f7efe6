"""The graveyard on real Redis (RabbitMQ for replays): listing, groups, replay, purge, retention."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Queue

from celery_dlx.errors import DLXError
from celery_dlx.fates import ARCHIVED, BURIED, PURGED, REPLAYED
from celery_dlx.message.names import ATTEMPT_HEADER, PARKS_HEADER, REPLAYED_HEADER, Keys
from celery_dlx.message.obituary import Attempt, Obituary, payload_from_json_safe
from celery_dlx.ops import obituaries, purge
from celery_dlx.ops import replay as replaying
from celery_dlx.service.settle import buried_event
from celery_dlx.store.client import run_script_many
from celery_dlx.store.graveyard import Graveyard
from celery_dlx.wiring.retention import sweep_retention
from celery_dlx.wiring.runtime import Runtime, get_runtime

BROKER_URL = os.environ.get("DLX_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("DLX_TEST_REDIS", "redis://127.0.0.1:6379/0")


#: Tests run with the graveyard sharded by queue too (``dlx_redis_shards``), not just the default.
BOTH_LAYOUTS = pytest.mark.parametrize("runtime", ["none", "queue"], indirect=True)


@pytest.fixture
def runtime(request: pytest.FixtureRequest, uid: str, key_prefix: str) -> Iterator[Runtime]:
    app = Celery(f"gy-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(
        dlx_key_prefix=key_prefix,
        dlx_redis_url=REDIS_URL,
        dlx_graveyard_retention=3600,
        dlx_redis_shards=getattr(request, "param", "none"),
    )
    rt = get_runtime(app)
    yield rt
    rt.reset_publisher()
    for key in rt.redis.scan_iter(match="{" + key_prefix + ":*", count=1000):
        rt.redis.delete(key)  # the sharded layout's keys ({prefix:q:QUEUE:BUCKET}...)


def make(
    n: int,
    *,
    queue: str = "billing",
    task: str | None = None,
    cause: str = "c1",
    buried_ms: int | None = None,
    payload: bytes = b"{}",
    **extra: Any,
) -> Obituary:
    at = buried_ms if buried_ms is not None else 1_700_000_000_000 + n
    return Obituary.from_fields(
        id=f"ob-{n}",
        message_id=f"m-{n}",
        queue=queue,
        reason="retry budget spent",
        buried_ms=at,
        task=task,
        cause=cause,
        exc_type="ValueError",
        exc_message=f"bad value {n}",
        attempt=3,
        attempts=[Attempt(at - 2, "parked", cause), Attempt(at, "buried", cause)],
        first_failure_ms=at - 2,
        last_failure_ms=at,
        headers={
            ATTEMPT_HEADER: 2,
            PARKS_HEADER: 2,
            "custom": "kept",
            "x-death": [{"queue": queue, "reason": "rejected", "count": 1}],
        },
        properties={"content_type": "application/json", "message_id": f"m-{n}"},
        payload=payload,
        payload_size=len(payload),
        **extra,
    )


def bury(rt: Runtime, *obits: Obituary) -> list[bool]:
    return rt.graveyard.write_many([(ob, buried_event(ob)) for ob in obits])


def history(rt: Runtime) -> list[dict[str, str]]:
    return [fields for _, fields in rt.history.read()]


@BOTH_LAYOUTS
def test_write_is_idempotent_and_records_one_burial(runtime: Runtime) -> None:
    ob = make(1)
    runtime.redis.set(runtime.keys.cause("m-1"), b"{}")
    assert bury(runtime, ob) == [True]
    assert bury(runtime, ob) == [False]
    rows = history(runtime)
    assert [(r["fate"], r["message_id"]) for r in rows] == [(BURIED, "m-1")]
    assert runtime.redis.exists(runtime.keys.cause("m-1")) == 0
    assert obituaries.count(runtime) == 1


def test_get_by_id_or_message_id_with_payload_bytes(runtime: Runtime) -> None:
    body = os.urandom(10 * 1024 * 1024)
    bury(runtime, make(1, payload=body))
    ob = obituaries.get_obituary(runtime, "ob-1")
    assert ob is not None and ob.payload == body and ob.payload_size == len(body)
    assert ob.headers["custom"] == "kept"
    by_message = obituaries.get_obituary(runtime, "m-1", with_payload=False)
    assert by_message is not None and by_message.id == "ob-1" and by_message.payload is None
    assert obituaries.get_obituary(runtime, "nope") is None


@BOTH_LAYOUTS
def test_list_by_time_queue_task_cause_and_bounds(runtime: Runtime) -> None:
    bury(
        runtime,
        make(1, queue="billing", cause="c1"),
        make(2, queue="billing", cause="c2", task="proj.charge"),
        make(3, queue="audit", cause="c1"),
        make(4, queue="audit", cause="c2", task="proj.charge"),
    )

    def ids(**kw: Any) -> list[str]:
        return [ob.id for ob in obituaries.list_obituaries(runtime, **kw)]

    assert ids() == ["ob-4", "ob-3", "ob-2", "ob-1"]
    assert ids(oldest_first=True, limit=2) == ["ob-1", "ob-2"]
    assert ids(queue="audit") == ["ob-4", "ob-3"]
    assert ids(task="proj.charge") == ["ob-4", "ob-2"]
    assert ids(cause="c1") == ["ob-3", "ob-1"]
    assert ids(cause="c2", queue="billing") == ["ob-2"]
    assert ids(message_id="m-3") == ["ob-3"]
    assert ids(since=1_700_000_000.002, until=1_700_000_000.003) == ["ob-3", "ob-2"]
    assert [ob.payload for ob in obituaries.list_obituaries(runtime, limit=1)] == [None]
    assert obituaries.queues(runtime) == [
        ("audit", 2, 1_700_000_000_004),
        ("billing", 2, 1_700_000_000_002),
    ]


@BOTH_LAYOUTS
def test_post_filtered_listing_pages_through_large_indexes(runtime: Runtime) -> None:
    obits = [make(i, queue="billing" if i % 10 else "audit", cause="c") for i in range(350)]
    bury(runtime, *obits)
    found = obituaries.list_obituaries(runtime, cause="c", queue="audit", limit=None)
    assert [ob.id for ob in found] == [f"ob-{i}" for i in range(340, -1, -10)]


def test_groups_summarise_causes_still_in_the_graveyard(runtime: Runtime) -> None:
    bury(runtime, make(1, cause="c1"), make(2, cause="c1"), make(3, cause="c2", queue="audit"))
    groups = {g.cause: g for g in obituaries.groups(runtime)}
    assert set(groups) == {"c1", "c2"}
    c1 = groups["c1"]
    assert (c1.count, c1.total, c1.first_ms, c1.last_ms, c1.example_id) == (
        2,
        2,
        1_700_000_000_001,
        1_700_000_000_002,
        "ob-2",
    )
    assert (c1.exc_type, c1.exc_message, c1.queue) == ("ValueError", "bad value 2", "billing")
    assert [g.cause for g in obituaries.groups(runtime)] == ["c2", "c1"]
    purge.purge(runtime, ["ob-3"])
    assert [g.cause for g in obituaries.groups(runtime)] == ["c1"]
    purge.purge(runtime, ["ob-2"])
    (c1,) = obituaries.groups(runtime)
    assert (c1.count, c1.total, c1.example_id) == (1, 2, "ob-1")


@BOTH_LAYOUTS
def test_purge_records_the_obituary_in_the_history_whole_when_asked(
    runtime: Runtime,
) -> None:
    bury(runtime, make(1, payload=b"\x00\xffraw"), make(2), make(3, queue="audit"))
    with pytest.raises(DLXError, match="needs obituary ids or a filter"):
        purge.purge(runtime)
    dry = purge.purge(runtime, queue="billing", dry_run=True)
    assert dry.purged == ["ob-1", "ob-2"] and obituaries.count(runtime) == 3
    report = purge.purge(runtime, ["ob-1", "missing"], keep_whole=True)
    assert (report.purged, report.missing) == (["ob-1"], ["missing"])
    purged = [r for r in history(runtime) if r["fate"] == PURGED]
    assert len(purged) == 1
    kept = json.loads(purged[0]["obituary"])
    assert kept["id"] == "ob-1" and payload_from_json_safe(kept) == b"\x00\xffraw"
    assert obituaries.get_obituary(runtime, "ob-1") is None
    assert obituaries.list_obituaries(runtime, message_id="m-1") == []
    assert purge.purge(runtime, everything=True).purged == ["ob-2", "ob-3"]
    assert obituaries.count(runtime) == 0 and obituaries.queues(runtime) == []
    # By default the history keeps the obituary's summary: no traceback, headers or payload.
    summary = json.loads([r for r in history(runtime) if r["fate"] == PURGED][1]["obituary"])
    assert summary == make(2).leaving_note()
    assert "traceback" not in summary and "payload" not in summary and "headers" not in summary


@BOTH_LAYOUTS
def test_retention_moves_old_obituaries_to_the_history(runtime: Runtime) -> None:
    now = 1_700_000_000_000 + 7200 * 1000
    bury(
        runtime,
        make(1, buried_ms=now - 7200 * 1000),
        make(2, buried_ms=now - 3601 * 1000),
        make(3, buried_ms=now - 10),
    )
    assert sweep_retention(runtime, now=now) == 2
    assert sweep_retention(runtime, now=now) == 0
    assert [ob.id for ob in obituaries.list_obituaries(runtime)] == ["ob-3"]
    archived = [r for r in history(runtime) if r["fate"] == ARCHIVED]
    assert sorted(json.loads(r["obituary"])["id"] for r in archived) == ["ob-1", "ob-2"]
    assert all("dlx_graveyard_retention" in r["reason"] for r in archived)


@pytest.fixture
def work_queue(uid: str, broker: Any, cleanup_queues: list[str]) -> str:
    name = f"replay-{uid}"
    Queue(name, durable=False)(broker.channel()).declare()
    cleanup_queues.append(name)
    return name


def take_all(broker: Any, queue: str) -> list[Any]:
    channel = broker.channel()
    out = []
    while (msg := channel.basic_get(queue, no_ack=True)) is not None:
        out.append(msg)
    channel.close()
    return out


def test_replay_publishes_to_the_queue_once_with_a_fresh_budget(
    runtime: Runtime, broker: Any, work_queue: str
) -> None:
    bury(runtime, make(1, queue=work_queue, payload=b'{"a": 1}'), make(2, queue=work_queue))
    dry = replaying.replay(runtime, ["ob-1"], dry_run=True)
    assert dry.replayed == ["ob-1"] and take_all(broker, work_queue) == []
    report = replaying.replay(runtime, ["ob-1"])
    assert report.replayed == ["ob-1"]
    (msg,) = take_all(broker, work_queue)
    assert msg.body == b'{"a": 1}'
    headers = msg.headers
    assert headers[REPLAYED_HEADER] == "ob-1" and headers["custom"] == "kept"
    assert ATTEMPT_HEADER not in headers and PARKS_HEADER not in headers
    assert not any(k.startswith("x-death") for k in headers)
    assert msg.properties["message_id"] == "m-1"
    again = replaying.replay(runtime, ["ob-1"])
    assert again.replayed == [] and again.skipped[0][0] == "ob-1"
    assert take_all(broker, work_queue) == []
    forced = replaying.replay(runtime, ["ob-1"], force=True, keep_attempts=True)
    assert forced.replayed == ["ob-1"]
    (kept,) = take_all(broker, work_queue)
    assert kept.headers[ATTEMPT_HEADER] == 2
    ob = obituaries.get_obituary(runtime, "ob-1")
    assert ob is not None and len(ob.replays) == 2
    replayed = [r for r in history(runtime) if r["fate"] == REPLAYED]
    assert [(r["message_id"], r["attempt"]) for r in replayed] == [("m-1", "0"), ("m-1", "3")]


def test_replay_by_group_with_a_rate_and_a_missing_queue(
    runtime: Runtime, broker: Any, work_queue: str, uid: str
) -> None:
    bury(
        runtime,
        *(make(i, queue=work_queue, cause="grp") for i in range(5)),
        make(9, queue=f"gone-{uid}", cause="grp"),
        make(10, queue=work_queue, cause="other"),
    )
    seen: list[int] = []
    report = replaying.replay(runtime, cause="grp", rate=50, progress=seen.append)
    assert sorted(report.replayed) == [f"ob-{i}" for i in range(5)]
    assert [oid for oid, _ in report.failed] == ["ob-9"]
    assert sum(seen) == 6
    assert len(take_all(broker, work_queue)) == 5
    with pytest.raises(DLXError, match="rate"):
        replaying.replay(runtime, ["ob-10"], rate=0)


def test_text_outside_ascii_survives_the_write_script(runtime: Runtime) -> None:
    ob = make(1, queue="facturación", task="proj.tâche", cause="c☕")
    ob.exc_message = 'naïve "quoted" ☕ \\ \x00 end'
    ob.reason = "budget spent ☕"
    bury(runtime, ob)
    (group,) = obituaries.groups(runtime)
    assert (group.cause, group.queue, group.task, group.exc_message) == (
        "c☕",
        "facturación",
        "proj.tâche",
        ob.exc_message,
    )
    (row,) = history(runtime)
    assert (row["queue"], row["task"], row["reason"]) == ("facturación", "proj.tâche", ob.reason)
    assert [o.id for o in obituaries.list_obituaries(runtime, queue="facturación")] == ["ob-1"]


def _contents(client: Any, prefix: str) -> dict[str, Any]:
    """Every key under ``prefix`` (named without it) with what it holds (stream entry ids left
    out: they are times)."""
    out: dict[str, Any] = {}
    for raw in client.scan_iter(match="{" + prefix + "}*", count=1000):
        key = raw.decode()
        kind = client.type(key).decode()
        if kind == "hash":
            value: Any = client.hgetall(key)
        elif kind == "zset":
            value = client.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = [fields for _, fields in client.xrange(key)]
        else:
            value = client.dump(key)
        out[key.replace(prefix, "<prefix>", 1)] = (kind, value)
    return out


def test_a_batch_is_written_by_one_script_call_as_one_call_each_would_write_it(
    runtime: Runtime, key_prefix: str
) -> None:
    """The batched write (one command for the batch) leaves Redis as one script call per
    obituary did: indexes, groups, versions, history, the worker's cause records deleted; an
    obituary written before, or earlier in the batch, is left alone."""
    obits = [
        make(1),
        make(2, queue="mail", task="send", cause="c2"),
        make(3, cause="c2", code_version="v2"),
        make(1),  # again in the same batch
        make(4, queue="mail", task="caf\u00e9 \u4e2d"),
    ]
    items = [(ob, buried_event(ob)) for ob in obits]
    before = [(make(3), buried_event(make(3)))]
    other = f"{key_prefix}-one-each"
    client = runtime.redis
    try:
        for prefix in (key_prefix, other):
            client.set(Keys(prefix).cause("m-2"), b"{}")
        assert runtime.graveyard.write_many(before) == [True]
        assert runtime.graveyard.write_many(items) == [True, True, False, False, True]
        yard = Graveyard(client, Keys(other)).shards.home
        assert run_script_many(client, yard.scripts.write, yard.write_calls(before)) == [1]
        replies = run_script_many(client, yard.scripts.write, yard.write_calls(items))
        assert [bool(r) for r in replies] == [True, True, False, False, True]
        assert client.exists(Keys(key_prefix).cause("m-2")) == 0
        assert _contents(client, other) == _contents(client, key_prefix)
    finally:
        for raw in client.scan_iter(match="{" + other + "*", count=1000):
            client.delete(raw)
