"""A local HTTP server used as a Sentry DSN: it decodes the envelopes sentry-sdk really sends.

Used by tests/integration/test_sentry.py and benchmarks/p8_noise.py. Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import gzip
import json
import threading
import time
import zlib
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def parse_envelope(body: bytes) -> tuple[dict[str, Any], list[tuple[dict[str, Any], bytes]]]:
    """``(envelope header, [(item header, item payload bytes)])`` of a Sentry envelope."""
    pos = body.find(b"\n")
    header = json.loads(body[: pos if pos >= 0 else len(body)] or b"{}")
    items: list[tuple[dict[str, Any], bytes]] = []
    pos = len(body) if pos < 0 else pos + 1
    while pos < len(body):
        end = body.find(b"\n", pos)
        if end < 0:
            end = len(body)
        line = body[pos:end]
        pos = end + 1
        if not line.strip():
            continue
        item_header = json.loads(line)
        length = item_header.get("length")
        if length is not None:
            payload = body[pos : pos + length]
            pos += length + 1
        else:
            end = body.find(b"\n", pos)
            end = len(body) if end < 0 else end
            payload = body[pos:end]
            pos = end + 1
        items.append((item_header, payload))
    return header, items


def _decompress(body: bytes, encoding: str) -> bytes:
    encoding = encoding.lower().strip()
    if encoding == "gzip":
        return gzip.decompress(body)
    if encoding == "deflate":
        return zlib.decompress(body)
    if encoding == "br":
        import brotli  # type: ignore[import-not-found]

        return bytes(brotli.decompress(body))
    return body


class SentrySink:
    """Collects the events (``type == "event"`` items) posted to ``/api/<project>/envelope/``."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.items: list[tuple[dict[str, Any], bytes]] = []
        self.requests = 0
        self._cond = threading.Condition()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                body = _decompress(raw, self.headers.get("Content-Encoding") or "")
                _, items = parse_envelope(body)
                with sink._cond:
                    sink.requests += 1
                    for item_header, payload in items:
                        sink.items.append((item_header, payload))
                        if item_header.get("type") == "event":
                            sink.events.append(json.loads(payload))
                    sink._cond.notify_all()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def dsn(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://public@{host}:{port}/1"

    def __enter__(self) -> SentrySink:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(
        self, predicate: Callable[[list[dict[str, Any]]], bool], timeout: float = 30.0
    ) -> list[dict[str, Any]]:
        """Wait until ``predicate(events)`` holds; return a copy of the events."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not predicate(self.events):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(
                        f"Sentry sink: condition not met; got {len(self.events)} events"
                    )
                self._cond.wait(left)
            return list(self.events)
