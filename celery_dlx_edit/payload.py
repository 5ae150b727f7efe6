"""Editing a decoded payload: paths, setting values, encoding back, and the diff.

Pure: no I/O, nothing found in a body is run. A payload is edited only when it was read exactly
(JSON, a Celery JSON message, protobuf of a registered type); anything else (pickle and other
unsafe serializations, compressed or wrapped bodies, text, bytes nothing decodes) is refused
with the reason, so nothing half-understood is ever published.

A path names one value:

- ``args.0``, ``kwargs.order_id``, ``embed.callbacks`` in a Celery task message (protocol 2 body
  ``[args, kwargs, embed]`` or the protocol 1 mapping);
- dotted keys in a JSON body (``order.lines.0.sku``; a list index is a number, ``-`` appends),
  or an RFC 6901 JSON pointer when it starts with ``/`` (``/order/a.b``, ``~1`` is ``/``);
- field names of the best-fitting protobuf type (``customer.name``, ``lines.0.qty``, a map's key).
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery_dlx.codecs.context import media_type
from celery_dlx.codecs.messages import message_data
from celery_dlx.codecs.registry import ProtobufRegistry
from celery_dlx.codecs.result import KIND_CELERY, KIND_JSON, KIND_PROTOBUF, Decoded
from celery_dlx.codecs.shapes import TYPE_BYTES, TYPE_ENUM, is_repeated
from celery_dlx.codecs.textual import unbase64
from celery_dlx.codecs.unsafe import unsafe_reason
from celery_dlx.errors import DLXError

if TYPE_CHECKING:  # protobuf is an extra
    from google.protobuf.message import Message


class _Absent:
    """The value of a key or field that is not there (a singleton: :data:`ABSENT`)."""

    def __repr__(self) -> str:
        return "<absent>"


#: A diff's value for a key that was not there (before) or was removed (after).
ABSENT: Any = _Absent()
#: The parts of a Celery message a path may start with.
CELERY_PARTS = ("args", "kwargs", "embed")
#: Path segment that appends to a list.
APPEND = "-"


class EditError(DLXError):
    """The edit cannot be made: the message says why and what to do instead."""


@dataclass(frozen=True)
class Change:
    """One edited value: where, what it was, what it becomes (JSON-safe; :data:`ABSENT`)."""

    path: str
    before: Any
    after: Any

    def to_json(self) -> dict[str, object]:
        """``path``, ``before`` and ``after`` (None when absent), ``before_absent`` and
        ``after_absent``."""
        return {
            "path": self.path,
            "before": None if self.before is ABSENT else self.before,
            "after": None if self.after is ABSENT else self.after,
            "before_absent": self.before is ABSENT,
            "after_absent": self.after is ABSENT,
        }


@dataclass
class EditedBody:
    """A body edited and encoded back: the new bytes and what changed in it."""

    kind: str
    body: bytes
    changes: list[Change] = field(default_factory=list)
    type_name: str | None = None


def parse_path(path: str) -> list[str]:
    """The segments of ``path``: a JSON pointer when it starts with ``/``, else dotted keys.

    Raises:
        EditError: an empty path or segment.
    """
    if not isinstance(path, str) or not path.strip():
        raise EditError("an edit needs a path (args.0, kwargs.order_id, a.b.c or /a/b)")
    if path.startswith("/"):
        parts = [p.replace("~1", "/").replace("~0", "~") for p in path[1:].split("/")]
    else:
        parts = path.split(".")
    if any(p == "" for p in parts):
        raise EditError(f"path {path!r} has an empty segment")
    return parts


def parse_assignment(text: str, option: str = "--set") -> tuple[str, Any]:
    """``PATH=JSON`` split at the first ``=``, the value parsed as JSON.

    Raises:
        EditError: no ``=``, or a value that is not JSON (a string needs its quotes).
    """
    path, sep, raw = text.partition("=")
    if not sep or not path.strip():
        raise EditError(f"{option} takes PATH=JSON, got {text!r}")
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise EditError(
            f"{option} {path}: the value must be JSON ({exc}); a string needs quotes, "
            f"e.g. {path}='\"text\"'"
        ) from None
    _check_finite(value, f"{option} {path}")
    return path.strip(), value


def _check_finite(value: Any, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise EditError(f"{where}: NaN and infinities cannot be sent as JSON")
    if isinstance(value, Mapping):
        for v in value.values():
            _check_finite(v, where)
    elif isinstance(value, list):
        for v in value:
            _check_finite(v, where)


def _index(parts: Sequence[str], i: int, size: int, path: str, *, appending: bool) -> int:
    seg = parts[i]
    if appending and seg == APPEND:
        return size
    try:
        index = int(seg)
    except ValueError:
        raise EditError(f"path {path!r}: {seg!r} is not a list index") from None
    if index < 0:
        index += size
    if not 0 <= index < size:
        raise EditError(f"path {path!r}: index {seg} is out of range (the list has {size} items)")
    return index


def set_json(root: Any, parts: Sequence[str], value: Any, path: str) -> Any:
    """Set ``value`` at ``parts`` inside ``root`` (in place) and return what was there
    (:data:`ABSENT` for a new key or an appended item); only the last key may be new.

    Raises:
        EditError: a missing key on the way, a bad index, or a path through a scalar.
    """
    node = root
    for i, seg in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(node, list):
            index = _index(parts, i, len(node), path, appending=last)
            if last:
                if index == len(node):
                    node.append(value)
                    return ABSENT
                before, node[index] = node[index], value
                return before
            node = node[index]
        elif isinstance(node, dict):
            if last:
                before = node.get(seg, ABSENT)
                node[seg] = value
                return before
            if seg not in node:
                raise EditError(f"path {path!r}: no key {seg!r} (only the last key may be new)")
            node = node[seg]
        else:
            where = ".".join(parts[:i]) or "the body"
            raise EditError(f"path {path!r}: {where} is {json.dumps(node)}, not a list or mapping")
    raise EditError(f"path {path!r} names nothing")  # pragma: no cover - parts is never empty


#: Wrappings an edit undoes and puts back (compression is not: it is refused).
BASE64_LAYERS = ("base64", "base64url")


@dataclass(frozen=True)
class Wrapping:
    """How a body is wrapped around what an edit changes: nothing, or base64 text."""

    alphabet: str | None = None
    padded: bool = True

    def wrap(self, inner: bytes) -> bytes:
        if self.alphabet is None:
            return inner
        out = base64.b64encode(inner, altchars=b"-_" if self.alphabet == "urlsafe" else None)
        return out if self.padded else out.rstrip(b"=")


def unwrap(body: bytes, decoded: Decoded) -> tuple[bytes, Wrapping]:
    """What an edit changes inside ``body`` (the bytes inside one base64 layer, or the body),
    and how to wrap the edited bytes back.

    Raises:
        EditError: any other wrapping (compression, base64 inside JSON text, several layers).
    """
    if not decoded.layers:
        return body, Wrapping()
    if len(decoded.layers) == 1 and decoded.layers[0] in BASE64_LAYERS:
        text = body.decode("latin-1")
        found = unbase64(text)
        if found is not None and not text.lstrip().startswith('"'):
            return found.data, Wrapping(found.alphabet, text.rstrip().endswith("="))
    return body, Wrapping()  # readable() refuses it


def readable(kind: str, decoded: Decoded) -> str | None:
    """Why a body of this decoding cannot be edited, or None when it can."""
    if decoded.layers and not (len(decoded.layers) == 1 and decoded.layers[0] in BASE64_LAYERS):
        return (
            f"the body is wrapped ({' + '.join(decoded.layers)}): only JSON, Celery JSON "
            "messages and protobuf bodies, plain or in base64, can be edited"
        )
    if decoded.truncated:
        return "the body is larger than the decode limit: it cannot be edited safely"
    if kind not in (KIND_JSON, KIND_CELERY, KIND_PROTOBUF):
        why = "; ".join(decoded.notes)
        return (
            f"a {kind} body cannot be edited (only JSON, Celery JSON messages and protobuf of a "
            f"registered type can){': ' + why if why else ''}"
        )
    return None


def refuse_unsafe(body: bytes, content_type: str | None) -> None:
    """Raise for pickle and other unsafe serializations (never loaded, never edited).

    Raises:
        EditError: the body or its content type is an unsafe serializer.
    """
    media, _ = media_type(content_type)
    reason = unsafe_reason(body, media)
    if reason is not None:
        raise EditError(
            f"not editable: pickle and other unsafe serializations are never loaded, so never "
            f"edited ({reason}); replay it unchanged, or fix the producer"
        )


def edit_json(
    body: bytes,
    kind: str,
    assignments: Sequence[tuple[str, Any]],
    headers: Mapping[str, object] | None,
    *,
    task_id: str | None = None,
) -> EditedBody:
    """A JSON or Celery JSON body with ``assignments`` applied, encoded back as UTF-8 JSON;
    ``task_id`` is the new task id of a Celery protocol 1 message (its id is in the body).

    Raises:
        EditError: the body is not JSON, or a path does not fit it.
    """
    try:
        root = json.loads(body)
    except ValueError as exc:
        raise EditError(f"the body is not JSON ({exc}): it cannot be edited") from None
    changes = []
    for path, value in assignments:
        parts = parse_path(path)
        if kind == KIND_CELERY:
            parts = _celery_parts(root, parts, path)
        before = set_json(root, parts, value, path)
        changes.append(Change(path, before, value))
    if kind == KIND_CELERY:
        check_celery_shape(root, headers)
        if task_id is not None and isinstance(root, dict):
            root["id"] = task_id
    encoded = json.dumps(root, ensure_ascii=False, allow_nan=False).encode("utf-8")
    return EditedBody(kind, encoded, changes)


def _celery_parts(root: Any, parts: list[str], path: str) -> list[str]:
    head = parts[0]
    if head not in CELERY_PARTS:
        raise EditError(
            f"path {path!r}: a Celery task message's paths start with args, kwargs or embed "
            "(args.0, kwargs.order_id)"
        )
    if len(parts) == 1:
        raise EditError(f"path {path!r}: name an argument (args.0, kwargs.NAME), not all of them")
    if isinstance(root, list):  # protocol 2: [args, kwargs, embed]
        if head == "embed" and root[2] is None:
            root[2] = {}
        return [str(CELERY_PARTS.index(head)), *parts[1:]]
    if isinstance(root, dict) and head == "embed":  # protocol 1 keeps them at the top level
        return parts[1:]
    return parts


def check_celery_shape(root: Any, headers: Mapping[str, object] | None) -> None:
    """Raise unless ``root`` still has a Celery message's shape (``headers`` are not read).

    Raises:
        EditError: protocol 2 not ``[list, mapping, mapping or null]``, or protocol 1 without
            a task name, a list of args and a mapping of kwargs.
    """
    if isinstance(root, list):
        ok = (
            len(root) == 3
            and isinstance(root[0], list)
            and isinstance(root[1], dict)
            and (root[2] is None or isinstance(root[2], dict))
        )
        if not ok:
            raise EditError(
                "a Celery protocol 2 body must stay [args (a list), kwargs (a mapping), embed]"
            )
        return
    if not (
        isinstance(root, dict)
        and isinstance(root.get("task"), str)
        and isinstance(root.get("args", []), list)
        and isinstance(root.get("kwargs", {}), dict)
    ):
        raise EditError(
            "a Celery protocol 1 body must keep task, args (a list), kwargs (a mapping)"
        )


def edit_protobuf(
    body: bytes,
    type_name: str,
    registry: ProtobufRegistry,
    assignments: Sequence[tuple[str, Any]],
) -> EditedBody:
    """A protobuf body parsed as ``type_name``, ``assignments`` set, serialized again (unknown
    fields kept).

    Raises:
        EditError: the type is not registered or does not parse the body, a path names no
            field, or a value does not fit the field's type.
    """
    message = parse_protobuf(body, type_name, registry)
    changes = []
    for path, value in assignments:
        before = set_field(message, parse_path(path), value, path)
        changes.append(Change(path, before, value))
    try:
        encoded = message.SerializeToString()
    except Exception as exc:  # EncodeError: a required field unset
        raise EditError(f"{type_name} cannot be encoded after the edit: {exc}") from None
    return EditedBody(KIND_PROTOBUF, encoded, changes, type_name)


def parse_protobuf(body: bytes, type_name: str, registry: ProtobufRegistry) -> Message:
    """``body`` parsed as ``type_name`` of ``registry``.

    Raises:
        EditError: the type is not registered or does not parse the body.
    """
    cls = registry.message_class(type_name)
    if cls is None:
        raise EditError(
            f"protobuf type {type_name} is not registered (dlx_protobuf_descriptor_sets)"
        )
    try:
        return cls.FromString(body)
    except Exception as exc:  # DecodeError and friends
        raise EditError(f"the body does not parse as {type_name}: {exc}") from None


def set_field(message: Message, parts: Sequence[str], value: Any, path: str) -> Any:
    """Set ``value`` at ``parts`` in a protobuf ``message`` (in place); return the field's value
    before, as :func:`~celery_dlx.codecs.messages.message_data` shows it.

    Raises:
        EditError: no such field, a bad index, or a value of the wrong type.
    """
    node: Any = message
    for i, seg in enumerate(parts):
        last = i == len(parts) - 1
        fd = node.DESCRIPTOR.fields_by_name.get(seg)
        if fd is None:
            names = ", ".join(sorted(node.DESCRIPTOR.fields_by_name))
            raise EditError(
                f"path {path!r}: {node.DESCRIPTOR.full_name} has no field {seg!r} (fields: {names})"
            )
        entry = fd.message_type
        if entry is not None and entry.GetOptions().map_entry:
            return _set_map(node, fd, parts, i, value, path)
        if is_repeated(fd):
            return _set_repeated(node, fd, parts, i, value, path)
        if last:
            before = _shown(node, fd)
            _assign(node, fd, value, path)
            return before
        if entry is None:
            raise EditError(f"path {path!r}: {seg} is a scalar field, it has no fields")
        node = getattr(node, seg)
    raise EditError(f"path {path!r} names nothing")  # pragma: no cover


def _shown(node: Any, fd: Any) -> Any:
    """A singular field's value as :func:`message_data` shows it (:data:`ABSENT`: unset)."""
    if fd.message_type is not None:
        if not node.HasField(fd.name):
            return ABSENT
    else:
        try:
            if not node.HasField(fd.name):
                return ABSENT
        except ValueError:  # proto3 scalars without presence: the default is a value
            if fd.name not in message_data(node):
                return _default(fd, getattr(node, fd.name))
    return message_data(node).get(fd.name, ABSENT)


def _default(fd: Any, value: Any) -> Any:
    if fd.type == TYPE_ENUM:
        known = fd.enum_type.values_by_number.get(value)
        return known.name if known is not None else value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def _set_repeated(node: Any, fd: Any, parts: Sequence[str], i: int, value: Any, path: str) -> Any:
    items = getattr(node, fd.name)
    before_all: Any = message_data(node).get(fd.name, [])
    if i == len(parts) - 1:
        if not isinstance(value, list):
            raise EditError(f"path {path!r}: {fd.name} is repeated: give a JSON list or an index")
        del items[:]
        for item in value:
            if fd.message_type is not None:
                _fill(items.add(), item, path)
            else:
                items.append(_scalar(fd, item, path))
        return before_all
    index = _index(parts, i + 1, len(items), path, appending=i + 1 == len(parts) - 1)
    rest = parts[i + 2 :]
    if fd.message_type is not None:
        if index == len(items):
            target, before = items.add(), ABSENT
        else:
            target, before = items[index], message_data(items[index])
        if rest:
            return set_field(target, rest, value, path)
        _fill(target, value, path)
        return before
    if rest:
        raise EditError(f"path {path!r}: {fd.name}[{index}] is a scalar, it has no fields")
    converted = _scalar(fd, value, path)
    if index == len(items):
        items.append(converted)
        return ABSENT
    before_item = before_all[index] if index < len(before_all) else ABSENT
    items[index] = converted
    return before_item


def _set_map(node: Any, fd: Any, parts: Sequence[str], i: int, value: Any, path: str) -> Any:
    mapping = getattr(node, fd.name)
    key_fd = fd.message_type.fields_by_name["key"]
    value_fd = fd.message_type.fields_by_name["value"]
    before_all = message_data(node).get(fd.name, {})
    if i == len(parts) - 1:
        raise EditError(f"path {path!r}: name a key of the map {fd.name} ({fd.name}.KEY)")
    key = _scalar(key_fd, parts[i + 1], path) if key_fd.type != 9 else parts[i + 1]
    rest = parts[i + 2 :]
    before = before_all.get(str(key), ABSENT) if isinstance(before_all, dict) else ABSENT
    if value_fd.message_type is not None:
        if rest:
            return set_field(mapping[key], rest, value, path)
        _fill(mapping[key], value, path)
        return before
    if rest:
        raise EditError(f"path {path!r}: the values of {fd.name} are scalars, with no fields")
    mapping[key] = _scalar(value_fd, value, path)
    return before


def _assign(node: Any, fd: Any, value: Any, path: str) -> None:
    if value is None:
        node.ClearField(fd.name)
    elif fd.message_type is not None:
        _fill(getattr(node, fd.name), value, path)
    else:
        setattr(node, fd.name, _scalar(fd, value, path))


def _fill(message: Any, value: Any, path: str) -> None:
    """Replace a whole nested message with a JSON object (the canonical protobuf JSON mapping)."""
    from google.protobuf import json_format

    if not isinstance(value, dict):
        raise EditError(f"path {path!r}: {message.DESCRIPTOR.full_name} needs a JSON object")
    message.Clear()
    try:
        json_format.ParseDict(value, message)
    except json_format.ParseError as exc:
        raise EditError(f"path {path!r}: {exc}") from None


def _scalar(fd: Any, value: Any, path: str) -> Any:
    kind = fd.cpp_type
    # cpp types: 1 int32, 2 int64, 3 uint32, 4 uint64, 5 double, 6 float, 7 bool, 8 enum, 9 string
    if fd.type == TYPE_ENUM:
        if isinstance(value, str):
            known = fd.enum_type.values_by_name.get(value)
            if known is None:
                names = ", ".join(fd.enum_type.values_by_name)
                raise EditError(
                    f"path {path!r}: {value!r} is not a value of {fd.enum_type.full_name} ({names})"
                )
            return known.number
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind in (1, 2, 3, 4):
        if isinstance(value, str) and value.lstrip("-").isdigit():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif kind in (5, 6):
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif kind == 7:
        if isinstance(value, bool):
            return value
    elif fd.type == TYPE_BYTES:
        if isinstance(value, str):
            return value.encode("utf-8")
    elif kind == 9 and isinstance(value, str):
        return value
    raise EditError(
        f"path {path!r}: {json.dumps(value)} does not fit field {fd.name} ({_type_name(fd)})"
    )


_CPP_TYPES: dict[int, str] = {
    1: "int32",
    2: "int64",
    3: "uint32",
    4: "uint64",
    5: "double",
    6: "float",
    7: "bool",
    9: "string",
}


def _type_name(fd: Any) -> str:
    if fd.type == TYPE_ENUM:
        return f"enum {fd.enum_type.full_name}"
    if fd.type == TYPE_BYTES:
        return "bytes (give text)"
    return _CPP_TYPES.get(fd.cpp_type, "message")


def diff_lines(changes: Sequence[Change], headers: Sequence[Change] = ()) -> list[str]:
    """The diff as text lines: a before/after pair per changed path and header."""
    out = []
    for label, items in (("payload", changes), ("header", headers)):
        for c in items:
            out.append(f"{label} {c.path}:")
            out.append(f"  - {_dump(c.before)}")
            out.append(f"  + {_dump(c.after)}")
    return out


def _dump(value: Any) -> str:
    if value is ABSENT:
        return repr(ABSENT)
    return json.dumps(value, ensure_ascii=False, default=str)
