"""Every duration celery_dlx accepts, bounded by what its consumer can use.

Durations are finite seconds (int, float or :class:`~datetime.timedelta`; never a bool):

* a **delay** before a parked retry: ``0 <= s <= MAX_SECONDS`` (0: due at once).
* a **duration** setting: ``0.001 <= s <= MAX_SECONDS``: Redis counts whole milliseconds (``PX
  0`` is an error, a zero lease is no lease).
* a **ladder** step (``dlx_ttl_ladder``): at least 1 ms, strictly above the step before it once
  in whole ms, with room for the delay queue's ``x-expires`` (step + :data:`EXPIRES_MARGIN_MS`)
  within :data:`MAX_TTL_MS`. The setting and the TTL ladder both call :func:`ladder_ms`, so a
  ladder the configuration accepts is one the broker accepts.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from datetime import timedelta

from celery_dlx.errors import ConfigurationError

#: The longest duration: a :class:`~datetime.timedelta`'s (Celery beat schedules are timedeltas),
#: which as milliseconds past now still fits Redis's 64-bit expiry times.
MAX_SECONDS = 999_999_999 * 86_400.0
#: The shortest duration setting: one millisecond, the unit of Redis expiries and RabbitMQ TTLs.
MIN_DURATION = 0.001
#: RabbitMQ's largest ``x-message-ttl`` and ``x-expires`` (ms; ten years): a larger value fails
#: the queue declare with ``PRECONDITION_FAILED - invalid arg ... value_too_large``.
MAX_TTL_MS = 315_360_000_000
#: How long an unused delay queue outlives its TTL (ms); well above the ladder's redeclare period
#: (``celery_dlx.broker.ladder``).
EXPIRES_MARGIN_MS = 3_600_000
#: The longest ladder step (ms): its ``x-expires`` is then exactly :data:`MAX_TTL_MS`.
MAX_STEP_MS = MAX_TTL_MS - EXPIRES_MARGIN_MS


def _number(value: object) -> float | None:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def delay(value: object, name: str) -> float:
    """``value`` as a delay before a retry (raises ConfigurationError naming ``name``)."""
    seconds = _number(value)
    if seconds is None or seconds < 0:
        raise ConfigurationError(f"{name} must hold non-negative seconds, got {value!r}")
    return _bounded(seconds, value, name)


def duration(value: object, name: str) -> float:
    """``value`` as a duration setting (raises ConfigurationError naming ``name``)."""
    seconds = _bounded(_step(value, name), value, name)
    if seconds < MIN_DURATION:
        raise ConfigurationError(
            f"{name} must be at least {MIN_DURATION} s (Redis counts whole milliseconds), "
            f"got {value!r}"
        )
    return seconds


def _bounded(seconds: float, value: object, name: str) -> float:
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {value!r}")
    if seconds > MAX_SECONDS:
        raise ConfigurationError(f"{name} must be at most {MAX_SECONDS:.0f} s, got {value!r}")
    return seconds


def step_ms(seconds: float) -> int:
    """A delay in whole milliseconds (RabbitMQ's TTL unit), rounded."""
    return round(seconds * 1000)


def ladder(value: object, name: str = "dlx_ttl_ladder") -> tuple[float, ...]:
    """``value`` as the steps of a TTL ladder, in seconds (raises ConfigurationError naming
    ``name`` or its step, and what is wrong)."""
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        raise ConfigurationError(f"{name} must be a non-empty list of seconds, got {value!r}")
    steps = tuple(_step(v, f"{name}[{i}]") for i, v in enumerate(value))
    if list(steps) != sorted(set(steps)):
        raise ConfigurationError(f"{name} must be strictly increasing, got {list(steps)}")
    ladder_ms(steps, name)
    return steps


def _step(value: object, name: str) -> float:
    seconds = _number(value)
    if seconds is None or seconds <= 0:
        raise ConfigurationError(f"{name} must be a positive number of seconds, got {value!r}")
    if not math.isfinite(seconds):
        raise ConfigurationError(f"{name} must be a finite number of seconds, got {value!r}")
    return seconds


def ladder_ms(steps: Iterable[float], name: str = "dlx_ttl_ladder") -> tuple[int, ...]:
    """The steps of a ladder (seconds) in whole milliseconds.

    Raises:
        ConfigurationError: no step, a step that is not finite seconds, a step below 1 ms or
            past :data:`MAX_STEP_MS`, or two steps equal (or out of order) once in milliseconds.
    """
    seconds = tuple(_step(s, f"{name}[{i}]") for i, s in enumerate(steps))
    if not seconds:
        raise ConfigurationError(f"{name} must have at least one step")
    ms = tuple(step_ms(s) for s in seconds)
    if min(ms) < 1:
        raise ConfigurationError(
            f"{name} steps must be at least 0.001 s (RabbitMQ TTLs are whole milliseconds), "
            f"got {min(seconds)}"
        )
    if max(ms) > MAX_STEP_MS:
        raise ConfigurationError(
            f"{name} steps must be at most {MAX_STEP_MS / 1000:.0f} s (RabbitMQ's longest TTL, "
            f"{MAX_TTL_MS // 1000} s, less the delay queue's expiry margin), got {max(seconds)}"
        )
    if list(ms) != sorted(set(ms)):
        raise ConfigurationError(
            f"{name} steps must differ by at least 1 ms, got {[s / 1000 for s in ms]}"
        )
    return ms
