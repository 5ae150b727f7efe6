"""The public API: every name in ``celery_dlx.__all__`` resolves, and the docs import only public names."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import celery_dlx

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", celery_dlx.__all__)
def test_every_public_name_resolves(name: str) -> None:
    assert getattr(celery_dlx, name) is not None


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        celery_dlx.nope  # noqa: B018


def test_all_is_sorted_and_unique() -> None:
    assert list(celery_dlx.__all__) == sorted(set(celery_dlx.__all__))


def test_importing_the_package_leaves_the_operations_unloaded() -> None:
    code = "import sys, celery_dlx; print(sorted(m for m in sys.modules if m.startswith('celery_dlx.ops')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def _doc_imports() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for line in path.read_text().splitlines():
            m = re.match(r"\s*from (celery_dlx[\w.]*) import (.+)", line)
            if m:
                found.append((f"{path.name}: {line.strip()}", m.group(1)))
            m = re.match(r"\s*import (celery_dlx[\w.]*)", line)
            if m:
                found.append((f"{path.name}: {line.strip()}", m.group(1)))
    return found


def test_docs_import_only_the_public_api() -> None:
    imports = _doc_imports()
    assert imports, "the docs show no import at all: this test would check nothing"
    private = [where for where, module in imports if module != "celery_dlx"]
    assert private == []
