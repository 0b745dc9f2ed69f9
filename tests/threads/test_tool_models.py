"""Tools whose arguments and results are pydantic models or dataclasses; the digests of today's tools pinned.

The pins were taken from the code before pydantic models were supported: a tool
declared with plain annotations must keep exactly its schema, its contract digest
and its canonical arguments, or every existing thread would see a new revision.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal, NewType, NotRequired, Optional, TypedDict

import jsonschema
import pydantic
import pytest
from pydantic import BaseModel, ConfigDict, Field, computed_field, create_model
from pydantic.dataclasses import dataclass as pydantic_dataclass

from jixu.cli.demo import refund_agent
from jixu.cli.studio import fixture_agent
from jixu.errors import ToolDefinitionError, ToolInputError, ToolOutputError
from jixu.ledger.encoding import canonical_text, content_hash
from jixu.runs.workspace_tools import workspace_tools
from jixu.threads import Agent, Harness, State, ToolCall
from jixu.threads.model import ScriptedModel, Step
from jixu.threads.openai import OpenAIModel
from jixu.threads.steps import _step_tool
from jixu.threads.tools import NotOccurred, Occurred, ProbeQuery, Tool, ToolContext, tool
from tests.helpers import python_env
from tests.providers.fake_servers import Call, Completion, FakeOpenAI
from tests.threads.conftest import TouchlessModel, assert_same_answer

# --- today's tools, pinned --------------------------------------------------------------


class PinColor(enum.Enum):
    RED = "red"
    GREEN = "green"


class PinLevel(enum.IntEnum):
    LOW = 1
    HIGH = 2


@dataclasses.dataclass
class PinPoint:
    x: int
    y: Annotated[int, "vertical"] = 0
    tags: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class PinShape:
    name: str
    corners: list[PinPoint]
    color: PinColor = PinColor.RED


class PinMovie(TypedDict):
    title: str
    year: NotRequired[int]


PinUserId = NewType("PinUserId", str)


def _pin_probe(query: ProbeQuery) -> NotOccurred:
    return NotOccurred()


def pinned_tools() -> list[Tool]:
    """One tool per kind of annotation the code accepted before models, with every option."""

    @tool
    def add(a: int, b: int = 2) -> int:
        """Add."""
        return a + b

    @tool(semantics="read_only")
    def scalars(text: str, ratio: float, flag: bool, nothing: None, anything: Any, when: str | None = None) -> str:
        return text

    @tool(semantics="idempotent", requires_approval=True, timeout=5)
    def containers(ids: list[int], pair: tuple[str, ...], scores: dict[str, float], bare: list, table: dict,  # type: ignore[type-arg]
                   nested: list[dict[str, list[bool]]] | None = None) -> list[str]:
        return []

    @tool(semantics="unsafe", probe=_pin_probe)
    def choices(mode: Literal["fast", "slow"], color: PinColor, level: PinLevel, ctx: ToolContext,
                user: PinUserId, note: Annotated[str, "A note."] = "", maybe: Optional[PinColor] = None,  # noqa: UP045
                lit: Literal["a", 1, None] = None, default_color: PinColor = PinColor.GREEN) -> PinColor:
        return color

    @tool
    def records(shape: PinShape, movie: PinMovie, points: list[PinPoint], by_name: dict[str, PinMovie],
                where: PinPoint = PinPoint(1, 2)) -> PinShape:  # noqa: B008
        return shape

    @tool
    def nothing_back() -> None:
        pass

    @tool
    def unannotated_result(a: int):  # type: ignore[no-untyped-def]
        return a

    return [add, scalars, containers, choices, records, nothing_back, unannotated_result]


def shipped_tools(tmp: Path) -> list[Tool]:
    """The tools jixu itself defines: the workspace tools, the demo's, the Studio fixture's, a durable step's."""
    step = _step_tool("charge", lambda ctx: None, semantics="unsafe", probe=_pin_probe, probe_timeout=None,
                      requires_approval=False, timeout=None)
    return [*workspace_tools(tmp), *refund_agent(tmp / "outside.log").agent.tools, *fixture_agent().tools, step]


PINNED_DIGESTS = {  # name: (content_hash(contract()), content_hash(spec())), taken before models were supported
    "add": ("f6d89d617e9b0ba0f3882a8764df6db91d47105d0f6ea218b9318a09d6451a8c",
            "2f0d66cbaef28629ea292eaa6cf754eb99452cd9a2e4691fec5b24c3f0a7b7d5"),
    "scalars": ("24064316fd8bb6481682d8291700beeb1b0cf4b971068fa4bb924c2387b98840",
                "a9d516af3077810faffafa34049cd5a57d14da7ad8e24295c5812236e2c84671"),
    "containers": ("26ab7fad1d72c958d294fe9aa611356afa2003ef9c31278148964883e57cf129",
                   "d2479628726a5a6cee9a311ed7c85b4c1ea55544da22b9d9a603e879385390db"),
    "choices": ("97b00b54f0959107594c3616a303ee0b7409e164892159ab4480200c88303690",
                "19f5d4044e2b2a87e11b1fce0ffb973d981cb2cce7ee074bf3b46f1fb6a3a80f"),
    "records": ("aaa8c2977d4ecd50c0a7a53cc449a96c1e7bd0d32284f980cd15c85330717a97",
                "4a84d81820e6f0df5f0f81852c0ee765a3ed4d0c7954feafaca5f6bc3f2671f5"),
    "nothing_back": ("57a585bb1e17396810d4c0cb826bbedac4dd64f09be432a2d9ee41e32d31b228",
                     "43be6286ea8cde5901b0058a54575d656c77fca7a822d211de0d4a1c303c7e5c"),
    "unannotated_result": ("0af94ddca1f071145ea51fa1067e150e029a0be0ef7a9af74f01944b078ffa3b",
                           "88ac2d45b632b3a11c905137f209a5a7d359703050408788f52d043a542f8a53"),
    "read_file": ("231dbda051bf8312cc26e434455cd7212ee46de5c4b07002b6dcac664ebd4d4a",
                  "07d5f7ed5aa4a1be6d3ad5562fc46f1a5992a34eaddf0956f5f0e696cbbd8e63"),
    "list_files": ("7a8d3accc7e5964c35117dbcf20638ea2c5ee62290da0d4f6b28a0d14fb917bb",
                   "7b9da413561847b05d220f3bac2821f83e179bfaf2f96924beba1293dd1e9aca"),
    "write_file": ("756bc7e5ca7a62f2d546b30e184ba34250ce580766ca76225138e44d004f228f",
                   "1ef80b113fa9c4eca87f0227f8b56e254bd01d8a3ed13fea6c66ce1976cc2eeb"),
    "edit_file": ("46ddfc6e74f849d3b3cd3e2756738c38d46ec5e11bf5d59d22051bcbe5b9249c",
                  "41c6e0ec9f67f715ddfc484fbde44df03acb86c85fe424785733f9e3288f0de8"),
    "run_command": ("04965b5abc53ed52bf03370e79e23a97e340a8bd8f70ad113a287fd0ec85063a",
                    "2d791487d6c5301508d4f14d4e4f8ce6f8c557554aac2df4831419742afc2e7f"),
    "issue_refund": ("164ad08ffc30587a29ad4f98c77cb68ef5c5790c72cb87f1b00fc7e329a08211",
                     "e891afc1f302d81d9f496afff497d9a83bb4cd51a15566acab9ef4e3f9f07694"),
    "notify_customer": ("db23acca94aa8d138c20b0ee11d413a065e11609cc62052150db40c778815924",
                        "5ba0d00e33f6d4b9c588d1c4008c45d5a9b33310a47d97f63c37e1b20896dc90"),
    "charge_card": ("654ede3eebb300a4144084c16d2bf33704561866f6ade3e65e680c54a2bc9124",
                    "10c041f1c0c75e9940780436d7394d9628a2e12cc043b60f4e43f5be4eec5ff8"),
    "refund": ("0b02c8d1194440732361d4ba0ba57a3c10204ca666f4372b0df85d8691192659",
               "07701fabf1c0c00734b866661a291ed4061fbfe06cf1352bd6a7a96f9ff1703d"),
    "charge": ("14fb6dd422c139776352d73f09cefcbc90ea2508ffe87cf0a6fe2ba2b1875be5",
               "28f5ed8cdaae3ffcce59c667bf0c5559a834b463d7dffceaec653753793bb608"),
}

PINNED_ARGS = {  # name: (sample args, canonical text of validate_args(sample)), taken before models were supported
    "add": ({"a": 1}, '{"a":1,"b":2}'),
    "scalars": ({"text": "t", "ratio": 2, "flag": True, "nothing": None, "anything": {"k": [1, None]}},
                '{"anything":{"k":[1,null]},"flag":true,"nothing":null,"ratio":2,"text":"t","when":null}'),
    "containers": ({"ids": [1, 2], "pair": ["a"], "scores": {"a": 1.5}, "bare": [1, "x"], "table": {"k": {}}},
                   '{"bare":[1,"x"],"ids":[1,2],"nested":null,"pair":["a"],"scores":{"a":1.5},"table":{"k":{}}}'),
    "choices": ({"mode": "fast", "color": "red", "level": 2, "user": "u1"},
                '{"color":"red","default_color":"green","level":2,"lit":null,"maybe":null,"mode":"fast","note":"",'
                '"user":"u1"}'),
    "records": ({"shape": {"name": "tri", "corners": [{"x": 1}, {"x": 2, "y": 3, "tags": ["a"]}]},
                 "movie": {"title": "Heat"}, "points": [], "by_name": {"m": {"title": "Ran", "year": 1985}}},
                '{"by_name":{"m":{"title":"Ran","year":1985}},"movie":{"title":"Heat"},"points":[],"shape":'
                '{"color":"red","corners":[{"x":1,"y":0},{"tags":["a"],"x":2,"y":3}],"name":"tri"},"where":'
                '{"tags":[],"x":1,"y":2}}'),
    "nothing_back": ({}, "{}"),
    "unannotated_result": ({"a": 3}, '{"a":3}'),
}


def test_the_contracts_and_specs_of_todays_tools_keep_their_pinned_digests(tmp_path: Path) -> None:
    tools = [*pinned_tools(), *shipped_tools(tmp_path)]
    assert sorted(t.name for t in tools) == sorted(PINNED_DIGESTS)
    found = {t.name: (content_hash(t.contract()), content_hash(t.spec())) for t in tools}
    assert found == PINNED_DIGESTS


def test_an_agent_of_todays_tools_keeps_its_pinned_contract_and_digest() -> None:
    agent = Agent("pins", ScriptedModel(["done"]), tools=pinned_tools())
    assert agent.contract == "b95c758d115c02e8ece58de9708991c77b152dbdb36afe51cd747c9599245645"
    assert agent.digest == "94749273cdc7074d9723ba9160f607a6a0e3bf54f5650af15359a4da58b8b4b7"


@pytest.mark.parametrize("name", sorted(PINNED_ARGS))
def test_the_canonical_arguments_of_todays_tools_are_pinned(name: str) -> None:
    made = {t.name: t for t in pinned_tools()}[name]
    sample, expected = PINNED_ARGS[name]
    assert canonical_text(made.validate_args(sample)) == expected


# --- models of the tests below (module level: type hints are resolved against module globals) ----------


class Size(enum.Enum):
    SMALL = "s"
    LARGE = "l"


class Item(BaseModel):
    sku: str
    quantity: int = Field(1, gt=0, description="How many.")
    size: Size = Size.SMALL


class Order(BaseModel):
    """An order to place."""

    customer: str
    items: list[Item]
    note: Optional[str] = None  # noqa: UP045
    deliver_on: datetime.date | None = None
    speed: Literal["standard", "express"] = "standard"


class Receipt(BaseModel):
    order_id: str
    total: float
    items: list[Item]


class Closed(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    count: int


@pydantic_dataclass
class Span:
    start: int = Field(ge=0)
    end: int = Field(ge=0)


@dataclasses.dataclass
class Parcel:
    weight: float
    size: Size
    labels: tuple[str, ...] = ()


class Shipment(TypedDict):
    order: Order
    parcels: NotRequired[list[Parcel]]


class Recursive(BaseModel):
    name: str
    children: list[Recursive] = []


class Unschematic(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    callback: Callable[[], int]


class NotFullyDefined(BaseModel):
    later: Later  # type: ignore[name-defined]  # noqa: F821  # never defined: pydantic cannot complete the model


def ctx(attempt: int = 1) -> ToolContext:
    """A context as the harness would build it."""
    return ToolContext(effect_id="eff_1", idempotency_key="key_1", attempt=attempt, thread_id="thr_1",
                       turn_id="turn_1")


def call(made: Tool, args: dict[str, Any]) -> Any:
    """``made.invoke(args)`` on a fresh event loop."""
    return asyncio.run(made.invoke(args, ctx()))


def input_error(made: Tool, args: object) -> ToolInputError:
    with pytest.raises(ToolInputError) as caught:
        made.validate_args(args)
    assert caught.value.code == "tool_input_invalid" and caught.value.details["tool"] == made.name
    return caught.value


def output_error(made: Tool) -> ToolOutputError:
    with pytest.raises(ToolOutputError) as caught:
        call(made, {})
    assert caught.value.code == "tool_output_invalid" and caught.value.details["tool"] == made.name
    canonical_text(caught.value.to_dict())
    return caught.value


def definition_error(fn: Callable[..., Any]) -> ToolDefinitionError:
    with pytest.raises(ToolDefinitionError) as caught:
        tool(fn)
    assert caught.value.code == "tool_definition_invalid"
    return caught.value


ORDER = {"customer": "ada", "items": [{"sku": "A-1", "quantity": 2}, {"sku": "B-2", "size": "l"}]}
ORDER_DUMP = {"customer": "ada", "items": [{"sku": "A-1", "quantity": 2, "size": "s"},
                                           {"sku": "B-2", "quantity": 1, "size": "l"}],
              "note": None, "deliver_on": None, "speed": "standard"}


PLACE_ORDER_DIGEST = "5aeda3f820130795d19b4297829699dbcfe01b2495ff3fe05036dbfee1b8090f"
"""``place_order``'s contract digest under pydantic 2.14."""


@tool(semantics="idempotent")
def place_order(order: Order, rush: bool = False) -> Receipt:
    """Place an order."""
    return Receipt(order_id=f"o-{order.customer}", total=9.5 * len(order.items), items=order.items)


# --- schemas ------------------------------------------------------------------------------


def test_a_model_argument_has_pydantics_schema_with_its_definitions_at_the_root() -> None:
    expected_defs = Order.model_json_schema(ref_template="#/$defs/{model}")
    nested = expected_defs.pop("$defs")
    assert place_order.parameters == {
        "type": "object",
        "properties": {"order": {"$ref": "#/$defs/Order"}, "rush": {"type": "boolean", "default": False}},
        "required": ["order"],
        "additionalProperties": False,
        "$defs": {**nested, "Order": expected_defs},
    }
    defs = place_order.parameters["$defs"]
    assert defs["Order"]["description"] == "An order to place."
    assert defs["Order"]["properties"]["speed"] == {"default": "standard", "enum": ["standard", "express"],
                                                    "title": "Speed", "type": "string"}
    assert defs["Order"]["properties"]["deliver_on"]["anyOf"] == [{"format": "date", "type": "string"},
                                                                  {"type": "null"}]
    assert defs["Item"]["properties"]["quantity"] == {"default": 1, "description": "How many.",
                                                      "exclusiveMinimum": 0, "title": "Quantity", "type": "integer"}
    assert defs["Size"] == {"enum": ["s", "l"], "title": "Size", "type": "string"}


def test_a_model_result_has_the_schema_of_its_dump_as_a_document_of_its_own() -> None:
    schema = Receipt.model_json_schema(mode="serialization", ref_template="#/$defs/{model}")
    nested = schema.pop("$defs")
    assert place_order.returns == {"$ref": "#/$defs/Receipt", "$defs": {**nested, "Receipt": schema}}


def test_models_inside_containers_unions_and_annotated_refer_to_the_same_definitions() -> None:
    @tool
    def many(items: list[Item], by_name: dict[str, Item], maybe: Item | None,
             described: Annotated[Order, "The order."]) -> list[Item]:
        return items

    properties = many.parameters["properties"]
    assert properties == {
        "items": {"type": "array", "items": {"$ref": "#/$defs/Item"}},
        "by_name": {"type": "object", "additionalProperties": {"$ref": "#/$defs/Item"}},
        "maybe": {"anyOf": [{"$ref": "#/$defs/Item"}, {"type": "null"}]},
        "described": {"$ref": "#/$defs/Order", "description": "The order."},
    }
    assert sorted(many.parameters["$defs"]) == ["Item", "Order", "Size"]
    assert many.returns["items"] == {"$ref": "#/$defs/Item"} and sorted(many.returns["$defs"]) == ["Item", "Size"]


def test_two_models_of_the_same_name_get_two_definitions() -> None:
    def model_named_item(field: str) -> type[BaseModel]:
        return create_model("Item", **{field: (int, ...)})  # type: ignore[call-overload, no-any-return]

    first, second = model_named_item("a"), model_named_item("b")

    def both(one: Any, two: Any) -> None:
        pass

    both.__annotations__ = {"one": first, "two": second, "return": None}
    made = tool(both)
    refs = [made.parameters["properties"][name]["$ref"] for name in ("one", "two")]
    assert refs[0] != refs[1]
    defs = made.parameters["$defs"]
    assert [sorted(defs[ref.rsplit("/", 1)[1]]["properties"]) for ref in refs] == [["a"], ["b"]]


def test_a_recursive_model_is_supported_through_its_definition() -> None:
    @tool
    def tree(root: Recursive) -> int:
        return len(root.children)

    assert tree.parameters["properties"]["root"] == {"$ref": "#/$defs/Recursive"}
    assert tree.parameters["$defs"]["Recursive"]["properties"]["children"]["items"] == {"$ref": "#/$defs/Recursive"}
    assert call(tree, {"root": {"name": "a", "children": [{"name": "b"}, {"name": "c", "children": []}]}}) == 2


def test_a_pydantic_dataclass_argument_has_pydantics_schema() -> None:
    @tool
    def measure(span: Span) -> int:
        return span.end - span.start

    span = measure.parameters["$defs"]["Span"]
    assert span["required"] == ["start", "end"]
    assert span["properties"]["start"] == {"minimum": 0, "title": "Start", "type": "integer"}


def test_a_plain_dataclass_keeps_todays_schema_even_beside_a_model() -> None:
    @tool
    def ship(parcel: Parcel, order: Order) -> None:
        pass

    assert ship.parameters["properties"]["parcel"] == {
        "type": "object",
        "properties": {"weight": {"type": "number"}, "size": {"type": "string", "enum": ["s", "l"]},
                       "labels": {"type": "array", "items": {"type": "string"}, "default": []}},
        "required": ["weight", "size"],
        "additionalProperties": False,
    }


def test_the_same_model_tool_always_yields_the_same_contract_and_a_changed_model_another() -> None:
    def define() -> Tool:
        def place(order: Order) -> Receipt:
            raise AssertionError("not called")

        return tool(place, semantics="idempotent")

    first, second = define(), define()
    assert canonical_text(first.contract()) == canonical_text(second.contract())
    assert content_hash(first.contract()) == content_hash(second.contract())
    changed = create_model("Order", __base__=Order, gift=(bool, False))

    def place(order: Any) -> Receipt:
        raise AssertionError("not called")

    place.__annotations__ = {"order": changed, "return": Receipt}
    assert content_hash(tool(place, semantics="idempotent").contract()) != content_hash(first.contract())


def test_a_model_tools_digest_is_pinned_under_this_pydantic() -> None:
    # If this fails after a pydantic upgrade, pydantic's JSON Schemas changed: every thread whose agent has a
    # model tool will record a new revision (refused while a call of that tool is open). Say so in the CHANGELOG.
    assert content_hash(place_order.contract()) == PLACE_ORDER_DIGEST, pydantic.VERSION


# --- arguments ----------------------------------------------------------------------------


def test_model_arguments_are_recorded_as_the_models_json_dump() -> None:
    checked = place_order.validate_args({"order": {**ORDER, "deliver_on": "2026-03-01"}})
    assert checked == {"order": {**ORDER_DUMP, "deliver_on": "2026-03-01"}, "rush": False}
    canonical_text(checked)
    assert place_order.validate_args(checked) == checked, "the canonical arguments validate to themselves"


def test_a_lax_model_normalizes_what_it_coerces_so_the_record_matches_the_schema() -> None:
    checked = place_order.validate_args({"order": {"customer": "ada", "items": [{"sku": "A", "quantity": "3"}]}})
    assert checked["order"]["items"] == [{"sku": "A", "quantity": 3, "size": "s"}]


def test_the_function_receives_model_instances_with_nested_models_and_enum_members() -> None:
    seen: list[Any] = []

    @tool
    def take(order: Order, extra: list[Item] | None = None, ctx: ToolContext | None = None) -> None:
        seen.extend([order, extra, ctx])

    args = {"order": {**ORDER, "deliver_on": "2026-03-01", "speed": "express"}, "extra": [{"sku": "C"}]}
    before = json.dumps(args)
    assert call(take, args) is None
    order, extra, context = seen
    assert json.dumps(args) == before, "the arguments given are not changed"
    assert isinstance(order, Order) and order.customer == "ada" and order.speed == "express"
    assert order.deliver_on == datetime.date(2026, 3, 1)
    assert [type(item) for item in order.items] == [Item, Item]
    assert order.items[1].size is Size.LARGE and order.items[1].quantity == 1
    assert extra == [Item(sku="C")] and isinstance(context, ToolContext)


def test_a_dataclass_and_a_typeddict_may_hold_models_and_a_model_may_hold_a_dataclass() -> None:
    class Box(BaseModel):
        parcel: Parcel

    seen: list[Any] = []

    def pack(shipment: Any, box: Any) -> None:
        seen.extend([shipment, box])

    pack.__annotations__ = {"shipment": Shipment, "box": Box, "return": None}
    made = tool(pack)
    call(made, {"shipment": {"order": ORDER, "parcels": [{"weight": 2, "size": "l"}]},
                "box": {"parcel": {"weight": 1.5, "size": "s", "labels": ["fragile"]}}})
    shipment, box = seen
    assert type(shipment) is dict and isinstance(shipment["order"], Order)
    assert shipment["parcels"] == [Parcel(2, Size.LARGE)]
    assert box.parcel == Parcel(1.5, Size.SMALL, ("fragile",))


def test_a_pydantic_dataclass_argument_is_validated_before_the_call() -> None:
    calls: list[Span] = []

    @tool
    def measure(span: Span) -> int:
        calls.append(span)
        return span.end - span.start

    assert call(measure, {"span": {"start": 1, "end": 4}}) == 3
    assert isinstance(calls[0], Span)
    with pytest.raises(ToolInputError) as caught:
        call(measure, {"span": {"start": -1, "end": 4}})
    assert caught.value.details["path"] == "args.span.start"
    assert len(calls) == 1


def test_a_model_default_is_written_as_its_dump_and_supplied_when_absent() -> None:
    seen: list[Order] = []

    @tool
    def reorder(order: Order = Order(customer="ada", items=[Item(sku="A")])) -> None:  # noqa: B008
        seen.append(order)

    default = {"customer": "ada", "items": [{"sku": "A", "quantity": 1, "size": "s"}], "note": None,
               "deliver_on": None, "speed": "standard"}
    assert reorder.parameters["properties"]["order"] == {"$ref": "#/$defs/Order", "default": default}
    assert reorder.parameters["required"] == []
    assert reorder.validate_args({}) == {"order": default}
    call(reorder, {})
    assert seen == [Order(customer="ada", items=[Item(sku="A")])]


# --- validation errors --------------------------------------------------------------------


@pytest.mark.parametrize(("order", "path", "words"), [
    ({**ORDER, "customer": 7}, "args.order.customer", "Input should be a valid string, got integer 7"),
    ({"items": []}, "args.order.customer", "missing required key 'customer'"),
    ({**ORDER, "items": [{"sku": "A", "quantity": 0}]}, "args.order.items[0].quantity",
     "Input should be greater than 0, got integer 0"),
    ({**ORDER, "items": [{"sku": "A", "size": "xl"}]}, "args.order.items[0].size", "Input should be 's' or 'l'"),
    ({**ORDER, "speed": "warp"}, "args.order.speed", "Input should be 'standard' or 'express'"),
    ({**ORDER, "note": ["x"]}, "args.order.note", "Input should be a valid string"),
    ({**ORDER, "deliver_on": "someday"}, "args.order.deliver_on", "Input should be a valid date"),
    ({**ORDER, "items": "A-1"}, "args.order.items", "Input should be a valid array"),
    ("ada", "args.order", "Input should be an object, got string 'ada'"),
    ({**ORDER, "items": [{"sku": "A", "quantity": math.inf}]}, "args.order.items[0].quantity",
     "args.order.items[0].quantity is inf; NaN and Infinity are not JSON"),
])
def test_a_bad_model_argument_is_a_tool_input_error_naming_its_path(order: Any, path: str, words: str) -> None:
    error = input_error(place_order, {"order": order})
    assert error.details["path"] == path
    assert error.message.startswith("tool 'place_order': ") and path in error.message
    assert words in error.message
    assert error.to_dict() == {"code": "tool_input_invalid", "message": error.message, "tool": "place_order",
                               "path": path}


def test_several_problems_are_named_at_once_up_to_five() -> None:
    items = [{"sku": index} for index in range(7)]
    error = input_error(place_order, {"order": {"customer": "ada", "items": items}})
    assert error.details["path"] == "args.order.items[0].sku"
    assert error.message.count("Input should be a valid string") == 5
    assert error.message.endswith("; and 2 more")


def test_the_models_config_decides_strictness_and_extra_keys() -> None:
    @tool
    def count(value: Closed) -> int:
        return value.count

    assert count.validate_args({"value": {"count": 3}}) == {"value": {"count": 3}}
    assert input_error(count, {"value": {"count": "3"}}).details["path"] == "args.value.count"
    error = input_error(count, {"value": {"count": 3, "extra": 1}})
    assert error.details["path"] == "args.value.extra" and "unexpected key 'extra'" in error.message
    assert place_order.validate_args({"order": {**ORDER, "unknown": 1}})["order"] == ORDER_DUMP, \
        "a model that ignores extra keys drops them from the record"


def test_the_tool_level_rules_still_apply_around_a_model() -> None:
    assert input_error(place_order, {}).details["path"] == "args.order"
    assert input_error(place_order, {"order": ORDER, "rsuh": True}).details["path"] == "args.rsuh"
    assert input_error(place_order, {"order": Order(customer="ada", items=[])}).details["path"] == "args.order"


def test_a_union_of_a_model_and_null_reports_the_models_nested_problem() -> None:
    @tool
    def maybe(item: Item | None) -> None:
        pass

    error = input_error(maybe, {"item": {"sku": "A", "quantity": -1}})
    assert error.details["path"] == "args.item.quantity"
    assert maybe.validate_args({"item": None}) == {"item": None}


# --- definition errors --------------------------------------------------------------------


def test_a_model_pydantic_has_no_json_schema_for_is_a_definition_error_naming_the_parameter() -> None:
    def register(hook: Unschematic) -> None:
        pass

    error = definition_error(register)
    assert error.details == {"function": register.__qualname__, "parameter": "hook"}
    assert "Unschematic" in error.message and "JSON Schema" in error.message
    assert "errors.pydantic.dev" not in error.message


def test_a_model_that_is_not_fully_defined_is_a_definition_error() -> None:
    def use(value: NotFullyDefined) -> None:
        pass

    error = definition_error(use)
    assert error.details["parameter"] == "value" and "NotFullyDefined" in error.message


def test_an_unsupported_result_model_is_a_definition_error_of_the_return_annotation() -> None:
    def give() -> Unschematic:
        raise AssertionError("not called")

    assert "return annotation" in definition_error(give).message


def test_a_bad_model_default_is_a_definition_error() -> None:
    def fn(item: Item = {"sku": 5}) -> None:  # type: ignore[assignment]  # noqa: B006
        pass

    error = definition_error(fn)
    assert error.details["parameter"] == "item" and "default" in error.message


def test_pydantic_types_other_than_models_stay_unsupported_annotations() -> None:
    def fn(when: datetime.datetime) -> None:
        pass

    error = definition_error(fn)
    assert "datetime" in error.message and "pydantic models" in error.message


# --- results ------------------------------------------------------------------------------


def test_a_model_result_is_dumped_to_plain_json() -> None:
    result = call(place_order, {"order": ORDER})
    assert result == {"order_id": "o-ada", "total": 19.0, "items": ORDER_DUMP["items"]}
    canonical_text(result)


def test_a_plain_dict_result_of_a_model_tool_is_validated_and_normalized() -> None:
    @tool
    def quote() -> Receipt:
        return {"order_id": "q", "total": 3, "items": [{"sku": "A"}]}  # type: ignore[return-value]

    assert call(quote, {}) == {"order_id": "q", "total": 3.0, "items": [{"sku": "A", "quantity": 1, "size": "s"}]}


@pytest.mark.parametrize(("returns", "value", "expected"), [
    (Parcel, Parcel(1.5, Size.LARGE, ("a",)), {"weight": 1.5, "size": "l", "labels": ["a"]}),
    (list[Parcel], [Parcel(1, Size.SMALL)], [{"weight": 1, "size": "s", "labels": []}]),
    (Size, Size.LARGE, "l"),
    (tuple[int, ...], (1, 2), [1, 2]),
    (list[Item] | None, [Item(sku="A")], [{"sku": "A", "quantity": 1, "size": "s"}]),
    (dict[str, Span], {"a": Span(start=1, end=2)}, {"a": {"start": 1, "end": 2}}),
])
def test_dataclass_enum_tuple_and_model_results_are_turned_into_json(returns: Any, value: Any, expected: Any) -> None:
    def give() -> Any:
        return value

    give.__annotations__ = {"return": returns}
    assert call(tool(give), {}) == expected


def test_a_result_model_that_does_not_match_is_a_tool_output_error_naming_its_path() -> None:
    @tool
    def bad() -> Receipt:
        return {"order_id": "q", "total": "lots", "items": []}  # type: ignore[return-value]

    error = output_error(bad)
    assert error.details["path"] == "result.total"
    assert "does not match its return annotation" in error.message


def test_another_model_than_the_declared_one_is_a_tool_output_error() -> None:
    @tool
    def wrong() -> Receipt:
        return Item(sku="A")  # type: ignore[return-value]

    assert output_error(wrong).details["path"] == "result"


def test_a_model_returned_by_an_unannotated_tool_is_not_json_and_the_error_says_what_to_do() -> None:
    @tool
    def loose():  # type: ignore[no-untyped-def]
        return Item(sku="A")

    error = output_error(loose)
    assert "not plain JSON" in error.message and "annotate the return type" in error.message


def test_a_probe_may_answer_with_a_model_and_is_asked_with_the_canonical_arguments() -> None:
    asked: list[ProbeQuery] = []

    def find(query: ProbeQuery) -> Occurred:
        asked.append(query)
        return Occurred(result=Receipt(order_id="o-ada", total=1, items=[]), evidence={"row": 1})

    @tool(probe=find)
    def charge(order: Order) -> Receipt:
        raise AssertionError("not called")

    query = ProbeQuery(effect_id="e", idempotency_key="k", args=charge.validate_args({"order": ORDER}), tool="charge",
                       attempt=1, thread_id="t", turn_id="u")
    answer = asyncio.run(charge.ask_probe(query))
    assert answer == {"answer": "occurred", "result": {"order_id": "o-ada", "total": 1.0, "items": []},
                      "evidence": {"row": 1}}
    assert asked[0].args == {"order": ORDER_DUMP}
    other = charge.probe_answer(Occurred(result=Item(sku="A")))
    assert other["answer"] == "dont_know" and "its result is not plain JSON" in other["reason"]
    bad = charge.probe_answer(Occurred(result={"order_id": "o", "total": "lots", "items": []}))
    assert bad["answer"] == "dont_know" and "does not match the tool's return annotation" in bad["reason"]
    assert "result.total" in bad["reason"]


# --- threads ------------------------------------------------------------------------------


def order_tools(placed: list[Order], *, requires_approval: bool = False) -> list[Tool]:
    """A fresh definition of the order tool (as another process would make it), recording what it receives."""

    @tool(semantics="unsafe", requires_approval=requires_approval)
    def place_order(order: Order, ctx: ToolContext) -> Receipt:
        """Place an order."""
        placed.append(order)
        return Receipt(order_id=f"o-{ctx.effect_id[-6:]}", total=9.5 * len(order.items), items=order.items)

    return [place_order]


def test_a_model_provider_sees_the_models_schema_and_the_tool_runs_with_the_model(tmp_path: Path) -> None:
    server = FakeOpenAI().start()
    placed: list[Order] = []
    arguments = json.dumps({"order": {**ORDER, "deliver_on": "2026-03-01"}})
    server.script(Completion(calls=[Call("call_1", "place_order", arguments)]), Completion(text="Placed."))
    url = f"sqlite:///{tmp_path}/t.db"

    def agent(model: Any) -> Agent:
        return Agent("shop", model, instructions="Place orders.", tools=order_tools(placed))

    async def scenario() -> tuple[str, State]:
        harness = Harness(agent(OpenAIModel("gpt-4o-mini", base_url=server.url, api_key="sk-test")), url)
        try:
            thread = await harness.create_thread()
            await thread.send("two things for ada")
            return thread.thread_id, await thread.wait()
        finally:
            harness.close()

    try:
        thread_id, state = asyncio.run(scenario())
    finally:
        server.stop()
    assert state.status == "idle" and state.last_reply == "Placed.", state.reason
    [function] = [entry["function"] for entry in server.bodies[0]["tools"]]
    sent_schema = function["parameters"]
    assert sent_schema == order_tools([])[0].parameters and "$defs" in sent_schema
    jsonschema.Draft202012Validator.check_schema(sent_schema)
    jsonschema.validate(json.loads(arguments), sent_schema)  # the $refs resolve against the document sent
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"order": {**ORDER, "items": [{"sku": "A", "quantity": 0}]}}, sent_schema)
    [order] = placed
    assert isinstance(order, Order) and order.deliver_on == datetime.date(2026, 3, 1)
    [tool_message] = [m for m in server.bodies[1]["messages"] if m["role"] == "tool"]
    result = json.loads(tool_message["content"])
    assert result["total"] == 19.0 and result["items"] == ORDER_DUMP["items"]

    async def reopen() -> tuple[State, State, list[Any]]:
        harness = Harness(agent(TouchlessModel()), url)  # a new process: the tool is defined anew
        try:
            thread = await harness.open_thread(thread_id)
            return thread.state(), await thread.replay(), await thread.events()
        finally:
            harness.close()

    reopened, replayed, events = asyncio.run(reopen())
    assert [e.type for e in events].count("agent.revised") == 0, "the same model tool is the same revision"
    assert reopened.revision == 1 and replayed.revision == 1
    assert reopened.agent["tools"] == {"place_order": content_hash(order_tools([])[0].contract())}
    [completed] = [e for e in events if e.type == "tool.completed"]
    assert completed.data["result"] == result
    assert replayed.to_dict() == reopened.to_dict()
    assert len(placed) == 1, "reopening and replaying call no tool"


def test_an_approved_call_with_a_model_argument_runs_after_a_reopen_with_the_recorded_arguments(
        tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/t.db"
    placed: list[Order] = []
    script: list[Step] = [ToolCall("place_order", {"order": ORDER}), "Done."]

    def harness() -> Harness:
        return Harness(Agent("shop", ScriptedModel(script), tools=order_tools(placed, requires_approval=True)), url)

    async def park() -> tuple[str, str]:
        first = harness()
        try:
            thread = await first.create_thread()
            await thread.send("order")
            state = await thread.wait()
            [waiting] = state.waiting_on
            return thread.thread_id, str(waiting["effect_id"])
        finally:
            first.close()

    async def approve(thread_id: str, effect_id: str) -> tuple[State, list[Any]]:
        second = harness()
        try:
            thread = await second.open_thread(thread_id)
            await thread.approve(effect_id)
            state = await thread.wait()
            await assert_same_answer(second, thread)
            return state, await thread.events()
        finally:
            second.close()

    thread_id, effect_id = asyncio.run(park())
    assert placed == []
    state, events = asyncio.run(approve(thread_id, effect_id))
    assert state.status == "idle" and state.last_reply == "Done.", state.reason
    assert placed == [Order.model_validate(ORDER)]
    assert [e.type for e in events].count("agent.revised") == 0
    [requested] = [e for e in events if e.type == "tool.requested"]
    assert requested.data["args"] == {"order": ORDER}, "the intent records the arguments the model sent"
    [completed] = [e for e in events if e.type == "tool.completed"]
    assert completed.data["result"]["items"] == ORDER_DUMP["items"]


def test_bad_model_arguments_in_a_thread_fail_before_dispatch_like_any_bad_arguments(tmp_path: Path) -> None:
    placed: list[Order] = []
    bad = {"order": {**ORDER, "items": [{"sku": "A", "quantity": 0}]}}
    agent = Agent("shop", ScriptedModel([ToolCall("place_order", bad), "Sorry."]), tools=order_tools(placed))

    async def scenario() -> tuple[State, list[Any]]:
        harness = Harness(agent, f"sqlite:///{tmp_path}/t.db")
        try:
            thread = await harness.create_thread()
            await thread.send("order")
            return await thread.wait(), await thread.events()
        finally:
            harness.close()

    state, events = asyncio.run(scenario())
    assert placed == []
    assert [e.type for e in events if e.type.startswith("tool.")] == ["tool.requested", "tool.failed"]
    [failed] = [e for e in events if e.type == "tool.failed"]
    assert failed.data["indeterminate"] is False
    assert failed.data["error"] == {
        "type": "invalid_arguments", "code": "tool_input_invalid", "tool": "place_order",
        "path": "args.order.items[0].quantity",
        "message": "tool 'place_order': args.order.items[0].quantity: Input should be greater than 0, got integer 0"}
    [effect_id] = [e.data["effect_id"] for e in events if e.type == "tool.requested"]
    decision = state.effects[effect_id]
    assert (decision.state, decision.reason) == ("completed", "rejected_before_dispatch")


class Priced(BaseModel):
    model_config = ConfigDict(extra="forbid")

    price: int
    quantity: int = 1

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> int:
        return self.price * self.quantity


class Totalled(BaseModel):
    price: int

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> int:
        return self.price


def test_a_dump_that_does_not_validate_again_is_refused_before_dispatch_not_after() -> None:
    @tool
    def buy(item: Priced) -> None:
        raise AssertionError("not called")

    error = input_error(buy, {"item": {"price": 2}})
    assert error.details["path"] == "args.item" and "does not validate as one again" in error.message

    @tool
    def keep(item: Totalled) -> int:
        return item.total

    checked = keep.validate_args({"item": {"price": 2}})
    assert checked == {"item": {"price": 2, "total": 2}}
    assert keep.validate_args(checked) == checked and call(keep, checked) == 2


def test_tools_without_models_do_not_import_pydantic() -> None:
    code = ("import sys\nimport jixu\n\n@jixu.tool\ndef add(a: int, b: int = 2) -> int:\n    return a + b\n\n"
            "assert add.validate_args({'a': 1}) == {'a': 1, 'b': 2}\nprint('pydantic' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
