"""A forgotten ``celery_dlx.install(app)``: what the worker, a producer and the broker names say."""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from celery import Celery, current_app, signals

import celery_dlx
from celery_dlx.message.names import default_exchange, default_service_queue
from celery_dlx.policy.config import load_config
from celery_dlx.wiring.installed import installed, not_installed


@pytest.fixture(autouse=True)
def _current_app_restored() -> Any:
    before = current_app._get_current_object()
    yield
    before.set_current()


def _app(install: bool, **conf: Any) -> Celery:
    app = Celery("forgetful", broker="memory://", set_as_current=False)
    if install:
        celery_dlx.install(app)
    app.conf.update(conf)
    return app


@pytest.mark.parametrize(
    ("install", "conf", "expected"),
    [
        (False, {"dlx_enabled": True}, True),
        (False, {"DLX_ENABLED": "yes"}, True),
        (False, {"dlx_enabled": "maybe"}, True),  # asked for, if wrongly
        (False, {"dlx_enabled": False}, False),
        (False, {}, False),  # a plain Celery app
        (True, {"dlx_enabled": True}, False),
    ],
)
def test_not_installed_is_an_app_that_asks_for_celery_dlx_without_install(
    install: bool, conf: dict[str, Any], expected: bool
) -> None:
    app = _app(install, **conf)
    assert installed(app) is install
    assert not_installed(app) is expected


def test_a_producer_warns_once_at_its_first_publish(caplog: pytest.LogCaptureFixture) -> None:
    app = _app(False, dlx_enabled=True)
    app.set_current()
    caplog.set_level(logging.WARNING, logger="celery_dlx.install")
    for _ in range(3):
        app.send_task("proj.add", (1, 2))
    said = [r for r in caplog.records if "celery_dlx.install(app) was not called" in r.message]
    assert len(said) == 1 and said[0].levelname == "WARNING"
    assert "'forgetful'" in said[0].message


def test_an_installed_producer_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    app = _app(True, dlx_enabled=True)
    app.set_current()
    caplog.set_level(logging.WARNING, logger="celery_dlx.install")
    app.send_task("proj.add", (1, 2))
    assert not [r for r in caplog.records if "install(app)" in r.message]


def test_a_worker_starting_without_install_logs_an_error(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, logger="celery_dlx.install")
    forgot, fine = _app(False, dlx_enabled=True), _app(True, dlx_enabled=True)
    for app in (forgot, fine):
        signals.celeryd_after_setup.send(
            sender="w@host", instance=SimpleNamespace(app=app), conf=app.conf
        )
    (line,) = [r for r in caplog.records if "install(app)" in r.message]
    assert line.levelname == "ERROR" and "acked and lost" in line.message


@pytest.mark.parametrize(
    ("conf", "exchange", "queue"),
    [
        ({}, "celery_dlx", "celery_dlx.dead"),  # the default prefix keeps today's names
        ({"dlx_key_prefix": "dlx"}, "celery_dlx", "celery_dlx.dead"),
        ({"dlx_key_prefix": "shop"}, "celery_dlx.shop", "celery_dlx.shop.dead"),
        (
            {"dlx_key_prefix": "shop", "dlx_exchange": "celery_dlx"},
            "celery_dlx",
            "celery_dlx.shop.dead",
        ),
        (
            {"dlx_key_prefix": "shop", "dlx_exchange": "x", "dlx_service_queue": "y"},
            "x",
            "y",
        ),
    ],
)
def test_broker_names_follow_the_key_prefix_unless_set(
    conf: dict[str, Any], exchange: str, queue: str
) -> None:
    config = load_config(conf)
    assert (config.exchange, config.service_queue) == (exchange, queue)
    assert "dlx_exchange" not in conf or config.exchange == conf["dlx_exchange"]
    prefix = conf.get("dlx_key_prefix", "dlx")
    assert default_exchange(prefix) == config.exchange or "dlx_exchange" in conf
    assert default_service_queue(prefix) == config.service_queue or "dlx_service_queue" in conf


def test_a_dlx_services_consumer_tag_names_its_key_prefix_and_nothing_else_does() -> None:
    from celery_dlx.message.names import service_consumer_tag, service_tag_prefix

    tag = service_consumer_tag("shop", "host-1", 4242)
    assert tag == "celery_dlx.service:shop:host-1:4242"
    assert service_tag_prefix(tag) == "shop"
    for other in ("amq.ctag-abc", "", "celery_dlx.service:", "None3"):
        assert service_tag_prefix(other) is None
