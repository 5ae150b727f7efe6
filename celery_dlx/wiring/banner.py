"""What celery_dlx does in this process, in a few log lines: the worker's (after Celery's banner)
and the DLX service's first lines. Passwords never appear: URLs are shown with ``**`` instead."""

from __future__ import annotations

from urllib.parse import unquote

from celery import Celery

from celery_dlx.policy.config import DLXConfig


def redacted(url: str) -> str:
    """``url`` with the password of each of its hosts replaced by ``**`` (a Sentinel or failover
    list of several URLs, separated by ``;``, each); the rest unchanged."""
    return ";".join(_redact_one(part) for part in url.split(";"))


def _redact_one(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    end = min((i for i in (rest.find("/"), rest.find("?")) if i >= 0), default=len(rest))
    netloc, tail = rest[:end], rest[end:]
    userinfo, at, hosts = netloc.rpartition("@")
    if not at:
        return url
    user, colon, password = userinfo.partition(":")
    shown = f"{user}:**" if colon and password else ("**" if not colon and user else userinfo)
    return f"{scheme}://{shown}@{hosts}{tail}"


def _seconds(value: float) -> str:
    return f"{value:g}s"


def worker_lines(app: Celery, config: DLXConfig) -> list[str]:
    """The worker's lines: enabled, Redis, delay backend, the DLX service inside or not, drain."""
    service = (
        "runs inside this worker (dlx_service_in_worker)"
        if config.service_in_worker
        else "not in this worker: run `celery -A APP dlx service` (or dlx_service_in_worker = True)"
    )
    return [
        f"celery_dlx: enabled for app {app.main!r}: failures are requeued at the tail, parked "
        f"and buried (up to {config.max_requeues} requeues and {config.max_parks} parks)",
        f"celery_dlx: Redis {redacted(config.redis_url)} (dlx_redis_url), key prefix "
        f"{config.key_prefix!r}"
        + (", required at start (dlx_redis_required)" if config.redis_required else ""),
        f"celery_dlx: delay backend {config.delay_backend}; drain every "
        f"{_seconds(config.drain_interval)} under a Redis lease",
        f"celery_dlx: dead letters go to exchange {config.exchange!r} and queue "
        f"{config.service_queue!r}; the DLX service {service}",
    ]


def service_lines(app: Celery, config: DLXConfig, *, drain: bool, processes: int) -> list[str]:
    """The DLX service's first lines: broker, virtual host, Redis, queue, drain."""
    conn = app.connection_for_read()
    try:
        broker = conn.as_uri()  # kombu shows the password as **
        vhost = unquote(conn.virtual_host or "/")
    finally:
        conn.release()
    drains = f"every {_seconds(config.drain_interval)}" if drain else "no (--no-drain)"
    return [
        f"DLX service of app {app.main!r}: broker {redacted(broker)}, virtual host {vhost!r}",
        f"DLX service: consuming {config.service_queue!r} (bound to exchange "
        f"{config.exchange!r}), {processes} process(es)",
        f"DLX service: Redis {redacted(config.redis_url)} (dlx_redis_url), key prefix "
        f"{config.key_prefix!r}; drains parked retries: {drains}",
    ]
