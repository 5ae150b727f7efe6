"""Which ``Host`` the console answers and which page a write may come from: its defence against
DNS rebinding and cross-site writes.

A page on ``http://attacker.example:5566`` whose name the attacker then points at 127.0.0.1
reaches a loopback console as if it were its own origin: the browser sends
``Host: attacker.example:5566`` and an ``Origin`` matching it, and no credentials are needed
on an open console. So the ``Host`` must name the address the console listens on or a name of
``dlx_web_allowed_hosts`` (:class:`HostRule`), and a write must come from a page of the host it
names (:func:`same_origin`), which a form or ``fetch`` of another site cannot claim.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from celery_dlx_console.auth import is_loopback

#: The port a URL or ``Host`` without one means, by scheme.
DEFAULT_PORTS = {"http": 80, "https": 443}
#: Names of the loopback interface, all accepted when the console listens on it.
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
#: Methods that change something: they must come from a page of the console itself.
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})

_NAME = re.compile(r"[a-z0-9_.-]+|\[[0-9a-f:.]+\]")


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        return None


def canonical(name: str) -> str:
    """``name`` in lower case; an IP address in its short form, IPv6 in brackets."""
    ip = _ip(name.lower())
    if ip is None:
        return name.lower()
    return f"[{ip.compressed}]" if ip.version == 6 else ip.compressed


@dataclass(frozen=True)
class HostPort:
    """A parsed ``Host`` header: the :func:`canonical` name and the port, None if not given."""

    name: str
    port: int | None


def parse_host(value: str | None) -> HostPort | None:
    """A ``Host`` header (``name``, ``name:port``, ``[IPv6]``, ``[IPv6]:port``), or None when it
    is missing or malformed."""
    if not value:
        return None
    if value.startswith("["):
        name, bracket, rest = value.partition("]")
        name += bracket
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port_text = rest[1:]
        has_port = bool(rest)
    else:
        name, sep, port_text = value.partition(":")
        has_port = bool(sep)
    name = name.lower()
    if not _NAME.fullmatch(name):
        return None
    if not has_port:
        return HostPort(canonical(name), None)
    if not (port_text.isascii() and port_text.isdigit()) or not 0 < int(port_text) < 65536:
        return None
    return HostPort(canonical(name), int(port_text))


def matches(name: str, pattern: str) -> bool:
    """Whether a :func:`canonical` host name matches a ``dlx_web_allowed_hosts`` pattern: the
    same name, or for ``*.corp.example`` any name under ``corp.example`` (not itself)."""
    if pattern.startswith("*."):
        return name.endswith(pattern[1:])
    return name == canonical(pattern)


@dataclass(frozen=True)
class HostRule:
    """The ``Host`` headers a console answers: the address it listens on at its port, and the
    names of ``dlx_web_allowed_hosts`` at any port (a proxy's or a tunnel's)."""

    #: The listening address, with the loopback names when it is a loopback address.
    names: frozenset[str]
    port: int
    #: Listening on every interface (``0.0.0.0``, ``::``): any IP address at :attr:`port`.
    any_ip: bool
    patterns: tuple[str, ...] = ()

    @classmethod
    def listening(cls, host: str, port: int, allowed: Iterable[str] = ()) -> HostRule:
        """The rule of a console listening on ``host``:``port`` with ``allowed`` names."""
        name = canonical(host)
        ip = _ip(name)
        every = ip is not None and ip.is_unspecified
        names = {name, *LOOPBACK_NAMES} if every or is_loopback(host) else {name}
        return cls(frozenset(names), port, every, tuple(p.lower() for p in allowed))

    def allows(self, host: str | None, scheme: str = "http") -> bool:
        """Whether a request over ``scheme`` with this ``Host`` header is for this console."""
        parsed = parse_host(host)
        if parsed is None:
            return False
        if any(matches(parsed.name, pattern) for pattern in self.patterns):
            return True
        port = parsed.port if parsed.port is not None else DEFAULT_PORTS.get(scheme)
        if port != self.port:
            return False
        return parsed.name in self.names or (self.any_ip and _ip(parsed.name) is not None)

    def describe(self) -> str:
        """The hosts answered, for an error message."""
        listening = sorted(f"{name}:{self.port}" for name in self.names)
        if self.any_ip:
            listening.append(f"any IP address at port {self.port}")
        return ", ".join(listening + list(self.patterns))


def same_origin(source: str | None, scheme: str, host: str | None) -> bool:
    """Whether ``source`` (an ``Origin``, or a ``Referer`` URL) is the origin of a request over
    ``scheme`` with this ``Host``: same scheme, host and port, default ports filled in.

    ``Origin: null`` (an opaque origin: a sandboxed frame, a redirect from elsewhere) is not.
    """
    target = parse_host(host)
    if not source or target is None or scheme not in DEFAULT_PORTS:
        return False
    try:
        parts = urlsplit(source)
        port = parts.port
    except ValueError:
        return False
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return False
    return (
        parts.scheme == scheme
        and canonical(parts.hostname) == target.name
        and (port if port is not None else DEFAULT_PORTS[parts.scheme])
        == (target.port if target.port is not None else DEFAULT_PORTS[scheme])
    )
