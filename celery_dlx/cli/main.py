"""The ``celery dlx`` command group (``celery.commands`` entry point) and ``celery-dlx`` script.

``celery -A proj dlx <command>`` gets the app from Celery (``ctx.obj.app``); ``celery-dlx -A proj
[dlx] <command>`` loads it itself. The commands (:data:`COMMAND_SOURCES`) are thin: plain functions
of the package do the work and return data.
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Iterator, MutableMapping, Sequence

import click
from celery import Celery

from celery_dlx.errors import DLXError

#: Where the group's other commands live: (module, a command or a sequence of them).
COMMAND_SOURCES: tuple[tuple[str, str], ...] = (
    ("celery_dlx.cli.graveyard", "COMMANDS"),
    ("celery_dlx.cli.ops", "COMMANDS"),
    ("celery_dlx.cli.broker", "COMMANDS"),
    ("celery_dlx.cli.breakers", "COMMANDS"),
    ("celery_dlx.cli.web", "web_command"),
)


class LazyCommands(MutableMapping[str, click.Command]):
    """The ``dlx`` group's commands, whose modules are imported the first time one is looked up.

    Celery's command line imports every ``celery.commands`` entry point whenever it starts, a
    worker's included: the worker then loads this module only, not the graveyard, operations and
    console commands (nor what they import) that no worker runs.
    """

    def __init__(self, sources: Sequence[tuple[str, str]]) -> None:
        self._commands: dict[str, click.Command] = {}
        self._sources = list(sources)

    def _loaded(self) -> dict[str, click.Command]:
        while self._sources:
            module, attribute = self._sources.pop(0)
            found = getattr(importlib.import_module(module), attribute)
            for command in found if isinstance(found, (list, tuple)) else (found,):
                self._commands[command.name] = command
        return self._commands

    def __getitem__(self, name: str) -> click.Command:
        return self._loaded()[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._commands[name] = command

    def __delitem__(self, name: str) -> None:
        del self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())


class DLXGroup(click.Group):
    """The ``dlx`` group; as the root of ``celery-dlx`` it also accepts ``dlx`` as a no-op word."""

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name == "dlx" and ctx.parent is None:
            return self
        return super().get_command(ctx, cmd_name)


@click.group(name="dlx", cls=DLXGroup, commands=LazyCommands(COMMAND_SOURCES))
@click.option(
    "-A",
    "--app",
    "app_name",
    default=None,
    envvar="CELERY_DLX_APP",
    help="Celery app, as for `celery -A` (needed when run as `celery-dlx`).",
)
@click.pass_context
def dlx(ctx: click.Context, /, app_name: str | None, **_: object) -> None:
    """celery_dlx: DLX service, graveyard and parked retries."""
    if app_name:
        from celery.app.utils import find_app
        from celery.bin.base import CLIContext

        try:
            app = find_app(app_name)  # as ``celery -A`` names it: proj, proj.celery:app...
        except Exception as exc:
            raise click.UsageError(
                f"cannot load the Celery app {app_name!r} (-A/--app): {exc}"
            ) from exc
        ctx.obj = CLIContext(app=app, no_color=False, workdir=None)
    elif getattr(ctx.obj, "app", None) is None or _no_app_named(ctx):
        raise click.UsageError(
            "name the Celery app: `celery -A proj dlx ...` or `celery-dlx -A proj` "
            "(without -A, celery gives its empty default app, with none of your settings)"
        )


def _no_app_named(ctx: click.Context) -> bool:
    """True under ``celery dlx ...`` without ``-A`` (nor ``APP``): celery's default app then."""
    root = ctx.find_root()
    return root is not ctx and "app" in root.params and not root.params["app"]


def app_of(ctx: click.Context) -> Celery:
    """The Celery app of a ``dlx`` subcommand."""
    app: Celery = ctx.obj.app
    return app


def setup_logging(loglevel: str) -> None:
    """Log to stderr at ``loglevel`` unless logging is configured already."""
    level = logging.getLevelName(loglevel.upper())
    if not isinstance(level, int):
        raise click.BadParameter(f"unknown log level {loglevel!r}", param_hint="--loglevel")
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(level=level, format="[%(asctime)s: %(levelname)s/%(name)s] %(message)s")
    root.setLevel(level)


@dlx.command("service")
@click.option(
    "--prefetch",
    type=click.IntRange(min=1),
    default=None,
    help="Consumer prefetch (default: dlx_service_prefetch).",
)
@click.option(
    "--until-idle",
    type=click.FloatRange(min=0),
    default=None,
    help="Exit after this many seconds without a dead letter (default: run forever).",
)
@click.option(
    "-c",
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Service processes (forked); each handles a few thousand dead letters a second.",
)
@click.option(
    "--drain/--no-drain",
    default=True,
    show_default=True,
    help="Drain due parked retries every dlx_drain_interval, one process at a time under the "
    "workers' drain lease; --no-drain leaves it to the workers.",
)
@click.option("-l", "--loglevel", default="INFO", show_default=True, help="Logging level.")
@click.option("--json", "as_json", is_flag=True, help="Print the run's counts as JSON on exit.")
@click.pass_context
def service(
    ctx: click.Context,
    prefetch: int | None,
    until_idle: float | None,
    processes: int,
    drain: bool,
    loglevel: str,
    as_json: bool,
) -> None:
    """Run the DLX service: park, requeue or bury every dead letter, and drain parked retries
    (stops on SIGTERM/SIGINT)."""
    from celery_dlx.service.runner import run_service

    setup_logging(loglevel)
    try:
        stats = run_service(
            app_of(ctx),
            prefetch=prefetch,
            idle_timeout=until_idle,
            processes=processes,
            drain=drain,
        )
    except DLXError as exc:
        raise click.ClickException(str(exc)) from exc
    if as_json:
        click.echo(json.dumps(stats.as_dict(), sort_keys=True))


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``celery-dlx`` console script."""
    dlx.main(args=list(argv) if argv is not None else None, prog_name="celery-dlx")
