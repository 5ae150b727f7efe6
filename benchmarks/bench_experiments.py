"""Variants of celery_dlx's worker, patched into a benchmark worker to measure what they buy.

Nothing here is used by celery_dlx itself: ``bench_app`` applies these when ``BENCH_EXPERIMENTS``
names them. The earlier experiments (``lazy_einfo``, ``quiet_ignore``, ``einfo_positions``) are
now celery_dlx's own code (``LazyExceptionInfo``, ``raise Ignore() from None``) or gone with the
requeue and park that end without a traceback (``compat.settling_tracer``); what is left:

- ``no_events``: ``dlx_send_events = False`` (no Flower event per fate change);
- ``events_always``: ``dlx_events_follow_worker = False`` (a fate event per fate change even from
  a worker that sends no task events, as before 2026-11-27; the benchmark workers run without
  ``-E``, so by default they send none);
- ``child_parks``: ``dlx_parent_parks = False`` (each pool process writes its own parks, as
  before the main process batched them);
- ``no_park_write``: a ceiling, not a design: the main process's settler acks each park its pool
  hands over without writing it (no Redis transaction, no history, counters or fate line), so
  every park is lost. What is left is the failure path without its durable write: the pool
  process's decision and copy, the handover, the main process's bookkeeping and the ack.
- ``no_linger``: the settler writes what has arrived at once (``settler.LINGER = 0``) instead of
  waiting up to 3 ms for more parks to join the batch (and holding their acks as long).
"""

from __future__ import annotations

from typing import Any

KNOWN = {"no_events", "events_always", "child_parks", "no_park_write", "no_linger"}


def apply(app: Any, experiments: set[str]) -> None:
    unknown = experiments - KNOWN
    if unknown:
        raise ValueError(f"unknown BENCH_EXPERIMENTS: {sorted(unknown)} (known: {sorted(KNOWN)})")
    if "no_events" in experiments:
        app.conf.dlx_send_events = False
    if "events_always" in experiments:
        app.conf.dlx_events_follow_worker = False
    if "child_parks" in experiments:
        app.conf.dlx_parent_parks = False
    if "no_linger" in experiments:
        from celery_dlx.worker import settler

        settler.LINGER = 0.0  # read by the settler's thread at each batch
    if "no_park_write" in experiments:
        from celery_dlx.wiring.runtime import Runtime

        def acked_unwritten(self: Runtime, parks: Any) -> list[BaseException | None]:
            return [None] * len(parks)

        # In this benchmark worker only (its main process: the settler calls it).
        Runtime.park_recorded_many = acked_unwritten  # type: ignore[method-assign]
