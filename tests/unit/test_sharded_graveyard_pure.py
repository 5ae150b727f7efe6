"""How the sharded graveyard sums a cause's per-bucket groups, and picks an obituary's bucket."""

from __future__ import annotations

from celery_dlx.message.names import Keys
from celery_dlx.store.graveyard import BUCKETS, Group, _summed
from celery_dlx.store.shards import Layout

bucket_of = Layout(Keys("app"), per_queue=True, buckets=BUCKETS).bucket


def part(**fields: object) -> Group:
    base: dict[str, object] = {
        "cause": "c",
        "count": 1,
        "total": 1,
        "first_ms": 10,
        "last_ms": 10,
        "example_id": "x",
        "exc_type": "ValueError",
        "exc_message": "m",
        "task": "t",
        "queue": "q",
    }
    return Group(**{**base, **fields})  # type: ignore[arg-type]


def test_a_cause_group_is_the_sum_of_its_parts_latest_and_earliest_where_they_belong() -> None:
    older = part(
        count=2,
        total=5,
        first_ms=5,
        last_ms=20,
        example_id="a",
        queue="qa",
        first_seen_ms=3,
        first_version="v1",
        last_version="v1",
        versions={"v1": 2},
    )
    newer = part(
        count=3,
        total=3,
        first_ms=8,
        last_ms=30,
        example_id="b",
        queue="qb",
        exc_message="newest",
        first_seen_ms=8,
        first_version="v2",
        last_version="v3",
        versions={"v1": 1, "v3": 2},
    )
    legacy = part(count=1, total=1, first_ms=7, last_ms=9, example_id="c")  # no version stats
    group = _summed([newer, legacy, older])
    assert (group.count, group.total, group.first_ms, group.last_ms) == (6, 9, 5, 30)
    assert (group.example_id, group.queue, group.exc_message) == ("b", "qb", "newest")
    assert (group.first_seen_ms, group.first_version, group.last_version) == (3, "v1", "v3")
    assert group.versions == {"v1": 3, "v3": 2}


def test_a_group_without_version_stats_keeps_them_unknown() -> None:
    group = _summed([part(), part(last_ms=11, example_id="y")])
    assert group.first_seen_ms is None and group.first_version is None
    assert group.example_id == "y" and group.count == 2


def test_an_obituary_id_names_one_stable_bucket() -> None:
    ids = [f"celery-ob-{i}" for i in range(400)]
    buckets = [bucket_of(i) for i in ids]
    assert buckets == [bucket_of(i) for i in ids]
    assert set(buckets) == set(range(BUCKETS))
