"""The validated settings of one app: :class:`DLXConfig`, built by :func:`load_config` alone.

Settings are read as ``dlx_enabled``, ``DLX_ENABLED`` and, for Django's
``config_from_object(..., namespace="CELERY")``, ``CELERY_DLX_ENABLED``; each is described in
:mod:`celery_dlx.policy.settings`.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from celery_dlx.docs_url import doc_url
from celery_dlx.errors import ConfigurationError
from celery_dlx.message.names import default_exchange, default_service_queue
from celery_dlx.policy.breaker import BreakerSettings
from celery_dlx.policy.decide import Backoff, Policy
from celery_dlx.policy.settings import (
    SENTRY_SETTINGS,
    SETTINGS,
    QueuePolicy,
    closest,
    sentry_missing,
)


def _lookup(conf: Mapping[str, Any], name: str, namespace: str | None) -> tuple[bool, object]:
    candidates = [name, name.upper()]
    if namespace:
        candidates.append(f"{namespace}_{name.upper()}")
    for key in candidates:
        try:
            if key in conf:
                return True, conf[key]
        except Exception:  # some conf objects raise on odd keys
            continue
    return False, None


def enabled_setting(conf: Mapping[str, Any], namespace: str | None = None) -> bool:
    """True when ``conf`` sets ``dlx_enabled`` to a true value, or to a non-boolean (asked for,
    if wrongly)."""
    found, value = _lookup(conf, "dlx_enabled", namespace)
    if not found:
        return False
    try:
        return bool(SETTINGS["dlx_enabled"].check("dlx_enabled", value))
    except ConfigurationError:
        return True


def unknown_settings(conf: Mapping[str, Any], namespace: str | None = None) -> list[str]:
    """Keys in ``conf`` that look like celery_dlx settings but are not."""
    out = []
    prefixes = ["dlx_", "DLX_"] + ([f"{namespace}_DLX_"] if namespace else [])
    for key in list(conf.keys()):
        if not isinstance(key, str):
            continue
        for prefix in prefixes:
            if key.startswith(prefix):
                name = "dlx_" + key[len(prefix) :].lower()
                if name not in SETTINGS:
                    out.append(key)
    return sorted(set(out))


#: DLXConfig's field of a setting when it is not the setting's name without ``dlx_``.
_FIELD_OF = {"dlx_code_version": "code_version_setting", "dlx_importance": "default_importance"}


def field_name(setting: str) -> str:
    """The :class:`DLXConfig` attribute holding ``setting`` (``dlx_max_parks`` -> ``max_parks``)."""
    return _FIELD_OF.get(setting, setting.removeprefix("dlx_"))


@dataclass(frozen=True, kw_only=True)
class DLXConfig:
    """Validated celery_dlx settings of one app: one typed attribute per ``dlx_*`` setting
    (``config["dlx_max_parks"]`` and :attr:`values` read by setting name)."""

    enabled: bool
    redis_url: str
    redis_required: bool
    #: None: the URL's default (:meth:`celery_dlx.store.client.Replicas.for_url`).
    redis_min_replicas: int | None
    redis_replica_timeout: float
    #: auto, queue or none (the composition root resolves auto).
    redis_shards: str
    key_prefix: str
    max_requeues: int
    max_parks: int
    backoff: Backoff
    drain_interval: float
    drain_batch: int
    drain_lease: float
    #: :meth:`importance` refines it per queue.
    default_importance: str
    exchange: str
    service_queue: str
    quorum: bool
    delivery_limit: int | None
    queues: Mapping[str, QueuePolicy]
    #: None: off; :meth:`breaker_for` refines it per queue.
    breaker: BreakerSettings | None
    expired: str
    service_in_worker: bool
    service_prefetch: int
    obituary_task: str | None
    #: As set; :attr:`code_version` falls back to the environment.
    code_version_setting: str | None
    graveyard_retention: float
    graveyard_max_bytes: int
    graveyard_max_per_cause: int
    resolve_after: float
    resolved_retention: float
    cause_ttl: float
    delay_backend: str
    parent_parks: bool
    ttl_ladder: tuple[float, ...]
    protobuf_descriptor_sets: tuple[str, ...]
    protobuf_modules: tuple[str, ...]
    send_events: bool
    events_follow_worker: bool
    sentry: bool
    sentry_include_payload: bool
    sentry_payload_limit: int
    sentry_rate_limit: int
    sentry_rate_window: float
    web_host: str
    web_port: int
    web_allowed_hosts: tuple[str, ...]
    web_basic_auth: tuple[str, ...]
    web_viewer_auth: tuple[str, ...]
    web_editors: tuple[str, ...]
    web_max_replay_rate: int
    #: Names of the settings set in the app's configuration (the rest are defaults).
    explicit: frozenset[str] = frozenset()

    @property
    def values(self) -> dict[str, object]:
        """Every setting by its name (``dlx_max_parks``), as validated."""
        return {name: getattr(self, field_name(name)) for name in SETTINGS}

    def __getitem__(self, name: str) -> Any:
        if name not in SETTINGS:
            raise KeyError(name)
        return getattr(self, field_name(name))

    @property
    def code_version(self) -> str | None:
        env = os.environ
        version = self.code_version_setting or env.get("DLX_CODE_VERSION") or env.get("GIT_COMMIT")
        return version or None

    # Each of the four below: the setting, refined by ``dlx_queues[queue]`` when present.
    def policy(self, queue: str | None = None) -> Policy:
        spec = self.queues.get(queue or "", {})
        return Policy(
            max_requeues=spec.get("max_requeues", self.max_requeues),
            max_parks=spec.get("max_parks", self.max_parks),
            backoff=spec.get("backoff", self.backoff),
        )

    def importance(self, queue: str | None = None) -> str:
        return self.queues.get(queue or "", {}).get("importance", self.default_importance)

    def breaker_for(self, queue: str | None = None) -> BreakerSettings | None:
        return self.queues.get(queue or "", {}).get("breaker", self.breaker)

    def expired_action(self, queue: str | None = None) -> str:
        return self.queues.get(queue or "", {}).get("expired", self.expired)


def load_config(conf: Mapping[str, Any], namespace: str | None = None) -> DLXConfig:
    """Validate and read every ``dlx_*`` setting from ``conf`` (an ``app.conf`` or a dict).

    Raises:
        ConfigurationError: an unknown ``dlx_*`` key, or a bad value, named; or an integration's
            settings set while its library is missing (named with the extra to install).
    """
    unknown = unknown_settings(conf, namespace)
    if unknown:
        # dlx_max_parkz of DLX_MAX_PARKZ or CELERY_DLX_MAX_PARKZ (the namespace's)
        names = [key.removeprefix(f"{namespace}_") if namespace else key for key in unknown]
        hint = closest([name.lower() for name in names], SETTINGS)
        raise ConfigurationError(
            f"unknown celery_dlx setting(s): {', '.join(unknown)}{hint}; known settings: "
            f"{', '.join(sorted(SETTINGS))} (see {doc_url('configuration')})"
        )
    values: dict[str, Any] = {}
    explicit: set[str] = set()
    for name, setting in SETTINGS.items():
        found, raw = _lookup(conf, name, namespace)
        if found:
            explicit.add(name)
        value = raw if found else setting.default
        values[name] = setting.check(name, value) if (found or value is not None) else None
    if values["dlx_delivery_limit"] is not None and not values["dlx_quorum"]:
        raise ConfigurationError(
            "dlx_delivery_limit needs quorum queues: set dlx_quorum = True or remove dlx_delivery_limit"
        )
    # An integration the settings ask for must be installed; a default one may be absent.
    asked = values["dlx_sentry"] and explicit & SENTRY_SETTINGS
    if asked and importlib.util.find_spec("sentry_sdk") is None:
        raise ConfigurationError(sentry_missing(explicit, "no module named 'sentry_sdk'"))
    # A key prefix of its own gives an app broker names of its own: apps on one vhost stay apart.
    if "dlx_exchange" not in explicit:
        values["dlx_exchange"] = default_exchange(values["dlx_key_prefix"])
    if "dlx_service_queue" not in explicit:
        values["dlx_service_queue"] = default_service_queue(values["dlx_key_prefix"])
    return DLXConfig(
        **{field_name(name): value for name, value in values.items()},
        explicit=frozenset(explicit),
    )
