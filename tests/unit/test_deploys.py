"""Ordering code versions by when each was first seen, and ``--new-since`` (pure)."""

from __future__ import annotations

import pytest

from celery_dlx.errors import DLXError
from celery_dlx.fates import FateEvent
from celery_dlx.integrations.sentry import burial_release
from celery_dlx.ops.deploys import (
    UnknownVersion,
    new_in,
    new_since,
    newest_version,
    version_order,
)
from celery_dlx.store.graveyard import Group


def group(cause: str, first_ms: int | None, first_version: str | None) -> Group:
    return Group(
        cause=cause,
        count=1,
        total=1,
        first_ms=first_ms or 0,
        last_ms=first_ms or 0,
        example_id=f"ob-{cause}",
        exc_type="E",
        exc_message="",
        task=None,
        queue="q",
        first_seen_ms=first_ms,
        first_version=first_version,
    )


# SHA-like names on purpose: "f00" sorts after "a11" as a string but was deployed first.
SEEN = {"f00": 1_000, "": 500, "a11": 2_000, "c22": 3_000}


def test_versions_are_ordered_by_first_seen_time_never_by_name() -> None:
    assert version_order(SEEN) == ["", "f00", "a11", "c22"]
    assert version_order({"b": 5, "a": 5}) == ["a", "b"]  # a tie: by name, stable
    assert newest_version(SEEN) == "c22"
    assert newest_version({"": 1}) is None and newest_version({}) is None


@pytest.mark.parametrize(
    ("since", "expected"),
    [
        ("f00", ["old", "mid", "new", "late-unknown"]),
        ("a11", ["mid", "new", "late-unknown"]),
        ("c22", ["new", "late-unknown"]),
        ("", ["old", "mid", "new", "late-unknown"]),  # "pre" predates every sighting
    ],
)
def test_new_since_takes_first_seen_version_or_time(since: str, expected: list[str]) -> None:
    groups = [
        group("pre", 400, None),  # started before version stats were kept
        group("old", 1_000, "f00"),
        group("mid", 2_500, "a11"),
        group("new", 3_000, "c22"),
        # first seen after c22 appeared, by a process still without a version
        group("late-unknown", 3_500, ""),
    ]
    assert [g.cause for g in new_since(groups, SEEN, since)] == expected


def test_new_since_counts_a_cause_first_seen_with_the_version_even_if_earlier() -> None:
    # A clock skew between service hosts: the group's first burial is stamped before the
    # version's first sighting elsewhere; its first version still says it is new.
    skewed = group("skewed", 2_900, "c22")
    assert new_since([skewed], SEEN, "c22") == [skewed]


def test_unknown_version_is_an_error_naming_the_known_ones() -> None:
    with pytest.raises(UnknownVersion) as info:
        new_since([], SEEN, "zzz")
    assert isinstance(info.value, DLXError)
    assert "'zzz'" in str(info.value) and "'f00', 'a11', 'c22'" in str(info.value)
    with pytest.raises(UnknownVersion, match="none"):
        new_since([], {}, "v1")


def test_new_in_marks_only_causes_first_seen_with_the_newest_version() -> None:
    assert new_in(group("x", 3_000, "c22"), "c22") == "c22"
    assert new_in(group("x", 1_000, "f00"), "c22") is None
    assert new_in(group("x", 1_000, None), None) is None


def test_sentry_release_keeps_the_clients_own_else_the_code_version() -> None:
    event = FateEvent.from_fields("buried", queue="q", message_id="m", code_version="abc123")
    assert burial_release(event, None) == "abc123"
    assert burial_release(event, "shop@2.1") == "shop@2.1"
    bare = FateEvent.from_fields("buried", queue="q", message_id="m")
    assert burial_release(bare, None) is None
