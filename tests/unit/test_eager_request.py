"""An eagerly run task's body sees its own request once celery_dlx is installed, on every Celery
the package allows (before Celery 5.5, ``Task.__call__`` pushed an empty one over it)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

import celery_dlx

NO_BROKER = "amqp://nobody:nothing@127.0.0.1:1//"


def _app(enabled: bool) -> Celery:
    app = Celery("eagertest", broker=NO_BROKER, set_as_current=False)
    celery_dlx.install(app)
    app.conf.update(dlx_enabled=enabled, dlx_key_prefix="unit")
    return app


@pytest.mark.parametrize("enabled", [True, False])
def test_the_body_sees_the_run_s_id_retries_and_headers(enabled: bool) -> None:
    app = _app(enabled)
    seen: list[dict[str, Any]] = []

    @app.task(name="proj.look", bind=True, shared=False)
    def look(self: Any, x: int) -> int:
        seen.append(
            {
                "id": self.request.id,
                "retries": self.request.retries,
                "args": list(self.request.args),
            }
        )
        return x

    result = look.apply(args=(7,), task_id="the-id", retries=2)
    assert result.get() == 7
    assert seen == [{"id": "the-id", "retries": 2, "args": [7]}]
    assert look.request.id is None  # nothing left on the stack


def test_an_eager_retry_runs_again_with_the_next_retry_count() -> None:
    app = _app(enabled=False)
    runs: list[int] = []

    @app.task(name="proj.flaky", bind=True, shared=False, max_retries=3)
    def flaky(self: Any) -> str:
        runs.append(self.request.retries)
        if len(runs) < 3:
            raise self.retry(countdown=0)
        return "ok"

    assert flaky.apply(task_id="flaky-1").get() == "ok"
    assert runs == [0, 1, 2]
