"""State shared by the steps decoding one payload: what was declared, notes and layers so far."""

from __future__ import annotations

import codecs
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from celery_dlx.codecs.registry import ProtobufRegistry
from celery_dlx.compat.python import is_text_codec

#: Media types that declare JSON (besides any ``*/*+json``).
JSON_TYPES = frozenset({"application/json", "text/json", "application/x-json"})
#: Media types that declare protobuf (besides any ``*/*+proto`` or ``*/*+protobuf``).
PROTOBUF_TYPES = frozenset(
    {
        "application/x-protobuf",
        "application/protobuf",
        "application/vnd.google.protobuf",
        "application/x-google-protobuf",
        "application/octet-stream+protobuf",
    }
)
#: Media types of msgpack.
MSGPACK_TYPES = frozenset(
    {"application/x-msgpack", "application/msgpack", "application/vnd.msgpack"}
)
#: Content-type parameters that may name the protobuf type of the body.
TYPE_PARAMETERS = ("messagetype", "message_type", "proto", "type", "schema", "message")
# content_encoding values that say nothing beyond "bytes" or "UTF-8".
_PLAIN_ENCODINGS = frozenset({"", "binary", "utf-8", "utf8", "8bit", "7bit", "identity", "none"})


def media_type(content_type: object) -> tuple[str | None, dict[str, str]]:
    """The lower-cased media type of a content type and its parameters (lower-cased names)."""
    if isinstance(content_type, bytes):
        content_type = content_type.decode("latin-1")
    if not isinstance(content_type, str) or not content_type.strip():
        return None, {}
    head, *rest = content_type.split(";")
    params = {}
    for part in rest:
        name, _, value = part.partition("=")
        if name.strip():
            params[name.strip().lower()] = value.strip().strip('"')
    return head.strip().lower(), params


def header(headers: Mapping[str, object] | None, name: str) -> object:
    """``headers[name]``, or None when absent or when a foreign mapping fails on the lookup."""
    if not headers:
        return None
    try:
        return headers.get(name)
    except Exception:  # a broker client's mapping type may raise on odd keys: treat as absent
        return None


def charset_of(content_encoding: str | None) -> str | None:
    """A text encoding named by ``content_encoding`` other than UTF-8, else None."""
    name = (content_encoding or "").strip().lower()
    if name in _PLAIN_ENCODINGS:
        return None
    try:
        info = codecs.lookup(name)
    except (LookupError, ValueError):
        return None
    # Codecs such as "hex" or "rot13" are bytes/str transforms, not text encodings.
    return name if is_text_codec(info) else None


@dataclass
class Context:
    """One payload being decoded (``limit`` already clamped)."""

    media: str | None
    params: dict[str, str]
    headers: Mapping[str, object] | None
    registry: ProtobufRegistry | None
    limit: int
    charset: str | None = None
    notes: list[str] = field(default_factory=list)
    layers: list[str] = field(default_factory=list)
    truncated: bool = False
    #: Size of the bytes being decoded before the limit cut them (their own size if not cut).
    full_size: int = 0

    @property
    def declares_json(self) -> bool:
        media = self.media or ""
        return media in JSON_TYPES or media.endswith("+json")

    @property
    def declares_protobuf(self) -> bool:
        media = self.media or ""
        return media in PROTOBUF_TYPES or media.endswith(("+proto", "+protobuf"))

    @property
    def declares_msgpack(self) -> bool:
        return (self.media or "") in MSGPACK_TYPES

    @property
    def type_hint(self) -> str | None:
        """The protobuf type the content type names (``;messageType=pkg.Type``), if any."""
        if not self.declares_protobuf:
            return None
        for name in TYPE_PARAMETERS:
            if self.params.get(name):
                return self.params[name].lstrip(".")
        return None

    def child(self, layer: str) -> Context:
        """A context for bytes found inside this payload under ``layer`` (notes kept apart)."""
        # Base64 inside a declared protobuf body is protobuf too (and keeps a named type).
        keep = self.declares_protobuf
        return replace(
            self,
            media=self.media if keep else None,
            params=dict(self.params) if keep else {},
            charset=None,
            notes=[],
            layers=[*self.layers, layer],
        )

    def adopt(self, child: Context) -> None:
        """Keep what a child context learned, once its reading of the bytes is accepted."""
        self.notes.extend(child.notes)
        self.layers = child.layers
        self.truncated = self.truncated or child.truncated
