"""``GET /api/openapi.json``: the JSON API as an OpenAPI 3.1 document, generated from the routes'
own declarations (:mod:`celery_dlx_console.declare`), the ones their handlers check requests with,
plus what the middleware and roles require of every route."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from celery_dlx import __version__
from celery_dlx_console.declare import (
    TEXT,
    Answer,
    Endpoint,
    Refusal,
    Schema,
    json_answer,
    schema_of,
)

#: The refusals of the JSON handlers and of the middleware in front of every route (plain text).
_ERROR_OR_TEXT = {"application/json": Refusal, "text/plain": TEXT}
COMMON: dict[int, Answer] = {
    400: Answer("a malformed request (the error names the key), or a foreign Host", _ERROR_OR_TEXT),
    401: Answer("credentials needed (HTTP Basic)", {"text/plain": TEXT}),
    503: json_answer("Redis unreachable or refused", Refusal),
}
WRITES: dict[int, Answer] = {
    403: Answer(
        "a role below the route's, a missing or wrong X-CSRF-Token, or an Origin (Referer) "
        "that is not the console's own",
        _ERROR_OR_TEXT,
    ),
    413: Answer("a body over the console's limit", {"text/plain": TEXT}),
}

SECURITY_SCHEMES = {
    "basic": {
        "type": "http",
        "scheme": "basic",
        "description": "the console's accounts: --viewer-auth (viewers), --basic-auth "
        "(operators), --editor-auth (editors); a console without accounts (loopback only) "
        "takes anyone as an operator",
    },
    "csrf": {
        "type": "apiKey",
        "in": "header",
        "name": "X-CSRF-Token",
        "description": "the caller's token from GET /api/csrf; every write needs it, and an "
        "Origin header naming the console itself (scheme, host and port)",
    },
}

ROLE_TEXT = {
    "viewer": "Any account (viewers, operators, editors).",
    "operator": "Operators and editors; viewers get 403.",
    "editor": "Editors only; operators and viewers get 403.",
}


def _responses(endpoint: Endpoint, defs: dict[str, Schema]) -> dict[str, Any]:
    answers = {**COMMON, **(WRITES if endpoint.writes else {}), **endpoint.responses}
    out: dict[str, Any] = {}
    for status, answer in sorted(answers.items()):
        content = {
            media: {"schema": schema_of(body, defs)} for media, body in answer.content.items()
        }
        out[str(status)] = {"description": answer.doc, "content": content}
    return out


def _parameters(endpoint: Endpoint) -> list[dict[str, Any]]:
    in_path = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
        for name in re.findall(r"{(\w+)}", endpoint.path)
    ]
    return in_path + [
        {
            "name": f.name,
            "in": "query",
            "required": f.required,
            "description": f.doc,
            "schema": f.schema,
        }
        for f in endpoint.params
    ]


def operation(endpoint: Endpoint, defs: dict[str, Schema]) -> dict[str, Any]:
    """The OpenAPI operation of ``endpoint``; the schemas it refers to go into ``defs``."""
    said = [ROLE_TEXT[endpoint.role]]
    if endpoint.body is not None:
        said.append("Unknown keys and values of the wrong type are refused with 400.")
    if endpoint.confirmation:
        said.append(f"Confirmation: {endpoint.confirmation}.")
    op: dict[str, Any] = {
        "operationId": re.sub(r"[^a-z0-9]+", "_", endpoint.label.lower()).strip("_"),
        "summary": endpoint.summary,
        "description": " ".join(said),
        "x-dlx-role": endpoint.role,
        "responses": _responses(endpoint, defs),
    }
    parameters = _parameters(endpoint)
    if parameters:
        op["parameters"] = parameters
    if endpoint.body is not None:
        op["requestBody"] = {
            "required": True,
            "content": {"application/json": {"schema": endpoint.body_schema()}},
        }
    if endpoint.writes:
        op["security"] = [{"basic": [], "csrf": []}]
    if endpoint.confirmation:
        op["x-dlx-confirmation"] = endpoint.confirmation
    return op


def document(endpoints: Iterable[Endpoint]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``endpoints``."""
    defs: dict[str, Schema] = {}
    paths: dict[str, dict[str, Any]] = {}
    for endpoint in endpoints:
        paths.setdefault(endpoint.path, {})[endpoint.method.lower()] = operation(endpoint, defs)
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "celery_dlx console",
            "version": __version__,
            "description": "The console's JSON API: the CLI's --json over HTTP. Writes need "
            "the caller's X-CSRF-Token (GET /api/csrf) and an Origin naming the console.",
        },
        "paths": paths,
        "components": {"schemas": dict(sorted(defs.items())), "securitySchemes": SECURITY_SCHEMES},
        "security": [{"basic": []}],
    }


OPENAPI = Endpoint(
    "GET",
    "/api/openapi.json",
    "This document",
    {200: json_answer("the OpenAPI 3.1 document of the JSON API", {"type": "object"})},
)


async def openapi(request: Request) -> Response:
    OPENAPI.query(request)
    return JSONResponse(request.app.state.api_document)
