"""Tolerant decoding of AMQP properties that are not UTF-8 (py-amqp raises on them)."""

from __future__ import annotations

import amqp
import pytest
from amqp import serialization

from celery_dlx.compat import install_tolerant_properties

BASIC = amqp.spec.Basic.CLASS_ID


def header_frame(**properties: object) -> bytes:
    return bytes(amqp.Message(b"body", **properties)._serialize_properties())


def test_py_amqp_alone_raises_on_a_non_utf8_message_id() -> None:
    frame = header_frame(message_id=b"\xff\xfe-id")
    with pytest.raises(UnicodeDecodeError):
        serialization.decode_properties_basic(frame, 0)


def test_installed_decoder_replaces_invalid_short_strings_and_header_names() -> None:
    install_tolerant_properties()
    install_tolerant_properties()  # idempotent: wraps once
    decode = serialization.PROPERTY_CLASSES[BASIC]
    frame = header_frame(
        message_id=b"\xff\xfe-id",
        content_type=b"text/\xff",
        application_headers={b"\xfe-name": 1, "ok": "v"},
    )
    props, _ = decode(frame, 0)
    assert props["message_id"] == "\ufffd\ufffd-id"
    assert props["content_type"] == "text/\ufffd"
    assert props["application_headers"] == {"\ufffd-name": 1, "ok": "v"}
    assert serialization.pstr_t is amqp.utils.bytes_to_str  # the swap did not outlive the frame


def test_installed_decoder_changes_nothing_that_decoded_before() -> None:
    install_tolerant_properties()
    frame = header_frame(
        message_id="m-1",
        content_type="application/json",
        application_headers={"x-death": [{"queue": "q", "count": 1}], "raw": b"\xff"},
    )
    assert serialization.PROPERTY_CLASSES[BASIC](frame, 0) == (
        serialization.decode_properties_basic(frame, 0)
    )
