"""The one JSON codec of stored records (parked retries, obituaries): header values JSON cannot
hold are *tagged* as one-key objects: ``{"__bytes__": "00ff"}`` (hex), ``{"__datetime__": ISO}``
(a date too: its text has no time part), ``{"__decimal__": "12.50"}``, and ``{"__repr__": ...}``
for anything else (comes back as that text). A table of user data with a tag-shaped key is
*escaped* (each such key prefixed with :data:`ESCAPED`, the table marked ``"__escaped__": 1``), so
user data never passes for a tag. Mapping keys become text; tuples become lists.

:func:`dumps` and :func:`loads` are the fast paths (tagging inside json's C loop);
:func:`to_jsonable` and :func:`from_jsonable` give and read the same form as data.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import date, datetime
from decimal import Decimal, InvalidOperation

#: Keys of the tags; a table of user data using one is escaped so it never reads as a tag.
TAG_KEYS = ("__bytes__", "__datetime__", "__decimal__", "__repr__")
#: Marks a table whose keys were escaped, and prefixes each escaped key.
ESCAPED = "__escaped__"
#: Longest ``repr`` kept for a value of an unknown type.
REPR_LIMIT = 1000
#: Length of a date's ISO text (``YYYY-MM-DD``); a datetime's is always longer.
_DATE_TEXT = 10

_COMPACT = (",", ":")


def tag(value: object) -> dict[str, str]:
    """The tag of a scalar JSON cannot hold (bytes, datetime, date, Decimal; else its repr)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__bytes__": bytes(value).hex()}
    if isinstance(value, (datetime, date)):
        return {"__datetime__": value.isoformat()}
    if isinstance(value, Decimal):
        return {"__decimal__": str(value)}
    return {"__repr__": repr(value)[:REPR_LIMIT]}


def to_jsonable(value: object) -> object:
    """``value`` as JSON-safe data: non-JSON scalars tagged, tag-shaped keys escaped."""
    if isinstance(value, Mapping):
        return _escaped({str(k): to_jsonable(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return tag(value)


def untag(obj: dict[str, object]) -> object:
    """One decoded JSON object back to its value (a tag's, an unescaped table, or ``obj``): a
    ``json.loads`` ``object_hook``.

    Raises:
        ValueError: a bytes or datetime tag whose text is not hex or ISO (the record is broken).
    """
    if len(obj) == 1:
        (key, inner), *_ = obj.items()
        if key == "__repr__":
            return inner
        if isinstance(inner, str):
            if key == "__bytes__":
                return bytes.fromhex(inner)
            if key == "__datetime__":
                if len(inner) == _DATE_TEXT:
                    return date.fromisoformat(inner)
                return datetime.fromisoformat(inner)
            if key == "__decimal__":
                try:
                    return Decimal(inner)
                except InvalidOperation:  # a table the parking store wrote before it knew decimals
                    return obj
    elif ESCAPED in obj:
        cut = len(ESCAPED)
        return {
            (k[cut:] if k.startswith(ESCAPED) else k): v for k, v in obj.items() if k != ESCAPED
        }
    return obj


def from_jsonable(value: object) -> object:
    """Undo :func:`to_jsonable` on data already parsed from JSON (``__repr__`` values stay text)."""
    if isinstance(value, dict):
        return untag({k: from_jsonable(v) for k, v in value.items()})
    if isinstance(value, list):
        return [from_jsonable(v) for v in value]
    return value


#: Tags made by the running :func:`dumps` of each thread.
_tags = threading.local()


def _tag_counted(value: object) -> object:
    """The encoder's ``default``: tags (and counts) a value JSON cannot hold."""
    if isinstance(value, Mapping):
        raise TypeError("a non-dict mapping: the slow path walks it")
    _tags.count += 1
    return tag(value)


_encode = json.JSONEncoder(separators=_COMPACT, default=_tag_counted).encode


def dumps(doc: Mapping[str, object]) -> str:
    """``doc`` as compact JSON text in the tagged form (what ``json.dumps(to_jsonable(doc))``
    gives); a tag-shaped or non-text key, or a non-dict mapping, takes that slow, total path.

    Counted gain (a speed trick stays where it saves 5% of its path): the stored JSON of a P6
    dead letter (its obituary or parked entry, ``benchmarks/tricks_cpu.py --part write``) takes
    290,674 instructions with this encoder and 538,132 with ``json.dumps(to_jsonable(doc))``
    (commit 0c23bad against d3d96ef); a whole dead letter in a DLX service process
    (``benchmarks/p6_cpu.py --instructions 300,1300``) 962,509 against 1,220,262: 21% of
    it. ``to_jsonable`` walks every value in Python, the encoder only the few it must tag.
    """
    _tags.count = 0
    try:
        text = _encode(doc)
    except (TypeError, ValueError):  # e.g. a tuple key deep in a header table
        return json.dumps(to_jsonable(doc), separators=_COMPACT)
    if _tag_keys_in_data(text, _tags.count):
        return json.dumps(to_jsonable(doc), separators=_COMPACT)  # escapes those tables
    return text


def loads(text: str | bytes) -> object:
    """Parse JSON written by :func:`dumps` (or an older codec), tags decoded.

    Raises:
        ValueError: the text is not JSON, or a tag's text is broken.
    """
    return json.loads(text, object_hook=untag)


def _needs_escape(key: str) -> bool:
    return key in TAG_KEYS or key.startswith(ESCAPED)


def _escaped(table: dict[str, object]) -> dict[str, object]:
    if not any(_needs_escape(k) for k in table):
        return table
    out = {(ESCAPED + k if _needs_escape(k) else k): v for k, v in table.items()}
    out[ESCAPED] = 1
    return out


def _tag_keys_in_data(text: str, tags: int) -> bool:
    """Whether JSON ``text``, in which ``tags`` values were tagged, uses a tag's key elsewhere."""
    if '"__' not in text:  # one scan settles the common case
        return False
    found = sum(text.count(f'"{key}":') for key in TAG_KEYS)
    return found > tags or f'"{ESCAPED}' in text
