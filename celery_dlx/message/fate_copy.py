"""The copy a DLX worker sends to the DLX service with a fate it decided but could not write (a
park it cannot store, a requeued copy it cannot publish): it names its fate and delay, and the
service carries it out (a plain rejection would leave it to decide without the cause record)."""

from __future__ import annotations

from dataclasses import replace

from celery_dlx.message.names import DELAY_HEADER, FATE_HEADER, QUEUE_HEADER
from celery_dlx.message.outgoing import Outgoing

#: Fates a copy may ask the DLX service to carry out.
FATES = ("parked", "requeued")


def fate_copy(
    copy: Outgoing, *, fate: str, exchange: str, queue: str, delay: float | None = None
) -> Outgoing:
    """``copy`` (the requeued copy, or the parked one), addressed to the dead-letter ``exchange``
    with its ``fate`` and, for a park, its ``delay`` in seconds.

    Raises:
        ValueError: ``fate`` is not parked or requeued, or a park has no finite delay >= 0.
    """
    if fate not in FATES:
        raise ValueError(f"a fate copy is parked or requeued, not {fate!r}")
    headers = {k: v for k, v in copy.headers.items() if k not in (FATE_HEADER, DELAY_HEADER)}
    headers[FATE_HEADER] = fate
    headers[QUEUE_HEADER] = queue
    if fate == "parked":
        if delay is None or not 0 <= delay < float("inf"):
            raise ValueError(f"a parked fate copy needs a delay in seconds >= 0, got {delay!r}")
        headers[DELAY_HEADER] = f"{delay:.3f}"
    return replace(copy, exchange=exchange, routing_key=queue, headers=headers)
