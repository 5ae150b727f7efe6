"""What a new user meets in the first hour, on the real services: two apps on one virtual host
keep their dead letters apart, a forgotten ``celery_dlx.install(app)`` is said, and a worker says
what celery_dlx does in it (or refuses to start without Redis when told to)."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

import celery_dlx
from celery_dlx.errors import ConfigurationError
from celery_dlx.fates import BURIED, PARKED
from celery_dlx.ops import obituaries
from celery_dlx.wiring.runtime import get_runtime
from celery_dlx.worker.startup import require_redis
from tests.conftest import REDIS_URL, ROOT, _delete_prefix
from tests.integration.cli_helpers import run, run_json
from tests.integration.dlx_apps import drain_thread, make_app, service_thread, worker
from tests.integration.helpers import wait_until


def _app(name: str, broker: str, prefix: str, queue: str, *, install: bool = True) -> Celery:
    """An app that sets its own key prefix and leaves dlx_exchange and dlx_service_queue alone."""
    app = Celery(name, broker=broker, set_as_current=False)
    if install:
        celery_dlx.install(app)
    app.conf.update(
        dlx_enabled=True,
        dlx_redis_url=REDIS_URL,
        dlx_key_prefix=prefix,
        task_default_queue=queue,
        dlx_max_requeues=0,
        dlx_max_parks=1,
        dlx_backoff=[0.2],
        dlx_drain_interval=0.2,
        broker_connection_retry_on_startup=True,
    )
    return app


@pytest.fixture
def other_prefix(uid: str) -> Iterator[str]:
    """A second key prefix of this test (the ``uid`` fixture forgets only ``test-<uid>``)."""
    prefix = f"test-{uid}b"
    yield prefix
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    try:
        _delete_prefix(client, prefix)
    finally:
        client.close()


def _publish(conn: Connection, queue: str, count: int) -> list[str]:
    ids = [f"{queue}-{i}-{uuid.uuid4().hex[:6]}" for i in range(count)]
    producer = conn.Producer()
    for message_id in ids:
        producer.publish(b"{}", routing_key=queue, message_id=message_id, retry=True)
    return ids


def _reject_everything(conn: Connection, queues: list[str], until: Any, timeout: float) -> int:
    """A foreign consumer that rejects (requeue=false) every message of ``queues`` until
    ``until()``; the number of rejects."""
    channel = conn.channel()
    rejected = 0
    deadline = time.monotonic() + timeout
    try:
        while not until():
            assert time.monotonic() < deadline, "dead letters not settled in time"
            got = False
            for queue in queues:
                message = channel.basic_get(queue)
                if message is not None:
                    channel.basic_reject(message.delivery_tag, requeue=False)
                    rejected += 1
                    got = True
            if not got:
                time.sleep(0.05)
    finally:
        channel.close()
    return rejected


def _fates(runtime: Any) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for _, entry in runtime.history.read():
        out.setdefault(entry["message_id"], []).append(entry["fate"])
    return out


def test_two_apps_on_one_vhost_park_and_bury_only_in_their_own_redis(
    uid: str, key_prefix: str, other_prefix: str, vhost: str
) -> None:
    shop = _app(f"shop-{uid}", vhost, key_prefix, f"work-a-{uid}")
    mail = _app(f"mail-{uid}", vhost, other_prefix, f"work-b-{uid}")
    shop_rt, mail_rt = get_runtime(shop), get_runtime(mail)
    # Each app's key prefix chooses its broker names; nothing was set by hand.
    assert (shop_rt.config.exchange, shop_rt.config.service_queue) == (
        f"celery_dlx.{key_prefix}",
        f"celery_dlx.{key_prefix}.dead",
    )
    assert (mail_rt.config.exchange, mail_rt.config.service_queue) == (
        f"celery_dlx.{other_prefix}",
        f"celery_dlx.{other_prefix}.dead",
    )
    with Connection(vhost) as conn:
        for app in (shop, mail):
            queue = app.amqp.queues[app.conf.task_default_queue]
            assert (
                queue.queue_arguments["x-dead-letter-exchange"] == get_runtime(app).config.exchange
            )
            queue(conn.channel()).declare()
        with (
            service_thread(shop),
            service_thread(mail),
            drain_thread(shop, 0.1),
            drain_thread(mail, 0.1),
        ):
            shop_ids = _publish(conn, f"work-a-{uid}", 4)
            mail_ids = _publish(conn, f"work-b-{uid}", 3)

            def all_buried() -> bool:
                return obituaries.count(shop_rt) == 4 and obituaries.count(mail_rt) == 3

            # Every message: rejected, parked by its own app's service, drained, rejected, buried.
            rejected = _reject_everything(conn, [f"work-a-{uid}", f"work-b-{uid}"], all_buried, 60)
    assert rejected == 2 * (4 + 3)
    shop_fates, mail_fates = _fates(shop_rt), _fates(mail_rt)
    assert set(shop_fates) == set(shop_ids) and set(mail_fates) == set(mail_ids)
    for fates in (*shop_fates.values(), *mail_fates.values()):
        assert fates[0] == PARKED and fates[-1] == BURIED and fates.count(BURIED) == 1
    shop_buried = {o.message_id for o in obituaries.list_obituaries(shop_rt, limit=100)}
    mail_buried = {o.message_id for o in obituaries.list_obituaries(mail_rt, limit=100)}
    assert (shop_buried, mail_buried) == (set(shop_ids), set(mail_ids))


def test_an_app_sharing_another_apps_dead_letter_exchange_is_told_by_check_and_service(
    uid: str, key_prefix: str, other_prefix: str, vhost: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Two apps with their own key prefixes, one of which set the other's dlx_exchange by hand:
    each dead letter is copied to both service queues. ``dlx check`` of either names the other
    app's service, and a service that starts beside the other logs an ERROR naming it."""
    shop = _app(f"shop-{uid}", vhost, key_prefix, f"work-a-{uid}")
    mail = _app(f"mail-{uid}", vhost, other_prefix, f"work-b-{uid}")
    shared = get_runtime(shop).config.exchange
    mail.conf.dlx_exchange = shared
    shop_queue = get_runtime(shop).config.service_queue
    mail_queue = get_runtime(mail).config.service_queue
    assert shop_queue != mail_queue
    with Connection(vhost) as conn:
        conn.SimpleQueue(f"work-a-{uid}").close()
    # A tap bound by hand (no DLX service consumes it) is none of this.
    with Connection(vhost) as conn:
        channel = conn.channel()
        channel.queue_declare(f"tap-{uid}", durable=False, auto_delete=False)
        with service_thread(mail):
            # The management API lists consumers from its statistics (every 5 s by default).
            wait_until(
                lambda: _consumed_by_service(channel, mail_queue),
                timeout=30,
                what="the mail service's consumer in the management API",
            )
            channel.queue_bind(f"tap-{uid}", shared, "#")
            report = run_json(shop, "check", code=4)
            shared_problems = [p for p in report["problems"] if p["kind"] == "shared-dlx"]
            assert [p["subject"] for p in shared_problems] == [mail_queue], report["problems"]
            assert repr(other_prefix) in shared_problems[0]["detail"]
            caplog.set_level(logging.ERROR, logger="celery_dlx.service.loop")
            with service_thread(shop):
                wait_until(
                    lambda: any("another app" in r.getMessage() for r in caplog.records),
                    timeout=20,
                    what="the shop service's ERROR",
                )
        channel.queue_delete(f"tap-{uid}")
        channel.close()
    said = [r.getMessage() for r in caplog.records if "another app" in r.getMessage()]
    assert repr(other_prefix) in said[0] and repr(mail_queue) in said[0]


def _consumed_by_service(channel: Any, queue: str) -> bool:
    """Whether the management API lists a DLX service's consumer on ``queue``."""
    from celery_dlx.broker.management import management_for

    info = management_for(channel.connection.client).queue(queue) or {}
    tags = [str(c.get("consumer_tag")) for c in info.get("consumer_details") or []]
    return any(tag.startswith("celery_dlx.service:") for tag in tags)


def test_check_says_install_was_not_called_instead_of_a_migration(uid: str, vhost: str) -> None:
    app = _app(f"forgot-{uid}", vhost, f"test-{uid}", f"work-{uid}", install=False)
    with Connection(vhost) as conn:
        # What its workers declared: the queue, without any dead-letter argument.
        conn.SimpleQueue(f"work-{uid}").close()
    report = run_json(app, "check", code=4)
    assert report["app"] == f"forgot-{uid}"
    kinds = [p["kind"] for p in report["problems"]]
    assert kinds[0] == "not-installed" and "no-dead-letter-exchange" not in kinds, kinds
    assert "celery_dlx.install(app) was not called" in report["problems"][0]["detail"]
    text = run(app, "check")
    assert text.exit_code == 4
    assert "celery_dlx.install(app) was not called" in text.stdout
    assert "migrate" not in text.stdout
    assert text.stdout.startswith(f"app forgot-{uid}:")


def test_a_worker_refuses_to_start_without_redis_when_redis_is_required(uid: str) -> None:
    dead = "redis://:secret@127.0.0.1:1/0"
    with pytest.raises(ConfigurationError) as info:
        require_redis(get_runtime(_unreachable_app(uid, dead)).redis.ping, dead)
    text = str(info.value)
    assert "dlx_redis_url=redis://:**@127.0.0.1:1/0" in text and "dlx_redis_required" in text
    assert "secret" not in text


def _unreachable_app(uid: str, redis_url: str) -> Celery:
    app = Celery(f"noredis-{uid}", set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(dlx_enabled=True, dlx_redis_url=redis_url, dlx_redis_required=True)
    return app


# -- real `celery worker` processes ------------------------------------------------------------

APP_MODULE = """
from celery import Celery
{imports}
app = Celery("{name}", broker="{broker}")
{install}
app.conf.update(
    dlx_enabled=True,
    dlx_redis_url="{redis}",
    dlx_redis_required={required},
    dlx_key_prefix="test-{uid}",
    task_default_queue="work-{uid}",
    worker_hijack_root_logger=True,
)

@app.task(name="noop-{uid}")
def noop():
    return None
"""


def _worker(
    tmp_path: Path, uid: str, vhost: str, *, install: bool, redis: str = REDIS_URL, **kw: Any
) -> subprocess.Popen[str]:
    module = f"firsthour_{uid}"
    source = APP_MODULE.format(
        imports="import celery_dlx" if install else "",
        install="celery_dlx.install(app)" if install else "",
        name=module,
        broker=vhost,
        redis=redis,
        required=kw.get("required", False),
        uid=uid,
    )
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    command = [sys.executable, "-m", "celery", "-A", module, "worker", "-P", "solo"]
    command += ["-l", "INFO", "--without-mingle", "--without-gossip", "-n", f"w-{uid}@%h"]
    return subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _read_until(proc: subprocess.Popen[str], wanted: str, timeout: float = 60) -> str:
    """The worker's output up to the first line holding ``wanted`` (or its exit)."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if wanted in line:
            return "".join(seen)
    return "".join(seen)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_a_worker_says_what_celery_dlx_does_in_it(tmp_path: Path, uid: str, vhost: str) -> None:
    proc = _worker(tmp_path, uid, vhost, install=True)
    try:
        out = _read_until(proc, "celery_dlx: dead letters go to")
    finally:
        _stop(proc)
    assert f"celery_dlx: enabled for app 'firsthour_{uid}'" in out, out
    assert f"celery_dlx: Redis {REDIS_URL} (dlx_redis_url), key prefix 'test-{uid}'" in out
    assert "celery_dlx: delay backend redis; drain every 1s" in out
    assert f"exchange 'celery_dlx.test-{uid}' and queue 'celery_dlx.test-{uid}.dead'" in out
    assert "the DLX service not in this worker" in out


def test_a_worker_of_an_app_without_install_logs_an_error_naming_it(
    tmp_path: Path, uid: str, vhost: str
) -> None:
    # The app module never imports celery_dlx: the `celery` command does (the `dlx` entry point).
    proc = _worker(tmp_path, uid, vhost, install=False)
    try:
        out = _read_until(proc, "was not called")
    finally:
        _stop(proc)
    line = next(x for x in out.splitlines() if "was not called" in x)
    assert "ERROR" in line and "celery_dlx.install(app)" in line, out


def test_a_worker_with_redis_required_exits_when_redis_does_not_answer(
    tmp_path: Path, uid: str, vhost: str
) -> None:
    proc = _worker(tmp_path, uid, vhost, install=True, redis="redis://127.0.0.1:1/0", required=True)
    try:
        out = _read_until(proc, "dlx_redis_required is True")
        code = proc.wait(60)
    finally:
        _stop(proc)
    assert code == 1, out
    assert "dlx_redis_url=redis://127.0.0.1:1/0 does not answer" in out


def test_autoretry_logs_the_users_reason_and_the_burial_shows_the_tasks_frames(
    uid: str, caplog: pytest.LogCaptureFixture
) -> None:
    app = make_app(uid, dlx_max_requeues=0)
    runtime = get_runtime(app)

    @app.task(
        name=f"lookup-{uid}", autoretry_for=(KeyError,), max_retries=1, default_retry_delay=0.2
    )
    def lookup(sku: int) -> None:
        raise KeyError(f"sku {sku} not in the catalogue")

    caplog.set_level(logging.INFO, logger="celery_dlx")
    with service_thread(app), drain_thread(app), worker(app):
        result = lookup.delay(7)
        wait_until(lambda: obituaries.count(runtime) == 1, what="the burial")
    lines = [r.getMessage() for r in caplog.records if r.name == "celery_dlx"]
    (parked,) = [x for x in lines if x.startswith("parked ") and result.id in x]
    assert "reason=retry error=KeyError: 'sku 7 not in the catalogue'" in parked, parked
    assert "RetryPark" not in "\n".join(lines)
    ob = obituaries.get_obituary(runtime, result.id)
    assert ob is not None and ob.exc_type == "KeyError"
    frames = [x for x in ob.traceback.splitlines() if x.lstrip().startswith("File ")]
    assert frames and __file__ in frames[0], ob.traceback  # the task's frame comes first
    assert not [f for f in frames if "celery_dlx" in f.replace(__file__, "")], ob.traceback
