"""Every module of celery_dlx sits in a layer of the import contracts (pyproject.toml).

import-linter checks only the modules a layers contract names: a module in no layer (a new file at
the package root, say) may import anything and be imported from anywhere, which is how a cycle
hides. This test lists the package's modules from its files (nothing imported) and fails with each
one that no layer names, directly or through a package above it.
"""

from __future__ import annotations

import ast
import pkgutil
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

# The contracts are the repository's, not a release's: read where the standard library reads TOML.
tomllib = pytest.importorskip("tomllib", reason="tomllib is in the standard library from 3.11")

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "celery_dlx"


def modules(folder: Path, prefix: str) -> Iterator[str]:
    """The dotted names of the modules and packages under ``folder`` (read from the files)."""
    for info in pkgutil.iter_modules([str(folder)]):
        name = f"{prefix}.{info.name}"
        yield name
        if info.ispkg:
            yield from modules(folder / info.name, name)


def contracts() -> list[dict[str, object]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    found: list[dict[str, object]] = config["tool"]["importlinter"]["contracts"]
    return found


def layered_names() -> set[str]:
    """Every module a layers contract names (``a | b`` and ``a : b`` are layers of siblings)."""
    names: set[str] = set()
    for contract in contracts():
        if contract["type"] != "layers":
            continue
        layers = contract["layers"]
        assert isinstance(layers, list)
        for layer in layers:
            names.update(part.strip(" ()") for part in re.split(r"[|:]", layer))
    return names


def uncovered(found: Iterable[str], layered: set[str]) -> list[str]:
    """The modules of ``found`` that no name of ``layered`` covers, itself or by a parent package."""

    def covered(name: str) -> bool:
        parts = name.split(".")
        return any(".".join(parts[:n]) in layered for n in range(1, len(parts) + 1))

    return sorted(name for name in found if not covered(name))


def test_every_module_is_in_a_layer() -> None:
    # The root package itself is the contracts' root_package: the container of the layers.
    missing = uncovered(modules(ROOT / PACKAGE, PACKAGE), layered_names())
    assert not missing, f"modules in no layer of [tool.importlinter]: {', '.join(missing)}"


def test_every_layer_names_a_module() -> None:
    existing = set(modules(ROOT / PACKAGE, PACKAGE))
    stale = sorted(layered_names() - existing)
    assert not stale, f"layers naming no module of {PACKAGE}: {', '.join(stale)}"


def test_a_module_in_no_layer_is_reported() -> None:
    layered = {"celery_dlx.store", "celery_dlx.fates"}
    found = ["celery_dlx.store", "celery_dlx.store.parking", "celery_dlx.fates", "celery_dlx.roles"]
    assert uncovered(found, layered) == ["celery_dlx.roles"]
    # A sibling whose name merely starts like a layer's is not covered by it.
    assert uncovered(["celery_dlx.stores.x", "celery_dlx.fates2"], layered) == [
        "celery_dlx.fates2",
        "celery_dlx.stores.x",
    ]


def test_the_package_s_modules_are_all_listed() -> None:
    found = set(modules(ROOT / PACKAGE, PACKAGE))
    assert {"celery_dlx.fates", "celery_dlx.compat.kombu", "celery_dlx.message.event"} <= found
    assert "celery_dlx.store.shards" in found


def _contract(name_start: str) -> dict[str, object]:
    (found,) = [c for c in contracts() if str(c["name"]).startswith(name_start)]
    return found


def test_above_the_root_no_module_of_store_is_importable_but_its_errors() -> None:
    # The whole store package is forbidden (a new store module is covered by itself), and the
    # one import allowed is of the store's exception classes.
    roles = _contract("cli, web, ops, workers, the service and the drain reach state only")
    assert roles["forbidden_modules"] == ["celery_dlx.store"]
    ignored = roles.get("ignore_imports", [])
    assert isinstance(ignored, list)
    assert {rule.split("->")[1].strip() for rule in ignored} <= {"celery_dlx.store.errors"}


def test_the_store_s_errors_hold_no_client() -> None:
    tree = ast.parse((ROOT / PACKAGE / "store" / "errors.py").read_text())
    imported = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module is not None
    }
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert imported <= {"__future__", "redis.exceptions", "celery_dlx.errors"}, imported
    classes = [n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
    for cls in classes:
        bases = {b.id for b in cls.bases if isinstance(b, ast.Name)}
        assert bases <= {"StoreError", "RedisError"}, (cls.name, bases)
