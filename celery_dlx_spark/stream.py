"""Driver-side Redis work on the history stream: its bounds, the export lock, the checkpoint
mirror and the trim after a committed export. The driver never reads the entries themselves."""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any

from celery_dlx_spark.source import format_id, parse_id

logger = logging.getLogger(__name__)

#: Seconds the export lock lives without a heartbeat (a killed export frees it after this).
LOCK_TTL = 120.0
#: Seconds between lock heartbeats.
LOCK_HEARTBEAT = 20.0

_REFRESH = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('pexpire', KEYS[1], ARGV[2])
end
return 0
"""
_RELEASE = """
if redis.call('get', KEYS[1]) == ARGV[1] then
    return redis.call('del', KEYS[1])
end
return 0
"""


class LockedError(RuntimeError):
    """Another export of the same stream is running."""


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def stream_bounds(client: Any, key: str) -> tuple[str, str, int] | None:
    """``(first id, last id, length)`` of the stream, or None when it is empty or missing."""
    last = client.xrevrange(key, "+", "-", count=1)
    if not last:
        return None
    first = client.xrange(key, "-", "+", count=1)
    return _text(first[0][0]), _text(last[0][0]), int(client.xlen(key))


def successor(entry_id: str) -> str:
    """The smallest stream id greater than ``entry_id``."""
    ms, seq = parse_id(entry_id)
    return format_id(ms + 1, 0) if seq >= 2**64 - 1 else format_id(ms, seq + 1)


def trim(client: Any, key: str, exported_id: str) -> int:
    """Remove the entries up to and including ``exported_id`` (XTRIM MINID, exact); returns how
    many were removed. Entries appended during the export are newer and stay."""
    return int(client.xtrim(key, minid=successor(exported_id), approximate=False))


def mirror_key(key: str) -> str:
    """Hash mirroring the checkpoint next to the stream (same hash tag, so same cluster slot)."""
    return key + ":export"


def redis_full(exc: BaseException) -> bool:
    """True when Redis refused a write at its ``maxmemory`` (redis-py's ``OutOfMemoryError``)."""
    return type(exc).__name__ == "OutOfMemoryError" or "OOM command" in str(exc)


def mirror_checkpoint(client: Any, key: str, fields: dict[str, str]) -> None:
    """Copy the checkpoint into Redis so other tools see what has been exported; skipped with a
    warning on a full Redis (the checkpoint in ``--out`` is the one that counts)."""
    try:
        client.hset(mirror_key(key), mapping=fields)
    except Exception as exc:
        if not redis_full(exc):
            raise
        logger.warning("Redis is full (maxmemory): the checkpoint is not mirrored to %s", key)


class ExportLock:
    """A Redis lock per history stream, so two exports never interleave checkpoints or trims.

    Held with a short TTL renewed by a heartbeat thread: an export killed with -9 frees it within
    ``LOCK_TTL`` seconds. On a Redis at its ``maxmemory`` the lock cannot be written: the export
    goes on without it (it is what makes room, with ``--trim``), and the checkpoint in ``--out``
    still refuses the commit of a second export that ran meanwhile.
    """

    def __init__(self, client: Any, key: str, ttl: float = LOCK_TTL) -> None:
        self.client = client
        self.key = key + ":export:lock"
        self.ttl_ms = int(ttl * 1000)
        self.token = secrets.token_hex(12)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: False when Redis was full and the export runs without the lock.
        self.held = False

    def __enter__(self) -> ExportLock:
        try:
            taken = self.client.set(self.key, self.token, nx=True, px=self.ttl_ms)
        except Exception as exc:
            if not redis_full(exc):
                raise
            logger.warning(
                "Redis is full (maxmemory): exporting without the lock %s; the checkpoint in "
                "--out refuses the commit of another export that runs meanwhile",
                self.key,
            )
            return self
        if not taken:
            left = max(0, int(self.client.pttl(self.key)))
            raise LockedError(
                f"another export of this stream holds {self.key}; wait for it (the lock expires "
                f"within {left / 1000:.0f}s if that export died)"
            )
        self.held = True
        self._thread = threading.Thread(target=self._beat, name="dlx-export-lock", daemon=True)
        self._thread.start()
        return self

    def _beat(self) -> None:
        while not self._stop.wait(LOCK_HEARTBEAT):
            try:
                self.client.eval(_REFRESH, 1, self.key, self.token, self.ttl_ms)
            except Exception:  # a Redis hiccup must not kill the export; the next beat retries
                logger.warning("renewing %s failed", self.key, exc_info=True)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self.held:
            self.client.eval(_RELEASE, 1, self.key, self.token)


def now_ms() -> int:
    return int(time.time() * 1000)
