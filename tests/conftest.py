"""Shared fixtures: real RabbitMQ and Redis on loopback, unique names per test, cleanup after."""

from __future__ import annotations

import contextlib
import os
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

BROKER_URL = os.environ.get("DLX_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("DLX_TEST_REDIS", "redis://127.0.0.1:6379/0")
ROOT = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        path = str(item.fspath)
        if f"{os.sep}integration{os.sep}" in path:
            item.add_marker(pytest.mark.integration)
        if f"{os.sep}spark{os.sep}" in path:
            item.add_marker(pytest.mark.spark)


#: Test directories whose tests reach the shared RabbitMQ and Redis: their ids are forgotten
#: there after each test (:func:`forget`).
_SERVICE_TESTS = tuple(f"{os.sep}{name}{os.sep}" for name in ("integration", "interop", "web"))


@pytest.fixture
def uid(request: pytest.FixtureRequest) -> Iterator[str]:
    """A short unique id for queue names and key prefixes of one test; after a test that reaches
    the shared services, what it left under that id there is deleted (:func:`forget`)."""
    value = uuid.uuid4().hex[:10]
    yield value
    if any(part in str(request.node.fspath) for part in _SERVICE_TESTS):
        forget(value)


def forget(uid: str) -> None:
    """Delete what a test left on the shared services under its ``uid``: the Redis keys of its
    key prefix (``{test-<uid>}...``; apps made by ``dlx_apps.make_app`` use it whether or not the
    test asked for :func:`key_prefix`), and the queues and exchanges of ``BROKER_URL``'s virtual
    host whose names hold the id (``work-<uid>``, ``dlx-<uid>``, its delay queues...). The id is
    ten random hex digits: nothing of anyone else's holds it."""
    import redis
    from kombu import Connection

    from celery_dlx.broker.management import ManagementError, management_for

    client = redis.Redis.from_url(REDIS_URL)
    try:
        _delete_prefix(client, f"test-{uid}")
    finally:
        client.close()
    api = management_for(Connection(BROKER_URL))
    vhost = urllib.parse.quote(api.vhost, safe="")
    for kind in ("queues", "exchanges"):
        listed = api.request("GET", f"/api/{kind}/{vhost}?columns=name")
        for entry in listed if isinstance(listed, list) else []:
            name = str(entry.get("name", ""))
            if uid in name:
                quoted = urllib.parse.quote(name, safe="")
                # gone meanwhile (an auto-delete queue, its exchange): nothing to delete
                with contextlib.suppress(ManagementError):
                    api.request("DELETE", f"/api/{kind}/{vhost}/{quoted}")


def _delete_prefix(client: Any, prefix: str) -> None:
    """Delete every key of the celery_dlx key prefix ``prefix`` (``{prefix}...``)."""
    for key in client.scan_iter(match="{" + prefix + "}*", count=1000):
        client.delete(key)


@pytest.fixture
def redis_client() -> Iterator[Any]:
    import redis

    client = redis.Redis.from_url(REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def key_prefix(uid: str, redis_client: Any) -> Iterator[str]:
    """A unique celery_dlx key prefix; every key under it is deleted after the test."""
    prefix = f"test-{uid}"
    yield prefix
    _delete_prefix(redis_client, prefix)


@pytest.fixture
def keys(key_prefix: str) -> Any:
    from celery_dlx.message.names import Keys

    return Keys(key_prefix)


def vhost_url(name: str) -> str:
    """``BROKER_URL`` with its virtual host replaced by ``name``."""
    parts = urllib.parse.urlsplit(BROKER_URL)
    return parts._replace(path="/" + urllib.parse.quote(name, safe="")).geturl()


@pytest.fixture
def vhost(uid: str) -> Iterator[str]:
    """The broker URL of a RabbitMQ virtual host of this test alone, deleted with all it holds
    after the test (through the management API of ``BROKER_URL``'s host, as its user).

    For a test whose point holds for everything a process logs or reports: on a shared virtual
    host, other users reach every worker through its broadcast exchanges (a worker starting
    with mingle makes each one log ``sync with <node>``), whoever they are.
    """
    from kombu import Connection

    from celery_dlx.broker.management import management_for

    name = f"dlxtest-{uid}"
    api = management_for(Connection(BROKER_URL))
    quoted = urllib.parse.quote(name, safe="")
    api.request("PUT", f"/api/vhosts/{quoted}", {})
    try:
        everything = {"configure": ".*", "write": ".*", "read": ".*"}
        user = urllib.parse.quote(api.user, safe="")
        api.request("PUT", f"/api/permissions/{quoted}/{user}", everything)
        yield vhost_url(name)
    finally:
        api.request("DELETE", f"/api/vhosts/{quoted}")


@pytest.fixture
def broker() -> Iterator[Any]:
    """A connected kombu connection to the real RabbitMQ."""
    from kombu import Connection

    conn = Connection(BROKER_URL)
    conn.ensure_connection(max_retries=3)
    yield conn
    conn.release()


@pytest.fixture
def cleanup_queues(broker: Any) -> Iterator[list[str]]:
    """Append queue (or ``exchange:NAME``) names to delete them after the test."""
    names: list[str] = []
    yield names
    channel = broker.channel()
    for name in names:
        try:
            if name.startswith("exchange:"):
                channel.exchange_delete(name[len("exchange:") :])
            else:
                channel.queue_delete(name)
        except Exception:
            channel = broker.channel()
    channel.close()
