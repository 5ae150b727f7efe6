"""Every exception celery_dlx raises in a pool child survives pickling to the main process.

The prefork pool pickles a run's exception to send it to the worker's main process; an exception
that cannot be rebuilt there stops the worker ("Unrecoverable error"). The result backend
rebuilds an exception from its type and message only. A real prefork round trip is in
tests/integration/test_celery_semantics.py::test_fate_exceptions_cross_a_prefork_pool_and_the_worker_survives.
"""

from __future__ import annotations

import pickle

import pytest

from celery_dlx.fates import Bury, Park, Requeue
from celery_dlx.worker.retrying import RetryPark
from celery_dlx.worker.task import Redelivered

CASES = [
    Park(),
    Park(countdown=1.5),
    Park(countdown=0, message="not yet"),
    Bury(),
    Bury("order is gone"),
    Requeue(),
    Requeue("busy"),
    RetryPark(countdown=2.0, message="ConnectionError()", call_args=[1], call_kwargs={"y": 2}),
    RetryPark(),
    Redelivered("redelivered by the broker"),
]


@pytest.mark.parametrize("exc", CASES, ids=lambda e: f"{type(e).__name__}:{e}")
def test_pickle_round_trip_keeps_type_message_and_fields(exc: BaseException) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    for attr in ("countdown", "reason", "call_args", "call_kwargs", "budgeted"):
        assert getattr(back, attr, None) == getattr(exc, attr, None)


@pytest.mark.parametrize("exc", [e for e in CASES if isinstance(e, Park)], ids=str)
def test_park_rebuilt_from_its_message_alone(exc: Park) -> None:
    """What a result backend does: ``cls(*exc.args)``."""
    back = type(exc)(*exc.args)
    assert str(back) == str(exc)


def test_park_still_refuses_a_negative_countdown() -> None:
    with pytest.raises(ValueError, match="must be >= 0"):
        Park(countdown=-1)


def test_the_worker_marks_buried_exceptions_as_the_sentry_integration_reads_them() -> None:
    from celery_dlx.integrations.sentry import HANDLED_ATTR, handled_fate
    from celery_dlx.worker.task import HANDLED_FATE_ATTR

    assert HANDLED_FATE_ATTR == HANDLED_ATTR
    exc = ValueError("x")
    setattr(exc, HANDLED_FATE_ATTR, "buried")
    assert handled_fate(exc) == "buried"
