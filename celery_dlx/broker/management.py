"""A small client of the RabbitMQ management HTTP API (``rabbitmq_management`` plugin).

``celery dlx check`` reads queues, bindings and policies through it; ``celery dlx migrate --policy``
writes one policy. Only the standard library is used (``urllib``). The URL, user and password
default to the broker's host with port 15672 (15671 for ``amqps``) and the broker's credentials.
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass

from kombu import Connection

from celery_dlx.errors import DLXError

#: Default management port for plain and TLS brokers.
HTTP_PORT = 15672
HTTPS_PORT = 15671


class ManagementError(DLXError):
    """The management API could not be reached or refused a request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Management:
    """The management API of one virtual host.

    Args:
        url: base URL, e.g. ``http://127.0.0.1:15672``.
        user, password: credentials of a user with the ``management`` tag (``policymaker`` to
            write policies).
        vhost: the virtual host every call is about.
        timeout: seconds per HTTP request.
    """

    url: str
    user: str
    password: str
    vhost: str = "/"
    timeout: float = 10.0

    def _path(self, *parts: str) -> str:
        return "/api/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)

    def request(self, method: str, path: str, body: object = None) -> object:
        """Send one request; the decoded JSON answer (None for an empty one).

        Raises:
            ManagementError: unreachable, not authorised, or an error status (``status`` set).
        """
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(self.url.rstrip("/") + path, data=data, method=method)
        token = base64.b64encode(f"{self.user}:{self.password}".encode()).decode("ascii")
        req.add_header("Authorization", f"Basic {token}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode("utf-8", "replace")[:300]
            hint = (
                " (check --management-user/--management-password)" if exc.code in (401, 403) else ""
            )
            raise ManagementError(
                f"management API {method} {path} answered {exc.code}: {detail}{hint}", exc.code
            ) from exc
        except (urllib.error.URLError, OSError) as exc:
            raise ManagementError(
                f"management API at {self.url} unreachable ({exc}); set --management-url or "
                "enable it: rabbitmq-plugins enable rabbitmq_management"
            ) from exc
        return json.loads(raw) if raw.strip() else None

    def get(self, *parts: str) -> object:
        return self.request("GET", self._path(*parts))

    def queues(self) -> list[dict[str, object]]:
        """Every queue of the virtual host, with consumers, messages, arguments and policy."""
        return _objects(self.get("queues", self.vhost))

    def queue(self, name: str) -> dict[str, object] | None:
        """One queue, or None when it does not exist."""
        try:
            found = self.get("queues", self.vhost, name)
        except ManagementError as exc:
            if exc.status == 404:
                return None
            raise
        return _object(found)

    def queue_bindings(self, name: str) -> list[dict[str, object]]:
        """The bindings of queue ``name`` (the default exchange's included)."""
        return _objects(self.get("queues", self.vhost, name, "bindings"))

    def bindings_between(self, exchange: str, queue: str) -> list[dict[str, object]]:
        return _objects(self.get("bindings", self.vhost, "e", exchange, "q", queue))

    def policies(self) -> list[dict[str, object]]:
        """Every (user) policy of the virtual host."""
        return _objects(self.get("policies", self.vhost))

    def policy(self, name: str) -> dict[str, object] | None:
        try:
            found = self.get("policies", self.vhost, name)
        except ManagementError as exc:
            if exc.status == 404:
                return None
            raise
        return _object(found)

    def put_policy(
        self,
        name: str,
        pattern: str,
        definition: Mapping[str, object],
        priority: int,
        apply_to: str,
    ) -> None:
        """Create or replace policy ``name``."""
        body = {
            "pattern": pattern,
            "definition": definition,
            "priority": priority,
            "apply-to": apply_to,
        }
        self.request("PUT", self._path("policies", self.vhost, name), body)

    def delete_policy(self, name: str) -> bool:
        """Delete policy ``name``; False if there was none."""
        try:
            self.request("DELETE", self._path("policies", self.vhost, name))
        except ManagementError as exc:
            if exc.status == 404:
                return False
            raise
        return True


def _object(found: object) -> dict[str, object]:
    """A JSON object the API answered.

    Raises:
        ManagementError: the answer is not a JSON object.
    """
    if not isinstance(found, dict):
        raise ManagementError(f"management API answered {type(found).__name__}, not an object")
    return dict(found)


def _objects(found: object) -> list[dict[str, object]]:
    """A JSON array of objects the API answered (none for an empty answer).

    Raises:
        ManagementError: the answer is not a JSON array of objects.
    """
    if not found:
        return []
    if not isinstance(found, list) or not all(isinstance(item, dict) for item in found):
        raise ManagementError("management API answered something else than a list of objects")
    return list(found)


def management_for(
    connection: Connection,
    *,
    url: str | None = None,
    user: str | None = None,
    password: str | None = None,
    timeout: float = 10.0,
) -> Management:
    """The management API of a kombu connection's broker, unless told otherwise.

    Args:
        connection: a ``kombu.Connection`` (not connected: only its URL parts are read).
        url: management base URL (default: ``http://<broker host>:15672``, ``https`` and
            15671 for an ``amqps``/SSL broker).
        user, password: default: the broker's.
    """
    host = connection.hostname or "127.0.0.1"
    ssl = bool(getattr(connection, "ssl", False))
    if url is None:
        scheme, port = ("https", HTTPS_PORT) if ssl else ("http", HTTP_PORT)
        shown = f"[{host}]" if ":" in host else host
        url = f"{scheme}://{shown}:{port}"
    vhost = connection.virtual_host or "/"
    return Management(
        url=url,
        user=user if user is not None else (connection.userid or "guest"),
        password=password if password is not None else (connection.password or "guest"),
        vhost=vhost,
        timeout=timeout,
    )


def dead_letter_exchange_of(queue: Mapping[str, object]) -> tuple[str | None, str]:
    """The dead-letter exchange a queue (as the API shows it) routes to, and where it is set.

    Queue arguments win over policies, as in RabbitMQ; where is ``argument``, ``policy``,
    ``operator-policy`` or ``none``.
    """
    args = queue.get("arguments") or {}
    if isinstance(args, Mapping) and args.get("x-dead-letter-exchange"):
        return str(args["x-dead-letter-exchange"]), "argument"
    effective = queue.get("effective_policy_definition") or {}
    if isinstance(effective, dict) and effective.get("dead-letter-exchange"):
        where = "policy" if queue.get("policy") else "operator-policy"
        return str(effective["dead-letter-exchange"]), where
    return None, "none"
