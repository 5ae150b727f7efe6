"""Standard library internals celery_dlx relies on (checked on CPython 3.11, installed here; the
matrix runs 3.10 to 3.13).

Canary: ``tests/unit/test_compat_canaries.py`` (standard library section).
"""

from __future__ import annotations

import codecs


def is_text_codec(info: codecs.CodecInfo) -> bool:
    """True when ``info`` (``codecs.lookup(name)``) is a text encoding, not a bytes-to-bytes or
    str-to-str transform such as ``hex``, ``base64`` or ``rot13``.

    Internal: ``CodecInfo._is_text_encoding``, which ``str.encode``/``bytes.decode`` read to
    refuse those transforms; nothing public tells them apart. A codec without the attribute
    (a third-party one) counts as a text encoding, as CPython counts it.
    """
    return bool(getattr(info, "_is_text_encoding", True))
