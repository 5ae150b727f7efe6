"""The overflow queue: dead letters whose cause holds ``dlx_graveyard_max_per_cause`` obituaries
wait there, whole, instead of in the graveyard (see ``celery_dlx.service.settle``)."""

from __future__ import annotations

from typing import TypedDict

from celery_dlx.broker.moving import drain_overflow
from celery_dlx.broker.topology import overflow_name
from celery_dlx.wiring.runtime import Runtime


class OverflowJSON(TypedDict):
    """What ``dlx overflow --json`` prints."""

    queue: str
    waiting: int
    requeued: int
    max_per_cause: int


def overflow(runtime: Runtime, *, requeue: bool = False) -> OverflowJSON:
    """How many dead letters wait in the overflow queue; with ``requeue``, move them back to
    the DLX service queue first (with confirms), which buries them once their cause has room
    or moves them back."""
    config = runtime.config
    moved, waiting = drain_overflow(
        runtime.app, config.service_queue, quorum=bool(config.quorum), requeue=requeue
    )
    return {
        "queue": overflow_name(config.service_queue),
        "waiting": waiting,
        "requeued": moved,
        "max_per_cause": config.graveyard_max_per_cause,
    }
