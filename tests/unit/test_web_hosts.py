"""The console's Host and Origin rules (celery_dlx_console.hosts), and the setting that widens them."""

from __future__ import annotations

import pytest

from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.config import load_config
from celery_dlx_console.hosts import HostPort, HostRule, matches, parse_host, same_origin


@pytest.mark.parametrize(
    ("header", "parsed"),
    [
        ("127.0.0.1:5566", HostPort("127.0.0.1", 5566)),
        ("LocalHost", HostPort("localhost", None)),
        ("[::1]:5566", HostPort("[::1]", 5566)),
        ("[0:0::1]", HostPort("[::1]", None)),
        ("dlx.example.com:443", HostPort("dlx.example.com", 443)),
    ],
)
def test_host_headers_are_parsed(header: str, parsed: HostPort) -> None:
    assert parse_host(header) == parsed


@pytest.mark.parametrize(
    "header",
    [None, "", ":5566", "a:b", "a:0", "a:65536", "a:5566:1", "[::1", "[::1]x", "a b", "a/b", "u@a"],
)
def test_malformed_host_headers_are_none(header: str | None) -> None:
    assert parse_host(header) is None


def test_patterns_match_the_name_or_the_names_under_a_domain() -> None:
    assert matches("dlx.example.com", "dlx.example.com")
    assert matches("a.b.corp.example", "*.corp.example")
    assert not matches("corp.example", "*.corp.example")
    assert not matches("evilcorp.example", "*.corp.example")
    assert matches("[::1]", "[0::1]")


def test_loopback_console_answers_its_port_under_every_loopback_name() -> None:
    rule = HostRule.listening("127.0.0.1", 5566)
    for host in ("127.0.0.1:5566", "localhost:5566", "LOCALHOST:5566", "[::1]:5566"):
        assert rule.allows(host), host
    for host in (
        "attacker.example:5566",  # DNS rebinding: the attacker's name, the console's address
        "attacker.example",
        "127.0.0.1:5567",
        "127.0.0.1",  # port 80
        "127.0.0.2:5566",
        "localhost.attacker.example:5566",
        None,
        "",
    ):
        assert not rule.allows(host), host
    assert HostRule.listening("::1", 80).allows("localhost")
    assert HostRule.listening("localhost", 443).allows("[::1]", "https")


def test_allowed_names_are_answered_at_any_port() -> None:
    rule = HostRule.listening("127.0.0.1", 5566, ["dlx.example.com", "*.corp.example"])
    for host in ("dlx.example.com", "dlx.example.com:8443", "x.corp.example:5566"):
        assert rule.allows(host, "https"), host
    assert not rule.allows("corp.example:5566")
    assert not rule.allows("dlx.example.com.attacker.example")
    assert "dlx.example.com" in rule.describe() and "localhost:5566" in rule.describe()


def test_a_console_on_every_interface_answers_ip_addresses_and_loopback_names() -> None:
    rule = HostRule.listening("0.0.0.0", 5566, ["dlx.example.com"])
    for host in ("10.1.2.3:5566", "[fe80::1]:5566", "localhost:5566", "dlx.example.com"):
        assert rule.allows(host), host
    for host in ("10.1.2.3:80", "box.internal:5566", "attacker.example:5566"):
        assert not rule.allows(host), host
    assert "any IP address at port 5566" in rule.describe()
    specific = HostRule.listening("10.1.2.3", 5566)
    assert specific.allows("10.1.2.3:5566") and not specific.allows("10.9.9.9:5566")
    assert not specific.allows("localhost:5566")


@pytest.mark.parametrize(
    ("source", "scheme", "host"),
    [
        ("http://127.0.0.1:5566", "http", "127.0.0.1:5566"),
        ("http://127.0.0.1:5566/group?cause=x", "http", "127.0.0.1:5566"),  # a Referer
        ("https://DLX.example.com", "https", "dlx.example.com"),
        ("https://dlx.example.com:443", "https", "dlx.example.com"),
        ("http://dlx.example.com", "http", "dlx.example.com:80"),
        ("http://[::1]:5566", "http", "[0::1]:5566"),
    ],
)
def test_same_origin(source: str, scheme: str, host: str) -> None:
    assert same_origin(source, scheme, host)


@pytest.mark.parametrize(
    ("source", "scheme", "host"),
    [
        ("http://attacker.example", "http", "127.0.0.1:5566"),
        ("http://127.0.0.1:5567", "http", "127.0.0.1:5566"),
        ("http://localhost:5566", "http", "127.0.0.1:5566"),  # another origin, same machine
        ("http://dlx.example.com", "https", "dlx.example.com"),
        ("https://dlx.example.com", "http", "dlx.example.com"),
        ("null", "http", "127.0.0.1:5566"),
        ("", "http", "127.0.0.1:5566"),
        (None, "http", "127.0.0.1:5566"),
        ("http://127.0.0.1:99999", "http", "127.0.0.1:5566"),
        ("file:///tmp/x.html", "http", "127.0.0.1:5566"),
        ("http://127.0.0.1:5566", "http", None),
        ("http://127.0.0.1:5566", "ws", "127.0.0.1:5566"),
    ],
)
def test_not_same_origin(source: str | None, scheme: str, host: str | None) -> None:
    assert not same_origin(source, scheme, host)


def test_setting_is_lower_cased_and_refuses_a_wildcard_for_everything() -> None:
    config = load_config({"dlx_web_allowed_hosts": ["DLX.example.com", "*.corp.example", "[::1]"]})
    assert config.web_allowed_hosts == ("dlx.example.com", "*.corp.example", "[::1]")
    with pytest.raises(ConfigurationError, match=r"dlx_web_allowed_hosts\[0\] is '\*'.*rebinding"):
        load_config({"dlx_web_allowed_hosts": ["*"]})
    with pytest.raises(ConfigurationError, match="without scheme, port or path"):
        load_config({"dlx_web_allowed_hosts": ["https://dlx.example.com"]})
