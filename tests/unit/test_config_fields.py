"""DLXConfig has one typed field per setting, and every validator returns the field's type."""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import pytest

from celery_dlx.policy.config import DLXConfig, field_name, load_config
from celery_dlx.policy.decide import Backoff
from celery_dlx.policy.settings import SETTINGS

HINTS = typing.get_type_hints(DLXConfig)


def conforms(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(conforms(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if origin is tuple:
        return isinstance(value, tuple) and all(conforms(v, args[0]) for v in value)
    if origin in (Mapping, dict):
        return isinstance(value, Mapping) and all(isinstance(k, str) for k in value)
    if origin is frozenset:
        return isinstance(value, frozenset)
    if hint is float:
        return isinstance(value, float)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, hint)


def test_one_field_per_setting() -> None:
    fields = {f.name for f in dataclasses.fields(DLXConfig)}
    assert fields - {"explicit"} == {field_name(name) for name in SETTINGS}


def test_config_is_frozen() -> None:
    config = load_config({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.max_parks = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "conf",
    [
        {},
        {
            "dlx_quorum": "yes",
            "dlx_delivery_limit": 5,
            "dlx_drain_interval": timedelta(seconds=2),
            "dlx_graveyard_retention": 60,
            "dlx_backoff": [1, 2],
            "dlx_obituary_task": "proj.obituary",
            "dlx_code_version": "v1",
            "dlx_queues": {"billing": {"backoff": [5], "max_parks": 1, "importance": "page"}},
            "dlx_ttl_ladder": [1, 2.5],
            "dlx_protobuf_modules": ["proj.pb"],
        },
    ],
    ids=["defaults", "set"],
)
def test_every_validated_value_has_its_field_type(conf: dict[str, Any]) -> None:
    config = load_config(conf)
    for name in SETTINGS:
        attr = field_name(name)
        value = getattr(config, attr)
        assert conforms(value, HINTS[attr]), f"{name}: {value!r} is not {HINTS[attr]}"
        assert config[name] is value and config.values[name] is value
    assert config.explicit == frozenset(conf)


def test_queue_policies_are_typed() -> None:
    config = load_config({"dlx_queues": {"billing": {"backoff": [5], "max_requeues": 0}}})
    policy = config.queues["billing"]
    assert isinstance(policy["backoff"], Backoff) and policy["max_requeues"] == 0
    assert config.policy("billing").max_requeues == 0
