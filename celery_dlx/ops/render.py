"""Text for people and JSON for scripts: times, durations, tables and one-line payload previews."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Sequence
from datetime import datetime, timedelta, timezone

from celery_dlx.errors import DLXError

#: Units a duration may be written in (``90s``, ``15m``, ``2h``, ``3d``, ``1w``), in seconds.
DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$", re.I)
_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)", re.I)


def parse_duration(text: str, option: str = "duration") -> float:
    """Seconds of ``text``: ``90``, ``90s``, ``15m``, ``2h``, ``3d``, ``1w``, or ``1h30m``.

    Raises:
        DLXError: ``text`` is not a duration; the message names ``option``.
    """
    match = _DURATION.match(text)
    if match:
        return float(match.group(1)) * DURATION_UNITS[(match.group(2) or "s").lower()]
    squeezed = text.replace(" ", "")
    parts = _PART.findall(squeezed)
    if parts and "".join(n + u for n, u in parts).lower() == squeezed.lower():
        return sum(float(n) * DURATION_UNITS[u.lower()] for n, u in parts)
    raise DLXError(
        f"{option}: {text!r} is not a duration (examples: 90s, 15m, 2h, 3d, 1h30m; plain seconds)"
    )


def parse_when(text: str, option: str = "--since", *, now: datetime | None = None) -> datetime:
    """The time ``text`` names: a duration ago (``2h``), an ISO date or time (UTC unless it
    says), or ``@epoch``.

    Raises:
        DLXError: ``text`` is none of these; the message names ``option``.
    """
    now = now or datetime.now(timezone.utc)
    stripped = text.strip()
    if stripped.startswith("@"):
        try:
            return datetime.fromtimestamp(float(stripped[1:]), timezone.utc)
        except (ValueError, OverflowError, OSError) as exc:
            raise DLXError(f"{option}: {text!r} is not @<epoch seconds>") from exc
    try:
        ago = parse_duration(stripped, option)
    except DLXError:
        ago = None
    if ago is not None:
        try:
            return now - timedelta(seconds=ago)
        except OverflowError as exc:  # before year 1
            raise DLXError(f"{option}: {text!r} is too long ago") from exc
    try:
        parsed = datetime.fromisoformat(stripped.replace("Z", "+00:00"))
    except ValueError as exc:
        raise DLXError(
            f"{option}: {text!r} is neither a duration ago (2h, 3d), an ISO time "
            "(2024-05-01T10:00) nor @<epoch seconds>"
        ) from exc
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def count(n: int, noun: str, plural: str | None = None) -> str:
    """``"1 cause"``, ``"2 causes"``; ``plural`` for a noun that does not take an s."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"


def iso(ms: int | None) -> str | None:
    """Epoch milliseconds as an ISO-8601 UTC time with milliseconds (``...Z``); None stays None."""
    if ms is None:
        return None
    moment = datetime.fromtimestamp(ms / 1000, timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def human_seconds(seconds: float) -> str:
    """A short duration: ``850ms``, ``42s``, ``5m12s``, ``3h05m``, ``2d04h``."""
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 1:
        return f"{sign}{int(s * 1000)}ms"
    if s < 60:
        return f"{sign}{s:.0f}s"
    if s < 3600:
        return f"{sign}{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{sign}{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    return f"{sign}{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"


def ago(ms: int | None, now_ms: int) -> str:
    """How long before ``now_ms`` the time ``ms`` was (``5m12s ago``, ``in 30s``); ``-`` if None."""
    if ms is None:
        return "-"
    delta = (now_ms - ms) / 1000
    return f"{human_seconds(delta)} ago" if delta >= 0 else f"in {human_seconds(-delta)}"


def clip(text: object, width: int) -> str:
    """``text`` on one line, cut to ``width`` characters with an ellipsis."""
    flat = " ".join(str("" if text is None else text).split())
    if width <= 0 or len(flat) <= width:
        return flat
    return flat[: max(1, width - 1)] + "…"


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    width: int | None = None,
    shrink: Sequence[str] = (),
) -> str:
    """An aligned text table (``None`` shows as ``-``) cut to ``width`` (default: the terminal's,
    at least 80) in the ``shrink`` columns, most expendable first."""
    total = width or max(80, shutil.get_terminal_size((120, 24)).columns)
    cells = [[("-" if v is None else " ".join(str(v).split())) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    excess = sum(widths) + 2 * (len(widths) - 1) - total
    for title in shrink:
        if excess <= 0:
            break
        i = list(headers).index(title)
        cut = min(excess, widths[i] - max(len(title), 8))
        if cut > 0:
            widths[i] -= cut
            excess -= cut
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    for row in cells:
        lines.append(
            "  ".join(clip(c, w).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        )
    return "\n".join(lines)


def dumps(data: object) -> str:
    """``data`` as indented JSON (non-ASCII kept, NaN refused: the output must parse anywhere)."""
    return json.dumps(data, indent=2, ensure_ascii=False, allow_nan=False, default=_fallback)


def _fallback(value: object) -> object:
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {"__bytes__": bytes(value).hex()}
    if isinstance(value, datetime):
        return value.isoformat()
    return repr(value)


def preview(data: object, width: int = 80) -> str:
    """A one-line rendering of decoded payload data, cut to ``width`` characters."""
    if isinstance(data, str):
        return clip(data, width)
    try:
        text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), default=repr)
    except (TypeError, ValueError):
        text = repr(data)
    return clip(text, width)
