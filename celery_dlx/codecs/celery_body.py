"""Celery task messages (protocol 1 and 2) shown as task, id, args, kwargs and embed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from celery_dlx.codecs.context import header

#: Keys of a protocol 1 body that protocol 2 moved into the ``embed`` part.
_PROTOCOL1_EMBED = ("callbacks", "errbacks", "chord", "chain", "taskset", "group")


def header_text(value: Any) -> str | None:
    """A header value as text (bytes decoded as UTF-8), or None."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return None if value is None else str(value)


def header_task(headers: Mapping[str, object] | None) -> str | None:
    """The task name of a protocol 2 message, from its ``task`` header, if there is one."""
    return header_text(header(headers, "task")) or None


def celery_view(
    value: Any, headers: Mapping[str, object] | None
) -> tuple[dict[str, object] | None, str | None]:
    """``(view, None)`` when ``value`` (a decoded body) is a Celery message, ``(None, note)`` when
    the headers name a task but the body lacks Celery's shape, else ``(None, None)``."""
    task = header_task(headers)
    if task is not None:
        if not (
            isinstance(value, list)
            and len(value) == 3
            and isinstance(value[0], list)
            and isinstance(value[1], Mapping)
            and (value[2] is None or isinstance(value[2], Mapping))
        ):
            return None, (
                f"header task={task!r} says Celery protocol 2, but the body is not "
                "[args, kwargs, embed]: shown as it is"
            )
        return {
            "task": task,
            "id": header_text(header(headers, "id")),
            "args": value[0],
            "kwargs": value[1],
            "embed": value[2] or {},
            "protocol": 2,
        }, None
    if (
        isinstance(value, Mapping)
        and isinstance(value.get("task"), str)
        and ("args" in value or "kwargs" in value)
    ):
        return {
            "task": value["task"],
            "id": header_text(value.get("id")),
            "args": value.get("args") or [],
            "kwargs": value.get("kwargs") or {},
            "embed": {k: value[k] for k in _PROTOCOL1_EMBED if value.get(k) is not None},
            "protocol": 1,
        }, None
    return None, None
