"""One real run through the gate's own plumbing: Celery's test_fail, alone, plain and with
celery_dlx on (about 30 seconds).

It checks on real output what the fake runs of test_compare.py assume: pytest's report of the
failure matches its allow-list entry, and the retries parked on the way are drained by the
drainer bootstep of Celery's session worker (the gate runs no drain of its own).
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest

from tests.compat import gate

TEST = "t/integration/test_tasks.py::test_tasks::test_fail"


@pytest.fixture(scope="module")
def suite(compat: ModuleType) -> object:
    version = compat.celery_version()
    if os.environ.get("DLX_COMPAT") != "1" and not (compat.CACHE / f"celery-{version}").exists():
        pytest.skip("needs Celery's t/integration: set DLX_COMPAT=1 to fetch its sdist")
    return compat.fetch_suite(version)


@pytest.mark.integration
def test_test_fail_fails_as_allowed_and_its_parked_retries_are_drained_by_the_worker(
    compat: ModuleType, suite: object
) -> None:
    def run(mode: str) -> object:
        return compat.run_suite(
            suite, [TEST], mode, budgets=None, timeout=120, tag="gate-test", limit=300, rerun=True
        )

    plain, dlx = run("plain"), run("dlx")
    assert plain.results[TEST].outcome == gate.PASSED
    failure = dlx.results[TEST].failure
    assert failure is not None and compat.load_allowed()[TEST].matches(failure), failure
    assert dlx.drainers == [True]  # the session worker ran celery_dlx's drainer bootstep...
    parked, drained = dlx.fates.get("parked", 0), dlx.fates.get("drained", 0)
    assert parked > 0 and drained > 0, dlx.fates  # ...and it drained the parked retries
    assert drained + dlx.left_parked >= parked, (dlx.fates, dlx.left_parked)
    assert gate.drain_problem(dlx.fates, dlx.drainers) is None
