"""Shared pieces of the ``celery dlx`` commands: the app and runtime, exit codes, errors, output.

Exit codes (docs/cli.md lists them): 0 done, 1 could not run (:func:`handle_errors`), 2 usage
error (click), and those below.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar, cast

import click

from celery_dlx.cli.main import app_of
from celery_dlx.errors import DLXError
from celery_dlx.ops.render import dumps, parse_duration, parse_when

if TYPE_CHECKING:
    from celery_dlx.wiring.runtime import Runtime

#: ``show`` of an unknown id, ``migrate`` of a missing queue, ``breakers close`` of none open.
EXIT_NOT_FOUND = 3
#: ``check`` found a problem.
EXIT_PROBLEMS = 4
#: ``replay``/``purge`` left some targets (not confirmed, refused, missing).
EXIT_INCOMPLETE = 5
#: ``replay --canary``: the canary did not succeed, so the replay stopped after it.
EXIT_CANARY = 6
#: ``check``: the dead-letter path is stalled (Redis full, or the service queue over its limit).
EXIT_STALLED = 7

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")


def runtime_of(ctx: click.Context) -> Runtime:
    """The app's :class:`~celery_dlx.wiring.runtime.Runtime`."""
    from celery_dlx.wiring.runtime import get_runtime

    return get_runtime(app_of(ctx))


def handle_errors(func: F) -> F:
    """Turn celery_dlx, Redis and broker errors into one clear line and exit code 1."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from celery_dlx.broker.errors import UNREACHABLE
        from celery_dlx.wiring.errors import STORE_ERRORS, is_full

        try:
            return func(*args, **kwargs)
        except DLXError as exc:
            raise click.ClickException(str(exc)) from exc
        except STORE_ERRORS as exc:
            if is_full(exc):
                raise click.ClickException(
                    f"Redis is full ({exc}): it refuses writes at its maxmemory; make room with "
                    "`dlx purge` (it deletes first, so it runs on a full Redis) or raise maxmemory"
                ) from exc
            raise click.ClickException(
                f"Redis unreachable or refused ({exc}); check dlx_redis_url"
            ) from exc
        except UNREACHABLE as exc:
            raise click.ClickException(f"broker unreachable ({exc}); check broker_url") from exc

    return cast(F, wrapper)


def no_obituary(ctx: click.Context, ident: str, as_json: bool) -> NoReturn:
    """Say that no obituary has id or message id ``ident``, and exit 3."""
    if as_json:
        echo_json({"error": "not found", "id": ident})
    else:
        click.echo(f"no obituary with id or message id {ident!r}", err=True)
    ctx.exit(EXIT_NOT_FOUND)


def echo_json(data: object) -> None:
    """Print ``data`` as JSON on stdout."""
    click.echo(dumps(data))


def _parsed(
    parse: Callable[[str, str], T], option: str | None = None
) -> Callable[[click.Context, click.Parameter, object], T | None]:
    """A click callback: ``parse(value, option)``, a :class:`DLXError` as a bad parameter."""

    def callback(ctx: click.Context, param: click.Parameter, value: object) -> T | None:
        if value is None:
            return None
        try:
            return parse(str(value), option or f"--{param.name}")
        except DLXError as exc:
            raise click.BadParameter(str(exc)) from exc

    return callback


def duration(option: str) -> Callable[[click.Context, click.Parameter, object], float | None]:
    """A click callback parsing a duration option (``90s``, ``15m``, ``2h``)."""
    return _parsed(parse_duration, option)


#: A click callback parsing ``--since``/``--until`` (duration ago, ISO time, ``@epoch``).
when = _parsed(parse_when)


def options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """The options ``decorators`` as one decorator, in the order given."""

    def decorate(func: F) -> F:
        for option in reversed(decorators):
            func = option(func)
        return func

    return decorate


def command(name: str) -> Callable[[Callable[..., Any]], click.Command]:
    """``click.command(name)`` of a function given the context, whose errors
    :func:`handle_errors` turns into exit code 1."""
    return lambda func: click.command(name)(click.pass_context(handle_errors(func)))


#: The graveyard filters shared by ``list``, ``replay`` and ``purge``.
filter_options = options(
    click.option("--queue", "-Q", default=None, help="Only obituaries of this queue."),
    click.option("--task", "-t", default=None, help="Only obituaries of this task name."),
    click.option(
        "--cause",
        "--group",
        "cause",
        default=None,
        help="Only this cause fingerprint (a group of `groups`).",
    ),
    click.option(
        "--since",
        default=None,
        callback=when,
        help="Buried at or after: 2h (ago), 2024-05-01T10:00 (UTC) or @<epoch>.",
    ),
    click.option("--until", default=None, callback=when, help="Buried at or before (same forms)."),
)


#: ``--json``: print JSON instead of a table.
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


def limit_option(help: str) -> Callable[[F], F]:
    """``--limit/-n``: how many rows to show (50 unless told)."""
    return click.option(
        "--limit", "-n", type=click.IntRange(min=1), default=50, show_default=True, help=help
    )


def show_progress(as_json: bool) -> bool:
    """Progress bars only for people: not with ``--json``, not when stderr is not a terminal."""
    return not as_json and sys.stderr.isatty()


@contextmanager
def progress_bar(total: int, label: str, enabled: bool) -> Iterator[Callable[[int], None]]:
    """A callable advancing a click progress bar on stderr (a no-op when not ``enabled``)."""
    if not enabled or total <= 1:
        yield lambda n: None
        return
    with click.progressbar(length=total, label=label, file=sys.stderr, show_pos=True) as bar:
        yield bar.update
