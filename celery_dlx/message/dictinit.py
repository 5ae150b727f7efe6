"""A faster ``__init__`` for the frozen dataclasses made once or more per message: the generated
one sets each field with ``object.__setattr__``, one call per field; :func:`dict_init`'s fills
``__dict__`` in one ``dict.update``, with the same signature, still frozen afterwards.

Counted gain (a speed trick stays where it saves 5% of its path): a whole P6 dead letter in a DLX
service process (``benchmarks/p6_cpu.py --instructions 300,1300``) takes 903,418 instructions
with it and 962,509 with the dataclasses' own ``__init__`` (commit 61d8a10 against 0c23bad):
6.1% of it. Its own work without I/O (``benchmarks/tricks_cpu.py --part all``): 601,413 against
659,401 (8.8%); reading and deciding it (``--part read``): 179,362 against 226,645 (21%).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, TypeVar

T = TypeVar("T")

#: Stands for "not given" where a field's default is made by its factory.
_FACTORY = object()


def dict_init(cls: type[T]) -> type[T]:
    """Replace the ``__init__`` of the frozen dataclass ``cls`` by one that fills ``__dict__``
    (apply it above ``@dataclass(frozen=True)``).

    Raises:
        TypeError: ``cls`` is not a frozen dataclass, or uses what this ``__init__`` would not do
            alike (``__post_init__``, ``InitVar``, ``init=False`` fields, ``__slots__``).
    """
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen:
        raise TypeError(f"dict_init: {cls.__name__} is not a frozen dataclass")
    if hasattr(cls, "__post_init__") or "__slots__" in cls.__dict__:
        raise TypeError(f"dict_init: {cls.__name__} has __post_init__ or __slots__")
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    taken = [name for name in inspect.signature(cls.__init__).parameters][1:]
    if taken != [f.name for f in fields]:
        raise TypeError(f"dict_init: {cls.__name__} has InitVar or init=False fields")
    namespace: dict[str, Any] = {"_FACTORY": _FACTORY}
    positional: list[str] = []
    keyword: list[str] = []
    values: list[str] = []
    for f in fields:
        value = f.name
        if f.default is not dataclasses.MISSING:
            namespace[f"_default_{f.name}"] = f.default
            param = f"{f.name}=_default_{f.name}"
        elif f.default_factory is not dataclasses.MISSING:
            namespace[f"_factory_{f.name}"] = f.default_factory
            param = f"{f.name}=_FACTORY"
            value = f"_factory_{f.name}() if {f.name} is _FACTORY else {f.name}"
        else:
            param = f.name
        (keyword if f.kw_only else positional).append(param)
        values.append(f"{f.name}={value}")
    signature = ", ".join(["self", *positional, *(["*", *keyword] if keyword else [])])
    source = f"def __init__({signature}):\n    self.__dict__.update({', '.join(values)})\n"
    exec(source, namespace)  # as dataclasses builds its own __init__
    init = namespace["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls
