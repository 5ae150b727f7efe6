"""The compat gate's decisions (tests/compat/gate.py) on fake outcomes and on real JUnit reports.

The files under ``junit/`` are JUnit reports of Celery's own tests run with celery_dlx on by
``scripts/celery_compat.py`` (Celery 5.7.0), kept as they were written.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import tomllib

from tests.compat import gate
from tests.compat.gate import FAILED, PASSED, SKIPPED, Failure, Reruns, Result

HERE = Path(__file__).resolve().parent
ACTIVE = "t/integration/test_inspect.py::test_Inspect::test_active"
QUEUES = "t/integration/test_inspect.py::test_Inspect::test_active_queues"
FAIL = "t/integration/test_tasks.py::test_tasks::test_fail"
ERRBACK = (
    "t/integration/test_canvas.py::test_chord::"
    "test_mutable_errback_called_by_chord_from_group_fail_multiple_on_body_failure"
)


def reported(report: str, name: str) -> Failure:
    """The first failure of test ``name`` in ``junit/<report>``."""
    for case in ET.parse(HERE / "junit" / report).getroot().iter("testcase"):
        if case.get("name") == name:
            first = next(e for e in case if e.tag in ("failure", "error"))
            return gate.failure_from_junit(first.get("message", ""), first.text or "")
    raise AssertionError(f"no {name} in {report}")


@pytest.fixture(scope="module")
def allowed() -> dict[str, gate.AllowedDifference]:
    return gate.parse_allowed(tomllib.loads((HERE / "allowed.toml").read_text()))


def failed(exc_type: str = "AssertionError", message: str = "assert 1 == 2") -> Result:
    return Result(FAILED, Failure(exc_type, f"{exc_type}: {message}"))


def entry(**fields: str) -> gate.AllowedDifference:
    return gate.AllowedDifference(test="t::x", reason="r", instead="i", **fields)


# -- reading pytest's reports ----------------------------------------------------------------


def test_a_failures_type_is_the_dotted_name_pytest_reports() -> None:
    failure = reported("test_fail-dlx.xml", "test_fail")
    assert failure.exc_type == "celery.exceptions.TimeoutError"
    assert str(failure) == "celery.exceptions.TimeoutError: The operation timed out."


@pytest.mark.parametrize(
    ("message", "exc_type"),
    [
        ("AssertionError", "AssertionError"),
        ("TypeError: object of type 'NoneType' has no len()", "TypeError"),
        ('failed on setup with "ConnectionRefusedError: [Errno 111]"', "ConnectionRefusedError"),
        ('failed on teardown with "RuntimeError: worker did not stop"', "RuntimeError"),
        ("Failed: Timeout (>300.0s) from pytest-timeout.", "Failed"),
        ("contains 1 failed subtest", ""),
    ],
)
def test_the_type_of_every_kind_of_junit_message(message: str, exc_type: str) -> None:
    assert gate.failure_from_junit(message, "").exc_type == exc_type


def test_a_one_line_assertion_takes_its_type_from_the_reports_last_line() -> None:
    failure = reported("stats-plain-alone.xml", "test_stats")
    assert failure.message == "assert 0 > 0"
    assert failure.exc_type == "AssertionError"


def test_the_detail_is_the_exceptions_rendering_whole() -> None:
    failure = reported("inspect_active-dlx.xml", "test_active")
    assert (
        "more lines; full report in element text" in failure.message
    )  # pytest's message attribute is cut short...
    assert "+         'acknowledged': False," in failure.detail  # ...its E lines are not
    assert "t/integration/test_inspect.py" not in failure.detail  # only the E lines


# -- allowed differences: the test's name and its failure ------------------------------------


def test_every_entry_of_the_allow_list_says_how_its_test_fails(
    allowed: dict[str, gate.AllowedDifference],
) -> None:
    assert allowed
    for difference in allowed.values():
        assert difference.exception or difference.message, difference.test


@pytest.mark.parametrize(
    ("report", "name", "test"),
    [
        ("test_fail-dlx.xml", "test_fail", FAIL),
        ("inspect_active-dlx.xml", "test_active", ACTIVE),
        ("inspect_active-dlx.xml", "test_query_task", ACTIVE.replace("active", "query_task")),
        ("mutable_errback-dlx.xml", ERRBACK.split("::")[-1] + "[errback_new_style]", None),
    ],
)
def test_the_allowed_tests_fail_as_written_down(
    allowed: dict[str, gate.AllowedDifference], report: str, name: str, test: str | None
) -> None:
    test = test or f"{ERRBACK}[errback_new_style]"
    assert allowed[test].matches(reported(report, name))


def test_an_allowed_test_failing_for_another_reason_is_not_allowed(
    allowed: dict[str, gate.AllowedDifference],
) -> None:
    # The worker could not encode its active_queues reply (a queue attribute that is no JSON):
    # the test fails, but not because of the dead-letter arguments its entry allows.
    encode_error = reported("active_queues-dlx-encode-error.xml", "test_active_queues")
    assert encode_error.exc_type == "TypeError"
    assert not allowed[QUEUES].matches(encode_error)
    # With that encoded, celery_dlx's own queue attributes (dlx_app...) still show beside
    # Celery's: more than the dead-letter arguments written down.
    attributes = reported("active_queues-dlx-attributes.xml", "test_active_queues")
    assert attributes.exc_type == "AssertionError"
    assert not allowed[QUEUES].matches(attributes)


def test_the_active_queues_entry_allows_the_dead_letter_arguments_alone(
    allowed: dict[str, gate.AllowedDifference],
) -> None:
    failure = reported("active_queues-dlx-attributes.xml", "test_active_queues")
    cut = [
        "\n".join(line for line in text.splitlines() if "'dlx_" not in line).replace(
            ", 'dlx_service_queue': 'celery_dlx.dead', 'dlx_quorum_service': False, "
            "'dlx_app': 'celery.tests', 'dlx_management': None",
            "",
        )
        for text in (failure.message, failure.detail)
    ]
    assert "dlx_" not in "".join(cut)
    assert allowed[QUEUES].matches(Failure(failure.exc_type, cut[0], cut[1]))


def test_a_cut_short_assertion_diff_does_not_match(
    allowed: dict[str, gate.AllowedDifference],
) -> None:
    """Without the whole diff (pytest's default) the difference cannot be told: the gate asks
    pytest for whole diffs (verbosity_assertions=2)."""
    short = reported("inspect-dlx-short-diff.xml", "test_active")
    assert not allowed[ACTIVE].matches(short)


@pytest.mark.parametrize(
    ("expected", "actual", "matches"),
    [
        ("TimeoutError", "celery.exceptions.TimeoutError", True),
        ("celery.exceptions.TimeoutError", "celery.exceptions.TimeoutError", True),
        ("TimeoutError", "TimeoutError", True),
        ("Error", "celery.exceptions.TimeoutError", False),
        ("exceptions.TimeoutError", "celery.exceptions.TimeoutError", True),
        ("TimeoutError", "Failed", False),
    ],
)
def test_an_exception_type_matches_by_its_name_or_its_dotted_tail(
    expected: str, actual: str, matches: bool
) -> None:
    assert gate.type_matches(actual, expected) is matches


def test_type_and_pattern_must_both_match_when_both_are_given() -> None:
    both = entry(exception="TimeoutError", message="never incremented")
    assert both.matches(Failure("celery.exceptions.TimeoutError", "x was never incremented"))
    assert not both.matches(Failure("celery.exceptions.TimeoutError", "The operation timed out."))
    assert not both.matches(Failure("AssertionError", "x was never incremented"))
    assert not both.matches(None)  # skipped or missing: no failure to match
    assert entry(message="never").matches(Failure("Anything", "never"))
    assert entry(exception="KeyError").matches(Failure("KeyError", "KeyError: 'a'"))


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"test": "a", "reason": "r"}, "lacks ['instead']"),
        ({"test": "a", "reason": "r", "instead": "i"}, "give the failure"),
        ({"test": "a", "reason": "r", "instead": "i", "message": "("}, "not a valid pattern"),
        ({"test": "a", "reason": "r", "instead": "i", "exception": "E", "why": "?"}, "unknown"),
    ],
)
def test_an_entry_without_a_usable_failure_is_refused(fields: dict[str, str], error: str) -> None:
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("]", r"\]")):
        gate.parse_allowed({"allowed": [fields]})


def test_a_test_listed_twice_is_refused() -> None:
    twice = {"test": "a", "reason": "r", "instead": "i", "exception": "E"}
    with pytest.raises(ValueError, match="listed twice"):
        gate.parse_allowed({"allowed": [twice, twice]})


# -- differences, reruns and verdicts --------------------------------------------------------


def test_a_difference_is_a_pass_plain_that_did_not_pass_with_celery_dlx() -> None:
    plain = {
        "a": Result(PASSED),
        "b": Result(PASSED),
        "c": Result(PASSED),
        "d": failed(),
        "e": Result(PASSED),
    }
    dlx = {"a": Result(PASSED), "b": failed(), "c": Result(SKIPPED), "d": failed()}
    assert gate.differing(plain, dlx) == ["b", "c", "e"]  # e: missing with celery_dlx on


def test_an_allowed_test_failing_as_written_down_needs_no_rerun() -> None:
    allowed = entry(exception="TimeoutError")
    verdict = gate.first_look("t::x", failed("celery.exceptions.TimeoutError"), allowed)
    assert verdict is not None and verdict.kind == gate.ALLOWED


@pytest.mark.parametrize(
    "dlx",
    [failed("AssertionError"), Result(SKIPPED), None],
    ids=["other-failure", "skipped", "missing"],
)
def test_any_other_difference_goes_to_the_reruns(dlx: Result | None) -> None:
    assert gate.first_look("t::x", dlx, entry(exception="TimeoutError")) is None
    assert gate.first_look("t::x", dlx, None) is None


def test_flaky_only_when_it_failed_plain_in_a_rerun_the_same_way() -> None:
    timeout = failed("celery.exceptions.TimeoutError", "The operation timed out.")
    reruns = Reruns(plain=[Result(PASSED), timeout, Result(PASSED)], dlx=[timeout] * 3)
    verdict = gate.judge("t::x", timeout, None, reruns)
    assert verdict.kind == gate.FLAKY
    assert "failed plain too, the same way, in 1 of 3 reruns" in verdict.why
    assert "(celery.exceptions.TimeoutError: The operation timed out.)" in verdict.why


def test_failing_plain_alone_for_another_reason_explains_nothing() -> None:
    """Celery's test_stats, seen by the gate: with celery_dlx on the worker could not encode
    its stats reply (TypeError); alone, plain, it fails on the worker's uptime of 0 s."""
    encode = Result(FAILED, reported("stats-dlx-alone-encode-error.xml", "test_stats"))
    uptime = Result(FAILED, reported("stats-plain-alone.xml", "test_stats"))
    reruns = Reruns(plain=[uptime] * 3, dlx=[encode] * 3)
    verdict = gate.judge("t::x", encode, None, reruns)
    assert verdict.kind == gate.REGRESSION
    assert "failed plain alone in 3 of 3 reruns, but otherwise (AssertionError" in verdict.why


@pytest.mark.parametrize(
    ("plain", "dlx", "same"),
    [
        (Failure("KeyError", "KeyError: 'a'"), Failure("KeyError", "KeyError: 'b'"), True),
        (Failure("TimeoutError", "x"), Failure("celery.exceptions.TimeoutError", "x"), True),
        (Failure("Error", "x"), Failure("celery.exceptions.TimeoutError", "x"), False),
        (Failure("AssertionError", "assert 0 > 0"), Failure("TypeError", "len(None)"), False),
        (Failure("", "contains 1 failed subtest"), Failure("", "contains 1 failed subtest"), False),
        (None, Failure("KeyError", "KeyError: 'a'"), False),
        (Failure("KeyError", "KeyError: 'a'"), None, False),
    ],
)
def test_the_same_way_is_the_same_exception_type(
    plain: Failure | None, dlx: Failure | None, same: bool
) -> None:
    assert gate.same_way(plain, dlx) is same


def test_failing_only_with_celery_dlx_in_the_reruns_is_a_regression() -> None:
    reruns = Reruns(plain=[Result(PASSED)] * 3, dlx=[Result(PASSED), failed(), failed()])
    verdict = gate.judge("t::x", failed(), None, reruns)
    assert verdict.kind == gate.REGRESSION
    assert "not on the allow-list" in verdict.why
    assert "failed again in 2 of 3 reruns" in verdict.why


def test_passing_every_rerun_does_not_excuse_a_failure_seen_only_with_celery_dlx() -> None:
    """The gate cannot be passed by luck: a flaky test is one that fails plain too."""
    reruns = Reruns(plain=[Result(PASSED)] * 3, dlx=[Result(PASSED)] * 3)
    verdict = gate.judge("t::x", failed(), None, reruns)
    assert verdict.kind == gate.REGRESSION
    assert "passed its 3 reruns with celery_dlx on and never failed plain" in verdict.why


def test_an_allowed_test_failing_otherwise_is_a_regression_naming_both_failures() -> None:
    allowed = entry(exception="TimeoutError", message="never incremented")
    reruns = Reruns(plain=[Result(PASSED)] * 3, dlx=[failed("KeyError", "'x'")] * 3)
    verdict = gate.judge("t::x", failed("KeyError", "'x'"), allowed, reruns)
    assert verdict.kind == gate.REGRESSION
    assert "allowed for TimeoutError matching 'never incremented'" in verdict.why
    assert "but failed with KeyError: 'x'" in verdict.why


def test_a_rerun_without_a_result_counts_against_celery_dlx_never_for_it() -> None:
    # A plain rerun that reported nothing is no evidence of a plain failure...
    reruns = Reruns(plain=[None, Result(PASSED), Result(SKIPPED)], dlx=[Result(PASSED)] * 3)
    assert gate.judge("t::x", failed(), None, reruns).kind == gate.REGRESSION
    # ...and a celery_dlx rerun that reported nothing is no pass.
    reruns = Reruns(plain=[Result(PASSED)], dlx=[None])
    assert (
        "failed again in 1 of 1 reruns (no result" in gate.judge("t::x", failed(), None, reruns).why
    )


def test_without_reruns_every_difference_not_allowed_is_a_regression() -> None:
    verdict = gate.judge("t::x", failed(), None, Reruns())
    assert verdict.kind == gate.REGRESSION and verdict.why.endswith("not rerun")


# -- the drain is the worker's own -----------------------------------------------------------


def test_the_plugins_drainer_lines_are_read_back() -> None:
    log = "\n".join(
        [
            "celery_dlx compat: celery_dlx on {'dlx_enabled': True}",
            "1 failed in 13.29s",
            gate.drainer_line("gen1@vm", True),
            gate.drainer_line("gen2@vm", False),
        ]
    )
    assert gate.drainer_states(log) == [True, False]
    assert gate.drainer_states("1 passed in 3s") == []


@pytest.mark.parametrize(
    ("fates", "drainers", "problem"),
    [
        ({"parked": 5, "drained": 5}, [True], None),
        ({"requeued": 2}, [], None),  # nothing parked: no worker needed, nothing to drain
        ({}, [True], None),
        ({"parked": 5}, [True], "5 retries were parked and none was drained"),
        ({"parked": 5, "drained": 5}, [False], "without celery_dlx's drainer bootstep"),
        ({"parked": 1, "drained": 1}, [], "no session worker reported its drainer bootstep"),
    ],
)
def test_parked_retries_must_be_drained_by_the_workers_drainer(
    fates: dict[str, int], drainers: list[bool], problem: str | None
) -> None:
    found = gate.drain_problem(fates, drainers)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found
