"""Deterministic crash points for chaos tests, off unless ``DLX_FAULT`` is set.

``DLX_FAULT="drain.claimed@3,service.buried@1"`` makes the process exit with ``os._exit(9)`` (as
after a ``kill -9``) the 3rd time it reaches ``drain.claimed`` or the 1st time it reaches
``service.buried``. With ``DLX_FAULT_LOG=path`` a line (point, pid, epoch seconds) is appended to
``path`` first, so a test's ledger records where and when each process died.
"""

from __future__ import annotations

import os
import threading
import time

#: Environment variable arming the crash points.
FAULT_ENV = "DLX_FAULT"
#: Environment variable naming a file each crash is logged to before the exit.
FAULT_LOG_ENV = "DLX_FAULT_LOG"
#: Every crash point, with the window it sits in (a crash there must lose nothing).
POINTS = frozenset(
    {
        "drain.claimed",  # parked retries claimed in Redis, not yet published
        "drain.published",  # retries published and confirmed, not yet deleted from Redis
        "service.parked",  # the DLX service's parks (and their history) written, the rest not yet
        "service.published",  # the DLX service's requeued copies confirmed, letters not yet acked
        "service.buried",  # obituaries written to the graveyard, dead letters not yet acked
        # A worker's park written to Redis, its original not yet acked (the broker redelivers the
        # original: the park must be recognised, not given a second retry).
        "worker.parked",
        "worker.requeued",  # a worker's requeued copy confirmed and recorded, original not acked
        "worker.stashed",  # a worker's cause record stashed, its original not yet rejected
    }
)

# Reach counts per point in this process (the only mutable module state).
_reached: dict[str, int] = {}
_lock = threading.Lock()


def armed(spec: str) -> dict[str, int]:
    """Parse a ``DLX_FAULT`` value: point -> the reach that crashes (1 when not given); raises
    ValueError for an unknown point or a count below 1."""
    out: dict[str, int] = {}
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, nth = item.partition("@")
        if name not in POINTS:
            raise ValueError(f"{FAULT_ENV}: unknown crash point {name!r}; known: {sorted(POINTS)}")
        count = int(nth) if nth else 1
        if count < 1:
            raise ValueError(f"{FAULT_ENV}: {item!r} must count from 1")
        out[name] = count
    return out


def point(name: str) -> None:
    """A crash point: exits the process here if ``DLX_FAULT`` arms ``name`` for this reach."""
    spec = os.environ.get(FAULT_ENV)
    if not spec:
        return
    nth = armed(spec).get(name)
    if nth is None:
        return
    with _lock:
        reached = _reached[name] = _reached.get(name, 0) + 1
    if reached != nth:
        return
    log = os.environ.get(FAULT_LOG_ENV)
    if log:
        with open(log, "a", encoding="utf-8") as out:
            out.write(f"{name} pid={os.getpid()} at={time.time():.3f}\n")
    os._exit(9)
