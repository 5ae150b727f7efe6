"""``celery dlx list/show/groups/replay/edit/purge``: the graveyard from the command line.

Thin: :mod:`celery_dlx.ops.inspection`, :mod:`celery_dlx.ops.replay` and :mod:`celery_dlx.store.graveyard` do
the work and return data; these commands print it (tables, or JSON with ``--json``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from celery_dlx.cli.kit import (
    EXIT_CANARY,
    EXIT_INCOMPLETE,
    command,
    duration,
    echo_json,
    filter_options,
    handle_errors,
    json_option,
    limit_option,
    no_obituary,
    progress_bar,
    runtime_of,
    show_progress,
)
from celery_dlx.fates import now_ms
from celery_dlx.ops import obituaries, purge
from celery_dlx.ops.render import ago, clip, count, dumps, human_seconds, table

if TYPE_CHECKING:
    from celery_dlx.wiring.runtime import Runtime

_PROTO = click.option(
    "--proto",
    "protos",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False),
    help="Extra protobuf descriptor set to decode payloads with (repeatable).",
)


@command("list")
@filter_options
@limit_option("Most obituaries to show.")
@click.option("--oldest-first", is_flag=True, help="Oldest burial first (default: newest).")
@click.option("--no-decode", is_flag=True, help="Do not load and decode payloads (faster).")
@click.option(
    "--status",
    type=click.Choice(["unresolved", "replayed", "resolved", "failed-again", "all"]),
    default="unresolved",
    show_default=True,
    help="What became of them after a replay: unresolved (nobody replayed them, or their "
    "replay failed again as a new obituary), replayed (waiting for the outcome), resolved, "
    "failed-again, or all.",
)
@_PROTO
@json_option
def list_command(
    ctx: click.Context,
    /,
    limit: int,
    oldest_first: bool,
    no_decode: bool,
    status: str,
    protos: tuple[str, ...],
    as_json: bool,
    **filters: Any,
) -> None:
    """List obituaries, newest first, with a decoded payload preview (by default the unresolved
    ones: those replayed and resolved stay until dlx_resolved_retention, with --status)."""
    from celery_dlx.ops.inspection import list_rows, registry_for

    runtime = runtime_of(ctx)
    data = list_rows(
        runtime,
        registry=None if no_decode else registry_for(runtime, protos),
        decode=not no_decode,
        limit=limit,
        oldest_first=oldest_first,
        status=status,
        **filters,
    )
    if as_json:
        echo_json(data)
        return
    now = now_ms()
    rows = [
        (
            r["id"] + (f" (x{r['repeats'] + 1})" if r["repeats"] else ""),
            ago(r["buried_ms"], now),
            r["queue"],
            r["task"] or "-",
            r["attempt"],
            r["exc_type"].rsplit(".", 1)[-1],
            r["cause"],
            r["payload"]["preview"] or f"{r['payload']['size']} bytes",
        )
        for r in data["obituaries"]
    ]
    headers = ("ID", "BURIED", "QUEUE", "TASK", "ATT", "EXCEPTION", "CAUSE", "PAYLOAD")
    if rows:
        click.echo(table(headers, rows, shrink=("PAYLOAD", "TASK", "EXCEPTION", "QUEUE")))
    click.echo(f"{data['count']} shown of {data['total']} in the graveyard")


@command("show")
@click.argument("ident")
@click.option("--raw", is_flag=True, help="Include the payload bytes as base64.")
@_PROTO
@json_option
def show_command(
    ctx: click.Context, ident: str, raw: bool, protos: tuple[str, ...], as_json: bool
) -> None:
    """Show one obituary (by obituary id or message id): decoded payload, headers, attempts,
    traceback."""
    from celery_dlx.ops.inspection import registry_for, show_data

    runtime = runtime_of(ctx)
    ob = obituaries.get_obituary(runtime, ident)
    if ob is None:
        no_obituary(ctx, ident, as_json)
    data = show_data(ob, registry_for(runtime, protos), raw=raw)
    if as_json:
        echo_json(data)
        return
    click.echo(_show_text(data))


def _show_text(data: dict[str, Any]) -> str:
    now = now_ms()
    lines = [f"obituary {data['id']}  message {data['message_id']}"]
    facts = (
        ("queue", data["queue"]),
        ("task", data["task"]),
        ("origin", data["origin"]),
        ("buried", f"{data['buried_at']} ({ago(data['buried_ms'], now)})"),
        ("reason", data["reason"]),
        ("death", data["death_reason"]),
        ("exception", f"{data['exc_type']}: {data['exc_message']}"),
        ("cause", data["cause"]),
        ("importance", data["importance"]),
        ("attempts", data["attempt"]),
        ("first failure", data["first_failure_at"]),
        ("code version", data["code_version"]),
        ("host", data["hostname"]),
        ("replayed from", data["replayed_from"]),
        ("replays", ", ".join(r["at"] for r in data["replays"]) or "never"),
    )
    lines += [f"  {k + ':':<15}{'-' if v in (None, '') else v}" for k, v in facts]
    if data["attempts"]:
        lines += ["", "attempts:"]
        lines += [f"  {a['at']}  {a['fate']:<9} {a['cause']}" for a in data["attempts"]]
    lines += ["", "properties:"] + [f"  {k}: {v}" for k, v in data["properties"].items()]
    lines += ["", "headers:"] + [f"  {k}: {clip(v, 200)}" for k, v in data["headers"].items()]
    payload = data["payload"]
    decoded = payload["decoded"]
    lines += [
        "",
        f"payload: {payload['size']} bytes, {payload['content_type'] or 'no content type'}",
    ]
    if decoded is not None:
        kind = decoded["kind"] + (
            f" {decoded['type_name']} (score {decoded['score']})" if decoded["type_name"] else ""
        )
        lines.append(
            f"  decoded as {kind}"
            + (f", layers {'+'.join(decoded['layers'])}" if decoded["layers"] else "")
        )
        lines += [f"  note: {n}" for n in decoded["notes"]]
        lines += ["  " + line for line in dumps(decoded["data"]).splitlines()]
    if payload["base64"]:
        lines += ["", "payload (base64):", payload["base64"]]
    if data["traceback"]:
        lines += ["", "traceback:", data["traceback"].rstrip()]
    return "\n".join(lines)


@command("groups")
@json_option
@click.option(
    "--new-since",
    "new_since",
    metavar="VERSION",
    default=None,
    help="Only causes first seen with code version VERSION, or after VERSION was first seen "
    "in the graveyard (versions are ordered by when each was first seen).",
)
@click.option(
    "--status",
    type=click.Choice(["unresolved", "all"]),
    default="unresolved",
    show_default=True,
    help="unresolved: the causes with an obituary nobody replayed (or whose replay failed "
    "again); all: every cause, those whose obituaries were all replayed too.",
)
def groups_command(ctx: click.Context, as_json: bool, new_since: str | None, status: str) -> None:
    """Obituaries grouped by cause fingerprint: count, how many were resolved by a replay,
    first and last seen, the code version it was first seen with, an example."""
    from celery_dlx.ops.deploys import UnknownVersion
    from celery_dlx.ops.inspection import groups_data

    try:
        data = groups_data(runtime_of(ctx), new_since=new_since)
    except UnknownVersion as exc:
        raise click.BadParameter(str(exc), param_hint="--new-since") from exc
    if status == "unresolved":
        data["groups"] = [g for g in data["groups"] if g["unresolved"]]
        data["count"] = len(data["groups"])
    if as_json:
        echo_json(data)
        return
    now = now_ms()
    rows = [
        (
            g["cause"],
            g["count"],
            g["resolved"] or "-",
            ago(g["first_ms"], now),
            ago(g["last_ms"], now),
            g["task"] or g["queue"],
            f"{g['exc_type'].rsplit('.', 1)[-1]}: {g['exc_message']}",
            (g["first_seen_version"] or "?")[:12],  # a git SHA shortened
            g["example_id"],
        )
        for g in data["groups"]
    ]
    headers: tuple[str, ...] = ("CAUSE", "COUNT", "RESOLVED", "FIRST", "LAST", "TASK/QUEUE")
    headers += ("EXCEPTION", "VERSION", "EXAMPLE")
    if rows:
        click.echo(table(headers, rows, shrink=("EXCEPTION", "TASK/QUEUE")))
    click.echo(f"{count(data['count'], 'cause')}, {count(data['total'], 'obituary', 'obituaries')}")


@command("replay")
@click.argument("ids", nargs=-1)
@filter_options
@click.option("--all", "everything", is_flag=True, help="Replay the whole graveyard.")
@click.option(
    "--rate",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Most replays per second.",
)
@click.option("--canary", is_flag=True, help="Replay one first; go on only if it succeeded.")
@click.option(
    "--canary-timeout",
    default="120s",
    callback=duration("--canary-timeout"),
    show_default=True,
    help="How long to wait for the canary's fate.",
)
@click.option(
    "--canary-settle",
    default="5s",
    callback=duration("--canary-settle"),
    show_default=True,
    help="Foreign messages: how long after the queue emptied without a failure.",
)
@click.option(
    "--keep-attempts", is_flag=True, help="Keep the attempt count (default: a fresh retry budget)."
)
@click.option(
    "--force", is_flag=True, help="Replay obituaries the ledger says were replayed already."
)
@click.option(
    "--to-queue",
    "to_queue",
    metavar="QUEUE",
    default=None,
    help="Publish to this existing queue instead of the one each message died in.",
)
@click.option("--dry-run", is_flag=True, help="Say what would be replayed; publish nothing.")
@json_option
def replay_command(
    ctx: click.Context,
    /,
    ids: tuple[str, ...],
    everything: bool,
    rate: float | None,
    canary: bool,
    canary_timeout: float,
    canary_settle: float,
    keep_attempts: bool,
    force: bool,
    to_queue: str | None,
    dry_run: bool,
    as_json: bool,
    **filters: Any,
) -> None:
    """Put buried messages back on their queues (default exchange, attempts reset).

    IDS are obituary ids; otherwise the filters (or --all) choose. Each obituary is replayed once
    (the replay ledger) unless --force. --to-queue sends them to another queue (it must exist).
    """
    from celery_dlx.ops.canary import replay_run

    runtime, targets = _targets(ctx, "replay", ids, everything, filters)
    with progress_bar(len(targets), "replaying", show_progress(as_json)) as advance:
        run = replay_run(
            runtime,
            targets,
            rate=rate,
            keep_attempts=keep_attempts,
            force=force,
            dry_run=dry_run,
            canary=canary,
            canary_timeout=canary_timeout,
            canary_settle=canary_settle,
            progress=advance,
            to_queue=to_queue,
        )
    if as_json:
        echo_json(run.to_json())
    else:
        click.echo(_replay_text(run))
    if run.canary is not None and not run.canary.succeeded:
        ctx.exit(EXIT_CANARY)
    if not run.complete:
        ctx.exit(EXIT_INCOMPLETE)


def _replay_text(run: Any) -> str:
    r = run.report
    verb = "would replay" if r.dry_run else "replayed"
    lines = [f"{verb} {len(r.replayed)} of {run.targets}"]
    if r.to_queue:
        died = ", ".join(f"{n} from {q}" for q, n in sorted(r.from_queues.items()))
        lines[0] += f" to queue {r.to_queue}" + (f" ({died})" if died else "")
    if run.canary is not None:
        c = run.canary
        lines.append(
            f"canary {c.obituary_id} (message {c.message_id}): {c.outcome} after "
            f"{human_seconds(c.waited_s)}: {c.detail}"
        )
    if run.stopped:
        lines.append(f"stopped: {len(run.not_replayed)} not replayed")
    lines += [f"skipped {i}: {why}" for i, why in r.skipped]
    lines += [f"failed {i}: {why}" for i, why in r.failed]
    lines += [f"missing {i}" for i in r.missing]
    return "\n".join(lines)


@click.command("edit")
@click.argument("ident")
@click.option(
    "--set",
    "sets",
    multiple=True,
    metavar="PATH=JSON",
    help="Set a value of the decoded payload: args.0, kwargs.order_id (a Celery task), a.b.0 or "
    "/a/b (JSON), field.sub (protobuf); the value is JSON (repeatable).",
)
@click.option(
    "--header",
    "header_edits",
    multiple=True,
    metavar="NAME=JSON",
    help="Set a header (JSON null removes it); x-dlx-* and x-death* cannot be set (repeatable).",
)
@click.option(
    "--payload",
    "payload_file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Replace the whole body with this file's bytes (it must decode as the message does).",
)
@click.option("--replay", is_flag=True, help="Publish the edited copy (a new message id).")
@click.option("--dry-run", is_flag=True, help="Show the diff only; publish and record nothing.")
@click.option(
    "--to-queue",
    "to_queue",
    metavar="QUEUE",
    default=None,
    help="Replay the edited copy to this existing queue instead of the one it died in.",
)
@_PROTO
@json_option
@click.pass_context
@handle_errors
def edit_command(
    ctx: click.Context,
    ident: str,
    sets: tuple[str, ...],
    header_edits: tuple[str, ...],
    payload_file: str | None,
    replay: bool,
    dry_run: bool,
    to_queue: str | None,
    protos: tuple[str, ...],
    as_json: bool,
) -> None:
    """Edit a buried message (obituary id or message id) and show the diff; --replay publishes
    the edited copy as a new message (a new task id for a Celery task) with header
    x-dlx-edited-from. The obituary stays; the edit is recorded in its ledger, the history and
    the audit log. Pickle and bodies that do not decode exactly cannot be edited."""
    import getpass
    from pathlib import Path

    from celery_dlx.ops.inspection import registry_for
    from celery_dlx_edit.edit import edit
    from celery_dlx_edit.payload import parse_assignment

    assignments = [parse_assignment(s, "--set") for s in sets]
    header_values = [parse_assignment(h, "--header") for h in header_edits]
    payload = Path(payload_file).read_bytes() if payload_file else None
    runtime = runtime_of(ctx)
    if obituaries.get_obituary(runtime, ident, with_payload=False) is None:
        no_obituary(ctx, ident, as_json)
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "?"
    report = edit(
        runtime,
        ident,
        sets=assignments,
        headers=header_values,
        payload=payload,
        registry=registry_for(runtime, protos),
        replay=replay,
        dry_run=dry_run,
        to_queue=to_queue,
        user=user,
        role="cli",
    )
    if as_json:
        echo_json(report.to_json())
        return
    plan = report.plan
    what = plan.kind + (f" {plan.type_name}" if plan.type_name else "")
    click.echo(f"edit of obituary {plan.obituary_id} ({what}):")
    for line in plan.diff():
        click.echo(f"  {line}")
    if report.replayed:
        click.echo(
            f"replayed to queue {plan.queue} as message {plan.new_message_id}"
            + (f" (task id {plan.task_id})" if plan.task_id else "")
        )
    else:
        verb = "dry run" if dry_run else "not replayed (add --replay)"
        click.echo(
            f"{verb}: nothing published (a replay goes to queue {plan.queue} as a new message)"
        )


@command("purge")
@click.argument("ids", nargs=-1)
@filter_options
@click.option("--all", "everything", is_flag=True, help="Purge the whole graveyard.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--dry-run", is_flag=True, help="Say what would be purged; delete nothing.")
@click.option(
    "--keep-whole",
    is_flag=True,
    help="Keep each whole obituary (traceback, headers, payload) in its `purged` history entry "
    "(default: its summary only, so the purge frees the bytes it removes).",
)
@json_option
def purge_command(
    ctx: click.Context,
    /,
    ids: tuple[str, ...],
    everything: bool,
    yes: bool,
    dry_run: bool,
    keep_whole: bool,
    as_json: bool,
    **filters: Any,
) -> None:
    """Delete obituaries (ids or filters); each leaves its summary in the failure history as
    `purged`. Works on a Redis at maxmemory (it deletes first)."""
    runtime, targets = _targets(ctx, "purge", ids, everything, filters)
    if targets and not (yes or dry_run):
        click.confirm(
            f"Purge {count(len(targets), 'obituary', 'obituaries')}?", abort=True, err=True
        )
    with progress_bar(len(targets), "purging", show_progress(as_json)) as advance:
        report = purge.purge_targets(
            runtime, targets, dry_run=dry_run, keep_whole=keep_whole, progress=advance
        )
    if as_json:
        echo_json(report.to_json())
    else:
        verb = "would purge" if dry_run else "purged"
        click.echo(f"{verb} {len(report.purged)} of {len(targets)}")
        for oid in report.missing:
            click.echo(f"missing {oid}")
    if report.missing:
        ctx.exit(EXIT_INCOMPLETE)


def _targets(
    ctx: click.Context, what: str, ids: tuple[str, ...], everything: bool, filters: dict[str, Any]
) -> tuple[Runtime, list[str]]:
    """The runtime and the obituary ids a ``replay``/``purge`` acts on (a usage error, exit 2,
    when it names no target at all)."""
    from celery_dlx.ops.replay import resolve_targets

    if not ids and not everything and all(f is None for f in filters.values()):
        raise click.UsageError(
            f"{what} needs obituary ids, a filter (--queue, --task, --cause/--group, --since) "
            "or --all"
        )
    runtime = runtime_of(ctx)
    return runtime, resolve_targets(runtime, ids, everything=everything, what=what, **filters)


#: The commands this module adds to the ``dlx`` group.
COMMANDS = (
    list_command,
    show_command,
    groups_command,
    replay_command,
    edit_command,
    purge_command,
)
