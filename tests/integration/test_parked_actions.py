"""Parked retries one by one (``dlx parked --retry-now / --bury-now``), on the real Redis: by
entry id and by cause, dry runs that change nothing, a retry a drain holds left to it, and an
audit entry for each action."""

from __future__ import annotations

import json
from typing import Any

import pytest

from celery_dlx.fates import AUDIT, BURIED, now_ms
from celery_dlx.message.parked import ParkedMessage
from celery_dlx.ops import obituaries
from celery_dlx.wiring.runtime import Runtime, get_runtime
from tests.integration.cli_helpers import run, run_json
from tests.integration.dlx_apps import make_app


def retry(i: int, due_ms: int, cause: str = "c-declined") -> ParkedMessage:
    return ParkedMessage(
        message_id=f"p-{i}",
        attempt=2,
        queue="orders",
        body=json.dumps({"order": i}).encode(),
        headers={"x-dlx-attempt": 2, "x-dlx-cause": cause, "task": "shop.charge"},
        properties={"content_type": "application/json", "message_id": f"p-{i}"},
        due_ms=due_ms,
        parked_ms=due_ms - 60_000,
        task="shop.charge",
        cause=cause,
    )


@pytest.fixture
def parked(uid: str) -> tuple[Any, Runtime, int]:
    app = make_app(uid)
    runtime = get_runtime(app)
    later = now_ms() + 3_600_000
    for i in range(4):
        runtime.park(retry(i, later + i, cause="c-declined" if i < 3 else "c-other"))
    return app, runtime, later


def due(runtime: Runtime, now: int) -> list[str]:
    return sorted(m.entry_id for m in runtime.parking.peek(100) if m.due_ms <= now)


def audits(runtime: Runtime) -> list[dict[str, str]]:
    return [f for _, f in runtime.history.read() if f["fate"] == AUDIT]


def test_retry_now_makes_a_retry_due_and_leaves_a_claimed_one_to_its_drain(
    parked: tuple[Any, Runtime, int],
) -> None:
    app, runtime, _ = parked
    dry = run_json(app, "parked", "--retry-now", "--id", "p-0:2", "--dry-run")
    assert dry["done"] == ["p-0:2"] and dry["dry_run"] and due(runtime, now_ms()) == []
    assert audits(runtime) == []  # a dry run is not an action

    done = run_json(
        app, "parked", "--retry-now", "--id", "p-0:2", "--id", "gone:1", "--yes", code=3
    )
    assert (done["done"], done["missing"]) == (["p-0:2"], ["gone:1"])
    assert due(runtime, now_ms()) == ["p-0:2"]
    # Now a drain claims it: a second retry-now leaves it alone (it is being published).
    (claimed,) = runtime.parking.claim(10, lease_ms=60_000)
    assert claimed.entry_id == "p-0:2"
    again = run_json(app, "parked", "--retry-now", "--id", "p-0:2", "--yes")
    assert (again["done"], again["claimed"]) == ([], ["p-0:2"])
    assert runtime.parking.ack([claimed]) == 1  # the drain's ack still finds it as it left it

    (entry,) = [a for a in audits(runtime) if "retry-now" in a["reason"]][:1]
    assert entry["reason"].startswith("cli:") and "p-0:2" in entry["reason"]


def test_bury_now_by_cause_writes_an_obituary_each_and_removes_the_retries(
    parked: tuple[Any, Runtime, int],
) -> None:
    app, runtime, _ = parked
    dry = run_json(app, "parked", "--bury-now", "--cause", "c-declined", "--dry-run")
    assert sorted(dry["done"]) == ["p-0:2", "p-1:2", "p-2:2"]
    assert runtime.parking.count() == 4 and obituaries.count(runtime) == 0

    result = run(app, "parked", "--bury-now", "--cause", "c-declined", input="y\n")
    assert result.exit_code == 0, result.output
    assert "bury-now: 3 done, 0 claimed by a drain, 0 not found" in result.stdout
    assert [m.entry_id for m in runtime.parking.peek(10)] == ["p-3:2"]
    obits = obituaries.list_obituaries(runtime)
    assert sorted(ob.message_id for ob in obits) == ["p-0", "p-1", "p-2"]
    for ob in obits:
        assert ob.reason.startswith("buried by cli:") and ob.queue == "orders"
        whole = obituaries.get_obituary(runtime, ob.id)
        assert whole is not None and json.loads(whole.payload or b"") == {
            "order": int(ob.message_id[2:])
        }
        assert ob.task == "shop.charge"
    buried = [f for _, f in runtime.history.read() if f["fate"] == BURIED]
    assert sorted(f["message_id"] for f in buried) == ["p-0", "p-1", "p-2"]
    assert [a for a in audits(runtime) if "bury-now" in a["reason"]]


def test_a_retry_a_drain_claims_is_not_buried(parked: tuple[Any, Runtime, int]) -> None:
    from celery_dlx.ops import parked_actions

    app, runtime, _ = parked
    assert run_json(app, "parked", "--retry-now", "--id", "p-1:2", "--yes")["done"] == ["p-1:2"]
    (claimed,) = runtime.parking.claim(10, lease_ms=60_000)
    # The entry as the operator read it (due now), then the drain holds it: no second fate.
    report = parked_actions.bury_now(runtime, ["p-1:2"], by="test")
    assert (report.done, report.claimed) == ([], ["p-1:2"])
    assert obituaries.count(runtime) == 0
    assert runtime.parking.ack([claimed]) == 1


def test_the_targets_are_ids_or_a_cause(parked: tuple[Any, Runtime, int]) -> None:
    app, _, _ = parked
    for args in (["--retry-now"], ["--bury-now", "--id", "p-0:2", "--cause", "c"]):
        result = run(app, "parked", *args, "--yes")
        assert result.exit_code == 2, result.output
    assert run(app, "parked", "--id", "p-0:2").exit_code == 2
