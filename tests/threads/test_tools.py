"""Tools: the ``@tool`` decorator, JSON Schemas from type hints, argument and result validation, invoke."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import enum
import functools
import math
import threading
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, Literal, NewType, NotRequired, Optional, Required, TypedDict, Union

import pytest

from jixu.errors import (
    InvalidInput,
    JixuError,
    MalformedEvent,
    ToolDefinitionError,
    ToolInputError,
    ToolOutputError,
)
from jixu.ledger.encoding import canonical_text
from jixu.threads.tools import Tool, ToolContext, ToolError, tool

# --- module-level types (type hints are resolved against module globals) --------------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Mixed(enum.Enum):
    A = "a"
    B = 1


class Floaty(enum.Enum):
    A = 1.5


class Empty(enum.Enum):
    pass


@dataclasses.dataclass
class Point:
    x: int
    y: Annotated[int, "vertical"] = 0
    tags: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Shape:
    name: str
    corners: list[Point]
    color: Color = Color.RED


@dataclasses.dataclass
class TreeNode:
    value: int
    children: list[TreeNode]


@dataclasses.dataclass
class BadDefault:
    x: int = "zero"  # type: ignore[assignment]


class Movie(TypedDict):
    title: str
    year: NotRequired[int]


class BadMovie(TypedDict):
    cast: set[str]


@dataclasses.dataclass
class Stamped:
    x: int
    seen: int = dataclasses.field(default=0, init=False)


class Partial(TypedDict, total=False):
    note: str
    key: Required[str]


UserId = NewType("UserId", str)


def ctx(attempt: int = 1) -> ToolContext:
    """A context as the harness would build it."""
    return ToolContext(effect_id="eff_1", idempotency_key="key_1", attempt=attempt, thread_id="thr_1",
                       turn_id="turn_1")


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to completion on a fresh event loop."""
    return asyncio.run(coro)


def schema_of(annotation: Any) -> dict[str, Any]:
    """The property schema a single parameter with ``annotation`` gets."""

    def probe(value: Any) -> None:
        """Probe."""

    probe.__annotations__ = {"value": annotation}
    return tool(probe).parameters["properties"]["value"]  # type: ignore[no-any-return]


# --- decorator forms ------------------------------------------------------------------


def test_bare_decorator_makes_a_tool_with_default_options() -> None:
    @tool
    def add(a: int, b: int = 2) -> int:
        """Add two numbers."""
        return a + b

    assert isinstance(add, Tool)
    assert add.name == "add"
    assert add.description == "Add two numbers."
    assert add.semantics == "unsafe"
    assert add.requires_approval is False
    assert add.timeout is None
    assert add.is_async is False
    assert add.fn.__name__ == "add"


def test_decorator_with_options_records_them() -> None:
    @tool(name="mail-send", semantics="idempotent", requires_approval=True, timeout=5)
    async def send_email(to: str, body: str) -> str:
        """Send an email."""
        return "sent"

    assert send_email.name == "mail-send"
    assert send_email.semantics == "idempotent"
    assert send_email.requires_approval is True
    assert send_email.timeout == 5.0 and isinstance(send_email.timeout, float)
    assert send_email.is_async is True


def test_tool_can_be_called_as_a_plain_function_too() -> None:
    def lookup(key: str) -> str:
        return key.upper()

    made = tool(lookup, semantics="read_only")
    assert made.semantics == "read_only"
    assert made("abc") == "ABC"


def test_calling_a_tool_directly_calls_the_underlying_function() -> None:
    @tool
    def add(a: int, b: int = 2) -> int:
        return a + b

    @tool
    async def double(a: int) -> int:
        return a * 2

    assert add(1) == 3
    assert add(1, b=5) == 6
    assert run(double(4)) == 8


def test_description_is_the_whole_cleaned_docstring() -> None:
    @tool
    def send(to: str) -> None:
        """Send an email.

        Longer description
            with an indented line.
        """

    assert send.description == "Send an email.\n\nLonger description\n    with an indented line."


def test_description_option_overrides_the_docstring_and_missing_docstring_is_empty() -> None:
    @tool(description="Custom text.")
    def documented(x: int) -> None:
        """Docstring."""

    @tool
    def undocumented(x: int) -> None:
        pass

    assert documented.description == "Custom text."
    assert undocumented.description == ""


def test_tool_is_immutable_and_its_schemas_are_copies() -> None:
    @tool
    def add(a: int) -> int:
        return a

    with pytest.raises(AttributeError):
        add.name = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        add._name = "other"
    with pytest.raises(AttributeError):
        del add._name
    params = add.parameters
    params["properties"]["a"]["type"] = "string"
    add.contract()["returns"]["type"] = "string"
    assert add.parameters["properties"]["a"] == {"type": "integer"}
    assert add.returns == {"type": "integer"}


def test_repr_names_the_tool_and_its_semantics() -> None:
    @tool(semantics="read_only")
    def peek(a: int) -> int:
        return a

    assert repr(peek) == "<Tool peek semantics=read_only requires_approval=False>"


def test_a_bound_method_can_be_a_tool() -> None:
    class Counter:
        def __init__(self) -> None:
            self.total = 0

        def bump(self, by: int) -> int:
            self.total += by
            return self.total

    counter = Counter()
    bump = tool(counter.bump)
    assert bump.parameters["properties"] == {"by": {"type": "integer"}}
    assert run(bump.invoke({"by": 3}, ctx())) == 3
    assert counter.total == 3


def test_name_of_exactly_64_characters_is_accepted() -> None:
    def fn(a: int) -> None:
        pass

    assert tool(fn, name="a" * 64).name == "a" * 64


# --- spec, contract and determinism ---------------------------------------------------


def test_spec_has_name_description_and_parameters() -> None:
    @tool
    def add(a: int, b: int = 2) -> int:
        """Add."""
        return a + b

    assert add.spec() == {
        "name": "add",
        "description": "Add.",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer", "default": 2}},
            "required": ["a"],
            "additionalProperties": False,
        },
    }


def test_contract_has_exactly_the_parts_that_must_not_change() -> None:
    @tool(semantics="idempotent", requires_approval=True, timeout=3, description="ignored by the contract")
    def add(a: int) -> int:
        return a

    assert add.contract() == {
        "name": "add",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                       "additionalProperties": False},
        "returns": {"type": "integer"},
        "semantics": "idempotent",
        "requires_approval": True,
    }


def test_the_same_function_always_yields_byte_identical_contracts() -> None:
    def big(z: str, a: list[Point], m: Color = Color.GREEN, k: dict[str, Movie] | None = None,
            ctx: ToolContext | None = None) -> list[int]:
        return []

    first, second = tool(big), tool(big)
    assert canonical_text(first.contract()) == canonical_text(second.contract())
    assert canonical_text(first.spec()) == canonical_text(second.spec())
    assert first.parameters["required"] == ["z", "a"]
    assert list(first.parameters["properties"]) == ["z", "a", "m", "k"]


def test_required_follows_declaration_order_including_keyword_only() -> None:
    def fn(zeta: int, alpha: int, *, mid: str, beta: int = 1, omega: str) -> None:
        pass

    made = tool(fn)
    assert made.parameters["required"] == ["zeta", "alpha", "mid", "omega"]
    assert list(made.parameters["properties"]) == ["zeta", "alpha", "mid", "beta", "omega"]


# --- schemas from annotations ---------------------------------------------------------


@pytest.mark.parametrize(("annotation", "expected"), [
    (str, {"type": "string"}),
    (int, {"type": "integer"}),
    (float, {"type": "number"}),
    (bool, {"type": "boolean"}),
    (None, {"type": "null"}),
    (type(None), {"type": "null"}),
    (Any, {}),
    (list[int], {"type": "array", "items": {"type": "integer"}}),
    (list, {"type": "array", "items": {}}),
    (tuple[str, ...], {"type": "array", "items": {"type": "string"}}),
    (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
    (dict, {"type": "object", "additionalProperties": {}}),
    (list[dict[str, list[bool]]], {"type": "array", "items": {
        "type": "object", "additionalProperties": {"type": "array", "items": {"type": "boolean"}}}}),
    (int | None, {"anyOf": [{"type": "integer"}, {"type": "null"}]}),
    (Optional[str], {"anyOf": [{"type": "string"}, {"type": "null"}]}),  # noqa: UP045
    (Union[int, str], {"anyOf": [{"type": "integer"}, {"type": "string"}]}),  # noqa: UP007
    (str | int | None, {"anyOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]}),
    (Literal["a", "b"], {"enum": ["a", "b"], "type": "string"}),
    (Literal[1, 2], {"enum": [1, 2], "type": "integer"}),
    (Literal["a", 1, None], {"enum": ["a", 1, None]}),
    (Color, {"type": "string", "enum": ["red", "green"]}),
    (Level, {"type": "integer", "enum": [1, 2]}),
    (Annotated[str, "The recipient."], {"type": "string", "description": "The recipient."}),
    (Annotated[list[int], "Some ids."], {"type": "array", "items": {"type": "integer"}, "description": "Some ids."}),
    (Annotated[int | None, "Maybe."], {"anyOf": [{"type": "integer"}, {"type": "null"}], "description": "Maybe."}),
    (list[Annotated[str, "one"]], {"type": "array", "items": {"type": "string", "description": "one"}}),
    (UserId, {"type": "string"}),
])
def test_schema_for_each_supported_annotation(annotation: Any, expected: dict[str, Any]) -> None:
    assert schema_of(annotation) == expected


def test_dataclass_becomes_a_closed_nested_object_schema() -> None:
    assert schema_of(Shape) == {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "corners": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer"},
                    "y": {"type": "integer", "description": "vertical", "default": 0},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
                "required": ["x"],
                "additionalProperties": False,
            }},
            "color": {"type": "string", "enum": ["red", "green"], "default": "red"},
        },
        "required": ["name", "corners"],
        "additionalProperties": False,
    }


def test_typeddict_becomes_a_closed_object_schema_with_its_required_keys() -> None:
    assert schema_of(Movie) == {
        "type": "object",
        "properties": {"title": {"type": "string"}, "year": {"type": "integer"}},
        "required": ["title"],
        "additionalProperties": False,
    }
    assert schema_of(Partial) == {
        "type": "object", "properties": {"note": {"type": "string"}, "key": {"type": "string"}},
        "required": ["key"], "additionalProperties": False,
    }


def test_defaults_are_not_required_and_appear_in_the_schema_as_json() -> None:
    def fn(a: int, b: str = "x", c: float | None = None, d: Color = Color.GREEN,
           e: tuple[int, ...] = (1, 2), f: Annotated[bool, "Flag."] = True, g: list[str] = []) -> None:  # noqa: B006
        pass

    assert tool(fn).parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "string", "default": "x"},
            "c": {"anyOf": [{"type": "number"}, {"type": "null"}], "default": None},
            "d": {"type": "string", "enum": ["red", "green"], "default": "green"},
            "e": {"type": "array", "items": {"type": "integer"}, "default": [1, 2]},
            "f": {"type": "boolean", "description": "Flag.", "default": True},
            "g": {"type": "array", "items": {"type": "string"}, "default": []},
        },
        "required": ["a"],
        "additionalProperties": False,
    }


def test_a_default_without_a_json_form_is_left_out_of_the_schema() -> None:
    def fn(a: Any = math.inf, b: float = math.nan) -> None:
        pass

    assert tool(fn).parameters["properties"] == {"a": {}, "b": {"type": "number"}}
    assert tool(fn).parameters["required"] == []


def test_a_dataclass_default_is_written_as_an_object() -> None:
    def fn(p: Point = Point(1, 2)) -> None:  # noqa: B008
        pass

    assert tool(fn).parameters["properties"]["p"]["default"] == {"x": 1, "y": 2, "tags": []}


def test_dict_and_typeddict_defaults_are_written_as_objects() -> None:
    def fn(opts: dict[str, int] = {"a": 1}, movie: Movie = {"title": "Heat"},  # noqa: B006
           either: list[int] | None = None) -> None:
        pass

    properties = tool(fn).parameters["properties"]
    assert properties["opts"]["default"] == {"a": 1}
    assert properties["movie"]["default"] == {"title": "Heat"}
    assert properties["either"]["default"] is None


def test_dataclass_fields_outside_init_are_not_part_of_the_schema() -> None:
    assert schema_of(Stamped) == {"type": "object", "properties": {"x": {"type": "integer"}},
                                  "required": ["x"], "additionalProperties": False}


def test_the_context_parameter_is_injected_and_not_part_of_the_schema() -> None:
    @tool
    async def fn(a: int, context: ToolContext) -> None:
        pass

    @tool
    def optional_ctx(a: int, ctx: ToolContext | None = None) -> None:
        pass

    for made in (fn, optional_ctx):
        assert made.parameters == {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                                   "additionalProperties": False}


def test_return_schema_follows_the_return_annotation() -> None:
    def unannotated(a: int):  # type: ignore[no-untyped-def]
        return a

    def any_result(a: int) -> Any:
        return a

    def nothing(a: int) -> None:
        pass

    def listing(a: int) -> list[str]:
        return []

    assert tool(unannotated).returns == {}
    assert tool(any_result).returns == {}
    assert tool(nothing).returns == {"type": "null"}
    assert tool(listing).returns == {"type": "array", "items": {"type": "string"}}


def test_a_tool_without_parameters_has_an_empty_closed_schema() -> None:
    @tool
    def ping() -> str:
        return "pong"

    assert ping.parameters == {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    assert ping.validate_args({}) == {}
    assert run(ping.invoke({}, ctx())) == "pong"


# --- definition errors ----------------------------------------------------------------


def _definition_error(make: Callable[[], object]) -> ToolDefinitionError:
    with pytest.raises(ToolDefinitionError) as caught:
        make()
    error = caught.value
    assert isinstance(error, InvalidInput)
    assert error.code == "tool_definition_invalid"
    return error


def plain(a: int) -> int:
    return a


@pytest.mark.parametrize("semantics", ["unsafe ", "READ_ONLY", "safe", "", None, 1])
def test_unknown_semantics_is_rejected(semantics: Any) -> None:
    error = _definition_error(lambda: tool(plain, semantics=semantics))
    assert "plain" in error.message and "semantics" in error.message


@pytest.mark.parametrize("timeout", [0, -1, 0.0, math.nan, math.inf, True, "5"])
def test_timeout_must_be_a_positive_finite_number(timeout: Any) -> None:
    error = _definition_error(lambda: tool(plain, timeout=timeout))
    assert "timeout" in error.message and "plain" in error.message


@pytest.mark.parametrize("name", ["1abc", "has space", "a" * 65, "", "dots.not.allowed", "ok\n", "é"])
def test_tool_name_must_match_the_pattern(name: str) -> None:
    error = _definition_error(lambda: tool(plain, name=name))
    assert repr(name) in error.message


def test_a_lambda_needs_an_explicit_name() -> None:
    error = _definition_error(lambda: tool(lambda: None))
    assert "<lambda>" in error.message and "name=" in error.message


def test_requires_approval_and_description_must_have_the_right_types() -> None:
    assert "requires_approval" in _definition_error(lambda: tool(plain, requires_approval=1)).message  # type: ignore[call-overload]
    assert "description" in _definition_error(lambda: tool(plain, description=3)).message  # type: ignore[call-overload]


def test_a_parameter_without_annotation_is_rejected_naming_it() -> None:
    def fn(a: int, b) -> None:  # type: ignore[no-untyped-def]
        pass

    error = _definition_error(lambda: tool(fn))
    assert "fn" in error.message and "'b'" in error.message and "annotation" in error.message
    assert error.details["parameter"] == "b"


@pytest.mark.parametrize("annotation", [
    set[int], bytes, object, dict[int, str], tuple[int, str], tuple[()], Callable[[], int], list[set[str]],
    list[ToolContext], Literal[1.5], Mixed, Floaty, Empty, Annotated[int, 5], TreeNode, BadDefault, BadMovie,
])
def test_an_unsupported_annotation_is_rejected_naming_the_parameter(annotation: Any) -> None:
    def fn(value: Any) -> None:
        pass

    fn.__annotations__ = {"value": annotation}
    error = _definition_error(lambda: tool(fn))
    assert "fn" in error.message and "'value'" in error.message
    assert error.details == {"function": fn.__qualname__, "parameter": "value"}


def test_an_unresolvable_forward_reference_is_rejected() -> None:
    def fn(value: DoesNotExist) -> None:  # type: ignore[name-defined]  # noqa: F821
        pass

    error = _definition_error(lambda: tool(fn))
    assert "DoesNotExist" in error.message and "fn" in error.message


def test_an_unsupported_return_annotation_is_rejected() -> None:
    def fn(a: int) -> set[int]:
        return set()

    error = _definition_error(lambda: tool(fn))
    assert "return annotation" in error.message


def test_star_args_and_star_kwargs_are_rejected() -> None:
    def star(*items: int) -> None:
        pass

    def double_star(**options: int) -> None:
        pass

    assert "'items'" in _definition_error(lambda: tool(star)).message
    assert "'options'" in _definition_error(lambda: tool(double_star)).message


def test_positional_only_parameters_are_rejected() -> None:
    def fn(a: int, /, b: int) -> None:
        pass

    error = _definition_error(lambda: tool(fn))
    assert "positional-only" in error.message and "'a'" in error.message


def test_only_one_context_parameter_is_allowed() -> None:
    def fn(one: ToolContext, two: ToolContext) -> None:
        pass

    assert "'two'" in _definition_error(lambda: tool(fn)).message


def test_a_default_that_contradicts_its_annotation_is_rejected() -> None:
    def fn(a: int = "zero") -> None:  # type: ignore[assignment]
        pass

    error = _definition_error(lambda: tool(fn))
    assert "'a'" in error.message and "default" in error.message


def test_generators_partials_non_functions_and_tools_cannot_become_tools() -> None:
    def gen(a: int) -> Any:
        yield a

    async def agen(a: int) -> Any:
        yield a

    assert "generator" in _definition_error(lambda: tool(gen)).message
    assert "generator" in _definition_error(lambda: tool(agen)).message
    assert "function" in _definition_error(lambda: tool(functools.partial(plain, 1))).message
    assert "function" in _definition_error(lambda: tool("plain")).message  # type: ignore[call-overload]
    assert "already a tool" in _definition_error(lambda: tool(tool(plain))).message


# --- validate_args --------------------------------------------------------------------


def _input_error(made: Tool, args: object) -> ToolInputError:
    before = copy.deepcopy(args)
    with pytest.raises(ToolInputError) as caught:
        made.validate_args(args)
    assert args == before, "validation must not mutate its input"
    error = caught.value
    assert isinstance(error, InvalidInput) and error.code == "tool_input_invalid"
    assert error.details["tool"] == made.name
    return error


@tool
def kitchen_sink(
    text: str,
    count: int,
    ratio: float,
    flag: bool,
    items: list[int],
    scores: dict[str, float],
    mode: Literal["fast", "slow"],
    color: Color,
    level: Level,
    point: Point,
    movie: Movie,
    pair: tuple[str, ...],
    maybe: int | None,
    anything: Any,
    limit: int = 10,
) -> dict[str, Any]:
    """Takes one of everything."""
    return {}


VALID: dict[str, Any] = {
    "text": "hi", "count": 1, "ratio": 0.5, "flag": True, "items": [1, 2, 3], "scores": {"alice": 1.0},
    "mode": "fast", "color": "red", "level": 2, "point": {"x": 1}, "movie": {"title": "Heat"},
    "pair": ["a", "b"], "maybe": None, "anything": {"k": [1, "two", None]},
}


def test_valid_args_come_back_as_a_new_dict_with_defaults_filled_in() -> None:
    args = copy.deepcopy(VALID)
    checked = kitchen_sink.validate_args(args)
    assert args == VALID
    assert checked == {**VALID, "limit": 10, "point": {"x": 1, "y": 0}}
    assert checked is not args
    assert checked["items"] is not args["items"]
    assert checked["anything"]["k"] is not args["anything"]["k"]
    checked["items"].append(4)
    assert args["items"] == [1, 2, 3]
    canonical_text(checked)


def test_a_filled_default_is_a_fresh_copy_each_time() -> None:
    @tool
    def fn(tags: list[str] = []) -> None:  # noqa: B006
        pass

    first = fn.validate_args({})
    first["tags"].append("x")
    assert fn.validate_args({}) == {"tags": []}


@pytest.mark.parametrize(("key", "value", "path"), [
    ("text", 3, "args.text"),
    ("text", None, "args.text"),
    ("count", "1", "args.count"),
    ("count", 1.5, "args.count"),
    ("count", True, "args.count"),
    ("ratio", "0.5", "args.ratio"),
    ("ratio", False, "args.ratio"),
    ("ratio", math.nan, "args.ratio"),
    ("ratio", math.inf, "args.ratio"),
    ("flag", 1, "args.flag"),
    ("flag", "true", "args.flag"),
    ("items", [1, 2, "3"], "args.items[2]"),
    ("items", (1, 2), "args.items"),
    ("items", {"0": 1}, "args.items"),
    ("scores", {"alice": 1.0, "bob": "high"}, "args.scores.bob"),
    ("scores", {"a b": "x"}, 'args.scores["a b"]'),
    ("scores", {1: 1.0}, "args.scores"),
    ("scores", [], "args.scores"),
    ("mode", "medium", "args.mode"),
    ("mode", 1, "args.mode"),
    ("color", "blue", "args.color"),
    ("color", 1, "args.color"),
    ("level", 3, "args.level"),
    ("level", "1", "args.level"),
    ("level", True, "args.level"),
    ("point", {"x": "1"}, "args.point.x"),
    ("point", {"x": 1, "z": 2}, "args.point.z"),
    ("point", {"y": 1}, "args.point.x"),
    ("point", {"x": 1, "tags": ["a", 2]}, "args.point.tags[1]"),
    ("point", [1, 2], "args.point"),
    ("movie", {"title": "Heat", "year": "1995"}, "args.movie.year"),
    ("movie", {}, "args.movie.title"),
    ("movie", {"title": "Heat", "rating": 5}, "args.movie.rating"),
    ("pair", ["a", 1], "args.pair[1]"),
    ("maybe", "1", "args.maybe"),
    ("anything", {1, 2}, "args.anything"),
    ("anything", {"k": [1, math.nan]}, "args.anything.k[1]"),
    ("anything", ("a",), "args.anything"),
    ("limit", None, "args.limit"),
])
def test_each_kind_of_mismatch_is_reported_with_its_path(key: str, value: Any, path: str) -> None:
    args = {**copy.deepcopy(VALID), key: value}
    error = _input_error(kitchen_sink, args)
    assert error.details["path"] == path
    assert path in error.message and "kitchen_sink" in error.message


def test_a_missing_required_argument_names_it() -> None:
    args = copy.deepcopy(VALID)
    del args["count"]
    error = _input_error(kitchen_sink, args)
    assert error.details["path"] == "args.count"
    assert "missing" in error.message


def test_an_unknown_argument_is_rejected_and_the_known_ones_are_listed() -> None:
    error = _input_error(kitchen_sink, {**copy.deepcopy(VALID), "cuont": 1})
    assert error.details["path"] == "args.cuont"
    assert "unexpected" in error.message and "count" in error.message


@pytest.mark.parametrize("args", [None, [], "{}", ({"a": 1},), {1: 2}])
def test_args_must_be_a_json_object(args: object) -> None:
    assert _input_error(kitchen_sink, args).details["path"] == "args"


def test_the_error_message_says_what_was_expected_and_what_came() -> None:
    error = _input_error(kitchen_sink, {**copy.deepcopy(VALID), "count": "seven"})
    assert error.message == "tool 'kitchen_sink': args.count: expected integer, got string 'seven'"
    assert error.to_dict() == {"code": "tool_input_invalid", "message": error.message,
                               "tool": "kitchen_sink", "path": "args.count"}


def test_an_int_is_accepted_where_a_float_is_expected_and_kept_as_given() -> None:
    checked = kitchen_sink.validate_args({**copy.deepcopy(VALID), "ratio": 2, "scores": {"a": 3}})
    assert checked["ratio"] == 2 and type(checked["ratio"]) is int
    assert checked["scores"] == {"a": 3}


def test_enum_arguments_stay_raw_values_and_members_are_turned_into_values() -> None:
    checked = kitchen_sink.validate_args({**copy.deepcopy(VALID), "color": Color.GREEN, "level": Level.LOW})
    assert checked["color"] == "green" and type(checked["color"]) is str
    assert checked["level"] == 1 and type(checked["level"]) is int
    canonical_text(checked)


def test_a_union_reports_the_nested_error_of_the_only_branch_of_the_right_kind() -> None:
    @tool
    def fn(xs: list[int] | None) -> None:
        pass

    error = _input_error(fn, {"xs": [1, "x"]})
    assert error.details["path"] == "args.xs[1]"
    error = _input_error(fn, {"xs": "x"})
    assert error.details["path"] == "args.xs"
    assert "expected array or null, got string" in error.message


def test_a_union_with_no_branch_of_the_right_kind_lists_every_branch() -> None:
    @tool
    def fn(x: Literal["a"] | Color | dict[str, int] | Point | Annotated[list[int], "ids"]) -> None:
        pass

    error = _input_error(fn, {"x": 5})
    assert error.message == ("tool 'fn': args.x: expected one of \"a\" or Color (one of \"red\", \"green\") "
                             "or object or Point object or array, got integer 5")


def test_a_union_with_any_reports_why_the_value_is_not_json() -> None:
    @tool
    def fn(x: int | Any) -> None:
        pass

    assert fn.validate_args({"x": "s"}) == {"x": "s"}
    error = _input_error(fn, {"x": {"k": {1, 2}}})
    assert error.details["path"] == "args.x.k"
    assert "set" in error.message


def test_a_long_offending_value_is_shortened_in_the_message() -> None:
    @tool
    def fn(n: int) -> None:
        pass

    error = _input_error(fn, {"n": "x" * 500})
    assert error.message.endswith("...") and len(error.message) < 120


def test_literal_values_must_match_in_type_not_just_equality() -> None:
    @tool
    def fn(n: Literal[1, 2], b: Literal[True] = True) -> None:
        pass

    assert fn.validate_args({"n": 1}) == {"n": 1, "b": True}
    assert _input_error(fn, {"n": True}).details["path"] == "args.n"
    assert _input_error(fn, {"n": 1.0}).details["path"] == "args.n"
    assert _input_error(fn, {"n": 1, "b": 1}).details["path"] == "args.b"


def test_str_subclasses_are_not_plain_json_strings() -> None:
    class Shout(str):
        pass

    @tool
    def fn(text: str) -> None:
        pass

    assert _input_error(fn, {"text": Shout("x")}).details["path"] == "args.text"


# --- invoke ---------------------------------------------------------------------------


def test_invoke_calls_an_async_tool_with_validated_args_and_the_context() -> None:
    seen: list[Any] = []

    @tool
    async def send_email(to: str, body: str, context: ToolContext, retries: int = 3) -> str:
        seen.append((to, body, context, retries))
        return f"sent to {to}"

    context = ctx(attempt=2)
    assert run(send_email.invoke({"to": "a@b.c", "body": "hi"}, context)) == "sent to a@b.c"
    assert seen == [("a@b.c", "hi", context, 3)]
    assert seen[0][2].attempt == 2 and seen[0][2].idempotency_key == "key_1"


def test_invoke_injects_an_optional_context_parameter_too() -> None:
    @tool
    def fn(ctx: ToolContext | None = None) -> str:
        assert ctx is not None
        return ctx.effect_id

    assert run(fn.invoke({}, ctx())) == "eff_1"


def test_a_sync_tool_runs_in_a_worker_thread() -> None:
    @tool
    def where() -> int:
        return threading.get_ident()

    async def main() -> tuple[int, int]:
        return threading.get_ident(), await where.invoke({}, ctx())

    loop_thread, tool_thread = run(main())
    assert tool_thread != loop_thread


def test_a_sync_tool_does_not_block_the_event_loop() -> None:
    release = threading.Event()

    @tool
    def blocking() -> str:
        assert release.wait(5), "the event loop was blocked"
        return "done"

    async def main() -> str:
        call = asyncio.ensure_future(blocking.invoke({}, ctx()))
        await asyncio.sleep(0.01)
        release.set()  # only reachable while the tool waits, if the loop is free
        return await call  # type: ignore[no-any-return]

    assert run(main()) == "done"


def test_an_async_tool_runs_on_the_event_loop_thread() -> None:
    @tool
    async def where() -> int:
        return threading.get_ident()

    async def main() -> tuple[int, int]:
        return threading.get_ident(), await where.invoke({}, ctx())

    loop_thread, tool_thread = run(main())
    assert tool_thread == loop_thread


def test_invoke_converts_enums_dataclasses_and_tuples_but_keeps_typeddicts_as_dicts() -> None:
    received: dict[str, Any] = {}

    @tool
    def fn(color: Color, level: Level, shape: Shape, movie: Movie, pair: tuple[int, ...],
           colors: list[Color], maybe: Color | None, by_name: dict[str, Point]) -> None:
        received.update(color=color, level=level, shape=shape, movie=movie, pair=pair, colors=colors,
                        maybe=maybe, by_name=by_name)

    args = {"color": "green", "level": 2, "shape": {"name": "tri", "corners": [{"x": 1}, {"x": 2, "y": 3}]},
            "movie": {"title": "Heat"}, "pair": [1, 2], "colors": ["red"], "maybe": "red",
            "by_name": {"p": {"x": 5, "tags": ["t"]}}}
    before = copy.deepcopy(args)
    assert run(fn.invoke(args, ctx())) is None
    assert args == before
    assert received["color"] is Color.GREEN
    assert received["level"] is Level.HIGH
    assert received["shape"] == Shape("tri", [Point(1), Point(2, 3)], Color.RED)
    assert received["shape"].color is Color.RED
    assert received["movie"] == {"title": "Heat"} and type(received["movie"]) is dict
    assert received["pair"] == (1, 2)
    assert received["colors"] == [Color.RED]
    assert received["maybe"] is Color.RED
    assert received["by_name"] == {"p": Point(5, 0, ["t"])}


def test_invoke_passes_plain_containers_and_picks_the_matching_union_branch() -> None:
    received: dict[str, Any] = {}

    @tool
    def fn(scores: dict[str, float], either: Level | Color, stamped: Stamped) -> None:
        received.update(scores=scores, either=either, stamped=stamped)

    args = {"scores": {"a": 1.5}, "either": "red", "stamped": {"x": 1}}
    run(fn.invoke(args, ctx()))
    assert received["scores"] == {"a": 1.5} and received["scores"] is not args["scores"]
    assert received["either"] is Color.RED
    assert received["stamped"].x == 1 and received["stamped"].seen == 0


def test_a_default_without_json_form_is_supplied_by_python() -> None:
    @tool
    def fn(a: Any = math.inf) -> bool:
        return bool(a == math.inf)

    assert fn.validate_args({}) == {}
    assert run(fn.invoke({}, ctx())) is True


def test_invoke_validates_before_calling() -> None:
    calls: list[int] = []

    @tool
    def fn(a: int) -> int:
        calls.append(a)
        return a

    with pytest.raises(ToolInputError) as caught:
        run(fn.invoke({"a": "1"}, ctx()))
    assert caught.value.details["path"] == "args.a"
    assert calls == []


def test_invoke_requires_a_tool_context() -> None:
    @tool
    def fn() -> None:
        pass

    with pytest.raises(InvalidInput):
        run(fn.invoke({}, {"effect_id": "x"}))  # type: ignore[arg-type]


def test_invoke_does_not_enforce_the_timeout() -> None:
    @tool(timeout=0.001)
    async def slow() -> str:
        await asyncio.sleep(0.05)
        return "late"

    assert run(slow.invoke({}, ctx())) == "late"


def test_tool_error_raised_by_the_function_propagates_unchanged() -> None:
    raised = ToolError("card declined", code="declined", data={"retry": False})

    @tool
    async def charge(amount: int) -> None:
        raise raised

    @tool
    def charge_sync(amount: int) -> None:
        raise raised

    for made in (charge, charge_sync):
        with pytest.raises(ToolError) as caught:
            run(made.invoke({"amount": 5}, ctx()))
        assert caught.value is raised


def test_any_other_exception_propagates_unchanged() -> None:
    @tool
    def broken() -> None:
        raise ConnectionResetError("peer went away")

    with pytest.raises(ConnectionResetError, match="peer went away"):
        run(broken.invoke({}, ctx()))


# --- output validation ----------------------------------------------------------------


def _output_error(made: Tool) -> ToolOutputError:
    with pytest.raises(ToolOutputError) as caught:
        run(made.invoke({}, ctx()))
    error = caught.value
    assert isinstance(error, JixuError) and not isinstance(error, InvalidInput)
    assert error.code == "tool_output_invalid"
    assert error.details["tool"] == made.name
    canonical_text(error.to_dict())
    return error


@pytest.mark.parametrize(("value", "path"), [
    ({1, 2}, "result"),
    (math.nan, "result"),
    ({"x": [1, math.inf]}, "result.x[1]"),
    ((1, 2), "result"),
    ({1: "a"}, "result"),
    (Color.RED, "result"),
    (Point(1), "result"),
    (b"bytes", "result"),
])
def test_a_result_that_is_not_plain_json_is_rejected(value: Any, path: str) -> None:
    @tool
    def fn():  # type: ignore[no-untyped-def]
        return value

    error = _output_error(fn)
    assert error.details["path"] == path
    assert "not plain JSON" in error.message


@pytest.mark.parametrize(("returns", "value", "path"), [
    (int, "x", "result"),
    (int, None, "result"),
    (int, True, "result"),
    (None, 0, "result"),
    (list[str], ["a", 1], "result[1]"),
    (dict[str, int], {"a": "b"}, "result.a"),
    (Point, {"x": 1, "extra": 2}, "result.extra"),
    (Literal["ok"], "nope", "result"),
    (Color, "blue", "result"),
])
def test_a_result_that_does_not_match_the_return_annotation_is_rejected(returns: Any, value: Any, path: str) -> None:
    def fn() -> Any:
        return value

    fn.__annotations__ = {"return": returns}
    error = _output_error(tool(fn))
    assert error.details["path"] == path
    assert "return annotation" in error.message


@pytest.mark.parametrize(("returns", "value"), [
    (int, 3), (float, 3), (None, None), (Any, {"a": [1, None]}), (list[str], ["a"]), (Color, "red"),
    (Point, {"x": 1}), (int | None, None), (tuple[int, ...], [1, 2]),
])
def test_a_plain_json_result_matching_the_annotation_is_returned_as_is(returns: Any, value: Any) -> None:
    def fn() -> Any:
        return value

    fn.__annotations__ = {"return": returns}
    assert run(tool(fn).invoke({}, ctx())) is value


# --- ToolError and ToolContext --------------------------------------------------------


def test_tool_error_to_dict_is_json_ready() -> None:
    error = ToolError("card declined", code="declined", data={"retry": False, "codes": [1, 2]})
    assert str(error) == "card declined"
    assert error.to_dict() == {"type": "tool_error", "code": "declined", "message": "card declined",
                               "data": {"retry": False, "codes": [1, 2]}}
    canonical_text(error.to_dict())
    error.to_dict()["data"]["codes"].append(3)
    assert error.data == {"retry": False, "codes": [1, 2]}


def test_tool_error_defaults_and_it_is_not_a_jixu_error() -> None:
    error = ToolError("nope")
    assert error.to_dict() == {"type": "tool_error", "code": "tool_error", "message": "nope", "data": None}
    assert not isinstance(error, JixuError)


def test_tool_error_rejects_data_that_is_not_json_and_an_empty_code() -> None:
    with pytest.raises(MalformedEvent):
        ToolError("x", data={"s": {1}})
    with pytest.raises(InvalidInput):
        ToolError("x", code="")


def test_tool_context_is_frozen_and_slotted() -> None:
    context = ctx()
    with pytest.raises(dataclasses.FrozenInstanceError):
        context.attempt = 2  # type: ignore[misc]
    assert not hasattr(context, "__dict__")
    assert [f.name for f in dataclasses.fields(ToolContext)] == [
        "effect_id", "idempotency_key", "attempt", "thread_id", "turn_id"]


def test_the_module_exports_exactly_its_public_names() -> None:
    import jixu.threads.tools as module

    assert sorted(module.__all__) == ["ArgumentsSchema", "DEFAULT_PROBE_TIMEOUT", "DEFINITE_ANSWERS", "DontKnow", "NotOccurred",
                                      "Occurred", "ProbeAnswer", "ProbeQuery", "Semantics", "Tool", "ToolContext",
                                      "ToolError", "tool"]


def test_a_read_only_tool_that_raises_at_every_attempt_is_a_failure_the_model_is_told(tmp_path: Any) -> None:
    """An audit: a read-only lookup that raised at each of its attempts stopped its thread "waiting for an operator's
    resolution", as if it might have acted. Past its last attempt its error is its outcome: determinate, the model
    is told, the turn goes on. An idempotent tool raising so stays unknown (it may have acted)."""
    from jixu import Agent, Harness, ScriptedModel, ToolCall
    from jixu.ledger import SQLiteStore

    calls: list[str] = []

    @tool(semantics="read_only")
    async def lookup(sku: str) -> str:
        """Look a product up."""
        calls.append(sku)
        raise ValueError(f"no such sku {sku}")

    def script(messages: list[dict[str, Any]]) -> str | ToolCall:
        last = messages[-1]
        return ToolCall("lookup", {"sku": "x"}) if last.get("role") == "user" else f"told: {last.get('content')}"

    async def main() -> tuple[Any, list[Any]]:
        with SQLiteStore(tmp_path / "ro.db") as store:
            async with Harness(Agent("ro", ScriptedModel(script), tools=[lookup]), store, max_attempts=3) as harness:
                thread = await harness.create_thread()
                await thread.send("look it up")
                state = await thread.wait()
                return state, [e for e in store.read(thread.log.stream) if e.type == "tool.failed"]

    state, failed = asyncio.run(main())
    assert calls == ["x", "x", "x"]
    assert state.status == "idle" and "no such sku x" in str(state.last_reply), (state.status, state.reason)
    assert [e.data["indeterminate"] for e in failed] == [True, True, False]
