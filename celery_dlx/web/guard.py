"""ASGI middleware in front of every route: authentication, body size, security headers."""

from __future__ import annotations

from typing import Any

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from celery_dlx.web.auth import Accounts

#: No inline script, no third-party anything, no framing, forms only to the console itself.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cache-control", b"no-store"),
)


async def _plain(send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]]) -> None:
    body = text.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        *SECURITY_HEADERS,
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class Guard:
    """401 without valid credentials, 413 for a body over ``max_body``, security headers on
    every response; the user goes to ``scope["state"]["user"]``."""

    def __init__(self, app: ASGIApp, accounts: Accounts, max_body: int) -> None:
        self.app = app
        self.accounts = accounts
        self.max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        user = self.accounts.authenticate(headers.get("authorization"))
        if user is None:
            await _plain(
                send,
                401,
                "credentials needed (HTTP Basic)\n",
                [(b"www-authenticate", b'Basic realm="celery_dlx", charset="UTF-8"')],
            )
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _plain(send, 413, f"request body over {self.max_body} bytes\n", [])
            return
        scope.setdefault("state", {})["user"] = user
        seen = 0

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise HTTPException(413, f"request body over {self.max_body} bytes")
            return message

        async def secured_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
            await send(message)

        await self.app(scope, limited_receive, secured_send)


def user_of(scope_or_request: Any) -> Any:
    """The authenticated user of a request."""
    state = (
        scope_or_request.scope["state"]
        if hasattr(scope_or_request, "scope")
        else scope_or_request["state"]
    )
    return state["user"]
