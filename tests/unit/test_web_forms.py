"""The console's pure request parsing and summaries: status choices (the CLI's and the API's),
parked-retry targets, the one-line summary of a parked action, per-cause parked counts."""

from __future__ import annotations

import pytest

from celery_dlx.message.parked import ParkedMessage
from celery_dlx_console import forms
from celery_dlx_console.actions import parked_summary
from celery_dlx_console.reads import CauseParked, GroupFilters, _tally_cause


def test_status_choices_are_the_cli_and_api_ones() -> None:
    assert forms.OBITUARY_STATUSES == ("unresolved", "replayed", "resolved", "failed-again", "all")
    assert forms.CAUSE_STATUSES == ("unresolved", "all")
    assert forms.choice({}, "status", forms.CAUSE_STATUSES, "unresolved") == "unresolved"
    assert forms.choice({"status": " "}, "status", forms.CAUSE_STATUSES, "unresolved") == (
        "unresolved"
    )
    assert forms.choice({"status": "all"}, "status", forms.CAUSE_STATUSES, "unresolved") == "all"
    with pytest.raises(forms.BadRequest, match=r"status must be one of unresolved, all, got 'x'"):
        forms.choice({"status": "x"}, "status", forms.CAUSE_STATUSES, "unresolved")


def test_group_filters_default_to_unresolved() -> None:
    assert forms.group_filters({}) == GroupFilters()
    assert GroupFilters().status == "unresolved"
    assert forms.group_filters({"status": "failed-again"}).status == "failed-again"
    with pytest.raises(forms.BadRequest):
        forms.group_filters({"status": "resolved-ish"})


def test_parked_targets_by_ids_or_cause() -> None:
    chosen = forms.parked_targets(["a:1", " a:1 ", "b:2", ""], None)
    assert (chosen.ids, chosen.cause, chosen.label) == (["a:1", "b:2"], None, "2 parked retries")
    assert forms.parked_targets(["a:1"], "").label == "a:1"
    by_cause = forms.parked_targets([], " c1 ")
    assert (by_cause.ids, by_cause.cause) == ([], "c1")
    assert by_cause.label == "parked retries of cause c1"
    for ids, cause in (([], None), (["a:1"], "c1")):
        with pytest.raises(forms.BadRequest, match="one of the two"):
            forms.parked_targets(ids, cause)
    with pytest.raises(forms.BadRequest, match="at most"):
        forms.parked_targets([f"m{i}:1" for i in range(forms.MAX_IDS + 1)], None)


def _report(action: str, done: int, claimed: int = 0, missing: int = 0) -> dict[str, object]:
    return {
        "action": action,
        "dry_run": False,
        "done": [f"d{i}:1" for i in range(done)],
        "claimed": [f"c{i}:1" for i in range(claimed)],
        "missing": [f"m{i}:1" for i in range(missing)],
        "obituaries": [],
    }


@pytest.mark.parametrize(
    ("report", "expected"),
    [
        (_report("retry-now", 2), ("done", "retried now 2 of 2")),
        (_report("bury-now", 1), ("done", "buried now 1 of 1")),
        (
            _report("bury-now", 1, claimed=1),
            ("incomplete", "buried now 1 of 2; 1 claimed by a drain, left to it"),
        ),
        (_report("retry-now", 0, missing=3), ("incomplete", "retried now 0 of 3; missing 3")),
    ],
)
def test_parked_action_summary(report: dict[str, object], expected: tuple[str, str]) -> None:
    assert parked_summary(report) == expected


def test_parked_retries_are_counted_per_cause() -> None:
    per: dict[str, CauseParked] = {}
    for i, due in enumerate((900, 1000, 1100)):
        _tally_cause(
            per, ParkedMessage(f"m{i}", 1, "q", b"", due_ms=due, cause="c", task="t"), 1000
        )
    _tally_cause(per, ParkedMessage("x", 1, "q2", b"", due_ms=5, cause="other"), 1000)
    assert per["c"] == {"cause": "c", "count": 3, "due_now": 2, "task": "t", "queue": "q"}
    assert per["other"]["count"] == 1 and per["other"]["due_now"] == 1
