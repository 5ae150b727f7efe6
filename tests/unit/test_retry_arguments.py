"""``retry_arguments``: the arguments of a run retried by ``self.retry(args=..., kwargs=...)``,
as Celery's ``Task.retry`` computes them (the cases of Celery's ``test_retry_switches_*``)."""

from __future__ import annotations

from typing import Any

import pytest

from celery_dlx.worker.retrying import retry_arguments


def with_label(foo: int, bar: int, label: Any = None) -> None: ...


def two(foo: int, bar: int) -> None: ...


def star(*args: Any, **kwargs: Any) -> None: ...


@pytest.mark.parametrize(
    ("run", "request_args", "request_kwargs", "args", "kwargs", "expected"),
    [
        (two, [1, 2], {}, None, None, (None, None)),  # None: the copy keeps the message's
        (
            with_label,
            [],
            {"foo": 1, "bar": 2, "label": "x"},
            (2, 3),
            None,
            ((2, 3), {"label": "x"}),
        ),
        (two, [1, 2], {}, None, {"foo": 2}, ((2, 2), {})),
        (two, [1, 2], {}, (5, 6), {"x": 1}, ((5, 6), {"x": 1})),  # both given: as given
        (star, [1], {"a": 1}, (2,), None, ((2,), {"a": 1})),
    ],
)
def test_retry_arguments_follow_celery(
    run: Any, request_args: Any, request_kwargs: Any, args: Any, kwargs: Any, expected: Any
) -> None:
    got_args, got_kwargs = retry_arguments(run, request_args, request_kwargs, args, kwargs)
    assert (tuple(got_args) if got_args is not None else None, got_kwargs) == expected
