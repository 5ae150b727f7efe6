"""Others' private internals are used in the compat module only (DESIGN.md, guarantee 12).

Scans every module of ``celery_dlx``, ``celery_dlx_console``, ``celery_dlx_edit`` and
``celery_dlx_spark`` for uses of names that Celery, kombu, py-amqp, billiard, vine, redis-py,
sentry-sdk, pyspark and starlette do not offer as their public API, and fails with each use
outside the compat module as ``file:line: rule: name``. The compat modules are
``celery_dlx/compat/`` and ``celery_dlx_spark/compat.py`` (the Spark job imports nothing of
``celery_dlx``, so it keeps its own); the console and payload editing may import only celery_dlx's public API, so one they needed
would be their own ``compat.py`` (they need none).

What counts (each rule is a function below, each is shown to find what it looks for by
``test_each_rule_finds_its_kind``):

- ``private-import``: importing a module or a name starting with ``_`` from one of those projects.
- ``internal-module``: importing from one of :data:`INTERNAL_MODULES`, modules their projects do
  not document for use (a copy of, or a subclass relying on, their internals).
- ``private-attribute``: ``x._name`` (not a dunder), or ``getattr``/``hasattr``/``setattr``/
  ``delattr`` of ``"_name"``, whose receiver is not ``self``/``cls``, unless ``_name`` is a
  celery_dlx-owned name listed in :data:`OWN_PRIVATE_NAMES` (each checked to be defined by
  celery_dlx); and ``self._name``/``cls._name``/``super()._name`` in a class of celery_dlx whose
  foreign base class defines ``_name`` (``inherited-private``, resolved by importing the class).
- ``foreign-dunder``: a dunder that is not Python's but another project's (:data:`FOREIGN_DUNDERS`),
  read on another object or defined (a method or property of that name).
- ``undocumented-name``: a public-looking attribute another project does not document
  (:data:`UNDOCUMENTED_NAMES`), on any receiver but ``self``.
- ``dict-shadow``: ``x.__dict__`` used to read or write a key that is not celery_dlx's own
  (own keys start with ``_celery_dlx``, ``celery_dlx``, ``_dlx`` or ``dlx_``; Python's own dunders
  are not another project's either), or its whole dict read on a receiver that is not a
  celery_dlx object, or on ``self`` in a class with a foreign base. :data:`OWN_DICT_RECEIVERS`
  lists the receivers that are celery_dlx's, with the reason.
- ``stand-in``: ``keyword=cast(ForeignClass, x)`` in a call: an object of celery_dlx's passed to
  another project's API in place of one of its classes (a duck type relies on what that project
  calls on it, which it does not document).
- ``override``: a class of celery_dlx (resolved by importing it) that defines a private name of a
  foreign base class (``_name`` or one of :data:`FOREIGN_DUNDERS`), or a public method of a
  foreign class that its project does not offer for overriding (:data:`DOCUMENTED_OVERRIDES`
  lists what each does offer).
- ``thread-ack``: Celery's ``Request.acknowledge``/``reject`` called in a module that runs a
  thread of its own: Celery schedules the ack with kombu's ``Hub.call_soon``, which its docs do
  not offer to other threads.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The packages scanned, and the compat module of each (a folder or a file).
PACKAGES = {
    "celery_dlx": "celery_dlx/compat",
    "celery_dlx_console": "celery_dlx_console/compat.py",
    "celery_dlx_edit": "celery_dlx_edit/compat.py",
    "celery_dlx_spark": "celery_dlx_spark/compat.py",
}
#: Other projects whose private names are fenced in the compat module.
PROJECTS = frozenset(
    {"celery", "kombu", "amqp", "billiard", "vine", "redis", "sentry_sdk", "pyspark", "starlette"}
)

#: Modules of those projects that their docs do not offer for use, with the reason.
INTERNAL_MODULES = {
    "celery.app.trace": "Celery's tracer (build_tracer, trace_ok_t, TraceInfo): no public API",
    "celery.worker.strategy": "the signature of a strategy's message handler is not documented",
    "amqp.method_framing": "py-amqp's frame handler",
    "amqp.serialization": "py-amqp's wire codec",
    "amqp.transport": "py-amqp's socket transports (TCPTransport's read loop)",
    "kombu.asynchronous.hub": "kombu's event loop as the worker runs it",
}

#: Dunder-shaped names that belong to another project, not to Python.
FOREIGN_DUNDERS = {
    "__trace__": "Celery's tracer of a task, set by the worker (celery.app.trace.build_tracer)",
}

#: Public-looking attributes of other projects that their docs do not offer, with the owner.
UNDOCUMENTED_NAMES = {
    "request_dict": "celery.worker.request.Request: the message's headers as Celery keeps them",
    "pool_cls": "celery.worker.WorkController: the pool class the worker chose",
    "task_consumer": "celery.worker.consumer.Consumer: the kombu Consumer of the task queues",
    "reject_log_error": "kombu.message.Message: what Celery's consumer rejects with",
    "type_to_name": "kombu.serialization.SerializerRegistry: content type to serializer",
    "global_event_processors": "sentry_sdk.scope: the process's event processors",
    "on_inbound_frame": "amqp.Connection: its frame handler",
    "bytes_recv": "amqp.Connection: frames received (heartbeat accounting)",
    "inbound_body": "amqp.Message: py-amqp's framing of a body",
    "frame_method": "amqp.Message: py-amqp's framing of a method",
    "frame_args": "amqp.Message: py-amqp's framing of a method",
    "raise_on_initial_eintr": "amqp.transport: how a timed-out first read is reported",
    "nodes_manager": "redis.cluster.RedisCluster: its slot map",
}

#: Public methods of foreign classes that their projects offer for overriding, per class
#: (``module:qualname``). A class not listed here may have any public method overridden; one
#: listed only those named (private names never).
DOCUMENTED_OVERRIDES: dict[str, frozenset[str]] = {
    # The worker_consumer setting replaces the class; none of its methods is a documented hook.
    "celery.worker.consumer.consumer:Consumer": frozenset(),
    # Celery's "Requests and custom requests" shows on_timeout and on_failure.
    "celery.worker.request:Request": frozenset(
        {"on_timeout", "on_failure", "on_success", "on_retry", "on_accepted"}
    ),
    "amqp.basic_message:Message": frozenset(),
    "amqp.transport:TCPTransport": frozenset(),
    "amqp.transport:_AbstractTransport": frozenset(),
    # py-amqp's Connection builds its transport with Connection.Transport (not a documented hook).
    "amqp.connection:Connection": frozenset(),
}

#: Python's own special names (never another project's).
_PYTHON_DUNDERS = """
    __init__ __new__ __call__ __repr__ __str__ __eq__ __hash__ __getattr__ __getattribute__
    __setattr__ __delattr__ __getstate__ __setstate__ __reduce__ __reduce_ex__ __copy__
    __deepcopy__ __iter__ __len__ __contains__ __getitem__ __setitem__ __delitem__ __enter__
    __exit__ __bool__ __doc__ __module__ __qualname__ __dict__ __weakref__ __slots__
    __annotations__ __orig_bases__ __parameters__ __class_getitem__ __init_subclass__
    __set_name__ __missing__ __firstlineno__ __static_attributes__ __type_params__ __lt__ __le__
    __gt__ __ge__ __ne__ __await__ __aiter__ __anext__ __aenter__ __aexit__ __match_args__
    __dataclass_fields__ __dataclass_params__ __post_init__ __abstractmethods__ __json__
    __protocol_attrs__
"""
PYTHON_DUNDERS = frozenset(_PYTHON_DUNDERS.split())

#: celery_dlx's own private names that its code reads on an object other than ``self`` (each
#: must be defined by celery_dlx: checked by ``test_allow_lists_are_current``).
OWN_PRIVATE_NAMES = {
    "_dlx_enabled_for": "DLXTask._dlx_enabled_for, read on the current task (integrations/logs)",
    "_dlx_options_cache": "a DLX task class's cache of its resolved options (worker/task)",
    "_dlx_shipped": "celery_dlx_spark's mark on a SparkContext that its modules were shipped",
    "_exit": "os._exit, documented by Python (faults: kill the process at a fault point)",
}

#: ``module:receiver`` whose ``__dict__`` celery_dlx reads or writes as its own, with the reason.
OWN_DICT_RECEIVERS = {
    "celery_dlx.cli.ops:result": "ExportResult, a dataclass of celery_dlx_spark.launch",
    "celery_dlx.cli.ops:done": "Migration, a dataclass of celery_dlx.store.migrate",
    "celery_dlx.cli.ops:graves": "Migration, a dataclass of celery_dlx.store.migrate",
    "celery_dlx.message.dictinit:cls": "a dataclass of celery_dlx being given its __init__",
    "celery_dlx.outages:owner": (
        "outage_log(owner, attr): a Runtime (celery_dlx's), or an app under _celery_dlx_* keys"
    ),
}

#: Prefixes of the keys celery_dlx keeps in other objects' ``__dict__`` (its own attributes).
OWN_KEY_PREFIXES = ("_celery_dlx", "celery_dlx", "_dlx", "dlx_")

GETATTR_FAMILY = frozenset({"getattr", "hasattr", "setattr", "delattr"})


@dataclass(frozen=True, order=True)
class Hit:
    path: str
    line: int
    rule: str
    name: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.name}"


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _foreign(module: str | None) -> bool:
    return bool(module) and module.split(".")[0] in PROJECTS  # type: ignore[union-attr]


def _internal(module: str) -> str | None:
    for internal in INTERNAL_MODULES:
        if module == internal or module.startswith(internal + "."):
            return internal
    return None


def _receiver(node: ast.expr) -> str:
    return ast.unparse(node)


class _Scanner(ast.NodeVisitor):
    """The static rules over one module's source."""

    def __init__(self, path: str, module: str, constants: dict[str, str]) -> None:
        self.path = path
        self.module = module
        self.constants = constants
        self.hits: list[Hit] = []
        self.imports: dict[str, str] = {}  # local name -> "module:name" or "module"
        self.classes: list[ast.ClassDef] = []
        self.runs_thread = False

    def hit(self, node: ast.AST, rule: str, name: str) -> None:
        self.hits.append(Hit(self.path, getattr(node, "lineno", 0), rule, name))

    # -- imports --------------------------------------------------------------------------------

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self.imports[alias.asname or alias.name.split(".")[0]] = (
                alias.name if alias.asname else alias.name.split(".")[0]
            )
            if _foreign(alias.name):
                if any(_is_private(part) for part in alias.name.split(".")):
                    self.hit(node, "private-import", alias.name)
                elif _internal(alias.name) is not None:
                    self.hit(node, "internal-module", alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        for alias in node.names:
            self.imports[alias.asname or alias.name] = f"{module}:{alias.name}"
        if not _foreign(module):
            return
        for alias in node.names:
            full = f"{module}.{alias.name}"
            if any(_is_private(part) for part in module.split(".")) or _is_private(alias.name):
                self.hit(node, "private-import", full)
            elif _internal(module) is not None or _internal(full) is not None:
                self.hit(node, "internal-module", full)

    # -- attributes -----------------------------------------------------------------------------

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node)
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in FOREIGN_DUNDERS:
            self.hit(node, "foreign-dunder", f"def {node.name}")
        self.generic_visit(node)

    def visit_keyword(self, node: ast.keyword) -> None:
        value = node.value
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "cast"
            and value.args
        ):
            target = ast.unparse(value.args[0]).strip("'\"")
            origin = self.imports.get(target.split(".")[0], "")
            if _foreign(origin.split(":")[0]):
                self.hit(node.value, "stand-in", f"{node.arg}=cast({target}, ...)")
        self.generic_visit(node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        receiver = _receiver(node.value)
        own_receiver = receiver in ("self", "cls")
        if _is_private(node.attr) and not own_receiver and node.attr not in OWN_PRIVATE_NAMES:
            self.hit(node, "private-attribute", f"{receiver}.{node.attr}")
        if node.attr in FOREIGN_DUNDERS and not own_receiver:
            self.hit(node, "foreign-dunder", f"{receiver}.{node.attr}")
        if node.attr in UNDOCUMENTED_NAMES and receiver != "self":
            self.hit(node, "undocumented-name", f"{receiver}.{node.attr}")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if (
            isinstance(func, ast.Name)
            and func.id in GETATTR_FAMILY
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            name, receiver = node.args[1].value, _receiver(node.args[0])
            own = receiver in ("self", "cls") or name in OWN_PRIVATE_NAMES
            if _is_private(name) and not own:
                self.hit(node, "private-attribute", f"{func.id}({receiver}, {name!r})")
            if name in UNDOCUMENTED_NAMES and receiver != "self":
                self.hit(node, "undocumented-name", f"{func.id}({receiver}, {name!r})")
            if name in FOREIGN_DUNDERS and receiver not in ("self", "cls"):
                self.hit(node, "foreign-dunder", f"{func.id}({receiver}, {name!r})")
        if isinstance(func, ast.Attribute) and func.attr == "Thread":
            self.runs_thread = True
        self.generic_visit(node)


def _dict_uses(tree: ast.Module) -> Iterator[tuple[ast.Attribute, ast.expr | None, str]]:
    """Each ``x.__dict__`` of ``tree``: the node, the key it touches (None: the whole dict), and
    the name of the class it is in ("" outside a class)."""
    parents: dict[ast.AST, ast.AST] = {}
    classes: dict[ast.AST, str] = {}
    for node in ast.walk(tree):
        for child in ast.iter_child_nodes(node):
            parents[child] = node
            if isinstance(node, ast.ClassDef):
                classes[child] = node.name
            elif node in classes:
                classes[child] = classes[node]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr == "__dict__":
            parent = parents.get(node)
            key: ast.expr | None = None
            if isinstance(parent, ast.Subscript) and parent.value is node:
                key = parent.slice
            elif isinstance(parent, ast.Compare) and node in parent.comparators:
                key = parent.left
            elif isinstance(parent, ast.Attribute) and parent.value is node:
                call = parents.get(parent)
                if (
                    parent.attr in ("get", "pop", "setdefault")
                    and isinstance(call, ast.Call)
                    and call.args
                ):
                    key = call.args[0]
            yield node, key, classes.get(node, "")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "__getattribute__"
            and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "__dict__"
        ):
            parent = parents.get(node)
            call = parents.get(parent) if isinstance(parent, ast.Attribute) else None
            key = call.args[0] if isinstance(call, ast.Call) and call.args else None
            fake = ast.Attribute(value=node.args[0], attr="__dict__", lineno=node.lineno)
            yield fake, key, classes.get(node, "")


def _key_value(key: ast.expr, constants: dict[str, str]) -> str | None:
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    if isinstance(key, ast.Name):
        return constants.get(key.id)
    return None


def _string_constants(trees: dict[str, ast.Module]) -> dict[str, str]:
    """Module-level ``NAME = "text"`` of every scanned module (keys reach ``__dict__`` so)."""
    found: dict[str, str] = {}
    for tree in trees.values():
        for node in tree.body:
            if (
                isinstance(node, ast.Assign | ast.AnnAssign)
                and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)
            ):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        found[target.id] = node.value.value
    return found


# -- runtime rules: what a class of celery_dlx inherits from another project --------------------


def _foreign_bases(cls: type) -> list[type]:
    return [k for k in cls.__mro__[1:] if _foreign(getattr(k, "__module__", None))]


def _instance_names(klass: type) -> set[str]:
    """Attributes a foreign class sets on its instances (``self.x = ...`` in its source)."""
    try:
        source = inspect.getsource(klass)
    except (OSError, TypeError):
        return set()
    return set(re.findall(r"self\.(\w+)\s*=", source))


def _defined_by(bases: list[type], name: str) -> type | None:
    for base in bases:
        if name in vars(base) or name in _instance_names(base):
            return base
    return None


def _class_rules(path: str, module: str, tree: ast.Module) -> list[Hit]:
    """``override`` and ``inherited-private`` for each class of
    ``module`` with a foreign base (imported, so its bases are what Python resolves)."""
    hits: list[Hit] = []
    if not any(isinstance(n, ast.ClassDef) and n.bases for n in ast.walk(tree)):
        return hits  # nothing inherited (and ``__main__`` modules are not imported)
    imported = importlib.import_module(module)
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        cls = getattr(imported, node.name, None)
        if not isinstance(cls, type) or cls.__module__ != module:
            continue
        bases = _foreign_bases(cls)
        if not bases:
            continue
        lines = {
            item.name: item.lineno
            for item in node.body
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        for item in node.body:
            for target in (
                item.targets
                if isinstance(item, ast.Assign)
                else [item.target]
                if isinstance(item, ast.AnnAssign)
                else []
            ):
                if isinstance(target, ast.Name):
                    lines.setdefault(target.id, item.lineno)
        for name in vars(cls):
            owner = _defined_by(bases, name)
            if owner is None:
                continue
            where = f"{owner.__module__}:{owner.__qualname__}"
            line = lines.get(name, node.lineno)
            if _is_private(name) or name in FOREIGN_DUNDERS:
                hits.append(Hit(path, line, "override", f"{node.name}.{name} ({where})"))
            elif name in PYTHON_DUNDERS or name.startswith("__"):
                continue
            elif where in DOCUMENTED_OVERRIDES and name not in DOCUMENTED_OVERRIDES[where]:
                hits.append(Hit(path, line, "override", f"{node.name}.{name} ({where})"))
        for sub in ast.walk(node):
            if isinstance(sub, ast.Attribute) and _is_private(sub.attr):
                receiver = _receiver(sub.value)
                if receiver not in ("self", "cls", "super()"):
                    continue
                owner = _defined_by(bases, sub.attr)
                if owner is not None:
                    hits.append(
                        Hit(path, sub.lineno, "inherited-private", f"{receiver}.{sub.attr}")
                    )
    return hits


def _dict_rules(
    path: str, module: str, tree: ast.Module, constants: dict[str, str], foreign_classes: set[str]
) -> list[Hit]:
    hits: list[Hit] = []
    for node, key, class_name in _dict_uses(tree):
        receiver = _receiver(node.value)
        if f"{module}:{receiver}" in OWN_DICT_RECEIVERS:
            continue
        if key is not None:
            value = _key_value(key, constants)
            if value in PYTHON_DUNDERS:
                continue
            if value is None or not value.startswith(OWN_KEY_PREFIXES):
                shown = value if value is not None else ast.unparse(key)
                hits.append(
                    Hit(path, node.lineno, "dict-shadow", f"{receiver}.__dict__[{shown!r}]")
                )
            continue
        if receiver in ("self", "cls"):
            if class_name in foreign_classes:
                hits.append(Hit(path, node.lineno, "dict-shadow", f"{receiver}.__dict__"))
            continue
        hits.append(Hit(path, node.lineno, "dict-shadow", f"{receiver}.__dict__"))
    return hits


def _thread_acks(path: str, tree: ast.Module, runs_thread: bool) -> list[Hit]:
    if not runs_thread:
        return []
    return [
        Hit(path, node.lineno, "thread-ack", ast.unparse(node.func))
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("acknowledge", "reject")
        and _receiver(node.func.value) not in ("self", "super()")
    ]


def _modules() -> Iterator[tuple[str, str, Path]]:
    for package in PACKAGES:
        for file in sorted((ROOT / package).rglob("*.py")):
            rel = file.relative_to(ROOT).as_posix()
            module = rel[: -len(".py")].replace("/", ".").removesuffix(".__init__")
            yield rel, module, file


def in_compat(path: str) -> bool:
    return any(path == c or path.startswith(c + "/") for c in PACKAGES.values())


def scan(sources: dict[str, tuple[str, str]], *, runtime: bool = True) -> list[Hit]:
    """Every private-name use in ``sources`` (``path: (module, source)``)."""
    trees = {path: ast.parse(source, path) for path, (_, source) in sources.items()}
    constants = _string_constants(trees)
    hits: list[Hit] = []
    for path, (module, _) in sources.items():
        tree = trees[path]
        scanner = _Scanner(path, module, constants)
        scanner.visit(tree)
        hits += scanner.hits
        foreign_classes: set[str] = set()
        if runtime:
            hits += _class_rules(path, module, tree)
            if any(c.bases for c in scanner.classes):
                imported = importlib.import_module(module)
                foreign_classes = {
                    c.name
                    for c in scanner.classes
                    if isinstance(getattr(imported, c.name, None), type)
                    and _foreign_bases(getattr(imported, c.name))
                }
        hits += _dict_rules(path, module, tree, constants, foreign_classes)
        hits += _thread_acks(path, tree, scanner.runs_thread)
    return sorted(set(hits))


@pytest.fixture(scope="module")
def hits() -> list[Hit]:
    sources = {rel: (module, file.read_text()) for rel, module, file in _modules()}
    return scan(sources)


def test_no_private_name_of_another_project_outside_the_compat_module(hits: list[Hit]) -> None:
    outside = [str(h) for h in hits if not in_compat(h.path)]
    assert not outside, (
        f"{len(outside)} use(s) of another project's private names outside the compat module "
        "(move each into celery_dlx/compat/, with its reason, the versions checked and a "
        "canary test):\n" + "\n".join(outside)
    )


def test_the_compat_module_is_where_the_private_names_are(hits: list[Hit]) -> None:
    # The scan sees the compat module's own uses: a scan finding nothing anywhere is broken.
    assert any(in_compat(h.path) for h in hits)


def test_allow_lists_are_current() -> None:
    sources = "\n".join(file.read_text() for _, _, file in _modules())
    for name in OWN_PRIVATE_NAMES:
        if name == "_exit":
            continue
        assert re.search(rf"\b{name}\b\s*[=:(]", sources), f"{name} is no longer celery_dlx's"
    for entry in OWN_DICT_RECEIVERS:
        module, receiver = entry.split(":")
        path = ROOT / (module.replace(".", "/") + ".py")
        assert f"{receiver}.__dict__" in path.read_text(), f"{entry} reads no __dict__ any more"


SNIPPET = """
import threading
from typing import cast
from redis.connection import ConnectionPool
from celery._state import get_current_app
from kombu import _private
from amqp.method_framing import frame_handler
from celery.app.trace import build_tracer

KEY = "acknowledge"

def f(consumer, request, app, spark, task, node):
    consumer._active_tags
    getattr(consumer, "_active_tags", None)
    request.request_dict["x"] = 1
    request.__dict__[KEY] = None
    request.__dict__["_celery_dlx_ok"] = None
    "Task" in app.__dict__
    spark.sparkContext._jvm
    task.__trace__
    app.__dict__.items()
    threading.Thread(target=f)
    request.acknowledge()
    Redis(connection_pool=cast(ConnectionPool, held))

class Hooked:
    @property
    def __trace__(self):
        return None
"""


def test_each_rule_finds_its_kind() -> None:
    found = scan({"celery_dlx/snippet.py": ("celery_dlx.snippet", SNIPPET)}, runtime=False)
    shown = {(h.rule, h.name) for h in found}
    assert shown == {
        ("private-import", "celery._state.get_current_app"),
        ("private-import", "kombu._private"),
        ("internal-module", "amqp.method_framing.frame_handler"),
        ("internal-module", "celery.app.trace.build_tracer"),
        ("private-attribute", "consumer._active_tags"),
        ("private-attribute", "getattr(consumer, '_active_tags')"),
        ("undocumented-name", "request.request_dict"),
        ("dict-shadow", "request.__dict__['acknowledge']"),
        ("dict-shadow", "app.__dict__['Task']"),
        ("dict-shadow", "app.__dict__"),
        ("private-attribute", "spark.sparkContext._jvm"),
        ("foreign-dunder", "task.__trace__"),
        ("thread-ack", "request.acknowledge"),
        ("stand-in", "connection_pool=cast(ConnectionPool, ...)"),
        ("foreign-dunder", "def __trace__"),
    }
    assert not in_compat("celery_dlx/snippet.py")
    assert in_compat("celery_dlx/compat/celery.py") and in_compat("celery_dlx_spark/compat.py")


def test_the_class_rules_resolve_foreign_bases() -> None:
    """Overrides of Celery's Consumer and Request hooks and py-amqp's privates are found by
    importing the class (this test module's own classes stand in for celery_dlx's)."""
    tree = ast.parse(inspect.getsource(_Fixtures))
    hits = _class_rules("tests/unit/x.py", __name__, tree)
    names = {h.name.split(" ")[0] for h in hits}
    assert {
        "ConsumerFixture.on_unknown_message",
        "RequestFixture.acknowledge",
        "TransportFixture._setup_transport",
        "TransportFixture._read",
        "TaskFixture.__trace__",
        "super()._setup_transport",
    } <= names
    assert "RequestFixture.on_failure" not in names and "TaskFixture.run" not in names


from amqp.transport import TCPTransport  # noqa: E402  (fixtures of the class rules)
from celery import Task  # noqa: E402
from celery.worker.consumer import Consumer  # noqa: E402
from celery.worker.request import Request  # noqa: E402


class _Fixtures:
    class ConsumerFixture(Consumer):
        def on_unknown_message(self, body: object, message: object) -> None: ...

    class RequestFixture(Request):
        def acknowledge(self) -> None: ...

        def on_failure(self, *args: object, **kwargs: object) -> None: ...

    class TransportFixture(TCPTransport):
        def _setup_transport(self) -> None:
            super()._setup_transport()  # type: ignore[misc]

        def _read(self, n: int, initial: bool = False) -> bytes:
            return b""

    class TaskFixture(Task):  # type: ignore[type-arg]
        __trace__ = None

        def run(self) -> None: ...


ConsumerFixture = _Fixtures.ConsumerFixture
RequestFixture = _Fixtures.RequestFixture
TransportFixture = _Fixtures.TransportFixture
TaskFixture = _Fixtures.TaskFixture
