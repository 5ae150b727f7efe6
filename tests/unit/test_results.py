"""celery_dlx's details of a run, stored beside its result with the backend's public key-value API."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery
from celery.result import AsyncResult

from celery_dlx.results import dlx_details, store_details

NO_BROKER = "amqp://nobody:nothing@127.0.0.1:1//"


def _app(backend: str, **conf: Any) -> Celery:
    return Celery("results", broker=NO_BROKER, backend=backend, set_as_current=False, **conf)


@pytest.mark.parametrize("extended", [False, True])
def test_details_are_read_back_and_the_result_meta_is_celerys(extended: bool) -> None:
    from celery.app.task import Context

    app = _app("cache+memory://", result_extended=extended)
    backend = app.backend
    details = {"fate": "parked", "attempt": 2, "due_ms": 1_700_000_000_000, "delay": 1.5}
    assert store_details(backend, "results-1", details) is True
    request = Context(id="results-1", task="proj.t", retries=2, delivery_info={})
    backend.mark_as_retry("results-1", ValueError("x"), None, request=request)
    result = AsyncResult("results-1", app=app)
    assert dlx_details(result) == details
    assert result.state == "RETRY"
    meta = backend.get_task_meta("results-1")
    assert "dlx" not in meta  # Celery's meta, exactly as Celery stores it
    # A later run's details replace the earlier ones.
    store_details(backend, "results-1", {"fate": "recovered", "attempt": 2, "replayed": False})
    assert dlx_details(result) == {"fate": "recovered", "attempt": 2, "replayed": False}


def test_a_result_without_details_has_none() -> None:
    app = _app("cache+memory://")
    app.backend.mark_as_done("results-plain", 1)
    assert dlx_details(AsyncResult("results-plain", app=app)) is None


def test_details_beside_the_result_key_under_a_global_prefix() -> None:
    app = _app("cache+memory://", result_backend_transport_options={"global_keyprefix": "p:"})
    backend = app.backend
    store_details(backend, "results-2", {"fate": "buried"})
    key = backend.get_key_for_task("results-2")
    assert backend.get(key + b":dlx") is not None
    assert dlx_details(AsyncResult("results-2", app=app)) == {"fate": "buried"}


@pytest.mark.parametrize("backend", ["disabled", "rpc://"])
def test_backends_without_a_key_value_store_keep_no_details(backend: str) -> None:
    app = _app("disabled://" if backend == "disabled" else backend)
    assert store_details(app.backend, "results-3", {"fate": "parked"}) is False
    assert dlx_details(AsyncResult("results-3", app=app)) is None


def test_the_key_value_backends_keep_details() -> None:
    from celery.backends.base import BaseKeyValueStoreBackend
    from celery.backends.cache import CacheBackend
    from celery.backends.filesystem import FilesystemBackend
    from celery.backends.redis import RedisBackend

    for backend in (RedisBackend, CacheBackend, FilesystemBackend):
        assert issubclass(backend, BaseKeyValueStoreBackend), backend
