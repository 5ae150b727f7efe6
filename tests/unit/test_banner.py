"""The lines a worker and the DLX service log about celery_dlx at start; no password in them."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from celery import Celery

import celery_dlx
from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.config import load_config
from celery_dlx.wiring.banner import redacted, service_lines, worker_lines
from celery_dlx.worker.startup import StartupStep, require_redis


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
        ("redis://:s3cret@redis:6379/0", "redis://:**@redis:6379/0"),
        (
            "rediss://user:s3cret@redis:6380/1?ssl_cert_reqs=none",
            "rediss://user:**@redis:6380/1?ssl_cert_reqs=none",
        ),
        ("redis://s3cret@redis", "redis://**@redis"),
        ("sentinel://:p@a:26379,b:26379/mymaster", "sentinel://:**@a:26379,b:26379/mymaster"),
        ("amqp://u:p@h1//;amqp://u:p@h2//", "amqp://u:**@h1//;amqp://u:**@h2//"),
        ("redis://user@h/0", "redis://**@h/0"),  # redis-py reads a lone user as the password
        ("not a url", "not a url"),
    ],
)
def test_redacted_hides_every_password(url: str, shown: str) -> None:
    assert redacted(url) == shown


def test_worker_lines_say_what_celery_dlx_does_here() -> None:
    app = Celery("proj", set_as_current=False)
    config = load_config(
        {
            "dlx_enabled": True,
            "dlx_redis_url": "redis://:pw@redis:6379/2",
            "dlx_key_prefix": "shop",
            "dlx_drain_interval": 0.5,
            "dlx_delay_backend": "ttl",
            "dlx_service_in_worker": True,
        }
    )
    text = "\n".join(worker_lines(app, config))
    assert "enabled for app 'proj'" in text
    assert "Redis redis://:**@redis:6379/2 (dlx_redis_url), key prefix 'shop'" in text
    assert "delay backend ttl; drain every 0.5s" in text
    assert "exchange 'celery_dlx.shop' and queue 'celery_dlx.shop.dead'" in text
    assert "runs inside this worker (dlx_service_in_worker)" in text
    assert ":pw@" not in text


def test_service_lines_name_broker_vhost_and_redis_without_passwords() -> None:
    app = Celery("proj", broker="amqp://svc:hunter2@rabbit:5672/shop", set_as_current=False)
    config = load_config({"dlx_redis_url": "redis://:hunter2@redis:6379/0"})
    text = "\n".join(service_lines(app, config, drain=False, processes=2))
    assert "broker amqp://svc:**@rabbit:5672/shop, virtual host 'shop'" in text
    assert "consuming 'celery_dlx.dead' (bound to exchange 'celery_dlx'), 2 process(es)" in text
    assert "Redis redis://:**@redis:6379/0 (dlx_redis_url)" in text
    assert "drains parked retries: no (--no-drain)" in text
    assert "hunter2" not in text


def test_the_startup_step_logs_the_lines(caplog: pytest.LogCaptureFixture) -> None:
    app = Celery("proj", set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(dlx_enabled=True)
    caplog.set_level(logging.INFO, logger="celery_dlx")
    parent = SimpleNamespace(app=app)
    step = StartupStep(parent)
    assert step.include_if(parent)  # type: ignore[arg-type]
    step.start(parent)  # type: ignore[arg-type]
    lines = [r.message for r in caplog.records if r.name == "celery_dlx"]
    assert lines == worker_lines(app, load_config(app.conf))


def test_require_redis_turns_a_redis_error_into_a_refusal_naming_the_settings() -> None:
    import redis

    def ping() -> None:
        raise redis.ConnectionError("Connection refused")

    with pytest.raises(ConfigurationError) as info:
        require_redis(ping, "redis://:pw@nowhere:6379/0")
    assert str(info.value).startswith("Redis at dlx_redis_url=redis://:**@nowhere:6379/0 does")
    assert "dlx_redis_required is True" in str(info.value)
    require_redis(lambda: True, "redis://x")  # an answer: nothing raised
