"""Sentry burial events carry the release: the code version the message was buried with, or the
client's own release when ``sentry_sdk.init`` has one. A local HTTP server is the DSN."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sentry_sdk
from celery import Celery

from celery_dlx.fates import BURIED, FateEvent
from celery_dlx.integrations import install_integrations
from celery_dlx.wiring.runtime import get_runtime
from tests.conftest import BROKER_URL, REDIS_URL
from tests.sentry_sink import SentrySink


@pytest.fixture
def sink(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SentrySink]:
    # The SDK takes a release from $SENTRY_RELEASE or from `git rev-parse` in the working
    # directory (this checkout) when init() names none: run where neither gives one.
    monkeypatch.delenv("SENTRY_RELEASE", raising=False)
    monkeypatch.chdir(tmp_path)
    with SentrySink() as running:
        yield running
    sentry_sdk.init()  # leave no client behind for other tests


def _send(uid: str, key_prefix: str, cause: str, code_version: str | None) -> None:
    app = Celery(f"sentry-release-{uid}", broker=BROKER_URL, set_as_current=False)
    app.conf.update(dlx_key_prefix=key_prefix, dlx_redis_url=REDIS_URL, dlx_send_events=False)
    runtime = get_runtime(app)
    install_integrations(app, runtime)
    event = FateEvent.from_fields(
        fate=BURIED,
        queue="orders",
        message_id=f"{cause}-0",
        attempt=3,
        cause=cause,
        exc_type="shop.errors.BadOrder",
        exc_message="order is bad",
        importance="page",
        code_version=code_version,
    )
    runtime.record(event, history=False)


def _one(sink: SentrySink) -> dict[str, Any]:
    sentry_sdk.flush(timeout=10)
    sink.wait_for(lambda evs: len(evs) >= 1)
    (sent,) = sink.events
    return sent


def test_release_is_the_burials_code_version(sink: SentrySink, uid: str, key_prefix: str) -> None:
    sentry_sdk.init(dsn=sink.dsn)
    assert sentry_sdk.get_client().options["release"] is None
    _send(uid, key_prefix, f"rel-{uid}", "4f2a9c1")
    assert _one(sink)["release"] == "4f2a9c1"


def test_the_clients_own_release_is_kept(sink: SentrySink, uid: str, key_prefix: str) -> None:
    sentry_sdk.init(dsn=sink.dsn, release="shop@2.1")
    _send(uid, key_prefix, f"own-{uid}", "4f2a9c1")
    assert _one(sink)["release"] == "shop@2.1"


def test_no_version_no_release(sink: SentrySink, uid: str, key_prefix: str) -> None:
    sentry_sdk.init(dsn=sink.dsn)
    _send(uid, key_prefix, f"none-{uid}", None)
    assert _one(sink).get("release") is None
