"""``/api/``: the CLI's ``--json`` shapes over HTTP, same accounts and roles as the pages.

Each route's :class:`~celery_dlx_console.declare.Endpoint` stands above its handler, which reads its
query or body through it; ``/api/openapi.json`` publishes the same declarations. Writes wait for
their action and answer what the CLI's ``--json`` prints.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from celery_dlx.ops import STATUSES, obituaries
from celery_dlx.ops import purge as purge_ops
from celery_dlx.ops.canary import RedirectedReplayJSON, replay_run
from celery_dlx.ops.inspection import (
    GroupList,
    ObituaryFilters,
    ObituaryList,
    ParkedData,
    Stats,
    groups_data,
    list_rows,
    parked_data,
    show_data,
    stats_data,
)
from celery_dlx.ops.parked_actions import ParkedActionJSON
from celery_dlx.ops.purge import PurgeJSON
from celery_dlx_console import forms
from celery_dlx_console.actions import MAX_IDS, Busy, Job, JobJSON
from celery_dlx_console.audit import read_audit
from celery_dlx_console.auth import OPERATOR
from celery_dlx_console.declare import Endpoint, Field, Refusal, json_answer
from celery_dlx_console.guard import user_of
from celery_dlx_console.pages import console_of

#: Most obituaries one ``/api/obituaries`` call lists.
MAX_LIST = 500
#: Longest a replay's canary may be waited for, in seconds.
MAX_CANARY_TIMEOUT = 600.0

STRING: dict[str, Any] = {"type": "string"}
FLAG: dict[str, Any] = {"type": "boolean"}
ID_LIST: dict[str, Any] = {"type": "array", "items": STRING, "maxItems": MAX_IDS}
OPTIONAL_STRING: dict[str, Any] = {"type": ["string", "null"]}
WHEN: dict[str, Any] = {"type": "string", "examples": ["2h", "2024-05-01T12:00:00Z", "@1714564800"]}
NOT_FOUND = json_answer("no such obituary or job", Refusal)


async def _answer(request: Request, read: Callable[..., Any], **kwargs: Any) -> Response:
    """``read(runtime, **kwargs)`` in a worker thread, as JSON."""
    return JSONResponse(await run_in_threadpool(read, console_of(request).runtime, **kwargs))


def _limit(high: int, default: int) -> Field:
    return Field(
        "limit",
        {"type": "integer", "minimum": 1, "maximum": high},
        f"most rows (default {default})",
    )


GROUPS = Endpoint(
    "GET",
    "/api/groups",
    "Cause groups, most recently seen first (dlx groups --json)",
    {200: json_answer("the cause groups", GroupList)},
    params=(
        Field("new_since", STRING, "only causes first seen in this code version or later"),
        Field(
            "status",
            {"type": "string", "enum": ["unresolved", "all"]},
            "unresolved (default): causes with an obituary nobody replayed; all: every cause",
        ),
    ),
)


async def groups(request: Request) -> Response:
    q = GROUPS.query(request)  # an UnknownVersion is a DLXError: 400
    runtime = console_of(request).runtime
    data = await run_in_threadpool(groups_data, runtime, new_since=q.get("new_since"))
    if q.get("status", "unresolved") == "unresolved":
        data["groups"] = [g for g in data["groups"] if g["unresolved"]]
        data["count"] = len(data["groups"])
    return JSONResponse(data)


OBITUARIES = Endpoint(
    "GET",
    "/api/obituaries",
    "Obituaries, newest first (dlx list --json)",
    {200: json_answer("the obituaries", ObituaryList)},
    params=(
        Field("queue", STRING, "only those buried from this queue"),
        Field("task", STRING, "only those of this task"),
        Field("cause", STRING, "only those of this cause group"),
        Field("since", WHEN, "buried since: 2h (ago), an ISO time, or @epoch seconds"),
        Field("until", WHEN, "buried until (as since)"),
        _limit(MAX_LIST, 50),
        Field("oldest_first", FLAG, "oldest first"),
        Field("no_decode", FLAG, "skip decoding the payloads (faster)"),
        Field(
            "status",
            {"type": "string", "enum": [*STATUSES, "all"]},
            "what became of them after a replay (default unresolved; all: any)",
        ),
    ),
)


async def obituary_list(request: Request) -> Response:
    console = console_of(request)
    q = OBITUARIES.query(request)
    filters: ObituaryFilters = {
        "queue": q.get("queue"),
        "task": q.get("task"),
        "cause": q.get("cause"),
        "since": None if (s := forms.when_ms(q, "since")) is None else s / 1000,
        "until": None if (u := forms.when_ms(q, "until")) is None else u / 1000,
        "limit": q.get("limit", 50),
        "oldest_first": q.get("oldest_first", False),
        "status": q.get("status", "unresolved"),
    }
    decode = not q.get("no_decode", False)
    registry = console.registry if decode else None
    rows: ObituaryList = await run_in_threadpool(
        lambda: list_rows(console.runtime, registry=registry, decode=decode, **filters)
    )
    return JSONResponse(rows)


OBITUARY = Endpoint(
    "GET",
    "/api/obituary",
    "One obituary with its decoded payload (dlx show --json)",
    {
        200: json_answer(
            "every stored field of the obituary, its decoded payload and ISO times",
            {"type": "object", "required": ["id", "message_id", "queue", "payload"]},
        ),
        404: NOT_FOUND,
    },
    params=(Field("id", STRING, "an obituary id or a message id"),),
)


async def obituary(request: Request) -> Response:
    console = console_of(request)
    ident = str(OBITUARY.query(request).get("id", "")).strip()

    def read() -> dict[str, object] | None:
        ob = obituaries.get_obituary(console.runtime, ident)
        return None if ob is None else show_data(ob, console.registry)

    data = await run_in_threadpool(read) if ident else None
    if data is None:
        return JSONResponse({"error": "not found", "id": ident}, 404)
    return JSONResponse(data)


PARKED = Endpoint(
    "GET",
    "/api/parked",
    "Parked retries, soonest due first (dlx parked --json)",
    {200: json_answer("the parked retries", ParkedData)},
    params=(_limit(MAX_LIST, 50),),
)


async def parked(request: Request) -> Response:
    return await _answer(request, parked_data, limit=PARKED.query(request).get("limit", 50))


STATS = Endpoint(
    "GET",
    "/api/stats",
    "Fate counts and the stores' sizes (dlx stats --json)",
    {200: json_answer("the statistics", Stats)},
    params=(
        Field(
            "window",
            {"type": "number", "exclusiveMinimum": 0, "maximum": 8 * 86400},
            "seconds of fate counts (default 3600)",
        ),
    ),
)


async def stats(request: Request) -> Response:
    window = float(STATS.query(request).get("window", 3600))
    return await _answer(request, stats_data, window_s=window)


CHECK = Endpoint(
    "GET",
    "/api/check",
    "The topology check (dlx check --json)",
    {
        200: json_answer(
            "what was checked and the problems found; error: the check could not run",
            {"type": "object", "required": ["ok", "problems"]},
        )
    },
)


async def check(request: Request) -> Response:
    CHECK.query(request)
    return JSONResponse(await run_in_threadpool(console_of(request).check))


AUDIT = Endpoint(
    "GET",
    "/api/audit",
    "The audit log, newest first",
    {200: json_answer("the latest actions", {"type": "array", "items": {"type": "object"}})},
    params=(_limit(1000, 100),),
)


async def audit(request: Request) -> Response:
    return await _answer(request, read_audit, limit=AUDIT.query(request).get("limit", 100))


CSRF = Endpoint(
    "GET",
    "/api/csrf",
    "The caller's CSRF token, for the X-CSRF-Token header of writes",
    {
        200: json_answer(
            "the token",
            {"type": "object", "required": ["token"], "properties": {"token": STRING}},
        )
    },
)


async def csrf(request: Request) -> Response:
    CSRF.query(request)
    return JSONResponse({"token": console_of(request).csrf.token(user_of(request))})


JOB = Endpoint(
    "GET",
    "/api/jobs/{job_id}",
    "One action started from the pages (of the latest 100)",
    {200: json_answer("the action, with its result once it ended", JobJSON), 404: NOT_FOUND},
)


async def job(request: Request) -> Response:
    JOB.query(request)
    found = console_of(request).actions.job(request.path_params["job_id"])
    if found is None:
        return JSONResponse({"error": "not found", "id": request.path_params["job_id"]}, 404)
    return JSONResponse(found.to_json())


IDS = Field("ids", ID_LIST, f"obituary ids (at most {MAX_IDS}); or cause")
CAUSE = Field("cause", OPTIONAL_STRING, "a cause group, all its obituaries; or ids")
DRY_RUN = Field(
    "dry_run", FLAG, "say what would be done and change nothing, as the CLI's --dry-run"
)
BUSY = json_answer("another operator action is running", Refusal)

REPLAY = Endpoint(
    "POST",
    "/api/replay",
    "Replay obituaries (dlx replay --json)",
    {
        200: json_answer(
            "what was replayed; on a dry run replayed is empty and would_replay lists what a "
            "real run would publish",
            RedirectedReplayJSON,
        ),
        409: BUSY,
    },
    role=OPERATOR,
    body=(
        IDS,
        CAUSE,
        Field(
            "rate",
            {"type": ["number", "null"], "exclusiveMinimum": 0},
            "replays per second (default 10; at most dlx_web_max_replay_rate)",
        ),
        Field("canary", FLAG, "replay one first and go on only if it succeeds"),
        Field(
            "canary_timeout",
            {"type": ["number", "null"], "minimum": 1, "maximum": MAX_CANARY_TIMEOUT},
            "seconds to wait for the canary's fate (default 120)",
        ),
        Field("force", FLAG, "replay obituaries the ledger says were replayed already"),
        Field(
            "to_queue",
            {"type": ["string", "null"], "maxLength": 255},
            "an existing queue to replay to, instead of the queues the messages died in",
        ),
        DRY_RUN,
    ),
)


async def _waited(start: Callable[[], Job]) -> Response:
    """The result of the action ``start`` starts, once it ended; 409 while another runs."""
    try:
        started = start()
    except Busy as exc:
        return JSONResponse({"error": str(exc)}, 409)
    await run_in_threadpool(started.done.wait)
    return JSONResponse(started.result)


def _confirmed(got: dict[str, Any], what: str) -> bool:
    """Whether ``got`` asks for a dry run; else it must carry ``"yes": true``."""
    if not got.get("dry_run", False) and got.get("yes") is not True:
        raise forms.BadRequest(f'{what} needs "yes": true in the body (or "dry_run": true)')
    return bool(got.get("dry_run", False))


async def replay(request: Request) -> Response:
    got = await REPLAY.read(request)
    console, user = console_of(request), user_of(request)
    runtime = console.runtime
    maximum = console.settings.max_replay_rate
    opts = await run_in_threadpool(forms.replay_options, runtime, got, maximum)
    chosen = await run_in_threadpool(forms.targets, runtime, got.get("ids", []), got.get("cause"))
    if got.get("dry_run", False):  # as the CLI's --dry-run: nothing published, recorded or audited
        run = await run_in_threadpool(lambda: replay_run(runtime, chosen.ids, dry_run=True, **opts))
        return JSONResponse(run.to_json())
    replay = console.actions.replay
    return await _waited(lambda: replay(user, chosen.ids, chosen.label, cause=chosen.cause, **opts))


PURGE = Endpoint(
    "POST",
    "/api/purge",
    "Purge obituaries (dlx purge --json)",
    {
        200: json_answer(
            "what was purged; on a dry run purged is empty and would_purge lists what a real "
            "run would delete",
            PurgeJSON,
        ),
        409: BUSY,
    },
    role=OPERATOR,
    body=(
        IDS,
        CAUSE,
        Field("yes", FLAG, 'the confirmation: a purge needs "yes": true (a dry run does not)'),
        DRY_RUN,
    ),
    confirmation='"yes": true in the body, unless "dry_run": true',
)


async def purge(request: Request) -> Response:
    got = await PURGE.read(request)
    console, user = console_of(request), user_of(request)
    dry_run = _confirmed(got, "purging")
    runtime = console.runtime
    chosen = await run_in_threadpool(forms.targets, runtime, got.get("ids", []), got.get("cause"))
    if dry_run:  # as the CLI's --dry-run: nothing deleted, recorded or audited
        report = await run_in_threadpool(purge_ops.purge_targets, runtime, chosen.ids, dry_run=True)
        answer: PurgeJSON = report.to_json()
        return JSONResponse(answer)
    return await _waited(
        lambda: console.actions.purge(user, chosen.ids, chosen.label, cause=chosen.cause)
    )


PARKED_TARGETS = (
    Field(
        "ids",
        ID_LIST,
        f"parked retries' entry ids, MESSAGE_ID:ATTEMPT (at most {MAX_IDS}); or cause",
    ),
    Field("cause", OPTIONAL_STRING, "every parked retry of this cause; or ids"),
    Field("yes", FLAG, 'the confirmation: "yes": true (a dry run needs none)'),
    DRY_RUN,
)


def _parked_action(action: str, doc: str) -> Endpoint:
    return Endpoint(
        "POST",
        f"/api/parked/{action}",
        doc,
        {200: json_answer("what was done; on a dry run, what would be", ParkedActionJSON)},
        role=OPERATOR,
        body=PARKED_TARGETS,
        confirmation='"yes": true in the body, unless "dry_run": true',
    )


RETRY_NOW = _parked_action(
    "retry-now", "Make parked retries due now (dlx parked --retry-now --json)"
)
BURY_NOW = _parked_action(
    "bury-now", "Bury parked retries now, reason 'buried by USER' (dlx parked --bury-now --json)"
)


async def act_on_parked(request: Request) -> Response:
    """``POST /api/parked/retry-now`` and ``/api/parked/bury-now``."""
    endpoint = BURY_NOW if request.url.path.endswith("/bury-now") else RETRY_NOW
    got = await endpoint.read(request)
    dry_run = _confirmed(got, "this")
    ids, cause = got.get("ids") or None, got.get("cause")
    if bool(ids) == (cause is not None):
        raise forms.BadRequest('name parked retries by "ids" or by "cause" (one of the two)')
    act = forms.PARKED_ACTIONS["bury-now" if endpoint is BURY_NOW else "retry-now"]
    runtime, user = console_of(request).runtime, user_of(request)
    report = await run_in_threadpool(
        lambda: act(runtime, ids, cause=cause, by=f"web:{user.name}", dry_run=dry_run)
    )
    return JSONResponse(report.as_dict())


#: The routes of this module with their declarations.
ROUTES = (
    (GROUPS, groups),
    (OBITUARIES, obituary_list),
    (OBITUARY, obituary),
    (PARKED, parked),
    (STATS, stats),
    (CHECK, check),
    (AUDIT, audit),
    (CSRF, csrf),
    (JOB, job),
    (REPLAY, replay),
    (PURGE, purge),
    (RETRY_NOW, act_on_parked),
    (BURY_NOW, act_on_parked),
)
