"""Bounded decompression: a body never expands past the decode limit (no decompression bombs)."""

from __future__ import annotations

import bz2
import lzma
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

#: Names (``content_encoding`` values and Kombu ``compression`` header values) of each format.
ALIASES = {
    **dict.fromkeys(("gzip", "x-gzip", "application/x-gzip", "application/gzip"), "zlib"),
    **dict.fromkeys(("zlib", "deflate", "application/zlib"), "zlib"),
    **dict.fromkeys(("bzip2", "bzip", "x-bzip2"), "bz2"),
    **dict.fromkeys(("application/x-bz2", "application/x-bzip2"), "bz2"),
    **dict.fromkeys(("lzma", "xz", "application/x-lzma", "application/x-xz"), "lzma"),
}
#: Compressions Kombu or HTTP know that this module cannot undo without extra packages.
UNSUPPORTED = frozenset({"br", "brotli", "application/x-brotli", "zstd", "application/zstd"})

GZIP_MAGIC = b"\x1f\x8b"
BZ2_MAGIC = b"BZh"
XZ_MAGIC = b"\xfd7zXZ\x00"


@dataclass(frozen=True)
class Inflated:
    """Result of a bounded decompression: ``data`` (at most ``cap`` bytes), ``capped`` (there
    was more), ``error`` (why decompression failed; then ``data`` is empty)."""

    data: bytes
    capped: bool = False
    error: str | None = None


def format_of(name: str) -> str | None:
    """The format (``zlib``, ``bz2``, ``lzma``) a content encoding or compression name means."""
    return ALIASES.get(name.strip().lower())


def sniff_format(data: bytes) -> str | None:
    """The compression format whose magic number starts ``data``, if any (not zlib: its one
    header byte ``x`` is too common a start for other data)."""
    if data.startswith(GZIP_MAGIC):
        return "zlib"
    if data.startswith(XZ_MAGIC):
        return "lzma"
    if data.startswith(BZ2_MAGIC) and len(data) > 10 and data[3:4].isdigit():
        return "bz2"
    return None


def inflate(data: bytes, fmt: str, cap: int) -> Inflated:
    """Decompress ``data`` in format ``fmt``, producing ``cap`` bytes at most; never raises (a
    corrupt stream gives an :class:`Inflated` with ``error`` set)."""
    try:
        if fmt == "zlib":
            return _zlib(data, cap)
        if fmt == "bz2":
            return _stream(lambda: bz2.BZ2Decompressor(), data, cap)
        if fmt == "lzma":
            return _stream(lambda: lzma.LZMADecompressor(), data, cap)
    except (OSError, EOFError, ValueError, zlib.error, lzma.LZMAError) as exc:
        return Inflated(b"", error=f"{type(exc).__name__}: {exc}")
    return Inflated(b"", error=f"unknown compression format {fmt!r}")


def _zlib(data: bytes, cap: int) -> Inflated:
    try:
        # wbits 47 accepts both zlib and gzip headers (Kombu's "gzip" is really zlib).
        return _stream(lambda: zlib.decompressobj(wbits=47), data, cap)
    except zlib.error:
        # Some producers send raw deflate under the name "deflate".
        return _stream(lambda: zlib.decompressobj(wbits=-15), data, cap)


def _stream(make: Callable[[], Any], data: bytes, cap: int) -> Inflated:
    """Run decompressors over ``data`` (several members, as gzip and xz allow) up to ``cap``."""
    out = bytearray()
    rest = data
    while rest:
        engine = make()
        out += engine.decompress(rest, cap - len(out) + 1)
        rest, ended = engine.unused_data, engine.eof
        if len(out) >= cap and not (ended and not rest):
            return Inflated(bytes(out[:cap]), capped=True)
        if not ended:
            raise ValueError("compressed data ends before the end of the stream")
        if not rest.strip(b"\x00"):
            break
    return Inflated(bytes(out))
