"""Per-task options (``dlx_*`` class or decorator attributes), validated against the settings."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from types import FunctionType
from typing import Any

from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.breaker import BreakerSettings
from celery_dlx.policy.config import DLXConfig
from celery_dlx.policy.decide import Policy, parse_matchers
from celery_dlx.policy.settings import IMPORTANCES, SETTINGS, closest

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


def _importance(value: Any, where: str) -> str:
    if value not in IMPORTANCES:
        raise ConfigurationError(f"{where} must be one of {', '.join(IMPORTANCES)}, got {value!r}")
    return str(value)


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

    def option(key: str, default: Any, parse: Callable[[Any, str], Any] | None = None) -> Any:
        """The task's ``key``, checked as the setting of that name unless ``parse`` is given."""
        value = getattr(task_cls, key, None)
        if value is None:
            return default
        where = f"task {name}: option {key}"
        return SETTINGS[key].check(where, value) if parse is None else parse(value, where)

    importance = option("dlx_importance", None, _importance)
    return TaskOptions(
        policy=Policy(
            max_requeues=option("dlx_max_requeues", base.max_requeues),
            max_parks=option("dlx_max_parks", base.max_parks),
            backoff=option("dlx_backoff", base.backoff),
            requeue_on=option("dlx_requeue_on", (), parse_matchers),
            park_on=option("dlx_park_on", (), parse_matchers),
            bury_on=option("dlx_bury_on", (), parse_matchers),
        ),
        importance=importance or config.importance(queue),
        breaker=option("dlx_breaker", config.breaker_for(queue)),
    )
