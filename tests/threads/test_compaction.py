"""Context compaction: an effect asks the model for a summary citing the events it covers; the projection
uses the recorded summary; replay never calls the model; a failed compaction leaves the context whole."""

from __future__ import annotations

import asyncio
import dataclasses
import re
from typing import Any

import pytest

from jixu.errors import InvalidInput, ModelError, OwnershipLost
from jixu.ledger import Event
from jixu.recovery import RecoveryResolver
from jixu.threads import (
    Agent,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    Thread,
    ToolCall,
    ToolContext,
    tool,
)
from jixu.threads.compaction import SUMMARY_HEADER, estimate_tokens
from jixu.threads.projection import ThreadProjection
from tests.threads.conftest import (
    Ledger,
    assert_lifecycle_order,
    assert_same_answer,
    lifecycle,
    of_type,
    run,
    types_of,
    wait_for,
)

ID = re.compile(r"\b[0-9A-HJKMNP-TV-Z]{26}\b")
PAD = "x" * 400
BUDGET = 150
"""Estimated tokens: turns one and two fit; before turn three's model call the conversation does not."""


@tool(semantics="read_only")
def lookup(key: str, ctx: ToolContext) -> str:
    """Look a key up."""
    return f"value of {key}"


class Writer:
    """A model that counts its calls: a summary when asked for one, else a long reply (after a lookup when
    the input says ``look up``). ``summary_errors`` are raised, in order, by the summary requests."""

    name = "writer"

    def __init__(self, summary_errors: list[ModelError] | None = None) -> None:
        self.requests: list[ModelRequest] = []
        self.summary_errors = list(summary_errors or [])
        self.hold: asyncio.Event | None = None
        """When set, summary requests wait for it (a call in flight when its process dies)."""

    @property
    def summaries(self) -> list[ModelRequest]:
        return [r for r in self.requests if r.purpose == "compaction"]

    @property
    def replies(self) -> list[ModelRequest]:
        return [r for r in self.requests if r.purpose == "reply"]

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        messages = list(request.messages)
        if request.purpose == "compaction":
            if self.hold is not None:
                await self.hold.wait()
            if self.summary_errors:
                raise self.summary_errors.pop(0)
            cited = ID.findall(str(messages[-1]["content"]))
            return ModelResponse(text=f"The user asked {len(messages) - 1} things [{', '.join(cited)}].",
                                 model="writer-1", stop_reason="end_turn")
        last = max(i for i, m in enumerate(messages) if m["role"] == "user")
        text = str(messages[last]["content"])
        if text.startswith("look up") and not any(m["role"] == "assistant" for m in messages[last:]):
            return ModelResponse(tool_calls=(ToolCall("lookup", {"key": text.rsplit(maxsplit=1)[-1]}),), model="writer-1")
        return ModelResponse(text=f"Reply to {text}: {PAD}", model="writer-1", stop_reason="end_turn")


def agent(model: Any, budget: int | None = BUDGET) -> Agent:
    return Agent("compactor", model, instructions="Be thorough.", tools=[lookup], context_budget=budget)


async def turn(thread: Thread, text: str) -> Any:
    await thread.send(text)
    state = await thread.wait()
    assert state.status == "idle", state.reason
    return state


def sources(events: list[Event], turn_ids: set[str]) -> list[str]:
    """The ids of the events the messages of these turns came from, in order."""
    kept = ("turn.started", "model.completed", "tool.completed")
    effect_turns = {e.data["effect_id"]: e.data.get("turn_id") for e in events if e.type.endswith(".requested")}
    found = []
    for event in events:
        if event.type not in kept:
            continue
        owner = event.data["turn_id"] if event.type == "turn.started" else effect_turns[event.data["effect_id"]]
        if owner in turn_ids:
            found.append(event.id)
    return found


def test_estimate_is_characters_over_four_of_contents_and_call_arguments() -> None:
    assert estimate_tokens([]) == 0
    assert estimate_tokens([{"role": "user", "content": "abcd"}]) == 1
    assert estimate_tokens([{"role": "user", "content": "abcde"}]) == 2
    call = {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "name": "add", "args": {"a": 1}}]}
    assert estimate_tokens([call]) == -(-(len("add") + len('{"a":1}')) // 4)
    assert estimate_tokens([{"role": "tool", "content": "x" * 400}]) == 100


def test_the_budget_must_be_a_positive_integer_and_changes_the_digest_only_when_set() -> None:
    model = Writer()
    for bad in (0, -5, 1.5, True, "100"):
        with pytest.raises(InvalidInput):
            Agent("a", model, context_budget=bad)  # type: ignore[arg-type]
    plain = Agent("a", model)
    assert plain.digest == Agent("a", model, context_budget=None).digest
    assert plain.digest != Agent("a", model, context_budget=100).digest
    assert plain.contract == Agent("a", model, context_budget=100).contract


def test_compaction_summarizes_earlier_turns_citing_exactly_their_events(ledger: Ledger) -> None:
    model = Writer()
    harness = ledger.harness(agent(model))

    async def scenario() -> None:
        thread = await harness.create_thread()
        first = await turn(thread, "look up alpha")
        await turn(thread, "second question")
        assert of_type(await thread.events(), "compaction.requested") == [], "both turns fit the budget"
        before = await thread.events()
        covered = list((await thread.refresh()).messages)
        assert len(covered) == 6 and estimate_tokens(covered) > BUDGET
        replies_before = len(model.replies)

        third = await turn(thread, "third question")
        events = await thread.events()
        new = events[len(before):]
        assert types_of(new) == ["turn.started", "compaction.requested", "compaction.dispatched",
                                 "compaction.completed", "model.requested", "model.dispatched", "model.completed",
                                 "turn.ended"]
        [requested] = of_type(events, "compaction.requested")
        [completed] = of_type(events, "compaction.completed")
        expected = sources(before, {t["turn_id"] for t in first.turns} | {before[-1].data["turn_id"]})
        assert len(expected) == 6
        assert requested.data["args"] == {"turn_id": third.turns[-1]["turn_id"], "upto_message": 6,
                                          "covers": expected}
        assert requested.data["semantics"] == "read_only" and requested.data["name"] == "writer"
        assert requested.data["idempotency_key"] == f"jixu:{requested.data['effect_id']}"
        assert completed.data["result"]["covers"] == expected and completed.data["result"]["upto_message"] == 6
        assert completed.data["attempt"] == 1
        assert_lifecycle_order(events)

        # The summary request: the covered messages, then a user message naming exactly the covered ids.
        [summary_request] = model.summaries
        assert list(summary_request.messages[:-1]) == covered
        instruction = summary_request.messages[-1]
        assert instruction["role"] == "user" and ID.findall(str(instruction["content"])) == expected
        assert summary_request.effect_id == requested.data["effect_id"]
        assert summary_request.instructions == "Be thorough."
        assert [t["name"] for t in summary_request.tools] == ["lookup"]

        # The next model call sees the summary instead of the old messages.
        [reply_request] = model.replies[replies_before:]
        summary = reply_request.messages[0]
        assert summary["compacted"] is True and summary["role"] == "user"
        assert str(summary["content"]).startswith(SUMMARY_HEADER.format(ids=", ".join(expected)))
        assert ID.findall(str(summary["content"])) == expected * 2, "the header and the model's citations"
        assert list(reply_request.messages[1:]) == [{"role": "user", "content": "third question"}]
        assert third.messages[0] == summary and len(third.messages) == 3
        assert [t["message_index"] for t in third.turns] == [0, 0, 1]
        state = await assert_same_answer(harness, thread)
        assert state.messages[0] == summary

        # Replay reproduces the compacted conversation without calling the model.
        calls = len(model.requests)
        replayed = await thread.replay()
        assert replayed.messages == third.messages and len(model.requests) == calls
        early = await thread.replay(upto=requested.seq)
        assert list(early.messages[:6]) == covered, "before the summary arrived, the context was whole"
        reopened = await ledger.harness(agent(Writer())).open_thread(thread.thread_id)
        assert reopened.state().messages == third.messages and len(model.requests) == calls

        # A later compaction summarizes the summary too: it cites the compaction's own event.
        await turn(thread, "fourth question")
        events = await thread.events()
        second = of_type(events, "compaction.requested")[1]
        assert second.data["args"]["covers"] == [completed.id, third_started(events, third), reply_of(events, third)]
        await assert_same_answer(harness, thread)

    run(scenario())


def third_started(events: list[Event], state: Any) -> str:
    turn_id = state.turns[-1]["turn_id"]
    return next(e.id for e in events if e.type == "turn.started" and e.data["turn_id"] == turn_id)


def reply_of(events: list[Event], state: Any) -> str:
    turn_id = state.turns[-1]["turn_id"]
    models = {e.data["effect_id"] for e in events if e.type == "model.requested" and e.data["turn_id"] == turn_id}
    return next(e.id for e in events if e.type == "model.completed" and e.data["effect_id"] in models)


def test_without_a_budget_or_anything_before_the_turn_nothing_is_compacted(ledger: Ledger) -> None:
    unlimited, tight = Writer(), Writer()

    async def scenario() -> None:
        thread = await ledger.harness(agent(unlimited, None)).create_thread()
        for text in ("look up a", "two", "three"):
            await turn(thread, text)
        assert not [e for e in await thread.events() if e.type.startswith("compaction.")]
        # A first turn far over the budget has nothing before it to summarize: the model gets it whole.
        thread = await ledger.harness(agent(tight, 10)).create_thread()
        await turn(thread, "huge " + "y" * 2_000)
        assert not [e for e in await thread.events() if e.type.startswith("compaction.")]
        assert tight.summaries == []

    run(scenario())


@pytest.mark.parametrize("indeterminate", [False, True])
def test_a_failed_compaction_keeps_the_old_context_and_the_turn_completes(ledger: Ledger,
                                                                         indeterminate: bool) -> None:
    error = ModelError("the summary was refused", kind="transient" if indeterminate else "invalid_request",
                       indeterminate=indeterminate)
    model = Writer([error])
    harness = ledger.harness(agent(model))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await turn(thread, "look up alpha")
        await turn(thread, "second question")
        covered = list(thread.state().messages)
        replies_before = len(model.replies)
        state = await turn(thread, "third question")
        events = await thread.events()
        [requested] = of_type(events, "compaction.requested")
        effect_id = requested.data["effect_id"]
        assert types_of(lifecycle(events, effect_id)) == ["compaction.requested", "compaction.dispatched",
                                                          "compaction.failed"], "tried once, never again"
        assert of_type(events, "compaction.failed")[0].data["indeterminate"] is indeterminate
        # The model was called with the whole context, and the turn completed.
        [reply_request] = model.replies[replies_before:]
        assert list(reply_request.messages) == [*covered, {"role": "user", "content": "third question"}]
        assert state.last_reply == f"Reply to third question: {PAD}"
        assert state.turns[-1]["compaction_failed"] is True
        assert not any(m.get("compacted") for m in state.messages)
        decision = state.effects[effect_id]
        assert (decision.state, decision.kind) == (("unknown", "compaction") if indeterminate
                                                   else ("completed", "compaction"))
        await assert_same_answer(harness, thread)
        # The next turn may compact again (and this time the model answers).
        state = await turn(thread, "fourth question")
        assert len(of_type(await thread.events(), "compaction.completed")) == 1
        assert state.messages[0]["compacted"] is True
        await assert_same_answer(harness, thread)

    run(scenario())


def test_a_summary_answer_that_is_not_a_summary_is_a_failed_compaction(ledger: Ledger) -> None:
    def script(messages: list[dict[str, Any]]) -> Any:
        if "Summarize the conversation above" in str(messages[-1]["content"]):
            return ToolCall("lookup", {"key": "nope"})
        return "r" * 800

    class Tricky(ScriptedModel):
        async def complete(self, request: ModelRequest) -> ModelResponse:
            if request.purpose == "compaction":  # answer the summary request like any other: with a tool call
                request = dataclasses.replace(request, purpose="reply")
            return await super().complete(request)

    harness = ledger.harness(agent(Tricky(script)))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await turn(thread, "one")
        state = await turn(thread, "two")
        [failed] = of_type(await thread.events(), "compaction.failed")
        assert failed.data["error"]["type"] == "invalid_summary" and failed.data["indeterminate"] is False
        assert "tool calls" in failed.data["error"]["message"]
        assert state.turns[-1]["compaction_failed"] is True and len(state.messages) == 4
        await assert_same_answer(harness, thread)

    run(scenario())


def test_a_compaction_in_flight_when_its_process_stops_is_retried_under_the_same_effect_id(ledger: Ledger) -> None:
    model = Writer()
    first = ledger.harness(agent(model), owner="worker")

    async def scenario() -> None:
        thread = await first.create_thread()
        await turn(thread, "look up alpha")
        await turn(thread, "second question")
        model.hold = asyncio.Event()
        await thread.send("third question")
        await wait_for(lambda: len(model.summaries) == 1)
        # The process "dies" mid-call: a restarted worker (same owner name) reopens the thread.
        rescuer = Writer()
        second = ledger.harness(agent(rescuer), owner="worker")
        reopened = await second.open_thread(thread.thread_id)
        state = await reopened.wait()
        assert state.status == "idle" and state.last_reply == f"Reply to third question: {PAD}"
        events = await reopened.events()
        [requested] = of_type(events, "compaction.requested")
        effect_id = requested.data["effect_id"]
        assert [(e.type, e.data.get("attempt")) for e in lifecycle(events, effect_id)] == [
            ("compaction.requested", None), ("compaction.dispatched", 1), ("compaction.dispatched", 2),
            ("compaction.completed", 2)]
        assert [r.effect_id for r in rescuer.summaries] == [effect_id] and rescuer.summaries[0].attempt == 2
        assert state.messages[0]["compacted"] is True
        # The stale loop of the first process is fenced out: its late answer writes nothing.
        model.hold.set()
        task = thread._task
        assert task is not None
        with pytest.raises(OwnershipLost, match="no longer owns"):
            await task
        assert len(await reopened.events()) == len(events)
        await assert_same_answer(second, reopened)

    run(scenario())


def test_fork_after_a_compaction_inherits_the_summary_and_its_sources(ledger: Ledger) -> None:
    model = Writer()
    harness = ledger.harness(agent(model))

    async def scenario() -> None:
        thread = await harness.create_thread()
        for text in ("look up alpha", "second question", "third question"):
            parent = await turn(thread, text)
        events = await thread.events()
        [completed] = of_type(events, "compaction.completed")
        calls = len(model.requests)
        child = await thread.fork(events[-1].id)
        assert child.state().messages == parent.messages and len(model.requests) == calls
        assert child.log.state.message_events == thread.log.state.message_events
        assert child.log.state.message_events[0] == completed.id
        await assert_same_answer(harness, child)
        # The child goes on on its own: its next compaction cites the inherited summary's event.
        state = await turn(child, "child question")
        [child_requested] = of_type(await child.events(), "compaction.requested")
        assert child_requested.data["args"]["covers"][0] == completed.id
        assert state.messages[0]["compacted"] is True
        await assert_same_answer(harness, child)
        # A fork while the compaction was open does not inherit it: the child's context is whole.
        [requested] = of_type(events, "compaction.requested")
        early = await thread.fork(requested.id)
        assert not any(m.get("compacted") for m in early.state().messages)
        assert early.state().turns[-1]["status"] == "interrupted"
        assert (await thread.refresh()).messages == parent.messages, "the parent never changes"

    run(scenario())


def test_placeholders_cite_the_event_that_closed_their_calls(ledger: Ledger) -> None:
    gate = asyncio.Event()

    @tool(name="lookup", semantics="read_only")
    async def slow_lookup(key: str, ctx: ToolContext) -> str:
        """Look a key up."""
        await gate.wait()
        return key

    model = ScriptedModel([ToolCall("lookup", {"key": "k"}), "done"])
    harness = ledger.harness(Agent("compactor", model, tools=[slow_lookup]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("go")
        await wait_for(lambda: bool(of_type(thread.log.events(), "tool.dispatched")))
        tool_requested = of_type(await thread.events(), "tool.requested")[0]
        child = await thread.fork(tool_requested.id)
        [forked] = of_type(await child.events(), "thread.forked")
        assert child.log.state.message_events[-1] == forked.id
        assert child.state().messages[-1]["status"] == "not_inherited"
        await thread.interrupt("stop")
        ended = of_type(await thread.events(), "turn.ended")[-1]
        state = thread.log.state
        assert len(state.message_events) == len(state.messages)
        placeholder = state.messages.index(next(m for m in state.messages if m.get("status") == "interrupted"))
        assert state.message_events[placeholder] == ended.id
        gate.set()

    run(scenario())


def test_a_fork_record_without_message_sources_still_loads() -> None:
    projection = ThreadProjection()
    state = projection.initial()
    state.messages = [{"role": "user", "content": "hi"}]
    state.message_events = ["01HXXXXXXXXXXXXXXXXXXXXXXX"]
    dumped = projection.dump(state)
    del dumped["message_events"]  # as reducer version 2 wrote fork records
    loaded = projection.load(dumped)
    assert loaded.messages == state.messages and loaded.message_events == [""]


def test_the_scripted_model_answers_summary_requests(ledger: Ledger) -> None:
    def script(messages: list[dict[str, Any]]) -> str:
        return "z" * 600

    harness = ledger.harness(agent(ScriptedModel(script)))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await turn(thread, "one")
        state = await turn(thread, "two")
        content = str(state.messages[0]["content"])
        assert state.messages[0]["compacted"] is True
        assert content.splitlines()[1:] == ["user: one", "assistant: " + "z" * 200]
        await assert_same_answer(harness, thread)

    run(scenario())


def test_the_scripted_model_takes_a_summarize_function(ledger: Ledger) -> None:
    seen: list[list[dict[str, Any]]] = []

    def summarize(messages: list[dict[str, Any]]) -> str:
        seen.append(messages)
        return "They said one; I answered at length."

    harness = ledger.harness(agent(ScriptedModel(lambda messages: "z" * 600, summarize=summarize)))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await turn(thread, "one")
        state = await turn(thread, "two")
        assert [m["content"] for m in seen[0]] == ["one", "z" * 600]
        assert str(state.messages[0]["content"]).endswith("\nThey said one; I answered at length.")

    run(scenario())
    with pytest.raises(InvalidInput):
        ScriptedModel(["x"], summarize="not a function")  # type: ignore[arg-type]


def test_the_resolver_treats_compaction_as_a_retry_safe_effect(ledger: Ledger) -> None:
    model = Writer([ModelError("lost", kind="transient", indeterminate=True)])
    harness = ledger.harness(agent(model))

    async def scenario() -> None:
        thread = await harness.create_thread()
        for text in ("look up alpha", "second question", "third question"):
            await turn(thread, text)
        analysis = RecoveryResolver.analyze(await thread.events())
        [effect_id] = [eid for eid, d in analysis.decisions.items() if d.kind == "compaction"]
        decision = analysis.decisions[effect_id]
        assert (decision.state, decision.reason, decision.retry_safe) == ("unknown", "indeterminate_failure", True)
        assert effect_id not in analysis.requires_resolution and analysis.safe_to_continue

    run(scenario())


def test_signals_of_a_driver_that_does_not_stream_are_refused(ledger: Ledger) -> None:
    harness = ledger.harness(Agent("a", ScriptedModel(["hi"])))

    async def scenario() -> None:
        thread = await harness.create_thread()
        with pytest.raises(InvalidInput, match="publishes no signals"):
            thread.signals()

    run(scenario())
