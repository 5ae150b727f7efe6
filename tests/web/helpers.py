"""Helpers of the console tests: obituaries of every payload kind, a small HTTP client."""

from __future__ import annotations

import base64
import http.client
import json
import pickle
import socket
import uuid
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode, urlsplit

from celery import Celery
from kombu.serialization import dumps

from celery_dlx.fates import now_ms
from celery_dlx.message.obituary import Attempt, Obituary
from celery_dlx.service.settle import buried_event
from celery_dlx.store.graveyard import Graveyard
from celery_dlx.wiring.runtime import Runtime

#: A payload, header, task name and message meant to run script if anything is not escaped.
XSS = '<script>window.__xss=1;alert("xss")</script><img src=x onerror="window.__xss=2;alert(2)">'

OPERATOR = ("op", "op-secret")
VIEWER = ("viewer", "viewer-secret")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def task_obituary(
    app: Celery,
    task_name: str,
    order: int,
    *,
    cause: str = "backend-down",
    exc_type: str = "RuntimeError",
    exc_message: str = "payment backend down",
    at: int | None = None,
    args: tuple[Any, ...] | None = None,
) -> Obituary:
    """An obituary holding a real Celery task message (protocol 2, JSON) of ``task_name``."""
    task_id = str(uuid.uuid4())
    message = app.amqp.as_task_v2(task_id, task_name, args=args if args is not None else (order,))
    content_type, encoding, body = dumps(message.body, serializer="json")
    at = at if at is not None else now_ms() - 10_000 + order
    raw = body if isinstance(body, bytes) else body.encode()
    return Obituary.from_fields(
        id=f"ob-{order}-{task_id[:8]}",
        message_id=task_id,
        queue=app.conf.task_default_queue,
        reason="retry budget spent: 2 requeues, 2 parks",
        buried_ms=at,
        task=task_name,
        origin="celery",
        cause=cause,
        exc_type=exc_type,
        exc_message=exc_message,
        traceback='Traceback (most recent call last):\n  File "shop.py", line 1\nRuntimeError: '
        + exc_message,
        attempt=5,
        attempts=[Attempt(at - 3000, "requeued", cause), Attempt(at, "buried", cause)],
        headers=dict(message.headers),
        properties={
            "content_type": content_type,
            "content_encoding": encoding,
            "correlation_id": task_id,
        },
        payload=raw,
        payload_size=len(raw),
    )


def foreign_obituary(
    queue: str,
    body: bytes,
    content_type: str | None,
    *,
    cause: str,
    exc_type: str = "ForeignError",
    exc_message: str = "consumer rejected it",
    headers: dict[str, Any] | None = None,
    order: int = 0,
) -> Obituary:
    mid = f"m-{uuid.uuid4().hex[:12]}"
    at = now_ms() - 5_000 + order
    return Obituary.from_fields(
        id=f"fob-{order}-{mid}",
        message_id=mid,
        queue=queue,
        reason="rejected by a foreign consumer",
        buried_ms=at,
        origin="foreign",
        cause=cause,
        exc_type=exc_type,
        exc_message=exc_message,
        attempt=1,
        attempts=[Attempt(at, "buried", cause)],
        headers=headers or {},
        properties={"content_type": content_type} if content_type else {},
        payload=body,
        payload_size=len(body),
    )


def pickle_bomb(marker: str) -> bytes:
    """A pickle that creates ``marker`` (a file path) if it is ever loaded."""

    class Bomb:
        def __reduce__(self) -> Any:
            return (open, (marker, "w"))

    return pickle.dumps(Bomb(), protocol=4)


def b64(message: Any) -> bytes:
    return base64.b64encode(message.SerializeToString())


def bury(runtime: Runtime, obits: list[Obituary]) -> None:
    Graveyard(runtime.redis, runtime.keys).write_many([(ob, buried_event(ob)) for ob in obits])


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", "replace")

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """A plain HTTP client of the console (no redirects followed). Like a browser on one of
    the console's pages, it sends ``Origin: <base>`` with every POST unless told otherwise."""

    def __init__(
        self, base: str, auth: tuple[str, str] | None = None, *, origin: str | None = "base"
    ) -> None:
        parts = urlsplit(base)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.auth = auth
        self.origin = f"{parts.scheme}://{parts.netloc}" if origin == "base" else origin

    def request(
        self,
        method: str,
        path: str,
        *,
        params: dict[str, Any] | None = None,
        form: list[tuple[str, str]] | dict[str, str] | None = None,
        json_body: Any = None,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        sent = dict(headers or {})
        if self.origin is not None and method != "GET":
            sent.setdefault("Origin", self.origin)
        if self.auth is not None:
            token = base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
            sent.setdefault("Authorization", f"Basic {token}")
        if params:
            path = f"{path}?{urlencode(params)}"
        if form is not None:
            body = urlencode(form).encode()
            sent.setdefault("Content-Type", "application/x-www-form-urlencoded")
        elif json_body is not None:
            body = json.dumps(json_body).encode()
            sent.setdefault("Content-Type", "application/json")
        conn = http.client.HTTPConnection(self.host, self.port, timeout=300)
        try:
            conn.request(method, path, body=body, headers=sent)
            resp = conn.getresponse()
            return Reply(resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read())
        finally:
            conn.close()

    def get(self, path: str, **kwargs: Any) -> Reply:
        return self.request("GET", path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Reply:
        return self.request("POST", path, **kwargs)

    def csrf(self) -> str:
        reply = self.get("/api/csrf")
        assert reply.status == 200, reply.text
        token: str = reply.json()["token"]
        return token


def redis_state(runtime: Runtime) -> dict[bytes, object]:
    """Every Redis key of ``runtime``'s key prefix with its content: equal before and after means
    nothing under the prefix was written.

    Content, not ``DUMP``: a hash read between two dumps may be rehashed and dump its fields in
    another order."""
    client = runtime.redis
    read = {
        b"string": client.get,
        b"hash": client.hgetall,
        b"list": lambda k: client.lrange(k, 0, -1),
        b"set": client.smembers,
        b"zset": lambda k: client.zrange(k, 0, -1, withscores=True),
        b"stream": lambda k: client.xrange(k),
    }
    keys = sorted(client.scan_iter(match="{" + runtime.keys.prefix + "*", count=1000))
    # Not the check's probe key: reads of the check write it, and it expires by itself (a
    # snapshot taken either side of its expiry would differ with no write in between).
    probe = runtime.keys.check_probe.encode()
    return {k: read[client.type(k)](k) for k in keys if k != probe}
