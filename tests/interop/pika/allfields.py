"""Every field type pika writes, and a typed view of every header it reads (issue 21).

    python allfields.py publish-all <amqp-url> <omit> <queue>...
        publish one message "pika-all" to each queue, its headers using every field type pika
        writes, with boundary values (omit is accepted for symmetry: every client reads them)
    python allfields.py consume-typed <amqp-url> <queue>...
        reject every delivery (requeue=false), printing per delivery a JSON line
        {"queue", "message_id", "redelivered", "headers"} where headers maps each name to a cell
        {"type": "<tag>/<Python type>", "value": <canonical value>}, recursing into tables and
        arrays

pika 1.4 (``pika/data.py``) writes S (str), x (bytes), t (bool), I (int within 32 bits), l (int
beyond, or ``pika.compat.long``), D (Decimal, normalized first: ``Decimal("1.50")`` goes out as
scale 1), T (datetime, unsigned: nothing before 1970), F (dict), A (list), V (None). It cannot
write b B s u i f d: no float of any width. It reads every tag RabbitMQ knows, but decodes f and
d with ``long(...)``, dropping the fraction (``1.5`` reads as ``1``), so a cell of those tags also
carries the value's wire bytes; and a T beyond datetime's range raises in its frame decoder.

pika decodes b B s u I i to ``int`` and S x to ``str``/``bytes``: the tag of each value is read
from the header table's bytes (``tags`` below); the values are pika's own decoding.
"""

from __future__ import annotations

import datetime
import decimal
import json
import struct
import sys
from typing import Any

import pika
import pika.data
from pika.compat import long

UTC = datetime.timezone.utc


def all_headers() -> dict[str, Any]:
    return {
        "pika.bool.true": True,
        "pika.bool.false": False,
        "pika.int.int32-min": -(2**31),
        "pika.int.int32-max": 2**31 - 1,
        "pika.int.zero": 0,
        "pika.int.int64-min": -(2**63),
        "pika.int.int64-max": 2**63 - 1,
        "pika.int.beyond-32": 2**31,
        "pika.long.small": long(7),
        "pika.decimal.cents": decimal.Decimal("123.45"),
        "pika.decimal.trailing": decimal.Decimal("1.50"),
        "pika.decimal.negative": decimal.Decimal("-0.001"),
        "pika.decimal.exponent": decimal.Decimal("1E+3"),
        "pika.decimal.max": decimal.Decimal("2.147483647"),
        "pika.datetime.2023": datetime.datetime.fromtimestamp(1_700_000_000, UTC),
        "pika.datetime.epoch": datetime.datetime.fromtimestamp(0, UTC),
        "pika.str.empty": "",
        "pika.str.utf8": "naïve café 日本語 🐍",
        "pika.bytes.empty": b"",
        "pika.bytes.binary": b"\xff\x00\x80\xfe\x01\xc3",
        "pika.none": None,
        "pika.list.empty": [],
        "pika.dict.empty": {},
        "pika.ключ.naïve": "a header name that is not ASCII",
        "pika.list.mixed": [
            -1,
            2**40,
            decimal.Decimal("1.234"),
            "s",
            b"\xff\x00",
            True,
            None,
            datetime.datetime.fromtimestamp(86_400, UTC),
            {"k": 2, "bytes": b"\x80"},
            [],
            [[long(-1), "deep"]],
        ],
        "pika.dict.nested": {
            "int": -5,
            "bytes": b"\x00\xff",
            "deep": {
                "dec": decimal.Decimal("0.5"),
                "arr": [1, "x"],
                "ts": datetime.datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC),
            },
            "empty": {},
            "ключ": -(2**63),
        },
    }


def publish_all(url: str, queues: list[str]) -> None:
    conn = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = conn.channel()
        channel.confirm_delivery()
        props = pika.BasicProperties(
            message_id="pika-all",
            content_type="application/json",
            delivery_mode=2,
            headers=all_headers(),
        )
        for queue in queues:
            channel.basic_publish("", queue, b'{"publisher": "pika"}', props)
    finally:
        conn.close()


# -- the tags of a header table, from its bytes -------------------------------------------------

FIXED = {"t": 1, "b": 1, "B": 1, "s": 2, "u": 2, "U": 2, "I": 4, "i": 4, "l": 8, "L": 8}
FIXED.update({"f": 4, "d": 8, "D": 5, "T": 8, "V": 0})

#: A tag node: ``(tag, wire bytes)`` of a scalar, ``(tag, children)`` of a table or array.
Node = tuple[str, Any]


def tag_at(data: bytes, offset: int) -> tuple[Node, int]:
    tag = chr(data[offset])
    offset += 1
    if tag in FIXED:
        end = offset + FIXED[tag]
        return (tag, data[offset:end]), end
    (length,) = struct.unpack_from(">I", data, offset)
    body, end = data[offset + 4 : offset + 4 + length], offset + 4 + length
    if tag in "Sx":
        return (tag, body), end
    if tag == "F":
        return (tag, field_tags(body)), end
    if tag == "A":
        return (tag, item_tags(body)), end
    raise ValueError(f"unknown field tag {tag!r}")


def field_tags(body: bytes) -> dict[str, Node]:
    out, offset = {}, 0
    while offset < len(body):
        length = body[offset]
        key = body[offset + 1 : offset + 1 + length].decode("utf-8", "replace")
        out[key], offset = tag_at(body, offset + 1 + length)
    return out


def item_tags(body: bytes) -> list[Node]:
    out, offset = [], 0
    while offset < len(body):
        node, offset = tag_at(body, offset)
        out.append(node)
    return out


class TaggedDict(dict[Any, Any]):
    """A decoded table with the tags of its values (``tags``), read from the same bytes."""

    tags: dict[str, Node]


def record_tags() -> None:
    """Wrap pika's table decoder (read at call time by ``pika.spec``) to keep the tags."""
    decode = pika.data.decode_table

    def tagged(encoded: bytes, offset: int) -> tuple[dict[Any, Any], int]:
        table, end = decode(encoded, offset)
        out = TaggedDict(table)
        try:
            out.tags = field_tags(bytes(encoded[offset + 4 : end]))
        except (ValueError, IndexError, struct.error) as exc:
            out.tags = {"?": ("?", str(exc))}
        return out, end

    pika.data.decode_table = tagged


# -- canonical cells ----------------------------------------------------------------------------


def text(value: str | bytes) -> str:
    if isinstance(value, str):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return "hex:" + value.hex()


def cell(value: Any, node: Node | None) -> dict[str, Any]:
    tag, sub = node if node is not None else ("?", None)
    out: dict[str, Any] = {"type": f"{tag}/{type(value).__name__}"}
    if isinstance(value, dict):
        out["value"] = table(value, sub or {})
    elif isinstance(value, list):
        subs = sub if isinstance(sub, list) else []
        out["value"] = [cell(v, subs[i] if i < len(subs) else None) for i, v in enumerate(value)]
    elif isinstance(value, bytes):
        out["value"] = "hex:" + value.hex()
    elif isinstance(value, datetime.datetime):
        out["value"] = str(int(value.timestamp()))
    elif isinstance(value, (bool, str)) or value is None:
        out["value"] = value
    else:  # int, pika's long, Decimal
        out["value"] = str(value)
    if tag in ("f", "d"):
        out["wire"] = sub.hex()  # pika's own value lost the fraction
    return out


def table(fields: dict[Any, Any], nodes: dict[str, Node]) -> dict[str, Any]:
    return {text(k): cell(v, nodes.get(text(k))) for k, v in fields.items()}


def consume_typed(url: str, queues: list[str]) -> None:
    record_tags()
    conn = pika.BlockingConnection(pika.URLParameters(url))
    channel = conn.channel()
    channel.basic_qos(prefetch_count=50)

    def consumed(queue: str) -> Any:
        def on_message(ch: Any, method: Any, props: Any, body: bytes) -> None:
            headers = props.headers or {}
            line = {
                "queue": queue,
                "message_id": props.message_id or "",
                "redelivered": method.redelivered,
                "headers": table(headers, getattr(headers, "tags", {})),
            }
            sys.stdout.write(json.dumps(line) + "\n")
            sys.stdout.flush()
            ch.basic_reject(method.delivery_tag, requeue=False)

        return on_message

    for queue in queues:
        channel.basic_consume(queue, consumed(queue), auto_ack=False)
    print('{"ready": true}', flush=True)
    try:
        channel.start_consuming()
    except Exception as exc:
        sys.stderr.write(f"CONNECTION CLOSED (error): {type(exc).__name__}: {exc}\n")
        sys.exit(2)


def main(argv: list[str]) -> None:
    if len(argv) >= 4 and argv[0] == "publish-all":
        publish_all(argv[1], argv[3:])
    elif len(argv) >= 3 and argv[0] == "consume-typed":
        consume_typed(argv[1], argv[2:])
    else:
        sys.exit(
            "usage: allfields.py publish-all <url> <omit|-> <queue>... | consume-typed <url> <queue>..."
        )


if __name__ == "__main__":
    main(sys.argv[1:])
