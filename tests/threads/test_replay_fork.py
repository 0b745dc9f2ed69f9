"""Replay and fork: pure reads that call no driver, and children with lineage and their own identities.

The drivers here fail the test if touched: a model whose ``complete`` raises
AssertionError and tools with the same names, schemas and semantics whose
functions raise AssertionError (so the agent contract matches and the thread
opens under them).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from jixu.errors import InvalidInput, NotFound, ThreadCorrupt
from jixu.ledger import Event, NewEvent, new_id, verify
from jixu.recovery import RecoveryResolver
from jixu.threads import Agent, Harness, ScriptedModel, State, Thread, Tool, ToolCall, ToolContext, tool
from jixu.threads.log import stream_of
from jixu.threads.model import Step
from jixu.threads.projection import NOT_INHERITED_MESSAGE
from tests.threads.conftest import (
    Calls,
    Ledger,
    TouchlessModel,
    assert_lifecycle_order,
    assert_same_answer,
    decision_dicts,
    effect_ids,
    event_dicts,
    ids_in,
    of_type,
    run,
    same_contract_tools,
    thread_streams,
    wait_for,
)

SCRIPT: list[Step] = [ToolCall("lookup", {"key": "a"}), "first", ToolCall("lookup", {"key": "b"}), "second",
          ToolCall("lookup", {"key": "c"}), "third"]


class Kit:
    """The real agent (a lookup tool and an unsafe charge tool) and a touchless twin with the same contract."""

    def __init__(self) -> None:
        self.calls = Calls()
        self.hits: list[str] = []

        @tool(semantics="read_only")
        def lookup(key: str, ctx: ToolContext) -> str:
            self.calls.record(ctx, key=key)
            return key.upper()

        @tool
        def charge(amount: int, ctx: ToolContext) -> dict[str, Any]:
            self.calls.record(ctx, amount=amount)
            raise ConnectionResetError("hung up")

        self.tools: list[Tool] = [lookup, charge]
        self.touchless_model = TouchlessModel()

    def agent(self, script: list[Step] | None = None) -> Agent:
        return Agent("kit", ScriptedModel(SCRIPT if script is None else script), tools=self.tools)

    def touchless_agent(self) -> Agent:
        return Agent("kit", self.touchless_model, tools=same_contract_tools(self.tools, self.hits.append))

    def assert_untouched(self, calls_before: int) -> None:
        assert self.touchless_model.calls == 0
        assert self.hits == []
        assert len(self.calls) == calls_before


async def two_turns(harness: Harness) -> tuple[Thread, State, Event]:
    """A thread with two completed turns; returns it, its state after turn one and turn one's last event."""
    thread = await harness.create_thread()
    await thread.send("one")
    after_one = await thread.wait()
    end_of_one = (await thread.events())[-1]
    assert end_of_one.type == "turn.ended"
    await thread.send("two")
    assert (await thread.wait()).last_reply == "second"
    return thread, after_one, end_of_one


# --- replay -----------------------------------------------------------------------------------------


def test_replay_calls_no_driver_and_reproduces_every_earlier_state(ledger: Ledger) -> None:
    kit = Kit()
    live = ledger.harness(kit.agent())
    inert = ledger.harness(kit.touchless_agent())

    async def scenario() -> None:
        thread, after_one, end_of_one = await two_turns(live)
        final = thread.state()
        events = await thread.events()
        calls_before = len(kit.calls)

        opened = await inert.open_thread(thread.thread_id)
        assert not opened.running and opened.state().status == "idle"
        full = await opened.replay()
        assert full.to_dict() == final.to_dict()
        for upto in (end_of_one.seq, end_of_one.id):
            replayed = await opened.replay(upto=upto)
            assert replayed.to_dict() == after_one.to_dict()
            assert list(replayed.messages) == list(after_one.messages)
        # Every prefix: the replayed decisions are the resolver's over exactly those events.
        for event in events:
            replayed = await opened.replay(upto=event.seq)
            assert replayed.seq == event.seq and replayed.head_hash == event.hash
            expected = RecoveryResolver.analyze(events[:event.seq])
            assert decision_dicts(replayed) == {k: d.to_dict() for k, d in expected.decisions.items()}
        await opened.fork(at=end_of_one.id)
        await opened.fork(at=events[-1].id)
        await opened.fork(at=of_type(events, "tool.dispatched")[-1].id)
        kit.assert_untouched(calls_before)
        assert event_dicts(await thread.events()) == event_dicts(events)

    run(scenario())


def test_replay_and_fork_of_a_waiting_thread_touch_nothing(ledger: Ledger) -> None:
    kit = Kit()
    live = ledger.harness(kit.agent([[ToolCall("charge", {"amount": 1}), ToolCall("lookup", {"key": "x"})],
                                     "done"]))
    inert = ledger.harness(kit.touchless_agent())

    async def scenario() -> None:
        thread = await live.create_thread()
        await thread.send("charge and look")
        waiting = await thread.wait()
        assert waiting.status == "waiting"
        events = await thread.events()
        charge_eid, lookup_eid = effect_ids(events)
        assert waiting.effects[charge_eid].state == "unknown"
        calls_before = len(kit.calls)

        opened = await inert.open_thread(thread.thread_id)
        await opened.wait()  # recovery finds nothing it may do: it waits
        assert opened.state().to_dict() == waiting.to_dict()
        assert (await opened.replay()).to_dict() == waiting.to_dict()
        child = await opened.fork(at=events[-1].id)
        child_state = child.state()
        assert charge_eid not in child_state.effects and lookup_eid not in child_state.effects
        assert child_state.status == "idle" and child_state.turns[-1]["status"] == "interrupted"
        kit.assert_untouched(calls_before)
        assert event_dicts(await thread.events()) == event_dicts(events)
        assert (await thread.refresh()).status == "waiting"

    run(scenario())


# --- fork -------------------------------------------------------------------------------------------


def _identities(events: list[Event]) -> set[str]:
    """Every id-like value in the events: their ids and every id inside their data."""
    found: set[str] = set()
    for event in events:
        found.add(event.id)
        found |= ids_in(event.data)
    return found


def test_a_fork_records_lineage_leaves_the_parent_untouched_and_uses_new_identities(ledger: Ledger) -> None:
    kit = Kit()
    harness = ledger.harness(kit.agent())

    async def scenario() -> None:
        parent, after_one, end_of_one = await two_turns(harness)
        parent_events = await parent.events()
        before = event_dicts(parent_events)
        streams = thread_streams(harness.store)

        child = await parent.fork(at=end_of_one.id)
        assert event_dicts(await parent.events()) == before
        assert thread_streams(harness.store) == sorted([*streams, stream_of(child.thread_id)])
        assert child.thread_id != parent.thread_id
        state = child.state()
        assert state.parent == {"thread_id": parent.thread_id, "event_id": end_of_one.id, "seq": end_of_one.seq,
                                "hash": end_of_one.hash}
        [forked, *inherited] = await child.events()
        assert forked.type == "thread.forked" and forked.seq == 1
        assert forked.prev_hash == end_of_one.hash
        assert forked.data["parent"] == state.parent
        # The inherited state travels in chunks appended with the fork record, in the same batch.
        assert [e.type for e in inherited] == ["thread.inherited"] * forked.data["inherited_parts"]
        for stream in (stream_of(parent.thread_id), stream_of(child.thread_id)):
            assert harness.store.verify(stream).valid
            assert verify(harness.store, stream).valid
        assert list(state.messages) == list(after_one.messages)
        assert state.turns == tuple({**turn, "inherited": True} for turn in after_one.turns)  # the parent's turns
        assert state.usage == after_one.usage
        assert state.effects == {}  # effects are never inherited, settled or not
        assert state.status == "idle" and state.last_reply == "first"
        await assert_same_answer(harness, child)

        # The child continues the script from its own history and writes only new identities.
        await child.send("two, differently")
        child_state = await child.wait()
        assert child_state.last_reply == "second"
        child_events = await child.events()
        assert_lifecycle_order(child_events)
        assert len(effect_ids(child_events)) == 1 and len(effect_ids(child_events, "model")) == 2
        child_ids = _identities(_after_fork_record(child_events)) | {child.thread_id}
        parent_ids = _identities(parent_events) | {parent.thread_id}
        assert child_ids.isdisjoint(parent_ids), child_ids & parent_ids
        assert set(child_state.effects).isdisjoint(decision_dicts(parent.state()))
        assert [c.thread_id for c in kit.calls.contexts][-1] == child.thread_id
        assert event_dicts(await parent.events()) == before
        assert harness.store.verify(stream_of(child.thread_id)).valid
        await assert_same_answer(harness, child)
        await assert_same_answer(harness, parent)

    run(scenario())


def test_a_fork_inside_a_turn_does_not_inherit_the_open_calls(ledger: Ledger) -> None:
    kit = Kit()
    harness = ledger.harness(kit.agent())

    async def scenario() -> None:
        parent, _after_one, _end = await two_turns(harness)
        events = await parent.events()
        # Turn two's lookup: dispatched (open) at this event.
        dispatched = of_type(events, "tool.dispatched")[-1]
        open_eid = dispatched.data["effect_id"]
        at_point = await parent.replay(upto=dispatched.id)
        assert at_point.effects[open_eid].state == "unknown"

        child = await parent.fork(at=dispatched.id)
        state = child.state()
        call_id = of_type(events, "tool.requested")[-1].data["call_id"]
        assert list(state.messages) == [*at_point.messages, {
            "role": "tool", "tool_call_id": call_id, "name": "lookup", "content": NOT_INHERITED_MESSAGE,
            "status": "not_inherited"}]
        assert open_eid not in state.effects and state.effects == {}
        assert state.turns[-1]["status"] == "interrupted" and state.turns[-1]["error"]["source"] == "fork"
        assert state.status == "idle"
        await assert_same_answer(harness, child)

        # With input, the child runs a turn at once; the script continues from the child's history.
        calls_before = len(kit.calls)
        second = await parent.fork(at=dispatched.id, input="never mind, summarise")
        assert second.running or second.state().status == "running"
        second_state = await second.wait()
        assert second_state.last_reply == "second"  # assistant message #4 of the script
        assert len(kit.calls) == calls_before  # the open call was not re-run in the child
        assert second_state.messages[-2] == {"role": "user", "content": "never mind, summarise"}
        await assert_same_answer(harness, second)

    run(scenario())


def test_fork_with_input_runs_the_child_turn_with_new_effects(ledger: Ledger) -> None:
    kit = Kit()
    harness = ledger.harness(kit.agent())

    async def scenario() -> None:
        parent, _after_one, end_of_one = await two_turns(harness)
        parent_events = await parent.events()
        child = await parent.fork(at=end_of_one.id, input="try b again")
        state = await child.wait()
        assert state.status == "idle" and state.last_reply == "second"
        child_events = await child.events()
        [child_tool] = effect_ids(child_events)
        assert child_tool not in effect_ids(parent_events)
        ctx = kit.calls.contexts[-1]
        assert (ctx.effect_id, ctx.thread_id, ctx.attempt) == (child_tool, child.thread_id, 1)
        assert _identities(_after_fork_record(child_events)).isdisjoint(_identities(parent_events))
        await assert_same_answer(harness, child)

    run(scenario())


def test_a_fork_of_a_fork_keeps_its_own_lineage(ledger: Ledger) -> None:
    harness = ledger.harness(Kit().agent())

    async def scenario() -> None:
        parent, _after_one, end_of_one = await two_turns(harness)
        child = await parent.fork(at=end_of_one.id, input="again")
        await child.wait()
        child_events = await child.events()
        grandchild = await child.fork(at=child_events[-1].id)
        assert grandchild.state().parent == {"thread_id": child.thread_id, "event_id": child_events[-1].id,
                                             "seq": child_events[-1].seq, "hash": child_events[-1].hash}
        assert (await grandchild.events())[0].prev_hash == child_events[-1].hash
        assert harness.store.verify(stream_of(grandchild.thread_id)).valid
        assert list(grandchild.state().messages) == list(child.state().messages)
        await assert_same_answer(harness, grandchild)

    run(scenario())


# --- fork: bad fork points write nothing ---------------------------------------------------------------


def test_forks_at_bad_points_raise_typed_errors_and_write_nothing(ledger: Ledger) -> None:
    harness = ledger.harness(Kit().agent())

    async def scenario() -> None:
        thread, _after_one, end_of_one = await two_turns(harness)
        other = await harness.create_thread()
        other_event = (await other.events())[0]
        before = event_dicts(await thread.events())
        streams = thread_streams(harness.store)
        bad: list[tuple[Any, type[Exception]]] = [
            (new_id(), NotFound),
            (other_event.id, NotFound),
            ("not-an-event-id", InvalidInput),
            ("", InvalidInput),
            (42, InvalidInput),
            (None, InvalidInput),
        ]
        for at, error in bad:
            with pytest.raises(error):
                await thread.fork(at=at)
        for text in ("", "   ", 7):
            with pytest.raises(InvalidInput):
                await thread.fork(at=end_of_one.id, input=text)  # type: ignore[arg-type]
        assert thread_streams(harness.store) == streams
        assert event_dicts(await thread.events()) == before

    run(scenario())


def test_a_fork_with_an_oversized_input_writes_nothing(ledger: Ledger) -> None:
    harness = ledger.harness(Kit().agent())

    async def scenario() -> None:
        thread, _after_one, end_of_one = await two_turns(harness)
        streams = thread_streams(harness.store)
        with pytest.raises(InvalidInput):
            await thread.fork(at=end_of_one.id, input="x" * 200_001)
        assert thread_streams(harness.store) == streams

    run(scenario())


def test_a_fork_at_or_after_a_contradiction_is_refused(ledger: Ledger) -> None:
    harness = ledger.harness(Kit().agent())

    async def scenario() -> None:
        thread, _after_one, end_of_one = await two_turns(harness)
        events = await thread.events()
        completed = of_type(events, "tool.completed")[0]
        store = ledger.store()
        [contradiction] = store.append(stream_of(thread.thread_id), [NewEvent("tool.completed", {
            "effect_id": completed.data["effect_id"], "attempt": 1, "result": "again"})], len(events))
        streams = thread_streams(store)
        with pytest.raises(ThreadCorrupt):
            await thread.fork(at=contradiction.id)
        assert thread_streams(store) == streams
        # Before the contradiction the history is sound: forking there works.
        child = await thread.fork(at=end_of_one.id)
        assert child.state().status == "idle"

    run(scenario())


def test_replay_upto_of_a_child_starts_at_its_fork_event(ledger: Ledger) -> None:
    harness = ledger.harness(Kit().agent())

    async def scenario() -> None:
        parent, after_one, end_of_one = await two_turns(harness)
        child = await parent.fork(at=end_of_one.id, input="more")
        await child.wait()
        fork_record = [e for e in await child.events() if e.type in ("thread.forked", "thread.inherited")]
        at_fork = await child.replay(upto=fork_record[-1].seq)
        assert list(at_fork.messages) == list(after_one.messages)
        assert at_fork.parent is not None and at_fork.parent["event_id"] == end_of_one.id
        assert json.dumps(at_fork.to_dict(), sort_keys=True)  # JSON-ready
        await wait_for(lambda: not child.running)

    run(scenario())


def test_a_long_thread_can_be_forked(ledger: Ledger) -> None:
    harness = ledger.harness(Agent("echo", ScriptedModel(lambda messages: "ok")))

    async def scenario() -> None:
        thread = await harness.create_thread()
        for _ in range(3):
            await thread.send("x" * 200_000)
            await thread.wait()
        child = await thread.fork(at=(await thread.events())[-1].id)
        assert len(child.state().messages) == 6

    run(scenario())


def _after_fork_record(events: list[Event]) -> list[Event]:
    """A child's events after its fork record (``thread.forked`` and its ``thread.inherited`` chunks).

    The record quotes the parent's state, so it names parent identities by design; everything the child
    writes afterwards must use new ones.
    """
    return [e for e in events if e.type not in ("thread.forked", "thread.inherited")]
