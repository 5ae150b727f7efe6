"""docs/configuration.md against the code: every setting, queue policy key and task option."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from celery_dlx.policy import settings as config
from celery_dlx.policy.options import TASK_OPTIONS

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "configuration.md"


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_config", ROOT / "docs" / "gen_config.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return load_generator()


def table_names(text: str, heading: str) -> list[str]:
    """The backticked names in the first column of the table under ``heading``."""
    section = text.split(heading, 1)[1]
    names = []
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        match = re.match(r"\| `([a-z_]+)` \|", line)
        if match:
            names.append(match.group(1))
    return names


def test_generated_block_matches_the_code(gen: ModuleType) -> None:
    text = DOC.read_text()
    assert gen.current(text) == gen.generate(), (
        "docs/configuration.md is out of date: run `python docs/gen_config.py --write`"
    )


def test_every_setting_is_documented_with_its_default() -> None:
    text = DOC.read_text()
    assert table_names(text, "### Settings") == list(config.SETTINGS)
    for setting in config.SETTINGS.values():
        row = next(line for line in text.splitlines() if line.startswith(f"| `{setting.name}` |"))
        assert setting.doc.replace("|", "\\|") in row


def test_every_queue_policy_key_and_task_option_is_documented() -> None:
    text = DOC.read_text()
    assert table_names(text, "### Keys of one `dlx_queues` entry") == list(config.QUEUE_POLICY_KEYS)
    assert table_names(text, "### Task options") == list(TASK_OPTIONS)


def test_a_setting_added_to_the_code_without_docs_fails(
    gen: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    extra = config.Setting("dlx_new_thing", 3, config._count, "A setting nobody documented.")
    monkeypatch.setitem(config.SETTINGS, extra.name, extra)
    assert gen.current(DOC.read_text()) != gen.generate()
    assert "dlx_new_thing" not in table_names(DOC.read_text(), "### Settings")


def test_a_new_validator_or_task_option_must_be_described(
    gen: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    odd = config.Setting("dlx_odd", 1, lambda name, value: value, "Checked by a new validator.")
    monkeypatch.setitem(config.SETTINGS, odd.name, odd)
    with pytest.raises(gen.Undocumented, match="dlx_odd"):
        gen.generate()
    monkeypatch.delitem(config.SETTINGS, odd.name)
    monkeypatch.setattr(gen, "TASK_OPTIONS", (*TASK_OPTIONS, "dlx_new_option"))
    with pytest.raises(gen.Undocumented, match="dlx_new_option"):
        gen.generate()


def test_defaults_in_the_table_are_the_code_defaults(gen: ModuleType) -> None:
    text = DOC.read_text()
    for name in ("dlx_max_requeues", "dlx_max_parks", "dlx_exchange", "dlx_service_queue"):
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        assert f"`{config.SETTINGS[name].default!r}`" in row
