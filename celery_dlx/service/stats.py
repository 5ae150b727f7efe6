"""What one DLX service run did, counted."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields


@dataclass
class ServiceStats:
    """Counts of what one service run did (settling threads share them)."""

    received: int = 0
    buried: int = 0
    parked: int = 0
    requeued: int = 0
    duplicates: int = 0
    #: Redelivered dead letters without a provable identity, given a fate again (maybe twice).
    unproven_redeliveries: int = 0
    #: Parks and requeues workers could not write (Redis or the broker refused them), written here.
    refused_copies: int = 0
    #: Dead letters moved to the overflow queue (their cause at dlx_graveyard_max_per_cause).
    overflowed: int = 0
    batches: int = 0
    archived: int = 0
    outages: int = 0
    retries: int = 0
    processes: int = 1
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, n in counts.items():
                setattr(self, name, getattr(self, name) + n)

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
