"""A small ``urllib`` client of the RabbitMQ management HTTP API (``rabbitmq_management``).

URL and credentials default to the broker's (port 15672, 15671 for ``amqps``); a failover list of
broker URLs gives one candidate per URL, the first that answers is used.
"""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from kombu import Connection

from celery_dlx.errors import DLXError
from celery_dlx.message.names import service_tag_prefix

logger = logging.getLogger(__name__)

#: Default management port for plain and TLS brokers.
HTTP_PORT = 15672
HTTPS_PORT = 15671
#: What :meth:`Management._unless_404` answers for a 404.
_MISSING = object()


class ManagementError(DLXError):
    """The management API could not be reached or refused a request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class Management:
    """The management API of one virtual host (``url`` as ``http://127.0.0.1:15672``; the user
    needs the ``management`` tag, ``policymaker`` to write policies; ``timeout`` per request)."""

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

    def _unless_404(self, method: str, *parts: str) -> object:
        """One request to ``parts``; :data:`_MISSING` when the API answers 404."""
        try:
            return self.request(method, self._path(*parts))
        except ManagementError as exc:
            if exc.status == 404:
                return _MISSING
            raise

    def queue(self, name: str) -> dict[str, object] | None:
        """One queue, or None when it does not exist."""
        found = self._unless_404("GET", "queues", self.vhost, name)
        return None if found is _MISSING else _object(found)

    def queue_bindings(self, name: str) -> list[dict[str, object]]:
        """The bindings of queue ``name`` (the default exchange's included)."""
        return _objects(self.get("queues", self.vhost, name, "bindings"))

    def exchange_bindings(self, exchange: str) -> list[dict[str, object]]:
        """The bindings whose source is ``exchange`` (an empty list when it does not exist)."""
        found = self._unless_404("GET", "exchanges", self.vhost, exchange, "bindings", "source")
        return [] if found is _MISSING else _objects(found)

    def bindings_between(self, exchange: str, queue: str) -> list[dict[str, object]]:
        return _objects(self.get("bindings", self.vhost, "e", exchange, "q", queue))

    def policies(self) -> list[dict[str, object]]:
        """Every (user) policy of the virtual host."""
        return _objects(self.get("policies", self.vhost))

    def policy(self, name: str) -> dict[str, object] | None:
        found = self._unless_404("GET", "policies", self.vhost, name)
        return None if found is _MISSING else _object(found)

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
        return self._unless_404("DELETE", "policies", self.vhost, name) is not _MISSING


def _object(found: object) -> dict[str, object]:
    """A JSON object the API answered (else :class:`ManagementError`)."""
    if not isinstance(found, dict):
        raise ManagementError(f"management API answered {type(found).__name__}, not an object")
    return dict(found)


def _objects(found: object) -> list[dict[str, object]]:
    """A JSON array of objects the API answered, [] for none (else :class:`ManagementError`)."""
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
    """The management API of a kombu connection's broker (only its URL parts are read), unless
    ``url``, ``user`` or ``password`` say otherwise."""
    return Management(
        url=url
        if url is not None
        else _default_url(connection.hostname, bool(getattr(connection, "ssl", False))),
        user=user if user is not None else (connection.userid or "guest"),
        password=password if password is not None else (connection.password or "guest"),
        vhost=connection.virtual_host or "/",
        timeout=timeout,
    )


def broker_urls(connection: Connection) -> list[str]:
    """Every URL of a kombu connection's failover list (``amqp://a;amqp://b``), first one first."""
    alternates = [str(url) for url in (connection.alt or []) if url]
    return alternates or [connection.as_uri(include_password=True)]


def management_url_of(broker_url: str, *, ssl: bool = False) -> str:
    """The default management base URL of one broker URL."""
    tls = ssl or broker_url.split("://", 1)[0].lower() in ("amqps", "pyamqps")
    return _default_url(Connection(broker_url).hostname, tls)


def _default_url(host: str | None, tls: bool) -> str:
    scheme, port = ("https", HTTPS_PORT) if tls else ("http", HTTP_PORT)
    host = host or "127.0.0.1"
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def split_urls(values: Iterable[str] | str | None) -> list[str]:
    """Management URLs given as repeated values, each possibly comma-separated; blanks dropped,
    the first of duplicates kept."""
    if values is None:
        return []
    items = [values] if isinstance(values, str) else list(values)
    out: list[str] = []
    for item in items:
        for url in item.split(","):
            url = url.strip()
            if url and url not in out:
                out.append(url)
    return out


def management_candidates(
    connection: Connection,
    *,
    urls: Iterable[str] | str | None = None,
    user: str | None = None,
    password: str | None = None,
) -> list[Management]:
    """The management APIs to try, in order, for a (possibly clustered) broker: one per URL of
    ``connection``'s failover list, or the ``urls`` the user gave (credentials and virtual host
    then from the broker's first URL); ``user``/``password`` override every candidate's."""
    given = split_urls(urls)
    if given:
        return [management_for(connection, url=url, user=user, password=password) for url in given]
    ssl = bool(getattr(connection, "ssl", False))
    out: list[Management] = []
    for broker_url in broker_urls(connection):
        url = management_url_of(broker_url, ssl=ssl)
        api = management_for(Connection(broker_url), url=url, user=user, password=password)
        if all(api.url != seen.url or api.vhost != seen.vhost for seen in out):
            out.append(api)
    return out


#: Seconds a candidate management API has to answer :func:`first_answering`'s probe.
PROBE_TIMEOUT = 5.0


def first_answering(candidates: Sequence[Management]) -> Management:
    """The first of ``candidates`` whose ``GET /api/whoami`` succeeds within
    :data:`PROBE_TIMEOUT` (a dead cluster node costs that, not the whole command); a single one
    is returned unprobed.

    Raises:
        ManagementError: none answered; the message names each URL tried and why it failed.
        ValueError: no candidates.
    """
    if not candidates:
        raise ValueError("no management API to try")
    if len(candidates) == 1:
        return candidates[0]
    failures: list[str] = []
    status: int | None = None
    for api in candidates:
        probe = dataclasses.replace(api, timeout=min(api.timeout, PROBE_TIMEOUT))
        try:
            probe.get("whoami")
        except ManagementError as exc:
            failures.append(f"{api.url}: {exc}")
            status = exc.status
            continue
        if failures:
            logger.info("management API %s answers; tried before: %s", api.url, "; ".join(failures))
        return api
    raise ManagementError(
        f"none of {len(candidates)} management APIs answered (set --management-url, or enable "
        "rabbitmq_management on the nodes): " + "; ".join(failures),
        status,
    )


def other_services(api: Management, exchange: str, own_queue: str, prefix: str) -> dict[str, str]:
    """Queue -> key prefix of the queues bound to ``exchange`` besides ``own_queue`` that a DLX
    service of another app consumes (read from its consumer tag): each gets a copy of every dead
    letter, so both services park and bury it."""
    found: dict[str, str] = {}
    for binding in api.exchange_bindings(exchange):
        queue = str(binding.get("destination", ""))
        if binding.get("destination_type") != "queue" or queue in (own_queue, *found):
            continue
        consumers = (api.queue(queue) or {}).get("consumer_details")
        for consumer in consumers if isinstance(consumers, list) else []:
            tag = consumer.get("consumer_tag", "") if isinstance(consumer, Mapping) else ""
            other = service_tag_prefix(str(tag))
            if other is not None and other != prefix:
                found[queue] = other
                break
    return found


def dead_letter_exchange_of(queue: Mapping[str, object]) -> tuple[str | None, str]:
    """The dead-letter exchange a queue (as the API shows it) routes to, and where it is set:
    ``argument`` (which wins over policies, as in RabbitMQ), ``policy``, ``operator-policy`` or
    ``none``."""
    args = queue.get("arguments") or {}
    if isinstance(args, Mapping) and args.get("x-dead-letter-exchange"):
        return str(args["x-dead-letter-exchange"]), "argument"
    effective = queue.get("effective_policy_definition") or {}
    if isinstance(effective, dict) and effective.get("dead-letter-exchange"):
        where = "policy" if queue.get("policy") else "operator-policy"
        return str(effective["dead-letter-exchange"]), where
    return None, "none"
