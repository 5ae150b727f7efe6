"""Per-task options (``dlx_*`` class or decorator attributes), validated against the settings."""

from __future__ import annotations

from dataclasses import dataclass
from types import FunctionType
from typing import Any

from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.breaker import BreakerSettings, parse_breaker
from celery_dlx.policy.config import DLXConfig
from celery_dlx.policy.decide import Policy, parse_backoff, parse_matchers
from celery_dlx.policy.settings import IMPORTANCES, closest

#: Options a task may set; each falls back to the ``dlx_*`` setting of the same name.
TASK_OPTIONS = (
    "dlx_requeue_on",
    "dlx_park_on",
    "dlx_bury_on",
    "dlx_backoff",
    "dlx_max_requeues",
    "dlx_max_parks",
    "dlx_importance",
    "dlx_breaker",
)


@dataclass(frozen=True)
class TaskOptions:
    """A task's resolved failure policy and importance."""

    policy: Policy
    importance: str
    #: None: off (the failure path pays nothing for it).
    breaker: BreakerSettings | None = None


def unknown_task_options(task_cls: type) -> list[str]:
    """``dlx_*`` attributes of ``task_cls`` that are not task options."""
    return sorted(
        name
        for name in dir(task_cls)
        # Exception classes and lambdas are callable too, so only a method defined under its
        # own name is exempt: a misspelt dlx_bury_onn=ValueError must not pass.
        if name.startswith("dlx_")
        and name not in TASK_OPTIONS
        and not _is_method(getattr(task_cls, name, None), name)
    )


def _is_method(value: Any, name: str) -> bool:
    return isinstance(value, FunctionType) and value.__name__ == name


def _count(task: str, name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(
            f"task {task}: option {name} must be a non-negative integer, got {value!r}"
        )
    return value


def resolve_task_options(
    task_cls: type, config: DLXConfig, queue: str | None = None
) -> TaskOptions:
    """The policy of ``task_cls``: its options over ``dlx_queues[queue]`` over the settings.

    Raises:
        ConfigurationError: an unknown ``dlx_*`` option or a bad value, naming the task and option.
    """
    name = getattr(task_cls, "name", None) or task_cls.__name__
    unknown = unknown_task_options(task_cls)
    if unknown:
        raise ConfigurationError(
            f"task {name}: unknown option(s) {', '.join(unknown)}"
            f"{closest(unknown, TASK_OPTIONS)}; known: {', '.join(TASK_OPTIONS)}"
        )
    base = config.policy(queue)

    def get(option: str) -> Any:
        return getattr(task_cls, option, None)

    backoff = get("dlx_backoff")
    importance = get("dlx_importance")
    if importance is not None and importance not in IMPORTANCES:
        raise ConfigurationError(
            f"task {name}: option dlx_importance must be one of {', '.join(IMPORTANCES)}, got {importance!r}"
        )
    return TaskOptions(
        policy=Policy(
            max_requeues=base.max_requeues
            if get("dlx_max_requeues") is None
            else _count(name, "dlx_max_requeues", get("dlx_max_requeues")),
            max_parks=base.max_parks
            if get("dlx_max_parks") is None
            else _count(name, "dlx_max_parks", get("dlx_max_parks")),
            backoff=base.backoff
            if backoff is None
            else parse_backoff(backoff, f"task {name}: option dlx_backoff"),
            requeue_on=parse_matchers(get("dlx_requeue_on"), f"task {name}: option dlx_requeue_on"),
            park_on=parse_matchers(get("dlx_park_on"), f"task {name}: option dlx_park_on"),
            bury_on=parse_matchers(get("dlx_bury_on"), f"task {name}: option dlx_bury_on"),
        ),
        importance=importance or config.importance(queue),
        breaker=config.breaker_for(queue)
        if get("dlx_breaker") is None
        else parse_breaker(get("dlx_breaker"), f"task {name}: option dlx_breaker"),
    )
