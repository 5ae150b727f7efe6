"""Parsing what a request asks for: page bounds, filters, times, replay and purge targets."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from celery_dlx import DLXError, Runtime
from celery_dlx.ops import STATUSES, UNRESOLVED, parked_actions
from celery_dlx.ops.obituaries import to_ms
from celery_dlx.ops.render import parse_when
from celery_dlx.ops.replay import check_target_queue, resolve_targets
from celery_dlx_console.actions import MAX_IDS as MAX_IDS
from celery_dlx_console.reads import ALL, MAX_PAGE, GroupFilters

#: The obituary statuses a listing filters by (``dlx list --status``), and a cause list's
#: (``dlx groups --status``); the default of both is unresolved.
OBITUARY_STATUSES = (*STATUSES, ALL)
CAUSE_STATUSES = (UNRESOLVED, ALL)
#: What the Parked page can do to parked retries (``dlx parked --retry-now/--bury-now``).
PARKED_ACTIONS = {"retry-now": parked_actions.retry_now, "bury-now": parked_actions.bury_now}


class BadRequest(DLXError):
    """The request asks for something malformed; the message says what (HTTP 400)."""


def integer(
    params: Mapping[str, object], name: str, default: int, *, low: int = 0, high: int | None = None
) -> int:
    raw = params.get(name)
    if raw in (None, ""):
        return default
    try:
        value = int(str(raw))
    except ValueError as exc:
        raise BadRequest(f"{name} must be an integer, got {raw!r}") from exc
    if value < low or (high is not None and value > high):
        raise BadRequest(f"{name} must be between {low} and {high}, got {value}")
    return value


def number(raw: object, name: str) -> float:
    try:
        return float(str(raw))
    except ValueError as exc:
        raise BadRequest(f"{name} must be a number, got {raw!r}") from exc


def when_ms(params: Mapping[str, object], name: str) -> int | None:
    """``since``/``until`` as the CLI takes them (``2h`` ago, an ISO time, ``@epoch``), in ms."""
    raw = params.get(name)
    if raw in (None, ""):
        return None
    try:
        return to_ms(parse_when(str(raw), name))
    except DLXError as exc:
        raise BadRequest(str(exc)) from exc


def text(params: Mapping[str, object], name: str) -> str | None:
    raw = params.get(name)
    return str(raw).strip() or None if raw is not None else None


def choice(params: Mapping[str, object], name: str, choices: Sequence[str], default: str) -> str:
    """``params[name]``, one of ``choices`` (``default`` when absent or empty).

    Raises:
        BadRequest: another value.
    """
    value = text(params, name)
    if value is None:
        return default
    if value not in choices:
        raise BadRequest(f"{name} must be one of {', '.join(choices)}, got {value!r}")
    return value


def group_filters(params: Mapping[str, object]) -> GroupFilters:
    return GroupFilters(
        queue=text(params, "queue"),
        task=text(params, "task"),
        exception=text(params, "exception"),
        since_ms=when_ms(params, "since"),
        until_ms=when_ms(params, "until"),
        status=choice(params, "status", OBITUARY_STATUSES, UNRESOLVED),
    )


def page_bounds(params: Mapping[str, object]) -> tuple[int, int]:
    return integer(params, "offset", 0), integer(params, "limit", 50, low=1, high=MAX_PAGE)


@dataclass
class Targets:
    """Obituary ids an action applies to, and how to name them in the audit log."""

    ids: list[str]
    label: str
    cause: str | None


def targets(runtime: Runtime, ids: Sequence[object], cause: object) -> Targets:
    """The named ids (at most :data:`MAX_IDS`), else every obituary of ``cause``, oldest first.

    Raises:
        BadRequest: neither, both, or too many ids.
    """
    given = [str(i).strip() for i in ids if str(i).strip()]
    cause_text = str(cause).strip() if cause else ""
    if given and cause_text:
        raise BadRequest("name obituary ids or a cause, not both")
    if len(given) > MAX_IDS:
        raise BadRequest(f"at most {MAX_IDS} obituary ids at once; use the whole cause instead")
    if given:
        unique = list(dict.fromkeys(given))
        label = unique[0] if len(unique) == 1 else f"{len(unique)} selected obituaries"
        return Targets(unique, label, None)
    if not cause_text:
        raise BadRequest("choose obituaries (ids) or a cause group")
    found = resolve_targets(runtime, cause=cause_text)
    return Targets(found, f"cause {cause_text}", cause_text)


def replay_rate(raw: object, maximum: float) -> float:
    """The replay rate asked for, between 0 (excluded) and ``dlx_web_max_replay_rate``."""
    if raw in (None, ""):
        return min(10.0, maximum)
    rate = number(raw, "rate")
    if not rate > 0:
        raise BadRequest(f"rate must be a positive number per second, got {raw}")
    if rate > maximum:
        raise BadRequest(
            f"rate {rate:g}/s is over the console's limit of {maximum:g}/s (dlx_web_max_replay_rate)"
        )
    return rate


def replay_options(runtime: Runtime, raw: Mapping[str, Any], maximum: float) -> dict[str, Any]:
    """What a form or JSON body asks of :meth:`~celery_dlx_console.actions.Actions.replay`: rate,
    canary, force, canary_timeout, to_queue.

    Raises:
        BadRequest: a value out of bounds, or no such queue.
    """
    rate = replay_rate(raw.get("rate"), maximum)
    timeout = number(raw.get("canary_timeout") or 120, "canary_timeout")
    return {
        "rate": rate,
        "canary": flag(raw.get("canary")),
        "force": flag(raw.get("force")),
        "canary_timeout": max(1.0, min(timeout, 600.0)),
        "to_queue": to_queue(runtime, raw.get("to_queue")),
    }


def to_queue(runtime: Runtime, raw: object) -> str | None:
    """The queue a replay is redirected to (None: the queues the messages died in), once the
    broker says it exists.

    Raises:
        BadRequest: a malformed name, or no such queue (the broker's answer is in the message).
    """
    name = str(raw).strip() if raw is not None else ""
    if not name:
        return None
    try:
        return check_target_queue(runtime, name)
    except DLXError as exc:
        raise BadRequest(str(exc)) from exc


def parked_targets(ids: Sequence[object], cause: object) -> Targets:
    """The parked retries named by entry ids (at most :data:`MAX_IDS`) or by a cause.

    Raises:
        BadRequest: neither, both, or too many ids.
    """
    given = list(dict.fromkeys(str(i).strip() for i in ids if str(i).strip()))
    cause_text = str(cause).strip() if cause else ""
    if bool(given) == bool(cause_text):
        raise BadRequest("name parked retries by entry ids or by a cause (one of the two)")
    if len(given) > MAX_IDS:
        raise BadRequest(f"at most {MAX_IDS} parked retries at once; use the whole cause instead")
    if cause_text:
        return Targets(given, f"parked retries of cause {cause_text}", cause_text)
    return Targets(given, given[0] if len(given) == 1 else f"{len(given)} parked retries", None)


def flag(raw: object) -> bool:
    return raw is True or str(raw).lower() in {"1", "on", "true", "yes"}


def purge_phrase(count: int) -> str:
    """What an operator types to confirm purging ``count`` obituaries."""
    return f"purge {count}"
