"""``celery dlx check`` and ``celery dlx migrate``: the topology as RabbitMQ has it, through its
management API (queues without a dead-letter exchange, orphans; policy or rename migrations)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click
from celery import Celery

from celery_dlx.broker.management import Management, first_answering, management_candidates
from celery_dlx.cli.kit import (
    EXIT_NOT_FOUND,
    EXIT_PROBLEMS,
    EXIT_STALLED,
    command,
    duration,
    echo_json,
    json_option,
    options,
    progress_bar,
    runtime_of,
    show_progress,
)
from celery_dlx.docs_url import doc_url
from celery_dlx.ops.render import count, table

if TYPE_CHECKING:
    from celery_dlx.ops.checks import CheckReport

#: ``--management-url/-user/-password`` (defaults from the broker URL).
management_options = options(
    click.option(
        "--management-url",
        "management_url",
        envvar="CELERY_DLX_MANAGEMENT_URL",
        multiple=True,
        help="RabbitMQ management API; repeatable or comma-separated (the nodes of a cluster: "
        "the first that answers is used). Default: http://<host>:15672 of each URL of "
        "broker_url, in order.",
    ),
    click.option(
        "--management-user",
        envvar="CELERY_DLX_MANAGEMENT_USER",
        default=None,
        help="Management API user (default: the broker's).",
    ),
    click.option(
        "--management-password",
        envvar="CELERY_DLX_MANAGEMENT_PASSWORD",
        default=None,
        help="Management API password (default: the broker's).",
    ),
)


def management_apis(
    app: Celery,
    management_url: tuple[str, ...],
    management_user: str | None,
    management_password: str | None,
) -> list[Management]:
    """The management APIs to try in order: ``--management-url`` values, else one per broker
    URL of the app's failover list."""
    conn = app.connection_for_write()
    try:
        return management_candidates(
            conn, urls=management_url, user=management_user, password=management_password
        )
    finally:
        conn.release()


@command("check")
@click.option(
    "--for",
    "for_seconds",
    default="15m",
    callback=duration("--for"),
    show_default=True,
    help="A queue with ready messages and no consumer this long is an orphan.",
)
@click.option("--all-queues", is_flag=True, help="Look for orphans among every queue of the vhost.")
@click.option(
    "--max-backlog",
    type=click.IntRange(min=0),
    default=10_000,
    show_default=True,
    help="Dead letters waiting in the DLX service queue that make a stall (0: never).",
)
@click.option(
    "--no-management",
    is_flag=True,
    help="Check over AMQP only (no arguments, bindings or orphans).",
)
@management_options
@json_option
def check_command(
    ctx: click.Context,
    for_seconds: float,
    all_queues: bool,
    max_backlog: int,
    no_management: bool,
    as_json: bool,
    **management: Any,
) -> None:
    """Check the dead-letter topology, orphan queues, Redis memory and the DLX service's backlog;
    exit 4 when something is wrong, 7 when the dead-letter path is stalled (Redis full, or the
    service queue over --max-backlog)."""
    from celery_dlx.ops.checks import run_check

    runtime = runtime_of(ctx)
    api = None if no_management else management_apis(runtime.app, **management)
    report = run_check(
        runtime, api, for_seconds=for_seconds, all_queues=all_queues, max_backlog=max_backlog
    )
    if as_json:
        echo_json(report.to_json())
    else:
        click.echo(
            f"app {report.app}: exchange {report.exchange}, service queue {report.service_queue}"
        )
        if report.queues:
            rows = [
                (q["name"], q["dead_letter_exchange"] or "-", q.get("set_by", "-"), q["why"])
                for q in report.queues
            ]
            click.echo(table(("QUEUE", "DLX", "SET BY", "WHY"), rows, shrink=("WHY",)))
        if not report.management:
            click.echo("management API not used: queue arguments, bindings and orphans not checked")
        elif report.management_url and len(report.management_tried) > 1:
            click.echo(
                f"management API {report.management_url} "
                f"(of {len(report.management_tried)}: {', '.join(report.management_tried)})"
            )
        for line in _state_lines(report):
            click.echo(line)
        for p in report.problems:
            click.echo(f"PROBLEM {p.kind} {p.subject}: {p.detail}")
        click.echo("ok" if report.ok else f"{len(report.problems)} problem(s)")
    if report.stalled:
        ctx.exit(EXIT_STALLED)
    if not report.ok:
        ctx.exit(EXIT_PROBLEMS)


def _state_lines(report: CheckReport) -> list[str]:
    """Redis memory, the graveyard budget, the service queue's backlog, refused copies."""
    lines = []
    redis = report.redis
    if redis is not None:
        used, limit = int(str(redis["used_memory"])), int(str(redis["maxmemory"]))
        budget = report.graveyard_budget
        lines.append(
            f"redis {used / 1048576:.1f} MB used of "
            + (f"maxmemory {limit / 1048576:.1f} MB" if limit else "no maxmemory")
            + f" ({redis['maxmemory_policy']}), graveyard budget "
            + (f"{budget / 1048576:.1f} MB" if budget else "unlimited")
            + f", {int(str(redis['refused_writes'])):,} writes refused for memory"
            + ("" if redis["writable"] is not False else ", refusing writes now")
        )
    if report.backlog is not None:
        age = report.backlog.get("oldest_age_s")
        lines.append(
            f"service queue {report.service_queue}: {report.backlog['messages']:,} dead letters, "
            f"{report.backlog['consumers']} consumer(s)"
            + (f", the oldest {float(str(age)):.0f} s old" if age is not None else "")
        )
    if report.refused:
        counts = ", ".join(f"{n:,} {fate}" for fate, n in sorted(report.refused.items()))
        lines.append(f"copies workers could not write, written by the DLX service: {counts}")
    return lines


@command("migrate")
@click.argument("queue")
@click.option("--policy", "method", flag_value="policy", help="Add the DLX with a RabbitMQ policy.")
@click.option(
    "--rename",
    "method",
    flag_value="rename",
    help="Declare a new queue with the DLX and move the messages.",
)
@click.option("--remove", is_flag=True, help="With --policy: remove the policy this command wrote.")
@click.option("--to", default=None, help="With --rename: the new queue's name (default QUEUE.dlx).")
@click.option(
    "--no-bindings", is_flag=True, help="With --rename: do not copy the old queue's bindings."
)
@click.option(
    "--keep-old-bindings", is_flag=True, help="With --rename: leave the old queue bound too."
)
@click.option("--dry-run", is_flag=True, help="Say what would be done; change nothing.")
@management_options
@json_option
def migrate_command(
    ctx: click.Context,
    queue: str,
    method: str | None,
    remove: bool,
    to: str | None,
    no_bindings: bool,
    keep_old_bindings: bool,
    dry_run: bool,
    as_json: bool,
    **management: Any,
) -> None:
    """Give an existing QUEUE the dead-letter exchange without a 406 (--policy or --rename)."""
    from celery_dlx.ops import migrate

    if method is None:
        raise click.UsageError(
            f"choose --policy or --rename ({doc_url('migration')} compares them)"
        )
    if remove and method != "policy":
        raise click.UsageError("--remove goes with --policy (it deletes the policy migrate wrote)")
    runtime = runtime_of(ctx)
    candidates = management_apis(runtime.app, **management)
    api = first_answering(candidates)
    if len(candidates) > 1:
        click.echo(f"management API: {api.url} (first to answer of {len(candidates)})", err=True)
    try:
        if method == "policy" and remove:
            data = migrate.remove_policy(api, queue)
        elif method == "policy":
            data = migrate.migrate_policy(api, queue, runtime.config.exchange, dry_run=dry_run)
        else:
            ready = 0 if dry_run else (api.queue(queue) or {}).get("messages_ready")
            total = ready if isinstance(ready, int) else 0  # absent until the broker's first stats
            with progress_bar(total, "moving", show_progress(as_json)) as advance:
                data = migrate.migrate_rename(
                    runtime,
                    api,
                    queue,
                    to=to,
                    copy_bindings=not no_bindings,
                    unbind_old=not keep_old_bindings,
                    dry_run=dry_run,
                    progress=advance,
                )
    except migrate.QueueNotFound as exc:
        if as_json:
            echo_json({"error": "not found", "queue": queue, "detail": str(exc)})
        else:
            click.echo(str(exc), err=True)
        ctx.exit(EXIT_NOT_FOUND)
    if as_json:
        echo_json(data)
    else:
        click.echo(_migrate_text(data))


def _migrate_text(data: dict[str, Any]) -> str:
    if "removed" in data:
        return f"policy {data['policy']} {'removed' if data['removed'] else 'was not there'}"
    prefix = "dry run: " if data.get("dry_run") else ""
    if data["method"] == "policy":
        p = data["policy"]
        if not p["needed"]:
            return f"{prefix}nothing to do for {data['queue']}: {p['reason']}"
        merged = f", merging policy {p['merged_from']}" if p["merged_from"] else ""
        head = f"{prefix}policy {p['name']} (priority {p['priority']}{merged}) on {data['queue']}"
        if data.get("dry_run"):
            # Nothing was written: the broker still reports the queue as it was.
            target = p["definition"].get("dead-letter-exchange", "-")
            return f"{head}: {p['definition']}; dead letters would go to {target} (by policy)"
        return (
            f"{head}: {p['definition']}; dead letters now go to "
            f"{data['dead_letter_exchange'] or '-'} (set by {data['set_by']})"
        )
    lines = [f"{prefix}{data['queue']} -> {data['new_queue']} with {data['arguments']}"]
    lines += [f"  bound {b['source']} {b['routing_key']!r}" for b in data["bound"]]
    lines += [f"  unbound old {b['source']} {b['routing_key']!r}" for b in data["unbound"]]
    if not data.get("dry_run"):
        lines.append(
            f"moved {count(data['moved'], 'message')}, {data['left']} left on {data['queue']}"
        )
        lines.append(
            f"next: point consumers at {data['new_queue']} (task_queues), then producers that "
            f"publish to {data['queue']!r} directly; delete {data['queue']} when it stays empty"
        )
    return "\n".join(lines)


COMMANDS = (check_command, migrate_command)
