"""The Sentry event, breadcrumbs and payload view built for fate changes (pure functions)."""

from __future__ import annotations

import json

import pytest

from celery_dlx.fates import BURIED, PARKED, REQUEUED, FateEvent
from celery_dlx.integrations.sentry import (
    burial_event,
    drop_handled,
    fate_breadcrumb,
    handled_fate,
    history_breadcrumbs,
    mark_handled,
    payload_view,
)

TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/srv/app/tasks.py", line 12, in charge\n'
    "    raise ValueError(f'order {order_id} is bad')\n"
    "ValueError: order 42 is bad\n"
)


def _buried(**kw: object) -> FateEvent:
    base: dict[str, object] = {
        "fate": BURIED,
        "queue": "orders",
        "message_id": "m-1",
        "attempt": 8,
        "task": "shop.charge",
        "cause": "abc123def4567890",
        "exc_type": "ValueError",
        "exc_message": "order 42 is bad",
        "reason": "park budget spent",
        "importance": "page",
        "traceback": TRACEBACK,
        "first_failure_ms": 1_700_000_000_000,
        "at_ms": 1_700_000_060_000,
    }
    base.update(kw)
    return FateEvent.from_fields(**base)  # type: ignore[arg-type]


def test_burial_event_groups_by_cause_and_tags_the_fate() -> None:
    event = burial_event(_buried(), "fatal")
    assert event["fingerprint"] == ["abc123def4567890"]
    assert event["level"] == "fatal"
    assert event["tags"] == {
        "queue": "orders",
        "task": "shop.charge",
        "attempts": "8",
        "importance": "page",
        "fate": "buried",
    }
    (value,) = event["exception"]["values"]
    assert (value["type"], value["value"]) == ("ValueError", "order 42 is bad")
    assert value["mechanism"] == {"type": "celery_dlx", "handled": True}
    assert value["stacktrace"]["frames"][0]["function"] == "charge"
    context = event["contexts"]["celery_dlx"]
    assert context["message_id"] == "m-1"
    assert context["reason"] == "park budget spent"
    assert context["first_failure"].startswith("2023-11-14T22:13:20")
    assert "extra" not in event  # no payload unless asked


def test_burial_without_cause_or_exception_still_groups_and_titles() -> None:
    event = burial_event(
        _buried(cause="", exc_type="", exc_message="", traceback="", reason="x-death: expired"),
        "warning",
    )
    assert event["fingerprint"] == ["shop.charge:x-death: expired"]
    (value,) = event["exception"]["values"]
    assert value["type"] == "Buried"
    assert value["value"] == "x-death: expired"


def test_foreign_message_is_named_by_queue() -> None:
    event = burial_event(_buried(task=None), "warning")
    assert event["tags"]["task"] == ""
    assert event["transaction"] == "queue:orders"


def test_obituary_id_from_extra() -> None:
    event = burial_event(_buried(extra={"obituary": {"id": "ob-7"}}), "fatal")
    assert event["contexts"]["celery_dlx"]["obituary_id"] == "ob-7"


def test_fate_breadcrumb_carries_queue_attempt_cause_and_delay() -> None:
    crumb = fate_breadcrumb(
        FateEvent.from_fields(
            fate=PARKED, queue="q", message_id="m", attempt=3, task="t", cause="c", delay=12.5
        )
    )
    assert crumb["category"] == "celery_dlx"
    assert crumb["level"] == "warning"
    assert crumb["data"] == {
        "fate": "parked",
        "queue": "q",
        "message_id": "m",
        "attempt": 3,
        "cause": "c",
        "delay": 12.5,
    }
    assert crumb["message"] == "parked t[m] attempt=3"


def test_history_breadcrumbs_skip_malformed_entries() -> None:
    history = [[1000, REQUEUED, "c1"], "junk", [2000], [3000, PARKED, None], [4000, BURIED, "c1"]]
    crumbs = history_breadcrumbs(_buried(extra={"history": history}))
    assert [c["data"]["fate"] for c in crumbs] == ["requeued", "parked", "buried"]
    assert crumbs[0]["timestamp"] == 1.0
    assert crumbs[1]["data"]["cause"] == ""


def test_history_breadcrumbs_from_obituary_attempts() -> None:
    attempts = [{"at_ms": 1000, "fate": REQUEUED, "cause": "c"}, {"fate": ""}]
    event = _buried(extra={"obituary": {"attempts": attempts}})
    (crumb,) = history_breadcrumbs(event)
    assert crumb["data"] == {"fate": "requeued", "cause": "c", "queue": "orders"}


def test_payload_is_decoded_and_capped_in_bytes() -> None:
    body = json.dumps({"order": "é" * 5000}).encode()
    view = payload_view(body, "application/json", "utf-8", 100)
    assert view["payload_kind"] == "json"
    assert view["payload"].startswith('{\n "order": "éé')
    assert len(view["payload"].encode("utf-8")) <= 100
    assert view["payload_truncated"] is True
    assert view["payload_bytes"] == len(body)


def test_small_payload_is_whole() -> None:
    view = payload_view(b'{"a": 1}', "application/json", "utf-8", 4096)
    assert view["payload_truncated"] is False
    assert json.loads(view["payload"]) == {"a": 1}


def test_pickle_is_never_loaded() -> None:
    import pickle

    body = pickle.dumps({"secret": 1})
    view = payload_view(body, "application/x-python-serialize", "binary", 4096)
    assert view["payload_kind"] == "opaque-unsafe"
    assert json.loads(view["payload"])["length"] == len(body)
    assert "never loaded" in view["payload_notes"][0]


def test_payload_falls_back_to_repr_when_a_codec_breaks(monkeypatch: pytest.MonkeyPatch) -> None:
    import celery_dlx.codecs

    def broken(*_: object, **__: object) -> object:
        raise RuntimeError("codec bug")

    monkeypatch.setattr(celery_dlx.codecs, "decode_payload", broken)
    view = payload_view(b"\x80\x04pickle", "application/x-python-serialize", None, 50)
    assert view["payload"] == repr(b"\x80\x04pickle")
    assert view["payload_kind"] == "repr"
    assert view["payload_notes"] == ["not decoded: RuntimeError('codec bug')"]


def test_mark_handled_drops_events_of_that_exception_and_its_wrappers() -> None:
    exc = ValueError("handled")
    mark_handled(exc, REQUEUED)
    assert handled_fate(exc) == REQUEUED
    wrapper = RuntimeError("wrapper")
    wrapper.__cause__ = exc
    event = {"message": "x"}
    assert drop_handled(event, {"exc_info": (ValueError, exc, None)}) is None
    assert drop_handled(event, {"exc_info": (RuntimeError, wrapper, None)}) is None
    other = ValueError("not handled")
    assert drop_handled(event, {"exc_info": (ValueError, other, None)}) is event
    assert drop_handled(event, {}) is event
