"""Redis' memory as ``INFO`` reports it: what ``dlx check`` and ``/metrics`` compare with
``maxmemory`` (read by :func:`celery_dlx.store.memory.read_memory`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RedisMemory:
    """One Redis server's memory. ``refused_writes``: ``OOM`` refusals since start; ``writable``:
    the probe write was taken (None: not probed), else ``refusal`` is Redis's answer."""

    used: int
    maxmemory: int
    policy: str
    refused_writes: int
    writable: bool | None = None
    refusal: str | None = None
    node: str = ""

    @property
    def share(self) -> float | None:
        """``used / maxmemory``; None when no ``maxmemory`` is set."""
        return self.used / self.maxmemory if self.maxmemory else None

    def to_json(self) -> dict[str, object]:
        return {
            "node": self.node,
            "used_memory": self.used,
            "maxmemory": self.maxmemory,
            "maxmemory_policy": self.policy,
            "used_share": self.share,
            "refused_writes": self.refused_writes,
            "writable": self.writable,
            "refusal": self.refusal,
        }
