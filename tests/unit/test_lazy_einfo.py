"""``LazyExceptionInfo``: billiard's ExceptionInfo of a handled failure, built only when read."""

from __future__ import annotations

import pickle

from billiard.einfo import ExceptionInfo

from celery_dlx.worker.einfo import LazyExceptionInfo


def _caught() -> tuple[LazyExceptionInfo, ExceptionInfo]:
    try:
        raise ValueError("order 7 is bad")
    except ValueError:
        return LazyExceptionInfo(), ExceptionInfo()


def test_nothing_is_built_until_read() -> None:
    lazy, _ = _caught()
    assert set(vars(lazy)) == {"_exc_info"}


def test_reads_give_billiards_exception_info() -> None:
    lazy, eager = _caught()
    assert isinstance(lazy, ExceptionInfo)
    assert lazy.traceback == eager.traceback
    assert lazy.type is ValueError
    assert str(lazy.exception) == str(eager.exception)
    assert str(lazy) == eager.traceback
    assert "_exc_info" not in vars(lazy)  # the live traceback is not kept once built


def test_unread_pickles_as_built() -> None:
    lazy, eager = _caught()
    copy = pickle.loads(pickle.dumps(lazy))
    assert copy.traceback == eager.traceback
    assert copy.type is ValueError


def test_unknown_attribute_is_an_attribute_error() -> None:
    lazy, _ = _caught()
    _ = lazy.traceback
    try:
        _ = lazy.no_such_thing
    except AttributeError:
        pass
    else:
        raise AssertionError("expected AttributeError")
