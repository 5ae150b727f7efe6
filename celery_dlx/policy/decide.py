"""Pure failure policy: classify an exception, apply the escalation ladder, compute backoff.

No I/O, so every rule is a table test.
"""

from __future__ import annotations

import contextlib
import math
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta

from celery_dlx.errors import ConfigurationError
from celery_dlx.fates import BURIED, PARKED, REQUEUED, Bury, FateRequest, Park, Requeue
from celery_dlx.message.dictinit import dict_init
from celery_dlx.message.failure import Failure, KnownAttempt
from celery_dlx.message.headers import DLXState, exception_type_name, fingerprint
from celery_dlx.policy import durations

#: What a classification list may hold: exception classes, or predicates over an exception.
Matcher = type[BaseException] | Callable[[BaseException], bool]


@dict_init
@dataclass(frozen=True)
class ToRequeue:
    """Publish a copy at the tail of the same queue."""

    reason: str = ""


@dict_init
@dataclass(frozen=True)
class ToPark:
    """Store the message and republish it after ``delay`` seconds."""

    delay: float
    reason: str = ""


@dict_init
@dataclass(frozen=True)
class ToBury:
    """Send the message to the graveyard."""

    reason: str


Decision = ToRequeue | ToPark | ToBury


class Backoff(ABC):
    """A delay schedule: ``backoff(n)`` is the delay in seconds before the retry after park ``n``."""

    @abstractmethod
    def __call__(self, park_index: int) -> float: ...


@dataclass(frozen=True)
class ListBackoff(Backoff):
    """Explicit delays; park ``n`` beyond the list uses the last one."""

    delays: tuple[float, ...]

    def __call__(self, park_index: int) -> float:
        return self.delays[min(park_index, len(self.delays) - 1)]


@dataclass(frozen=True)
class ExponentialBackoff(Backoff):
    """``min(max, base * factor**n)``, then up to ``jitter`` (a fraction) taken off at random."""

    base: float = 10.0
    factor: float = 2.0
    max: float = 3600.0
    jitter: float = 0.1
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __call__(self, park_index: int) -> float:
        try:
            delay = min(self.max, self.base * self.factor ** min(park_index, 64))
        except OverflowError:  # a large factor: past any max
            delay = self.max
        if self.jitter:
            delay -= delay * self.jitter * self.rng.random()
        return delay


@dataclass(frozen=True)
class CallableBackoff(Backoff):
    """A user function of the park index."""

    fn: Callable[[int], float]

    def __call__(self, park_index: int) -> float:
        delay = self.fn(park_index)
        if not isinstance(delay, (bool, timedelta)):
            with contextlib.suppress(TypeError, ValueError):  # refused below, naming the value
                delay = float(delay)
        try:
            return durations.delay(delay, "dlx_backoff callable")
        except ConfigurationError:
            raise ConfigurationError(
                f"dlx_backoff callable returned a negative delay or not a delay: {delay!r} "
                f"(return seconds from 0 to {durations.MAX_SECONDS:.0f})"
            ) from None


def _number(value: object, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigurationError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def parse_backoff(value: object, name: str = "dlx_backoff") -> Backoff:
    """A :class:`Backoff` from a list of seconds (or timedeltas), a mapping ``{"base", "factor",
    "max", "jitter"}``, a :class:`Backoff`, or a callable of the park index.

    Raises:
        ConfigurationError: naming ``name`` and what is wrong.
    """
    if isinstance(value, Backoff):
        return value
    if isinstance(value, Mapping):
        unknown = set(value) - {"base", "factor", "max", "jitter"}
        if unknown:
            raise ConfigurationError(
                f"{name} has unknown keys {sorted(unknown)}; use base, factor, max, jitter"
            )
        jitter = _number(value.get("jitter", 0.1), f"{name}['jitter']")
        if not 0 <= jitter <= 1:
            raise ConfigurationError(f"{name}['jitter'] must be between 0 and 1, got {jitter}")
        factor = _number(value.get("factor", 2.0), f"{name}['factor']")
        if factor < 1:
            raise ConfigurationError(f"{name}['factor'] must be >= 1, got {factor}")
        return ExponentialBackoff(
            base=durations.delay(value.get("base", 10.0), f"{name}['base']"),
            factor=factor,
            max=durations.delay(value.get("max", 3600.0), f"{name}['max']"),
            jitter=jitter,
        )
    if isinstance(value, (list, tuple)):
        if not value:
            raise ConfigurationError(f"{name} must not be an empty list")
        return ListBackoff(tuple(durations.delay(v, f"{name}[{i}]") for i, v in enumerate(value)))
    if callable(value):
        return CallableBackoff(value)
    raise ConfigurationError(
        f"{name} must be a list of seconds, a mapping with base/factor/max/jitter or a callable, "
        f"got {type(value).__name__}"
    )


def parse_matchers(value: object, name: str) -> tuple[Matcher, ...]:
    """Validate a classification option (exception classes or predicates)."""
    if value is None:
        return ()
    if isinstance(value, type) or not isinstance(value, (list, tuple, set, frozenset)):
        value = (value,)
    for item in value:
        if not callable(item) or (isinstance(item, type) and not issubclass(item, BaseException)):
            raise ConfigurationError(
                f"{name} must hold exception classes or predicates, got {item!r}"
            )
    return tuple(value)


@dict_init
@dataclass(frozen=True)
class Policy:
    """A task's or queue's failure policy."""

    max_requeues: int = 2
    max_parks: int = 5
    backoff: Backoff = field(default_factory=ExponentialBackoff)
    requeue_on: tuple[Matcher, ...] = ()
    park_on: tuple[Matcher, ...] = ()
    bury_on: tuple[Matcher, ...] = ()

    @property
    def max_runs(self) -> int:
        """Runs of a message that always fails: 1 + requeues + parks."""
        return 1 + self.max_requeues + self.max_parks


def _matches(exc: BaseException, matchers: Sequence[Matcher]) -> bool:
    for m in matchers:
        try:
            if isinstance(exc, m) if isinstance(m, type) else m(exc):
                return True
        except Exception:  # a broken predicate must not break failure handling
            continue
    return False


def classify(exc: BaseException, policy: Policy) -> str:
    """``"bury"``, ``"park"``, ``"requeue"`` or ``"escalate"`` (in no list)."""
    if isinstance(exc, Bury) or _matches(exc, policy.bury_on):
        return "bury"
    if isinstance(exc, Park) or _matches(exc, policy.park_on):
        return "park"
    if isinstance(exc, Requeue) or _matches(exc, policy.requeue_on):
        return "requeue"
    return "escalate"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun if n == 1 else noun + 's'}"


#: Longest user reason (a ``Requeue``/``Park`` message) a decision carries.
REASON_LIMIT = 200


def one_line(text: str, limit: int = REASON_LIMIT) -> str:
    """``text`` on one line (runs of white space made one space), cut to ``limit`` characters."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "\u2026"


def reason_of(exc: BaseException) -> str:
    """A requeue's or park's reason: the exception's type, or the words of a fate the task asked
    for (``Requeue("upstream busy")`` -> ``Requeue: upstream busy``; ``self.retry()`` ->
    ``retry``)."""
    if isinstance(exc, Park) and not exc.budgeted:  # self.retry() (RetryPark)
        return "retry"
    name = type(exc).__name__
    if isinstance(exc, FateRequest):
        message = str(exc)
        default = isinstance(exc, Park) and message in ("park", f"park for {exc.countdown}s")
        return f"{name}: {one_line(message)}" if message and not default else name
    return name


def decide(exc: BaseException, state: DLXState, policy: Policy) -> Decision:
    """The fate of a message whose run raised ``exc``, given its headers' ``state``: requeue
    while the requeue budget lasts (``park`` failures skip this), then park while the park budget
    lasts, then bury."""
    kind = classify(exc, policy)
    why = reason_of(exc)
    if kind == "bury":
        return ToBury(reason=exc.reason if isinstance(exc, Bury) else f"permanent failure: {why}")
    if kind != "park" and state.requeues < policy.max_requeues:
        return ToRequeue(reason=why)
    # self.retry() parks unbudgeted: Celery's max_retries was checked before it asked.
    if state.parks < policy.max_parks or (isinstance(exc, Park) and not exc.budgeted):
        countdown = exc.countdown if isinstance(exc, Park) else None
        delay = countdown if countdown is not None else policy.backoff(state.parks)
        return ToPark(delay=delay, reason=why)
    return ToBury(
        reason=f"retry budget spent: {_count(state.requeues, 'requeue')}, "
        f"{_count(state.parks, 'park')} ({why})"
    )


def root_cause(exc: BaseException) -> BaseException:
    """The failure to name: the exception a fate request wraps (``raise Park() from err``,
    ``self.retry(exc=err)``), else ``exc`` itself."""
    if isinstance(exc, FateRequest) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


@dict_init
@dataclass(frozen=True)
class FailurePlan(KnownAttempt):
    """What to do with a failed run, worked out before any I/O (:func:`plan_failure`); its
    ``failure``'s facts read as ``plan.cause``, ``plan.at_ms``..."""

    decision: Decision
    fate: str
    #: The task's own failure: named in history and obituary, raised again on burial.
    root: BaseException
    failure: Failure
    #: The state the copy carries (requeue, park); the delivery's own state on burial.
    state: DLXState
    #: Celery's ``request.retries`` of the copy's run: every requeue and park is a retry.
    retries: int
    #: Seconds until a parked copy is due; None unless parked.
    delay: float | None = None

    @property
    def at_ms(self) -> int:
        """When the run failed (epoch ms)."""
        return self.failure.at_ms or 0

    @property
    def buried(self) -> bool:
        return isinstance(self.decision, ToBury)


def plan_failure(
    exc: BaseException,
    state: DLXState,
    policy: Policy,
    *,
    task: str,
    queue: str,
    retries: int,
    at_ms: int,
) -> FailurePlan:
    """The fate of a run of ``task`` that raised ``exc`` (``state``: its headers'; ``retries``:
    Celery's count), and everything the worker then writes."""
    decision = decide(exc, state, policy)
    root = root_cause(exc)
    exc_type = exception_type_name(root)
    exc_message = str(root)
    cause = fingerprint(task, exc_type, exc_message)
    fate, after, delay = BURIED, state, None
    if not isinstance(decision, ToBury):
        fate = REQUEUED if isinstance(decision, ToRequeue) else PARKED
        after = state.after_failure(
            fate=fate,
            at_ms=at_ms,
            cause=cause,
            queue=queue,
            exc_type=exc_type,
            exc_message=exc_message,
        )
        delay = decision.delay if isinstance(decision, ToPark) else None
    failure = Failure(
        task=task,
        queue=queue,
        attempt=state.attempt + 1,
        cause=cause,
        exc_type=exc_type,
        exc_message=exc_message,
        reason=decision.reason,
        first_failure_ms=state.first_failure_ms if state.first_failure_ms is not None else at_ms,
        at_ms=at_ms,
    )
    return FailurePlan(
        decision=decision,
        fate=fate,
        root=root,
        failure=failure,
        state=after,
        retries=retries if fate == BURIED else retries + 1,
        delay=delay,
    )
