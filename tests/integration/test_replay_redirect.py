"""``celery dlx replay --to-queue`` on the real services, in a virtual host of its own: a buried
Celery task replayed to another queue runs on a worker that consumes only that queue (its retry
stays there too); a filtered group replay redirected; the ledger and history entries; a copy's
headers; a missing target queue refused with nothing published or recorded.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kombu import Connection, Queue

from celery_dlx import replay
from celery_dlx.errors import DLXError
from celery_dlx.fates import RECOVERED, REPLAYED, REQUEUED
from celery_dlx.message.names import ATTEMPT_HEADER, QUEUE_HEADER, REPLAYED_HEADER
from celery_dlx.message.outgoing import PUBLISH_SEQ_HEADER
from celery_dlx.ops import obituaries
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.cli_helpers import run, run_json
from tests.integration.dlx_apps import make_app, worker
from tests.integration.helpers import queue_depth, wait_until
from tests.web.helpers import bury, task_obituary

CAUSE = "backend-down"
#: The order whose first run on the new queue fails (a transient error: requeued).
FLAKY = 2


@pytest.fixture
def shop(uid: str, key_prefix: str, vhost: str) -> Iterator[dict[str, Any]]:
    """A DLX app on its own virtual host with two DLX queues: ``old`` (the default, where the
    messages died, no consumer) and ``new``. Its task records the queue each run came from."""
    old, new = f"work-{uid}", f"new-{uid}"
    app = make_app(uid, broker_url=vhost, task_queues=[Queue(old), Queue(new)])
    runtime = get_runtime(app)
    ran, done = f"{{{key_prefix}}}:ran", f"{{{key_prefix}}}:done"

    @app.task(bind=True, name=f"ship-{uid}")
    def ship(self: Any, order: int) -> None:
        queue = (self.request.delivery_info or {}).get("routing_key")
        runs = runtime.redis.rpush(f"{ran}:{order}", str(queue))
        if order == FLAKY and runs == 1:
            raise ConnectionError("the carrier hung up")
        runtime.redis.rpush(done, f"{order}:{queue}")

    conn = Connection(vhost)
    channel = conn.channel()
    for name in (old, new):
        app.amqp.queues[name](channel).declare()
    try:
        yield {
            "app": app,
            "runtime": runtime,
            "task": ship,
            "old": old,
            "new": new,
            "ran": ran,
            "done": done,
            "channel": channel,
        }
    finally:
        runtime.reset_publisher()
        conn.release()


def history(runtime: Any, fate: str) -> list[dict[str, str]]:
    return [f for _, f in runtime.history.read() if f["fate"] == fate]


def test_redirected_replays_run_on_a_worker_of_only_the_new_queue(shop: dict[str, Any]) -> None:
    app, runtime, old, new = shop["app"], shop["runtime"], shop["old"], shop["new"]
    name = shop["task"].name
    obits = [task_obituary(app, name, i) for i in range(4)]
    other = task_obituary(app, name, 9, cause="another-cause")
    bury(runtime, [*obits, other])
    ids = [ob.id for ob in obits]
    assert {ob.queue for ob in obits} == {old}

    with worker(app, queues=[new]):
        first = run_json(app, "replay", ids[0], "--to-queue", new, "--canary")
        assert first["replayed"] == [ids[0]] and first["to_queue"] == new
        assert first["from_queues"] == {old: 1}
        assert first["canary"]["outcome"] == "recovered" and first["canary"]["queue"] == new

        group = run_json(app, "replay", "--group", CAUSE, "--to-queue", new, "--rate", "20")
        assert group["targets"] == 4 and group["replayed"] == ids[1:]
        assert [s["id"] for s in group["skipped"]] == [ids[0]]  # the ledger: replayed once
        assert group["to_queue"] == new and group["from_queues"] == {old: 3}
        assert group["failed"] == group["missing"] == []
        wait_until(
            lambda: runtime.redis.llen(shop["done"]) == 4,
            timeout=60,
            what="4 runs on the new queue",
        )
    done = sorted(x.decode() for x in runtime.redis.lrange(shop["done"], 0, -1))
    assert done == [f"{i}:{new}" for i in range(4)]
    # The flaky one failed once on the new queue and its requeued copy came back there.
    runs = [x.decode() for x in runtime.redis.lrange(f"{shop['ran']}:{FLAKY}", 0, -1)]
    assert runs == [new, new]
    flaky_id = obits[FLAKY].message_id
    requeued = [f for f in history(runtime, REQUEUED) if f["message_id"] == flaky_id]
    assert [f["queue"] for f in requeued] == [new]
    wait_until(
        lambda: (
            {f["message_id"] for f in history(runtime, RECOVERED)}
            >= {ob.message_id for ob in obits}
        ),
        timeout=30,
        what="4 recoveries",
    )
    assert queue_depth(shop["channel"], old) == 0  # nothing went back where it died
    assert queue_depth(shop["channel"], new) == 0

    # The ledger keeps each replay's queue; the history's replayed entries say from and to.
    redirects = runtime.graveyard.redirects([*ids, other.id])
    for ob, seen in zip(obits, redirects, strict=False):
        assert list(seen.values()) == [new]
        assert list(seen) == obituaries.get_obituary(runtime, ob.id).replays  # type: ignore[union-attr]
    assert redirects[-1] == {}
    assert obituaries.get_obituary(runtime, other.id).replays == []  # type: ignore[union-attr]
    replayed = {f["message_id"]: f for f in history(runtime, REPLAYED)}
    assert set(replayed) == {ob.message_id for ob in obits}
    for ob in obits:
        entry = replayed[ob.message_id]
        assert entry["queue"] == old
        assert entry["reason"] == f"replayed from obituary {ob.id} to queue {new} (died in {old})"
    shown = run(app, "replay", ids[0], "--to-queue", new, "--force", "--dry-run")
    assert shown.exit_code == 0 and f"would replay 1 of 1 to queue {new} (1 from {old})" in (
        shown.stdout
    )


def test_a_redirected_copy_carries_the_new_queue_and_the_same_headers(
    shop: dict[str, Any], uid: str
) -> None:
    app, runtime, old = shop["app"], shop["runtime"], shop["old"]
    plain = f"plain-{uid}"
    channel = shop["channel"]
    channel.queue_declare(plain, durable=True, auto_delete=False)
    ob = task_obituary(app, shop["task"].name, 1)
    ob.headers = {
        **ob.headers,
        ATTEMPT_HEADER: 4,
        QUEUE_HEADER: old,
        "x-tenant": "acme",
        "x-priority-class": 3,
        "x-death": [{"count": 1, "queue": old, "reason": "rejected"}],
    }
    fresh = task_obituary(app, shop["task"].name, 2)
    bury(runtime, [ob, fresh])

    # the same obituary replayed to where it died, then redirected, both keeping attempts
    run_json(app, "replay", ob.id, "--keep-attempts")
    moved = run_json(app, "replay", ob.id, "--keep-attempts", "--force", "--to-queue", plain)
    assert moved["replayed"] == [ob.id]
    home, there = channel.basic_get(old, no_ack=True), channel.basic_get(plain, no_ack=True)
    assert there.delivery_info["exchange"] == "" and there.delivery_info["routing_key"] == plain
    assert there.body == home.body

    def props(message: Any) -> dict[str, Any]:
        return {k: v for k, v in message.properties.items() if k != "application_headers"}

    assert props(there) == props(home)
    assert there.headers[QUEUE_HEADER] == plain and home.headers[QUEUE_HEADER] == old
    assert there.headers[ATTEMPT_HEADER] == 4 and there.headers[REPLAYED_HEADER] == ob.id

    def rest(headers: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in headers.items() if k not in {QUEUE_HEADER, PUBLISH_SEQ_HEADER}}

    assert rest(there.headers) == rest(home.headers)
    assert there.headers["x-tenant"] == "acme" and there.headers["x-priority-class"] == 3
    assert not any(k.startswith("x-death") for k in there.headers)

    # a fresh budget: no attempt headers, and the queue header names the new queue
    replay(runtime, [fresh.id], to_queue=plain)
    copy = channel.basic_get(plain, no_ack=True)
    assert copy.headers["id"] == fresh.message_id and copy.headers[QUEUE_HEADER] == plain
    assert ATTEMPT_HEADER not in copy.headers


def test_a_missing_target_queue_is_refused_and_nothing_is_lost(
    shop: dict[str, Any], uid: str
) -> None:
    app, runtime, old = shop["app"], shop["runtime"], shop["old"]
    obits = [task_obituary(app, shop["task"].name, i) for i in range(2)]
    bury(runtime, obits)
    nowhere = f"nowhere-{uuid.uuid4().hex[:6]}"

    for extra in ((), ("--canary",), ("--dry-run",)):
        refused = run(app, "replay", "--group", CAUSE, "--to-queue", nowhere, *extra)
        assert refused.exit_code == 1, (refused.stdout, refused.stderr)
        assert f"queue {nowhere!r} does not exist" in refused.stderr
        assert "NOT_FOUND" in refused.stderr and "declare it first" in refused.stderr
    with pytest.raises(DLXError, match="does not exist"):
        replay(runtime, [obits[0].id], to_queue=nowhere)
    with pytest.raises(DLXError, match="needs a queue name"):
        replay(runtime, [obits[0].id], to_queue=" ")

    for ob in obits:  # still in the graveyard, never replayed, nothing published anywhere
        assert obituaries.get_obituary(runtime, ob.id).replays == []  # type: ignore[union-attr]
    assert history(runtime, REPLAYED) == []
    assert runtime.graveyard.redirects([ob.id for ob in obits]) == [{}, {}]
    assert queue_depth(shop["channel"], old) == 0
    # the broker did not create the queue either (a passive declare)
    with pytest.raises(Exception, match="NOT_FOUND"):
        Connection(app.conf.broker_url).channel().queue_declare(nowhere, passive=True)
