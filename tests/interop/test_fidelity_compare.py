"""The header comparison of test_header_fidelity.py can fail: each kind of change is caught."""

from __future__ import annotations

from typing import Any

from tests.interop.fidelity import EXPECTED, MessageReport, compare, flatten, label


def cell(typ: str, value: Any, **extra: Any) -> dict[str, Any]:
    return {"type": typ, "value": value, **extra}


ORIGINAL = {
    "n": cell("b/int8", "-1"),
    "bytes": cell("x/[]uint8", "hex:ff00"),
    "nested": cell("F/amqp091.Table", {"list": cell("A/[]interface {}", [cell("l/int64", "7")])}),
    "f": cell("f/long", "1", wire="3fc00000"),
}


def delivery(headers: dict[str, Any], queue: str = "q") -> dict[str, Any]:
    return {"queue": queue, "message_id": "m", "headers": headers}


def own(attempt: int, **more: Any) -> dict[str, Any]:
    return {"x-dlx-attempt": cell("I/int32", str(attempt)), **more}


def test_each_kind_of_change_is_caught() -> None:
    copy = {
        "n": cell("I/int32", "-1"),  # type
        "bytes": cell("x/[]uint8", "hex:ff"),  # value
        "nested": cell("F/amqp091.Table", {"list": cell("A/[]interface {}", [])}),  # missing
        "f": cell("f/long", "1", wire="3fc00001"),  # value, seen only in pika's wire bytes
        "new": cell("S/string", "x"),  # added
    }
    kinds = {c.path: c.kind for c in compare(flatten(ORIGINAL), flatten(copy))}
    assert kinds == {
        "n": "type",
        "bytes": "value",
        'nested["list"][0]': "missing",
        "f": "value",
        "new": "added",
    }


def test_own_headers_are_left_out_and_label_the_copy() -> None:
    copy = {**ORIGINAL, **own(1), "x-dlx-queue": cell("S/string", "q")}
    assert compare(flatten(ORIGINAL), flatten(copy)) == []
    assert label(ORIGINAL) == "first delivery"
    assert label(copy) == "requeue copy"
    assert label({**own(0), "x-dlx-replayed": cell("S/string", "1")}) == "replay: first delivery"


def _death(queue: str, reason: str) -> dict[str, Any]:
    fields = {"queue": cell("S/string", queue), "reason": cell("S/string", reason)}
    return cell("A/[]interface {}", [cell("F/amqp091.Table", fields)])


def test_broker_headers_fail_unless_the_ladder_returned_the_copy() -> None:
    cycle = [ORIGINAL, {**ORIGINAL, **own(1)}, {**ORIGINAL, **own(2), "x-death": None}]
    for death, ladder, allowed in (
        (_death("q_dlq_200", "expired"), True, True),
        (_death("q_dlq_200", "expired"), False, False),  # Redis parks: no x-death at all
        (_death("q", "rejected"), True, False),  # the consumer's reject, carried over
    ):
        cycle[2]["x-death"] = death
        replays = [{**h, "x-dlx-replayed": cell("S/string", "1")} for h in cycle]
        report = MessageReport.of("m", [delivery(h) for h in cycle + replays], ladder=ladder)
        assert sorted(report.labels) == sorted(EXPECTED)
        assert report.changes == []
        assert (report.problems() == []) is allowed, report.problems()
