"""Migration that completes: a queue created before celery_dlx, with good and poison messages
waiting; the celery_dlx worker is refused with the hint; `celery -A APP dlx migrate QUEUE
--policy` (or `--rename`); then the same app's worker runs with no code change, the good messages
are done, the poison ones buried, nothing lost."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.broker.management import Management
from celery_dlx.message.names import Keys
from celery_dlx.store.graveyard import Graveyard
from tests.integration.dropin_app import build, queue_of
from tests.integration.dropin_worker import APP, celery_cli, worker_process
from tests.integration.helpers import fates_of, queue_depth, wait_until

pytestmark = pytest.mark.slow

GOOD = 6
POISON = 2
#: A message the migrated app's own producer sends.
LATE = 100


@pytest.fixture
def api() -> Management:
    return Management("http://127.0.0.1:15672", "guest", "guest")


@pytest.fixture
def names(uid: str, cleanup_queues: list[str], api: Management) -> Iterator[str]:
    queue = queue_of(uid)
    cleanup_queues.extend(
        [
            queue,
            f"{queue}.dlx",
            f"default-{uid}",
            f"dead-{uid}",
            f"exchange:dlx-{uid}",
            f"exchange:{queue}",
        ]
    )
    yield queue
    api.delete_policy(f"celery-dlx-{queue}")


def _waiting_messages(uid: str) -> tuple[list[str], list[str]]:
    """Good and poison messages published by the app before celery_dlx (a plain queue)."""
    plain = build(uid, plain=True)
    good = [plain.send_task("dropin.good", args=[n]).id for n in range(GOOD)]
    poison = [plain.send_task("dropin.poison", args=[n]).id for n in range(POISON)]
    return good, poison


def _refused(uid: str, queue: str, tmp_path: Path) -> str:
    """Start the celery_dlx worker on the plain queue: it must stop with the migration hint."""
    log = tmp_path / "refused.log"
    with worker_process(uid, log, "-Q", queue) as proc:
        wait_until(
            lambda: proc.poll() is not None or "dlx migrate" in log.read_text(errors="replace"),
            what="the worker refused with the hint",
            timeout=120,
        )
    return log.read_text(errors="replace")


def _migrate(uid: str, *args: str) -> str:
    result = celery_cli(uid, "dlx", "migrate", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _all_settled(
    redis_client: Any, keys: Keys, key_prefix: str, poison: list[str], extra: tuple[int, ...] = ()
) -> bool:
    done = {int(n) for n in redis_client.smembers("{" + key_prefix + "}:test:good")}
    buried = all("buried" in fates_of(redis_client, keys, mid) for mid in poison)
    return done == {*range(GOOD), *extra} and buried


def test_policy_migration_ends_with_a_running_worker_and_nothing_lost(
    uid: str,
    key_prefix: str,
    keys: Keys,
    redis_client: Any,
    broker: Any,
    names: str,
    api: Management,
    tmp_path: Path,
) -> None:
    queue = names
    good, poison = _waiting_messages(uid)
    channel = broker.channel()
    # send_task publishes without confirms: the broker counts the messages a moment later
    wait_until(
        lambda: queue_depth(channel, queue) == GOOD + POISON,
        what="the waiting messages in the plain queue",
        timeout=30,
    )

    refused = _refused(uid, queue, tmp_path)
    assert f"celery -A {APP} dlx migrate {queue} --policy" in refused, refused[-3000:]
    # the worker's broker URL is on the default virtual host: the line says so
    assert f"set_policy -p / celery-dlx-{queue} " in refused
    assert queue_depth(channel, queue) == GOOD + POISON, "nothing consumed or lost"

    out = _migrate(uid, queue, "--policy")
    assert f"celery-dlx-{queue}" in out
    assert (api.queue(queue) or {}).get("policy") == f"celery-dlx-{queue}"

    log = tmp_path / "migrated.log"
    with worker_process(uid, log, "-Q", queue) as proc:
        # the same app's producer, no code change: it declares the queue as it is too
        producer = build(uid)
        late = producer.send_task("dropin.good", args=[LATE])
        wait_until(
            lambda: _all_settled(redis_client, keys, key_prefix, poison, extra=(LATE,)),
            what="good messages done and poison ones buried",
            timeout=180,
        )
        assert proc.poll() is None, "the worker keeps running"
        wait_until(lambda: Graveyard(redis_client, keys).count() == POISON, what="2 obituaries")
    text = log.read_text(errors="replace")
    assert "PRECONDITION_FAILED" not in text and "TopologyError" not in text, text[-3000:]
    assert queue_depth(channel, queue) == 0
    assert (api.queue(queue) or {}).get("arguments") == {}, "the queue was not redeclared"
    for mid in [*good, late.id]:
        assert "buried" not in fates_of(redis_client, keys, mid)
    for mid in poison:
        assert fates_of(redis_client, keys, mid)[-1] == "buried"


def test_rename_migration_ends_with_a_running_worker_and_nothing_lost(
    api: Management,
    uid: str,
    key_prefix: str,
    keys: Keys,
    redis_client: Any,
    broker: Any,
    names: str,
    tmp_path: Path,
) -> None:
    queue = names
    _, poison = _waiting_messages(uid)
    assert f"celery -A {APP} dlx migrate {queue} --rename" in _refused(uid, queue, tmp_path)

    out = _migrate(uid, queue, "--rename")
    assert f"{queue}.dlx" in out
    renamed = api.queue(f"{queue}.dlx") or {}
    assert (renamed.get("durable"), renamed.get("auto_delete")) == (True, False), renamed
    channel = broker.channel()
    assert queue_depth(channel, f"{queue}.dlx") == GOOD + POISON
    assert queue_depth(channel, queue) == 0

    log = tmp_path / "renamed.log"
    with worker_process(uid, log, "-Q", f"{queue}.dlx") as proc:
        wait_until(
            lambda: _all_settled(redis_client, keys, key_prefix, poison),
            what="good messages done and poison ones buried",
            timeout=180,
        )
        assert proc.poll() is None, "the worker keeps running"
    assert queue_depth(channel, f"{queue}.dlx") == 0
    assert queue_depth(channel, queue) == 0
