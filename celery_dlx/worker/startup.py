"""celery_dlx's lines after Celery's banner, and with ``dlx_redis_required`` a refusal to start
without Redis."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from celery import bootsteps

from celery_dlx.errors import ConfigurationError
from celery_dlx.wiring.banner import redacted, worker_lines
from celery_dlx.wiring.errors import STORE_ERRORS
from celery_dlx.wiring.runtime import get_runtime

if TYPE_CHECKING:
    from celery.worker import WorkController

logger = logging.getLogger("celery_dlx")


class StartupStep(bootsteps.StartStopStep):
    """Worker bootstep: log celery_dlx's lines and check Redis before the worker consumes (a
    start that raises stops the worker with exit 1)."""

    name = "celery_dlx.worker.startup"

    def include_if(self, parent: WorkController) -> bool:
        return bool(get_runtime(parent.app).config.enabled)

    def start(self, parent: WorkController) -> None:
        runtime = get_runtime(parent.app)
        for line in worker_lines(parent.app, runtime.config):
            logger.info("%s", line)
        if runtime.config.redis_required:
            require_redis(runtime.ping_redis, runtime.config.redis_url)


def require_redis(ping: Any, url: str) -> None:
    """Call ``ping``; a Redis error becomes the worker's refusal to start.

    Raises:
        ConfigurationError: Redis did not answer, naming ``dlx_redis_url`` and
            ``dlx_redis_required``.
    """
    try:
        ping()
    except STORE_ERRORS as exc:
        raise ConfigurationError(
            f"Redis at dlx_redis_url={redacted(url)} does not answer ({type(exc).__name__}: "
            f"{exc}) and dlx_redis_required is True: the worker does not start. Fix dlx_redis_url "
            "or start Redis (dlx_redis_required = False starts without it, parking nothing "
            "until it answers)"
        ) from exc
