"""Every ``dlx_*`` setting: defaults, validation naming the setting, lookup under namespaces."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery

from celery_dlx.docs_url import doc_url
from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.config import DLXConfig, load_config, unknown_settings
from celery_dlx.policy.decide import ExponentialBackoff, ListBackoff, Policy
from celery_dlx.policy.settings import SETTINGS
from celery_dlx.wiring.runtime import get_runtime

NO_BROKER = "amqp://nobody:nothing@127.0.0.1:1//"


def test_defaults() -> None:
    config = load_config({})
    assert dict(config.values) == {
        "dlx_enabled": False,
        "dlx_redis_url": "redis://127.0.0.1:6379/0",
        "dlx_redis_required": False,
        "dlx_redis_min_replicas": None,
        "dlx_redis_replica_timeout": 1.0,
        "dlx_redis_shards": "auto",
        "dlx_key_prefix": "dlx",
        "dlx_max_requeues": 2,
        "dlx_max_parks": 5,
        "dlx_backoff": ExponentialBackoff(base=10.0, factor=2.0, max=3600.0, jitter=0.1),
        "dlx_drain_interval": 1.0,
        "dlx_drain_batch": 500,
        "dlx_drain_lease": 30.0,
        "dlx_importance": "notify",
        "dlx_exchange": "celery_dlx",
        "dlx_service_queue": "celery_dlx.dead",
        "dlx_quorum": False,
        "dlx_delivery_limit": None,
        "dlx_queues": {},
        "dlx_breaker": None,
        "dlx_expired": "park",
        "dlx_service_in_worker": False,
        "dlx_service_prefetch": 1000,
        "dlx_obituary_task": None,
        "dlx_code_version": None,
        "dlx_graveyard_retention": 30 * 86400.0,
        "dlx_graveyard_max_bytes": 0,
        "dlx_graveyard_max_per_cause": 10000,
        "dlx_resolve_after": 3600.0,
        "dlx_resolved_retention": 86400.0,
        "dlx_cause_ttl": 7 * 86400.0,
        "dlx_delay_backend": "redis",
        "dlx_parent_parks": True,
        "dlx_ttl_ladder": (1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0),
        "dlx_protobuf_descriptor_sets": (),
        "dlx_protobuf_modules": (),
        "dlx_send_events": True,
        "dlx_events_follow_worker": True,
        "dlx_sentry": True,
        "dlx_sentry_include_payload": False,
        "dlx_sentry_payload_limit": 4096,
        "dlx_sentry_rate_limit": 10,
        "dlx_sentry_rate_window": 3600.0,
        "dlx_web_host": "127.0.0.1",
        "dlx_web_port": 5566,
        "dlx_web_allowed_hosts": (),
        "dlx_web_basic_auth": (),
        "dlx_web_viewer_auth": (),
        "dlx_web_editors": (),
        "dlx_web_max_replay_rate": 50,
    }
    assert config.policy() == Policy()


def test_every_setting_is_documented() -> None:
    for name, setting in SETTINGS.items():
        assert name == setting.name and name.startswith("dlx_")
        assert setting.doc.strip(), name


#: At least one bad value per setting; test_every_setting_has_a_bad_value keeps this complete.
BAD_VALUES: dict[str, list[Any]] = {
    "dlx_enabled": ["maybe", 1, None, [True]],
    "dlx_redis_url": ["", 6379, None],
    "dlx_redis_required": ["always", 2, None],
    "dlx_redis_min_replicas": [-1, True, "1", 1.0, None],
    "dlx_redis_replica_timeout": [0, -1, "1s", None],
    "dlx_redis_shards": ["bucket", None, True],
    "dlx_key_prefix": ["", None, b"dlx"],
    "dlx_max_requeues": [-1, True, "2", 1.5, None],
    "dlx_max_parks": [-3, False, "5", None],
    "dlx_backoff": [[], "10s", 10, None, {"cap": 1}, [-1]],
    "dlx_drain_interval": [0, -1, "1", True, timedelta(0), None],
    "dlx_drain_batch": [0, -1, "5", 2.5],
    "dlx_drain_lease": [0, timedelta(seconds=-30), "30s"],
    "dlx_importance": ["critical", None, "PAGE"],
    "dlx_exchange": ["", None, 1],
    "dlx_service_queue": ["", None],
    "dlx_quorum": ["quorum", 1],
    "dlx_delivery_limit": [0, -1, "5", True],
    "dlx_queues": ["billing", ["billing"], {"billing": 5}],
    "dlx_breaker": [
        5,
        {"failures": 0},
        {"window": -1},
        {"failures": 1.5},
        {"hold": 10, "probe": 20},
        {"burst": 1},
    ],
    "dlx_expired": ["drop", None],
    "dlx_service_in_worker": [2, "sometimes"],
    "dlx_service_prefetch": [0, -10, None],
    "dlx_obituary_task": ["", 5],
    "dlx_code_version": ["", 1.0],
    "dlx_graveyard_retention": [0, -1, "30d"],
    "dlx_graveyard_max_bytes": [-1, "50mb", 1.5, None],
    "dlx_graveyard_max_per_cause": [-1, "many", None],
    "dlx_resolve_after": [0, -1, "1h"],
    "dlx_resolved_retention": [0, -1, None],
    "dlx_cause_ttl": [0, -5, None],
    "dlx_delay_backend": ["rabbit", None],
    "dlx_ttl_ladder": [[], "1,5,10", [5, 1], [1, 1], [0, 5], None],
    "dlx_protobuf_descriptor_sets": ["a.desc", ["a.desc", ""], [1]],
    "dlx_protobuf_modules": ["proj.events_pb2", [None]],
    "dlx_send_events": ["sometimes", None],
    "dlx_events_follow_worker": ["sometimes", None],
    "dlx_parent_parks": ["sometimes", None],
    "dlx_sentry": [None, 0],
    "dlx_sentry_include_payload": ["y", 1],
    "dlx_sentry_payload_limit": [0, -1, "4k"],
    "dlx_sentry_rate_limit": [-1, 0],
    "dlx_sentry_rate_window": [0, "1h"],
    "dlx_web_host": [None, 5],
    "dlx_web_port": [0, -1, "5566"],
    "dlx_web_allowed_hosts": [
        "dlx.example.com",
        ["*"],
        ["http://dlx.example.com"],
        ["dlx.example.com:8443"],
        ["dlx.example.com/console"],
        ["*dlx.example.com"],
        ["dlx .example.com"],
        ["::1"],
        [""],
    ],
    "dlx_web_basic_auth": ["admin:secret", [1]],
    "dlx_web_viewer_auth": ["viewer:secret", [None]],
    "dlx_web_editors": ["editor:secret", [2]],
    "dlx_web_max_replay_rate": [0, -5, "50"],
}


def test_every_setting_has_a_bad_value() -> None:
    assert set(BAD_VALUES) == set(SETTINGS)


@pytest.mark.parametrize(
    ("name", "value"),
    [(name, value) for name, values in BAD_VALUES.items() for value in values],
    ids=lambda v: repr(v)[:30],
)
def test_bad_value_is_rejected_naming_the_setting(name: str, value: Any) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_config({name: value})
    assert str(info.value).startswith(name), str(info.value)


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        ({"dlx_max_requeues": -1}, "dlx_max_requeues must be a non-negative integer, got -1"),
        ({"dlx_drain_batch": 0}, "dlx_drain_batch must be a positive integer, got 0"),
        ({"dlx_enabled": "maybe"}, "dlx_enabled must be a boolean, got 'maybe'"),
        (
            {"dlx_drain_interval": 0},
            "dlx_drain_interval must be a positive number of seconds, got 0",
        ),
        ({"dlx_importance": "critical"}, "dlx_importance must be one of page, notify, ignore; got"),
        ({"dlx_ttl_ladder": [5, 1]}, "dlx_ttl_ladder must be strictly increasing, got [5.0, 1.0]"),
        ({"dlx_ttl_ladder": [1, -1]}, "dlx_ttl_ladder[1] must be a positive number of seconds"),
        ({"dlx_protobuf_modules": ["a", ""]}, "dlx_protobuf_modules[1] must be a non-empty string"),
        ({"dlx_backoff": [1, "x"]}, "dlx_backoff[1] must hold non-negative seconds, got 'x'"),
        ({"dlx_queues": "billing"}, "dlx_queues must map queue names to policies, got 'billing'"),
        ({"dlx_queues": {"billing": 5}}, "dlx_queues['billing'] must be a mapping, got 5"),
        (
            {"dlx_queues": {"billing": {"retries": 1, "max_parks": 1}}},
            "dlx_queues['billing'] has unknown keys ['retries']; allowed: backoff, max_requeues, "
            "max_parks, importance, expired",
        ),
        (
            {"dlx_queues": {"billing": {"max_parks": -1}}},
            "dlx_queues['billing']['max_parks'] must be a non-negative integer, got -1",
        ),
        (
            {"dlx_queues": {"billing": {"max_requeues": "2"}}},
            "dlx_queues['billing']['max_requeues'] must be a non-negative integer",
        ),
        ({"dlx_queues": {"billing": {"backoff": []}}}, "dlx_queues['billing']['backoff'] must not"),
        (
            {"dlx_queues": {"billing": {"importance": "loud"}}},
            "dlx_queues['billing']['importance'] must be one of page, notify, ignore",
        ),
        (
            {"dlx_queues": {"billing": {"expired": "drop"}}},
            "dlx_queues['billing']['expired'] must be one of park, bury",
        ),
    ],
)
def test_error_messages(conf: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        load_config(conf)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("dlx_enabled", True, True),
        ("dlx_enabled", "yes", True),
        ("dlx_enabled", "On", True),
        ("dlx_enabled", "1", True),
        ("dlx_enabled", "false", False),
        ("dlx_enabled", "OFF", False),
        ("dlx_max_requeues", 0, 0),
        ("dlx_max_parks", 100, 100),
        ("dlx_backoff", [1, timedelta(minutes=1)], ListBackoff((1.0, 60.0))),
        ("dlx_backoff", {"base": 1, "jitter": 0}, ExponentialBackoff(base=1.0, jitter=0.0)),
        ("dlx_drain_interval", timedelta(milliseconds=500), 0.5),
        ("dlx_drain_interval", 2, 2.0),
        ("dlx_drain_batch", 1, 1),
        ("dlx_importance", "page", "page"),
        ("dlx_delivery_limit", 5, 5),
        ("dlx_delivery_limit", None, None),
        ("dlx_obituary_task", "proj.obituary", "proj.obituary"),
        ("dlx_obituary_task", None, None),
        ("dlx_ttl_ladder", (1, 2.5), (1.0, 2.5)),
        ("dlx_protobuf_modules", ["proj.events_pb2"], ("proj.events_pb2",)),
        ("dlx_protobuf_descriptor_sets", None, ()),
        ("dlx_graveyard_retention", timedelta(days=1), 86400.0),
        ("dlx_delay_backend", "ttl", "ttl"),
        ("dlx_expired", "bury", "bury"),
    ],
)
def test_good_values_are_normalized(name: str, value: Any, expected: Any) -> None:
    # A delivery limit needs quorum queues (checked across settings).
    extra = {"dlx_quorum": True} if name == "dlx_delivery_limit" else {}
    assert load_config({name: value, **extra})[name] == expected


def test_queue_policies_are_validated_and_parsed() -> None:
    config = load_config(
        {
            "dlx_max_requeues": 3,
            "dlx_max_parks": 4,
            "dlx_backoff": [9],
            "dlx_importance": "ignore",
            "dlx_queues": {
                "billing": {
                    "backoff": [1, 2],
                    "max_requeues": 0,
                    "importance": "page",
                    "expired": "bury",
                },
                "emails": {"max_parks": 1},
            },
        }
    )
    assert config.queues == {
        "billing": {
            "backoff": ListBackoff((1.0, 2.0)),
            "max_requeues": 0,
            "importance": "page",
            "expired": "bury",
        },
        "emails": {"max_parks": 1},
    }
    assert config.policy("billing") == Policy(
        max_requeues=0, max_parks=4, backoff=ListBackoff((1.0, 2.0))
    )
    assert config.policy("emails") == Policy(
        max_requeues=3, max_parks=1, backoff=ListBackoff((9.0,))
    )
    for queue in ("other", None):
        assert config.policy(queue) == Policy(3, 4, ListBackoff((9.0,)))
    assert [config.importance(q) for q in ("billing", "emails", None)] == [
        "page",
        "ignore",
        "ignore",
    ]
    assert [config.expired_action(q) for q in ("billing", "emails", None)] == [
        "bury",
        "park",
        "park",
    ]


def test_config_attributes_and_items() -> None:
    config = load_config({"dlx_max_parks": 9})
    assert config.max_parks == 9 == config["dlx_max_parks"]
    with pytest.raises(AttributeError):
        _ = config.max_parkz
    with pytest.raises(KeyError):
        config["max_parks"]


@pytest.mark.parametrize(
    ("explicit", "env", "expected"),
    [
        (None, {}, None),
        ("v1.2", {"DLX_CODE_VERSION": "env", "GIT_COMMIT": "abc"}, "v1.2"),
        (None, {"DLX_CODE_VERSION": "env", "GIT_COMMIT": "abc"}, "env"),
        (None, {"GIT_COMMIT": "abc"}, "abc"),
    ],
)
def test_code_version(
    explicit: str | None, env: dict[str, str], expected: str | None, monkeypatch: Any
) -> None:
    monkeypatch.delenv("DLX_CODE_VERSION", raising=False)
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert load_config({"dlx_code_version": explicit}).code_version == expected


# --- lookup and unknown settings ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("conf", "namespace", "expected"),
    [
        ({"dlx_max_parks": 1}, None, 1),
        ({"DLX_MAX_PARKS": 2}, None, 2),
        ({"CELERY_DLX_MAX_PARKS": 3}, "CELERY", 3),
        ({"CELERY_DLX_MAX_PARKS": 3}, None, 5),
        ({"PROJ_DLX_MAX_PARKS": 4}, "PROJ", 4),
        ({"dlx_max_parks": 1, "DLX_MAX_PARKS": 2, "CELERY_DLX_MAX_PARKS": 3}, "CELERY", 1),
        ({"DLX_MAX_PARKS": 2, "CELERY_DLX_MAX_PARKS": 3}, "CELERY", 2),
    ],
)
def test_lookup_names(conf: dict[str, Any], namespace: str | None, expected: int) -> None:
    assert load_config(conf, namespace).max_parks == expected


@pytest.mark.parametrize(
    ("conf", "namespace", "unknown", "hint"),
    [
        ({"dlx_max_requeus": 1}, None, ["dlx_max_requeus"], " (did you mean dlx_max_requeues?)"),
        (
            {"DLX_MAX_REQUEUS": 1, "DLX_MAX_PARKS": 1},
            None,
            ["DLX_MAX_REQUEUS"],
            " (did you mean dlx_max_requeues?)",
        ),
        (
            {"CELERY_DLX_ENABLE": True},
            "CELERY",
            ["CELERY_DLX_ENABLE"],
            " (did you mean dlx_enabled?)",
        ),
        (
            {"dlx_a": 1, "DLX_B": 2, "CELERY_DLX_C": 3},
            "CELERY",
            ["CELERY_DLX_C", "DLX_B", "dlx_a"],
            "",
        ),
    ],
)
def test_unknown_settings_are_rejected_with_the_known_ones(
    conf: dict[str, Any], namespace: str | None, unknown: list[str], hint: str
) -> None:
    assert unknown_settings(conf, namespace) == unknown
    with pytest.raises(ConfigurationError) as info:
        load_config(conf, namespace)
    message = str(info.value)
    assert message.startswith(
        f"unknown celery_dlx setting(s): {', '.join(unknown)}{hint}; known settings: "
    )
    known = re.search(r"known settings: (.*) \(see", message)
    assert known is not None and known.group(1).split(", ") == sorted(SETTINGS)
    assert message.endswith(f"(see {doc_url('configuration')})")


@pytest.mark.parametrize(
    ("conf", "namespace"),
    [
        ({"CELERY_DLX_ENABLE": True}, None),
        ({"dlx": 1, "dlxfoo": 2, "my_dlx_thing": 3, 42: "x"}, None),
        ({"CELERY_TASK_DEFAULT_QUEUE": "work", "task_default_queue": "work"}, "CELERY"),
    ],
)
def test_keys_that_are_not_dlx_settings_are_left_alone(
    conf: dict[Any, Any], namespace: str | None
) -> None:
    assert unknown_settings(conf, namespace) == []
    assert load_config(conf, namespace) == load_config({})


class ExplodingConf(dict[str, Any]):
    """A conf whose ``in`` fails for some keys, as some settings objects do."""

    def __contains__(self, key: object) -> bool:
        if isinstance(key, str) and key.isupper():
            raise KeyError(key)
        return super().__contains__(key)


def test_lookup_survives_a_conf_that_raises() -> None:
    assert load_config(ExplodingConf(dlx_max_parks=7)).max_parks == 7


# --- a real Celery app ---------------------------------------------------------------------------


class DjangoSettings:
    """What a Django settings module looks like to ``config_from_object(namespace="CELERY")``."""

    CELERY_BROKER_URL = NO_BROKER
    CELERY_TASK_DEFAULT_QUEUE = "work"
    CELERY_DLX_ENABLED = True
    CELERY_DLX_MAX_PARKS = 7
    CELERY_DLX_MAX_REQUEUES = 0
    CELERY_DLX_BACKOFF = [1, 2]
    CELERY_DLX_QUEUES = {"billing": {"importance": "page"}}
    CELERY_DLX_EXCHANGE = "proj_dlx"
    DEBUG = True


def test_celery_app_reads_namespaced_settings() -> None:
    app = Celery("django_proj", set_as_current=False)
    app.config_from_object(DjangoSettings, namespace="CELERY")
    config = get_runtime(app).config
    assert isinstance(config, DLXConfig)
    assert config.enabled is True
    assert (config.max_parks, config.max_requeues, config.exchange) == (7, 0, "proj_dlx")
    assert config.backoff == ListBackoff((1.0, 2.0))
    assert config.importance("billing") == "page"
    assert config.service_queue == "celery_dlx.dead"
    assert app.conf.task_default_queue == "work"


def test_celery_app_rejects_an_unknown_namespaced_setting() -> None:
    class Misspelt(DjangoSettings):
        CELERY_DLX_MAX_REQUEUS = 1

    app = Celery("django_proj", set_as_current=False)
    app.config_from_object(Misspelt, namespace="CELERY")
    with pytest.raises(
        ConfigurationError, match=r"unknown celery_dlx setting\(s\): CELERY_DLX_MAX"
    ):
        get_runtime(app)


def test_celery_app_reads_plain_settings() -> None:
    app = Celery("plain", set_as_current=False, broker=NO_BROKER)
    app.conf.update(dlx_max_parks=3, dlx_drain_interval=timedelta(seconds=2))
    config = get_runtime(app).config
    assert (config.max_parks, config.drain_interval, config.enabled) == (3, 2.0, False)
    assert get_runtime(app) is get_runtime(app)
