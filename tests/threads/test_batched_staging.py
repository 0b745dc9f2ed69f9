"""Decision 0019: while batching, a receipt rides in the next append and is never seen before it is durable.

With ``group_commits`` a call's receipt is staged reversibly: the loop
decides its next step from the state with the receipt in it, then
:meth:`ThreadLog.append_async` takes the receipt back out of the state
(:meth:`ThreadProjection.rollback`) before it waits for the shared commit
that carries the receipt and the next events, and applies them all, as
stored, once they are durable. These tests pin the rollback itself against
real recorded histories, that no other task of the loop ever sees an event
before it is durable, and what a failed shared commit leaves behind.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable
from typing import Any

import pytest

from jixu.errors import ModelError, OwnershipLost
from jixu.ledger import NewEvent, SQLiteStore
from jixu.ledger.event import Event
from jixu.ledger.projection import fold
from jixu.threads import (
    Agent,
    Harness,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    Thread,
    ToolCall,
    ToolContext,
    ToolError,
    tool,
)
from jixu.threads.log import ThreadLog, stream_of
from jixu.threads.projection import RECEIPT_TYPES, ThreadProjection, ThreadState
from tests.threads.conftest import Ledger, assert_lifecycle_order, assert_same_answer, run, types_of

THREADS = 6
STEPS = 6


def _everything(state: ThreadState) -> dict[str, Any]:
    """All of a state a reader or a checkpoint can see, including the last turn's fields."""
    projection = ThreadProjection()
    return {"dump": projection.dump(state), "turns": [turn.to_dict() for turn in state.turns],
            "settled": list(state.settled.encoded())}


class FlakyModel:
    """Calls for tools in a set order; its second call fails determinately once, its fourth indeterminately."""

    name = "flaky"

    def __init__(self) -> None:
        self.calls = 0

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.calls += 1
        if self.calls == 2:
            raise ModelError("rate limited", kind="rate_limit", indeterminate=False, retry_after=0.0)
        if self.calls == 4:
            raise ModelError("connection reset", kind="transient", indeterminate=True)
        answered = sum(1 for m in request.messages if m["role"] == "assistant")
        plan: list[tuple[ToolCall, ...]] = [(ToolCall("look", {"n": 1}), ToolCall("look", {"n": 2})),
                                            (ToolCall("refuse"),), (ToolCall("wobbly"),), (ToolCall("big"),)]
        if answered < len(plan):
            return ModelResponse(tool_calls=plan[answered], model=self.name, stop_reason="tool_use")
        return ModelResponse(text="all done", model=self.name, stop_reason="end_turn")


def _rich_history(ledger: Ledger) -> list[Event]:
    """A real thread whose receipts cover every kind :meth:`ThreadProjection.rollback` takes back."""
    wobbled: list[int] = []

    @tool(semantics="read_only")
    def look(n: int) -> dict[str, Any]:
        """A read-only lookup."""
        return {"n": n}

    @tool(semantics="read_only")
    def refuse() -> str:
        """A call that fails with a determinate answer."""
        raise ToolError("not allowed here")

    @tool(semantics="read_only")
    def wobbly() -> str:
        """A read-only call that breaks without an answer once (unknown, then retried)."""
        wobbled.append(1)
        if len(wobbled) == 1:
            raise RuntimeError("connection reset")
        return "steady"

    @tool(semantics="read_only")
    def big() -> str:
        """A result large enough to be stored as an artifact."""
        return "x" * 100_000

    async def scenario() -> list[Event]:
        harness = ledger.harness(Agent("rich", FlakyModel(), tools=[look, refuse, wobbly, big], max_steps=12),
                                 retry_backoff=0.001, retry_backoff_cap=0.001)
        thread = await harness.create_thread()
        await thread.send("go")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "all done", state.reason
        return await thread.events()

    return run(scenario())


def test_apply_all_applies_exactly_what_apply_applies_over_a_real_history(sqlite_ledger: Ledger) -> None:
    """The reducer's one-loop ``apply_all`` (what a replay runs) against ``apply`` event by event, from the
    start and from every point of the history."""
    events = _rich_history(sqlite_ledger)
    projection = ThreadProjection()

    def one_by_one(upto: int) -> ThreadState:
        state = projection.initial()
        for event in events[:upto]:
            state = projection.apply(state, event)
        return state

    whole = _everything(one_by_one(len(events)))
    assert _everything(projection.apply_all(projection.initial(), events)) == whole
    for index in range(1, len(events)):
        assert _everything(projection.apply_all(one_by_one(index), events[index:])) == whole


def test_rollback_takes_back_every_receipt_of_a_real_history_exactly(sqlite_ledger: Ledger) -> None:
    events = _rich_history(sqlite_ledger)
    projection = ThreadProjection()
    receipts = [index for index, event in enumerate(events) if event.type in RECEIPT_TYPES]
    assert {events[index].type for index in receipts} == RECEIPT_TYPES, "the history misses a receipt kind"
    assert any("result_artifact" in events[index].data for index in receipts)
    assert any(events[index].data.get("indeterminate") is True for index in receipts)
    for index in receipts:
        # One receipt, and every run of receipts that follow each other (parallel calls answer back to back).
        end = index + 1
        while end < len(events) and events[end].type in RECEIPT_TYPES:
            end += 1
        for stop in range(index + 1, end + 1):
            state = fold(projection, events[:index])
            before = _everything(state)
            mark = projection.mark(state)
            for event in events[index:stop]:
                state = projection.apply(state, event)
            assert _everything(state) != before, f"applying {events[index].type} changed nothing"
            projection.rollback(state, mark)
            assert _everything(state) == before, f"rollback of events {index}..{stop - 1} left a trace"
            # What follows applies to the rolled-back state exactly as to a state that never saw them.
            for event in events[index:]:
                state = projection.apply(state, event)
            assert _everything(state) == _everything(fold(projection, events))


def _as_staged(event: Event) -> Event:
    """``event`` as :meth:`ThreadLog.stage` projects it before it is stored: no time, no hash, its own copy
    of the data (parsed again from the same text)."""
    return dataclasses.replace(event, data=json.loads(json.dumps(event.data)), recorded_at="", hash="")


def test_applying_the_stored_receipts_again_after_a_rollback_makes_what_applying_them_makes(
        sqlite_ledger: Ledger) -> None:
    """What ``append_async`` does: stage receipts, take them back, then apply them as stored reusing the
    decisions taken back (decision 0019). The state is the one a plain fold of the history makes."""
    events = _rich_history(sqlite_ledger)
    projection = ThreadProjection()
    whole = _everything(fold(projection, events))
    reused = 0
    for index, event in enumerate(events):
        if event.type not in RECEIPT_TYPES:
            continue
        end = index + 1
        while end < len(events) and events[end].type in RECEIPT_TYPES:
            end += 1
        state = fold(projection, events[:index])
        mark = projection.mark(state)
        for staged in events[index:end]:
            state = projection.apply(state, _as_staged(staged))
        taken_back = projection.rollback(state, mark)
        reused += len(taken_back)
        state = projection.apply_again(state, events[index:], taken_back)
        assert _everything(state) == whole, f"receipts {index}..{end - 1} applied again differ"
    assert reused > 5, "no decision was taken back to reuse"


def test_a_decision_taken_back_is_reused_only_for_the_same_receipt_after_the_same_events(
        sqlite_ledger: Ledger) -> None:
    events = _rich_history(sqlite_ledger)
    projection = ThreadProjection()
    index = next(i for i, event in enumerate(events) if event.type == "tool.completed")
    receipt = events[index]
    effect_id = receipt.data["effect_id"]
    state = fold(projection, events[:index])
    mark = projection.mark(state)
    projection.apply(state, _as_staged(receipt))
    taken_back = projection.rollback(state, mark)
    text, before, then = taken_back[effect_id]
    assert [e.type for e in before] == ["tool.requested", "tool.dispatched"] and then.id == receipt.id
    # A marker in place of the text shows which path settled the effect (a real text is JSON).
    marked = {effect_id: ("REUSED", before, then)}

    def settled_text(receipt_now: Event, taken: dict[str, Any]) -> str:
        again = fold(projection, events[:index])
        again.open_events[effect_id][:] = list(before)  # the very events the decision was made from
        again = projection.apply_again(again, [receipt_now], taken)
        return str(again.settled._rows[effect_id])

    assert settled_text(receipt, marked) == "REUSED"
    changed = dataclasses.replace(receipt, data={**receipt.data, "result": "something else"})
    assert settled_text(changed, marked) != "REUSED"
    assert settled_text(dataclasses.replace(receipt, seq=receipt.seq + 1), marked) != "REUSED"
    # Equal but not the same earlier events: decided again.
    copies = tuple(dataclasses.replace(e) for e in before)
    assert settled_text(receipt, {effect_id: ("REUSED", copies, then)}) != "REUSED"
    assert settled_text(receipt, {}) == text
    # Reuse lasts for one apply_again only.
    assert projection.apply(fold(projection, events[:index]), receipt).settled._rows[effect_id] == text


@tool(semantics="read_only")
async def look() -> str:
    """A read-only call that yields to the loop, as real I/O does."""
    await asyncio.sleep(0)
    return "seen"


def _counting_agent() -> Agent:
    def script(messages: list[dict[str, Any]]) -> Any:
        done = sum(1 for m in messages if m["role"] == "tool")
        return ToolCall("look", {}) if done < STEPS else "done"

    return Agent("batched", ScriptedModel(script), tools=[look], max_steps=STEPS + 2)


def test_no_other_task_ever_sees_an_event_before_it_is_durable(sqlite_ledger: Ledger) -> None:
    observer = SQLiteStore(sqlite_ledger.path)  # another connection: it sees committed events only
    observed = {"all": 0, "in_flight": 0}

    async def scenario() -> None:
        harness = sqlite_ledger.harness(_counting_agent(), group_commits=True)
        threads = [await harness.create_thread() for _ in range(THREADS)]
        for thread in threads:
            await thread.send("go")

        async def watch() -> None:
            while any(t.running for t in threads):
                for thread in threads:
                    info = observer.stream_info(thread.stream)
                    assert info is not None
                    # Nothing else runs on the loop between these reads, so the state cannot move in between.
                    assert thread.log.state.seq <= info.head_seq, "the state holds an event not yet durable"
                    assert thread.state().seq <= info.head_seq
                    observed["all"] += 1
                    observed["in_flight"] += thread.log.appending
                await asyncio.sleep(0)

        await asyncio.gather(watch(), *(t.wait() for t in threads))
        batcher = harness.commit_batcher()
        assert batcher is not None and 0 < batcher.commits < batcher.appends
        # Receipts rode with the next events: about two appends per step, not four.
        assert batcher.appends <= THREADS * (2 * STEPS + 2)
        for thread in threads:
            events = await thread.events()
            assert_lifecycle_order(events)
            assert types_of(events).count("tool.completed") == STEPS
            await assert_same_answer(harness, thread)

    try:
        run(scenario())
    finally:
        observer.close()
    assert observed["in_flight"] > 50, observed  # the check ran while commits carrying receipts were in flight


async def _three_batched_threads(ledger: Ledger, agent: Agent,
                                 targets: Callable[[list[Thread]], None]) -> tuple[Harness, list[Thread]]:
    """Three threads of one harness with ``group_commits``, told their targets before any of them runs."""
    harness = ledger.harness(agent, group_commits=True)
    threads = [await harness.create_thread() for _ in range(3)]
    targets(threads)
    # Started together: their turn.started events share one commit, and no loop runs before all are started.
    await asyncio.gather(*(thread.send("go") for thread in threads))
    return harness, threads


def test_a_concurrent_write_drops_the_batched_receipt_and_the_call_is_retried_under_its_identity(
        sqlite_ledger: Ledger) -> None:
    """An operator's event lands while a call runs: the shared append carrying its receipt meets a moved
    head. The state was never ahead of the store, so the loop just reads the new event and decides again."""
    other = SQLiteStore(sqlite_ledger.path)
    calls: list[tuple[str, int]] = []
    target: list[str] = []

    @tool(semantics="read_only")
    async def probe(ctx: ToolContext) -> str:
        """A read-only probe; the first attempt of the target thread races an operator's note."""
        if ctx.thread_id == target[0]:
            calls.append((ctx.effect_id, ctx.attempt))
            if ctx.attempt == 1:
                head = other.stream_info(stream_of(ctx.thread_id))
                assert head is not None
                other.append(stream_of(ctx.thread_id),
                             [NewEvent("operator.noted", {"note": "hello"}, {"actor": "operator"})], head.head_seq)
        await asyncio.sleep(0)
        return "probed"

    async def scenario() -> None:
        harness, threads = await _three_batched_threads(
            sqlite_ledger, Agent("raced", ScriptedModel([ToolCall("probe"), "done"]), tools=[probe]),
            lambda made: target.append(made[0].thread_id))
        states = await asyncio.gather(*(t.wait() for t in threads))
        assert all(s.status == "idle" and s.last_reply == "done" for s in states)
        batcher = harness.commit_batcher()
        assert batcher is not None and batcher.appends > 0
        state = await assert_same_answer(harness, threads[0])
        assert "operator.noted" in types_of(await threads[0].events())
        [effect_id] = {effect for effect, _attempt in calls}
        assert calls == [(effect_id, 1), (effect_id, 2)]
        assert state.effects[effect_id].state == "completed" and state.effects[effect_id].attempts == 2

    try:
        run(scenario())
    finally:
        other.close()


def test_a_lost_turn_drops_the_batched_receipt_and_the_state_matches_the_store(sqlite_ledger: Ledger) -> None:
    """Another process takes the turn over while a tool runs: the shared append carrying the receipt is fenced
    out, the loop stops with OwnershipLost, and the live state equals a fresh load of the store."""
    thief = SQLiteStore(sqlite_ledger.path)
    target: list[ThreadLog] = []

    @tool(semantics="read_only")
    async def slow(ctx: ToolContext) -> str:
        """A read-only call during which the target thread's lease is taken over."""
        log = target[0]
        if ctx.thread_id == log.thread_id:
            lease = thief.get_lease(log.turn_key)
            assert lease is not None
            thief.take_over_lease(log.turn_key, "thief", 30.0, expected_epoch=lease.epoch, require_expired=False)
        await asyncio.sleep(0)
        return "ok"

    async def scenario() -> None:
        harness, threads = await _three_batched_threads(
            sqlite_ledger, Agent("stolen", ScriptedModel([ToolCall("slow"), "done"]), tools=[slow]),
            lambda made: target.append(made[0].log))
        with pytest.raises(OwnershipLost):
            await threads[0].wait()
        for thread in threads[1:]:
            assert (await thread.wait()).last_reply == "done"
        batcher = harness.commit_batcher()
        assert batcher is not None and batcher.appends > 0
        stored = thief.read(threads[0].stream)
        assert types_of(stored)[-1] == "tool.dispatched", "nothing after the dispatch marker was committed"
        state = threads[0].log.state
        assert state.seq == stored[-1].seq and state.head_hash == stored[-1].hash
        fresh = ThreadLog.load(thief, threads[0].thread_id)
        assert ThreadProjection().dump(state) == ThreadProjection().dump(fresh.state)

    try:
        run(scenario())
    finally:
        thief.close()


def test_threads_that_compact_while_batching_record_what_they_would_alone(ledger: Ledger) -> None:
    """A compaction's receipt cannot be taken back out of the state (it edits the head of the conversation):
    staged while batching, it is committed directly with the next events, and every path agrees after."""
    from tests.threads.test_compaction import Writer
    from tests.threads.test_compaction import agent as compacting_agent

    async def scenario() -> None:
        harness = ledger.harness(compacting_agent(Writer()), group_commits=True)
        threads = [await harness.create_thread() for _ in range(3)]

        async def three_turns(thread: Thread) -> None:
            for text in ("look up alpha", "second question", "third question"):
                await thread.send(text)
                state = await thread.wait()
                assert state.status == "idle", state.reason

        await asyncio.gather(*(three_turns(thread) for thread in threads))
        batcher = harness.commit_batcher()
        assert batcher is not None and 0 < batcher.commits < batcher.appends
        for thread in threads:
            events = await thread.events()
            assert "compaction.completed" in types_of(events)
            assert_lifecycle_order(events)
            await assert_same_answer(harness, thread)

    run(scenario())


def test_batched_model_requests_scan_only_the_new_messages_for_artifacts(
        sqlite_ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """With receipts taken back and applied again, each model request still scans only the messages added
    since the last one (it scanned the whole conversation at every step before: quadratic in a turn)."""
    import jixu.threads.thread as thread_module

    scanned: list[int] = []

    def counting_any(items: Any) -> bool:
        seen = list(items)
        scanned.append(len(seen))
        return any(seen)

    monkeypatch.setattr(thread_module, "any", counting_any, raising=False)
    steps = 30

    async def scenario() -> None:
        script = [ToolCall("look")] * steps + ["done"]
        harness, threads = await _three_batched_threads(
            sqlite_ledger, Agent("long", ScriptedModel(script), tools=[look]), lambda made: None)
        states = await asyncio.gather(*(t.wait() for t in threads))
        assert all(s.status == "idle" and s.last_reply == "done" for s in states)
        batcher = harness.commit_batcher()
        assert batcher is not None and batcher.commits < batcher.appends, "the threads shared commits"
        messages = sum(len(s.messages) for s in states)
        requests = 3 * (steps + 1)
        assert len(scanned) == requests
        # Every message is scanned about once: the user message, then each step's two new ones.
        assert sum(scanned) <= messages + requests, (sum(scanned), messages)

    run(scenario())
