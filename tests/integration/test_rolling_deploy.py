"""Rolling deploy: a queue migrated with ``dlx migrate QUEUE --policy`` is consumed at once by a
plain Celery worker of the same app (no ``install``, dlx off) and a celery_dlx worker.

Flaky messages fail their first run in the celery_dlx worker, which requeues a copy with its
``x-dlx-*`` headers; the copies the celery_dlx worker cannot hold (two processes, late acks, prefetch 2; its
copy runs wait until the plain worker ran one) are left for the plain worker, which runs them like
any task. A poison message queued behind the flaky ones is requeued by celery_dlx once, and its
copy (last in the queue) always reaches the plain worker, which fails it as plain Celery does
(acks_late off: logged, acked, FAILURE, gone; no obituary). Good messages and a second poison
message are published while both workers consume: the good ones are done by whichever worker gets
them, the poison one is either buried by celery_dlx or failed by the plain worker, as above.
Nothing is lost, nothing stays queued."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from celery_dlx.broker.management import Management
from celery_dlx.message.names import Keys
from celery_dlx.store.graveyard import Graveyard
from tests.integration.dropin_app import build
from tests.integration.dropin_worker import worker_process
from tests.integration.helpers import fates_of, queue_depth, wait_until
from tests.integration.test_migration_e2e import _migrate, api, names  # noqa: F401

pytestmark = pytest.mark.slow

FLAKY = 6
GOOD = 6
#: Copies the celery_dlx worker holds: ``-c 2``, prefetch multiplier 1 and celery_dlx's late acks,
#: so its two waiting copy runs; the other copies stay queued for the plain worker.
HELD = 2


def _key(key_prefix: str, name: str) -> str:
    return "{" + key_prefix + "}:test:" + name


def _runs(redis_client: Any, key_prefix: str) -> list[tuple[str, int, str]]:
    """Each run of ``dropin.flaky``: (worker kind, n, x-dlx-requeues as seen by the task)."""
    rows = redis_client.lrange(_key(key_prefix, "flaky-runs"), 0, -1)
    return [(k, int(n), r) for k, n, r in (row.decode().split(":") for row in rows)]


def _members(redis_client: Any, key_prefix: str, name: str) -> set[int]:
    return {int(n) for n in redis_client.smembers(_key(key_prefix, name))}


def test_plain_and_dlx_workers_share_a_migrated_queue(
    uid: str,
    key_prefix: str,
    keys: Keys,
    redis_client: Any,
    broker: Any,
    names: str,  # noqa: F811
    api: Management,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    queue = names
    channel = broker.channel()
    # the app's producer before celery_dlx creates the plain queue with the flaky messages
    plain_producer = build(uid, plain=True)
    for n in range(FLAKY):
        plain_producer.send_task("dropin.flaky", args=[n])
    # queued behind the flaky ones: its celery_dlx copy comes last, after every flaky copy
    early_poison = plain_producer.send_task("dropin.poison", args=[1]).id
    wait_until(lambda: queue_depth(channel, queue) == FLAKY + 1, what="the messages queued")
    _migrate(uid, queue, "--policy")
    assert (api.queue(queue) or {}).get("policy") == f"celery-dlx-{queue}"

    dlx_log, plain_log = tmp_path / "dlx.log", tmp_path / "plain.log"
    with worker_process(uid, dlx_log, "-Q", queue) as dlx_worker:
        # every first run fails in the celery_dlx worker; the copies queue behind the originals
        wait_until(
            lambda: (
                sorted(n for k, n, r in _runs(redis_client, key_prefix) if r == "None")
                == list(range(FLAKY))
            ),
            what="each flaky message failed once in the celery_dlx worker",
            timeout=120,
        )
        wait_until(
            lambda: "requeued" in fates_of(redis_client, keys, early_poison),
            what="the early poison message requeued by the celery_dlx worker",
        )
        wait_until(
            lambda: queue_depth(channel, queue) == FLAKY + 1 - HELD,
            what="the copies the celery_dlx worker cannot hold left in the queue",
            timeout=60,
        )
        with monkeypatch.context() as env:
            env.setenv("DLX_TEST_PLAIN", "1")
            plain = worker_process(uid, plain_log, "-Q", queue)
            plain_worker = plain.__enter__()
        try:
            producer = build(uid)
            for n in range(GOOD):
                producer.send_task("dropin.good", args=[n])
            poison = producer.send_task("dropin.poison", args=[0]).id
            failed_in_plain = f"dropin.poison[{poison}] raised unexpected: ValueError"

            def poison_settled() -> str:
                if "buried" in fates_of(redis_client, keys, poison):
                    return "buried"
                if failed_in_plain in plain_log.read_text(errors="replace"):
                    return "failed in the plain worker"
                return ""

            wait_until(
                lambda: (
                    _members(redis_client, key_prefix, "flaky-done") == set(range(FLAKY))
                    and _members(redis_client, key_prefix, "good") == set(range(GOOD))
                ),
                what="every flaky and good message done",
                timeout=180,
            )
            fate = wait_until(poison_settled, what="the poison message settled", timeout=180)
            assert dlx_worker.poll() is None, "the celery_dlx worker keeps running"
            assert plain_worker.poll() is None, "the plain worker keeps running"
            wait_until(lambda: queue_depth(channel, queue) == 0, what="an empty queue", timeout=60)
        finally:
            plain.__exit__(None, None, None)

    runs = _runs(redis_client, key_prefix)
    plain_copies = [(n, r) for k, n, r in runs if k == "plain"]
    # the plain worker got only copies (the originals were all run before it started): each
    # carries celery_dlx's requeue count and ran to success there
    assert len(plain_copies) >= FLAKY - HELD, runs
    assert all(r == "1" for _, r in plain_copies), runs
    # each flaky message failed exactly once and was done exactly once: nothing lost, no extra run
    assert sorted(n for _, n, r in runs if r == "None") == list(range(FLAKY)), runs
    assert sorted(n for _, n, r in runs if r != "None") == list(range(FLAKY)), runs
    plain_text = plain_log.read_text(errors="replace")
    for log in (plain_text, dlx_log.read_text(errors="replace")):
        assert "Unrecoverable error" not in log and "WorkerLostError" not in log, log[-3000:]
    assert "dropin.flaky" in plain_text and "succeeded" in plain_text
    graveyard = Graveyard(redis_client, keys).count()
    if fate == "buried":
        assert graveyard == 1 and failed_in_plain not in plain_text
    else:
        # plain Celery: the failure is logged, the message acked and gone; no obituary
        assert graveyard == 0 and fates_of(redis_client, keys, poison)[-1:] != ["buried"]
    # the early poison message's copy (x-dlx-requeues=1) reached the plain worker, which failed it
    # as plain Celery does: logged, acked, gone; celery_dlx did not see it again, no obituary
    assert f"dropin.poison[{early_poison}] raised unexpected: ValueError" in plain_text
    assert fates_of(redis_client, keys, early_poison) == ["requeued"]
    assert queue_depth(channel, queue) == 0
