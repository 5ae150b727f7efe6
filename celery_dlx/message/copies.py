"""What a Celery task message carries, read from the running request (the copy itself is built
by :func:`celery_dlx.broker.copies.celery_copy`). A copy keeps the message's task protocol: 2
(task headers, ``[args, kwargs, embed]`` body) or 1 (everything in a dict body).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class Delivered(Protocol):
    """What :func:`delivery_headers` reads of a running request (Celery's ``Context``)."""

    @property
    def properties(self) -> Mapping[str, object] | None: ...

    @property
    def headers(self) -> Mapping[str, object] | None: ...


def delivery_headers(request: Delivered) -> dict[str, object]:
    """The delivery's full AMQP header table (Celery's and custom headers)."""
    props = request.properties or {}
    raw = props.get("application_headers")
    if isinstance(raw, dict):
        return dict(raw)
    return dict(request.headers or {})


def task_protocol(headers: Mapping[str, object]) -> int:
    """2 when the task headers are there (``task`` and ``id``), else 1 (all in the body)."""
    return 2 if "task" in headers and "id" in headers else 1


def _body_v1(
    request: Any, args: list[Any], kwargs: dict[str, Any], retries: int
) -> dict[str, object]:
    """Celery's protocol 1 body (``celery.app.amqp.AMQP.as_task_v1``) for the running request."""
    group = getattr(request, "group", None)
    timelimit = getattr(request, "timelimit", None) or (None, None)
    return {
        "task": request.task,
        "id": request.id,
        "args": args,
        "kwargs": kwargs,
        "group": group,
        "group_index": getattr(request, "group_index", None),
        "retries": retries,
        "eta": getattr(request, "eta", None),
        "expires": getattr(request, "expires", None),
        "utc": getattr(request, "utc", True),
        "callbacks": request.callbacks,
        "errbacks": request.errbacks,
        "timelimit": list(timelimit),
        "taskset": group,
        "chord": request.chord,
    }
