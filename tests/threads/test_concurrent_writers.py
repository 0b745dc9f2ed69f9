"""The effect kernel under concurrency: parallel calls of one response, and other writers on the same stream.

Two rules of issue 21, each tried the way it broke:

* Parallel calls of one model response are recorded by one writer per
  stream: their appends are serialised and chained (never two at one
  ``expected_seq``), so every call is dispatched exactly once, with shared
  commits on or off, and ``wait()`` never reports a contradiction the
  events do not hold.
* A receipt is never dropped: when another writer (an operator's approval,
  denial or resolution from another connection) moved the head while a
  call ran, the kernel reads the new events, folds them and records the
  receipt after them. The call ran once and its outcome stays known.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest

from jixu.ledger import NewEvent, Store
from jixu.recovery import RecoveryResolver
from jixu.threads import Agent, ScriptedModel, ToolCall, ToolContext, tool
from jixu.threads.log import ThreadLog
from tests.threads.conftest import Ledger, assert_lifecycle_order, assert_same_answer, lifecycle, run


def _two_call_agent(tools: list[Any], calls: list[ToolCall]) -> Agent:
    """A model that asks for ``calls`` in one response, then replies ``done`` once every result is in."""

    def script(messages: list[dict[str, Any]]) -> Any:
        answered = sum(1 for m in messages if m["role"] == "tool")
        return list(calls) if answered == 0 else "done"

    return Agent("parallel", ScriptedModel(script), tools=tools, max_steps=6)


@pytest.mark.parametrize("semantics", ["read_only", "idempotent", "unsafe"])
@pytest.mark.parametrize("finish", ["together", "staggered"])
def test_parallel_calls_of_one_response_are_each_dispatched_once(
        ledger: Ledger, semantics: str, finish: str) -> None:
    """Two threads on one loop, each asking for two calls at once: every call leaves exactly once.

    ``together``: both calls of a response return in the same turn of the event loop, so their receipts
    are recorded at the same moment (the case that once submitted two appends at one expected seq);
    ``staggered``: one returns a few loop turns after the other.
    """
    ran: Counter[str] = Counter()
    entered: dict[str, int] = Counter()
    both_in: dict[str, asyncio.Event] = {}

    @tool(semantics=semantics)  # type: ignore[call-overload]
    async def probe(which: str, ctx: ToolContext) -> str:
        """A call that yields to the loop while it runs, as real I/O does."""
        ran[ctx.effect_id] += 1
        entered[ctx.thread_id] += 1
        gate = both_in.setdefault(ctx.thread_id, asyncio.Event())
        if entered[ctx.thread_id] % 2 == 0:
            gate.set()
        await gate.wait()
        for _ in range(3 if finish == "staggered" and which == "b" else 0):
            await asyncio.sleep(0)
        return f"{which} seen"

    agent = _two_call_agent([probe], [ToolCall("probe", {"which": "a"}), ToolCall("probe", {"which": "b"})])

    async def scenario() -> None:
        harness = ledger.harness(agent)
        threads = [await harness.create_thread() for _ in range(2)]
        await asyncio.gather(*(thread.send("go") for thread in threads))
        states = await asyncio.gather(*(asyncio.wait_for(thread.wait(), 30) for thread in threads))
        assert [s.status for s in states] == ["idle", "idle"], [s.reason for s in states]
        assert all(s.last_reply == "done" for s in states)
        tool_effects = []
        for thread in threads:
            events = await thread.events()
            assert_lifecycle_order(events)
            dispatched = [e for e in events if e.type == "tool.dispatched"]
            assert [e.data["attempt"] for e in dispatched] == [1, 1]
            tool_effects.extend(e.data["effect_id"] for e in dispatched)
            assert harness.store.verify(thread.stream).valid
            analysis = RecoveryResolver.analyze(events)
            assert not analysis.has_corruption
            assert {d.state for d in analysis.decisions.values()} == {"completed"}
            await assert_same_answer(harness, thread)
        assert dict(ran) == dict.fromkeys(tool_effects, 1), "a call ran more than once"

    run(scenario())


def _approve_from_elsewhere(store: Store, thread_id: str, effect_id: str) -> None:
    """An operator's approval through another connection (its own record of the thread)."""
    ThreadLog.load(store, thread_id, actor="other-operator").decide_parked(effect_id, "approved",
                                                                           actor="other-operator")


def test_a_receipt_is_kept_when_another_writer_moved_the_head_while_the_call_ran(
        ledger: Ledger) -> None:
    """While an unsafe refund runs, another connection approves its parked sibling: the refund's receipt is
    recorded after the approval, the refund ran once and is ``completed``, and the approved call runs."""
    refunds: list[str] = []
    notices: list[str] = []
    running = asyncio.Event()
    release = asyncio.Event()

    @tool(semantics="unsafe")
    async def refund(order: int, ctx: ToolContext) -> str:
        """Refund an order (here: wait until the test has approved the sibling call elsewhere)."""
        refunds.append(ctx.effect_id)
        running.set()
        await release.wait()
        return f"refunded {order}"

    @tool(semantics="unsafe", requires_approval=True)
    def notify(text: str, ctx: ToolContext) -> str:
        """Tell the customer (parked until an operator approves)."""
        notices.append(ctx.effect_id)
        return "told"

    agent = _two_call_agent([refund, notify], [ToolCall("refund", {"order": 42}),
                                               ToolCall("notify", {"text": "refund issued"})])

    async def scenario() -> None:
        harness = ledger.harness(agent)
        thread = await harness.create_thread()
        await thread.send("refund order 42")
        await asyncio.wait_for(running.wait(), 10)
        events = await thread.events()
        [parked] = [e.data["effect_id"] for e in events if e.type == "tool.parked"]
        _approve_from_elsewhere(ledger.store(), thread.thread_id, parked)
        release.set()
        state = await thread.wait()
        assert state.status == "idle", state.reason
        assert state.last_reply == "done"
        events = await thread.events()
        [refund_id] = refunds
        assert [e.type for e in lifecycle(events, refund_id)] == [
            "tool.requested", "tool.dispatched", "tool.completed"]
        assert state.effects[refund_id].state == "completed"
        assert state.effects[refund_id].reason == "succeeded"
        approved = next(e for e in events if e.type == "tool.approved")
        receipt = next(e for e in events if e.type == "tool.completed" and e.data["effect_id"] == refund_id)
        assert approved.seq < receipt.seq, "the receipt was recorded after the other writer's approval"
        assert notices == [parked]
        assert state.effects[parked].state == "completed"
        assert_lifecycle_order(events)
        await assert_same_answer(harness, thread)

    run(scenario())


def test_the_receipt_of_a_call_running_alone_is_kept_when_another_process_ends_the_turn(
        ledger: Ledger) -> None:
    """One unsafe call alone (its receipt would ride with the next step's events): meanwhile another
    connection records that the turn was interrupted. The charge did happen: its receipt is recorded after
    the interruption, the effect is ``completed`` and nothing is dispatched again."""
    charges: list[str] = []
    started = asyncio.Event()
    release = asyncio.Event()

    @tool(semantics="unsafe")
    async def charge(amount: int, ctx: ToolContext) -> str:
        """Charge a card."""
        charges.append(ctx.effect_id)
        started.set()
        await release.wait()
        return f"charged {amount}"

    agent = Agent("charger", ScriptedModel([ToolCall("charge", {"amount": 5}), "charged"]), tools=[charge])

    async def scenario() -> None:
        harness = ledger.harness(agent)
        thread = await harness.create_thread()
        await thread.send("charge 5")
        await asyncio.wait_for(started.wait(), 10)
        other = ThreadLog.load(ledger.store(), thread.thread_id, actor="other-operator")
        assert other.end_running_turn("stopped by another operator")
        release.set()
        state = await thread.wait()
        [charge_id] = charges
        assert state.effects[charge_id].state == "completed", state.effects[charge_id]
        events = await thread.events()
        assert [e.type for e in lifecycle(events, charge_id)] == [
            "tool.requested", "tool.dispatched", "tool.completed"]
        ended = next(e for e in events if e.type == "turn.ended")
        receipt = next(e for e in events if e.type == "tool.completed")
        assert ended.data["outcome"] == "interrupted" and ended.seq < receipt.seq
        assert state.status == "idle", state.reason
        assert not RecoveryResolver.analyze(events).has_corruption
        await assert_same_answer(harness, thread)

    run(scenario())


def test_wait_never_raises_a_raw_concurrency_error_when_an_operator_writes_mid_turn(ledger: Ledger) -> None:
    """Another connection appends to the thread's stream while each call of a running turn runs (an event type
    this version does not act on, as a newer version's or another tool's would be): the loop folds each,
    records every receipt after it and goes on; no call is dispatched twice."""
    steps = 6
    entered: asyncio.Queue[int] = asyncio.Queue()
    release: asyncio.Queue[None] = asyncio.Queue()

    @tool(semantics="read_only")
    async def look(n: int) -> str:
        """Look something up (waits until the other writer has written)."""
        await entered.put(n)
        await release.get()
        return f"seen {n}"

    def script(messages: list[dict[str, Any]]) -> Any:
        answered = sum(1 for m in messages if m["role"] == "tool")
        return ToolCall("look", {"n": answered}) if answered < steps else "done"

    agent = Agent("looker", ScriptedModel(script), tools=[look], max_steps=steps + 2)

    async def scenario() -> None:
        harness = ledger.harness(agent)
        thread = await harness.create_thread()
        other_store = ledger.store()

        async def interfere() -> None:
            for _ in range(steps):
                await asyncio.wait_for(entered.get(), 10)
                other = ThreadLog.load(other_store, thread.thread_id, actor="other")
                other.append([NewEvent("thread.noted", {"note": "still here"}, other.meta("other"))])
                await release.put(None)

        await thread.send("go")
        await asyncio.gather(interfere(), thread.wait())
        state = await thread.wait()
        assert state.status == "idle", state.reason
        assert state.last_reply == "done"
        events = await thread.events()
        assert_lifecycle_order(events)
        assert [e.data["attempt"] for e in events if e.type == "tool.dispatched"] == [1] * steps
        assert sum(1 for e in events if e.type == "tool.completed") == steps
        assert sum(1 for e in events if e.type == "thread.noted") == steps
        await assert_same_answer(harness, thread)

    run(scenario())


@pytest.mark.parametrize("calls", ["one_invalid", "valid_and_invalid"])
def test_a_rejected_call_is_recorded_with_its_intent_when_another_writer_moved_the_head(
        ledger: Ledger, calls: str) -> None:
    """Another connection appends while the model call runs; the model then asks for a call whose arguments are
    invalid (rejected before dispatch: its intent and its rejection are one commit, after the model's receipt).
    That commit meets the other writer's event. The model's receipt is recorded after it, and the rejection goes
    with its intent when the loop decides again: recorded alone, it was a receipt without an intent and the
    thread was corrupt for good."""
    seen: dict[str, Any] = {"asked": 0}

    @tool(semantics="read_only")
    async def look(n: int) -> str:
        """Look something up."""
        return f"seen {n}"

    def answer_after_another_write(messages: list[dict[str, Any]]) -> Any:
        seen["asked"] += 1
        if seen["asked"] > 1:
            return "done"
        other = ThreadLog.load(seen["store"], seen["thread_id"], actor="other")
        other.append([NewEvent("thread.noted", {"note": "written while the model thought"}, other.meta("other"))])
        invalid = ToolCall("look", {"n": "not a number"})
        return [invalid] if calls == "one_invalid" else [ToolCall("look", {"n": 1}), invalid]

    agent = Agent("looker", ScriptedModel(answer_after_another_write), tools=[look], max_steps=6)

    async def scenario() -> None:
        harness = ledger.harness(agent)
        thread = await harness.create_thread()
        seen.update(store=ledger.store(), thread_id=thread.thread_id)
        await thread.send("go")
        state = await thread.wait()
        assert (state.status, state.last_reply) == ("idle", "done"), state.reason
        events = await thread.events()
        assert_lifecycle_order(events)
        analysis = RecoveryResolver.analyze(events)
        assert not analysis.has_corruption and not analysis.unattributed_events
        [rejected] = [e for e in events if e.type == "tool.failed"]
        assert rejected.data["effect_id"] not in {e.data["effect_id"] for e in events if e.type == "tool.dispatched"}
        await assert_same_answer(harness, thread)

    run(scenario())


@pytest.mark.parametrize("writer", ["once", "every_time"])
def test_a_send_that_meets_another_writers_event_starts_its_turn_after_it_and_keeps_no_stray_lease(
        tmp_path: Any, writer: str) -> None:
    """Another connection appends to the thread (an operator's note) between ``send``'s look at the head and
    the commit of its ``turn.started``. The send decides again on that event and starts its turn after it;
    when the other writer wins every time, the send fails with ``ConcurrencyError`` and gives its turn lease
    back. Before, it raised at once and left the lease held, so every other process got ``TurnOwned`` for a
    turn that did not exist until the lease expired."""
    from jixu import Harness
    from jixu.errors import ConcurrencyError
    from jixu.ledger import SQLiteStore
    from jixu.threads.log import START_TRIES

    path = tmp_path / "ledger.db"

    class NoteFirst(SQLiteStore):
        """Lets another connection append a note right before a ``turn.started`` is committed."""

        notes = 0

        def _before(self, events: Any) -> None:
            if (writer == "every_time" or not self.notes) and any(getattr(e, "type", "") == "turn.started"
                                                                  for e in events):
                self.notes += 1
                with SQLiteStore(path) as other:
                    [info] = other.list_streams("thread/")
                    log = ThreadLog.load(other, info.stream.split("/", 1)[1], actor="operator")
                    log.append([NewEvent("thread.noted", {"note": "customer called"}, log.meta("operator"))])

        def append(self, stream: str, events: Any, expected_seq: int, fence: Any = None, **kw: Any) -> Any:
            self._before(events)
            return super().append(stream, events, expected_seq, fence, **kw)

        def append_many(self, requests: Any) -> Any:
            for request in requests:
                self._before(request.events)
            return super().append_many(requests)

    store = NoteFirst(path)
    harness = Harness(Agent("noted", ScriptedModel(["Hello."])), store, owner="app")

    async def scenario() -> None:
        thread = await harness.create_thread()
        if writer == "every_time":
            with pytest.raises(ConcurrencyError):
                await thread.send("hi")
            assert store.notes == START_TRIES
            assert "turn.started" not in [e.type for e in await thread.events()]
        else:
            turn_id = await thread.send("hi")
            state = await thread.wait()
            assert (state.status, state.last_reply) == ("idle", "Hello."), state.reason
            types = [e.type for e in await thread.events()]
            assert types.index("thread.noted") < types.index("turn.started"), types
            started = [e for e in await thread.events() if e.type == "turn.started"]
            assert [e.data["turn_id"] for e in started] == [turn_id]
        lease = store.get_lease(f"thread/{thread.thread_id}/turn")
        assert lease is not None and lease.released, lease

    run(scenario())
    store.close()


def _note(store: Store, thread_id: str) -> None:
    """Another connection's event on the thread's stream (an operator's note)."""
    log = ThreadLog.load(store, thread_id, actor="op")
    log.append([NewEvent("thread.noted", {"note": "busy"}, log.meta("op"))])


def test_no_receipt_is_dropped_however_often_another_writer_wins_the_race(ledger: Ledger) -> None:
    """Another connection appends right before every write that carries a receipt, 60 times over (a tight
    foreign loop that always wins): every receipt is still recorded, in order after the others' events. The
    kernel once gave up after 20 re-appends and the loop dropped the receipts: an unsafe call that ran became
    ``unknown`` for an operator, an idempotent one ran again."""
    ran: Counter[str] = Counter()
    interfered = [0]

    @tool(semantics="unsafe")
    async def pay(n: int, ctx: ToolContext) -> str:
        """Pay (unsafe: a repeat would pay twice)."""
        ran[ctx.effect_id] += 1
        await asyncio.sleep(0.01)
        return f"paid {n}"

    @tool(semantics="idempotent")
    async def reserve(n: int, ctx: ToolContext) -> str:
        """Reserve stock (idempotent)."""
        ran[ctx.effect_id] += 1
        return f"reserved {n}"

    script = _one_then_together(ToolCall("pay", {"n": 0}),
                                [ToolCall("pay", {"n": 1}), ToolCall("reserve", {"n": 2}), ToolCall("pay", {"n": 3})])

    async def scenario() -> None:
        harness = ledger.harness(Agent("busy", ScriptedModel(script), tools=[pay, reserve], max_steps=6))
        thread = await harness.create_thread()
        other = ledger.store()
        store = harness.store

        def first_another_writer(method: Any, events_of: Any) -> Any:
            def wrapped(*args: Any, **kwargs: Any) -> Any:
                if interfered[0] < 60 and events_of(*args):
                    interfered[0] += 1
                    _note(other, thread.thread_id)
                return method(*args, **kwargs)
            return wrapped

        store.append = first_another_writer(store.append, lambda stream, events, *rest: _carries(events))
        store.append_many = first_another_writer(
            store.append_many, lambda requests: any(_carries(r.events) for r in requests))
        if hasattr(store, "append_after"):  # the kernel's re-append: interfered with just the same
            store.append_after = first_another_writer(store.append_after, lambda *args: True)
        await thread.send("pay")
        state = await asyncio.wait_for(thread.wait(), 60)
        assert state.status == "idle" and state.last_reply == "done", state.reason
        events = await thread.events()
        assert interfered[0] >= 4 and any(e.type == "thread.noted" for e in events)
        assert sorted(ran.values()) == [1, 1, 1, 1], "each call ran once"
        assert {effect_id: state.effects[effect_id].state for effect_id in ran} == dict.fromkeys(ran, "completed")
        assert_lifecycle_order(events)
        assert ledger.store().verify(f"thread/{thread.thread_id}").valid

    run(scenario())


FOREIGN_WRITER = """
import sys, time
from jixu.errors import ConcurrencyError
from jixu.ledger import NewEvent, SQLiteStore
from jixu.threads.log import ThreadLog

store = SQLiteStore(sys.argv[1])
log = ThreadLog.load(store, sys.argv[2], actor="op")
end, notes = time.monotonic() + float(sys.argv[3]), 0
print("ready", flush=True)
while time.monotonic() < end:
    try:
        log.sync()
        log.append([NewEvent("thread.noted", {"note": "busy"}, log.meta("op"))])
        notes += 1
    except ConcurrencyError:
        pass
print(notes)
"""


def test_every_receipt_is_recorded_while_other_processes_append_in_tight_loops(sqlite_ledger: Ledger) -> None:
    """Two other processes append notes to the thread's stream as fast as they can while it makes twelve unsafe
    calls one after another and four at once: every call runs once and every receipt is recorded. (They start
    once the turn has: a turn's start meeting them gives up after a few tries, a documented refusal.)"""
    from tests.helpers import spawn_python

    ran: Counter[str] = Counter()
    writing = asyncio.Event()

    @tool(semantics="unsafe")
    async def pay(n: int, ctx: ToolContext) -> str:
        """Pay (unsafe)."""
        ran[ctx.effect_id] += 1
        await writing.wait()
        await asyncio.sleep(0.01)
        return f"paid {n}"

    def script(messages: list[dict[str, Any]]) -> Any:
        answered = sum(1 for m in messages if m["role"] == "tool")
        if answered < 12:
            return ToolCall("pay", {"n": answered})
        if answered < 16:
            return [ToolCall("pay", {"n": answered + i}) for i in range(4)]
        return "done"

    async def scenario() -> None:
        harness = sqlite_ledger.harness(Agent("busy", ScriptedModel(script), tools=[pay], max_steps=20))
        thread = await harness.create_thread()
        await thread.send("pay")
        writers = [spawn_python(FOREIGN_WRITER, str(sqlite_ledger.path), thread.thread_id, "30") for _ in range(2)]
        try:
            for writer in writers:
                assert writer.stdout is not None
                assert (await asyncio.to_thread(writer.stdout.readline)).strip() == "ready"
            writing.set()
            state = await asyncio.wait_for(thread.wait(), 60)
        finally:
            for writer in writers:
                writer.kill()
                writer.communicate()
        assert state.status == "idle" and state.last_reply == "done", state.reason
        events = await thread.events()
        assert sum(e.type == "thread.noted" for e in events) > 20, "the other processes did write meanwhile"
        assert len(ran) == 16 and set(ran.values()) == {1}
        assert {state.effects[effect_id].state for effect_id in ran} == {"completed"}
        assert_lifecycle_order(events)

    run(scenario())


@pytest.mark.parametrize("committed", [True, False], ids=["stored", "not-stored"])
def test_a_receipt_whose_commit_outcome_was_unknown_is_committed_again_once_the_store_answers(
        tmp_path: Any, committed: bool) -> None:
    """The database restarts under a receipt's commit: the connection breaks before the answer
    (``OutcomeUnknown``: stored or not, nobody knows) and the next try finds it unreachable. The kernel commits
    the same batch again once the store answers: one that was stored is answered as stored (same ids), one
    that was not is stored now. The call ran once and is ``completed``; before, the receipt was given up and
    the call left ``unknown`` for an operator."""
    from jixu.errors import OutcomeUnknown, StoreError
    from jixu.ledger import SQLiteStore
    from jixu.threads import Harness

    outages = [0]

    class Restarting(SQLiteStore):
        def _outage(self, carries: bool, commit: Any) -> Any:
            if carries and outages[0] < 6:  # the receipts' commits: in doubt, then unreachable, then fine
                outages[0] += 1
                if outages[0] % 2 == 1:
                    if committed:
                        commit()
                    raise OutcomeUnknown("the connection broke before this write was answered")
                raise StoreError("cannot connect: the server is restarting")
            return commit()

        def append(self, stream: str, events: Any, expected_seq: int, fence: Any = None, **kw: Any) -> Any:
            return self._outage(_carries(events),
                                lambda: super(Restarting, self).append(stream, events, expected_seq, fence, **kw))

        def append_many(self, requests: Any) -> Any:
            return self._outage(any(_carries(r.events) for r in requests),
                                lambda: super(Restarting, self).append_many(requests))

    ran: Counter[str] = Counter()

    @tool(semantics="unsafe")
    async def pay(n: int, ctx: ToolContext) -> str:
        """Pay (unsafe)."""
        ran[ctx.effect_id] += 1
        return f"paid {n}"

    script = _one_then_together(ToolCall("pay", {"n": 0}), [ToolCall("pay", {"n": 1}), ToolCall("pay", {"n": 2})])

    async def scenario() -> None:
        store = Restarting(tmp_path / "t.db")
        harness = Harness(Agent("restart", ScriptedModel(script), tools=[pay], max_steps=6), store)
        thread = await harness.create_thread()
        await thread.send("pay")
        state = await asyncio.wait_for(thread.wait(), 60)
        assert state.status == "idle" and state.last_reply == "done", state.reason
        assert outages[0] == 6 and sorted(ran.values()) == [1, 1, 1]
        assert {state.effects[effect_id].state for effect_id in ran} == {"completed"}
        assert_lifecycle_order(await thread.events())
        assert store.verify(f"thread/{thread.thread_id}").valid
        store.close()

    run(scenario())


def _carries(events: Any) -> bool:
    """Whether an append carries a receipt."""
    return any(str(getattr(e, "type", "")).endswith((".completed", ".failed")) for e in events)


def _one_then_together(first: ToolCall, together: list[ToolCall]) -> Any:
    """A model's script: ``first`` alone, then ``together`` in one response, then ``done``."""

    def script(messages: list[dict[str, Any]]) -> Any:
        answered = sum(1 for m in messages if m["role"] == "tool")
        if answered == 0:
            return first
        return list(together) if answered == 1 else "done"

    return script
