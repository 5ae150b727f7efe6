"""Unsafe serializations (pickle above all) are shown as opaque bytes and never loaded."""

from __future__ import annotations

import ast
import base64
import gzip
import json
import pickle
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import celery_dlx.codecs
from celery_dlx.codecs import decode_payload

PICKLE = "application/x-python-serialize"
CODECS_DIR = Path(celery_dlx.codecs.__file__).resolve().parent

# Audit events raised while a decode runs (hooks cannot be removed, so one hook records into
# whichever list is armed).
_ARMED: list[list[tuple[str, Any]]] = []


def _audit(event: str, args: Any) -> None:
    if _ARMED and (
        event.startswith("pickle.") or event in {"open", "exec", "compile", "os.system"}
    ):
        _ARMED[-1].append((event, args))


sys.addaudithook(_audit)


@pytest.fixture
def audit() -> Iterator[list[tuple[str, Any]]]:
    events: list[tuple[str, Any]] = []
    _ARMED.append(events)
    yield events
    _ARMED.remove(events)


class Canary:
    """Creates the file at ``path`` when unpickled: what an attacker's payload would do."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (str(self.path), "w"))


def test_the_canary_pickle_really_creates_its_file_when_loaded(
    tmp_path: Path, audit: list[tuple[str, Any]]
) -> None:
    # The control: proves the payloads below are live and that the audit hook sees a load, so
    # neither a missing file nor a silent hook below can pass by accident.
    canary = tmp_path / "control"
    pickle.loads(pickle.dumps(Canary(canary))).close()
    assert canary.exists()
    assert any(event == "pickle.find_class" for event, _ in audit)
    assert any(event == "open" and str(canary) in str(args) for event, args in audit)


WRAPPINGS = {
    "raw": (lambda b: b, None),
    "gzip-declared": (gzip.compress, "gzip"),
    "gzip-undeclared": (gzip.compress, None),
    "base64": (base64.b64encode, None),
    "base64-in-json-string": (lambda b: json.dumps(base64.b64encode(b).decode()).encode(), None),
}


@pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
@pytest.mark.parametrize(
    "content_type",
    [
        PICKLE,
        "application/json",
        None,
        "text/plain",
        "application/x-protobuf",
        "application/octet-stream",
    ],
)
@pytest.mark.parametrize("wrapping", sorted(WRAPPINGS))
def test_a_malicious_pickle_is_opaque_and_never_loaded(
    tmp_path: Path,
    audit: list[tuple[str, Any]],
    protocol: int,
    content_type: str | None,
    wrapping: str,
) -> None:
    canary = tmp_path / "pwned"
    wrap, encoding = WRAPPINGS[wrapping]
    payload = pickle.dumps(Canary(canary), protocol=protocol)
    decoded = decode_payload(
        wrap(payload),
        content_type=content_type,
        content_encoding=encoding,
        headers={"task": "shop.tasks.evil", "id": "t-9"},
    )
    assert not canary.exists()
    assert [e for e in audit if e[0].startswith("pickle.") or str(canary) in str(e[1])] == []
    assert decoded.kind == "opaque-unsafe"
    assert decoded.data["task"] == "shop.tasks.evil"
    if content_type == PICKLE and wrapping.startswith("base64"):
        # The declared serializer alone makes the (base64) body opaque; it is not looked into.
        assert decoded.data["length"] == len(wrap(payload))
    else:
        assert decoded.data["length"] == len(payload)
        # open pickles as builtins.open or io.open, as _io.open from Python 3.13
        assert set(decoded.data["pickle_globals"]) & {"builtins.open", "io.open", "_io.open"}
    assert any("never loaded" in note for note in decoded.notes)
    json.dumps(decoded.to_json(), allow_nan=False)


def test_pickle_content_type_is_opaque_even_when_the_bytes_are_not_a_pickle() -> None:
    decoded = decode_payload(b"[1, 2]", content_type="application/x-python-serialize")
    assert decoded.kind == "opaque-unsafe"
    assert decoded.data["hex"] == b"[1, 2]".hex()
    assert "content type application/x-python-serialize is an unsafe serializer" in decoded.notes[0]


def test_yaml_with_python_tags_is_opaque_and_plain_yaml_is_text() -> None:
    evil = b"!!python/object/apply:os.system ['touch /tmp/x']\n"
    decoded = decode_payload(evil, content_type="application/x-yaml")
    assert decoded.kind == "opaque-unsafe"
    plain = decode_payload(b"a: 1\nb: [x, y]\n", content_type="application/x-yaml")
    assert (plain.kind, plain.data) == ("text", "a: 1\nb: [x, y]\n")


def test_java_serialized_objects_are_opaque() -> None:
    decoded = decode_payload(b"\xac\xed\x00\x05sr\x00\x11java.util.HashMap", content_type=None)
    assert decoded.kind == "opaque-unsafe"
    assert "Java serialized object" in decoded.notes[0]


def test_text_that_merely_ends_with_a_dot_is_not_taken_for_a_pickle() -> None:
    decoded = decode_payload(b"Card declined by the bank.", content_type="text/plain")
    assert (decoded.kind, decoded.data) == ("text", "Card declined by the bank.")


# Calls that load or run data: none may appear anywhere in the codecs package.
_FORBIDDEN_CALLS = {
    ("pickle", "loads"),
    ("pickle", "load"),
    ("pickle", "Unpickler"),
    ("cPickle", "loads"),
    ("dill", "loads"),
    ("marshal", "loads"),
    ("marshal", "load"),
    ("yaml", "load"),
    ("yaml", "unsafe_load"),
    ("yaml", "full_load"),
    ("shelve", "open"),
    ("jsonpickle", "decode"),
}
_FORBIDDEN_NAMES = {"eval", "exec", "compile", "__import__", "loads", "Unpickler"}
_FORBIDDEN_MODULES = {
    "pickle",
    "cPickle",
    "dill",
    "marshal",
    "shelve",
    "yaml",
    "jsonpickle",
    "_pickle",
}


def _violations(source: str, filename: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names]
            module = node.module if isinstance(node, ast.ImportFrom) else None
            for name in [module, *names]:
                if name and name.split(".")[0] in _FORBIDDEN_MODULES:
                    found.append(f"{filename}:{node.lineno} imports {name}")
        elif isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name) and func.id in _FORBIDDEN_NAMES:
                found.append(f"{filename}:{node.lineno} calls {func.id}")
            if (
                isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name)
                and (func.value.id, func.attr) in _FORBIDDEN_CALLS
            ):
                found.append(f"{filename}:{node.lineno} calls {func.value.id}.{func.attr}")
    return found


def test_the_checker_would_catch_a_loader() -> None:
    assert _violations("import pickle\npickle.loads(b'')\neval('1')\n", "x.py") == [
        "x.py:1 imports pickle",
        "x.py:2 calls pickle.loads",
        "x.py:3 calls eval",
    ]


def test_no_loader_or_evaluator_is_reachable_from_the_codecs_package() -> None:
    files = sorted(CODECS_DIR.glob("*.py"))
    assert len(files) > 5
    problems = [v for path in files for v in _violations(path.read_text(), path.name)]
    assert problems == []
