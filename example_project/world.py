"""The outside world of the orders service, kept in Redis so every process of a run shares it.

* :class:`Gateway`, a payment gateway whose answers the demo scripts per order: ``ok``,
  ``timeout`` (it did not answer in time) or ``decline`` (the card was refused).
* :class:`Database`, the orders table: a row may be committed by another service only after a
  task that needs it has started.
* :class:`Ledger`, what the fulfilment service (the "Go" consumer) did with each event.

Keys live under the run's hash tag (``{<run>}:example:...``), next to celery_dlx's own keys.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import redis

#: The gateway's answers a demo may script.
ANSWERS = ("ok", "timeout", "decline")


def key(run: str, *parts: str) -> str:
    """A Redis key of the run's world."""
    return ":".join(["{" + run + "}", "example", *parts])


def client(url: str) -> Any:
    """A Redis client answering text."""
    return redis.Redis.from_url(url, decode_responses=True)


class Gateway:
    """The payment gateway; its answers for an order are a script the demo writes first."""

    def __init__(self, redis_client: Any, run: str) -> None:
        self.redis = redis_client
        self.run = run

    def script(self, order_id: str, answers: Iterable[str]) -> None:
        """Make the gateway give ``answers`` to the next charges of ``order_id``, then ``ok``."""
        answers = list(answers)
        unknown = [a for a in answers if a not in ANSWERS]
        if unknown:
            raise ValueError(f"gateway answers must be among {ANSWERS}, got {unknown}")
        name = key(self.run, "gateway", order_id)
        pipe = self.redis.pipeline()
        pipe.delete(name)
        if answers:
            pipe.rpush(name, *answers)
        pipe.execute()

    def next_answer(self, order_id: str) -> str:
        """The gateway's answer to one charge of ``order_id``."""
        return str(self.redis.lpop(key(self.run, "gateway", order_id)) or "ok")


class Database:
    """The orders table (a Redis hash: order id -> JSON row)."""

    def __init__(self, redis_client: Any, run: str) -> None:
        self.redis = redis_client
        self.table = key(run, "db", "orders")

    def insert(self, order_id: str, row: dict[str, Any]) -> None:
        self.redis.hset(self.table, order_id, json.dumps(row))

    def get(self, order_id: str) -> dict[str, Any] | None:
        raw = self.redis.hget(self.table, order_id)
        return None if raw is None else dict(json.loads(raw))

    def update(self, order_id: str, **fields: Any) -> None:
        row = self.get(order_id) or {}
        row.update(fields)
        self.insert(order_id, row)


class Ledger:
    """What the fulfilment service did with each event: message id -> ``acked`` or ``rejected``."""

    def __init__(self, redis_client: Any, run: str) -> None:
        self.redis = redis_client
        self.name = key(run, "fulfilment", "ledger")

    def note(self, message_id: str, outcome: str) -> None:
        self.redis.hset(self.name, message_id, outcome)

    def outcome(self, message_id: str) -> str | None:
        value = self.redis.hget(self.name, message_id)
        return None if value is None else str(value)
