"""Turn a formatted Python traceback (text kept in an obituary) back into Sentry exception data:
the DLX service reports a burial long after the worker is gone, and frames give Sentry a real
stack trace instead of one opaque string.
"""

from __future__ import annotations

import re
from typing import Any

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]*)", line (?P<line>\d+)(?:, in (?P<func>.*))?$')
_CHAIN = re.compile(
    r"^(?:The above exception was the direct cause of the following exception:"
    r"|During handling of the above exception, another exception occurred:)\s*$"
)
_HEADER = "Traceback (most recent call last):"
_CARETS = re.compile(r"^\s*[~^]+\s*$")
_REPEATED = re.compile(r"^\s*\[Previous line repeated \d+ more times?\]\s*$")
_LIBRARY = re.compile(r"(site-packages|dist-packages)[/\\]|[/\\]lib[/\\]python\d")
#: Frames kept per exception (Sentry drops the middle of longer traces anyway).
MAX_FRAMES = 250


def split_type(exc_type: str) -> tuple[str | None, str]:
    """``("module", "QualName")`` of a ``module.QualName`` type name; no module for builtins."""
    module, _, name = exc_type.rpartition(".")
    return (module or None), name


def _frame(match: re.Match[str], code: str | None) -> dict[str, object]:
    filename = match.group("file")
    frame: dict[str, Any] = {
        "filename": filename,
        "abs_path": filename,
        "lineno": int(match.group("line")),
        "function": (match.group("func") or "<module>").strip(),
        "in_app": not _LIBRARY.search(filename),
    }
    if code:
        frame["context_line"] = code
    return frame


def _is_text(line: str) -> bool:
    """A line that is neither blank, the traceback header, carets nor a repetition note."""
    text = line.strip()
    return bool(text) and text != _HEADER and not _CARETS.match(line) and not _REPEATED.match(line)


def _parse_block(lines: list[str]) -> dict[str, object] | None:
    frames: list[dict[str, Any]] = []
    tail: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        match = _FRAME.match(line)
        if match:
            code = None
            nxt = lines[i + 1] if i + 1 < len(lines) else ""
            if nxt.startswith("    ") and not _FRAME.match(nxt) and not _CARETS.match(nxt):
                code = nxt.strip()
                i += 1
            frames.append(_frame(match, code))
            tail = []
        elif _is_text(line):
            tail.append(line)
        i += 1
    if not frames and not tail:
        return None
    head = tail[0] if tail else ""
    name, sep, value = head.partition(": ")
    if not sep and head.endswith(":"):
        name = head[:-1]
    value = "\n".join([value, *tail[1:]]).strip() if sep else "\n".join(tail[1:]).strip()
    name = name.strip()
    module, short = split_type(name) if name and " " not in name else (None, "")
    exc: dict[str, Any] = {"type": short or "Exception", "value": value if short else head}
    if module:
        exc["module"] = module
    if frames:
        exc["stacktrace"] = {"frames": frames[-MAX_FRAMES:]}
    return exc


def parse_traceback(text: str) -> list[dict[str, object]]:
    """Sentry ``exception.values`` from a formatted traceback, root cause first (chained
    exceptions are separate values, in Python's order); empty for text that is no traceback."""
    blocks: list[list[str]] = [[]]
    for line in text.splitlines():
        if _CHAIN.match(line.strip()):
            blocks.append([])
        else:
            blocks[-1].append(line)
    values = [exc for exc in (_parse_block(b) for b in blocks) if exc is not None]
    return values if any("stacktrace" in v for v in values) else []


def exception_values(exc_type: str, exc_message: str, traceback: str) -> list[dict[str, object]]:
    """Sentry ``exception.values`` for a failure known by type, message and traceback text; the
    last value (Sentry's title) carries ``exc_type`` and ``exc_message`` as recorded."""
    values = parse_traceback(traceback) if traceback else []
    module, short = split_type(exc_type or "Exception")
    last: dict[str, object] = values[-1] if values else {}
    last = {**last, "type": short, "value": exc_message}
    if module:
        last["module"] = module
    else:
        last.pop("module", None)
    return [*values[:-1], last]
