"""Pure parts of the console: settings, CSRF tokens, Basic credentials, the hex and wire views,
the SVG chart's points, the purge phrase and the replay rate limit."""

from __future__ import annotations

import base64
import json

import pytest

from celery_dlx.errors import ConfigurationError
from celery_dlx.policy.config import load_config
from celery_dlx_console import forms
from celery_dlx_console.auth import OPERATOR, VIEWER, Accounts, Csrf, User
from celery_dlx_console.console import WebSettings, link
from celery_dlx_console.payload import hexdump, wire_view


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_settings_and_options() -> None:
    config = load_config(
        {
            "CELERY_DLX_WEB_PORT": 6000,
            "CELERY_DLX_WEB_BASIC_AUTH": ["a:1"],
            "CELERY_DLX_WEB_VIEWER_AUTH": ["v:2"],
        },
        namespace="CELERY",
    )
    settings = WebSettings.from_config(config)
    assert (settings.host, settings.port) == ("127.0.0.1", 6000)
    assert settings.operators == ("a:1",) and settings.viewers == ("v:2",)
    assert settings.max_replay_rate == 50
    given = WebSettings.from_config(config, host="::1", port=7000, operators=["b:3"])
    assert (given.host, given.port, given.operators, given.viewers) == (
        "::1",
        7000,
        ("b:3",),
        ("v:2",),
    )
    with pytest.raises(ConfigurationError, match="dlx_web_basic_auth must be a list"):
        load_config({"dlx_web_basic_auth": "a:1"})


def test_allowed_hosts_from_the_setting_or_the_option() -> None:
    config = load_config({"dlx_web_allowed_hosts": ["dlx.example.com"]})
    assert WebSettings.from_config(config).allowed_hosts == ("dlx.example.com",)
    given = WebSettings.from_config(config, allowed_hosts=["*.Corp.example"])
    assert given.allowed_hosts == ("*.corp.example",)
    with pytest.raises(ConfigurationError, match=r"--allowed-host/dlx_web_allowed_hosts\[0\]"):
        WebSettings.from_config(config, allowed_hosts=["dlx.example.com:443"])
    with pytest.raises(ConfigurationError, match="rebinding"):
        WebSettings(allowed_hosts=("*",))


def test_accounts_and_csrf() -> None:
    accounts = Accounts.from_lists(["op:pw:with:colons"], ["v:x"])
    assert accounts.authenticate(basic("op", "pw:with:colons")) == User("op", OPERATOR)
    assert accounts.authenticate(basic("v", "x")) == User("v", VIEWER)
    for header in (None, "", basic("op", "pw"), basic("nobody", "x"), "Bearer abc", "Basic !!"):
        assert accounts.authenticate(header) is None
    csrf = Csrf()
    op, viewer = User("op", OPERATOR), User("v", VIEWER)
    assert csrf.valid(op, csrf.token(op)) and not csrf.valid(op, csrf.token(viewer))
    assert not csrf.valid(op, None) and not csrf.valid(op, "")
    assert not Csrf().valid(op, csrf.token(op))  # another console start, another secret


def test_hexdump_and_wire_view() -> None:
    assert hexdump(b"AB\x00") == "00000000  41 42 00" + " " * 39 + "  AB."
    assert hexdump(b"x" * 40, limit=16).endswith("... 24 more bytes")
    wire = wire_view(b"\x0a\x03abc\x10\x2a", [])
    assert wire is not None and '"field": 1' in wire and '"value": 42' in wire
    assert wire_view(base64.b64encode(b"\x0a\x03abc"), ["base64"]) is not None
    assert wire_view(b"\xff\xff\xff", []) is None and wire_view(b"", []) is None


def test_link_rates_and_phrase() -> None:
    assert link("/group", cause="a b", queue=None, offset=0) == "/group?cause=a+b&offset=0"
    assert link("/causes") == "/causes"
    assert forms.replay_rate(None, 50) == 10 and forms.replay_rate("", 5) == 5
    assert forms.replay_rate("2.5", 50) == 2.5
    for bad in ("0", "-1", "x", "51"):
        with pytest.raises(forms.BadRequest):
            forms.replay_rate(bad, 50)
    assert forms.purge_phrase(3) == "purge 3"


def test_a_long_result_keeps_its_counts_in_the_audit_stream() -> None:
    from celery_dlx_console.audit import RESULT_LIMIT, _result_json

    small = {"replayed": ["a"], "targets": 1}
    assert json.loads(_result_json(small)) == small
    big = {"replayed": [f"ob-{i:08d}" for i in range(RESULT_LIMIT // 10)], "targets": 7}
    kept = json.loads(_result_json(big))
    assert kept == {"truncated": True, "replayed": RESULT_LIMIT // 10, "targets": 7}
