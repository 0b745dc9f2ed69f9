"""Tool(parameters=ArgumentsSchema(...)): arguments described by a JSON Schema given as it is (an MCP tool's)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest

from jixu.errors import ToolDefinitionError, ToolInputError
from jixu.threads.tools import ArgumentsSchema, Tool, ToolContext

SCHEMA = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "integer"}},
                                           "note.text": {"type": "string"}}, "required": ["items"]}


def _problem(args: dict[str, Any]) -> tuple[Sequence[str | int], str] | None:
    if "items" not in args:
        return (), "missing items"
    for index, item in enumerate(args["items"]):
        if type(item) is not int:
            return ("items", index), f"{item!r} is not an integer"
    return None


def test_the_schema_is_shown_as_given_and_the_check_names_the_path() -> None:
    async def total(ctx: ToolContext, **args: Any) -> int:
        return sum(args["items"]) + ctx.attempt

    tool = Tool(total, parameters=ArgumentsSchema(SCHEMA, _problem), semantics="read_only")
    assert tool.parameters == SCHEMA and tool.contract()["parameters"] == SCHEMA
    assert tool.validate_args({"items": [1, 2], "note.text": "x"}) == {"items": [1, 2], "note.text": "x"}
    with pytest.raises(ToolInputError) as bad:
        tool.validate_args({"items": [1, "2"]})
    assert bad.value.details["path"] == "args.items[1]" and "'2' is not an integer" in bad.value.message
    with pytest.raises(ToolInputError, match="missing items"):
        tool.validate_args({})
    with pytest.raises(ToolInputError, match="reserved for the call's ToolContext"):
        tool.validate_args({"items": [], "ctx": 1})
    with pytest.raises(ToolInputError, match="not JSON"):
        tool.validate_args({"items": [float("nan")]})
    context = ToolContext(effect_id="e", idempotency_key="k", attempt=2, thread_id="t", turn_id="u")
    assert asyncio.run(tool.invoke({"items": [1, 2], "note.text": "x"}, context)) == 5


def test_parameters_need_a_kwargs_only_function() -> None:
    def typed(items: list[int], **rest: Any) -> int:
        return 0

    def no_kwargs(ctx: ToolContext) -> int:
        return 0

    for fn in (typed, no_kwargs):
        with pytest.raises(ToolDefinitionError, match=r"\*\*kwargs only"):
            Tool(fn, parameters=ArgumentsSchema(SCHEMA, _problem))

    def plain(**rest: Any) -> int:
        return 0

    with pytest.raises(ToolDefinitionError, match=r"\*args and \*\*kwargs are not supported"):
        Tool(plain)
    with pytest.raises(ToolDefinitionError, match="must be an ArgumentsSchema"):
        Tool(plain, parameters=SCHEMA)  # type: ignore[arg-type]
