"""Per-cause breakers in Redis, shared by every worker (the ``Breakers`` role).

Keys (all under the app's hash tag ``{prefix}``, so one transaction may touch them on a Redis
Cluster too):

* ``{prefix}:breaker:state:QUEUE\\tCAUSE`` — hash: the :class:`~celery_dlx.policy.breaker.BreakerState`
  fields, plus ``queue``, ``cause``, ``task`` and ``exc_type`` once open;
* ``{prefix}:breaker:held:QUEUE\\tCAUSE`` — set: parking entry ids held by the open breaker;
* ``{prefix}:breaker:open`` — sorted set: ``QUEUE\\tCAUSE`` -> opened ms, the open breakers.

A failure reads the state, applies :func:`~celery_dlx.policy.breaker.on_failure` and writes the
result in one optimistic transaction (``WATCH``/``MULTI``, retried on a concurrent change). The
state and held keys expire ``2 * hold + window`` seconds after their last write: by then every
held message has come back on its own (a hold lasts at most ``hold``), so nothing depends on them.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, cast

from celery_dlx.message.names import Keys
from celery_dlx.policy.breaker import BreakerSettings, BreakerState, Hold, on_failure
from celery_dlx.store.client import RedisClient, text

_STATE_FIELDS = tuple(f.name for f in fields(BreakerState))


def _state(raw: dict[Any, Any]) -> BreakerState:
    data = {text(k): text(v) for k, v in raw.items()}
    return BreakerState(**{name: int(data.get(name) or 0) for name in _STATE_FIELDS})


@dataclass(frozen=True)
class OpenBreaker:
    """An open breaker, as listed."""

    queue: str
    cause: str
    task: str
    exc_type: str
    opened_ms: int
    probe_ms: int
    held: int

    def as_dict(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class Breakers:
    """The ``Breakers`` role in Redis."""

    def __init__(self, client: RedisClient, keys: Keys) -> None:
        self.client = client
        self.keys = keys
        #: Sorted set of the open breakers (``QUEUE\tCAUSE`` -> opened ms).
        self.open_index = keys.breakers_open

    @staticmethod
    def member(queue: str, cause: str) -> str:
        return f"{queue}\t{cause}"

    def state_key(self, queue: str, cause: str) -> str:
        return self.keys.breaker_state(self.member(queue, cause))

    def fail(
        self,
        queue: str,
        cause: str,
        settings: BreakerSettings,
        now_ms: int,
        *,
        entry_id: str,
        task: str = "",
        exc_type: str = "",
    ) -> Hold | None:
        """Count one failure of ``cause`` on ``queue``; the hold verdict, or None (closed). A
        held failure's parking entry ``entry_id`` is remembered for :meth:`close`."""
        member = self.member(queue, cause)
        state_key, held_key = self.keys.breaker_state(member), self.keys.breaker_held(member)
        ttl_ms = 2 * settings.hold_ms + settings.window_ms
        verdict: list[Hold | None] = [None]

        def step(pipe: Any) -> None:
            before = _state(pipe.hgetall(state_key))
            after, hold = on_failure(before, settings, now_ms)
            verdict[0] = hold
            pipe.multi()
            mapping: dict[str, object] = {name: getattr(after, name) for name in _STATE_FIELDS}
            if hold is not None and hold.opened:
                mapping.update(queue=queue, cause=cause, task=task, exc_type=exc_type)
                pipe.zadd(self.open_index, {member: now_ms})
            pipe.hset(state_key, mapping=mapping)
            pipe.pexpire(state_key, ttl_ms)
            if hold is not None:
                pipe.sadd(held_key, entry_id)
                pipe.pexpire(held_key, ttl_ms)

        self.client.transaction(step, state_key)
        return verdict[0]

    def close(self, queue: str, cause: str) -> tuple[bool, list[str]]:
        """Close the breaker of ``cause`` on ``queue``: whether it was open, and the parking
        entry ids it held (to release)."""
        member = self.member(queue, cause)
        state_key, held_key = self.keys.breaker_state(member), self.keys.breaker_held(member)
        pipe = self.client.pipeline(transaction=True)
        pipe.hget(state_key, "opened_ms")
        pipe.smembers(held_key)
        pipe.delete(state_key, held_key)
        pipe.zrem(self.open_index, member)
        opened, held, _, _ = pipe.execute()
        was_open = bool(opened) and int(opened) > 0
        return was_open, sorted(text(h) for h in held or ())

    def is_open(self, queue: str, cause: str) -> bool:
        opened = self.client.hget(self.state_key(queue, cause), "opened_ms")
        return bool(opened) and int(cast("bytes", opened)) > 0

    def list_open(self) -> list[OpenBreaker]:
        """The open breakers, oldest first; index entries whose state expired are dropped."""
        members = [text(m) for m in cast("list[Any]", self.client.zrange(self.open_index, 0, -1))]
        if not members:
            return []
        pipe = self.client.pipeline(transaction=False)
        for m in members:
            pipe.hgetall(self.keys.breaker_state(m))
        out: list[OpenBreaker] = []
        stale: list[str] = []
        for member, raw in zip(members, pipe.execute(), strict=True):
            data = {text(k): text(v) for k, v in (raw or {}).items()}
            if int(data.get("opened_ms") or 0) <= 0:
                stale.append(member)
                continue
            queue, _, cause = member.partition("\t")
            out.append(
                OpenBreaker(
                    queue=queue,
                    cause=cause,
                    task=data.get("task", ""),
                    exc_type=data.get("exc_type", ""),
                    opened_ms=int(data["opened_ms"]),
                    probe_ms=int(data.get("probe_ms") or 0),
                    held=int(data.get("held") or 0),
                )
            )
        if stale:
            self.client.zrem(self.open_index, *stale)
        return out
