"""The per-cause breaker (automatic hold), as a pure state machine.

When one cause (fingerprint) fails more than ``failures`` times within ``window`` seconds on a
queue, the breaker of that (queue, cause) opens: new failures of that cause are *held*, i.e.
parked for ``hold`` seconds without spending their requeue/park budget. Every ``probe`` seconds
one held message, the *canary*, is parked due at the probe time instead; if it succeeds the
breaker closes and the held messages are made due again at ``release_rate`` per second; if it
fails it is held again, as the canary of the next probe, and the hold goes on.

How it works, in time:

* closed: failures are counted in fixed windows of ``window`` seconds (a window starts at the
  first failure after the previous one ended). The failure that makes the count exceed
  ``failures`` opens the breaker and is held as the first canary, due at ``now + probe``.
* open: a failure is held due at ``now + hold``, unless the slot of the current probe time has no
  canary yet: then it is the canary, due at the probe time. A failure at or after the probe time
  (the canary's own, usually) moves the probe time to ``now + probe``.
* ``hold`` is an upper bound: a held message comes back after it whatever happens, so a lost
  canary or a breaker state that expired never strands held messages.

Everything here is pure (:func:`on_failure`, :func:`on_success`); ``store/breaker.py`` keeps the
state in Redis and the worker carries out the verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from celery_dlx.errors import ConfigurationError

# Re-exported: the headers of a held copy are named with celery_dlx's other headers (in
# OWN_HEADERS, so a replay drops them).
from celery_dlx.message.names import HELD_HEADER as HELD_HEADER
from celery_dlx.message.names import HOLDS_HEADER as HOLDS_HEADER

#: The keys of a ``dlx_breaker`` mapping, with their defaults.
BREAKER_DEFAULTS: Mapping[str, float] = {
    "failures": 50,
    "window": 60.0,
    "hold": 300.0,
    "probe": 60.0,
    "release_rate": 50,
}


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


def _positive(value: object, where: str, *, integer: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(f"{where} must be a positive number, got {value!r}")
    if value <= 0 or (integer and value != int(value)):
        kind = "a positive integer" if integer else "a positive number of seconds"
        raise ConfigurationError(f"{where} must be {kind}, got {value!r}")
    return value


def parse_breaker(value: object, name: str = "dlx_breaker") -> BreakerSettings | None:
    """Validate a ``dlx_breaker`` setting or option: None (off), or a mapping of
    ``failures``, ``window``, ``hold``, ``probe``, ``release_rate`` (missing keys take
    :data:`BREAKER_DEFAULTS`).

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
    merged = {**BREAKER_DEFAULTS, **value}
    checked = {
        key: _positive(merged[key], f"{name}[{key!r}]", integer=key in ("failures", "release_rate"))
        for key in BREAKER_DEFAULTS
    }
    settings = BreakerSettings(
        failures=int(checked["failures"]),
        window=float(checked["window"]),
        hold=float(checked["hold"]),
        probe=float(checked["probe"]),
        release_rate=int(checked["release_rate"]),
    )
    if settings.probe > settings.hold:
        raise ConfigurationError(
            f"{name}['probe'] ({settings.probe}) must not exceed {name}['hold'] ({settings.hold}): "
            "a held message comes back after hold seconds anyway"
        )
    return settings


@dataclass(frozen=True)
class BreakerState:
    """One (queue, cause)'s breaker; times in epoch ms, 0 when unset."""

    #: Start of the current counting window, and the failures counted in it (closed breaker).
    window_start_ms: int = 0
    failures: int = 0
    #: When the breaker opened (0: closed).
    opened_ms: int = 0
    #: When the next canary is due.
    probe_ms: int = 0
    #: The probe time whose canary has been chosen (== probe_ms once one is held for it).
    canary_ms: int = 0
    #: Messages held since the breaker opened.
    held: int = 0

    @property
    def open(self) -> bool:
        return self.opened_ms > 0


@dataclass(frozen=True)
class Hold:
    """Verdict of a failure under an open breaker: park it, budget untouched, due at ``due_ms``."""

    due_ms: int
    #: This message is the canary of the probe at ``due_ms``.
    canary: bool
    #: This failure opened the breaker (alert once).
    opened: bool


def on_failure(
    state: BreakerState, settings: BreakerSettings, now_ms: int
) -> tuple[BreakerState, Hold | None]:
    """The breaker after one more failure of its cause at ``now_ms``, and the failure's verdict:
    a :class:`Hold`, or None (closed: the failure takes its ordinary fate)."""
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
    """The breaker after a held message of its cause succeeded: closed (counts reset); and
    whether it was open (its held messages are then released)."""
    return BreakerState(), state.open


def release_schedule(count: int, rate: int, now_ms: int) -> list[tuple[int, int, int]]:
    """Due times that release ``count`` held messages at ``rate`` per second from ``now_ms``:
    ``(start, stop, due_ms)`` slices of the held list, one per second."""
    return [(i, min(i + rate, count), now_ms + (i // rate) * 1000) for i in range(0, count, rate)]
