"""The agent loop and its effects, against real stores (memory and a SQLite file).

Every scenario ends with :func:`assert_same_answer`: the RecoveryResolver's
answer online, after a reopen (from the checkpoint) and after a full replay is
identical, decision by decision.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from jixu.errors import EffectNotUnknown, InvalidInput, ModelError, NotFound, ResolutionConflict, ThreadBusy
from jixu.ledger import new_id
from jixu.threads import (
    Agent,
    ModelResponse,
    ScriptedModel,
    ToolCall,
    ToolContext,
    ToolError,
    Usage,
    tool,
)
from jixu.threads.model import Step
from jixu.threads.tools import Semantics
from tests.threads.conftest import (
    Calls,
    Ledger,
    assert_lifecycle_order,
    assert_same_answer,
    effect_ids,
    event_dicts,
    lifecycle,
    of_type,
    run,
    types_of,
    wait_for,
)

Messages = list[dict[str, Any]]


def last_tool_status(messages: Messages) -> str | None:
    """The status of the newest message when it is a tool message, else None."""
    last = messages[-1]
    return str(last["status"]) if last.get("role") == "tool" else None


# --- one tool call, then a reply ---------------------------------------------------------------------


def test_a_tool_call_records_intent_then_dispatch_then_receipt_and_the_model_replies(ledger: Ledger) -> None:
    calls = Calls()

    @tool(semantics="read_only")
    def add(a: int, b: int, ctx: ToolContext) -> int:
        """Add two integers."""
        calls.record(ctx, a=a, b=b)
        return a + b

    model = ScriptedModel([ToolCall("add", {"a": 2, "b": 3}), "2 + 3 = 5"])
    harness = ledger.harness(Agent("calc", model, instructions="Use the add tool.", tools=[add]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        turn_id = await thread.send("what is 2 + 3?")
        state = await thread.wait()
        events = await thread.events()

        assert types_of(events) == [
            "thread.created", "turn.started",
            "model.requested", "model.dispatched", "model.completed",
            "tool.requested", "tool.dispatched", "tool.completed",
            "model.requested", "model.dispatched", "model.completed",
            "turn.ended",
        ]
        assert [e.seq for e in events] == list(range(1, 13))
        assert_lifecycle_order(events)
        [tool_eid] = effect_ids(events, "tool")
        model_eids = effect_ids(events, "model")
        assert len(set(model_eids)) == 2 and tool_eid not in model_eids

        requested = of_type(events, "tool.requested")[0].data
        assert requested["name"] == "add" and requested["args"] == {"a": 2, "b": 3}
        assert requested["semantics"] == "read_only" and requested["turn_id"] == turn_id
        assert requested["idempotency_key"] == f"jixu:{tool_eid}"
        dispatched = of_type(events, "tool.dispatched")[0].data
        assert dispatched["attempt"] == 1 and dispatched["idempotency_key"] == f"jixu:{tool_eid}"
        assert of_type(events, "tool.completed")[0].data == {"effect_id": tool_eid, "attempt": 1, "result": 5}

        # The tool saw its durable identity.
        [ctx] = calls.contexts
        assert ctx == ToolContext(effect_id=tool_eid, idempotency_key=f"jixu:{tool_eid}", attempt=1,
                                  thread_id=thread.thread_id, turn_id=turn_id)
        assert calls.args == [{"a": 2, "b": 3}]

        # The model saw each call's identity, the tools and the conversation so far.
        first, second = model.calls
        assert (first.effect_id, first.attempt, first.idempotency_key) == (model_eids[0], 1, f"jixu:{model_eids[0]}")
        assert (first.thread_id, first.turn_id) == (thread.thread_id, turn_id)
        assert first.instructions == "Use the add tool."
        assert [t["name"] for t in first.tools] == ["add"]
        assert first.messages == ({"role": "user", "content": "what is 2 + 3?"},)
        assert second.effect_id == model_eids[1] and len(second.messages) == 3

        call_id = f"call_{model_eids[0]}_0"
        assert state.status == "idle" and state.reason == ""
        assert state.last_reply == "2 + 3 = 5"
        assert list(state.messages) == [
            {"role": "user", "content": "what is 2 + 3?"},
            {"role": "assistant", "content": None,
             "tool_calls": [{"id": call_id, "name": "add", "args": {"a": 2, "b": 3}}]},
            {"role": "tool", "tool_call_id": call_id, "name": "add", "content": "5", "status": "ok"},
            {"role": "assistant", "content": "2 + 3 = 5", "tool_calls": []},
        ]
        assert state.turns[-1]["status"] == "completed" and state.turns[-1]["reply"] == "2 + 3 = 5"
        assert state.waiting_on == ()
        decision = state.effects[tool_eid]
        assert (decision.state, decision.reason, decision.attempts) == ("completed", "succeeded", 1)
        assert all(d.state == "completed" for d in state.effects.values())
        assert state.usage["model_calls"] == 2 and state.usage["tool_calls"] == 1
        assert state.seq == 12 and state.head_hash == events[-1].hash
        await assert_same_answer(harness, thread)

    run(scenario())


def test_usage_counts_model_calls_tool_calls_tokens_and_cost(ledger: Ledger) -> None:
    @tool(semantics="read_only")
    def ping() -> str:
        return "pong"

    usage = Usage(input_tokens=100, output_tokens=20, cached_tokens=7, cost=0.25)
    steps: list[Step] = [
        ModelResponse(tool_calls=(ToolCall("ping"), ToolCall("ping")), usage=usage),
        ModelResponse(tool_calls=(ToolCall("ping"),), usage=usage),
        ModelResponse(text="done", usage=usage),
    ]
    harness = ledger.harness(Agent("pinger", ScriptedModel(steps), tools=[ping]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("ping thrice")
        state = await thread.wait()
        assert state.usage == {"input_tokens": 300, "output_tokens": 60, "cached_tokens": 21, "cost": 0.75,
                               "model_calls": 3, "tool_calls": 3}
        await assert_same_answer(harness, thread)

    run(scenario())


# --- parallel tool calls ----------------------------------------------------------------------------


def test_parallel_tool_calls_both_run_and_a_slow_one_does_not_hold_back_the_fast_receipt(
        ledger: Ledger) -> None:
    gate: dict[str, asyncio.Event] = {}
    order: list[str] = []

    @tool(semantics="read_only")
    async def slow() -> str:
        order.append("slow started")
        await asyncio.wait_for(gate["fast_done"].wait(), 5)
        await asyncio.sleep(0.01)
        order.append("slow done")
        return "slow result"

    @tool(semantics="read_only")
    async def fast() -> str:
        order.append("fast started")
        gate["fast_done"].set()
        return "fast result"

    def script(messages: Messages) -> Step:
        if messages[-1]["role"] == "user":
            return [ToolCall("slow"), ToolCall("fast")]
        tool_messages = {m["name"]: m["content"] for m in messages if m["role"] == "tool"}
        return f"{tool_messages['slow']} + {tool_messages['fast']}"

    harness = ledger.harness(Agent("parallel", ScriptedModel(script), tools=[slow, fast]))

    async def scenario() -> None:
        gate["fast_done"] = asyncio.Event()
        thread = await harness.create_thread()
        await thread.send("run both")
        state = await thread.wait()
        events = await thread.events()
        assert_lifecycle_order(events)
        slow_eid, fast_eid = effect_ids(events, "tool")
        requested = of_type(events, "tool.requested")
        assert requested[0].seq + 1 == requested[1].seq  # one batch of intents
        slow_done = lifecycle(events, slow_eid)[-1]
        fast_done = lifecycle(events, fast_eid)[-1]
        assert slow_done.type == fast_done.type == "tool.completed"
        assert fast_done.seq < slow_done.seq
        dispatches = [e.seq for e in of_type(events, "tool.dispatched")]
        assert max(dispatches) < fast_done.seq  # both were in flight together
        assert order == ["slow started", "fast started", "slow done"]
        assert state.status == "idle" and state.last_reply == "slow result + fast result"
        tool_messages = [m for m in state.messages if m["role"] == "tool"]
        assert [m["name"] for m in tool_messages] == ["fast", "slow"]  # in receipt order
        assert state.usage["tool_calls"] == 2
        await assert_same_answer(harness, thread)

    run(scenario())


# --- tool failures ----------------------------------------------------------------------------------


def test_a_tool_error_is_a_determinate_failure_fed_back_to_the_model(ledger: Ledger) -> None:
    @tool
    def refund(order: int) -> str:
        raise ToolError("order already refunded", code="already_refunded", data={"order": order})

    def script(messages: Messages) -> Step:
        status = last_tool_status(messages)
        if status is None:
            return ToolCall("refund", {"order": 42})
        return f"refund failed ({status}): {json.loads(messages[-1]['content'])['error']['code']}"

    harness = ledger.harness(Agent("refunds", ScriptedModel(script), tools=[refund]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("refund 42")
        state = await thread.wait()
        events = await thread.events()
        assert_lifecycle_order(events)
        [eid] = effect_ids(events)
        [failed] = of_type(events, "tool.failed")
        error = {"type": "tool_error", "code": "already_refunded", "message": "order already refunded",
                 "data": {"order": 42}}
        assert failed.data == {"effect_id": eid, "attempt": 1, "indeterminate": False, "error": error}
        tool_message = next(m for m in state.messages if m["role"] == "tool")
        assert tool_message["status"] == "error"
        assert json.loads(tool_message["content"]) == {"error": error}
        assert state.status == "idle" and state.last_reply == "refund failed (error): already_refunded"
        decision = state.effects[eid]
        assert (decision.state, decision.reason, decision.retry_safe) == ("completed", "failed", False)
        assert state.usage["tool_calls"] == 1
        await assert_same_answer(harness, thread)

    run(scenario())


def test_an_exception_after_dispatch_of_an_unsafe_tool_leaves_the_thread_waiting(ledger: Ledger) -> None:
    attempts: list[int] = []

    @tool
    def charge(amount: int, ctx: ToolContext) -> str:
        attempts.append(ctx.attempt)
        raise ConnectionResetError("the payment provider hung up")

    harness = ledger.harness(Agent("payments", ScriptedModel([ToolCall("charge", {"amount": 5}), "charged"]),
                                   tools=[charge]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("charge 5")
        state = await thread.wait()
        events = await thread.events()
        assert_lifecycle_order(events)
        [eid] = effect_ids(events)
        [failed] = of_type(events, "tool.failed")
        assert failed.data["indeterminate"] is True and failed.data["attempt"] == 1
        assert failed.data["error"] == {"type": "exception", "exception": "ConnectionResetError",
                                        "message": "the payment provider hung up"}
        assert attempts == [1]  # never retried
        assert state.status == "waiting" and eid in state.reason
        decision = state.effects[eid]
        assert (decision.state, decision.reason, decision.retry_safe) == ("unknown", "indeterminate_failure", False)
        assert state.waiting_on == ({"effect_id": eid, "kind": "tool", "name": "charge", "state": "unknown",
                                     "reason": "indeterminate_failure"},)
        assert state.analysis.requires_resolution == (eid,)
        assert not any(m["role"] == "tool" for m in state.messages)  # the model is told nothing yet
        assert state.turns[-1]["status"] == "running"

        before = event_dicts(await thread.events())
        with pytest.raises(ThreadBusy):
            await thread.send("try again")
        assert event_dicts(await thread.events()) == before
        await assert_same_answer(harness, thread)

    run(scenario())


def test_send_while_waiting_for_a_resolution_says_what_to_do(ledger: Ledger) -> None:
    @tool
    def charge(amount: int) -> str:
        raise ConnectionResetError("hung up")

    harness = ledger.harness(Agent("payments", ScriptedModel([ToolCall("charge", {"amount": 5}), "charged"]),
                                   tools=[charge]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("charge 5")
        assert (await thread.wait()).status == "waiting"
        with pytest.raises(ThreadBusy, match=r"(?i)resolve"):
            await thread.send("try again")

    run(scenario())


@pytest.mark.parametrize("semantics", ["idempotent", "read_only"])
def test_a_retry_safe_tool_is_retried_under_the_same_effect_id_and_key(ledger: Ledger,
                                                                        semantics: Semantics) -> None:
    calls = Calls()

    @tool(semantics=semantics)
    def reserve(seat: str, ctx: ToolContext) -> str:
        calls.record(ctx, seat=seat)
        if ctx.attempt == 1:
            raise TimeoutError("read timed out")
        return f"reserved {seat}"

    harness = ledger.harness(Agent("seats", ScriptedModel([ToolCall("reserve", {"seat": "12A"}), "booked"]),
                                   tools=[reserve]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("book 12A")
        state = await thread.wait()
        events = await thread.events()
        assert_lifecycle_order(events)
        [eid] = effect_ids(events)
        assert [c.effect_id for c in calls.contexts] == [eid, eid]
        assert [c.idempotency_key for c in calls.contexts] == [f"jixu:{eid}"] * 2
        assert [c.attempt for c in calls.contexts] == [1, 2]
        assert [e.type for e in lifecycle(events, eid)] == [
            "tool.requested", "tool.dispatched", "tool.failed", "tool.dispatched", "tool.completed"]
        assert [e.data["attempt"] for e in of_type(events, "tool.dispatched")] == [1, 2]
        assert of_type(events, "tool.failed")[0].data["indeterminate"] is True
        assert state.status == "idle" and state.last_reply == "booked"
        decision = state.effects[eid]
        assert (decision.state, decision.reason, decision.attempts) == ("completed", "succeeded", 2)
        assert [m["content"] for m in state.messages if m["role"] == "tool"] == ["reserved 12A"]
        await assert_same_answer(harness, thread)

    run(scenario())


def test_an_idempotent_tool_that_keeps_failing_waits_after_max_attempts(ledger: Ledger) -> None:
    calls = Calls()

    @tool(semantics="idempotent")
    def sync_inventory(ctx: ToolContext) -> str:
        calls.record(ctx)
        raise OSError("connection refused")

    harness = ledger.harness(Agent("inventory", ScriptedModel([ToolCall("sync_inventory"), "synced"]),
                                   tools=[sync_inventory]), max_attempts=3)

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("sync")
        state = await thread.wait()
        events = await thread.events()
        assert_lifecycle_order(events)
        [eid] = effect_ids(events)
        assert [c.attempt for c in calls.contexts] == [1, 2, 3]
        assert {c.effect_id for c in calls.contexts} == {eid}
        assert len(of_type(events, "tool.failed")) == 3
        assert state.status == "waiting" and eid in state.reason
        decision = state.effects[eid]
        assert (decision.state, decision.attempts, decision.retry_safe) == ("unknown", 3, True)
        await assert_same_answer(harness, thread)

    run(scenario())


def test_an_exhausted_idempotent_effect_is_listed_in_waiting_on(ledger: Ledger) -> None:
    @tool(semantics="idempotent")
    def sync_inventory() -> str:
        raise OSError("connection refused")

    harness = ledger.harness(Agent("inventory", ScriptedModel([ToolCall("sync_inventory"), "synced"]),
                                   tools=[sync_inventory]), max_attempts=2)

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("sync")
        state = await thread.wait()
        [eid] = effect_ids(await thread.events())
        assert state.status == "waiting"
        assert [w["effect_id"] for w in state.waiting_on] == [eid]

    run(scenario())


def test_reopening_with_a_higher_max_attempts_retries_the_same_effect(ledger: Ledger) -> None:
    calls = Calls()

    @tool(semantics="idempotent")
    def sync_inventory(ctx: ToolContext) -> str:
        calls.record(ctx)
        if ctx.attempt < 3:
            raise OSError("connection refused")
        return "synced"

    agent = Agent("inventory", ScriptedModel([ToolCall("sync_inventory"), "all synced"]), tools=[sync_inventory])
    first = ledger.harness(agent, max_attempts=2)
    second = ledger.harness(agent, max_attempts=5)

    async def scenario() -> None:
        thread = await first.create_thread()
        await thread.send("sync")
        assert (await thread.wait()).status == "waiting"
        reopened = await second.open_thread(thread.thread_id)
        state = await reopened.wait()
        [eid] = effect_ids(await reopened.events())
        assert [(c.effect_id, c.idempotency_key, c.attempt) for c in calls.contexts] == [
            (eid, f"jixu:{eid}", 1), (eid, f"jixu:{eid}", 2), (eid, f"jixu:{eid}", 3)]
        assert state.status == "idle" and state.last_reply == "all synced"
        await assert_same_answer(second, reopened)

    run(scenario())


def test_a_tool_timeout_is_an_indeterminate_failure(ledger: Ledger) -> None:
    @tool(timeout=0.05)
    async def provision(size: str) -> str:
        await asyncio.sleep(30)
        return "never"

    harness = ledger.harness(Agent("infra", ScriptedModel([ToolCall("provision", {"size": "xl"}), "ok"]),
                                   tools=[provision]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("provision")
        state = await asyncio.wait_for(thread.wait(), 10)
        events = await thread.events()
        assert_lifecycle_order(events)
        [eid] = effect_ids(events)
        [failed] = of_type(events, "tool.failed")
        assert failed.data["indeterminate"] is True
        assert failed.data["error"]["type"] == "timeout"
        assert state.status == "waiting"
        assert state.effects[eid].state == "unknown"
        assert [w["effect_id"] for w in state.waiting_on] == [eid]
        await assert_same_answer(harness, thread)

    run(scenario())


@pytest.mark.parametrize(("call", "error_type"), [
    (ToolCall("add", {"a": "two", "b": 3}), "invalid_arguments"),
    (ToolCall("add", {"a": 2}), "invalid_arguments"),
    (ToolCall("add", {"a": 2, "b": 3, "c": 4}), "invalid_arguments"),
    (ToolCall("subtract", {"a": 2, "b": 3}), "unknown_tool"),
], ids=["wrong-type", "missing-arg", "extra-arg", "unknown-tool"])
def test_a_bad_tool_call_is_rejected_before_dispatch_and_fed_back(ledger: Ledger, call: ToolCall,
                                                                 error_type: str) -> None:
    calls = Calls()

    @tool(semantics="read_only")
    def add(a: int, b: int, ctx: ToolContext) -> int:
        calls.record(ctx, a=a, b=b)
        return a + b

    def script(messages: Messages) -> Step:
        if last_tool_status(messages) is None:
            return call
        error = json.loads(messages[-1]["content"])["error"]
        return f"{messages[-1]['status']}: {error['type']}"

    harness = ledger.harness(Agent("calc", ScriptedModel(script), tools=[add]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("add")
        state = await thread.wait()
        events = await thread.events()
        assert_lifecycle_order(events)
        [eid] = effect_ids(events)
        assert [e.type for e in lifecycle(events, eid)] == ["tool.requested", "tool.failed"]
        assert of_type(events, "tool.dispatched") == []
        [failed] = of_type(events, "tool.failed")
        assert failed.data["indeterminate"] is False and "attempt" not in failed.data
        assert failed.data["error"]["type"] == error_type
        assert len(calls) == 0
        decision = state.effects[eid]
        assert (decision.state, decision.reason, decision.attempts) == ("completed", "rejected_before_dispatch", 0)
        assert state.status == "idle" and state.last_reply == f"error: {error_type}"
        await assert_same_answer(harness, thread)

    run(scenario())


# --- approvals --------------------------------------------------------------------------------------


def _approval_agent(calls: Calls) -> Agent:
    @tool(requires_approval=True)
    def wire(amount: int, ctx: ToolContext) -> str:
        calls.record(ctx, amount=amount)
        return f"wired {amount}"

    def script(messages: Messages) -> Step:
        status = last_tool_status(messages)
        if status is None:
            return ToolCall("wire", {"amount": 100})
        return f"{status}: {messages[-1]['content']}"

    return Agent("treasury", ScriptedModel(script), tools=[wire])


def test_a_call_that_requires_approval_is_parked_then_dispatched_when_approved(ledger: Ledger) -> None:
    calls = Calls()
    harness = ledger.harness(_approval_agent(calls))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("wire 100")
        state = await thread.wait()
        events = await thread.events()
        [eid] = effect_ids(events)
        assert [e.type for e in lifecycle(events, eid)] == ["tool.requested", "tool.parked"]
        assert of_type(events, "tool.requested")[0].data["requires_approval"] is True
        assert state.status == "waiting"
        assert state.effects[eid].state == "parked"
        assert [w["effect_id"] for w in state.waiting_on] == [eid]
        assert state.analysis.waiting_on_parked == (eid,)
        assert len(calls) == 0
        await assert_same_answer(harness, thread)

        await thread.approve(eid, actor="alice", note="within limits")
        state = await thread.wait()
        events = await thread.events()
        assert_lifecycle_order(events)
        assert [e.type for e in lifecycle(events, eid)] == [
            "tool.requested", "tool.parked", "tool.approved", "tool.dispatched", "tool.completed"]
        [approved] = of_type(events, "tool.approved")
        assert approved.data == {"effect_id": eid, "actor": "alice", "note": "within limits"}
        assert approved.meta["actor"] == "alice"
        assert [c.effect_id for c in calls.contexts] == [eid]
        assert state.status == "idle" and state.last_reply == "ok: wired 100"
        assert state.effects[eid].reason == "succeeded"
        await assert_same_answer(harness, thread)

    run(scenario())


def test_a_denied_call_is_never_dispatched_and_the_model_is_told(ledger: Ledger) -> None:
    calls = Calls()
    harness = ledger.harness(_approval_agent(calls))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("wire 100")
        await thread.wait()
        [eid] = effect_ids(await thread.events())
        await thread.deny(eid, note="not today")
        state = await thread.wait()
        events = await thread.events()
        assert [e.type for e in lifecycle(events, eid)] == ["tool.requested", "tool.parked", "tool.denied"]
        assert of_type(events, "tool.dispatched") == []
        assert len(calls) == 0
        tool_message = next(m for m in state.messages if m["role"] == "tool")
        assert tool_message["status"] == "denied" and "not today" in tool_message["content"]
        assert state.status == "idle" and state.last_reply is not None
        assert state.last_reply.startswith("denied: An operator denied this call.")
        assert (state.effects[eid].state, state.effects[eid].reason) == ("completed", "denied")
        await assert_same_answer(harness, thread)

    run(scenario())


def test_an_approval_survives_a_reopen_on_a_new_harness(durable_ledger: Ledger) -> None:
    calls = Calls()
    agent = _approval_agent(calls)
    first = durable_ledger.harness(agent)

    async def scenario() -> None:
        thread = await first.create_thread()
        await thread.send("wire 100")
        assert (await thread.wait()).status == "waiting"
        [eid] = effect_ids(await thread.events())
        first.close()

        second = durable_ledger.harness(agent)
        reopened = await second.open_thread(thread.thread_id)
        assert reopened.checkpoint_status == "used"
        state = reopened.state()
        assert state.status == "waiting" and [w["effect_id"] for w in state.waiting_on] == [eid]
        await reopened.approve(eid)
        state = await reopened.wait()
        assert [c.effect_id for c in calls.contexts] == [eid]
        assert state.status == "idle" and state.last_reply == "ok: wired 100"
        await assert_same_answer(second, reopened)

    run(scenario())


# --- outcome resolution -----------------------------------------------------------------------------


class Payments:
    """An unsafe ``charge`` tool whose first ``failures`` calls die after dispatch, and a model around it."""

    def __init__(self, failures: int = 1) -> None:
        self.calls = Calls()
        self.failures = failures

        @tool
        def charge(amount: int, ctx: ToolContext) -> dict[str, Any]:
            self.calls.record(ctx, amount=amount)
            if len(self.calls) <= self.failures:
                raise ConnectionResetError("the payment provider hung up")
            return {"charge_id": f"ch_{len(self.calls)}", "amount": amount}

        self.tool = charge
        self.model = ScriptedModel(self.script)

    @staticmethod
    def script(messages: Messages) -> Step:
        status = last_tool_status(messages)
        if status is None:
            return ToolCall("charge", {"amount": 5})
        if status == "not_occurred":
            return ToolCall("charge", {"amount": 5})
        return f"{status}: {messages[-1]['content']}"

    def agent(self) -> Agent:
        return Agent("payments", self.model, tools=[self.tool])


async def _unknown_charge(ledger: Ledger, payments: Payments) -> tuple[Any, Any, str]:
    harness = ledger.harness(payments.agent())
    thread = await harness.create_thread()
    await thread.send("charge 5")
    state = await thread.wait()
    assert state.status == "waiting"
    [eid] = effect_ids(await thread.events())
    return harness, thread, eid


def test_resolving_not_occurred_lets_the_model_make_a_new_call_under_a_new_effect_id(ledger: Ledger) -> None:
    payments = Payments(failures=1)

    async def scenario() -> None:
        harness, thread, eid = await _unknown_charge(ledger, payments)
        original = event_dicts(await thread.events())
        state = await thread.resolve_tool_outcome(eid, "not_occurred", resolution_id="res-1", actor="bob",
                                                  note="no charge in the PSP dashboard",
                                                  evidence={"dashboard": "https://psp.example/ch?q=5"})
        state = await thread.wait()
        events = await thread.events()
        assert event_dicts(events)[:len(original)] == original  # the original events are untouched
        assert_lifecycle_order(events)
        first, second = effect_ids(events)
        assert first == eid and second != eid
        assert [(c.effect_id, c.idempotency_key, c.attempt) for c in payments.calls.contexts] == [
            (eid, f"jixu:{eid}", 1), (second, f"jixu:{second}", 1)]
        [resolved] = of_type(events, "tool.outcome_resolved")
        assert resolved.data == {"effect_id": eid, "resolution": "not_occurred", "resolution_id": "res-1",
                                 "actor": "bob", "note": "no charge in the PSP dashboard",
                                 "evidence": {"dashboard": "https://psp.example/ch?q=5"}}
        assert resolved.meta["actor"] == "bob"
        statuses = [m["status"] for m in state.messages if m["role"] == "tool"]
        assert statuses == ["not_occurred", "ok"]
        decision = state.effects[eid]
        assert (decision.state, decision.reason, decision.retry_safe) == ("unknown", "resolved_by_operator", False)
        assert decision.resolution is not None and decision.resolution["resolution"] == "not_occurred"
        assert state.effects[second].state == "completed"
        assert state.status == "idle" and state.last_reply is not None and "ch_2" in state.last_reply
        await assert_same_answer(harness, thread)

    run(scenario())


def test_resolving_occurred_with_a_result_gives_the_model_that_result(ledger: Ledger) -> None:
    payments = Payments(failures=1)

    async def scenario() -> None:
        harness, thread, eid = await _unknown_charge(ledger, payments)
        original = event_dicts(await thread.events())
        await thread.resolve_tool_outcome(eid, "occurred", result={"charge_id": "ch_seen_by_ops"})
        state = await thread.wait()
        events = await thread.events()
        assert event_dicts(events)[:len(original)] == original
        assert len(payments.calls) == 1 and effect_ids(events) == [eid]
        tool_message = next(m for m in state.messages if m["role"] == "tool")
        assert tool_message["status"] == "occurred"
        assert json.loads(tool_message["content"])["result"] == {"charge_id": "ch_seen_by_ops"}
        assert state.status == "idle" and state.last_reply is not None
        assert state.last_reply.startswith("occurred:") and "ch_seen_by_ops" in state.last_reply
        assert state.effects[eid].resolution is not None
        assert state.effects[eid].resolution["result"] == {"charge_id": "ch_seen_by_ops"}
        await assert_same_answer(harness, thread)

    run(scenario())


def test_resolving_abandoned_unknown_tells_the_model_the_outcome_is_unknown(ledger: Ledger) -> None:
    payments = Payments(failures=1)

    async def scenario() -> None:
        harness, thread, eid = await _unknown_charge(ledger, payments)
        await thread.resolve_tool_outcome(eid, "abandoned_unknown", note="provider unreachable")
        state = await thread.wait()
        assert len(payments.calls) == 1
        tool_message = next(m for m in state.messages if m["role"] == "tool")
        assert tool_message["status"] == "abandoned_unknown" and "unknown" in tool_message["content"]
        assert state.status == "idle" and state.last_reply is not None
        assert state.last_reply.startswith("abandoned_unknown:")
        await assert_same_answer(harness, thread)

    run(scenario())


def test_with_two_unknown_effects_the_thread_waits_until_each_has_a_decision(ledger: Ledger) -> None:
    charged: list[int] = []

    @tool
    def charge(amount: int) -> str:
        charged.append(amount)
        raise ConnectionResetError("hung up")

    def script(messages: Messages) -> Step:
        if messages[-1]["role"] == "user":
            return [ToolCall("charge", {"amount": 1}), ToolCall("charge", {"amount": 2})]
        return " / ".join(sorted(m["status"] for m in messages if m["role"] == "tool"))

    model = ScriptedModel(script)
    harness = ledger.harness(Agent("payments", model, tools=[charge]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("charge both")
        state = await thread.wait()
        one, two = effect_ids(await thread.events())
        assert state.status == "waiting"
        assert sorted(w["effect_id"] for w in state.waiting_on) == sorted([one, two])
        assert sorted(charged) == [1, 2]
        model_calls = len(model.calls)

        await thread.resolve_tool_outcome(one, "occurred", resolution_id="r-one")
        state = await thread.wait()
        assert state.status == "waiting" and [w["effect_id"] for w in state.waiting_on] == [two]
        assert len(model.calls) == model_calls  # the model is not asked while any decision is missing
        await assert_same_answer(harness, thread)

        with pytest.raises(ResolutionConflict):  # a resolution id names one decision only
            await thread.resolve_tool_outcome(two, "occurred", resolution_id="r-one")

        await thread.resolve_tool_outcome(two, "not_occurred", resolution_id="r-two")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "not_occurred / occurred"
        assert sorted(charged) == [1, 2]
        await assert_same_answer(harness, thread)

    run(scenario())


def test_resolution_is_idempotent_on_its_id_and_cannot_be_changed(ledger: Ledger) -> None:
    payments = Payments(failures=2)

    async def scenario() -> None:
        harness, thread, eid = await _unknown_charge(ledger, payments)
        original = event_dicts(await thread.events())
        await thread.resolve_tool_outcome(eid, "not_occurred", resolution_id="res-1", note="checked")
        await thread.wait()
        settled = event_dicts(await thread.events())
        assert settled[:len(original)] == original

        # The same id and body: accepted, nothing new recorded.
        await thread.resolve_tool_outcome(eid, "not_occurred", resolution_id="res-1", note="checked")
        await thread.wait()
        assert event_dicts(await thread.events()) == settled
        # The same id with another body, or a second decision under a new id: refused.
        for kwargs in ({"resolution": "not_occurred", "resolution_id": "res-1", "note": "changed"},
                       {"resolution": "occurred", "resolution_id": "res-1", "note": "checked"},
                       {"resolution": "not_occurred", "resolution_id": "res-2", "note": "checked"},
                       {"resolution": "abandoned_unknown", "resolution_id": "res-3"}):
            with pytest.raises(ResolutionConflict):
                await thread.resolve_tool_outcome(eid, **kwargs)
        assert event_dicts(await thread.events()) == settled
        await assert_same_answer(harness, thread)

    run(scenario())


def test_only_an_unknown_effect_of_the_thread_can_be_resolved(ledger: Ledger) -> None:
    payments = Payments(failures=0)
    harness = ledger.harness(payments.agent())

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("charge 5")
        state = await thread.wait()
        assert state.status == "idle"
        events = event_dicts(await thread.events())
        [tool_eid] = effect_ids(await thread.events())
        model_eid = effect_ids(await thread.events(), "model")[0]
        for completed in (tool_eid, model_eid):
            with pytest.raises(EffectNotUnknown) as caught:
                await thread.resolve_tool_outcome(completed, "occurred")
            assert caught.value.details["state"] == "completed"
        with pytest.raises(NotFound):
            await thread.resolve_tool_outcome(new_id(), "occurred")
        assert event_dicts(await thread.events()) == events
        await assert_same_answer(harness, thread)

    run(scenario())


# --- model failures ---------------------------------------------------------------------------------


def test_an_indeterminate_model_failure_is_retried_under_the_same_effect_id(ledger: Ledger) -> None:
    failures = [0]

    def script(messages: Messages) -> Step:
        if failures[0] < 2:
            failures[0] += 1
            raise ModelError("rate limited", kind="rate_limited", indeterminate=True)
        return "hello"

    model = ScriptedModel(script)
    harness = ledger.harness(Agent("greeter", model), retry_backoff=0.01)

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("hi")
        state = await thread.wait()
        events = await thread.events()
        assert_lifecycle_order(events)
        [eid] = effect_ids(events, "model")
        # Each indeterminate failure pauses the turn for a recorded delay, then retries the same call.
        pauses = of_type(events, "turn.paused")
        assert [(p.data["reason"], p.data["automatic"], p.data["model_effect_id"]) for p in pauses] == [
            ("transient", True, eid)] * 2
        assert all(0 < p.data["delay"] < 1 for p in pauses)
        assert [e.data["reason"] for e in of_type(events, "turn.resumed")] == ["automatic", "automatic"]
        assert [(r.effect_id, r.idempotency_key, r.attempt) for r in model.calls] == [
            (eid, f"jixu:{eid}", 1), (eid, f"jixu:{eid}", 2), (eid, f"jixu:{eid}", 3)]
        assert [e.type for e in lifecycle(events, eid)] == [
            "model.requested", "model.dispatched", "model.failed", "model.dispatched", "model.failed",
            "model.dispatched", "model.completed"]
        assert all(e.data["indeterminate"] is True for e in of_type(events, "model.failed"))
        assert of_type(events, "model.failed")[0].data["error"]["kind"] == "rate_limited"
        assert state.status == "idle" and state.last_reply == "hello"
        assert state.usage["model_calls"] == 1
        await assert_same_answer(harness, thread)

    run(scenario())


def test_a_determinate_model_failure_fails_the_turn(ledger: Ledger) -> None:
    broken = [True]

    def script(messages: Messages) -> Step:
        if broken[0]:
            raise ModelError("context too long", kind="invalid_request", indeterminate=False)
        return "better now"

    model = ScriptedModel(script)
    harness = ledger.harness(Agent("greeter", model))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("hi")
        state = await thread.wait()
        events = await thread.events()
        [failed] = of_type(events, "model.failed")
        assert failed.data["indeterminate"] is False
        assert len(model.calls) == 1  # not retried
        [ended] = of_type(events, "turn.ended")
        assert ended.data["outcome"] == "failed"
        assert ended.data["error"]["source"] == "model" and ended.data["error"]["kind"] == "invalid_request"
        assert state.status == "failed"
        assert "(invalid_request)" in state.reason and "context too long" in state.reason, state.reason
        assert state.turns[-1]["status"] == "failed"
        assert state.turns[-1]["error"] == ended.data["error"]
        assert state.last_reply is None
        await assert_same_answer(harness, thread)

        # A failed turn does not block the next one.
        broken[0] = False
        await thread.send("again")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "better now"
        await assert_same_answer(harness, thread)

    run(scenario())


def test_a_model_that_keeps_raising_pauses_after_three_automatic_retries(ledger: Ledger) -> None:
    healthy = [False]

    def script(messages: Messages) -> Step:
        if not healthy[0]:
            raise RuntimeError("socket closed")
        return "back"

    model = ScriptedModel(script)
    harness = ledger.harness(Agent("greeter", model), retry_backoff=0.01)

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("hi")
        state = await thread.wait()
        events = await thread.events()
        [eid] = effect_ids(events, "model")
        assert [r.attempt for r in model.calls] == [1, 2, 3, 4], "one call and three automatic retries"
        failed = of_type(events, "model.failed")
        assert len(failed) == 4 and all(e.data["indeterminate"] for e in failed)
        assert failed[0].data["error"] == {"type": "exception", "exception": "RuntimeError",
                                           "message": "socket closed", "kind": "transient"}
        assert [p.data["automatic"] for p in of_type(events, "turn.paused")] == [True, True, True, False]
        assert state.status == "paused" and "resume it explicitly" in state.reason
        assert state.effects[eid].state == "unknown" and state.effects[eid].attempts == 4
        await assert_same_answer(harness, thread)
        with pytest.raises(ThreadBusy):
            await thread.send("anyone there?")
        # An explicit resume retries the same call once more, with a fresh automatic budget.
        healthy[0] = True
        await thread.resume(actor="ops", note="provider is back")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "back"
        assert [r.attempt for r in model.calls] == [1, 2, 3, 4, 5]
        await assert_same_answer(harness, thread)

    run(scenario())


def test_max_steps_fails_a_turn_that_keeps_calling_tools(ledger: Ledger) -> None:
    @tool(semantics="read_only")
    def look() -> str:
        return "more to see"

    harness = ledger.harness(Agent("looker", ScriptedModel(lambda messages: ToolCall("look")), tools=[look],
                                   max_steps=2))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("look around")
        state = await thread.wait()
        events = await thread.events()
        assert len(of_type(events, "model.requested")) == 2
        assert len(of_type(events, "tool.completed")) == 2
        [ended] = of_type(events, "turn.ended")
        assert ended.data["outcome"] == "failed" and ended.data["error"]["type"] == "max_steps"
        assert state.status == "failed" and state.turns[-1]["error"]["type"] == "max_steps"
        assert "(max_steps)" in state.reason and "used all 2 model calls" in state.reason, state.reason
        assert state.turns[-1]["model_calls"] == 2
        await assert_same_answer(harness, thread)

    run(scenario())


# --- interrupt --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("semantics", "status"), [("unsafe", "waiting"), ("read_only", "idle")])
def test_interrupt_records_the_call_in_flight_as_unknown(ledger: Ledger, semantics: Semantics,
                                                         status: str) -> None:
    started: list[str] = []

    @tool(semantics=semantics)
    async def deploy(ctx: ToolContext) -> str:
        started.append(ctx.effect_id)
        await asyncio.sleep(30)
        return "deployed"

    harness = ledger.harness(Agent("deployer", ScriptedModel([ToolCall("deploy"), "deployed"]), tools=[deploy]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        turn_id = await thread.send("deploy")
        await wait_for(lambda: bool(started))
        assert thread.running
        state = await thread.interrupt("operator pressed stop")
        assert not thread.running
        events = await thread.events()
        assert_lifecycle_order(events)
        [eid] = effect_ids(events)
        assert started == [eid]
        assert [e.type for e in lifecycle(events, eid)] == ["tool.requested", "tool.dispatched", "tool.failed"]
        [failed] = of_type(events, "tool.failed")
        assert failed.data["indeterminate"] is True and failed.data["error"]["type"] == "interrupted"
        assert events[-1].type == "turn.ended"
        assert events[-1].data == {"turn_id": turn_id, "outcome": "interrupted", "reason": "operator pressed stop"}
        assert state.turns[-1]["status"] == "interrupted"
        assert state.effects[eid].state == "unknown"
        assert state.status == status
        if semantics == "unsafe":
            assert [w["effect_id"] for w in state.waiting_on] == [eid]
        else:
            assert state.waiting_on == ()
        await assert_same_answer(harness, thread)

    run(scenario())


def test_interrupt_during_a_model_call_ends_the_turn(ledger: Ledger) -> None:
    entered: list[int] = []

    async def script(messages: Messages) -> Step:
        entered.append(len(messages))
        await asyncio.sleep(30)
        return "too late"

    harness = ledger.harness(Agent("thinker", ScriptedModel(script)))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("think")
        await wait_for(lambda: bool(entered))
        state = await thread.interrupt()
        events = await thread.events()
        [eid] = effect_ids(events, "model")
        assert [e.type for e in lifecycle(events, eid)] == ["model.requested", "model.dispatched", "model.failed"]
        assert of_type(events, "model.failed")[0].data["error"] == {"type": "interrupted"}
        assert state.turns[-1]["status"] == "interrupted" and state.status == "idle"
        # Nothing to interrupt: nothing is written.
        before = event_dicts(await thread.events())
        await thread.interrupt()
        assert event_dicts(await thread.events()) == before
        await assert_same_answer(harness, thread)

    run(scenario())


# --- reopen ------------------------------------------------------------------------------------------


def test_a_finished_thread_reopens_from_its_checkpoint_and_continues_the_script(ledger: Ledger) -> None:
    @tool(semantics="read_only")
    def lookup(key: str) -> str:
        return key.upper()

    def agent() -> Agent:
        return Agent("lookup", ScriptedModel([ToolCall("lookup", {"key": "a"}), "first",
                                              ToolCall("lookup", {"key": "b"}), "second"]), tools=[lookup])

    first = ledger.harness(agent())

    async def scenario() -> None:
        thread = await first.create_thread(metadata={"customer": 7})
        await thread.send("one")
        await thread.wait()
        second = ledger.harness(agent())  # a new process: new harness, new model, same definition
        reopened = await second.open_thread(thread.thread_id)
        assert reopened.checkpoint_status == "used"
        assert reopened.state().to_dict() == thread.state().to_dict()
        await reopened.send("two")
        state = await reopened.wait()
        assert state.last_reply == "second" and len(state.turns) == 2
        assert [m["content"] for m in state.messages if m["role"] == "tool"] == ["A", "B"]
        assert (await thread.refresh()).to_dict() == state.to_dict()
        summaries = await second.list_threads()
        assert [s.thread_id for s in summaries] == [thread.thread_id]
        assert summaries[0].events == state.seq and summaries[0].head_hash == state.head_hash
        await assert_same_answer(second, reopened)

    run(scenario())


def test_reopening_a_thread_whose_turn_was_started_but_never_run_runs_it(ledger: Ledger) -> None:
    first = ledger.harness(Agent("greeter", ScriptedModel(["hello"])))

    async def scenario() -> None:
        thread = await first.create_thread()
        turn_id, _ = thread.log.start_turn("hi")  # queued: recorded, never claimed or run
        second = ledger.harness(Agent("greeter", ScriptedModel(["hello"])))
        reopened = await second.open_thread(thread.thread_id)
        assert reopened.running or reopened.state().status in ("running", "idle")
        state = await reopened.wait()
        assert state.status == "idle" and state.last_reply == "hello"
        assert state.turns[-1]["turn_id"] == turn_id
        await assert_same_answer(second, reopened)

    run(scenario())


def test_opening_a_thread_another_harness_is_running_does_not_redispatch_its_calls(ledger: Ledger) -> None:
    entered: list[int] = []
    gate: dict[str, asyncio.Event] = {}

    async def script(messages: Messages) -> Step:
        entered.append(len(messages))
        await asyncio.wait_for(gate["go"].wait(), 5)
        return "answered"

    owner = ledger.harness(Agent("slow", ScriptedModel(script)))
    observer = ledger.harness(Agent("slow", ScriptedModel(script)))

    async def scenario() -> None:
        gate["go"] = asyncio.Event()
        thread = await owner.create_thread()
        await thread.send("hi")
        await wait_for(lambda: bool(entered))
        other = await observer.open_thread(thread.thread_id)
        await asyncio.sleep(0.05)
        gate["go"].set()
        await thread.wait()
        await other.wait()
        events = await thread.events()
        assert len(entered) == 1
        assert [e.data["attempt"] for e in of_type(events, "model.dispatched")] == [1]

    run(scenario())


def test_a_tool_call_id_reused_within_a_turn_still_runs(ledger: Ledger) -> None:
    ran: list[str] = []

    @tool(semantics="read_only")
    def lookup(key: str) -> str:
        ran.append(key)
        return key.upper()

    model = ScriptedModel([ToolCall("lookup", {"key": "a"}, id="call_1"),
                           ToolCall("lookup", {"key": "b"}, id="call_1"), "done"])
    harness = ledger.harness(Agent("lookup", model, tools=[lookup]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("look up a, then b")
        await thread.wait()
        assert ran == ["a", "b"]

    run(scenario())


def test_after_an_interrupt_every_tool_call_the_model_sees_has_an_answer(ledger: Ledger) -> None:
    started: list[str] = []

    @tool(semantics="read_only")
    async def slow() -> str:
        started.append("slow")
        await asyncio.sleep(30)
        return "late"

    model = ScriptedModel([ToolCall("slow"), "after"])
    harness = ledger.harness(Agent("slow", model, tools=[slow]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("go")
        await wait_for(lambda: bool(started))
        assert (await thread.interrupt()).status == "idle"
        await thread.send("next")
        await thread.wait()
        messages = model.calls[-1].messages
        called = {c["id"] for m in messages if m["role"] == "assistant" for c in m["tool_calls"]}
        answered = {m["tool_call_id"] for m in messages if m["role"] == "tool"}
        assert called <= answered

    run(scenario())


def test_a_call_id_reused_in_a_later_turn_gets_its_own_answer(ledger: Ledger) -> None:
    """Turn 1's call ``call_0`` is cut off by an interrupt (its outcome unknown, never settled); turn 2's model
    gives its call the same id, as some OpenAI-compatible servers do. Turn 2's result must reach the
    conversation: the closed call was known by its id, so that result was dropped and the thread waited for a
    call in flight with nothing to approve or resolve. Settling turn 1's call later changes nothing in turn 2."""
    started: list[int] = []

    @tool(semantics="read_only")
    async def look(n: int) -> str:
        started.append(n)
        if len(started) == 1:
            await asyncio.sleep(30)  # turn 1's call: cut off by the interrupt
        return f"seen {n}"

    def script(messages: list[dict[str, Any]]) -> Step:
        if messages[-1]["role"] == "user":
            return ToolCall("look", {"n": len(messages)}, id="call_0")
        return "done"

    harness = ledger.harness(Agent("reuser", ScriptedModel(script), tools=[look]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("one")
        await wait_for(lambda: bool(started))
        assert (await thread.interrupt()).status == "idle"
        await thread.send("two")
        state = await thread.wait()
        assert (state.status, state.last_reply) == ("idle", "done"), state.reason
        turn = state.messages[state.turns[-1]["message_index"]:]
        assert [m["content"] for m in turn if m["role"] == "tool"] == [f"seen {started[1]}"]
        [unknown] = [e for e, d in state.effects.items() if d.kind == "tool" and d.state == "unknown"]
        await thread.resolve_tool_outcome(unknown, "not_occurred", note="turn 1's call never happened")
        after = await thread.wait()
        assert after.messages == state.messages
        await assert_same_answer(harness, thread)

    run(scenario())


def test_interrupt_with_parallel_calls_in_flight_records_each_one(ledger: Ledger) -> None:
    started: list[str] = []

    @tool
    async def deploy(region: str) -> str:
        started.append(region)
        await asyncio.sleep(30)
        return "deployed"

    harness = ledger.harness(Agent("deployer", ScriptedModel([[ToolCall("deploy", {"region": "eu"}),
                                                               ToolCall("deploy", {"region": "us"})], "ok"]),
                                   tools=[deploy]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("deploy everywhere")
        await wait_for(lambda: len(started) == 2)
        state = await thread.interrupt()
        events = await thread.events()
        assert_lifecycle_order(events)
        eids = effect_ids(events)
        assert len(eids) == 2
        for eid in eids:
            assert [e.type for e in lifecycle(events, eid)] == ["tool.requested", "tool.dispatched", "tool.failed"]
        assert state.status == "waiting" and sorted(w["effect_id"] for w in state.waiting_on) == sorted(eids)
        for eid in eids:
            await thread.resolve_tool_outcome(eid, "abandoned_unknown")
        state = await thread.wait()
        assert state.status == "idle" and state.turns[-1]["status"] == "interrupted"
        await assert_same_answer(harness, thread)

    run(scenario())


def test_a_tool_that_ran_but_returned_an_invalid_result_is_not_a_determinate_failure(ledger: Ledger) -> None:
    ran: list[int] = []

    @tool
    def transfer(amount: int) -> int:
        ran.append(amount)
        return "sent"  # type: ignore[return-value]

    harness = ledger.harness(Agent("bank", ScriptedModel([ToolCall("transfer", {"amount": 5}), "done"]),
                                   tools=[transfer]))

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("transfer 5")
        await thread.wait()
        events = await thread.events()
        assert ran == [5]
        receipt = [e for e in events if e.type in ("tool.completed", "tool.failed")][-1]
        assert not (receipt.type == "tool.failed" and receipt.data["indeterminate"] is False)

    run(scenario())


def test_a_turn_whose_model_and_tools_never_wait_still_lets_other_tasks_of_its_loop_run(ledger: Ledger) -> None:
    """The lease heartbeat and any other task on the loop get turns while the agent loop runs."""
    steps = 30

    @tool(semantics="read_only")
    async def instant() -> str:
        """Never waits."""
        return "ok"

    def script(messages: Messages) -> Step:
        return ToolCall("instant") if sum(m["role"] == "tool" for m in messages) < steps else "done"

    async def scenario() -> None:
        harness = ledger.harness(Agent("busy", ScriptedModel(script), tools=[instant], max_steps=steps + 1))
        thread = await harness.create_thread()
        ticks = 0
        finished = False

        async def ticker() -> None:
            nonlocal ticks
            while not finished:
                ticks += 1
                await asyncio.sleep(0)

        other = asyncio.ensure_future(ticker())
        await asyncio.sleep(0)
        await thread.send("go")
        state = await thread.wait()
        finished = True
        await other
        assert state.last_reply == "done"
        assert ticks >= steps // 2, f"the other task ran only {ticks} times during a {steps}-step turn"

    run(scenario())


def test_the_scripted_model_keeps_every_request_unless_told_not_to(ledger: Ledger) -> None:
    """``keep_calls=False`` (a long-running script) keeps no requests and answers exactly the same."""

    @tool(semantics="read_only")
    def lookup(q: str) -> str:
        """Looks ``q`` up."""
        return q.upper()

    script: list[Step] = [ToolCall("lookup", {"q": "a"}), "done"]
    kept, unkept = ScriptedModel(script), ScriptedModel(script, keep_calls=False)

    async def scenario(model: ScriptedModel) -> list[tuple[str, Any]]:
        harness = ledger.harness(Agent("keeper", model, tools=[lookup]))
        thread = await harness.create_thread()
        await thread.send("go")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "done"
        return [(m["role"], m.get("content")) for m in state.messages]

    assert run(scenario(kept)) == run(scenario(unkept)) == [
        ("user", "go"), ("assistant", None), ("tool", "A"), ("assistant", "done")]
    assert [len(call.messages) for call in kept.calls] == [1, 3]
    assert unkept.calls == []
    with pytest.raises(InvalidInput, match="keep_calls must be True or False"):
        ScriptedModel(script, keep_calls="no")  # type: ignore[arg-type]
