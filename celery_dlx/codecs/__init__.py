"""Safe payload decoding for inspection: JSON, Celery messages, protobuf, text; never pickle.

:func:`decode_payload` shows any message body as JSON-safe data for ``celery dlx show``, Sentry
attachments and the graveyard. Protobuf bodies are decoded with the best-fitting type of a
:class:`ProtobufRegistry` (see :func:`registry_from_config`), or dumped without a schema.
"""

from __future__ import annotations

from celery_dlx.codecs.decode import decode_payload
from celery_dlx.codecs.limits import DEFAULT_LIMIT
from celery_dlx.codecs.registry import ProtobufRegistry, protobuf_available, registry_from_config
from celery_dlx.codecs.result import KINDS, Decoded, RunnerUp

__all__ = [
    "DEFAULT_LIMIT",
    "KINDS",
    "Decoded",
    "ProtobufRegistry",
    "RunnerUp",
    "decode_payload",
    "protobuf_available",
    "registry_from_config",
]
