"""Decision 0011: a call's receipt is committed with the next step's first events.

When one call runs alone, its receipt is projected at once (the loop decides
the next step from it) and committed in the same append as that step's
intent and dispatch marker. These tests pin what that must never change:
the receipt is durable before anything else leaves the process, a failed
commit leaves the in-memory state equal to what the store holds (and a
receipt that met another writer's event is recorded after it), and online,
reopened and replayed states agree.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from jixu.errors import OwnershipLost
from jixu.ledger import NewEvent, SQLiteStore
from jixu.threads import Agent, ScriptedModel, ToolCall, ToolContext, tool
from jixu.threads.log import ThreadLog, stream_of
from jixu.threads.projection import ThreadProjection
from tests.threads.conftest import Ledger, assert_lifecycle_order, assert_same_answer, run, types_of

STEPS = 12


def _stored_types(store: SQLiteStore, thread_id: str) -> list[str]:
    return types_of(store.read(stream_of(thread_id)))


def test_an_agent_step_is_two_commits_and_each_receipt_is_stored_before_the_next_dispatch(
        sqlite_ledger: Ledger, tmp_path: Path) -> None:
    observer = SQLiteStore(sqlite_ledger.path)  # another connection: it sees only committed events
    thread_ids: list[str] = []
    seen_by_tool: list[list[str]] = []
    seen_by_model: list[list[str]] = []

    @tool(semantics="read_only")
    def look(n: int) -> dict[str, Any]:
        """Look something up (read-only)."""
        seen_by_tool.append(_stored_types(observer, thread_ids[0]))
        return {"n": n}

    def script(messages: list[dict[str, Any]]) -> Any:
        seen_by_model.append(_stored_types(observer, thread_ids[0]))
        done = sum(1 for m in messages if m["role"] == "tool")
        return ToolCall("look", {"n": done}) if done < STEPS else "finished"

    async def scenario() -> None:
        harness = sqlite_ledger.harness(Agent("staged", ScriptedModel(script), tools=[look], max_steps=STEPS + 2))
        store = harness.store
        assert isinstance(store, SQLiteStore)
        thread = await harness.create_thread()
        thread_ids.append(thread.thread_id)
        commits = store.commit_count
        await thread.send("go")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "finished"
        # Append transactions: turn.started; the first model intent + marker; per agent step [model receipt +
        # tool intent + marker] and [tool receipt + model intent + marker]; the last model receipt + turn.ended.
        assert store.commit_count - commits == 1 + 1 + 2 * STEPS + 1
        events = await thread.events()
        assert_lifecycle_order(events)
        await assert_same_answer(harness, thread)
        # The live projection holds the stored events themselves, not provisional copies.
        replayed = ThreadProjection().initial()
        for event in events:
            replayed = ThreadProjection().apply(replayed, event)
        assert ThreadProjection().dump(thread.log.state) == ThreadProjection().dump(replayed)

    try:
        run(scenario())
    finally:
        observer.close()
    # Every tool call saw the model receipt that asked for it stored; every model call saw the previous
    # tool's receipt stored (and no receipt is ever missing from what the next call observed).
    assert len(seen_by_tool) == STEPS and len(seen_by_model) == STEPS + 1
    for index, stored in enumerate(seen_by_tool):
        assert stored.count("model.completed") == index + 1 and stored[-1] == "tool.dispatched"
        assert stored.count("tool.completed") == index
    for index, stored in enumerate(seen_by_model):
        assert stored.count("tool.completed") == index and stored[-1] == "model.dispatched"


def test_a_failed_shared_commit_drops_the_staged_receipt_and_the_state_matches_the_store(
        sqlite_ledger: Ledger) -> None:
    """Another process takes the turn over while a tool runs: the receipt cannot be committed with the
    next step, the loop stops with OwnershipLost, and the live state equals a fresh load of the store."""
    thief = SQLiteStore(sqlite_ledger.path)
    captured: list[ThreadLog] = []

    @tool(semantics="read_only")
    def slow(ctx: ToolContext) -> str:
        """A read-only call during which the lease is taken over."""
        log = captured[0]
        lease = thief.get_lease(log.turn_key)
        assert lease is not None
        thief.take_over_lease(log.turn_key, "thief", 30.0, expected_epoch=lease.epoch, require_expired=False)
        return "ok"

    async def scenario() -> None:
        harness = sqlite_ledger.harness(Agent("stolen", ScriptedModel([ToolCall("slow"), "never"]), tools=[slow]))
        thread = await harness.create_thread()
        captured.append(thread.log)
        await thread.send("go")
        with pytest.raises(OwnershipLost):
            await thread.wait()
        stored = thief.read(thread.stream)
        assert types_of(stored)[-1] == "tool.dispatched", "nothing after the dispatch marker was committed"
        assert thread.log.state.seq == stored[-1].seq and thread.log.state.head_hash == stored[-1].hash
        fresh = ThreadLog.load(thief, thread.thread_id)
        assert ThreadProjection().dump(thread.log.state) == ThreadProjection().dump(fresh.state)

    try:
        run(scenario())
    finally:
        thief.close()


def test_a_concurrent_write_during_a_call_keeps_the_staged_receipt_and_the_call_is_not_repeated(
        ledger: Ledger) -> None:
    """An operator's event lands while the call runs: the commit carrying the staged receipt meets a moved
    head. The kernel reloads the state from the store, folds the operator's event and records the receipt
    after it (a receipt is a fact): the read-only call ran once and is completed (before issue 21 the
    receipt was dropped and the call retried under its identity)."""
    calls: list[tuple[str, int]] = []
    thread_ids: list[str] = []
    other = ledger.store()

    @tool(semantics="read_only")
    def probe(ctx: ToolContext) -> str:
        """A read-only probe; its first attempt races an operator's note."""
        calls.append((ctx.effect_id, ctx.attempt))
        if ctx.attempt == 1:
            stream = stream_of(thread_ids[0])
            head = other.stream_info(stream)
            assert head is not None
            other.append(stream, [NewEvent("operator.noted", {"note": "hello"}, {"actor": "operator"})],
                         head.head_seq)
        return "probed"

    async def scenario() -> None:
        harness = ledger.harness(Agent("raced", ScriptedModel([ToolCall("probe"), "done"]), tools=[probe]))
        thread = await harness.create_thread()
        thread_ids.append(thread.thread_id)
        await thread.send("go")
        state = await assert_same_answer(harness, thread)
        assert state.status == "idle" and state.last_reply == "done"
        events = await thread.events()
        noted = types_of(events).index("operator.noted")
        [effect_id] = {effect for effect, _attempt in calls}
        assert calls == [(effect_id, 1)], "the call ran again"
        assert state.effects[effect_id].state == "completed" and state.effects[effect_id].attempts == 1
        receipt = next(e for e in events if e.type == "tool.completed")
        assert receipt.seq > events[noted].seq

    run(scenario())


def test_a_staged_receipt_that_leaves_its_effect_open_is_kept_as_the_stored_event(durable_ledger: Ledger) -> None:
    """An unsafe call fails without a determinate answer: its receipt stays among the open effect's events.
    The live state (and the checkpoint written from it) must hold the stored event, with its real time and
    hash, exactly as a reload from the store does."""

    @tool(semantics="unsafe")
    def charge() -> str:
        """An unsafe call that breaks mid-way."""
        raise RuntimeError("connection reset after the request was sent")

    async def scenario() -> None:
        harness = durable_ledger.harness(Agent("open", ScriptedModel([ToolCall("charge"), "never"]),
                                               tools=[charge]))
        thread = await harness.create_thread()
        await thread.send("go")
        state = await thread.wait()
        assert state.status == "waiting"
        events = await thread.events()
        assert types_of(events)[-1] == "tool.failed"
        [effect_id] = list(thread.log.state.open_events)
        assert [e.hash for e in thread.log.state.open_events[effect_id]] == [
            e.hash for e in events if e.data.get("effect_id") == effect_id]
        fresh = ThreadLog.load(durable_ledger.store(), thread.thread_id)
        assert fresh.checkpoint_status == "used"
        assert ThreadProjection().dump(thread.log.state) == ThreadProjection().dump(fresh.state)
        await assert_same_answer(harness, thread)

    run(scenario())
