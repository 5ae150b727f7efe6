"""Edge cases of settings and task options: each bad value is a ConfigurationError naming it."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

import celery_dlx
from celery_dlx.broker.topology import DLXQueue, dead_letter_arguments
from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.config import load_config
from celery_dlx.policy.decide import parse_backoff
from celery_dlx.policy.options import resolve_task_options

NO_BROKER = "amqp://nobody:nothing@127.0.0.1:1//"


def enabled_app(**conf: Any) -> Celery:
    app = Celery("bugs", broker=NO_BROKER, set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(dlx_enabled=True, task_default_queue="work", **conf)
    return app


def test_on_demand_queue_first_lookup_returns_a_dlx_queue() -> None:
    queue = enabled_app().amqp.queues["new"]
    assert isinstance(queue, DLXQueue)
    assert queue.queue_arguments == dead_letter_arguments("new")


def test_router_gives_producers_a_dlx_queue_for_an_unknown_queue() -> None:
    route = enabled_app().amqp.router.route({"queue": "fresh"}, "proj.add", (), {})
    assert route["queue"].queue_arguments == dead_letter_arguments("fresh")


def test_worker_minus_q_on_an_unknown_queue_consumes_a_dlx_queue() -> None:
    queues = enabled_app().amqp.queues
    queues.select(["other"])
    assert queues.consume_from["other"].queue_arguments == dead_letter_arguments("other")


@pytest.mark.parametrize(
    ("value", "key"),
    [
        ({"jitter": "abc"}, "jitter"),
        ({"factor": None}, "factor"),
        ({"jitter": None}, "jitter"),
        ({"factor": "2x"}, "factor"),
    ],
)
def test_parse_backoff_non_numbers_name_the_setting(value: Any, key: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"^dlx_backoff\['{key}'\]"):
        parse_backoff(value)


@pytest.mark.parametrize(
    "options",
    [{"dlx_bury_onn": ValueError}, {"dlx_requeue": ConnectionError}, {"dlx_bakoff": lambda n: 1.0}],
)
def test_misspelt_option_with_a_callable_value_is_reported(options: dict[str, Any]) -> None:
    cls = type("T", (), {"name": "proj.t", **options})
    with pytest.raises(ConfigurationError, match=r"unknown option\(s\)"):
        resolve_task_options(cls, load_config({}))


@pytest.mark.parametrize("prefix", ["{dlx}", "a b", "x}"])
def test_key_prefix_with_braces_or_spaces_is_a_configuration_error(prefix: str) -> None:
    with pytest.raises(ConfigurationError, match=r"^dlx_key_prefix"):
        load_config({"dlx_key_prefix": prefix})


def test_delivery_limit_without_quorum_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"dlx_delivery_limit"):
        load_config({"dlx_delivery_limit": 5})


def test_ttl_ladder_steps_below_a_millisecond_are_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match=r"^dlx_ttl_ladder steps must be at least 0.001 s"):
        load_config({"dlx_ttl_ladder": [0.0004, 1]})


def test_a_typo_names_the_closest_setting() -> None:
    from celery_dlx.errors import ConfigurationError
    from celery_dlx.policy.config import load_config

    with pytest.raises(ConfigurationError) as info:
        load_config({"dlx_max_parkz": 3})
    assert str(info.value).startswith(
        "unknown celery_dlx setting(s): dlx_max_parkz (did you mean dlx_max_parks?); known"
    )
    with pytest.raises(ConfigurationError) as info:
        load_config({"CELERY_DLX_REDIS_ULR": "redis://x"}, namespace="CELERY")
    assert "(did you mean dlx_redis_url?)" in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        load_config({"dlx_frobnicate": 1})  # nothing close: no guess
    assert "did you mean" not in str(info.value)
    with pytest.raises(ConfigurationError) as info:
        load_config({"dlx_queues": {"orders": {"max_park": 1, "backof": [1]}}})
    assert "(did you mean backof -> backoff, max_park -> max_parks?)" in str(info.value)


def test_a_task_option_typo_names_the_closest_option() -> None:
    from celery_dlx.errors import ConfigurationError
    from celery_dlx.policy.config import load_config
    from celery_dlx.policy.options import resolve_task_options

    class Task:
        name = "proj.charge"
        dlx_bury_onn = (ValueError,)

    with pytest.raises(ConfigurationError) as info:
        resolve_task_options(Task, load_config({}))
    assert "unknown option(s) dlx_bury_onn (did you mean dlx_bury_on?)" in str(info.value)
