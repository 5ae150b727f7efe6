"""The Starlette application of the console: routes, error pages, ``/metrics``, static files."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from celery_dlx import DLXError, Runtime
from celery_dlx_console import api, editing, openapi, pages
from celery_dlx_console.auth import check_listen
from celery_dlx_console.console import Console, WebSettings
from celery_dlx_console.guard import Guard, SameOrigin, TrustedHosts
from celery_dlx_console.hosts import HostRule

STATIC = Path(__file__).resolve().parent / "static"

#: The JSON API's routes with their declarations (published at ``/api/openapi.json``).
API_ROUTES = (
    *api.ROUTES,
    (editing.EDIT, editing.edit_api),
    (openapi.OPENAPI, openapi.openapi),
)


async def metrics(request: Request) -> Response:
    console = pages.console_of(request)
    body = await run_in_threadpool(generate_latest, console.metrics)
    return Response(body, media_type=CONTENT_TYPE_LATEST)


async def _error(request: Request, status: int, message: str) -> Response:
    """JSON for the API and before authentication, else the error page."""
    if request.url.path.startswith("/api/") or "user" not in request.scope.get("state", {}):
        return JSONResponse({"error": message}, status_code=status)
    return pages.error_page(request, status, message)


async def on_dlx_error(request: Request, exc: Exception) -> Response:
    return await _error(request, 400, str(exc))


async def on_http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    response = await _error(request, exc.status_code, str(exc.detail))
    response.headers.update(exc.headers or {})  # a 405's Allow
    return response


async def on_redis_error(request: Request, exc: Exception) -> Response:
    return await _error(request, 503, f"Redis unreachable or refused ({exc}); check dlx_redis_url")


def create_app(runtime: Runtime, settings: WebSettings) -> Starlette:
    """The console of ``runtime``'s app (a :class:`~celery_dlx.wiring.runtime.Runtime`).

    Raises:
        ConfigurationError: malformed accounts, or a non-loopback address without any.
    """
    from celery_dlx.ops import STORE_ERRORS

    console = Console(runtime, settings)
    check_listen(settings.host, console.accounts)
    routes = [
        Route("/", pages.overview),
        Route("/causes", pages.causes),
        Route("/group", pages.group),
        Route("/obituary", pages.obituary),
        Route("/parked", pages.parked),
        Route("/audit", pages.audit),
        Route("/jobs/{job_id}", pages.job),
        Route("/edit", editing.edit_page),
        Route("/actions/edit", editing.edit_action, methods=["POST"]),
        Route("/actions/replay", pages.replay_action, methods=["POST"]),
        Route("/actions/purge", pages.purge_action, methods=["POST"]),
        Route("/actions/parked", pages.parked_action, methods=["POST"]),
        Route("/actions/close-breaker", pages.close_breaker_action, methods=["POST"]),
        *[Route(e.path, handler, methods=[e.method]) for e, handler in API_ROUTES],
        Route("/metrics", metrics),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    hosts = HostRule.listening(settings.host, settings.port, settings.allowed_hosts)
    app = Starlette(
        routes=routes,
        # Outermost first: a foreign Host or a write from another site is refused before any
        # credentials are asked for.
        middleware=[
            Middleware(TrustedHosts, rule=hosts),
            Middleware(SameOrigin),
            Middleware(Guard, accounts=console.accounts, max_body=settings.max_body),
        ],
        exception_handlers={
            DLXError: on_dlx_error,
            HTTPException: on_http_error,
            **dict.fromkeys(STORE_ERRORS, on_redis_error),
        },
    )
    app.state.console = console
    app.state.api_document = openapi.document(e for e, _ in API_ROUTES)
    return app
