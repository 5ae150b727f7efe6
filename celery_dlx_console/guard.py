"""ASGI middleware in front of every route: the Host, the origin of writes, authentication,
body size, security headers."""

from __future__ import annotations

from typing import cast

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from celery_dlx_console.auth import Accounts, User
from celery_dlx_console.hosts import WRITE_METHODS, HostRule, same_origin

#: No inline script, no third-party anything, no framing, forms only to the console itself.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # Not no-referrer: with it Chromium sends ``Origin: null`` on the console's own form posts,
    # which SameOrigin must then refuse. same-origin still tells other sites nothing.
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)


async def _plain(send: Send, status: int, text: str, *extra: tuple[bytes, bytes]) -> None:
    body = text.encode()
    headers = [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(body)).encode()),
        *SECURITY_HEADERS,
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class TrustedHosts:
    """400 for a ``Host`` the console's :class:`HostRule` does not admit, saying which setting
    would, before credentials are asked for (Starlette's ``TrustedHostMiddleware`` cannot check
    a port or name the setting)."""

    def __init__(self, app: ASGIApp, rule: HostRule) -> None:
        self.app = app
        self.rule = rule

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        host = Headers(scope=scope).get("host")
        if self.rule.allows(host, scope.get("scheme", "http")):
            await self.app(scope, receive, send)
            return
        shown = repr(host[:200]) if host else "(none)"
        await _plain(
            send,
            400,
            f"Host {shown} is not a name of this console, which answers {self.rule.describe()}. "
            "A page that points its own name at the console (DNS rebinding) is refused here; "
            "if you reach the console by this name (a proxy, a tunnel), add it to "
            "dlx_web_allowed_hosts (or --allowed-host).\n",
        )


class SameOrigin:
    """403 for a write (POST, PUT, PATCH, DELETE) that does not come from a page of the
    console: its ``Origin`` (or, without one, its ``Referer``) must have the request's scheme,
    host and port. Browsers send ``Origin`` on every POST; a script must send it too."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in WRITE_METHODS:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        scheme, host = scope.get("scheme", "http"), headers.get("host")
        source = headers.get("origin", headers.get("referer"))
        if same_origin(source, scheme, host):
            await self.app(scope, receive, send)
            return
        said = "no Origin or Referer" if source is None else f"Origin/Referer {source[:200]!r}"
        hint = f"Scripts send the header too, e.g. curl -H 'Origin: {scheme}://{host}'."
        if scheme == "http" and source is not None and source.startswith("https:"):
            hint = (
                "Behind a TLS proxy, the proxy must send X-Forwarded-Proto: https from an "
                "address uvicorn trusts (127.0.0.1, ::1, or FORWARDED_ALLOW_IPS)."
            )
        await _plain(
            send,
            403,
            f"refused: a {scope['method']} must come from the console's own pages, and this "
            f"one has {said}, not {scheme}://{host}. {hint}\n",
        )


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
            challenge = (b"www-authenticate", b'Basic realm="celery_dlx", charset="UTF-8"')
            await _plain(send, 401, "credentials needed (HTTP Basic)\n", challenge)
            return
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _plain(send, 413, f"request body over {self.max_body} bytes\n")
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


def user_of(request: HTTPConnection) -> User:
    """The authenticated user of a request (set by :class:`Guard`)."""
    return cast(User, request.scope["state"]["user"])
