"""Fixtures of the console tests: a DLX app per test on the real RabbitMQ and Redis, and the
console served by a real uvicorn server on a free port."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from celery_dlx.wiring.runtime import get_runtime
from celery_dlx_console.console import WebSettings
from celery_dlx_console.server import Background
from tests.integration.cli_helpers import shop_protos
from tests.integration.dlx_apps import make_app, queue_names
from tests.web.helpers import OPERATOR, VIEWER, Client, free_port


def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    for item in items:
        if f"{os.sep}tests{os.sep}web{os.sep}" in str(item.fspath):
            item.add_marker(pytest.mark.integration)


@pytest.fixture
def shop(
    uid: str, key_prefix: str, cleanup_queues: list[str], tmp_path: Path
) -> Iterator[dict[str, Any]]:
    """A DLX app whose task ``flaky`` fails until ``fixed`` is set in Redis."""
    descriptor_set, events = shop_protos(tmp_path)
    app = make_app(uid, dlx_protobuf_descriptor_sets=[str(descriptor_set)])
    runtime = get_runtime(app)
    fixed_key, done_key = f"{{{key_prefix}}}:fixed", f"{{{key_prefix}}}:done"

    @app.task(name=f"flaky-{uid}")
    def flaky(order: Any) -> None:
        if not runtime.redis.get(fixed_key):
            raise RuntimeError("payment backend down")
        runtime.redis.rpush(done_key, str(order))

    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:{app.conf.dlx_exchange}")
    yield {
        "app": app,
        "runtime": runtime,
        "task": flaky,
        "fixed": fixed_key,
        "done": done_key,
        "events": events,
        "descriptor_set": descriptor_set,
        "uid": uid,
    }
    runtime.reset_publisher()


def serve(runtime: Any, **settings: Any) -> Background:
    options = {
        "operators": (":".join(OPERATOR),),
        "viewers": (":".join(VIEWER),),
        "port": free_port(),
        **settings,
    }
    return Background(runtime, WebSettings(**options)).start()


@pytest.fixture
def console(shop: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The shop's console with one operator and one viewer; clients for each and for nobody."""
    server = serve(shop["runtime"])
    try:
        yield {
            **shop,
            "server": server,
            "url": server.url,
            "op": Client(server.url, OPERATOR),
            "viewer": Client(server.url, VIEWER),
            "nobody": Client(server.url),
        }
    finally:
        server.stop()
