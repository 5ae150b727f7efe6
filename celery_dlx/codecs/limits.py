"""Bounds that keep payload decoding cheap whatever the input (sizes in bytes or characters)."""

from __future__ import annotations

#: Default ``limit`` of :func:`~celery_dlx.codecs.decode_payload`: the most bytes of a body that are
#: decoded (after decompression) and, roughly, the most characters of decoded data returned.
DEFAULT_LIMIT = 1 << 20
#: Smaller limits are raised to this, so even a tiny limit shows something useful.
MIN_LIMIT = 256
#: Bytes shown as hex in the preview of an opaque or binary body.
PREVIEW_BYTES = 64
#: Nesting of JSON data kept in a result; deeper values are replaced by a marker.
MAX_DATA_DEPTH = 64
#: Nesting of length-delimited fields a schema-less wire dump opens as sub-messages.
MAX_WIRE_DEPTH = 8
#: Fields a schema-less wire dump shows at most (all levels together).
MAX_DUMP_FIELDS = 1000
#: Fields read from one message without a schema (a longer message is read in part).
MAX_SCAN_FIELDS = 20_000
#: Wire fields (all levels) looked at when measuring how one type fits a body.
MAX_FIT_NODES = 2_000
#: Registered types measured field by field per body at most (the best by top-level wire types).
PRESELECTED = 64
#: Nesting of typed protobuf messages followed when scoring a type.
MAX_TYPED_DEPTH = 16
#: Registered protobuf types fully parsed per body (the best by a cheap wire-level fit).
MAX_CANDIDATES = 8
#: Wrapping layers (compression, base64) peeled off one body at most.
MAX_LAYERS = 4
#: Task arguments looked at for embedded base64 protobuf in a Celery body.
MAX_EMBEDDED = 16
