"""The HTML pages and the form actions (server-rendered; JavaScript only enhances)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast
from urllib.parse import quote

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from celery_dlx.ops import UNRESOLVED, obituaries
from celery_dlx.ops.inspection import GroupRow, ParkedData, parked_data
from celery_dlx.ops.render import iso
from celery_dlx_console import forms
from celery_dlx_console.actions import Busy, Job, close_audited
from celery_dlx_console.audit import read_audit
from celery_dlx_console.auth import User
from celery_dlx_console.console import Console
from celery_dlx_console.guard import user_of
from celery_dlx_console.payload import obituary_view
from celery_dlx_console.reads import (
    GroupPage,
    ParkedSummary,
    cause_breakers,
    causes_page,
    fate_chart,
    graveyard_queues,
    group_info,
    group_page,
    group_versions,
    overview_breakers,
    parked_summary,
)
from celery_dlx_edit.edit import edits_of


def console_of(request: Request) -> Console:
    return cast(Console, request.app.state.console)


def render(request: Request, template: str, status: int = 200, **context: object) -> HTMLResponse:
    console, user = console_of(request), user_of(request)
    html = console.env.get_template(template).render(
        user=user, csrf=console.csrf.token(user), path=request.url.path, **context
    )
    return HTMLResponse(html, status_code=status)


def error_page(request: Request, status: int, message: str) -> HTMLResponse:
    return render(request, "error.html", status=status, status_code=status, message=message)


async def overview(request: Request) -> Response:
    console = console_of(request)
    runtime = console.runtime

    def read() -> dict[str, object]:
        return {
            "queues": graveyard_queues(runtime),
            "total": obituaries.count(runtime),
            "parked": parked_summary(runtime),
            "chart": fate_chart(runtime),
            "check": console.check(),
            "breakers": overview_breakers(runtime),
        }

    return render(request, "overview.html", 200, **await run_in_threadpool(read))


async def causes(request: Request) -> Response:
    console = console_of(request)
    offset, limit = forms.page_bounds(request.query_params)
    status = forms.choice(request.query_params, "status", forms.CAUSE_STATUSES, UNRESOLVED)
    data = await run_in_threadpool(
        lambda: causes_page(console.runtime, offset=offset, limit=limit, status=status)
    )
    return render(request, "causes.html", data=data, statuses=forms.CAUSE_STATUSES)


async def group(request: Request) -> Response:
    console = console_of(request)
    params = request.query_params
    cause = forms.text(params, "cause")
    if not cause:
        return error_page(request, 400, "which cause? (?cause=<fingerprint>)")
    filters = forms.group_filters(params)
    offset, limit = forms.page_bounds(params)

    def read() -> tuple[GroupRow | None, GroupPage, dict[str, object], list[dict[str, Any]]]:
        info = group_info(console.runtime, cause)
        page = group_page(
            console.runtime, cause, filters, offset=offset, limit=limit, registry=console.registry
        )
        versions = group_versions(console.runtime, info) if info else {}
        return info, page, versions, cause_breakers(console.runtime, cause) if info else []

    info, page, versions, breakers = await run_in_threadpool(read)
    if info is None:
        return error_page(request, 404, f"no obituary of cause {cause!r} in the graveyard")
    return render(
        request,
        "group.html",
        group=info,
        code=versions,
        breakers=breakers,
        page=page,
        filters=filters,
        params=dict(params),
        limit=limit,
        statuses=forms.OBITUARY_STATUSES,
        phrase=forms.purge_phrase(info["count"]),
        max_rate=console.settings.max_replay_rate,
    )


async def obituary(request: Request) -> Response:
    console = console_of(request)
    ident = forms.text(request.query_params, "id")
    if not ident:
        return error_page(request, 400, "which obituary? (?id=<obituary id or message id>)")

    def read() -> dict[str, object] | None:
        ob = obituaries.get_obituary(console.runtime, ident)
        if ob is None:
            return None
        redirects = console.runtime.graveyard.redirects([ob.id])[0]
        view = obituary_view(ob, console.registry, redirects)
        view["edits"] = edits_of(console.runtime, ob.id)
        view["status"] = {
            "name": ob.status_name,
            "at": iso(ob.status.get("at")),
            "next": ob.status.get("next") or None,
            "prev": ob.status.get("prev") or None,
            "repeats": int(ob.status.get("repeats") or 0),
            "by": ob.status.get("by") or None,
        }
        return view

    data = await run_in_threadpool(read)
    if data is None:
        return error_page(request, 404, f"no obituary with id or message id {ident!r}")
    return render(
        request,
        "obituary.html",
        ob=data,
        phrase=forms.purge_phrase(1),
        max_rate=console.settings.max_replay_rate,
    )


async def parked(request: Request) -> Response:
    console = console_of(request)
    limit = forms.integer(request.query_params, "limit", 50, low=1, high=500)

    def read() -> tuple[ParkedSummary, ParkedData]:
        return parked_summary(console.runtime), parked_data(console.runtime, limit=limit)

    summary, data = await run_in_threadpool(read)
    return render(request, "parked.html", summary=summary, data=data)


async def parked_action(request: Request) -> Response:
    """``POST /actions/parked`` (``csrf``, ``action`` retry-now or bury-now, ``ids`` or
    ``cause``): without ``step=confirm``, the dry run's preview with the form that confirms it;
    with it, the action as a job of the operator, audited, as ``dlx parked --retry-now/--bury-now``.
    """
    form, console, user = await _form(request)
    action = forms.text(form, "action")
    if action not in forms.PARKED_ACTIONS:
        return error_page(request, 400, "which action? (retry-now or bury-now)")
    chosen = forms.parked_targets(form.getlist("ids"), form.get("cause"))
    if forms.text(form, "step") != "confirm":
        act, ids, by = forms.PARKED_ACTIONS[action], chosen.ids or None, f"web:{user.name}"
        report = await run_in_threadpool(
            lambda: act(console.runtime, ids, cause=chosen.cause, by=by, dry_run=True)
        )
        return render(
            request,
            "parked_action.html",
            action=action,
            verb="Retry now" if action == "retry-now" else "Bury now",
            chosen=chosen,
            report=report.as_dict(),
        )
    return _started(
        request,
        lambda: console.actions.parked(user, action, chosen.ids, chosen.cause, chosen.label),
    )


async def audit(request: Request) -> Response:
    console = console_of(request)
    entries = await run_in_threadpool(read_audit, console.runtime)
    running = [j.to_json() for j in console.actions.jobs() if j.status == "running"]
    return render(request, "audit.html", entries=entries, running=running)


async def job(request: Request) -> Response:
    console = console_of(request)
    found = console.actions.job(request.path_params["job_id"])
    if found is None:
        return error_page(request, 404, "no such job in this console (see the audit log)")
    return render(request, "job.html", job=found.to_json())


async def _form(request: Request, what: str = "replay or purge") -> tuple[FormData, Console, User]:
    """The posted form of an operator with a valid CSRF token.

    Raises:
        HTTPException: 403 (shown as the error page).
    """
    console, user = console_of(request), user_of(request)
    if not user.can_write:
        raise HTTPException(403, f"{user.name} is a viewer: viewers cannot {what}")
    form = await request.form(max_files=0, max_fields=forms.MAX_IDS + 20)
    if not console.csrf.valid(user, form.get("csrf")):  # type: ignore[arg-type]
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and retry")
    return form, console, user


def _started(request: Request, start: Callable[[], Job]) -> Response:
    """To the page of the job ``start`` starts; 409 while another action runs."""
    try:
        started = start()
    except Busy as exc:
        return error_page(request, 409, str(exc))
    return RedirectResponse(f"/jobs/{started.id}", status_code=303)


async def replay_action(request: Request) -> Response:
    form, console, user = await _form(request)
    maximum = console.settings.max_replay_rate
    opts = await run_in_threadpool(forms.replay_options, console.runtime, form, maximum)
    chosen = await run_in_threadpool(
        forms.targets, console.runtime, form.getlist("ids"), form.get("cause")
    )
    if not chosen.ids:
        return error_page(request, 400, "nothing to replay: no obituary matches")
    replay = console.actions.replay
    return _started(
        request, lambda: replay(user, chosen.ids, chosen.label, cause=chosen.cause, **opts)
    )


async def purge_action(request: Request) -> Response:
    form, console, user = await _form(request)
    chosen = await run_in_threadpool(
        forms.targets, console.runtime, form.getlist("ids"), form.get("cause")
    )
    phrase = forms.purge_phrase(len(chosen.ids))
    typed = str(form.get("confirm") or "").strip()
    if typed != phrase:
        return error_page(
            request,
            400,
            f"not purged: type {phrase!r} to confirm purging {len(chosen.ids)} obituaries "
            f"(you typed {typed!r})",
        )
    return _started(
        request, lambda: console.actions.purge(user, chosen.ids, chosen.label, cause=chosen.cause)
    )


async def close_breaker_action(request: Request) -> Response:
    """``POST /actions/close-breaker`` (``csrf``, ``cause``, ``queue``; ``back=group`` returns to
    the cause page): an operator closes one open breaker, as ``dlx breakers close``."""
    form, console, user = await _form(request, "close a breaker")
    cause, queue = forms.text(form, "cause"), forms.text(form, "queue")
    if not cause or not queue:
        return error_page(request, 400, "which breaker? (a cause and a queue)")
    await run_in_threadpool(close_audited, console.runtime, user, cause, queue)
    if forms.text(form, "back") == "group":
        return RedirectResponse(f"/group?cause={quote(cause, safe='')}", status_code=303)
    return RedirectResponse("/", status_code=303)
