"""The functions celery_dlx must never replace (DESIGN.md guarantee 9), described so that one
process's can be compared with a fresh interpreter's.

Imports nothing of celery_dlx: a fresh ``python -c`` imports this module and describes the
originals, a worker process describes what it holds after celery_dlx ran there.
"""

from __future__ import annotations

import hashlib
import importlib
from typing import Any

#: Description of a name that does not exist in this process (e.g. another Python version's).
MISSING = None

#: ``module:attribute path`` of each watched function; ``[n]`` indexes a mapping.
WATCHED = (
    "traceback:_get_code_position",
    "traceback:_extract_caret_anchors_from_line_segment",
    "billiard.einfo:_Code.__init__",
    "billiard.einfo:_Code.__reduce__",
    "billiard.einfo:_Frame.__init__",
    "billiard.einfo:Traceback.__init__",
    "celery.backends.base:Backend._get_result_meta",
    "amqp.serialization:PROPERTY_CLASSES[60]",
    "amqp.serialization:pstr_t",
)


def result_settings(uid: str, redis_url: str) -> dict[str, Any]:
    """Result backend settings of the worker's app (and of the test's copy, which sends tasks)."""
    return {
        "task_ignore_result": False,
        "result_backend": redis_url,
        "result_backend_transport_options": {"global_keyprefix": "{test-" + uid + "}:"},
    }


def resolve(path: str) -> Any:
    """The object at ``module:attribute path``, or :data:`MISSING`."""
    module_name, _, rest = path.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in rest.split("."):
        name, _, index = part.partition("[")
        obj = getattr(obj, name, MISSING)
        if obj is MISSING:
            return MISSING
        if index:
            obj = obj.get(int(index.rstrip("]")), MISSING)
    return obj


def describe(obj: Any) -> dict[str, str] | None:
    """Who made ``obj``: its type, qualified name and code (file, first line, bytecode hash).

    A replacement differs in at least one of them, even one that copies the name of what it
    wraps (``functools.wraps``, ``lru_cache``).
    """
    if obj is MISSING:
        return None
    func = getattr(obj, "__func__", obj)
    code = getattr(func, "__code__", None)
    return {
        "type": type(func).__qualname__,
        "name": f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', repr(func))}",
        "code": "-"
        if code is None
        else f"{code.co_filename}:{code.co_firstlineno}:"
        f"{hashlib.sha256(code.co_code).hexdigest()[:16]}",
    }


def snapshot(backend_class: str) -> dict[str, Any]:
    """Descriptions of :data:`WATCHED` and of ``backend_class``'s ``_get_result_meta``
    (``module:class``, the class of the app's result backend)."""
    watched = {path: describe(resolve(path)) for path in WATCHED}
    watched["result backend class:_get_result_meta"] = describe(
        resolve(f"{backend_class}._get_result_meta")
    )
    return watched
