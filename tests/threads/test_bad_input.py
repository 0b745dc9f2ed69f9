"""Every bad input to the thread API gets a typed error and writes nothing.

"Nothing" is checked on the ledger itself: the thread's events (byte for
byte) and the list of thread streams are the same before and after.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import pytest

from jixu.errors import (
    EffectNotParked,
    IncompatibleAgent,
    InvalidInput,
    JixuError,
    MalformedEvent,
    NotFound,
    ResolutionConflict,
    ThreadBusy,
    ThreadCorrupt,
    ThreadNotFound,
    UnsupportedStoreUrl,
)
from jixu.ledger import NewEvent, Store, new_id
from jixu.threads import Agent, Harness, ScriptedModel, Thread, Tool, ToolCall, ToolContext, tool
from jixu.threads.log import stream_of
from jixu.threads.model import Step
from tests.threads.conftest import (
    Calls,
    Ledger,
    effect_ids,
    event_dicts,
    of_type,
    run,
    thread_streams,
    wait_for,
)


@tool(semantics="read_only")
def lookup(key: str) -> str:
    """Look a key up."""
    return key.upper()


@tool
def charge(amount: int) -> str:
    """Charge an amount (it always dies after dispatch here)."""
    raise ConnectionResetError("hung up")


@tool(requires_approval=True)
def wire(amount: int) -> str:
    """Wire money (needs approval)."""
    return f"wired {amount}"


def agent(script: list[Step] | None = None, *, name: str = "kit", tools: list[Tool] | None = None) -> Agent:
    steps: list[Step] = [ToolCall("lookup", {"key": "a"}), "done"] if script is None else script
    return Agent(name, ScriptedModel(steps), tools=[lookup, charge, wire] if tools is None else tools)


class Unchanged:
    """Asserts that a block wrote nothing to the ledger."""

    def __init__(self, store: Store, thread: Thread | None = None) -> None:
        self.store = store
        self.thread = thread
        self.streams = thread_streams(store)
        self.events = event_dicts(store.read(thread.stream)) if thread else []

    def check(self) -> None:
        assert thread_streams(self.store) == self.streams
        if self.thread is not None:
            assert event_dicts(self.store.read(self.thread.stream)) == self.events


async def expect(error: type[JixuError], call: Callable[[], Awaitable[Any]], unchanged: Unchanged) -> JixuError:
    """``call()`` raises ``error`` (a typed jixu error) and the ledger is unchanged."""
    with pytest.raises(error) as caught:
        await call()
    assert isinstance(caught.value, JixuError)
    unchanged.check()
    return caught.value


async def finished_thread(harness: Harness) -> Thread:
    thread = await harness.create_thread()
    await thread.send("look a up")
    assert (await thread.wait()).status == "idle"
    return thread


# --- send -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "   \n\t", None, 123, b"bytes", ["hi"], "x" * 200_001],
                         ids=["empty", "blank", "none", "int", "bytes", "list", "too-long"])
def test_send_refuses_bad_input(ledger: Ledger, text: Any) -> None:
    harness = ledger.harness(agent())

    async def scenario() -> None:
        thread = await harness.create_thread()
        error = await expect(InvalidInput, lambda: thread.send(text), Unchanged(harness.store, thread))
        assert error.details["field"] == "input"
        assert not thread.running and thread.state().status == "idle"

    run(scenario())


def test_send_accepts_input_at_the_length_limit(ledger: Ledger) -> None:
    harness = ledger.harness(agent(["ok"]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("x" * 200_000)
        assert (await thread.wait()).last_reply == "ok"

    run(scenario())


def test_send_while_a_turn_is_running_is_refused_in_this_and_in_another_process(ledger: Ledger) -> None:
    release: dict[str, asyncio.Event] = {}
    started: list[str] = []

    @tool(semantics="read_only")
    async def slow(ctx: ToolContext) -> str:
        started.append(ctx.effect_id)
        await asyncio.wait_for(release["go"].wait(), 5)
        return "done"

    definition = Agent("slow", ScriptedModel([ToolCall("slow"), "finished"]), tools=[slow])
    harness = ledger.harness(definition)
    elsewhere = ledger.harness(definition)

    async def scenario() -> None:
        release["go"] = asyncio.Event()
        thread = await harness.create_thread()
        await thread.send("go")
        await wait_for(lambda: bool(started))
        unchanged = Unchanged(harness.store, thread)
        await expect(ThreadBusy, lambda: thread.send("and again"), unchanged)
        other = await elsewhere.open_thread(thread.thread_id, resume=False)
        assert other.state().status == "running"
        await expect(ThreadBusy, lambda: other.send("me too"), unchanged)
        release["go"].set()
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "finished" and len(state.turns) == 1

    run(scenario())


# --- corrupt threads --------------------------------------------------------------------------------


def _contradictions(events: list[Any]) -> dict[str, NewEvent]:
    tool_eid = effect_ids(events)[0]
    completed = of_type(events, "tool.completed")[0]
    requested = of_type(events, "tool.requested")[0].data
    return {
        "duplicate-receipt": NewEvent("tool.completed", {"effect_id": tool_eid, "attempt": 1, "result": "B"}),
        "dispatch-after-receipt": NewEvent("tool.dispatched", {
            "effect_id": tool_eid, "attempt": 2, "name": "lookup", "args_hash": requested["args_hash"],
            "idempotency_key": requested["idempotency_key"]}),
        "receipt-without-intent": NewEvent("tool.completed", {"effect_id": new_id(), "attempt": 1, "result": 1}),
        "failure-without-effect-id": NewEvent("tool.failed", {"error": {"type": "x"}, "indeterminate": False}),
        "second-completion-text": NewEvent("tool.completed", dict(completed.data)),
    }


@pytest.mark.parametrize("kind", [
    "duplicate-receipt", "dispatch-after-receipt", "receipt-without-intent", "second-completion-text",
    "failure-without-effect-id",
])
def test_a_contradictory_history_opens_as_corrupt_and_refuses_to_run(ledger: Ledger, kind: str) -> None:
    harness = ledger.harness(agent())

    async def scenario() -> None:
        thread = await finished_thread(harness)
        events = await thread.events()
        store = ledger.store()
        store.append(stream_of(thread.thread_id), [_contradictions(events)[kind]], len(events))

        reopened = await harness.open_thread(thread.thread_id)
        state = reopened.state()
        assert state.status == "corrupt"
        assert state.analysis.has_corruption and not state.analysis.safe_to_continue
        unchanged = Unchanged(harness.store, reopened)
        await expect(ThreadCorrupt, lambda: reopened.send("anything"), unchanged)
        await expect(ThreadCorrupt, lambda: thread.send("from the stale handle"), unchanged)
        assert (await reopened.wait()).status == "corrupt"
        assert (await reopened.replay()).status == "corrupt"
        unchanged.check()

    run(scenario())


# --- resolve ----------------------------------------------------------------------------------------


async def waiting_thread(harness: Harness) -> tuple[Thread, str]:
    thread = await harness.create_thread()
    await thread.send("charge")
    assert (await thread.wait()).status == "waiting"
    [eid] = effect_ids(await thread.events())
    return thread, eid


BAD_RESOLUTIONS: list[tuple[str, dict[str, Any]]] = [
    ("unknown-value", {"resolution": "maybe"}),
    ("upper-case", {"resolution": "OCCURRED"}),
    ("empty", {"resolution": ""}),
    ("none", {"resolution": None}),
    ("note-not-str", {"resolution": "occurred", "note": 123}),
    ("note-too-long", {"resolution": "occurred", "note": "x" * 10_001}),
    ("evidence-list", {"resolution": "occurred", "evidence": [1, 2]}),
    ("evidence-str", {"resolution": "occurred", "evidence": "a receipt"}),
    ("evidence-nan", {"resolution": "occurred", "evidence": {"amount": float("nan")}}),
    ("evidence-set", {"resolution": "occurred", "evidence": {"ids": {1, 2}}}),
    ("result-with-not-occurred", {"resolution": "not_occurred", "result": {"charge_id": "ch_1"}}),
    ("result-with-abandoned", {"resolution": "abandoned_unknown", "result": 0}),
    ("result-not-json", {"resolution": "occurred", "result": object()}),
    ("resolution-id-empty", {"resolution": "occurred", "resolution_id": ""}),
    ("resolution-id-int", {"resolution": "occurred", "resolution_id": 7}),
    ("resolution-id-too-long", {"resolution": "occurred", "resolution_id": "r" * 101}),
    ("actor-empty", {"resolution": "occurred", "actor": " "}),
]


@pytest.mark.parametrize("kwargs", [k for _, k in BAD_RESOLUTIONS], ids=[i for i, _ in BAD_RESOLUTIONS])
def test_resolve_refuses_bad_input(ledger: Ledger, kwargs: dict[str, Any]) -> None:
    harness = ledger.harness(agent([ToolCall("charge", {"amount": 5}), "done"]))

    async def scenario() -> None:
        thread, eid = await waiting_thread(harness)
        await expect(InvalidInput, lambda: thread.resolve_tool_outcome(eid, **kwargs),
                     Unchanged(harness.store, thread))
        assert thread.state().status == "waiting"
        assert thread.state().effects[eid].resolution is None

    run(scenario())


def test_resolve_of_no_such_effect_and_a_changed_decision_are_refused(ledger: Ledger) -> None:
    harness = ledger.harness(agent([ToolCall("charge", {"amount": 5}), "done", "again"]))

    async def scenario() -> None:
        thread, eid = await waiting_thread(harness)
        unchanged = Unchanged(harness.store, thread)
        for missing in (new_id(), "not-an-effect"):
            await expect(NotFound, partial(thread.resolve_tool_outcome, missing, "occurred"), unchanged)
        await thread.resolve_tool_outcome(eid, "occurred", resolution_id="r1")
        assert (await thread.wait()).status == "idle"
        unchanged = Unchanged(harness.store, thread)
        for decision in ("not_occurred", "abandoned_unknown", "occurred"):
            await expect(ResolutionConflict, partial(thread.resolve_tool_outcome, eid, decision), unchanged)

    run(scenario())


# --- approve / deny ---------------------------------------------------------------------------------


def test_approve_and_deny_only_a_parked_call(ledger: Ledger) -> None:
    harness = ledger.harness(agent([ToolCall("wire", {"amount": 1}), "sent"]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("wire 1")
        assert (await thread.wait()).status == "waiting"
        events = await thread.events()
        [parked] = effect_ids(events)
        model_eid = effect_ids(events, "model")[0]
        unchanged = Unchanged(harness.store, thread)
        for operation in (thread.approve, thread.deny):
            await expect(EffectNotParked, partial(operation, model_eid), unchanged)
            await expect(NotFound, partial(operation, new_id()), unchanged)
            await expect(InvalidInput, partial(operation, parked, actor=""), unchanged)
            await expect(InvalidInput, partial(operation, parked, note=5), unchanged)  # type: ignore[arg-type]
        await thread.approve(parked)
        assert (await thread.wait()).status == "idle"
        unchanged = Unchanged(harness.store, thread)
        for operation in (thread.approve, thread.deny):
            await expect(EffectNotParked, partial(operation, parked), unchanged)

    run(scenario())


# --- open_thread ------------------------------------------------------------------------------------


@pytest.mark.parametrize("thread_id", ["", "nope", "../etc/passwd", 42, None], ids=repr)
def test_open_thread_refuses_an_invalid_id(ledger: Ledger, thread_id: Any) -> None:
    harness = ledger.harness(agent())

    async def scenario() -> None:
        unchanged = Unchanged(harness.store)
        await expect(InvalidInput, lambda: harness.open_thread(thread_id), unchanged)

    run(scenario())


def test_open_thread_of_an_unknown_id_is_thread_not_found(ledger: Ledger) -> None:
    harness = ledger.harness(agent())

    async def scenario() -> None:
        await finished_thread(harness)
        error = await expect(ThreadNotFound, lambda: harness.open_thread(new_id()), Unchanged(harness.store))
        assert isinstance(error, NotFound)

    run(scenario())


@tool(semantics="read_only")
def echo(text: str) -> str:
    """An extra tool."""
    return text


def _lookup_variant(semantics: str = "read_only", requires_approval: bool = False) -> Tool:
    def lookup(key: str) -> str:
        return key

    return Tool(lookup, semantics=semantics, requires_approval=requires_approval)  # type: ignore[arg-type]


def _lookup_other_schema() -> Tool:
    def lookup(key: int) -> str:
        return str(key)

    return Tool(lookup, semantics="read_only")


CHANGED: dict[str, Callable[[], Agent]] = {
    "other-semantics": lambda: agent(tools=[_lookup_variant("idempotent"), charge, wire]),
    "now-requires-approval": lambda: agent(tools=[_lookup_variant(requires_approval=True), charge, wire]),
    "other-schema": lambda: agent(tools=[_lookup_other_schema(), charge, wire]),
    "tool-removed": lambda: agent(tools=[lookup, charge]),
    "tool-added": lambda: agent(tools=[lookup, charge, wire, echo]),
}


def test_open_thread_under_another_agent_is_refused(ledger: Ledger) -> None:
    original = ledger.harness(agent())
    other = ledger.harness(agent(name="kit-2"))

    async def scenario() -> None:
        thread = await finished_thread(original)
        error = await expect(IncompatibleAgent, lambda: other.open_thread(thread.thread_id),
                             Unchanged(original.store, thread))
        assert thread.thread_id in error.message and "another agent" in error.message

    run(scenario())


@pytest.mark.parametrize("variant", sorted(CHANGED))
def test_open_thread_under_a_changed_definition_with_no_call_open_writes_nothing_until_it_acts(
        ledger: Ledger, variant: str) -> None:
    """A thread with no effect open takes any change of its agent's tools (tests/threads/test_agent_revisions.py
    holds the rules); opening alone records nothing."""
    original = ledger.harness(agent())
    other = ledger.harness(CHANGED[variant]())

    async def scenario() -> None:
        thread = await finished_thread(original)
        unchanged = Unchanged(original.store, thread)
        reopened = await other.open_thread(thread.thread_id)
        assert reopened.state().status == "idle" and reopened.state().revision == 1
        unchanged.check()

    run(scenario())


def test_open_thread_under_new_instructions_or_model_is_allowed(ledger: Ledger) -> None:
    original = ledger.harness(agent())
    changed = ledger.harness(Agent("kit", ScriptedModel(["ok"], name="another-model"),
                                   instructions="Be brief.", tools=[lookup, charge, wire], max_steps=5))

    async def scenario() -> None:
        thread = await finished_thread(original)
        reopened = await changed.open_thread(thread.thread_id)
        assert reopened.state().status == "idle"

    run(scenario())


# --- definitions ------------------------------------------------------------------------------------


def plain_function(key: str) -> str:
    return key


@pytest.mark.parametrize("make", [
    lambda: Agent("kit", ScriptedModel(["x"]), tools=[lookup, lookup]),
    lambda: Agent("kit", ScriptedModel(["x"]), tools=[lookup, _lookup_variant("idempotent")]),
    lambda: Agent("kit", ScriptedModel(["x"]), tools=[plain_function]),  # type: ignore[list-item]
    lambda: Agent("kit", ScriptedModel(["x"]), tools=["lookup"]),  # type: ignore[list-item]
    lambda: Agent("kit", ScriptedModel(["x"]), max_steps=0),
    lambda: Agent("kit", ScriptedModel(["x"]), max_steps=-1),
    lambda: Agent("kit", ScriptedModel(["x"]), max_steps=True),
    lambda: Agent("kit", ScriptedModel(["x"]), max_steps=2.5),  # type: ignore[arg-type]
    lambda: Agent("", ScriptedModel(["x"])),
    lambda: Agent("  ", ScriptedModel(["x"])),
    lambda: Agent(7, ScriptedModel(["x"])),  # type: ignore[arg-type]
    lambda: Agent("kit", object()),  # type: ignore[arg-type]
], ids=["duplicate-tool", "duplicate-name", "plain-function", "string", "max-steps-0", "max-steps-negative",
        "max-steps-bool", "max-steps-float", "empty-name", "blank-name", "name-int", "not-a-model"])
def test_an_invalid_agent_definition_is_refused(make: Callable[[], Agent]) -> None:
    with pytest.raises(InvalidInput):
        make()


@pytest.mark.parametrize("max_attempts", [0, -1, True, 1.5, "3", None])
def test_harness_refuses_an_invalid_max_attempts(ledger: Ledger, max_attempts: Any) -> None:
    with pytest.raises(InvalidInput):
        Harness(agent(), ledger.target(), max_attempts=max_attempts)


@pytest.mark.parametrize("group_commits", [1, "yes"])
def test_harness_refuses_a_group_commits_that_is_not_a_bool(ledger: Ledger, group_commits: Any) -> None:
    with pytest.raises(InvalidInput):
        Harness(agent(), ledger.target(), group_commits=group_commits)


def test_group_commits_is_accepted_but_changes_nothing_and_says_so(ledger: Ledger) -> None:
    """Commits are always shared now (one commit path): the old option warns that it does nothing."""
    with pytest.warns(DeprecationWarning, match="changes nothing"):
        Harness(agent(), ledger.target(), group_commits=True).close()


def test_stage_refuses_a_bad_event_and_stages_nothing(ledger: Ledger) -> None:
    harness = ledger.harness(agent())

    async def scenario() -> None:
        thread = await harness.create_thread()
        before = (thread.log.state.seq, thread.log.has_staged)
        with pytest.raises(MalformedEvent):
            thread.log.stage([NewEvent("note.made", {"ok": 1}), NewEvent("note.made", {"bad": float("nan")})])
        assert (thread.log.state.seq, thread.log.has_staged) == before == (1, False)

    run(scenario())


def test_harness_refuses_a_bad_agent_or_store(tmp_path: Any) -> None:
    with pytest.raises(InvalidInput):
        Harness("kit", f"sqlite:///{tmp_path}/h.db")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        Harness(agent(), 42)  # type: ignore[arg-type]
    with pytest.raises(UnsupportedStoreUrl):
        Harness(agent(), "redis://localhost/0")


def test_create_thread_refuses_bad_metadata(ledger: Ledger) -> None:
    harness = ledger.harness(agent())

    async def scenario() -> None:
        unchanged = Unchanged(harness.store)
        bad: list[Any] = [["a"], "text", {"n": float("inf")}, {"o": object()}]
        for metadata in bad:
            await expect(InvalidInput, partial(harness.create_thread, metadata=metadata), unchanged)

    run(scenario())


# --- replay -----------------------------------------------------------------------------------------


def test_replay_refuses_an_invalid_upto(ledger: Ledger) -> None:
    harness = ledger.harness(agent())

    async def scenario() -> None:
        thread = await finished_thread(harness)
        other = await harness.create_thread()
        unchanged = Unchanged(harness.store, thread)
        invalid: list[Any] = [0, -3, True, False, 1.5, "nope", "", [1]]
        for upto in invalid:
            await expect(InvalidInput, partial(thread.replay, upto=upto), unchanged)
        for upto in (new_id(), (await other.events())[0].id):
            await expect(NotFound, partial(thread.replay, upto=upto), unchanged)

    run(scenario())


def test_replay_upto_a_seq_past_the_head_is_refused(ledger: Ledger) -> None:
    harness = ledger.harness(agent())

    async def scenario() -> None:
        thread = await finished_thread(harness)
        head = thread.state().seq
        with pytest.raises((InvalidInput, NotFound)):
            await thread.replay(upto=head + 1)

    run(scenario())


# --- bad output from the model is bad input to the harness -----------------------------------------------


def test_a_model_answer_that_is_not_json_fails_the_turn_and_runs_nothing(ledger: Ledger) -> None:
    calls = Calls()

    @tool(semantics="read_only")
    def measure(value: float, ctx: ToolContext) -> float:
        calls.record(ctx, value=value)
        return value

    harness = ledger.harness(Agent("meter", ScriptedModel([ToolCall("measure", {"value": float("nan")})]),
                                   tools=[measure]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("measure")
        state = await thread.wait()
        events = await thread.events()
        [failed] = of_type(events, "model.failed")
        assert failed.data["indeterminate"] is False
        assert failed.data["error"]["type"] == "invalid_response"
        assert of_type(events, "tool.requested") == []
        assert len(calls) == 0
        assert state.status == "failed"

    run(scenario())
