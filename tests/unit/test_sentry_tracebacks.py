"""Tracebacks kept as text in obituaries become Sentry exception values with real frames."""

from __future__ import annotations

import traceback

from celery_dlx.integrations.tracebacks import exception_values, parse_traceback, split_type


def _inner(value: str) -> None:
    raise ValueError(value)


def _outer(value: str) -> None:
    _inner(value)


def _format(fn: object, *args: object) -> str:
    try:
        fn(*args)  # type: ignore[operator]
    except Exception:
        return traceback.format_exc()
    raise AssertionError("expected an exception")


def _chained_cause() -> None:
    try:
        _outer("first: with colon")
    except ValueError as exc:
        raise KeyError("second") from exc


def _chained_context() -> None:
    try:
        _outer("first")
    except ValueError:
        {}["missing"]  # the KeyError is the point


def test_frames_in_order_with_code_and_location() -> None:
    text = _format(_outer, "bad order 42")
    (value,) = parse_traceback(text)
    assert value["type"] == "ValueError"
    assert value["value"] == "bad order 42"
    frames = value["stacktrace"]["frames"]
    names = [f["function"] for f in frames]
    assert names[-2:] == ["_outer", "_inner"]
    last = frames[-1]
    assert last["filename"] == __file__
    assert last["context_line"] == "raise ValueError(value)"
    assert last["lineno"] == _inner.__code__.co_firstlineno + 1
    assert last["in_app"] is True


def test_direct_cause_chain_gives_two_values_root_first() -> None:
    values = parse_traceback(_format(_chained_cause))
    assert [v["type"] for v in values] == ["ValueError", "KeyError"]
    assert values[0]["value"] == "first: with colon"
    assert values[1]["value"] == "'second'"
    assert values[1]["stacktrace"]["frames"][-1]["function"] == "_chained_cause"


def test_context_chain_is_parsed_too() -> None:
    values = parse_traceback(_format(_chained_context))
    assert [v["type"] for v in values] == ["ValueError", "KeyError"]


def test_carets_and_library_frames() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/srv/venv/lib/python3.11/site-packages/celery/app/trace.py", line 453, in trace\n'
        "    R = retval = fun(*args, **kwargs)\n"
        "                 ^^^^^^^^^^^^^^^^^^^^\n"
        '  File "/srv/app/tasks.py", line 12, in charge\n'
        "    total = order['amount'] / 0\n"
        "            ~~~~~~~~~~~~~~~~^~~\n"
        "ZeroDivisionError: division by zero\n"
    )
    (value,) = parse_traceback(text)
    lib, app = value["stacktrace"]["frames"]
    assert lib["in_app"] is False and app["in_app"] is True
    assert app["context_line"] == "total = order['amount'] / 0"
    assert value["type"] == "ZeroDivisionError" and value["value"] == "division by zero"


def test_module_qualified_type_and_multiline_message() -> None:
    text = (
        "Traceback (most recent call last):\n"
        '  File "/srv/app/tasks.py", line 3, in run\n'
        "    raise PaymentError(msg)\n"
        "billing.errors.PaymentError: card declined\nsecond line\n"
    )
    (value,) = parse_traceback(text)
    assert value["module"] == "billing.errors"
    assert value["type"] == "PaymentError"
    assert value["value"] == "card declined\nsecond line"


def test_text_that_is_not_a_traceback_gives_nothing() -> None:
    assert parse_traceback("") == []
    assert parse_traceback("ValueError: bad\n") == []
    assert parse_traceback("just some words") == []


def test_exception_values_use_the_recorded_type_and_message() -> None:
    text = _format(_outer, "raw message 17")
    values = exception_values("orders.errors.Bad", "recorded message", text)
    assert values[-1]["type"] == "Bad"
    assert values[-1]["module"] == "orders.errors"
    assert values[-1]["value"] == "recorded message"
    assert values[-1]["stacktrace"]["frames"][-1]["function"] == "_inner"


def test_exception_values_without_traceback() -> None:
    (value,) = exception_values("ValueError", "bad", "")
    assert value == {"type": "ValueError", "value": "bad"}


def test_split_type() -> None:
    assert split_type("ValueError") == (None, "ValueError")
    assert split_type("a.b.C") == ("a.b", "C")
