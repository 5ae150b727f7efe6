"""What each route of the console's JSON API takes and answers, declared once next to its handler.

The handler reads its input through its :class:`Endpoint` (an unknown key or a mistyped value is
a 400 naming it) and :mod:`celery_dlx_console.openapi` publishes the same declarations: what is
checked is what is documented. Schemas are JSON Schema 2020-12 (OpenAPI 3.1's); :func:`problem`
checks the part of it the declarations use.
"""

from __future__ import annotations

import json
import math
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypedDict, Union

from starlette.exceptions import HTTPException
from starlette.requests import Request

from celery_dlx_console.auth import EDITOR, OPERATOR, VIEWER
from celery_dlx_console.forms import BadRequest
from celery_dlx_console.guard import user_of

#: A JSON Schema.
Schema = dict[str, Any]

#: Who may call a route, least role first: viewers read, operators also replay and purge,
#: editors also edit.
ROLES = (VIEWER, OPERATOR, EDITOR)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


#: Each JSON Schema type: its test, and its name in a refusal.
_TYPES: dict[str, tuple[Callable[[object], bool], str]] = {
    "string": (lambda v: isinstance(v, str), "a string"),
    # JSON Schema counts 5.0 as an integer, as JSON does
    "integer": (lambda v: _is_number(v) and float(v).is_integer(), "an integer"),  # type: ignore[arg-type]
    "number": (_is_number, "a number"),
    "boolean": (lambda v: isinstance(v, bool), "true or false"),
    "array": (lambda v: isinstance(v, list), "a list"),
    "object": (lambda v: isinstance(v, dict), "an object"),
    "null": (lambda v: v is None, "null"),
}


def _types(schema: Schema) -> list[str]:
    given = schema.get("type", [])
    return [given] if isinstance(given, str) else list(given)


def _shown(value: object) -> str:
    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _typed(value: object, schema: Schema) -> bool:
    names = _types(schema)
    return not names or any(_TYPES[name][0](value) for name in names)


def problem(value: object, schema: Schema, where: str) -> str | None:
    """What is wrong with ``value`` under ``schema``, naming ``where`` (None: nothing)."""
    if "anyOf" in schema:
        branches: list[Schema] = schema["anyOf"]
        found = [problem(value, branch, where) for branch in branches]
        if None in found:
            return None
        # the branch of the value's own type says best what is wrong inside it
        for branch, said in zip(branches, found, strict=True):
            if _types(branch) and _typed(value, branch) and said:
                return said
        wanted = " or ".join(_TYPES[t][1] for b in branches for t in _types(b))
        return f"{where} must be {wanted}, got {_shown(value)}"
    if not _typed(value, schema):
        wanted = " or ".join(_TYPES[t][1] for t in _types(schema))
        return f"{where} must be {wanted}, got {_shown(value)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {', '.join(map(str, schema['enum']))}, got {_shown(value)}"
    if isinstance(value, list):
        return _list_problem(value, schema, where)
    if isinstance(value, dict) and len(value) > schema.get("maxProperties", len(value)):
        return f"{where} holds at most {schema['maxProperties']} entries, got {len(value)}"
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)):
            return f"{where} has at most {schema['maxLength']} characters"
        if len(value) < schema.get("minLength", 0):
            return f"{where} must not be empty"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _number_problem(value, schema, where)
    return None


def _list_problem(value: list[Any], schema: Schema, where: str) -> str | None:
    if len(value) > schema.get("maxItems", len(value)):
        return f"{where} holds at most {schema['maxItems']} items, got {len(value)}"
    if len(value) < schema.get("minItems", 0):
        return f"{where} holds at least {schema['minItems']} items, got {len(value)}"
    prefix: list[Schema] = schema.get("prefixItems", [])
    rest: Schema | None = schema.get("items")
    for i, item in enumerate(value):
        sub = prefix[i] if i < len(prefix) else rest
        said = None if sub is None else problem(item, sub, f"{where}[{i}]")
        if said:
            return said
    return None


def _number_problem(value: float, schema: Schema, where: str) -> str | None:
    if "minimum" in schema and value < schema["minimum"]:
        return f"{where} must be at least {schema['minimum']:g}, got {value:g}"
    if "exclusiveMinimum" in schema and value <= schema["exclusiveMinimum"]:
        return f"{where} must be more than {schema['exclusiveMinimum']:g}, got {value:g}"
    if "maximum" in schema and value > schema["maximum"]:
        return f"{where} must be at most {schema['maximum']:g}, got {value:g}"
    return None


@dataclass(frozen=True)
class Field:
    """One key of a JSON body or one query parameter: its JSON Schema and what it means."""

    name: str
    schema: Schema
    doc: str
    required: bool = False


@dataclass(frozen=True)
class Answer:
    """One response of a route: what it means, and its body by media type: a JSON Schema, or
    the Python type of the JSON (a ``TypedDict``, ``list[...]``: see :func:`schema_of`)."""

    doc: str
    content: Mapping[str, Any]


def json_answer(doc: str, body: Any) -> Answer:
    """A JSON response: ``body`` is a JSON Schema or the Python type of the JSON."""
    return Answer(doc, {"application/json": body})


class Refusal(TypedDict):
    """A refusal of the JSON API: what was wrong (a 404 also names the ``id`` looked for)."""

    error: str


#: The refusals of the middleware in front of every route, as plain text.
TEXT: Schema = {"type": "string"}


@dataclass(frozen=True)
class Endpoint:
    """A route of the JSON API as its handler serves it and the OpenAPI document shows it."""

    method: Literal["GET", "POST"]
    path: str
    summary: str
    responses: Mapping[int, Answer]
    #: The least role that may call it (see :data:`ROLES`).
    role: str = VIEWER
    params: tuple[Field, ...] = ()
    #: The JSON body's keys (None: no body).
    body: tuple[Field, ...] | None = None
    #: What the caller must send to confirm a write, besides its CSRF token (None: nothing).
    confirmation: str | None = None

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"{self.path}: role must be one of {ROLES}, got {self.role!r}")

    @property
    def label(self) -> str:
        return f"{self.method} {self.path}"

    @property
    def writes(self) -> bool:
        return self.method != "GET"

    def body_schema(self) -> Schema:
        """The JSON body's schema: an object of the declared keys and no other."""
        fields = self.body or ()
        required = [f.name for f in fields if f.required]
        return {
            "type": "object",
            "properties": {f.name: {**f.schema, "description": f.doc} for f in fields},
            "additionalProperties": False,
            **({"required": required} if required else {}),
        }

    def admit(self, request: Request) -> None:
        """Refuse a caller below :attr:`role`, and a write without the caller's CSRF token.

        Raises:
            HTTPException: 403, saying why.
        """
        user = user_of(request)
        if ROLES.index(user.role if user.role in ROLES else VIEWER) < ROLES.index(self.role):
            if self.role == EDITOR:
                said = f"{user.name} is not an editor: only editors may edit a message"
            else:
                said = f"{user.name} is a viewer: viewers cannot replay or purge"
            raise HTTPException(403, said)
        if self.writes:
            console = request.app.state.console
            if not console.csrf.valid(user, request.headers.get("x-csrf-token")):
                raise HTTPException(403, "missing or wrong X-CSRF-Token (GET /api/csrf)")

    def query(self, request: Request) -> dict[str, Any]:
        """The declared query parameters given (an empty text counts as not given).

        Raises:
            BadRequest: an undeclared parameter, or a value that is not of its declared type.
        """
        self.admit(request)
        accepted = {f.name: f for f in self.params}
        given = request.query_params
        self._refuse_unknown(given, accepted, "query parameter")
        out: dict[str, Any] = {}
        for name, raw in given.items():
            schema = accepted[name].schema
            if raw == "" and "string" in _types(schema) and "enum" not in schema:
                continue  # an empty text filter filters nothing (a number, flag or choice must be one)
            value = _from_text(raw, schema)
            said = problem(value, schema, repr(name))
            if said:
                raise BadRequest(f"{self.label}: {said}")
            out[name] = value
        return out

    async def read(self, request: Request) -> dict[str, Any]:
        """The JSON body once the caller is admitted (:meth:`admit`) and the body checked.

        Raises:
            HTTPException: 403 (see :meth:`admit`).
            BadRequest: not a JSON object, an unknown key, a missing or mistyped value.
        """
        self.admit(request)
        raw = await request.body()
        try:
            data = json.loads(raw or b"{}", parse_constant=_no_constant)
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise BadRequest(f"{self.label}: the body must be a JSON object")
        return self.check_body(data)

    def check_body(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` when it fits :meth:`body_schema`, without the keys whose schema allows null
        and that are null (not given, as absent keys are).

        Raises:
            BadRequest: an unknown key, a missing or mistyped value.
        """
        fields = {f.name: f for f in self.body or ()}
        self._refuse_unknown(data, fields, "key")
        for f in fields.values():
            if f.name not in data:
                if f.required:
                    raise BadRequest(f"{self.label}: {f.name!r} is required ({f.doc})")
                continue
            said = problem(data[f.name], f.schema, repr(f.name))
            if said:
                raise BadRequest(f"{self.label}: {said}")
            if data[f.name] is None:
                del data[f.name]
        return data

    def _refuse_unknown(
        self, given: Iterable[str], accepted: Mapping[str, Field], what: str
    ) -> None:
        unknown = sorted(set(given) - set(accepted))
        if unknown:
            names = ", ".join(repr(n) for n in unknown)
            plural = "s" if len(unknown) > 1 else ""
            takes = ", ".join(accepted) if accepted else "none"
            raise BadRequest(f"{self.label}: unknown {what}{plural} {names}; it accepts: {takes}")


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}


def _from_text(raw: str, schema: Schema) -> object:
    """A query parameter's text as the value its schema's type wants (left as text when it
    cannot be: :func:`problem` then names the parameter and the type)."""
    wanted = _types(schema)
    try:
        if "integer" in wanted:
            return int(raw)
        if "number" in wanted:
            number = float(raw)
            return number if math.isfinite(number) else raw
    except ValueError:
        return raw
    if "boolean" in wanted and raw.lower() in _TRUE | _FALSE:
        return raw.lower() in _TRUE
    return raw


def schema_of(tp: Any, defs: dict[str, Schema]) -> Schema:
    """The JSON Schema of a Python type of a JSON value: ``str``, ``int``, ``float``, ``bool``,
    ``None``, ``Any``/``object``, ``list[X]``, ``dict[str, X]``, ``X | Y``, ``Literal[...]``, and
    ``TypedDict`` s, which go into ``defs`` by name (``$ref``) with their required keys.

    Raises:
        TypeError: a type with no JSON form.
    """
    if isinstance(tp, dict):  # a schema already
        return tp
    origin = typing.get_origin(tp)
    if tp is Any or tp is object:
        return {}
    if tp is None or tp is type(None):
        return {"type": "null"}
    simple = {str: "string", bool: "boolean", int: "integer", float: "number"}
    if tp in simple:
        return {"type": simple[tp]}
    if origin in (Union, types.UnionType):
        return {"anyOf": [schema_of(arg, defs) for arg in typing.get_args(tp)]}
    if origin is Literal:
        return {"enum": list(typing.get_args(tp))}
    if origin is list:
        return {"type": "array", "items": schema_of(typing.get_args(tp)[0], defs)}
    if origin is dict:
        return {"type": "object", "additionalProperties": schema_of(typing.get_args(tp)[1], defs)}
    if typing.is_typeddict(tp):
        name = tp.__name__
        if name not in defs:
            defs[name] = {}  # a placeholder while its own fields are turned (recursion)
            hints = typing.get_type_hints(tp)
            defs[name] = {
                "type": "object",
                "properties": {key: schema_of(hint, defs) for key, hint in hints.items()},
                "required": sorted(tp.__required_keys__),
            }
            if tp.__doc__:
                defs[name]["description"] = " ".join(tp.__doc__.split())
        return {"$ref": f"#/components/schemas/{name}"}
    raise TypeError(f"no JSON Schema for {tp!r}")
