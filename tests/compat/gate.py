"""The compatibility gate's decisions: pure functions over the outcomes of Celery's suite.

``scripts/celery_compat.py`` runs Celery's ``t/integration`` plain and with celery_dlx on and
does the I/O (pytest sessions, JUnit files, Redis); every decision is made here, on plain data:

- :func:`differing`: the tests that pass plain and not with celery_dlx on;
- :func:`first_look`: an allowed difference whose failure is the one written down in
  ``tests/compat/allowed.toml`` needs no rerun;
- :func:`judge`: any other difference, after its reruns (each alone, in both modes): flaky only
  when it failed plain too, the same way, else a regression that fails the gate;
- :func:`drain_problem`: parked retries must have been drained by the worker's drainer bootstep.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"
ALLOWED, FLAKY, REGRESSION = "allowed", "flaky", "regression"

#: Most characters of a failure's first line shown in a report.
SHOWN = 160
#: Start of the line ``tests/compat/plugin.py`` writes per session worker into a run's log.
DRAINER_MARK = "celery_dlx compat: drainer bootstep"

# pytest's JUnit message of an error outside the test's call: 'failed on setup with "<exc>"'.
_PHASE = re.compile(r'failed on (?:setup|teardown) with "(?P<exc>.*)"\Z', re.S)
# "celery.exceptions.TimeoutError: The operation timed out." / "AssertionError" / "Failed: ..."
_EXC_TYPE = re.compile(r"(?P<type>[A-Za-z_][\w.]*)(?::|\Z)")
# The report's last line, "t/integration/test_x.py:201: AssertionError": the type when the
# message leaves it out (pytest writes a one-line assertion as "assert 0 > 0").
_WHERE = re.compile(r"\S+:\d+: (?P<type>[A-Za-z_][\w.]*)\Z")


@dataclass(frozen=True)
class Failure:
    """Why a test failed, as pytest reported it.

    Attributes:
        exc_type: the exception's type as pytest names it (``AssertionError``,
            ``celery.exceptions.TimeoutError``, ``Failed`` for pytest-timeout); empty if unknown.
        message: pytest's one-line account (``<type>: <message>``, possibly truncated).
        detail: the exception's whole rendering (pytest's ``E`` lines: the full assertion diff).
    """

    exc_type: str
    message: str
    detail: str = ""

    def matchable(self) -> str:
        """The text a message pattern is searched in."""
        return f"{self.message}\n{self.detail}"

    def __str__(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        if self.exc_type and not first.startswith(self.exc_type):
            first = f"{self.exc_type}: {first}" if first else self.exc_type
        return first if len(first) <= SHOWN else first[: SHOWN - 3] + "..."


@dataclass(frozen=True)
class Result:
    """One test's outcome in one run; ``failure`` is set for ``failed``."""

    outcome: str
    failure: Failure | None = None


def failure_from_junit(message: str, text: str) -> Failure:
    """The :class:`Failure` of a JUnit ``<failure>``/``<error>``: its ``message`` attribute and
    its text (the report, whose ``E`` lines render the exception)."""
    message = message.strip()
    phase = _PHASE.match(message)
    exc = phase.group("exc") if phase else message
    lines = text.strip().splitlines()
    found = _EXC_TYPE.match(exc) or (_WHERE.match(lines[-1].strip()) if lines else None)
    detail = "\n".join(line[1:].strip() for line in lines if line.startswith("E "))
    return Failure(exc_type=found.group("type") if found else "", message=exc, detail=detail)


@dataclass(frozen=True)
class AllowedDifference:
    """An intended difference: a test of Celery's suite that fails with celery_dlx on, and how.

    Attributes:
        test: the pytest node id in Celery's suite.
        reason: why celery_dlx differs here on purpose.
        instead: the celery_dlx test of the intended behaviour.
        exception: the exception type it fails with (a name, or a dotted name's tail).
        message: a regular expression searched in the failure's message and rendering.
    """

    test: str
    reason: str
    instead: str
    exception: str | None = None
    message: str | None = None

    def matches(self, failure: Failure | None) -> bool:
        """True when ``failure`` is the failure written down (type and pattern, those given)."""
        if failure is None:
            return False
        if self.exception is not None and not type_matches(failure.exc_type, self.exception):
            return False
        return self.message is None or re.search(self.message, failure.matchable()) is not None

    def expected(self) -> str:
        """The written-down failure, for reports."""
        parts = [self.exception] if self.exception else []
        if self.message is not None:
            parts.append(f"matching {self.message!r}")
        return " ".join(parts)


def type_matches(exc_type: str, expected: str) -> bool:
    """``celery.exceptions.TimeoutError`` matches ``TimeoutError`` and itself, not ``Error``."""
    return exc_type == expected or exc_type.endswith("." + expected)


def parse_allowed(data: Mapping[str, Any]) -> dict[str, AllowedDifference]:
    """The ``[[allowed]]`` entries of ``allowed.toml`` (already parsed), by test node id.

    Raises:
        ValueError: an entry lacks ``test``, ``reason`` or ``instead``, gives neither
            ``exception`` nor ``message``, has an invalid ``message`` pattern, or repeats a test.
    """
    allowed: dict[str, AllowedDifference] = {}
    for entry in data.get("allowed", []):
        missing = {"test", "reason", "instead"} - set(entry)
        if missing:
            raise ValueError(f"entry {entry} lacks {sorted(missing)}")
        unknown = set(entry) - {"test", "reason", "instead", "exception", "message"}
        if unknown:
            raise ValueError(f"{entry['test']}: unknown keys {sorted(unknown)}")
        if "exception" not in entry and "message" not in entry:
            raise ValueError(
                f"{entry['test']}: give the failure it is allowed for: `exception` (its type) "
                "and/or `message` (a pattern of its message), as the test fails with celery_dlx on"
            )
        if "message" in entry:
            try:
                re.compile(entry["message"])
            except re.error as exc:
                raise ValueError(f"{entry['test']}: message is not a valid pattern: {exc}") from exc
        if entry["test"] in allowed:
            raise ValueError(f"{entry['test']}: listed twice")
        allowed[entry["test"]] = AllowedDifference(
            test=entry["test"],
            reason=entry["reason"],
            instead=entry["instead"],
            exception=entry.get("exception"),
            message=entry.get("message"),
        )
    return allowed


def differing(plain: Mapping[str, Result], dlx: Mapping[str, Result]) -> list[str]:
    """Tests that passed plain and did not pass with celery_dlx on (failed, skipped or missing)."""
    return sorted(
        test
        for test, result in plain.items()
        if result.outcome == PASSED and (test not in dlx or dlx[test].outcome != PASSED)
    )


@dataclass(frozen=True)
class Verdict:
    """What the gate makes of one differing test; ``kind`` is allowed, flaky or regression."""

    test: str
    kind: str
    why: str


@dataclass
class Reruns:
    """The outcomes of one test's reruns, each alone in its own pytest session."""

    plain: list[Result | None] = field(default_factory=list)
    dlx: list[Result | None] = field(default_factory=list)


def first_look(test: str, dlx: Result | None, allowed: AllowedDifference | None) -> Verdict | None:
    """The verdict that needs no rerun: the test fails with celery_dlx on as written down.

    Returns:
        An ``allowed`` verdict, or None when the reruns decide.
    """
    if allowed is not None and dlx is not None and allowed.matches(dlx.failure):
        return Verdict(test, ALLOWED, f"fails as written down ({allowed.expected()})")
    return None


def judge(
    test: str, dlx: Result | None, allowed: AllowedDifference | None, reruns: Reruns
) -> Verdict:
    """The verdict on a differing test once :func:`first_look` left it to the reruns.

    It is flaky only if it failed plain in a rerun too, the same way (:func:`same_way`) as it
    failed with celery_dlx on. Anything else is a regression: failing only with celery_dlx on,
    even when every rerun passed (a gate passed by luck is no gate), or failing plain alone for
    another reason (a test that needs the tests before it: its reruns alone tell nothing).
    """
    seen = _shown(dlx)
    if allowed is not None:
        base = f"allowed for {allowed.expected()}, but failed with {seen}"
    else:
        base = f"not on the allow-list; failed with {seen}"
    failed_plain = [r for r in reruns.plain if r is not None and r.outcome == FAILED]
    alike = [r for r in failed_plain if dlx is not None and same_way(r.failure, dlx.failure)]
    if alike:
        return Verdict(
            test,
            FLAKY,
            f"failed plain too, the same way, in {len(alike)} of {len(reruns.plain)} reruns "
            f"({_shown(alike[0])})",
        )
    if failed_plain:
        return Verdict(
            test,
            REGRESSION,
            f"{base}; failed plain alone in {len(failed_plain)} of {len(reruns.plain)} reruns, "
            f"but otherwise ({_shown(failed_plain[0])}): the reruns do not explain it",
        )
    if not reruns.dlx:
        return Verdict(test, REGRESSION, f"{base}; not rerun")
    failed_dlx = [r for r in reruns.dlx if r is None or r.outcome != PASSED]
    if failed_dlx:
        also = sorted({_shown(r) for r in failed_dlx})
        return Verdict(
            test,
            REGRESSION,
            f"{base}; with celery_dlx on it failed again in {len(failed_dlx)} of "
            f"{len(reruns.dlx)} reruns ({'; '.join(also)}), never plain in {len(reruns.plain)}",
        )
    return Verdict(
        test,
        REGRESSION,
        f"{base} once; passed its {len(reruns.dlx)} reruns with celery_dlx on and never failed "
        f"plain ({len(reruns.plain)} reruns): a failure seen only with celery_dlx on",
    )


def same_way(plain: Failure | None, dlx: Failure | None) -> bool:
    """True when a plain failure is the celery_dlx one again: the same exception type (a
    timeout plain explains a timeout with celery_dlx on, an assertion does not). A type named
    without its module (pytest's last report line) matches its dotted name."""
    if plain is None or dlx is None or not plain.exc_type or not dlx.exc_type:
        return False
    return type_matches(plain.exc_type, dlx.exc_type) or type_matches(dlx.exc_type, plain.exc_type)


def _shown(result: Result | None) -> str:
    if result is None:
        return "no result (not run)"
    if result.failure is not None:
        return str(result.failure)
    return result.outcome


def drain_problem(fates: Mapping[str, int], drainers: Sequence[bool]) -> str | None:
    """Why the drain of a celery_dlx run is not the worker's own drainer at work, or None.

    Args:
        fates: fate -> count in the run's failure history (``parked``, ``drained``...).
        drainers: per session worker the run started, whether its drainer bootstep was running.
    """
    if not all(drainers):
        return "a session worker ran without celery_dlx's drainer bootstep"
    parked, drained = fates.get("parked", 0), fates.get("drained", 0)
    if parked and not drainers:
        return f"{parked} retries were parked but no session worker reported its drainer bootstep"
    if parked and not drained:
        return f"{parked} retries were parked and none was drained by the worker's drainer"
    return None


def drainer_line(hostname: str, running: bool) -> str:
    """The plugin's line on one session worker's drainer bootstep."""
    return f"{DRAINER_MARK} {'running' if running else 'NOT running'} in worker {hostname}"


def drainer_states(log: str) -> list[bool]:
    """Per session worker of a run (its :func:`drainer_line` in ``log``), whether the drainer
    bootstep was running."""
    return [
        line.split(DRAINER_MARK, 1)[1].split()[0] == "running"
        for line in log.splitlines()
        if DRAINER_MARK in line
    ]
