"""Decision 0024: receipts and shared commits. No task ever sees an event before it is durable.

Threads on one event loop share their commits (``jixu.kernel.Commits``). A
call's receipt rides in the loop's next append (decision 0011) only where
that append is committed at once by the loop's only running user, so no
other task can run in between; while other threads run, a receipt is
committed on its own (shared with their appends), and the state moves only
once it is durable. These tests pin that no other task of the loop ever
sees an event before it is durable, that a receipt survives another
writer's event, and that a lost turn keeps the receipt in its error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from jixu.errors import ModelError, OwnershipLost
from jixu.kernel import Commits, unrecorded_receipts
from jixu.ledger import NewEvent, SQLiteStore
from jixu.ledger.event import Event
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
from jixu.threads.projection import ThreadProjection, ThreadState
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
    """A real thread with receipts of every kind: completed, determinate and indeterminate failures, an
    artifact, a rate-limit pause."""
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
        harness = sqlite_ledger.harness(_counting_agent())
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
        commits = Commits.of(harness.store)
        assert 0 < commits.commits < commits.appends, "the threads shared commits"
        # With other threads running, a receipt is committed on its own: about four appends per step.
        assert commits.appends <= THREADS * (4 * STEPS + 4)
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


def test_a_thread_running_alone_commits_each_receipt_with_the_next_step(sqlite_ledger: Ledger) -> None:
    """Decision 0011 on the one commit path: alone on its loop, a thread commits two appends per agent step
    (the receipt rides with the next intent and marker), each made at once."""

    async def scenario() -> None:
        harness = sqlite_ledger.harness(_counting_agent())
        thread = await harness.create_thread()
        await thread.send("go")
        commits = Commits.of(harness.store)
        before = commits.appends
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "done"
        made = commits.appends - before
        # STEPS tool steps + the final reply: per step the model's intent+marker and the tool's (each carrying
        # the receipt before it), then turn.ended with the last receipt; the turn's claim is a direct append.
        assert made == 2 * STEPS + 2, made
        assert commits.commits_at_once >= made
        await assert_same_answer(harness, thread)

    run(scenario())


async def _three_threads(ledger: Ledger, agent: Agent,
                         targets: Callable[[list[Thread]], None]) -> tuple[Harness, list[Thread]]:
    """Three threads of one harness on one loop, told their targets before any of them runs."""
    harness = ledger.harness(agent)
    threads = [await harness.create_thread() for _ in range(3)]
    targets(threads)
    # Started together: their turn.started events share one commit, and no loop runs before all are started.
    await asyncio.gather(*(thread.send("go") for thread in threads))
    return harness, threads


@pytest.mark.parametrize("others", [0, 2], ids=["alone", "beside_two_others"])
def test_a_receipt_survives_another_writers_event_and_the_call_is_not_repeated(
        sqlite_ledger: Ledger, others: int) -> None:
    """An operator's event lands while a call runs: the append carrying its receipt meets a moved head.
    The kernel folds the operator's event and records the receipt after it; the call ran once, and its
    outcome is known (before issue 21 the receipt was dropped and the read-only call run again)."""
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
        harness = sqlite_ledger.harness(Agent("raced", ScriptedModel([ToolCall("probe"), "done"]), tools=[probe]))
        threads = [await harness.create_thread() for _ in range(1 + others)]
        target.append(threads[0].thread_id)
        await asyncio.gather(*(thread.send("go") for thread in threads))
        states = await asyncio.gather(*(t.wait() for t in threads))
        assert all(s.status == "idle" and s.last_reply == "done" for s in states)
        state = await assert_same_answer(harness, threads[0])
        events = await threads[0].events()
        noted = types_of(events).index("operator.noted")
        [effect_id] = {effect for effect, _attempt in calls}
        assert calls == [(effect_id, 1)], "the call ran again"
        assert state.effects[effect_id].state == "completed" and state.effects[effect_id].attempts == 1
        receipt = next(e for e in events if e.type == "tool.completed")
        assert receipt.seq > events[noted].seq

    try:
        run(scenario())
    finally:
        other.close()


def test_a_lost_turn_keeps_the_receipt_in_its_error_and_the_state_matches_the_store(sqlite_ledger: Ledger) -> None:
    """Another process takes the turn over while a tool runs: the append carrying the receipt is fenced out,
    the loop stops with OwnershipLost, which carries the receipt it could not record, and the live state
    equals a fresh load of the store."""
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
        _harness, threads = await _three_threads(
            sqlite_ledger, Agent("stolen", ScriptedModel([ToolCall("slow"), "done"]), tools=[slow]),
            lambda made: target.append(made[0].log))
        with pytest.raises(OwnershipLost) as lost:
            await threads[0].wait()
        [receipt] = unrecorded_receipts(lost.value)
        assert receipt.type == "tool.completed" and json.loads(receipt.data_json)["result"] == "ok"
        assert lost.value.details["unrecorded_receipts"] == [receipt.id]
        for thread in threads[1:]:
            assert (await thread.wait()).last_reply == "done"
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


def test_threads_that_compact_while_sharing_commits_record_what_they_would_alone(ledger: Ledger) -> None:
    """Compactions (whose receipts edit the head of the conversation) of threads sharing commits: every path
    agrees after."""
    from tests.threads.test_compaction import Writer
    from tests.threads.test_compaction import agent as compacting_agent

    async def scenario() -> None:
        harness = ledger.harness(compacting_agent(Writer()))
        threads = [await harness.create_thread() for _ in range(3)]

        async def three_turns(thread: Thread) -> None:
            for text in ("look up alpha", "second question", "third question"):
                await thread.send(text)
                state = await thread.wait()
                assert state.status == "idle", state.reason

        await asyncio.gather(*(three_turns(thread) for thread in threads))
        commits = Commits.of(harness.store)
        assert 0 < commits.commits < commits.appends
        for thread in threads:
            events = await thread.events()
            assert "compaction.completed" in types_of(events)
            assert_lifecycle_order(events)
            await assert_same_answer(harness, thread)

    run(scenario())


def test_model_requests_of_threads_sharing_commits_scan_only_the_new_messages_for_artifacts(
        sqlite_ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each model request scans only the messages added since the last one (it scanned the whole
    conversation at every step before: quadratic in a turn)."""
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
        harness, threads = await _three_threads(
            sqlite_ledger, Agent("long", ScriptedModel(script), tools=[look]), lambda made: None)
        states = await asyncio.gather(*(t.wait() for t in threads))
        assert all(s.status == "idle" and s.last_reply == "done" for s in states)
        commits = Commits.of(harness.store)
        assert commits.commits < commits.appends, "the threads shared commits"
        messages = sum(len(s.messages) for s in states)
        requests = 3 * (steps + 1)
        assert len(scanned) == requests
        # Every message is scanned about once: the user message, then each step's two new ones.
        assert sum(scanned) <= messages + requests, (sum(scanned), messages)

    run(scenario())
