"""Tools whose arguments and results are pydantic models or dataclasses; the digests of today's tools pinned.

The pins were taken from the code before pydantic models were supported: a tool
declared with plain annotations must keep exactly its schema, its contract digest
and its canonical arguments, or every existing thread would see a new revision.
"""

from __future__ import annotations

import dataclasses
import enum
from pathlib import Path
from typing import Annotated, Any, Literal, NewType, NotRequired, Optional, TypedDict

import pytest

from jixu.cli.demo import refund_agent
from jixu.cli.studio import fixture_agent
from jixu.ledger.encoding import canonical_text, content_hash
from jixu.runs.workspace_tools import workspace_tools
from jixu.threads import Agent
from jixu.threads.model import ScriptedModel
from jixu.threads.steps import _step_tool
from jixu.threads.tools import NotOccurred, ProbeQuery, Tool, ToolContext, tool

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
