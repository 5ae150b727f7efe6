"""The compat gate's script, loaded as a module for its tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def compat() -> ModuleType:
    """``scripts/celery_compat.py`` (not a package module: loaded from its path)."""
    spec = importlib.util.spec_from_file_location(
        "celery_compat_script", ROOT / "scripts" / "celery_compat.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module
