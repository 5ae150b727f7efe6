"""The console's state and settings: runtime, accounts, CSRF, actions, templates, metrics."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

import jinja2
from prometheus_client import CollectorRegistry

from celery_dlx import Runtime
from celery_dlx.codecs import ProtobufRegistry
from celery_dlx.ops import SETTINGS, DLXConfig, now_ms
from celery_dlx.ops.inspection import registry_for
from celery_dlx.ops.render import ago
from celery_dlx_console.actions import Actions
from celery_dlx_console.auth import Accounts, Csrf
from celery_dlx_console.metrics import BreakerCollector, DLXCollector

#: Largest request body accepted (forms and JSON), in bytes.
MAX_BODY = 64 * 1024
#: Seconds a ``dlx check`` result is reused by the overview.
CHECK_TTL = 30.0


@dataclass(frozen=True)
class WebSettings:
    """Where the console listens, the names it answers, who may use it, and its limits.

    Raises:
        ConfigurationError: a malformed host name or pattern in ``allowed_hosts``.
    """

    host: str = "127.0.0.1"
    port: int = 5566
    allowed_hosts: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    viewers: tuple[str, ...] = ()
    editors: tuple[str, ...] = ()
    max_replay_rate: float = 50.0
    max_body: int = MAX_BODY
    protos: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        check = SETTINGS["dlx_web_allowed_hosts"].check
        checked = check("--allowed-host/dlx_web_allowed_hosts", list(self.allowed_hosts))
        object.__setattr__(self, "allowed_hosts", checked)

    @classmethod
    def from_config(
        cls,
        config: DLXConfig,
        *,
        host: str | None = None,
        port: int | None = None,
        allowed_hosts: Sequence[str] = (),
        operators: Sequence[str] = (),
        viewers: Sequence[str] = (),
        protos: Sequence[str] = (),
        editors: Sequence[str] = (),
    ) -> WebSettings:
        """The ``dlx_web_*`` settings of ``config``, each replaced by an option given."""
        return cls(
            host=host or config.web_host,
            port=port or config.web_port,
            allowed_hosts=tuple(allowed_hosts) or tuple(config.web_allowed_hosts),
            operators=tuple(operators) or tuple(config.web_basic_auth),
            viewers=tuple(viewers) or tuple(config.web_viewer_auth),
            editors=tuple(editors) or tuple(config.web_editors),
            max_replay_rate=float(config.web_max_replay_rate),
            protos=tuple(protos),
        )


def link(path: str, **params: object) -> str:
    """``path`` with the non-empty ``params`` as its query string."""
    given = {k: v for k, v in params.items() if v is not None and v is not False and v != ""}
    return f"{path}?{urlencode(given)}" if given else path


def short_type(name: str | None) -> str:
    return (name or "").rsplit(".", 1)[-1]


class Console:
    """Everything the routes share; one per running console."""

    def __init__(self, runtime: Runtime, settings: WebSettings) -> None:
        self.runtime = runtime
        self.settings = settings
        self.accounts = Accounts.from_lists(settings.operators, settings.viewers, settings.editors)
        self.csrf = Csrf()
        self.actions = Actions(runtime)
        self.metrics = CollectorRegistry(auto_describe=False)
        self.metrics.register(DLXCollector(runtime))
        self.metrics.register(BreakerCollector(runtime))
        self._registry: ProtobufRegistry | None = None
        self._check: tuple[float, dict[str, object]] | None = None
        self._lock = threading.Lock()
        self.env = jinja2.Environment(
            loader=jinja2.PackageLoader("celery_dlx_console", "templates"),
            autoescape=True,
            undefined=jinja2.StrictUndefined,
            trim_blocks=True,
            lstrip_blocks=True,
        )
        self.env.globals.update(link=link, short_type=short_type)
        self.env.filters["ago"] = lambda ms: ago(ms, now_ms()) if ms else "-"

    @property
    def registry(self) -> ProtobufRegistry:
        """The protobuf registry of the settings and ``--proto`` (loaded once)."""
        with self._lock:
            if self._registry is None:
                self._registry = registry_for(self.runtime, self.settings.protos)
            return self._registry

    def check(self) -> dict[str, object]:
        """``dlx check --json`` with the broker's management API when it can be had, cached for
        :data:`CHECK_TTL` seconds; ``error`` is set when the check itself could not run."""
        from celery_dlx.ops.checks import management_of, run_check

        with self._lock:
            if self._check is not None and time.monotonic() - self._check[0] < CHECK_TTL:
                return self._check[1]
        api = management_of(self.runtime)
        data: dict[str, object]
        try:
            data = {**run_check(self.runtime, api).to_json(), "error": None}
        except Exception as exc:  # broker down: the overview says so and shows the rest
            error = f"{type(exc).__name__}: {exc}"
            data = {"ok": False, "problems": [], "management": False, "queues": [], "error": error}
        with self._lock:
            self._check = (time.monotonic(), data)
        return data
