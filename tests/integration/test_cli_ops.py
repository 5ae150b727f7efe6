"""``celery dlx check`` and ``celery dlx migrate`` on the real RabbitMQ and its management API.

Every policy a test writes is removed after it; queues and exchanges are unique per test.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import amqp
import pytest

from celery_dlx.broker.management import Management, management_for
from celery_dlx.broker.topology import dead_letter_arguments, declare_topology
from celery_dlx.wiring.runtime import get_runtime
from tests.integration.cli_helpers import run, run_json
from tests.integration.dlx_apps import make_app, queue_names
from tests.integration.helpers import wait_until


@pytest.fixture
def api(broker: Any) -> Management:
    return management_for(broker)


@pytest.fixture
def policies(api: Management) -> Iterator[list[str]]:
    """Append policy names to delete them after the test."""
    names: list[str] = []
    yield names
    for name in names:
        api.delete_policy(name)


def listed(api: Management, queue: str, **want: Any) -> dict[str, Any]:
    """The API's view of ``queue`` once its statistics show ``want`` (they lag a few seconds)."""
    return wait_until(  # type: ignore[no-any-return]
        lambda: (
            (q := api.queue(queue)) is not None
            and all(q.get(k) == v for k, v in want.items())
            and q
        ),
        timeout=30,
        what=f"management API to show {queue} with {want}",
    )


def publish(broker: Any, queue: str, n: int, exchange: str = "") -> None:
    channel = broker.channel()
    for i in range(n):
        channel.basic_publish(amqp.Message(f"m{i}".encode(), delivery_mode=2), exchange, queue)


def test_check_passes_on_a_declared_topology_then_finds_each_problem(
    uid: str, key_prefix: str, broker: Any, api: Management, cleanup_queues: list[str]
) -> None:
    foreign, orphan = f"foreign-{uid}", f"orphan-{uid}"
    app = make_app(uid)
    runtime = get_runtime(app)
    cleanup_queues.extend([*queue_names(app), foreign, orphan, f"exchange:{app.conf.dlx_exchange}"])
    missing = run_json(app, "check", code=4)
    kinds = {(p["kind"], p["subject"]) for p in missing["problems"]}
    assert ("missing-exchange", app.conf.dlx_exchange) in kinds
    assert ("missing-queue", app.conf.dlx_service_queue) in kinds
    assert ("missing-queue", app.conf.task_default_queue) in kinds

    with app.connection_for_write() as conn:
        declare_topology(
            conn.default_channel,
            app.amqp.queues.values(),
            exchange=app.conf.dlx_exchange,
            service=app.conf.dlx_service_queue,
        )
    ok = run_json(app, "check")
    assert ok["ok"] is True and ok["problems"] == [] and ok["management"] is True
    assert ok["exchange"] == app.conf.dlx_exchange
    assert ok["queues"] == [
        {
            "name": app.conf.task_default_queue,
            "why": "an app queue (dlx_enabled)",
            "dead_letter_exchange": app.conf.dlx_exchange,
            "set_by": "argument",
        }
    ]
    assert run(app, "check").stdout.rstrip().endswith("ok")

    # A foreign queue named in dlx_queues but declared without a DLX, and an orphan queue
    # (dead-lettering to our exchange, messages, no consumer).
    channel = broker.channel()
    channel.queue_declare(foreign, durable=True, auto_delete=False)
    args = dead_letter_arguments(orphan, app.conf.dlx_exchange)
    channel.queue_declare(orphan, durable=True, auto_delete=False, arguments=args)
    publish(broker, orphan, 3)
    listed(api, orphan, messages_ready=3)
    app2 = make_app(uid, dlx_queues={foreign: {"max_parks": 1}})
    first = run_json(app2, "check", "--for", "1h", code=4)
    assert [(p["kind"], p["subject"]) for p in first["problems"]] == [
        ("no-dead-letter-exchange", foreign)
    ]
    assert "migrate" in first["problems"][0]["detail"]
    later = run_json(app2, "check", "--for", "0s", code=4)
    orphans = [p for p in later["problems"] if p["kind"] == "orphan-queue"]
    assert [p["subject"] for p in orphans] == [orphan]
    assert "3 ready messages and has had no consumer" in orphans[0]["detail"]
    assert runtime.redis.hexists("{" + key_prefix + "}:check:consumerless", orphan)
    channel.basic_consume(orphan, callback=lambda m: None, no_ack=False)
    listed(api, orphan, consumers=1)
    healed = run_json(app2, "check", "--for", "0s", code=4)
    assert not [p for p in healed["problems"] if p["kind"] == "orphan-queue"]
    assert not runtime.redis.hexists("{" + key_prefix + "}:check:consumerless", orphan)
    amqp_only = run_json(app2, "check", "--no-management")
    assert amqp_only["management"] is False and amqp_only["ok"] is True


def test_check_reports_an_unreachable_management_api(uid: str, key_prefix: str) -> None:
    app = make_app(uid)
    result = run(app, "check", "--management-url", "http://127.0.0.1:9", "--json")
    assert result.exit_code == 4
    problems = json.loads(result.stdout)["problems"]
    assert problems[-1]["kind"] == "management-unreachable"
    assert "--management-url" in problems[-1]["detail"]


def test_migrate_policy_dead_letters_and_keeps_other_policies(
    uid: str,
    key_prefix: str,
    broker: Any,
    api: Management,
    policies: list[str],
    cleanup_queues: list[str],
) -> None:
    legacy = f"legacy-{uid}"
    app = make_app(uid)
    conf = app.conf
    cleanup_queues.extend([legacy, conf.dlx_service_queue, f"exchange:{conf.dlx_exchange}"])
    channel = broker.channel()
    channel.queue_declare(legacy, durable=True, auto_delete=False)  # no DLX: a 406 to redeclare
    with app.connection_for_write() as conn:
        declare_topology(
            conn.default_channel, [], exchange=conf.dlx_exchange, service=conf.dlx_service_queue
        )
    limits, unrelated = f"limits-{uid}", f"unrelated-{uid}"
    policies.extend([limits, unrelated, f"celery-dlx-{legacy}"])
    api.put_policy(limits, f"^legacy-{uid}", {"max-length": 1000}, 5, "queues")
    api.put_policy(unrelated, f"^nothing-{uid}$", {"message-ttl": 60000}, 9, "queues")
    listed(api, legacy, policy=limits)

    dry = run_json(app, "migrate", legacy, "--policy", "--dry-run")
    assert dry["applied"] is False and dry["set_by"] == "none"
    assert api.policy(f"celery-dlx-{legacy}") is None

    done = run_json(app, "migrate", legacy, "--policy")
    assert done["applied"] is True and done["dead_letter_exchange"] == conf.dlx_exchange
    assert done["set_by"] == "policy"
    assert done["policy"] == {
        "name": f"celery-dlx-{legacy}",
        "pattern": f"^legacy\\-{uid}$",
        "definition": {
            "max-length": 1000,
            "dead-letter-exchange": conf.dlx_exchange,
            "dead-letter-routing-key": legacy,
        },
        "priority": 6,
        "apply_to": "queues",
        "merged_from": limits,
        "needed": True,
        "reason": "",
    }
    for name, definition, priority in (
        (limits, {"max-length": 1000}, 5),
        (unrelated, {"message-ttl": 60000}, 9),
    ):
        other = api.policy(name)
        assert other is not None and other["definition"] == definition
        assert other["priority"] == priority
    effective = api.queue(legacy)["effective_policy_definition"]  # type: ignore[index]
    assert effective["max-length"] == 1000

    publish(broker, legacy, 1)
    msg = wait_until(lambda: channel.basic_get(legacy, no_ack=False), what="the published message")
    channel.basic_reject(msg.delivery_tag, requeue=False)
    dead = wait_until(
        lambda: channel.basic_get(conf.dlx_service_queue, no_ack=True), what="dead letter"
    )
    assert dead.body == b"m0" and dead.delivery_info["routing_key"] == legacy
    assert dead.headers["x-death"][0]["queue"] == legacy
    checker = make_app(uid, dlx_enabled=False, dlx_queues={legacy: {}})
    checked = run_json(checker, "check")  # the policy counts as the queue's DLX
    assert checked["ok"] is True and checked["queues"] == [
        {
            "name": legacy,
            "why": "named in dlx_queues",
            "dead_letter_exchange": conf.dlx_exchange,
            "set_by": "policy",
        }
    ]

    again = run_json(app, "migrate", legacy, "--policy")
    assert again["policy"]["merged_from"] == limits and again["policy"]["priority"] == 6

    removed = run_json(app, "migrate", legacy, "--policy", "--remove")
    assert removed == {
        "queue": legacy,
        "method": "policy",
        "removed": True,
        "policy": f"celery-dlx-{legacy}",
    }
    assert api.policy(f"celery-dlx-{legacy}") is None and api.policy(limits) is not None
    listed(api, legacy, policy=limits)
    assert run_json(app, "migrate", f"nope-{uid}", "--policy", code=3)["error"] == "not found"


def test_migrate_rename_moves_messages_and_bindings(
    uid: str, key_prefix: str, broker: Any, api: Management, cleanup_queues: list[str]
) -> None:
    old, exchange = f"old-{uid}", f"orders-{uid}"
    new = f"{old}.dlx"
    app = make_app(uid)
    conf = app.conf
    cleanup_queues.extend(
        [old, new, conf.dlx_service_queue, f"exchange:{conf.dlx_exchange}", f"exchange:{exchange}"]
    )
    channel = broker.channel()
    channel.exchange_declare(exchange, "direct", durable=True, auto_delete=False)
    channel.queue_declare(old, durable=True, auto_delete=False, arguments={"x-max-priority": 5})
    channel.queue_bind(old, exchange, "order.created")
    publish(broker, "order.created", 30, exchange=exchange)
    listed(api, old, messages_ready=30)

    plan = run_json(app, "migrate", old, "--rename", "--dry-run")
    assert plan["new_queue"] == new and plan["moved"] == 0 and plan["dry_run"] is True
    assert plan["arguments"] == {
        "x-max-priority": 5,
        "x-dead-letter-exchange": conf.dlx_exchange,
        "x-dead-letter-routing-key": new,
    }
    assert plan["bound"] == [{"source": exchange, "routing_key": "order.created", "arguments": {}}]
    assert api.queue(new) is None

    done = run_json(app, "migrate", old, "--rename")
    assert done["moved"] == 30 and done["left"] == 0
    assert done["unbound"] == done["bound"] == plan["bound"]
    info = listed(api, new, messages_ready=30)
    assert info["arguments"] == plan["arguments"]
    got = []
    while (m := channel.basic_get(new, no_ack=False)) is not None:
        got.append(m)
    assert [m.body for m in got] == [f"m{i}".encode() for i in range(30)]  # order kept
    for m in got[:-1]:
        channel.basic_ack(m.delivery_tag)
    channel.basic_reject(got[-1].delivery_tag, requeue=False)
    dead = wait_until(
        lambda: channel.basic_get(conf.dlx_service_queue, no_ack=True), what="dead letter"
    )
    assert dead.body == b"m29" and dead.delivery_info["routing_key"] == new

    publish(broker, "order.created", 1, exchange=exchange)  # producers now reach the new queue
    wait_until(lambda: channel.queue_declare(new, passive=True).message_count == 1)
    assert channel.queue_declare(old, passive=True).message_count == 0
    text = run(app, "migrate", f"nope-{uid}", "--rename")
    assert text.exit_code == 3 and "does not exist" in text.stderr
    usage = run(app, "migrate", old)
    assert usage.exit_code == 2 and "--policy or --rename" in usage.stderr
