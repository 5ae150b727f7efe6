"""The message a DLX task is running, as the worker sees it: queue, identity, attempt state, the
broker's redelivered flag, and whatever is wrong with its headers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from celery import Task

from celery_dlx.errors import MalformedHeader
from celery_dlx.message.copies import delivery_headers
from celery_dlx.message.headers import DLXState, dead_letter_refusal, message_identity, read_state
from celery_dlx.message.names import DELIVERY_QUEUE_HEADER


@dataclass
class Delivery:
    """What the worker knows about the message being run."""

    headers: dict[str, Any]
    queue: str
    message_id: str
    redelivered: bool
    state: DLXState
    problem: str | None
    x_death_problem: str | None


def read_delivery(task: Task[..., object], req: Any) -> Delivery:
    """What ``req`` (``task``'s request) says about its message; never raises: a malformed header
    becomes ``Delivery.problem``."""
    headers = delivery_headers(req)
    info = req.delivery_info or {}
    problem = None
    try:
        state = read_state(headers)
    except MalformedHeader as exc:
        state, problem = DLXState(), f"malformed header: {exc}"
    x_problem = dead_letter_refusal(headers) if "x-death" in headers else None
    queue = (
        headers.get(DELIVERY_QUEUE_HEADER)
        or state.queue
        or (info.get("routing_key") if not info.get("exchange") else None)
        or task.app.conf.task_default_queue
    )
    if isinstance(queue, bytes):
        queue = queue.decode("utf-8", "replace")
    return Delivery(
        headers=headers,
        queue=str(queue),
        message_id=str(req.id or message_identity(req.properties, headers, b"")),
        redelivered=bool(info.get("redelivered")),
        state=state,
        problem=problem or x_problem,
        x_death_problem=x_problem,
    )
