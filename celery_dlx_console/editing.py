"""The edit page and ``POST /api/edit``: an editor changes a buried message's payload and
headers, sees the diff, then confirms to replay the edited copy (:mod:`celery_dlx_edit.edit` does
the work and the recording). Only editors may; operators and viewers get 403."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from celery_dlx.errors import DLXError
from celery_dlx.ops import obituaries
from celery_dlx_console import forms
from celery_dlx_console.auth import EDITOR
from celery_dlx_console.declare import Endpoint, Field, Refusal, json_answer
from celery_dlx_console.guard import user_of
from celery_dlx_console.pages import console_of, error_page, render
from celery_dlx_console.payload import obituary_view
from celery_dlx_edit.edit import EditJSON, EditReport, edit, editable, edits_of
from celery_dlx_edit.payload import ABSENT, EditError, parse_assignment

#: Empty rows the form offers for payload paths and for headers.
PATH_ROWS = 4
HEADER_ROWS = 2
#: Most rows a posted form may carry.
MAX_ROWS = 50


@dataclass
class EditForm:
    """What the form holds: payload rows, header rows (name, JSON text), the target queue."""

    rows: list[tuple[str, str]] = field(default_factory=list)
    headers: list[tuple[str, str]] = field(default_factory=list)
    to_queue: str = ""

    def padded(self) -> dict[str, object]:
        rows = self.rows + [("", "")] * max(1, PATH_ROWS - len(self.rows))
        headers = self.headers + [("", "")] * max(1, HEADER_ROWS - len(self.headers))
        return {"rows": rows, "headers": headers, "to_queue": self.to_queue}


def _pairs(names: Sequence[object], values: Sequence[object]) -> list[tuple[str, str]]:
    pairs = ((str(n).strip(), str(v).strip()) for n, v in zip(names, values, strict=False))
    out = [(n, v) for n, v in pairs if n]
    if len(out) > MAX_ROWS:
        raise forms.BadRequest(f"at most {MAX_ROWS} rows in one edit")
    return out


def _parsed(pairs: list[tuple[str, str]], option: str) -> list[tuple[str, Any]]:
    return [parse_assignment(f"{name}={value}", option) for name, value in pairs]


def shown(value: Any) -> str:
    """A diff value as text (JSON; the template escapes it)."""
    return "(absent)" if value is ABSENT else json.dumps(value, ensure_ascii=False, default=str)


def _diff_rows(report: EditReport | None) -> list[dict[str, str]]:
    if report is None:
        return []
    plan = report.plan
    changes = [("payload", c) for c in plan.changes] + [("header", c) for c in plan.header_changes]
    return [
        {"kind": kind, "path": c.path, "before": shown(c.before), "after": shown(c.after)}
        for kind, c in changes
    ]


def _edit(request: Request, ident: str, **options: Any) -> Awaitable[EditReport]:
    """:func:`~celery_dlx_edit.edit.edit` of ``ident`` by the caller, in a worker thread."""
    console, user = console_of(request), user_of(request)
    return run_in_threadpool(
        lambda: edit(
            console.runtime,
            ident,
            registry=console.registry,
            user=user.name,
            role=user.role,
            **options,
        )
    )


def _refuse(request: Request) -> None:
    """Raises: HTTPException: 403 for anyone but an editor (shown as the error page)."""
    user = user_of(request)
    if not user.can_edit:
        raise HTTPException(
            403,
            f"{user.name} is {'an' if user.role[0] in 'aeiou' else 'a'} {user.role}: only "
            "editors (--editor-auth, dlx_web_editors) may edit a message",
        )


async def edit_page(request: Request) -> Response:
    _refuse(request)
    ident = forms.text(request.query_params, "id")
    if not ident:
        return error_page(request, 400, "which obituary? (?id=<obituary id or message id>)")
    return await _page(request, ident, EditForm())


async def _page(
    request: Request,
    ident: str,
    form: EditForm,
    *,
    status: int = 200,
    error: str | None = None,
    preview: EditReport | None = None,
    done: EditReport | None = None,
) -> Response:
    console = console_of(request)

    def read() -> tuple[dict[str, object], str | None, list[dict[str, Any]]] | None:
        ob = obituaries.get_obituary(console.runtime, ident)
        if ob is None:
            return None
        view = obituary_view(ob, console.registry)
        return view, editable(ob, console.registry), edits_of(console.runtime, ob.id)

    found = await run_in_threadpool(read)
    if found is None:
        return error_page(request, 404, f"no obituary with id or message id {ident!r}")
    view, refusal, past = found
    return render(
        request,
        "edit.html",
        status=status,
        ob=view,
        refusal=refusal,
        form=form.padded(),
        error=error,
        preview=preview,
        done=done,
        diff=_diff_rows(done or preview),
        past=past,
    )


async def edit_action(request: Request) -> Response:
    _refuse(request)
    console, user = console_of(request), user_of(request)
    posted = await request.form(max_files=0, max_fields=4 * MAX_ROWS + 20)
    if not console.csrf.valid(user, posted.get("csrf")):  # type: ignore[arg-type]
        raise HTTPException(403, "missing or wrong CSRF token: reload the page and retry")
    ident = str(posted.get("id") or "").strip()
    if not ident:
        return error_page(request, 400, "which obituary? (the form has no id)")
    form = EditForm(
        rows=_pairs(posted.getlist("path"), posted.getlist("value")),
        headers=_pairs(posted.getlist("header"), posted.getlist("header_value")),
        to_queue=str(posted.get("to_queue") or "").strip(),
    )
    confirm = posted.get("step") == "replay"
    try:
        sets, headers = _parsed(form.rows, "path"), _parsed(form.headers, "header")
        report = await _edit(
            request,
            ident,
            sets=sets,
            headers=headers,
            replay=confirm,
            to_queue=form.to_queue or None,
        )
    except DLXError as exc:
        status = 404 if isinstance(exc, EditError) and "no obituary" in str(exc) else 400
        return await _page(request, ident, form, status=status, error=str(exc))
    if confirm:
        return await _page(request, ident, EditForm(), done=report)
    return await _page(request, ident, form, preview=report)


def _json_pairs(raw: object) -> list[tuple[str, Any]]:
    """``{"path": value}`` or ``[["path", value], ...]`` (checked by :data:`EDIT`) as pairs, in
    order."""
    if isinstance(raw, dict):
        return [(str(k), v) for k, v in raw.items()]
    if isinstance(raw, list):
        return [(str(p[0]), p[1]) for p in raw]
    return []


def _assignments(what: str) -> dict[str, Any]:
    pair = {"type": "array", "prefixItems": [{"type": "string"}, {}], "minItems": 2, "maxItems": 2}
    return {
        "anyOf": [
            {"type": "object", "maxProperties": MAX_ROWS},
            {"type": "array", "items": pair, "maxItems": MAX_ROWS},
            {"type": "null"},
        ],
        "examples": [{"kwargs.x": 5} if what == "set" else {"x-tenant": "globex"}],
    }


EDIT = Endpoint(
    "POST",
    "/api/edit",
    "Edit a buried message and replay the edited copy (dlx edit --json)",
    {
        200: json_answer("the diff, and whether the edited copy was replayed", EditJSON),
        404: json_answer("no such obituary", Refusal),
    },
    role=EDITOR,
    body=(
        Field("id", {"type": "string", "minLength": 1}, "an obituary id or message id", True),
        Field(
            "set",
            _assignments("set"),
            f"payload paths and their JSON values, applied in order (at most {MAX_ROWS})",
        ),
        Field(
            "headers",
            _assignments("headers"),
            f"headers and their JSON values, null removes one (at most {MAX_ROWS})",
        ),
        Field(
            "to_queue",
            {"type": ["string", "null"], "maxLength": 255},
            "an existing queue to replay the edited copy to",
        ),
        Field("replay", {"type": "boolean"}, "publish the edited copy (else: the diff only)"),
        Field(
            "dry_run",
            {"type": "boolean"},
            "the diff only, nothing published or recorded, as the CLI's --dry-run",
        ),
    ),
    confirmation='"replay": true in the body publishes; without it (or with "dry_run": true) '
    "only the diff is returned",
)


async def edit_api(request: Request) -> Response:
    """``POST /api/edit``: answers what ``dlx edit --json`` prints."""
    data = await EDIT.read(request)
    try:
        report = await _edit(
            request,
            data["id"],
            sets=_json_pairs(data.get("set")),
            headers=_json_pairs(data.get("headers")),
            replay=data.get("replay", False),
            dry_run=data.get("dry_run", False),
            to_queue=data.get("to_queue") or None,
        )
    except DLXError as exc:
        status = 404 if "no obituary" in str(exc) else 400
        return JSONResponse({"error": str(exc)}, status)
    return JSONResponse(report.to_json())
