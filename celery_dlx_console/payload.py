"""An obituary as the console shows it: ``dlx show --json`` plus views of the raw bytes (a
schema-less protobuf dump, a hex dump). Unsafe serializations are never loaded: the codecs show
them as opaque bytes."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping

from celery_dlx import Obituary
from celery_dlx.codecs import ProtobufRegistry
from celery_dlx.codecs.wire import dump, scan
from celery_dlx.ops.inspection import show_data
from celery_dlx.ops.render import dumps, iso

#: Bytes shown in the hex dump.
HEX_BYTES = 4096
#: Bytes scanned for the schema-less wire dump.
WIRE_BYTES = 65536


def hexdump(data: bytes, limit: int = HEX_BYTES) -> str:
    """``offset  hex bytes  ascii`` lines, 16 bytes each, of the first ``limit`` bytes."""
    lines = []
    for start in range(0, min(len(data), limit), 16):
        chunk = data[start : start + 16]
        hexes = " ".join(f"{b:02x}" for b in chunk)
        text = "".join(chr(b) if 32 <= b < 127 else "." for b in chunk)
        lines.append(f"{start:08x}  {hexes:<47}  {text}")
    if len(data) > limit:
        lines.append(f"... {len(data) - limit} more bytes")
    return "\n".join(lines)


def wire_view(data: bytes, layers: list[str]) -> str | None:
    """The schema-less protobuf dump of ``data`` (unwrapped from base64 when the codecs peeled
    that layer), or None when the bytes are not well-formed protobuf."""
    body = data[:WIRE_BYTES]
    if "base64" in layers:
        try:
            body = base64.b64decode(body.strip(), validate=False)
        except (binascii.Error, ValueError):
            return None
    if not body:
        return None
    found = scan(body)
    if not found.fields or found.error is not None:
        return None
    fields, cut = dump(found.fields)
    return dumps(fields) + ("\n(cut: more fields)" if cut or found.capped else "")


def obituary_view(
    ob: Obituary, registry: ProtobufRegistry | None, redirects: Mapping[int, str] | None = None
) -> dict[str, object]:
    """``show`` data plus ``views`` (pretty texts) and a ``timeline`` of attempts and replays;
    each replay has ``to_queue``: the queue it was redirected to (``redirects``, from the replay
    ledger), or None when it went back to the queue the message died in."""
    data = show_data(ob, registry)
    replays = data.get("replays")
    if isinstance(replays, list):
        for replay in replays:
            replay["to_queue"] = (redirects or {}).get(replay["at_ms"])
    shown = data["payload"]
    decoded = shown.get("decoded") if isinstance(shown, dict) else None
    payload = ob.payload or b""
    views: dict[str, str | None] = {"decoded": None, "args": None, "kwargs": None, "embedded": None}
    if decoded is not None:
        views["decoded"] = dumps(decoded["data"])
        inner = decoded["data"]
        if decoded["kind"] == "celery" and isinstance(inner, dict):
            views["args"] = dumps(inner.get("args"))
            views["kwargs"] = dumps(inner.get("kwargs"))
            if inner.get("decoded"):
                views["embedded"] = dumps(inner.get("decoded"))
    opaque = decoded is not None and decoded["kind"] == "opaque-unsafe"
    views["wire"] = None if opaque else wire_view(payload, decoded["layers"] if decoded else [])
    views["hex"] = hexdump(payload)
    moments = [(a.at_ms, a.fate, a.cause) for a in ob.attempts] + [
        (at, "replayed", f"to {redirects[at]}" if redirects and at in redirects else "")
        for at in ob.replays
    ]
    timeline = [
        {"at_ms": at, "at": iso(at), "fate": fate, "cause": cause}
        for at, fate, cause in sorted(moments, key=lambda m: m[0])
    ]
    data["views"] = views
    data["timeline"] = timeline
    data["opaque"] = opaque
    data["first_failure_at"] = data.get("first_failure_at") or iso(ob.first_failure_ms)
    return data
