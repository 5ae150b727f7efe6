"""Recognising payloads of unsafe serializers, which are shown as opaque bytes and never loaded.

Loading a pickle (or a Java serialized object, or YAML with Python tags) runs code chosen by
whoever wrote the message. Nothing here loads anything: pickles are only walked opcode by opcode
with :mod:`pickletools` (a disassembler that imports and calls nothing) to name the globals a
pickle would import, which tells an operator what the payload is without running it.
"""

from __future__ import annotations

import pickletools
import re

#: Content types of serializers that can run code when loaded.
UNSAFE_CONTENT_TYPES = frozenset(
    {
        "application/x-python-serialize",
        "application/x-pickle",
        "application/python-pickle",
        "application/pickle",
        "application/x-java-serialized-object",
        "application/x-php-serialized",
        "application/x-marshal",
    }
)
#: Content types of YAML, which is unsafe only with language-specific tags.
YAML_CONTENT_TYPES = frozenset(
    {"application/x-yaml", "application/yaml", "text/yaml", "text/x-yaml"}
)

JAVA_MAGIC = b"\xac\xed\x00\x05"
_YAML_CODE_TAG = re.compile(rb"!!?python/|!!?ruby/|!!?java|!!?perl/|!!?php/")
# Pickle opcodes a protocol 0 or 1 pickle can start with (MARK, GLOBAL, EMPTY_* , INT, STRING...).
_PICKLE_V0_START = frozenset(b"(c]})NIJKLSVXFUTGi")
_STRING_OPS = frozenset({"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING"})
#: Opcodes walked before deciding; a body this complex that still parses is a pickle.
_MAX_OPS = 50_000
_MAX_GLOBALS = 20


def unsafe_reason(data: bytes, content_type: str | None) -> str | None:
    """Why ``data`` must not be decoded (a note for the operator), or None when it may be; the
    bytes are checked besides the declared content type, since a producer can lie."""
    if content_type in UNSAFE_CONTENT_TYPES:
        return (
            f"content type {content_type} is an unsafe serializer: "
            "shown as opaque bytes, never loaded"
        )
    if data.startswith(JAVA_MAGIC):
        return "body is a Java serialized object: shown as opaque bytes, never loaded"
    protocol = pickle_protocol(data)
    if protocol is not None:
        said = f" although the content type says {content_type}" if content_type else ""
        return f"body is a pickle (protocol {protocol}){said}: shown as opaque bytes, never loaded"
    if content_type in YAML_CONTENT_TYPES and _YAML_CODE_TAG.search(data):
        return "body is YAML with language tags (code on load): shown as opaque bytes, never loaded"
    return None


def pickle_protocol(data: bytes) -> int | None:
    """The pickle protocol of ``data`` when it is a pickle, else None: protocol 2 and later start
    with PROTO (``0x80``, the protocol number), older ones disassemble whole, ending in STOP."""
    if len(data) >= 2 and data[0] == 0x80 and 2 <= data[1] <= 5:
        # PROTO is all a pickle needs to be dangerous to load; a cut body is still a pickle.
        return data[1]
    if data[:1] and data[0] in _PICKLE_V0_START and data.endswith(b".") and _disassembles(data):
        return 0
    return None


def _disassembles(data: bytes) -> bool:
    end = -1
    try:
        for count, (_op, _arg, pos) in enumerate(pickletools.genops(data)):
            end = pos if pos is not None else end
            if count > _MAX_OPS:
                return True
    except Exception:  # genops raises ValueError and friends on anything that is not a pickle
        return False
    return end == len(data) - 1


def pickle_globals(data: bytes) -> list[str]:
    """``module.name`` of every global a pickle would import when loaded (not imported here)."""
    found: list[str] = []
    recent: list[str] = []
    try:
        for count, (op, arg, _pos) in enumerate(pickletools.genops(data)):
            if count > _MAX_OPS or len(found) >= _MAX_GLOBALS:
                break
            name = None
            if op.name in {"GLOBAL", "INST"} and isinstance(arg, str):
                name = arg.replace(" ", ".", 1)
            elif op.name in _STRING_OPS and isinstance(arg, str):
                recent = [*recent[-1:], arg]
            elif op.name == "STACK_GLOBAL" and len(recent) == 2:
                # Usually the two strings pushed just before; memo lookups can hide them.
                name = f"{recent[0]}.{recent[1]}"
            if name is not None and name not in found:
                found.append(name)
    except Exception:  # a cut or corrupt pickle: keep what was read before the damage
        pass
    return found
