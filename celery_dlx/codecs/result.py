"""The JSON-safe result of decoding one payload."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Nothing in the body.
KIND_EMPTY = "empty"
#: JSON that is not a Celery message.
KIND_JSON = "json"
#: A Celery task message (protocol 1 or 2), shown as task, id, args, kwargs and embed.
KIND_CELERY = "celery"
#: msgpack data (only when the optional ``msgpack`` package is installed).
KIND_MSGPACK = "msgpack"
#: Protobuf decoded with the best-fitting registered type (``type_name``, ``score``).
KIND_PROTOBUF = "protobuf"
#: Protobuf wire format shown without a schema: field numbers, wire types and values.
KIND_PROTOBUF_WIRE = "protobuf-wire"
#: Printable text.
KIND_TEXT = "text"
#: Bytes nothing could decode, shown as length, sha256 and a hex preview.
KIND_BINARY = "binary"
#: Bytes of an unsafe serializer (pickle, Java serialization, YAML with Python tags), never loaded.
KIND_OPAQUE_UNSAFE = "opaque-unsafe"

#: Every kind a :class:`Decoded` can have.
KINDS = (
    KIND_EMPTY,
    KIND_JSON,
    KIND_CELERY,
    KIND_MSGPACK,
    KIND_PROTOBUF,
    KIND_PROTOBUF_WIRE,
    KIND_TEXT,
    KIND_BINARY,
    KIND_OPAQUE_UNSAFE,
)


@dataclass(frozen=True)
class RunnerUp:
    """The second-best protobuf type for a body, with its score (0 to 1)."""

    type_name: str
    score: float

    def to_json(self) -> dict[str, object]:
        return {"type_name": self.type_name, "score": self.score}


@dataclass(frozen=True)
class Decoded:
    """What a payload is, shown as JSON-safe data.

    Attributes:
        kind: one of :data:`KINDS`.
        data: JSON-safe view of the payload (shape depends on ``kind``).
        notes: why something was not decoded, was cut, or is doubtful.
        type_name: the protobuf type chosen (kind ``protobuf``).
        score: how well ``type_name`` fits, 0 to 1 (1: every field known, with its declared wire
            type, and every field of the type present); ``runner_up``: the second best.
        size, sha256: length and hex digest of the body as received.
        layers: wrappings peeled off before decoding, outermost first (``gzip``, ``base64``...).
        truncated: only part of the body was decoded or part of the data is shown.
    """

    kind: str
    data: Any = None
    notes: list[str] = field(default_factory=list)
    type_name: str | None = None
    score: float | None = None
    runner_up: RunnerUp | None = None
    size: int = 0
    sha256: str = ""
    layers: list[str] = field(default_factory=list)
    truncated: bool = False

    def to_json(self) -> dict[str, object]:
        """A plain dict (``json.dumps`` accepts it with ``allow_nan=False``)."""
        return {
            "kind": self.kind,
            "data": self.data,
            "notes": list(self.notes),
            "type_name": self.type_name,
            "score": self.score,
            "runner_up": self.runner_up.to_json() if self.runner_up else None,
            "size": self.size,
            "sha256": self.sha256,
            "layers": list(self.layers),
            "truncated": self.truncated,
        }
