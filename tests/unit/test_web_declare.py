"""The console API's declarations (no server): the JSON Schema subset the bodies are checked
with, the schemas of the ``TypedDict`` answers, and the OpenAPI document built from both."""

from __future__ import annotations

from typing import Any, Literal, TypedDict

import pytest

from celery_dlx_console.app import API_ROUTES
from celery_dlx_console.declare import Endpoint, Field, json_answer, problem, schema_of
from celery_dlx_console.forms import BadRequest
from celery_dlx_console.openapi import document

PAIRS = {
    "anyOf": [
        {"type": "object", "maxProperties": 2},
        {
            "type": "array",
            "items": {"type": "array", "prefixItems": [{"type": "string"}, {}], "minItems": 2},
        },
        {"type": "null"},
    ]
}


@pytest.mark.parametrize(
    ("value", "schema", "said"),
    [
        ("x", {"type": "string"}, None),
        (True, {"type": "integer"}, "'k' must be an integer, got true"),
        (5.0, {"type": "integer"}, None),
        (5.5, {"type": "integer"}, "'k' must be an integer, got 5.5"),
        (float("inf"), {"type": "number"}, "'k' must be a number, got Infinity"),
        (None, {"type": ["number", "null"]}, None),
        (0, {"type": "number", "exclusiveMinimum": 0}, "'k' must be more than 0, got 0"),
        (601, {"type": "number", "maximum": 600}, "'k' must be at most 600, got 601"),
        (
            ["a", 1],
            {"type": "array", "items": {"type": "string"}},
            "'k'[1] must be a string, got 1",
        ),
        ([1, 2, 3], {"type": "array", "maxItems": 2}, "'k' holds at most 2 items, got 3"),
        ("", {"type": "string", "minLength": 1}, "'k' must not be empty"),
        ({"a": 1}, PAIRS, None),
        ([["a", {"deep": 1}]], PAIRS, None),
        ({"a": 1, "b": 2, "c": 3}, PAIRS, "'k' holds at most 2 entries, got 3"),
        ([[1, 2]], PAIRS, "'k'[0][0] must be a string, got 1"),
        ([["a"]], PAIRS, "'k'[0] holds at least 2 items, got 1"),
        ("a=1", PAIRS, "'k' must be an object or a list or null, got \"a=1\""),
    ],
)
def test_problem_names_the_key_and_what_is_wrong(value: Any, schema: Any, said: str | None) -> None:
    assert problem(value, schema, "'k'") == said


class Inner(TypedDict):
    """An inner record."""

    n: int


class Outer(TypedDict):
    name: str
    maybe: float | None
    rows: list[Inner]
    by_name: dict[str, int]
    kind: Literal["a", "b"]
    anything: Any


class Partial(Outer, total=False):
    extra: bool


def test_schema_of_typed_dicts_puts_them_in_components_with_their_required_keys() -> None:
    defs: dict[str, Any] = {}
    assert schema_of(Partial, defs) == {"$ref": "#/components/schemas/Partial"}
    assert defs["Inner"] == {
        "type": "object",
        "properties": {"n": {"type": "integer"}},
        "required": ["n"],
        "description": "An inner record.",
    }
    partial = defs["Partial"]
    assert partial["required"] == ["anything", "by_name", "kind", "maybe", "name", "rows"]
    assert partial["properties"]["maybe"] == {"anyOf": [{"type": "number"}, {"type": "null"}]}
    assert partial["properties"]["rows"] == {
        "type": "array",
        "items": {"$ref": "#/components/schemas/Inner"},
    }
    assert partial["properties"]["by_name"]["additionalProperties"] == {"type": "integer"}
    assert partial["properties"]["kind"] == {"enum": ["a", "b"]}
    assert partial["properties"]["anything"] == {}
    with pytest.raises(TypeError, match="no JSON Schema"):
        schema_of(set[int], {})


ECHO = Endpoint(
    "POST",
    "/api/echo",
    "Echo",
    {200: json_answer("the body", {"type": "object"})},
    role="operator",
    body=(
        Field("id", {"type": "string"}, "which", required=True),
        Field("note", {"type": ["string", "null"]}, "a note"),
        Field("flag", {"type": "boolean"}, "a flag"),
    ),
    confirmation='"flag": true',
)


def test_a_body_is_checked_against_its_declaration() -> None:
    assert ECHO.check_body({"id": "a", "note": None, "flag": True}) == {"id": "a", "flag": True}
    refusals = [
        (
            {"id": "a", "flga": True},
            "POST /api/echo: unknown key 'flga'; it accepts: id, note, flag",
        ),
        ({"note": "x"}, "POST /api/echo: 'id' is required (which)"),
        ({"id": "a", "flag": None}, "POST /api/echo: 'flag' must be true or false, got null"),
        ({"id": None}, "POST /api/echo: 'id' must be a string, got null"),
    ]
    for body, said in refusals:
        with pytest.raises(BadRequest) as refused:
            ECHO.check_body(body)
        assert str(refused.value) == said
    with pytest.raises(ValueError, match="role must be one of"):
        Endpoint("GET", "/x", "x", {}, role="admin")


def test_the_document_is_made_of_the_declarations() -> None:
    doc = document([ECHO])
    op = doc["paths"]["/api/echo"]["post"]
    assert op["requestBody"]["content"]["application/json"]["schema"] == ECHO.body_schema()
    assert ECHO.body_schema()["additionalProperties"] is False
    assert ECHO.body_schema()["required"] == ["id"]
    assert op["x-dlx-role"] == "operator" and op["x-dlx-confirmation"] == '"flag": true'
    assert op["security"] == [{"basic": [], "csrf": []}]
    assert set(op["responses"]) == {"200", "400", "401", "403", "413", "503"}
    assert op["responses"]["401"]["content"] == {"text/plain": {"schema": {"type": "string"}}}
    # The console's own: every route once, path parameters declared, every $ref resolvable.
    full = document(e for e, _ in API_ROUTES)
    assert len({(e.method, e.path) for e, _ in API_ROUTES}) == len(API_ROUTES)
    job = full["paths"]["/api/jobs/{job_id}"]["get"]
    assert job["parameters"][0] == {
        "name": "job_id",
        "in": "path",
        "required": True,
        "schema": {"type": "string"},
    }
    text = repr(full)
    for name in full["components"]["schemas"]:
        assert f"#/components/schemas/{name}" in text
    refs = {part.split("'")[0] for part in text.split("#/components/schemas/")[1:]}
    assert refs <= set(full["components"]["schemas"])
