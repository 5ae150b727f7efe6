"""``celery dlx replay`` on the real services: a canary against a consumer fixed halfway, the rate,
the ledger, ``--force``, ``--keep-attempts``, ``--dry-run``, and what a replayed message carries.

Obituaries hold real Celery task messages (protocol 2, JSON) of a DLX task; the worker is a real
Celery worker whose task fails until a Redis flag says the cause is fixed.
"""

from __future__ import annotations

import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu.serialization import dumps

from celery_dlx.fates import RECOVERED, REPLAYED, now_ms
from celery_dlx.message.names import ATTEMPT_HEADER, PARKS_HEADER, REPLAYED_HEADER
from celery_dlx.message.obituary import ORIGIN_FOREIGN, Attempt, Obituary
from celery_dlx.ops import obituaries
from celery_dlx.service.settle import buried_event
from celery_dlx.store.graveyard import Graveyard
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.integration.cli_helpers import run_json
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import wait_until

CAUSE = "backend-down"


@pytest.fixture
def shop(uid: str, key_prefix: str, cleanup_queues: list[str]) -> Iterator[dict[str, Any]]:
    """A DLX app whose task ``flaky`` fails until ``fixed`` is set in Redis."""
    app = make_app(uid)
    runtime = get_runtime(app)
    fixed_key, done_key = f"{{{key_prefix}}}:fixed", f"{{{key_prefix}}}:done"

    @app.task(name=f"flaky-{uid}")
    def flaky(order: int) -> None:
        if not runtime.redis.get(fixed_key):
            raise RuntimeError("payment backend down")
        runtime.redis.rpush(done_key, order)

    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:{app.conf.dlx_exchange}")
    yield {"app": app, "runtime": runtime, "task": flaky, "fixed": fixed_key, "done": done_key}
    runtime.reset_publisher()


def task_obituary(app: Celery, task_name: str, order: int, *, queue: str | None = None) -> Obituary:
    """An obituary holding a real Celery message of ``task_name(order)``, buried after 4 runs."""
    task_id = str(uuid.uuid4())
    message = app.amqp.as_task_v2(task_id, task_name, args=(order,))
    content_type, encoding, body = dumps(message.body, serializer="json")
    at = now_ms() - 10_000 + order
    return Obituary.from_fields(
        id=f"ob-{order}-{task_id[:8]}",
        message_id=task_id,
        queue=queue or app.conf.task_default_queue,
        reason="retry budget spent: 2 requeues, 2 parks",
        buried_ms=at,
        task=task_name,
        origin="celery",
        cause=CAUSE,
        exc_type="RuntimeError",
        exc_message="payment backend down",
        attempt=5,
        attempts=[Attempt(at, "buried", CAUSE)],
        headers={**message.headers, ATTEMPT_HEADER: 4, PARKS_HEADER: 2, "x-death": [{"count": 1}]},
        properties={
            "content_type": content_type,
            "content_encoding": encoding,
            "correlation_id": task_id,
        },
        payload=body if isinstance(body, bytes) else body.encode(),
        payload_size=len(body),
    )


def bury(runtime: Runtime, obits: list[Obituary]) -> None:
    Graveyard(runtime.redis, runtime.keys).write_many([(ob, buried_event(ob)) for ob in obits])


def fates(runtime: Runtime, message_id: str) -> list[tuple[str, str]]:
    """``(fate, attempt)`` of one message's history entries, in stream order."""
    return [
        (f["fate"], f["attempt"])
        for _, f in runtime.history.read()
        if f["message_id"] == message_id and f["fate"] != "buried"
    ]


def test_canary_stops_while_broken_then_replays_at_the_rate_once_fixed(
    shop: dict[str, Any],
) -> None:
    app, runtime = shop["app"], shop["runtime"]
    obits = [task_obituary(app, shop["task"].name, i) for i in range(6)]
    bury(runtime, obits)
    ids = [ob.id for ob in obits]  # oldest first, as replay takes them
    with worker(app):
        broken = run_json(app, "replay", "--group", CAUSE, "--canary", "--rate", "5", code=6)
        assert broken["targets"] == 6 and broken["replayed"] == [ids[0]], broken
        assert broken["stopped"] is True and broken["not_replayed"] == ids[1:]
        assert broken["failed"] == broken["skipped"] == broken["missing"] == []
        canary = broken["canary"]
        assert canary["obituary_id"] == ids[0] and canary["message_id"] == obits[0].message_id
        assert canary["queue"] == app.conf.task_default_queue
        assert canary["outcome"] == "failed" and canary["fate"] == "requeued"
        assert canary["succeeded"] is False and "failed again (requeued)" in canary["detail"]
        everything = run_json(app, "list", "--status", "all")["obituaries"]
        ledger = {r["id"]: r["replays"] for r in everything}
        assert bool(ledger[ids[0]]) and not any(ledger[i] for i in ids[1:])

        runtime.redis.set(shop["fixed"], 1)  # the cause is fixed halfway
        fixed = run_json(app, "replay", "--group", CAUSE, "--canary", "--rate", "4")
        assert [s["id"] for s in fixed["skipped"]] == [ids[0]]
        assert "already replayed" in fixed["skipped"][0]["reason"]
        # an ISO time and the real flag, not epoch milliseconds and "use force"
        assert re.fullmatch(
            r"already replayed at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z \(--force replays it again\)",
            fixed["skipped"][0]["reason"],
        ), fixed["skipped"][0]["reason"]
        assert fixed["canary"]["obituary_id"] == ids[1]
        assert fixed["canary"]["outcome"] == "recovered" and fixed["canary"]["fate"] == RECOVERED
        assert fixed["replayed"] == ids[1:] and fixed["stopped"] is False
        assert fixed["not_replayed"] == [] and fixed["failed"] == []
        wait_until(
            lambda: {int(x) for x in runtime.redis.lrange(shop["done"], 0, -1)} >= {1, 2, 3, 4, 5},
            timeout=60,
            what="the five replayed messages to run",
        )
        for ob in obits[1:]:
            wait_until(lambda ob=ob: (RECOVERED, "0") in fates(runtime, ob.message_id), timeout=30)
            # Attempts were reset: the replay and the recovery both say attempt 0 (the worker
            # may record the recovery before the replay is recorded: compare unordered).
            assert sorted(fates(runtime, ob.message_id)) == [(RECOVERED, "0"), (REPLAYED, "0")]
    replayed_at = sorted(
        int(f["at_ms"])
        for _, f in runtime.history.read()
        if f["fate"] == REPLAYED and f["message_id"] in {ob.message_id for ob in obits[2:]}
    )
    # --rate 4 spaces the four replays after the canary at least 0.25 s apart (a lower bound:
    # a slow machine only widens it).
    assert replayed_at[-1] - replayed_at[0] >= 3 * 250 - 50


def test_replay_copy_goes_to_its_queue_through_the_default_exchange(
    shop: dict[str, Any], uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    app, runtime = shop["app"], shop["runtime"]
    plain = f"plain-{uid}"
    cleanup_queues.append(plain)
    channel = broker.channel()
    channel.queue_declare(plain, durable=True, auto_delete=False)
    first, second = (task_obituary(app, shop["task"].name, i, queue=plain) for i in range(2))
    bury(runtime, [first, second])

    dry = run_json(app, "replay", first.id, "--dry-run")
    assert dry["dry_run"] is True and dry["would_replay"] == [first.id] and dry["replayed"] == []
    assert channel.queue_declare(plain, passive=True).message_count == 0
    assert obituaries.get_obituary(runtime, first.id).replays == []  # type: ignore[union-attr]

    reset = run_json(app, "replay", first.id)
    kept = run_json(app, "replay", second.id, "--keep-attempts")
    assert reset["replayed"] == [first.id] and kept["replayed"] == [second.id]
    assert reset["would_replay"] == [] and reset["dry_run"] is False
    got = [channel.basic_get(plain, no_ack=True) for _ in range(2)]
    by_id = {m.headers["id"]: m for m in got}
    fresh, same = by_id[first.message_id], by_id[second.message_id]
    assert fresh.delivery_info["exchange"] == "" and fresh.delivery_info["routing_key"] == plain
    body = fresh.body.encode() if isinstance(fresh.body, str) else fresh.body  # utf-8: text
    assert body == first.payload and fresh.headers[REPLAYED_HEADER] == first.id
    assert ATTEMPT_HEADER not in fresh.headers and PARKS_HEADER not in fresh.headers
    assert not any(k.startswith("x-death") for k in fresh.headers)
    assert fresh.properties["correlation_id"] == first.message_id
    assert same.headers[ATTEMPT_HEADER] == 4 and same.headers[REPLAYED_HEADER] == second.id

    again = run_json(app, "replay", first.id)
    assert again["replayed"] == [] and [s["id"] for s in again["skipped"]] == [first.id]
    forced = run_json(app, "replay", first.id, "--force")
    assert forced["replayed"] == [first.id]
    assert len(obituaries.get_obituary(runtime, first.id).replays) == 2  # type: ignore[union-attr]

    missing = run_json(app, "replay", "no-such-obituary", code=5)
    assert missing["missing"] == ["no-such-obituary"] and missing["replayed"] == []
    gone = task_obituary(app, shop["task"].name, 7, queue=f"deleted-{uid}")
    bury(runtime, [gone])
    refused = run_json(app, "replay", gone.id, code=5)
    assert refused["failed"][0]["id"] == gone.id and "refused" in refused["failed"][0]["reason"]
    assert obituaries.get_obituary(runtime, gone.id).replays == []  # type: ignore[union-attr]


def test_canary_times_out_without_a_consumer(
    shop: dict[str, Any], uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    app, runtime = shop["app"], shop["runtime"]
    idle = f"idle-{uid}"
    cleanup_queues.append(idle)
    broker.channel().queue_declare(idle, durable=True, auto_delete=False)
    obits = [task_obituary(app, shop["task"].name, i, queue=idle) for i in range(2)]
    bury(runtime, obits)
    data = run_json(app, "replay", "--queue", idle, "--canary", "--canary-timeout", "1s", code=6)
    assert data["canary"]["outcome"] == "timeout" and data["canary"]["fate"] is None
    assert data["not_replayed"] == [obits[1].id] and data["replayed"] == [obits[0].id]


def test_foreign_canary_is_consumed_when_its_queue_empties_without_a_failure(
    shop: dict[str, Any], uid: str, broker: Any, cleanup_queues: list[str]
) -> None:
    app, runtime = shop["app"], shop["runtime"]
    events = f"events-{uid}"
    cleanup_queues.append(events)
    broker.channel().queue_declare(events, durable=True, auto_delete=False)
    obits = []
    for i in range(3):
        ob = task_obituary(app, shop["task"].name, i, queue=events)
        ob.origin, ob.task, ob.headers = ORIGIN_FOREIGN, None, {"source": "go-service"}
        ob.properties = {"content_type": "application/octet-stream", "message_id": ob.message_id}
        obits.append(ob)
    bury(runtime, obits)
    taken: list[bytes] = []
    stop = threading.Event()

    def consumer() -> None:  # a foreign consumer that handles every message
        from kombu import Connection

        from tests.conftest import BROKER_URL

        with Connection(BROKER_URL) as conn:
            channel = conn.channel()
            while not stop.is_set():
                msg = channel.basic_get(events, no_ack=False)
                if msg is None:
                    stop.wait(0.05)
                    continue
                taken.append(msg.body)
                channel.basic_ack(msg.delivery_tag)

    thread = threading.Thread(target=consumer, daemon=True)
    thread.start()
    try:
        data = run_json(app, "replay", "--queue", events, "--canary", "--canary-settle", "0.5s")
        wait_until(lambda: len(taken) == 3, what="the consumer to take the three replays")
    finally:
        stop.set()
        thread.join(10)
    assert data["canary"]["outcome"] == "consumed" and data["canary"]["succeeded"] is True
    assert data["canary"]["obituary_id"] == obits[0].id and data["canary"]["fate"] is None
    assert data["replayed"] == [ob.id for ob in obits]
    assert sorted(taken) == sorted(ob.payload for ob in obits)
