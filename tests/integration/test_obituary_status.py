"""Replays close the loop (issue 37): a replayed obituary is ``replayed`` until its outcome is
known, ``resolved`` once a DLX task ran the replayed copy, ``failed-again`` (naming the new
obituary, which counts the repeats) when the copy is buried again, and ``resolved`` by the
sweep when nothing dead-lettered it within ``dlx_resolve_after``; resolved obituaries leave the
graveyard after ``dlx_resolved_retention``. Real worker, DLX service, RabbitMQ and Redis."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from celery_dlx.fates import ARCHIVED, now_ms
from celery_dlx.ops import obituaries
from celery_dlx.service.loop import DLXService
from celery_dlx.wiring.retention import sweep_retention
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.cli_helpers import run_json
from tests.integration.dlx_apps import make_app, queue_names, worker
from tests.integration.helpers import wait_until
from tests.integration.test_cli_replay import CAUSE, bury, task_obituary


@pytest.fixture
def shop(uid: str, key_prefix: str, cleanup_queues: list[str]) -> Iterator[dict[str, Any]]:
    """A DLX app whose task fails until ``fixed`` is set in Redis, with a short budget (one
    run, then buried) and a DLX service in its own thread."""
    app = make_app(uid, dlx_max_requeues=0, dlx_max_parks=0)
    runtime = get_runtime(app)
    fixed_key = f"{{{key_prefix}}}:fixed"

    @app.task(name=f"flaky-{uid}")
    def flaky(order: int) -> None:
        if not runtime.redis.get(fixed_key):
            raise RuntimeError("payment backend down")

    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:{app.conf.dlx_exchange}")
    service = DLXService(app)
    thread = threading.Thread(target=service.run, daemon=True)
    thread.start()
    try:
        yield {"app": app, "runtime": runtime, "task": flaky, "fixed": fixed_key}
    finally:
        service.stop()
        thread.join(30)
        runtime.reset_publisher()


def statuses(app: Any) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for r in run_json(app, "list", "--status", "all")["obituaries"]}


def test_a_canary_replay_resolves_its_cause_and_a_failure_again_links_the_new_obituary(
    shop: dict[str, Any],
) -> None:
    app, runtime = shop["app"], shop["runtime"]
    obits = [task_obituary(app, shop["task"].name, i) for i in range(4)]
    bury(runtime, obits)
    ids = [ob.id for ob in obits]
    (group,) = run_json(app, "groups")["groups"]
    assert (group["count"], group["unresolved"], group["resolved"]) == (4, 4, 0)

    with worker(app):
        # Still broken: the one replayed message fails and is buried again (budget: one run).
        broken = run_json(app, "replay", ids[0])
        assert broken["replayed"] == [ids[0]]
        wait_until(
            lambda: statuses(app)[ids[0]]["status"] == "failed-again",
            timeout=60,
            what="the replayed copy buried again",
        )
        old = statuses(app)[ids[0]]
        new = statuses(app)[old["next"]]
        assert new["replayed_from"] == ids[0] and new["repeats"] == 1
        assert new["status"] == "unresolved" and new["message_id"] == obits[0].message_id
        # The default listing shows what needs a person: the new obituary, not the old one.
        listed = [r["id"] for r in run_json(app, "list")["obituaries"]]
        assert old["next"] in listed and ids[0] not in listed

        runtime.redis.set(shop["fixed"], 1)  # the cause is fixed
        fixed = run_json(app, "replay", "--group", CAUSE, "--canary")
        assert fixed["canary"]["outcome"] == "recovered", fixed
        assert fixed["replayed"] == ids[1:]  # the failed-again one was replayed already
        # The new obituary has the cause the worker saw (its own group): replayed on its own.
        assert run_json(app, "replay", old["next"])["replayed"] == [old["next"]]
        wait_until(
            lambda: all(statuses(app)[i]["status"] == "resolved" for i in [*ids[1:], old["next"]]),
            timeout=60,
            what="every replayed copy to run",
        )
    assert run_json(app, "list")["obituaries"] == []  # nothing unresolved is left
    assert run_json(app, "groups")["groups"] == []
    groups = {g["cause"]: g for g in run_json(app, "groups", "--status", "all")["groups"]}
    assert (groups[CAUSE]["count"], groups[CAUSE]["resolved"]) == (4, 3)
    assert groups[CAUSE]["failed_again"] == 1 and groups[CAUSE]["unresolved"] == 0
    (other,) = [g for c, g in groups.items() if c != CAUSE]
    assert (other["count"], other["resolved"], other["unresolved"]) == (1, 1, 0)
    resolved = run_json(app, "list", "--status", "resolved")["obituaries"]
    assert sorted(r["id"] for r in resolved) == sorted([*ids[1:], old["next"]])

    # Resolved obituaries leave the graveyard after dlx_resolved_retention (history kept).
    later = now_ms() + int(runtime.config.resolved_retention * 1000) + 1000
    assert sweep_retention(runtime, now=later) == 4
    assert [ob.id for ob in obituaries.list_obituaries(runtime, status="all")] == [ids[0]]
    archived = [f for _, f in runtime.history.read() if f["fate"] == ARCHIVED]
    assert len(archived) == 4 and all("resolved" in f["reason"] for f in archived)


def test_a_replay_nothing_dead_letters_again_is_resolved_after_the_window(
    shop: dict[str, Any],
) -> None:
    """A foreign consumer's replay (or any replay no DLX task reports on) is resolved by the
    sweep once ``dlx_resolve_after`` passes without a new burial."""
    app, runtime = shop["app"], shop["runtime"]
    (ob,) = [task_obituary(app, shop["task"].name, 9)]
    bury(runtime, [ob])
    with app.connection_for_write() as conn:  # its queue, as a worker would declare it
        for queue in app.amqp.queues.values():
            queue(conn.default_channel).declare()
    assert run_json(app, "replay", ob.id)["replayed"] == [ob.id]  # no worker: nobody reports
    assert statuses(app)[ob.id]["status"] == "replayed"
    sweep_retention(runtime)
    assert statuses(app)[ob.id]["status"] == "replayed"  # the window is not over
    later = now_ms() + int(runtime.config.resolve_after * 1000) + 1000
    sweep_retention(runtime, now=later)
    assert statuses(app)[ob.id]["status"] == "resolved"
