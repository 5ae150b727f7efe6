"""Tolerant decoding of AMQP message properties whose short strings are not UTF-8.

AMQP short strings (``message_id``, ``content_type``, ``type``, ``app_id``..., header names) are
octets, and producers in other languages send whatever bytes they hold. py-amqp decodes them as
UTF-8 inside the connection's frame reader and raises ``UnicodeDecodeError`` there: the delivery
never reaches the consumer, the channel is left broken, and the broker redelivers the same
message to the next consumer, which dies the same way. One such dead letter would stop the DLX
service for good.

:func:`install_tolerant_properties` (called by celery_dlx's own consumers, never at import)
wraps py-amqp's decoder of basic properties: a header frame that decodes today decodes exactly
as before; one that raises is decoded again with every invalid short string replaced
(``U+FFFD``), so the message is delivered, kept and shown, and its id stays usable as text.
"""

from __future__ import annotations

import threading
from typing import Any

_lock = threading.Lock()


def _replacing(value: Any) -> Any:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", errors="replace")
    return value


def install_tolerant_properties() -> None:
    """Make py-amqp deliver messages whose properties or header names are not UTF-8.

    Process-wide and idempotent. Only header frames py-amqp could not decode are affected.
    """
    from amqp import serialization, spec

    strict = serialization.PROPERTY_CLASSES[spec.Basic.CLASS_ID]
    if getattr(strict, "celery_dlx_tolerant", False):
        return

    def decode(buf: Any, offset: int) -> Any:
        try:
            return strict(buf, offset)
        except UnicodeDecodeError:
            # py-amqp reads its module's `pstr_t` at call time; swap it for this one frame. Another
            # thread decoding meanwhile sees the same result for anything that decodes, and
            # replacement characters where it would have raised or kept bytes.
            with _lock:
                original = serialization.pstr_t
                serialization.pstr_t = _replacing
                try:
                    return strict(buf, offset)
                finally:
                    serialization.pstr_t = original

    decode.celery_dlx_tolerant = True  # type: ignore[attr-defined]
    serialization.PROPERTY_CLASSES[spec.Basic.CLASS_ID] = decode
