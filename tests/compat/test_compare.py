"""The compat gate script's orchestration, on scripted runs of Celery's suite (no Celery run).

``run_suite`` is replaced by a fake that answers from a script of outcomes and records each
pytest session the gate asked for: which tests, in which mode.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.compat import gate
from tests.compat.gate import FAILED, PASSED, Failure, Result

HERE = Path(__file__).resolve().parent
FILE = "test_x.py"
A, B, C, D = (f"t/integration/{FILE}::test_{n}" for n in "abcd")
TIMEOUT = Result(FAILED, Failure("celery.exceptions.TimeoutError", "TimeoutError: timed out"))
KEYERROR = Result(FAILED, Failure("KeyError", "KeyError: 'x'"))


class FakeSuite:
    """Answers ``run_suite`` from ``whole`` (mode -> results of the whole file) and ``alone``
    ((test, mode) -> the outcomes of its reruns, in order); records every session."""

    def __init__(
        self,
        whole: dict[str, dict[str, Result]],
        alone: dict[tuple[str, str], list[Result]] | None = None,
        fates: dict[str, int] | None = None,
        drainers: list[bool] | None = None,
    ) -> None:
        self.whole = whole
        self.alone = {k: list(v) for k, v in (alone or {}).items()}
        self.fates = {"parked": 3, "drained": 3} if fates is None else fates
        self.drainers = [True] if drainers is None else drainers
        self.sessions: list[tuple[tuple[str, ...], str, bool]] = []

    def __call__(self, module: ModuleType) -> Callable[..., Any]:
        def run_suite(
            suite: Path, targets: list[str], mode: str, *, rerun: bool = False, **_: Any
        ) -> Any:
            self.sessions.append((tuple(targets), mode, rerun))
            if targets == [f"t/integration/{FILE}"]:
                results = dict(self.whole[mode])
            else:
                (test,) = targets
                results = {test: self.alone[(test, mode)].pop(0)}
            run = module.Run(results, 1.0)
            if mode == "dlx":
                run.fates, run.drainers = dict(self.fates), list(self.drainers)
            return run

        return run_suite


def args(compat: ModuleType, *argv: str) -> Any:
    """The parsed command line, as main() would have it."""
    parsed: dict[str, Any] = {}

    def capture(suite: Path, file: str, a: Any, allowed: Any) -> dict[str, Any]:
        parsed["args"] = a
        raise SystemExit(0)

    original = compat.compare
    compat.compare = capture
    try:
        with pytest.raises(SystemExit):
            compat.main([FILE, *argv])
    finally:
        compat.compare = original
    return parsed["args"]


@pytest.fixture
def offline(compat: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> ModuleType:
    monkeypatch.setattr(compat, "fetch_suite", lambda version: tmp_path)
    monkeypatch.setattr(compat, "load_allowed", dict)
    return compat


ALLOWED_A = gate.AllowedDifference(
    test=A, reason="retried first", instead="-", exception="TimeoutError", message="timed out"
)


def test_only_differences_not_allowed_as_they_failed_are_rerun_alone_in_both_modes(
    offline: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSuite(
        whole={
            "plain": {A: Result(PASSED), B: Result(PASSED), C: Result(PASSED), D: TIMEOUT},
            "dlx": {A: TIMEOUT, B: KEYERROR, C: Result(PASSED), D: TIMEOUT},
        },
        alone={(B, "plain"): [Result(PASSED)] * 3, (B, "dlx"): [KEYERROR] * 3},
    )
    monkeypatch.setattr(offline, "run_suite", fake(offline))
    report = offline.compare(Path("suite"), FILE, args(offline), {A: ALLOWED_A})
    whole = (f"t/integration/{FILE}",)
    assert fake.sessions == [
        (whole, "plain", False),
        (whole, "dlx", False),
        *[((B,), mode, True) for _ in range(3) for mode in ("plain", "dlx")],
    ]
    assert report["passed_plain_failed_dlx"] == [A, B]
    assert report["allowed"] == [A] and report["flaky"] == [] and report["unexplained"] == [B]
    assert report["verdicts"][B]["reruns"] == {"plain": [PASSED] * 3, "dlx": [FAILED] * 3}
    assert "reruns" not in report["verdicts"][A]
    assert report["drain"]["parked"] == report["drain"]["drained"] == 3
    assert report["drain"]["problem"] is None


def test_an_allowed_test_failing_otherwise_is_rerun_and_fails_the_gate(
    offline: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSuite(
        whole={"plain": {A: Result(PASSED)}, "dlx": {A: KEYERROR}},
        alone={(A, "plain"): [Result(PASSED)] * 3, (A, "dlx"): [Result(PASSED)] * 3},
    )
    monkeypatch.setattr(offline, "run_suite", fake(offline))
    report = offline.compare(Path("suite"), FILE, args(offline), {A: ALLOWED_A})
    assert len(fake.sessions) == 2 + 6
    assert report["unexplained"] == [A]
    why = report["verdicts"][A]["why"]
    assert "allowed for TimeoutError matching 'timed out', but failed with KeyError" in why
    assert report["verdicts"][A]["dlx_failure"] == "KeyError: 'x'"


def test_a_difference_that_fails_plain_in_a_rerun_is_flaky(
    offline: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = FakeSuite(
        whole={"plain": {B: Result(PASSED)}, "dlx": {B: TIMEOUT}},
        alone={(B, "plain"): [Result(PASSED), TIMEOUT], (B, "dlx"): [TIMEOUT, Result(PASSED)]},
    )
    monkeypatch.setattr(offline, "run_suite", fake(offline))
    report = offline.compare(Path("suite"), FILE, args(offline, "--reruns", "2"), {})
    assert len(fake.sessions) == 2 + 4
    assert report["flaky"] == [B] and report["unexplained"] == []


@pytest.mark.parametrize(
    ("whole_dlx", "alone", "fates", "drainers", "status", "printed"),
    [
        ({B: Result(PASSED)}, {}, None, None, 0, "3 parked, 3 drained"),
        ({B: TIMEOUT}, {(B, "plain"): [Result(PASSED)], (B, "dlx"): [Result(PASSED)]}, None,
         None, 1, "UNEXPLAINED"),
        ({B: Result(PASSED)}, {}, {"parked": 4}, None, 1, "DRAIN PROBLEM: 4 retries were parked"),
        ({B: Result(PASSED)}, {}, None, [False], 1, "DRAIN PROBLEM: a session worker ran"),
    ],
    ids=["clean", "regression", "parked-not-drained", "no-drainer"],
)  # fmt: skip
def test_the_exit_status_and_report(
    offline: ModuleType,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    whole_dlx: dict[str, Result],
    alone: dict[tuple[str, str], list[Result]],
    fates: dict[str, int] | None,
    drainers: list[bool] | None,
    status: int,
    printed: str,
) -> None:
    fake = FakeSuite({"plain": {B: Result(PASSED)}, "dlx": whole_dlx}, alone, fates, drainers)
    monkeypatch.setattr(offline, "run_suite", fake(offline))
    out = tmp_path / "report.json"
    assert offline.main([FILE, "--reruns", "1", "--json", str(out)]) == status
    assert printed in capsys.readouterr().out
    (report,) = json.loads(out.read_text())["files"]
    assert report["file"] == FILE


def test_no_rerun_is_reruns_zero(offline: ModuleType) -> None:
    assert args(offline, "--no-rerun").reruns == 0
    assert args(offline).reruns == offline.DEFAULT_RERUNS == 3


# -- the script's own reading of reports and of the allow-list --------------------------------


def test_junit_reports_are_read_with_each_tests_node_id_and_failure(
    compat: ModuleType, tmp_path: Path
) -> None:
    (tmp_path / "t" / "integration").mkdir(parents=True)
    (tmp_path / "t" / "integration" / "test_canvas.py").touch()
    xml = tmp_path / "junit.xml"
    shutil.copy(HERE / "junit" / "mutable_errback-dlx.xml", xml)
    results = compat.parse_junit(tmp_path, xml)
    node = (
        "t/integration/test_canvas.py::test_chord::"
        "test_mutable_errback_called_by_chord_from_group_fail_multiple_on_body_failure"
    )
    assert results[f"{node}[errback_old_style]"] == Result(PASSED)
    new = results[f"{node}[errback_new_style]"]
    # Two <failure> elements (the subtest's, then "contains 1 failed subtest"): the first counts.
    assert new.outcome == FAILED and new.failure is not None
    assert new.failure.exc_type == "celery.exceptions.TimeoutError"
    assert "was never incremented" in new.failure.message


def test_the_allow_list_loads_and_names_existing_celery_dlx_tests(compat: ModuleType) -> None:
    allowed = compat.load_allowed()
    assert all(isinstance(a, gate.AllowedDifference) for a in allowed.values())


def test_an_allow_list_entry_without_its_failure_stops_the_gate(
    compat: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    toml = tmp_path / "allowed.toml"
    toml.write_text('[[allowed]]\ntest = "t::x"\nreason = "r"\ninstead = "tests/compat/x.py"\n')
    monkeypatch.setattr(compat, "ALLOWED", toml)
    with pytest.raises(SystemExit, match="give the failure it is allowed for"):
        compat.load_allowed()
