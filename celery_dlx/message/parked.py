"""A parked retry: the message, where it goes back to, when, and its stored JSON form."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from celery_dlx.message import jsoncodec
from celery_dlx.message.event import now_ms
from celery_dlx.message.outgoing import Outgoing


@dataclass
class ParkedMessage:
    """A message waiting for its retry to ``queue`` (through the default exchange) at ``due_ms``."""

    message_id: str
    attempt: int
    queue: str
    body: bytes
    headers: dict[str, Any] = field(default_factory=dict)
    properties: dict[str, Any] = field(default_factory=dict)
    due_ms: int = 0
    parked_ms: int = field(default_factory=now_ms)
    task: str | None = None
    cause: str = ""
    lease_score: int = 0

    @property
    def entry_id(self) -> str:
        return f"{self.message_id}:{self.attempt}"

    def outgoing(self, routing_key: str | None = None) -> Outgoing:
        """The republish of this retry through the default exchange, to ``routing_key`` (default:
        its queue; the TTL ladder names a delay queue)."""
        return Outgoing(
            body=self.body,
            routing_key=self.queue if routing_key is None else routing_key,
            exchange="",
            headers=dict(self.headers),
            properties=dict(self.properties),
        )

    def meta_json(self) -> str:
        doc = {
            "message_id": self.message_id,
            "attempt": self.attempt,
            "queue": self.queue,
            "headers": self.headers,
            "properties": self.properties,
            "due_ms": self.due_ms,
            "parked_ms": self.parked_ms,
            "task": self.task,
            "cause": self.cause,
        }
        return jsoncodec.dumps(doc)

    @classmethod
    def from_stored(cls, meta: bytes | str, body: bytes, lease_score: int = 0) -> ParkedMessage:
        data = jsoncodec.loads(meta)
        if not isinstance(data, dict):
            raise TypeError(
                f"a parked entry's meta must be a JSON object, got {type(data).__name__}"
            )
        return cls(
            message_id=data["message_id"],
            attempt=int(data["attempt"]),
            queue=data["queue"],
            body=body,
            headers=data.get("headers") or {},
            properties=data.get("properties") or {},
            due_ms=int(data["due_ms"]),
            parked_ms=int(data.get("parked_ms") or 0),
            task=data.get("task"),
            cause=data.get("cause") or "",
            lease_score=lease_score,
        )


def park_each(
    park: Callable[[ParkedMessage], object], messages: Sequence[ParkedMessage]
) -> list[BaseException | None]:
    """``park`` each of ``messages``: per message, None when it is in, or the error that kept it
    out."""
    outcomes: list[BaseException | None] = []
    for message in messages:
        try:
            park(message)
            outcomes.append(None)
        except Exception as err:
            outcomes.append(err)
    return outcomes


def parks_named(messages: Sequence[ParkedMessage]) -> str:
    """The parks of ``messages``, as an error message names them."""
    if len(messages) == 1:
        return f"the park of {messages[0].entry_id}"
    return f"the parks of {len(messages)} messages"
