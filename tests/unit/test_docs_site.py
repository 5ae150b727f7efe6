"""The documentation site against the code: every command, option, setting and public name has doc
text, and messages point at pages by URL (scripts/docs.sh builds the site itself)."""

from __future__ import annotations

import ast
import configparser
import re
from pathlib import Path

import click
import pytest

import celery_dlx
from celery_dlx.cli.main import dlx
from celery_dlx.docs_url import DOCS_URL, doc_url
from celery_dlx.policy import settings as config

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"


def undocumented_cli(command: click.Command, path: str = "dlx") -> list[str]:
    """Commands and options of ``command`` (and its subcommands) without help text."""
    missing = []
    if not (command.help or command.short_help):
        missing.append(path)
    for param in command.params:
        if isinstance(param, click.Option) and not (param.help or "").strip():
            missing.append(f"{path} {'/'.join(param.opts)}")
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            missing += undocumented_cli(sub, f"{path} {name}")
    return missing


def test_every_command_and_option_has_help_text() -> None:
    assert undocumented_cli(dlx) == []


def test_a_command_or_option_without_help_is_found() -> None:
    @click.group("top", help="A documented group.")
    def top() -> None: ...

    @top.command("bare")
    @click.option("--quiet", is_flag=True)
    @click.option("--loud", is_flag=True, help="Documented.")
    def bare(quiet: bool, loud: bool) -> None: ...

    assert undocumented_cli(top, "top") == ["top bare", "top bare --quiet"]


def test_the_cli_page_is_generated_from_the_dlx_group() -> None:
    text = (DOCS / "cli.md").read_text()
    assert ".. click:: celery_dlx.cli.main:dlx" in text
    assert ":nested: full" in text
    # Every command has its own notes section too, so no command is only a bare option list.
    for name in dlx.commands:
        assert re.search(rf"^## `{re.escape(name)}( [A-Z]+)?`$", text, re.M), name


def undocumented_settings(settings: dict[str, config.Setting]) -> list[str]:
    return [name for name, setting in settings.items() if not setting.doc.strip()]


def test_every_setting_has_doc_text(monkeypatch: pytest.MonkeyPatch) -> None:
    assert undocumented_settings(config.SETTINGS) == []
    blank = config.Setting("dlx_blank", 1, config._count, "  ")
    monkeypatch.setitem(config.SETTINGS, blank.name, blank)
    assert undocumented_settings(config.SETTINGS) == ["dlx_blank"]


def test_the_api_page_documents_every_public_name() -> None:
    text = (DOCS / "api.md").read_text()
    documented = re.findall(
        r"^\.\. auto(?:function|class|exception):: celery_dlx\.(\w+)$", text, re.M
    )
    assert sorted(documented) == sorted(celery_dlx.__all__)


@pytest.mark.parametrize("name", celery_dlx.__all__)
def test_every_public_name_has_a_docstring(name: str) -> None:
    assert (getattr(celery_dlx, name).__doc__ or "").strip(), name


def test_the_documentation_url_is_the_package_metadata_one() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    lines = cfg["metadata"]["project_urls"].strip().splitlines()
    urls = {key.strip(): url.strip() for key, url in (line.split("=", 1) for line in lines)}
    assert urls["Documentation"] == DOCS_URL
    assert DOCS_URL.startswith("https://") and DOCS_URL.endswith("/")


def test_doc_url_names_a_page_and_refuses_a_file_path() -> None:
    assert doc_url("migration") == f"{DOCS_URL}migration.html"
    assert doc_url("delays", "the-ttl-ladder") == f"{DOCS_URL}delays.html#the-ttl-ladder"
    for bad in ("docs/migration.md", "migration.md", "Migration", ""):
        with pytest.raises(ValueError, match="page name"):
            doc_url(bad)


def _package_strings() -> list[tuple[str, int, str, list[str]]]:
    """Every string in celery_dlx, the console and payload editing that is not a docstring (file, line, text,
    doc_url pages)."""
    found = []
    paths = [
        path
        for package in ("celery_dlx", "celery_dlx_console", "celery_dlx_edit")
        for path in (ROOT / package).rglob("*.py")
    ]
    for path in sorted(paths):
        tree = ast.parse(path.read_text(), str(path))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if id(node) not in docstrings:
                    found.append((path.name, node.lineno, node.value, []))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id == "doc_url"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                found.append((path.name, node.lineno, "", [str(node.args[0].value)]))
    return found


def test_no_message_names_a_docs_file() -> None:
    named = [
        f"{name}:{line}: {text!r}"
        for name, line, text, _ in _package_strings()
        if re.search(r"\b[\w-]+\.md\b", text)
    ]
    assert named == [], "name the page with celery_dlx.docs_url.doc_url(...) instead"


def test_every_page_a_message_links_exists() -> None:
    pages = [page for *_, called in _package_strings() for page in called]
    assert {"configuration", "migration", "delays"} <= set(pages)
    assert [p for p in pages if not (DOCS / f"{p}.md").is_file()] == []
