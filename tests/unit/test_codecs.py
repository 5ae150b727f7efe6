"""Payload decoding: JSON, Celery messages, text, compression and size caps."""

from __future__ import annotations

import base64
import bz2
import gzip
import importlib.util
import json
import lzma
import os
import tracemalloc
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from celery_dlx.codecs import KINDS, Decoded, decode_payload
from celery_dlx.codecs.limits import DEFAULT_LIMIT, MIN_LIMIT

TEN_MB = 10 * 1024 * 1024


def decode(body: Any, **kwargs: Any) -> Decoded:
    decoded = decode_payload(
        body,
        content_type=kwargs.pop("content_type", None),
        content_encoding=kwargs.pop("content_encoding", None),
        headers=kwargs.pop("headers", None),
        **kwargs,
    )
    assert decoded.kind in KINDS
    json.dumps(decoded.to_json(), allow_nan=False)
    return decoded


def test_json_body_decodes_field_by_field() -> None:
    body = json.dumps({"order": {"id": "o-1", "lines": [1, 2.5, None, True]}, "note": "é"}).encode()
    decoded = decode(body, content_type="application/json", content_encoding="utf-8")
    assert decoded.kind == "json"
    assert decoded.data == {"order": {"id": "o-1", "lines": [1, 2.5, None, True]}, "note": "é"}
    assert decoded.notes == []
    assert (decoded.size, decoded.truncated, decoded.layers) == (len(body), False, [])


@pytest.mark.parametrize(
    "content_type", [None, "application/octet-stream", "text/plain", "application/data"]
)
def test_json_is_recognised_when_the_content_type_lies_or_is_missing(
    content_type: str | None,
) -> None:
    decoded = decode(b'  {"a": [1, 2]}\n', content_type=content_type)
    assert (decoded.kind, decoded.data) == ("json", {"a": [1, 2]})


def test_json_content_type_with_a_body_that_is_not_json_says_so() -> None:
    decoded = decode(b"{not json at all", content_type="application/json")
    assert decoded.kind == "text"
    assert decoded.data == "{not json at all"
    assert any(
        n.startswith("the content type says JSON but the body is not JSON (") for n in decoded.notes
    )


def test_non_finite_json_numbers_stay_json_safe() -> None:
    decoded = decode(b"[NaN, Infinity, -Infinity, 1e999, 1.5]", content_type="application/json")
    assert decoded.data == ["NaN", "Infinity", "-Infinity", "1e999", 1.5]


def test_json_nested_past_the_parser_limit_is_kept_as_text() -> None:
    body = b"[" * 100_000 + b"]" * 100_000
    decoded = decode(body, content_type="application/json")
    assert decoded.kind == "text"
    assert (
        "the content type says JSON but the body is not JSON (nested too deeply to parse)"
        in decoded.notes
    )


def test_deep_json_data_is_bounded_in_depth() -> None:
    body = b"[" * 200 + b"]" * 200
    decoded = decode(body, content_type="application/json")
    assert decoded.kind == "json"
    assert decoded.truncated
    depth, node = 0, decoded.data
    while isinstance(node, list) and node:
        depth, node = depth + 1, node[0]
    assert depth == 64
    assert node == "…(nested deeper than 64 levels)"


def test_celery_protocol_2_shows_task_id_args_kwargs_embed() -> None:
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    body = json.dumps([[4, "x"], {"retry": True}, embed]).encode()
    headers = {
        "lang": "py",
        "task": "shop.tasks.charge",
        "id": "6f1c",
        "retries": 0,
        "argsrepr": "(4, 'x')",
    }
    decoded = decode(
        body, content_type="application/json", content_encoding="utf-8", headers=headers
    )
    assert decoded.kind == "celery"
    assert decoded.data == {
        "task": "shop.tasks.charge",
        "id": "6f1c",
        "args": [4, "x"],
        "kwargs": {"retry": True},
        "embed": embed,
        "protocol": 2,
    }


def test_celery_protocol_2_headers_as_bytes_are_read() -> None:
    decoded = decode(
        b"[[], {}, null]", content_type="application/json", headers={"task": b"t.x", "id": b"i-1"}
    )
    assert decoded.data == {
        "task": "t.x",
        "id": "i-1",
        "args": [],
        "kwargs": {},
        "embed": {},
        "protocol": 2,
    }


def test_task_header_with_a_body_not_shaped_like_celery_is_shown_as_json_with_a_note() -> None:
    decoded = decode(b'{"x": 1}', content_type="application/json", headers={"task": "t.y"})
    assert (decoded.kind, decoded.data) == ("json", {"x": 1})
    assert any(
        "says Celery protocol 2, but the body is not [args, kwargs, embed]" in n
        for n in decoded.notes
    )


def test_celery_protocol_1_body_is_recognised() -> None:
    body = {
        "task": "t.add",
        "id": "abc",
        "args": [1, 2],
        "kwargs": {},
        "retries": 0,
        "callbacks": ["cb"],
    }
    decoded = decode(json.dumps(body).encode(), content_type="application/json")
    assert decoded.kind == "celery"
    assert decoded.data == {
        "task": "t.add",
        "id": "abc",
        "args": [1, 2],
        "kwargs": {},
        "embed": {"callbacks": ["cb"]},
        "protocol": 1,
    }


def test_utf8_text_is_shown_as_text() -> None:
    decoded = decode("paiement refusé ✓\nligne 2".encode(), content_type="text/plain")
    assert (decoded.kind, decoded.data) == ("text", "paiement refusé ✓\nligne 2")


def test_text_in_a_declared_charset_is_decoded_with_it() -> None:
    decoded = decode(
        "café crème".encode("latin-1"), content_type="text/plain", content_encoding="latin-1"
    )
    assert (decoded.kind, decoded.data) == ("text", "café crème")
    assert "decoded as latin-1 (content_encoding)" in decoded.notes[0]


def test_plain_words_are_not_mistaken_for_base64() -> None:
    for word in (b"test", b"HelloWorld", b"ok", b"abcdefgh"):
        decoded = decode(word)
        assert (decoded.kind, decoded.data, decoded.layers) == ("text", word.decode(), [])


def test_base64_json_is_unwrapped() -> None:
    body = base64.b64encode(b'{"order_id": "o-1"}')
    decoded = decode(body)
    assert (decoded.kind, decoded.data, decoded.layers) == ("json", {"order_id": "o-1"}, ["base64"])


def test_declared_base64_content_encoding_is_undone() -> None:
    decoded = decode(
        base64.b64encode(b"[1,2]"), content_encoding="base64", content_type="application/json"
    )
    assert (decoded.kind, decoded.data, decoded.layers) == ("json", [1, 2], ["base64"])


@pytest.mark.parametrize(
    ("compress", "encoding", "layer"),
    [
        (gzip.compress, "gzip", "zlib"),
        (zlib.compress, "deflate", "zlib"),
        (lambda b: zlib.compress(b)[2:-4], "deflate", "zlib"),  # raw deflate under the same name
        (bz2.compress, "bzip2", "bz2"),
        (lzma.compress, "xz", "lzma"),
    ],
)
def test_declared_compression_is_undone(compress: Any, encoding: str, layer: str) -> None:
    decoded = decode(
        compress(b'{"a": 1}'), content_encoding=encoding, content_type="application/json"
    )
    assert (decoded.kind, decoded.data, decoded.layers) == ("json", {"a": 1}, [layer])


def test_kombu_compression_header_is_undone() -> None:
    # Kombu's "gzip" is zlib.compress, announced in a header; content_encoding stays utf-8.
    body = zlib.compress(json.dumps([[1], {}, {}]).encode())
    headers = {"compression": "application/x-gzip", "task": "t.z", "id": "1"}
    decoded = decode(
        body, content_type="application/json", content_encoding="utf-8", headers=headers
    )
    assert decoded.kind == "celery"
    assert decoded.data["args"] == [1]


def test_undeclared_gzip_is_recognised_by_its_magic_number() -> None:
    decoded = decode(gzip.compress(b"hello there"))
    assert (decoded.kind, decoded.data, decoded.layers) == (
        "text",
        "hello there",
        ["zlib (undeclared)"],
    )


def test_declared_compression_that_fails_is_reported_and_the_body_kept() -> None:
    decoded = decode(b"plain words", content_encoding="gzip")
    assert (decoded.kind, decoded.data) == ("text", "plain words")
    assert decoded.notes[0].startswith(
        "compression 'gzip' declared but the body does not decompress"
    )


def test_unsupported_compression_is_named() -> None:
    decoded = decode(b"\x0b\x02\x80hi\x03", content_encoding="br")
    assert "compression 'br' is not supported: shown as received" in decoded.notes


def test_decompression_bomb_is_refused_past_the_limit() -> None:
    bomb = gzip.compress(b"\0" * (200 * 1024 * 1024), compresslevel=9)  # 200 MB of zeros in ~200 kB
    tracemalloc.start()
    try:
        decoded = decode(bomb, content_encoding="gzip", limit=64 * 1024)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024
    assert decoded.truncated
    assert any("possible decompression bomb" in note for note in decoded.notes)
    assert decoded.data["length"] == 64 * 1024


def test_empty_body() -> None:
    decoded = decode(b"", content_type="application/json")
    assert (decoded.kind, decoded.data, decoded.size) == ("empty", None, 0)


def test_random_bytes_are_shown_as_binary_with_a_preview() -> None:
    body = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)) * 4
    decoded = decode(body, content_type="image/png")
    assert decoded.kind == "binary"
    assert decoded.data["length"] == len(body)
    assert decoded.data["hex"].startswith("89504e470d0a1a0a")
    assert decoded.data["ascii"].startswith(".PNG....")
    assert decoded.sha256 == decoded.data["sha256"]


def test_str_and_bytearray_bodies_are_accepted() -> None:
    assert decode('{"a": "é"}').data == {"a": "é"}
    assert decode(bytearray(b"[1]")).data == [1]


@pytest.mark.parametrize(
    "body",
    [
        json.dumps({"rows": [{"i": i, "name": "x" * 40} for i in range(200_000)]}).encode(),
        ("ligne de texte " * (TEN_MB // 15)).encode(),
        os.urandom(TEN_MB),
        base64.b64encode(os.urandom(TEN_MB // 2)),
    ],
    ids=["json", "text", "binary", "base64"],
)
def test_ten_megabyte_bodies_decode_in_bounded_memory(body: bytes) -> None:
    limit = 256 * 1024
    tracemalloc.start()
    try:
        decoded = decode(body, limit=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert decoded.size == len(body)
    assert decoded.truncated
    assert any("more than the decode limit" in note for note in decoded.notes)
    assert len(json.dumps(decoded.to_json())) < 2 * limit
    # The decoded prefix and its views, a few times over; never the 10 MB body again.
    assert peak < 16 * limit + 2 * 1024 * 1024


def test_default_limit_decodes_a_ten_megabyte_body_partially() -> None:
    decoded = decode(b"a" * TEN_MB)
    assert decoded.kind == "text"
    assert decoded.truncated
    assert len(decoded.data) <= DEFAULT_LIMIT + 100


def test_data_larger_than_the_limit_is_cut_with_a_note() -> None:
    body = b"\x08\x01" * 400  # 800 bytes of protobuf, far more once dumped field by field
    decoded = decode(body, limit=1000)
    assert decoded.kind == "protobuf-wire"
    assert decoded.truncated
    assert decoded.data[0] == {"field": 1, "wire_type": "varint", "value": 1}
    assert decoded.data[-1].startswith("…(truncated: ")
    assert "data cut to about 1000 characters (the decode limit)" in decoded.notes
    assert len(json.dumps(decoded.data)) < 1500


def test_json_longer_than_the_limit_is_shown_as_text_up_to_it() -> None:
    body = json.dumps({"items": list(range(5000))}).encode()
    decoded = decode(body, content_type="application/json", limit=1000)
    assert decoded.kind == "text"
    assert decoded.data.startswith('{"items": [0, 1, 2')
    assert "JSON cut at the decode limit cannot be parsed: shown as text" in decoded.notes
    assert decoded.truncated


def test_tiny_limits_are_raised_to_the_minimum() -> None:
    decoded = decode(b"x" * 1000, limit=1)
    assert decoded.kind == "text"
    assert decoded.data.startswith("x" * (MIN_LIMIT - 10))


def test_msgpack_is_decoded_when_installed_and_named_when_not() -> None:
    if importlib.util.find_spec("msgpack") is None:
        decoded = decode(b"\x93\x01\x02\x03", content_type="application/x-msgpack")
        assert "msgpack body: `pip install msgpack` to decode it" in decoded.notes
        assert decoded.kind != "msgpack"
    else:
        decoded = decode(
            b"\x93\x91\x01\x80\x80", content_type="application/x-msgpack", headers={"task": "t"}
        )
        assert decoded.kind == "celery"
        assert decoded.data["args"] == [1]


def test_headers_and_content_metadata_are_optional() -> None:
    decoded = decode_payload(b'{"a": 1}')
    assert (decoded.kind, decoded.data) == ("json", {"a": 1})


class _HostileHeaders(Mapping[str, Any]):
    """A header mapping that fails on every lookup, as a broken client's table type might."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("boom")

    def __iter__(self) -> Iterator[str]:
        return iter(["task"])

    def __len__(self) -> int:
        return 1


def test_a_header_mapping_that_fails_on_lookup_is_treated_as_empty() -> None:
    decoded = decode(b"[[1], {}, {}]", content_type="application/json", headers=_HostileHeaders())
    assert (decoded.kind, decoded.data) == ("json", [[1], {}, {}])
    assert not any(note.startswith("internal error") for note in decoded.notes)
