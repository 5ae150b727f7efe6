"""``/api/``: the CLI's ``--json`` shapes over HTTP, same accounts and roles as the pages.

Reads: ``groups``, ``obituaries`` (``list``), ``obituary?id=`` (``show``), ``parked``,
``stats``, ``check``, ``audit``. Writes (operators, ``X-CSRF-Token`` from ``GET /api/csrf``):
``POST replay`` and ``POST purge`` take JSON (``ids`` or ``cause``; replay: ``rate``,
``canary``, ``force``, ``canary_timeout``; purge: ``"yes": true``), wait for the action and
return what ``dlx replay --json`` / ``dlx purge --json`` print.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from celery_dlx.ops import obituaries
from celery_dlx.ops.deploys import UnknownVersion
from celery_dlx.ops.inspection import (
    ObituaryFilters,
    ObituaryList,
    groups_data,
    list_rows,
    parked_data,
    show_data,
    stats_data,
)
from celery_dlx.web import forms
from celery_dlx.web.actions import Busy
from celery_dlx.web.audit import read_audit
from celery_dlx.web.guard import user_of
from celery_dlx.web.pages import console_of

#: Most obituaries one ``/api/obituaries`` call lists.
MAX_LIST = 500


def _json(data: Any, status: int = 200) -> JSONResponse:
    return JSONResponse(data, status_code=status)


async def groups(request: Request) -> Response:
    new_since = request.query_params.get("new_since")
    try:
        data = await run_in_threadpool(
            groups_data, console_of(request).runtime, new_since=new_since
        )
    except UnknownVersion as exc:
        return _json({"error": str(exc)}, 400)
    return _json(data)


async def obituary_list(request: Request) -> Response:
    console = console_of(request)
    p = request.query_params
    limit = forms.integer(p, "limit", 50, low=1, high=MAX_LIST)
    filters: ObituaryFilters = {
        "queue": forms.text(p, "queue"),
        "task": forms.text(p, "task"),
        "cause": forms.text(p, "cause"),
        "since": None if (s := forms.when_ms(p, "since")) is None else s / 1000,
        "until": None if (u := forms.when_ms(p, "until")) is None else u / 1000,
        "limit": limit,
        "oldest_first": forms.flag(p.get("oldest_first")),
    }
    decode = not forms.flag(p.get("no_decode"))

    def read() -> ObituaryList:
        return list_rows(
            console.runtime,
            registry=console.registry if decode else None,
            decode=decode,
            **filters,
        )

    return _json(await run_in_threadpool(read))


async def obituary(request: Request) -> Response:
    console = console_of(request)
    ident = forms.text(request.query_params, "id") or ""

    def read() -> dict[str, object] | None:
        ob = obituaries.get_obituary(console.runtime, ident)
        return None if ob is None else show_data(ob, console.registry)

    data = await run_in_threadpool(read)
    if data is None:
        return _json({"error": "not found", "id": ident}, 404)
    return _json(data)


async def parked(request: Request) -> Response:
    limit = forms.integer(request.query_params, "limit", 50, low=1, high=MAX_LIST)
    return _json(await run_in_threadpool(parked_data, console_of(request).runtime, limit=limit))


async def stats(request: Request) -> Response:
    window = forms.number(request.query_params.get("window") or 3600, "window")
    if not 0 < window <= 8 * 86400:
        raise forms.BadRequest("window must be between 0 and 8 days (seconds)")
    return _json(await run_in_threadpool(stats_data, console_of(request).runtime, window_s=window))


async def check(request: Request) -> Response:
    return _json(await run_in_threadpool(console_of(request).check))


async def audit(request: Request) -> Response:
    limit = forms.integer(request.query_params, "limit", 100, low=1, high=1000)
    return _json(await run_in_threadpool(read_audit, console_of(request).runtime, limit=limit))


async def csrf(request: Request) -> Response:
    return _json({"token": console_of(request).csrf.token(user_of(request))})


async def job(request: Request) -> Response:
    found = console_of(request).actions.job(request.path_params["job_id"])
    if found is None:
        return _json({"error": "not found", "id": request.path_params["job_id"]}, 404)
    return _json(found.to_json())


async def _body(request: Request) -> dict[str, Any] | Response:
    console = console_of(request)
    user = user_of(request)
    if not user.can_write:
        return _json({"error": f"{user.name} is a viewer: viewers cannot replay or purge"}, 403)
    if not console.csrf.valid(user, request.headers.get("x-csrf-token")):
        return _json({"error": "missing or wrong X-CSRF-Token (GET /api/csrf)"}, 403)
    try:
        data = json.loads(await request.body() or b"{}")
    except ValueError:
        return _json({"error": "the body must be a JSON object"}, 400)
    if not isinstance(data, dict):
        return _json({"error": "the body must be a JSON object"}, 400)
    if not isinstance(data.get("ids") or [], list):
        return _json({"error": "ids must be a list of obituary ids"}, 400)
    return data


async def replay(request: Request) -> Response:
    got = await _body(request)
    if isinstance(got, Response):
        return got
    console, user = console_of(request), user_of(request)
    rate = forms.replay_rate(got.get("rate"), console.settings.max_replay_rate)
    timeout = forms.number(got.get("canary_timeout") or 120, "canary_timeout")
    to_queue = await run_in_threadpool(forms.to_queue, console.runtime, got.get("to_queue"))
    chosen = await run_in_threadpool(
        forms.targets, console.runtime, list(got.get("ids") or []), got.get("cause")
    )
    try:
        started = console.actions.replay(
            user,
            chosen.ids,
            chosen.label,
            rate=rate,
            canary=forms.flag(got.get("canary")),
            force=forms.flag(got.get("force")),
            canary_timeout=max(1.0, min(timeout, 600.0)),
            cause=chosen.cause,
            to_queue=to_queue,
        )
    except Busy as exc:
        return _json({"error": str(exc)}, 409)
    await run_in_threadpool(started.done.wait)
    return _json(started.result)


async def purge(request: Request) -> Response:
    got = await _body(request)
    if isinstance(got, Response):
        return got
    console, user = console_of(request), user_of(request)
    if got.get("yes") is not True:
        return _json({"error": 'purging needs "yes": true in the body'}, 400)
    chosen = await run_in_threadpool(
        forms.targets, console.runtime, list(got.get("ids") or []), got.get("cause")
    )
    try:
        started = console.actions.purge(user, chosen.ids, chosen.label, cause=chosen.cause)
    except Busy as exc:
        return _json({"error": str(exc)}, 409)
    await run_in_threadpool(started.done.wait)
    return _json(started.result)
