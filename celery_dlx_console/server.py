"""Running the console with uvicorn: in the foreground (the command) or in a thread (tests,
the demo)."""

from __future__ import annotations

import threading
import time
from typing import Any

from celery_dlx import ConfigurationError, Runtime
from celery_dlx_console.console import WebSettings


def _server(runtime: Runtime, settings: WebSettings, log_level: str) -> Any:
    import uvicorn

    from celery_dlx_console.app import create_app

    config = uvicorn.Config(
        create_app(runtime, settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level.lower(),
        access_log=log_level.upper() == "DEBUG",
        server_header=False,
        h11_max_incomplete_event_size=64 * 1024,
        limit_concurrency=64,
    )
    return uvicorn.Server(config)


def serve(runtime: Runtime, settings: WebSettings, *, log_level: str = "info") -> None:
    """Serve the console until SIGINT/SIGTERM.

    Raises:
        ConfigurationError: a non-loopback address without credentials, or bad accounts.
    """
    _server(runtime, settings, log_level).run()


class Background:
    """The console served by a uvicorn server in a daemon thread (tests, the demo)."""

    def __init__(self, runtime: Runtime, settings: WebSettings, log_level: str = "warning") -> None:
        self.server = _server(runtime, settings, log_level)
        self.settings = settings
        self.thread = threading.Thread(target=self.server.run, name="dlx-web", daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}"

    def start(self, timeout: float = 30.0) -> Background:
        """Start serving; returns once the server listens.

        Raises:
            ConfigurationError: it did not start within ``timeout`` (port taken?).
        """
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise ConfigurationError(f"the console did not start on {self.url} (port in use?)")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
