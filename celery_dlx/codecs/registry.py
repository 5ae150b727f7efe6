"""Protobuf types known for decoding: from descriptor sets and from modules of generated classes.

``google.protobuf`` is imported only when a registry is filled (celery_dlx works without the
``protobuf`` extra; filling a registry without it raises a :class:`ConfigurationError`).
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from celery_dlx.codecs.shapes import Shape
from celery_dlx.errors import ConfigurationError

if TYPE_CHECKING:
    from google.protobuf.message import Message

#: Where to get protobuf support.
INSTALL_HINT = "protobuf support needs `pip install celery-dlx[protobuf]`"
SETS_SETTING = "dlx_protobuf_descriptor_sets"
MODULES_SETTING = "dlx_protobuf_modules"
# Types of these packages (descriptor.proto, well-known types) fit far too many payloads to be
# offered as candidates; they still decode when used inside a registered type.
_NOT_CANDIDATES = ("google.protobuf.",)


def protobuf_available() -> bool:
    """True when ``google.protobuf`` can be imported."""
    try:
        importlib.import_module("google.protobuf.message")
    except ImportError:
        return False
    return True


def _protobuf(setting: str) -> Any:
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise ConfigurationError(f"{setting} is set but {INSTALL_HINT}") from None
    return descriptor_pb2, descriptor_pool, message_factory


class ProtobufRegistry:
    """Message types that :func:`~celery_dlx.codecs.decode_payload` tries on a protobuf body;
    descriptor sets go into a private pool (no generated code, no clash with the app's pool)."""

    def __init__(self) -> None:
        self._pool: Any = None
        self._classes: dict[str, type[Message]] = {}
        self._sources: list[str] = []
        #: Per-type data the decoder derives from descriptors, built once per registry.
        self.shapes: dict[str, Shape] = {}

    @property
    def type_names(self) -> tuple[str, ...]:
        """Full names of the candidate types, sorted."""
        return tuple(sorted(self._classes))

    @property
    def sources(self) -> tuple[str, ...]:
        """Descriptor set paths and module names the types came from."""
        return tuple(self._sources)

    def __len__(self) -> int:
        return len(self._classes)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def message_class(self, name: str) -> type[Message] | None:
        """The message class of type ``name``, or None when it is not registered."""
        return self._classes.get(name)

    def candidates(self) -> Iterator[tuple[str, type[Message]]]:
        """``(full name, message class)`` of every candidate type, sorted by name."""
        return iter(sorted(self._classes.items()))

    def add_descriptor_set(self, source: str | os.PathLike[str] | bytes) -> list[str]:
        """Register every message type of a ``FileDescriptorSet``: a path to the file written by
        ``protoc --descriptor_set_out=FILE --include_imports``, or its bytes. Returns the full
        names of the types added.

        Raises:
            ConfigurationError: protobuf is not installed, or the file is missing, unreadable or
                not a descriptor set (the message names ``dlx_protobuf_descriptor_sets``).
        """
        descriptor_pb2, descriptor_pool, message_factory = _protobuf(SETS_SETTING)
        label = "<bytes>" if isinstance(source, bytes) else os.fspath(source)
        raw = source if isinstance(source, bytes) else _read(label)
        try:
            files = descriptor_pb2.FileDescriptorSet.FromString(raw).file
        except Exception as exc:  # DecodeError, or anything the parser raises on garbage
            raise ConfigurationError(
                f"{SETS_SETTING}: {label} is not a FileDescriptorSet ({exc}); write one with "
                "`protoc --descriptor_set_out=FILE --include_imports ...`"
            ) from None
        if self._pool is None:
            self._pool = descriptor_pool.DescriptorPool()
        self._add_files(list(files), label)
        found = [self._pool.FindFileByName(f.name).message_types_by_name.values() for f in files]
        return self._register([d for types in found for d in types], message_factory, label)

    def _add_files(self, files: list[Any], label: str) -> None:
        # --include_imports writes dependencies first, but hand-made sets may not: add what is
        # ready, round after round.
        pending = [f for f in files if not self._has_file(f.name)]
        while pending:
            ready = [f for f in pending if all(self._has_file(d) for d in f.dependency)]
            if not ready:
                missing = sorted(
                    {d for f in pending for d in f.dependency if not self._has_file(d)}
                )
                raise ConfigurationError(
                    f"{SETS_SETTING}: {label} lacks imported files {', '.join(missing)}; "
                    "write it with `protoc --include_imports`"
                )
            for file_proto in ready:
                try:
                    self._pool.Add(file_proto)
                except Exception as exc:  # TypeError on conflicting definitions, and others
                    raise ConfigurationError(
                        f"{SETS_SETTING}: {label}: cannot load {file_proto.name}: {exc}"
                    ) from None
            pending = [f for f in pending if f not in ready]

    def _has_file(self, name: str) -> bool:
        try:
            self._pool.FindFileByName(name)
        except KeyError:
            return False
        return True

    def add_module(self, name: str) -> list[str]:
        """Register the message classes of a module of generated code (``*_pb2``): its file
        descriptor's types and any message class it holds (a package re-exporting classes from
        several ``_pb2`` modules works too).

        Raises:
            ConfigurationError: protobuf is not installed, the module cannot be imported, or it
                holds no message type (the message names ``dlx_protobuf_modules``).
        """
        _descriptor_pb2, _pool, message_factory = _protobuf(MODULES_SETTING)
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # an import runs arbitrary module code; report whatever it raised
            raise ConfigurationError(f"{MODULES_SETTING}: cannot import {name!r}: {exc}") from None
        file_descriptor = getattr(module, "DESCRIPTOR", None)
        roots = list(getattr(file_descriptor, "message_types_by_name", {}).values())
        for value in vars(module).values():
            descriptor = getattr(value, "DESCRIPTOR", None)
            if isinstance(value, type) and hasattr(descriptor, "fields_by_number"):
                roots.append(descriptor)
        if not roots:
            raise ConfigurationError(
                f"{MODULES_SETTING}: module {name!r} holds no protobuf message type"
            )
        return self._register(roots, message_factory, name)

    def _register(self, roots: list[Any], message_factory: Any, source: str) -> list[str]:
        """Register the message types ``roots`` and the types nested in them; the names added."""
        added = []
        stack = roots
        while stack:
            descriptor = stack.pop()
            stack.extend(descriptor.nested_types)
            name = descriptor.full_name
            if name in self._classes or name.startswith(_NOT_CANDIDATES):
                continue
            if not descriptor.GetOptions().map_entry:
                self._classes[name] = message_factory.GetMessageClass(descriptor)
                added.append(name)
        self._sources.append(source)
        return added


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigurationError(
            f"{SETS_SETTING}: cannot read {path}: {exc.strerror or exc}"
        ) from None


class ProtobufSettings(Protocol):
    """The two settings :func:`registry_from_config` reads, as a
    :class:`~celery_dlx.policy.config.DLXConfig` has them."""

    @property
    def protobuf_descriptor_sets(self) -> Sequence[str]: ...

    @property
    def protobuf_modules(self) -> Sequence[str]: ...


def registry_from_config(
    config: ProtobufSettings | Mapping[str, Iterable[str] | None],
) -> ProtobufRegistry:
    """The registry described by ``dlx_protobuf_descriptor_sets`` and ``dlx_protobuf_modules``
    of ``config`` (a :class:`~celery_dlx.policy.config.DLXConfig`, or a mapping of the two).

    Raises:
        ConfigurationError: a descriptor set or module cannot be loaded, or protobuf is missing
            while one of the settings is set.
    """
    if isinstance(config, Mapping):
        sets = config.get(SETS_SETTING) or []
        modules = config.get(MODULES_SETTING) or []
    else:
        sets = config.protobuf_descriptor_sets
        modules = config.protobuf_modules
    registry = ProtobufRegistry()
    for path in sets:
        registry.add_descriptor_set(path)
    for name in modules:
        registry.add_module(name)
    return registry
