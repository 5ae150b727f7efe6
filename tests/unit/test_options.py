"""Per-task options: task attributes over ``dlx_queues`` over settings, and their validation."""

from __future__ import annotations

from typing import Any

import pytest

from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.config import DLXConfig, load_config
from celery_dlx.policy.decide import CallableBackoff, ExponentialBackoff, ListBackoff, Policy
from celery_dlx.policy.options import TASK_OPTIONS, resolve_task_options, unknown_task_options
from celery_dlx.worker.task import DLXTask

SETTINGS: dict[str, Any] = {
    "dlx_max_requeues": 3,
    "dlx_max_parks": 4,
    "dlx_backoff": [9],
    "dlx_importance": "ignore",
    "dlx_queues": {
        "billing": {"max_requeues": 1, "max_parks": 2, "backoff": [5], "importance": "page"},
        "emails": {"max_parks": 0},
    },
}


def task_class(name: str = "proj.charge", base: type = object, **options: Any) -> type:
    return type("Charge", (base,), {"name": name, **options})


@pytest.fixture(scope="module")
def config() -> DLXConfig:
    return load_config(SETTINGS)


def fast(n: int) -> float:
    return 0.5 * n


@pytest.mark.parametrize(
    ("options", "queue", "expected"),
    [
        ({}, None, Policy(3, 4, ListBackoff((9.0,)))),
        ({}, "other", Policy(3, 4, ListBackoff((9.0,)))),
        ({}, "billing", Policy(1, 2, ListBackoff((5.0,)))),
        ({}, "emails", Policy(3, 0, ListBackoff((9.0,)))),
        ({"dlx_max_requeues": 0}, "billing", Policy(0, 2, ListBackoff((5.0,)))),
        ({"dlx_max_parks": 7}, "billing", Policy(1, 7, ListBackoff((5.0,)))),
        ({"dlx_max_parks": 0}, None, Policy(3, 0, ListBackoff((9.0,)))),
        ({"dlx_backoff": [1, 2]}, "billing", Policy(1, 2, ListBackoff((1.0, 2.0)))),
        (
            {"dlx_backoff": {"base": 2, "jitter": 0}},
            None,
            Policy(3, 4, ExponentialBackoff(2.0, jitter=0)),
        ),
        ({"dlx_backoff": fast}, "emails", Policy(3, 0, CallableBackoff(fast))),
        (
            {
                "dlx_requeue_on": ConnectionError,
                "dlx_park_on": [TimeoutError],
                "dlx_bury_on": (KeyError,),
            },
            None,
            Policy(
                3,
                4,
                ListBackoff((9.0,)),
                requeue_on=(ConnectionError,),
                park_on=(TimeoutError,),
                bury_on=(KeyError,),
            ),
        ),
    ],
)
def test_task_options_over_queue_policy_over_settings(
    config: DLXConfig, options: dict[str, Any], queue: str | None, expected: Policy
) -> None:
    assert resolve_task_options(task_class(**options), config, queue).policy == expected


@pytest.mark.parametrize(
    ("options", "queue", "importance"),
    [
        ({}, None, "ignore"),
        ({}, "billing", "page"),
        ({}, "emails", "ignore"),
        ({"dlx_importance": "notify"}, "billing", "notify"),
        ({"dlx_importance": "page"}, None, "page"),
    ],
)
def test_importance(
    config: DLXConfig, options: dict[str, Any], queue: str | None, importance: str
) -> None:
    assert resolve_task_options(task_class(**options), config, queue).importance == importance


def test_dlx_task_defaults_fall_back_to_the_settings(config: DLXConfig) -> None:
    class Charge(DLXTask):  # type: ignore[misc]
        name = "proj.charge"
        dlx_max_parks = 1

    assert unknown_task_options(Charge) == []
    options = resolve_task_options(Charge, config, "billing")
    assert options.policy == Policy(1, 1, ListBackoff((5.0,)))
    assert options.importance == "page"


def test_options_are_inherited(config: DLXConfig) -> None:
    base = task_class(dlx_max_requeues=0, dlx_bury_on=[KeyError])
    child = task_class("proj.child", base=base, dlx_max_parks=1)
    policy = resolve_task_options(child, config).policy
    assert (policy.max_requeues, policy.max_parks, policy.bury_on) == (0, 1, (KeyError,))


@pytest.mark.parametrize(
    ("options", "unknown", "hint"),
    [
        ({"dlx_max_requeus": 1}, ["dlx_max_requeus"], " (did you mean dlx_max_requeues?)"),
        ({"dlx_backof": [1], "dlx_max_parks": 1}, ["dlx_backof"], " (did you mean dlx_backoff?)"),
        ({"dlx_retries": 3, "dlx_enabled": True}, ["dlx_enabled", "dlx_retries"], ""),
        ({"dlx_park_on_": [TimeoutError]}, ["dlx_park_on_"], " (did you mean dlx_park_on?)"),
    ],
)
def test_unknown_option_names_the_task_and_option(
    config: DLXConfig, options: dict[str, Any], unknown: list[str], hint: str
) -> None:
    cls = task_class(**options)
    assert unknown_task_options(cls) == unknown
    with pytest.raises(ConfigurationError) as info:
        resolve_task_options(cls, config)
    assert str(info.value) == (
        f"task proj.charge: unknown option(s) {', '.join(unknown)}{hint}; "
        f"known: {', '.join(TASK_OPTIONS)}"
    )


def test_methods_named_like_options_are_not_options() -> None:
    class WithHelper:
        name = "proj.helper"

        def dlx_describe(self) -> str:
            return "a method, not an option"

    assert unknown_task_options(WithHelper) == []


def test_a_task_without_a_name_is_named_by_its_class(config: DLXConfig) -> None:
    cls = type("Nameless", (), {"dlx_importance": "loud"})
    with pytest.raises(ConfigurationError, match=r"^task Nameless: option dlx_importance"):
        resolve_task_options(cls, config)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"dlx_importance": "critical"},
            "task proj.charge: option dlx_importance must be one of page, notify, ignore, "
            "got 'critical'",
        ),
        ({"dlx_importance": 1}, "task proj.charge: option dlx_importance must be one of"),
        (
            {"dlx_max_requeues": -1},
            "task proj.charge: option dlx_max_requeues must be a non-negative integer, got -1",
        ),
        ({"dlx_max_requeues": True}, "task proj.charge: option dlx_max_requeues must be a non-neg"),
        ({"dlx_max_parks": "3"}, "task proj.charge: option dlx_max_parks must be a non-negative"),
        ({"dlx_max_parks": 2.0}, "task proj.charge: option dlx_max_parks must be a non-negative"),
        ({"dlx_backoff": []}, "task proj.charge: option dlx_backoff must not be an empty list"),
        ({"dlx_backoff": "10s"}, "task proj.charge: option dlx_backoff must be a list of seconds"),
        ({"dlx_backoff": [1, -2]}, "task proj.charge: option dlx_backoff[1] must hold non-neg"),
        ({"dlx_backoff": {"jitter": 3}}, "task proj.charge: option dlx_backoff['jitter'] must be"),
        (
            {"dlx_bury_on": "ValueError"},
            "task proj.charge: option dlx_bury_on must hold exception classes or predicates, "
            "got 'ValueError'",
        ),
        (
            {"dlx_park_on": [int]},
            "task proj.charge: option dlx_park_on must hold exception classes",
        ),
        ({"dlx_requeue_on": [3]}, "task proj.charge: option dlx_requeue_on must hold exception"),
    ],
)
def test_bad_option_values_name_the_task_and_option(
    config: DLXConfig, options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve_task_options(task_class(**options), config)
    assert str(info.value).startswith(message), str(info.value)
