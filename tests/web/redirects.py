"""The shop of the redirect tests: a DLX app with two DLX queues, its console, and a task that
records the queue each run came from."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kombu import Queue

from celery_dlx.wiring.runtime import get_runtime
from celery_dlx_console.console import WebSettings
from celery_dlx_console.server import Background
from tests.integration.dlx_apps import make_app, queue_names
from tests.web.helpers import OPERATOR, VIEWER, Client, free_port


@contextlib.contextmanager
def redirect_shop(
    uid: str, key_prefix: str, broker: Any, cleanup_queues: list[str]
) -> Iterator[dict[str, Any]]:
    """``old`` (the default queue, where the messages died; nobody consumes it) and ``new``, both
    declared; the task ``ship`` pushes ``order:queue`` to ``done``; the console with an operator
    and a viewer."""
    old, new = f"work-{uid}", f"new-{uid}"
    app = make_app(uid, task_queues=[Queue(old), Queue(new)])
    runtime = get_runtime(app)
    done = f"{{{key_prefix}}}:done"

    @app.task(bind=True, name=f"ship-{uid}")
    def ship(self: Any, order: Any) -> None:
        queue = (self.request.delivery_info or {}).get("routing_key")
        runtime.redis.rpush(done, f"{order}:{queue}")

    cleanup_queues.extend(queue_names(app))
    cleanup_queues.append(f"exchange:{app.conf.dlx_exchange}")
    channel = broker.channel()
    for name in (old, new):
        app.amqp.queues[name](channel).declare()
    settings = WebSettings(
        operators=(":".join(OPERATOR),), viewers=(":".join(VIEWER),), port=free_port()
    )
    server = Background(runtime, settings).start()
    try:
        yield {
            "app": app,
            "runtime": runtime,
            "task": ship,
            "old": old,
            "new": new,
            "done": done,
            "channel": channel,
            "url": server.url,
            "op": Client(server.url, OPERATOR),
            "viewer": Client(server.url, VIEWER),
        }
    finally:
        server.stop()
        runtime.reset_publisher()
        channel.close()
