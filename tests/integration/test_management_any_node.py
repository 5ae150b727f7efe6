"""``celery dlx check``/``migrate`` with several management URLs, the first one dead (a cluster
node down): the first that answers is used and named. One live RabbitMQ here; the 3-node run is
``tests/cluster/`` (and the URL derivation from a failover list ``tests/unit/test_management_urls.py``).
"""

from __future__ import annotations

from typing import Any

from kombu import Connection

from celery_dlx.broker.management import management_for
from celery_dlx.broker.topology import declare_topology
from tests.conftest import BROKER_URL
from tests.integration.cli_helpers import run, run_json
from tests.integration.dlx_apps import make_app, queue_names

#: Nothing listens there: a node whose management API is down.
DEAD = "http://127.0.0.1:9"


def live_url() -> str:
    return management_for(Connection(BROKER_URL)).url


def test_check_and_migrate_use_the_first_management_api_that_answers(
    uid: str, key_prefix: str, cleanup_queues: list[str]
) -> None:
    app = make_app(uid)
    cleanup_queues.extend([*queue_names(app), f"exchange:{app.conf.dlx_exchange}"])
    with app.connection_for_write() as conn:
        declare_topology(
            conn.default_channel,
            app.amqp.queues.values(),
            exchange=app.conf.dlx_exchange,
            service=app.conf.dlx_service_queue,
        )
    live = live_url()
    report = run_json(app, "check", "--management-url", f"{DEAD},{live}")
    assert report["ok"] is True, report["problems"]
    assert report["management_url"] == live
    assert report["management_tried"] == [DEAD, live]

    text = run(app, "check", "--management-url", DEAD, "--management-url", live)
    assert text.exit_code == 0, text.output
    assert f"management API {live} (of 2: {DEAD}, {live})" in text.stdout

    queue = app.conf.task_default_queue
    plan = run(app, "migrate", queue, "--policy", "--dry-run", "--management-url", f"{DEAD},{live}")
    assert plan.exit_code == 0, (plan.output, plan.stderr)
    assert f"management API: {live} (first to answer of 2)" in plan.stderr
    assert "nothing to do" in plan.stdout


def test_none_answering_names_every_url(uid: str, key_prefix: str) -> None:
    app = make_app(uid)
    other = "http://127.0.0.1:10"
    report: Any = run_json(app, "check", "--management-url", f"{DEAD},{other}", code=4)
    unreachable = [p for p in report["problems"] if p["kind"] == "management-unreachable"]
    assert len(unreachable) == 1 and report["management_url"] is None
    assert DEAD in unreachable[0]["detail"] and other in unreachable[0]["detail"]
    assert "--management-url" in unreachable[0]["detail"]

    failed = run(app, "migrate", f"q-{uid}", "--policy", "--management-url", f"{DEAD},{other}")
    assert failed.exit_code == 1
    assert "none of 2 management APIs answered" in failed.stderr
