"""The per-cause breaker (automatic hold), as a pure state machine.

When a cause (fingerprint) fails more than ``failures`` times within ``window`` seconds on a
queue, its breaker opens: new failures of the cause are *held* (parked for ``hold`` seconds
without spending their budget), except one *canary* per ``probe`` seconds, due at the probe
time. A canary that succeeds closes the breaker and releases the held messages at
``release_rate`` per second; one that fails is held again as the next probe's canary.

* closed: failures are counted in fixed windows (one starts at the first failure after the last
  ended); the failure past ``failures`` opens the breaker as the first canary, due at
  ``now + probe``.
* open: a failure is the canary if the current probe time has none yet, else held to
  ``now + hold``; a failure at or after the probe time moves it to ``now + probe``.
* ``hold`` is an upper bound, so a lost canary or an expired state never strands held messages.

``store/breaker.py`` keeps the state in Redis; the worker carries out the verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from celery_dlx.errors import ConfigurationError

# Re-exported; named with the other headers (in OWN_HEADERS, so a replay drops them).
from celery_dlx.message.names import HELD_HEADER as HELD_HEADER
from celery_dlx.message.names import HOLDS_HEADER as HOLDS_HEADER


@dataclass(frozen=True)
class BreakerSettings:
    """A validated ``dlx_breaker`` (durations in seconds)."""

    failures: int = 50
    window: float = 60.0
    hold: float = 300.0
    probe: float = 60.0
    release_rate: int = 50

    @property
    def window_ms(self) -> int:
        return int(self.window * 1000)

    @property
    def hold_ms(self) -> int:
        return int(self.hold * 1000)

    @property
    def probe_ms(self) -> int:
        return int(self.probe * 1000)


#: The keys of a ``dlx_breaker`` mapping, with their defaults.
BREAKER_DEFAULTS: Mapping[str, float] = asdict(BreakerSettings())


def _positive(value: object, where: str, *, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(f"{where} must be a positive number, got {value!r}")
    if value <= 0 or (integer and value != int(value)):
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ConfigurationError(f"{where} must be {kind}, got {value!r}")
    return int(value) if integer else float(value)


def parse_breaker(value: object, name: str = "dlx_breaker") -> BreakerSettings | None:
    """Validate a ``dlx_breaker`` setting or option: None (off), or a mapping of
    :data:`BREAKER_DEFAULTS`' keys (missing ones take their defaults).

    Raises:
        ConfigurationError: naming ``name`` and what is wrong.
    """
    if value is None or isinstance(value, BreakerSettings):
        return value
    if not isinstance(value, Mapping):
        raise ConfigurationError(
            f"{name} must be None or a mapping with {', '.join(BREAKER_DEFAULTS)}, got {value!r}"
        )
    unknown = set(value) - set(BREAKER_DEFAULTS)
    if unknown:
        raise ConfigurationError(
            f"{name} has unknown keys {sorted(map(str, unknown))}; use {', '.join(BREAKER_DEFAULTS)}"
        )
    checked: dict[str, Any] = {
        key: _positive(value.get(key, default), f"{name}[{key!r}]", integer=type(default) is int)
        for key, default in BREAKER_DEFAULTS.items()
    }
    settings = BreakerSettings(**checked)
    if settings.probe > settings.hold:
        raise ConfigurationError(
            f"{name}['probe'] ({settings.probe}) must not exceed {name}['hold'] ({settings.hold}): "
            "a held message comes back after hold seconds anyway"
        )
    return settings


@dataclass(frozen=True)
class BreakerState:
    """One (queue, cause)'s breaker; times in epoch ms, 0 when unset."""

    #: Start of the current counting window, and the failures counted in it.
    window_start_ms: int = 0
    failures: int = 0
    #: 0: closed.
    opened_ms: int = 0
    #: When the next canary is due.
    probe_ms: int = 0
    #: The probe time whose canary has been chosen.
    canary_ms: int = 0
    held: int = 0

    @property
    def open(self) -> bool:
        return self.opened_ms > 0


@dataclass(frozen=True)
class Hold:
    """Verdict of a failure under an open breaker: park it, budget untouched, due at ``due_ms``."""

    due_ms: int
    canary: bool
    #: This failure opened the breaker (alert once).
    opened: bool


def on_failure(
    state: BreakerState, settings: BreakerSettings, now_ms: int
) -> tuple[BreakerState, Hold | None]:
    """The breaker after one more failure at ``now_ms``, and a :class:`Hold` (None: closed)."""
    if state.open:
        probe = state.probe_ms
        if now_ms >= probe:
            probe = now_ms + settings.probe_ms
        canary = state.canary_ms < probe
        due = probe if canary else now_ms + settings.hold_ms
        after = replace(
            state,
            probe_ms=probe,
            canary_ms=probe if canary else state.canary_ms,
            held=state.held + 1,
        )
        return after, Hold(due_ms=due, canary=canary, opened=False)
    start, count = state.window_start_ms, state.failures
    if not count or now_ms - start >= settings.window_ms:
        start, count = now_ms, 0
    count += 1
    if count <= settings.failures:
        return replace(state, window_start_ms=start, failures=count), None
    probe = now_ms + settings.probe_ms
    opened = BreakerState(
        window_start_ms=start,
        failures=count,
        opened_ms=now_ms,
        probe_ms=probe,
        canary_ms=probe,
        held=1,
    )
    return opened, Hold(due_ms=probe, canary=True, opened=True)


def on_success(state: BreakerState) -> tuple[BreakerState, bool]:
    """The breaker after a held message succeeded (closed), and whether it was open."""
    return BreakerState(), state.open


def release_schedule(count: int, rate: int, now_ms: int) -> list[tuple[int, int, int]]:
    """``(start, stop, due_ms)`` slices releasing ``count`` held messages, ``rate`` a second."""
    return [(i, min(i + rate, count), now_ms + (i // rate) * 1000) for i in range(0, count, rate)]
