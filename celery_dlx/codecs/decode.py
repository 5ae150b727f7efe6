"""``decode_payload``: any message body shown as JSON-safe data, without running anything in it."""

from __future__ import annotations

import hashlib
import importlib
import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from celery_dlx.codecs import protobuf_view
from celery_dlx.codecs.celery_body import celery_view, header_task, header_text
from celery_dlx.codecs.compression import UNSUPPORTED, format_of, inflate, sniff_format
from celery_dlx.codecs.context import Context, charset_of, header, media_type
from celery_dlx.codecs.jsonsafe import is_printable, opaque_view, printable_text, prune
from celery_dlx.codecs.limits import DEFAULT_LIMIT, MAX_EMBEDDED, MAX_LAYERS, MIN_LIMIT
from celery_dlx.codecs.registry import ProtobufRegistry
from celery_dlx.codecs.result import (
    KIND_BINARY,
    KIND_CELERY,
    KIND_EMPTY,
    KIND_JSON,
    KIND_MSGPACK,
    KIND_OPAQUE_UNSAFE,
    KIND_PROTOBUF,
    KIND_PROTOBUF_WIRE,
    KIND_TEXT,
    Decoded,
)
from celery_dlx.codecs.textual import looks_like_json, parse_json, unbase64
from celery_dlx.codecs.unsafe import pickle_globals, pickle_protocol, unsafe_reason
from celery_dlx.codecs.wire import scan

logger = logging.getLogger(__name__)

#: What base64 found inside a body may turn out to be for the base64 reading to be believed.
_BELIEVED_INSIDE_BASE64 = frozenset(
    {KIND_PROTOBUF, KIND_JSON, KIND_CELERY, KIND_MSGPACK, KIND_OPAQUE_UNSAFE}
)


def decode_payload(
    body: bytes,
    *,
    content_type: str | None = None,
    content_encoding: str | None = None,
    headers: Mapping[str, object] | None = None,
    registry: ProtobufRegistry | None = None,
    limit: int = DEFAULT_LIMIT,
) -> Decoded:
    """Show a message body as JSON-safe data, for people inspecting dead messages; never raises.

    Pure: reads nothing but ``body`` and runs nothing found in it. Pickles and other unsafe
    serializations are shown as opaque bytes, whatever the content type claims.

    Args:
        body: the message body as received (``str`` is taken as UTF-8).
        content_type: may be wrong: the bytes are checked.
        content_encoding: compression (gzip, zlib, bzip2, xz), ``base64``, or a charset.
        headers: Celery's ``task`` and ``id``, Kombu's ``compression`` are read.
        registry: protobuf types to try on protobuf bodies.
        limit: bytes of body decoded at most (after decompression), and roughly the characters of
            data returned; larger bodies are decoded in part, with a note.
    """
    raw = _as_bytes(body)
    try:
        decoded = _decode(raw, content_type, content_encoding, headers, registry, limit)
    except Exception as exc:  # inspection must never break its caller; the bytes stay visible
        logger.exception("celery_dlx.codecs could not decode a %d-byte body", len(raw))
        decoded = Decoded(
            KIND_BINARY,
            opaque_view(raw),
            [f"internal error while decoding ({type(exc).__name__}): shown as opaque bytes"],
        )
    return replace(decoded, size=len(raw), sha256=hashlib.sha256(raw).hexdigest())


def _as_bytes(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, str):
        return body.encode("utf-8", errors="surrogatepass")
    return b"" if body is None else repr(body).encode("utf-8", errors="replace")


def _decode(
    raw: bytes,
    content_type: Any,
    content_encoding: Any,
    headers: Mapping[str, object] | None,
    registry: ProtobufRegistry | None,
    limit: int,
) -> Decoded:
    media, params = media_type(content_type)
    encoding = content_encoding if isinstance(content_encoding, str) else None
    ctx = Context(
        media=media,
        params=params,
        headers=headers if isinstance(headers, Mapping) else None,
        registry=registry,
        limit=max(limit, MIN_LIMIT) if isinstance(limit, int) else DEFAULT_LIMIT,
        charset=charset_of(encoding),
    )
    data = _declared_layers(raw, encoding, ctx)
    data = _cap(_sniffed_layers(data, ctx), ctx)
    reading = _interpret(data, ctx, 0)
    shown, cut = prune(reading.data, ctx.limit)
    if cut:
        ctx.truncated = True
        ctx.notes.append(f"data cut to about {ctx.limit} characters (the decode limit)")
    return replace(reading, data=shown, notes=ctx.notes, layers=ctx.layers, truncated=ctx.truncated)


def _declared_layers(data: bytes, encoding: str | None, ctx: Context) -> bytes:
    """Undo the compression or base64 the content encoding and Kombu's header declare."""
    compression = header(ctx.headers, "compression")
    if isinstance(compression, bytes):
        compression = compression.decode("latin-1")
    for name in (compression, encoding):
        if not isinstance(name, str) or not name.strip():
            continue
        fmt = format_of(name)
        if fmt is not None:
            data = _inflate(data, fmt, name, ctx, declared=True)
        elif name.strip().lower() in UNSUPPORTED:
            ctx.notes.append(f"compression {name!r} is not supported: shown as received")
        elif name.strip().lower() == "base64":
            found = unbase64(data.decode("latin-1"))
            if found is None:
                ctx.notes.append(
                    "content_encoding says base64 but the body is not base64: shown as received"
                )
            else:
                ctx.layers.append("base64")
                data = found.data
    return data


def _sniffed_layers(data: bytes, ctx: Context) -> bytes:
    """Undo compression recognised by its magic number (a producer forgot to declare it)."""
    for _ in range(MAX_LAYERS):
        fmt = sniff_format(data)
        if fmt is None:
            break
        inflated = _inflate(data, fmt, fmt, ctx, declared=False)
        if inflated is data:
            break
        data = inflated
    return data


def _inflate(data: bytes, fmt: str, name: str, ctx: Context, *, declared: bool) -> bytes:
    result = inflate(data, fmt, ctx.limit)
    if result.error is not None:
        if declared:
            ctx.notes.append(
                f"compression {name!r} declared but the body does not decompress "
                f"({result.error}): decoded as received"
            )
        return data
    ctx.layers.append(fmt if declared else f"{fmt} (undeclared)")
    if result.capped:
        ctx.truncated = True
        ctx.notes.append(
            f"{fmt} data expands past the decode limit ({ctx.limit} bytes from {len(data)} "
            "compressed): decompression stopped there (possible decompression bomb)"
        )
    return result.data


def _cap(data: bytes, ctx: Context) -> bytes:
    # Decompression stopped at the limit has no known full size: any cut field is plausible.
    ctx.full_size = len(data) if not ctx.truncated else 1 << 62
    if len(data) <= ctx.limit:
        return data
    ctx.truncated = True
    ctx.notes.append(
        f"body is {len(data)} bytes, more than the decode limit ({ctx.limit}): "
        f"only the first {ctx.limit} bytes are decoded"
    )
    return data[: ctx.limit]


def _interpret(data: bytes, ctx: Context, depth: int) -> Decoded:
    """Read bytes (any wrapping already undone) as the most specific thing they turn out to be."""
    if not data:
        return Decoded(KIND_EMPTY, None)
    reason = unsafe_reason(data, ctx.media)
    if reason is not None:
        ctx.notes.append(reason)
        return Decoded(KIND_OPAQUE_UNSAFE, _opaque(data, ctx))
    structured = _structured(data, ctx, depth)
    if structured is not None:
        return structured
    text = _text(data, ctx)
    if text is not None:
        return _from_text(text, data, ctx, depth)
    return _from_binary(data, ctx)


def _opaque(data: bytes, ctx: Context) -> dict[str, object]:
    view = opaque_view(data)
    if pickle_protocol(data) is not None:
        view["pickle_globals"] = pickle_globals(data)
    task = header_task(ctx.headers)
    if task is not None:
        view["task"] = task
        view["id"] = header_text(header(ctx.headers, "id"))
    return view


def _structured(data: bytes, ctx: Context, depth: int) -> Decoded | None:
    """JSON or msgpack, when the bytes are that."""
    if ctx.declares_msgpack:
        return _msgpack(data, ctx, depth)
    if not looks_like_json(data, declared=ctx.declares_json):
        if ctx.declares_json:
            ctx.notes.append("the content type says JSON but the body is not JSON")
        return None
    if ctx.truncated:
        ctx.notes.append("JSON cut at the decode limit cannot be parsed: shown as text")
        return None
    parsed = parse_json(data)
    if parsed.error is None:
        return _from_value(parsed.value, KIND_JSON, ctx, depth)
    if ctx.declares_json:
        ctx.notes.append(f"the content type says JSON but the body is not JSON ({parsed.error})")
    return None


def _msgpack(data: bytes, ctx: Context, depth: int) -> Decoded | None:
    try:
        msgpack = importlib.import_module("msgpack")
    except ImportError:
        ctx.notes.append("msgpack body: `pip install msgpack` to decode it")
        return None
    try:
        value = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:  # msgpack raises several unrelated types on bad input
        ctx.notes.append(
            f"the content type says msgpack but the body is not ({type(exc).__name__})"
        )
        return None
    return _from_value(value, KIND_MSGPACK, ctx, depth)


def _from_value(value: Any, kind: str, ctx: Context, depth: int) -> Decoded:
    view, note = celery_view(value, ctx.headers)
    if note is not None:
        ctx.notes.append(note)
    if view is not None:
        _embedded(view, ctx)
        return Decoded(KIND_CELERY, view)
    if isinstance(value, str):
        inner = _inside_base64(value, ctx, depth, strong_only=True)
        if inner is not None:
            ctx.notes.append("the body is a JSON string holding base64")
            return inner
    return Decoded(kind, value)


def _embedded(view: dict[str, Any], ctx: Context) -> None:
    """Decode task arguments holding base64 protobuf of a registered type, next to the originals."""
    if not ctx.registry or not isinstance(view.get("args"), list):
        return
    named = [(f"args[{i}]", v) for i, v in enumerate(view["args"][:MAX_EMBEDDED])]
    if isinstance(view.get("kwargs"), Mapping):
        named += [(f"kwargs[{k!r}]", v) for k, v in list(view["kwargs"].items())[:MAX_EMBEDDED]]
    decoded = {}
    for name, value in named:
        found = unbase64(value) if isinstance(value, str) else None
        if found is None or not found.strong:
            continue
        reading = protobuf_view.typed(found.data, ctx.child("base64"))
        if reading is not None:
            decoded[name] = {
                "type_name": reading.type_name,
                "score": reading.score,
                "data": reading.data,
            }
    if decoded:
        view["decoded"] = decoded
        ctx.notes.append(f"{', '.join(decoded)}: base64 protobuf, decoded under data.decoded")


def _text(data: bytes, ctx: Context) -> str | None:
    text = printable_text(data, partial=ctx.truncated)
    if text is not None or ctx.charset is None:
        return text
    try:
        text = data.decode(ctx.charset)
    except Exception:  # UnicodeError, or codec-specific errors of exotic charsets
        return None
    if not is_printable(text):
        return None
    ctx.notes.append(f"decoded as {ctx.charset} (content_encoding)")
    return text


def _from_text(text: str, data: bytes, ctx: Context, depth: int) -> Decoded:
    declared = ctx.declares_protobuf
    inner = _inside_base64(text, ctx, depth, strong_only=not declared)
    if inner is not None:
        return inner
    if declared:
        proto = protobuf_view.typed(data, ctx) or protobuf_view.wire(data, ctx, declared=True)
        if proto is not None:
            return proto
    return Decoded(KIND_TEXT, text)


def _inside_base64(text: str, ctx: Context, depth: int, *, strong_only: bool) -> Decoded | None:
    """What ``text`` holds when it is base64, if that reading is convincing; else None."""
    if depth >= MAX_LAYERS:
        return None
    found = unbase64(text, partial=ctx.truncated)
    if found is None or (strong_only and not found.strong):
        return None
    child = ctx.child("base64" if found.alphabet == "standard" else "base64url")
    data = _sniffed_layers(found.data, child)
    reading = _interpret(data, child, depth + 1)
    believed = (
        reading.kind in _BELIEVED_INSIDE_BASE64
        or (reading.kind == KIND_PROTOBUF_WIRE and (found.strong or ctx.declares_protobuf))
        or (reading.kind == KIND_TEXT and found.strong)
    )
    if not believed:
        return None
    ctx.adopt(child)
    return reading


def _from_binary(data: bytes, ctx: Context) -> Decoded:
    declared = ctx.declares_protobuf
    scanned = scan(data)
    reading = protobuf_view.typed(data, ctx, scanned) or protobuf_view.wire(
        data, ctx, declared=declared, scanned=scanned
    )
    if reading is not None:
        return reading
    if not declared:
        why = f" (as protobuf: {scanned.error})" if scanned.error else ""
        ctx.notes.append(f"not JSON, text or protobuf{why}: shown as opaque bytes")
    return Decoded(KIND_BINARY, opaque_view(data))
