"""Tool probes: the declaration, the answers, the pure policy, the projection, and threads that use them.

A probe asks the outside system what happened to one unknown call; a definite answer becomes the call's
outcome resolution (actor ``probe:<tool>``), anything else leaves the call to an operator with the answer
shown. The process-crash tests are in ``test_probe_crash.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import pytest

from jixu import (
    Agent,
    DontKnow,
    Harness,
    IncompatibleAgent,
    MemoryStore,
    NotOccurred,
    Occurred,
    ProbeQuery,
    ScriptedModel,
    ToolCall,
    ToolContext,
    tool,
)
from jixu.errors import ToolDefinitionError
from jixu.ledger import Event, content_hash, new_id
from jixu.threads.decide import Dispatch, Probe, RequestModel, ResolveByProbe, Stop, decide
from jixu.threads.log import build_state
from jixu.threads.projection import REDUCER_VERSION, ThreadProjection, ThreadState, fork_state
from jixu.threads.tools import DEFAULT_PROBE_TIMEOUT
from tests.threads.conftest import Ledger, assert_same_answer, of_type, run

# --- the declaration -----------------------------------------------------------------------------------


def _found(query: ProbeQuery) -> Occurred:
    return Occurred(result="refunded", evidence={"line": 1})


def test_a_probe_is_refused_on_a_read_only_tool_where_there_is_nothing_to_probe() -> None:
    with pytest.raises(ToolDefinitionError, match="nothing to probe"):
        @tool(semantics="read_only", probe=_found)
        def lookup(order: str) -> str:
            return order


@pytest.mark.parametrize("probe, problem", [
    ("not a function", "probe must be a function"),
    (lambda: None, "exactly one positional argument"),
    (lambda a, b: None, "exactly one positional argument"),
])
def test_a_probe_that_cannot_take_a_query_is_refused(probe: Any, problem: str) -> None:
    with pytest.raises(ToolDefinitionError, match=problem):
        tool(semantics="unsafe", probe=probe)(_refund_body)


def test_probe_timeout_needs_a_probe_and_a_positive_number() -> None:
    with pytest.raises(ToolDefinitionError, match="probe_timeout needs a probe"):
        tool(semantics="unsafe", probe_timeout=3)(_refund_body)
    for bad in (0, -1, float("nan"), "5", True):
        with pytest.raises(ToolDefinitionError, match="probe_timeout must be"):
            tool(semantics="unsafe", probe=_found, probe_timeout=bad)(_refund_body)
    made = tool(semantics="idempotent", probe=_found)(_refund_body)
    assert made.probe is _found and made.probe_timeout == DEFAULT_PROBE_TIMEOUT


def _refund_body(order: str) -> str:
    """Refund an order."""
    return f"refunded {order}"


def test_the_contract_says_a_tool_has_a_probe_and_tools_without_one_keep_their_contract() -> None:
    plain = tool(semantics="unsafe")(_refund_body)
    probed = tool(semantics="unsafe", probe=_found)(_refund_body)
    assert "probe" not in plain.contract()
    assert probed.contract() == {**plain.contract(), "probe": True}
    assert Agent("a", ScriptedModel(["x"]), tools=[plain]).contract != Agent(
        "a", ScriptedModel(["x"]), tools=[probed]).contract


# --- the answers ---------------------------------------------------------------------------------------


def _answer(value: object) -> dict[str, Any]:
    return tool(semantics="unsafe", probe=_found)(_refund_body).probe_answer(value)


def test_the_three_answers_are_recorded_as_plain_json() -> None:
    assert _answer(Occurred(result="refunded 42", evidence={"line": 3})) == {
        "answer": "occurred", "result": "refunded 42", "evidence": {"line": 3}}
    assert _answer(NotOccurred(evidence={"searched": "payments.log"})) == {
        "answer": "not_occurred", "evidence": {"searched": "payments.log"}}
    assert _answer(DontKnow("the payment system is down")) == {
        "answer": "dont_know", "reason": "the payment system is down", "evidence": {}}


@pytest.mark.parametrize("value, reason", [
    ("occurred", "not Occurred, NotOccurred or DontKnow"),
    (None, "not Occurred, NotOccurred or DontKnow"),
    (Occurred(result=42), "does not match the tool's return annotation"),
    (Occurred(result="x", evidence={"when": object()}), "evidence is not plain JSON"),
    (Occurred(result="x" * 70_000), "result is over"),
    (NotOccurred(evidence=["a list"]), "evidence must be a dict"),  # type: ignore[arg-type]
])
def test_a_bad_answer_is_a_dont_know_naming_why(value: object, reason: str) -> None:
    answer = _answer(value)
    assert answer["answer"] == "dont_know" and reason in answer["reason"], answer
    json.dumps(answer)


def _query() -> ProbeQuery:
    return ProbeQuery(effect_id=new_id(), idempotency_key="jixu:x", args={"order": "42"}, tool="refund",
                      attempt=1, thread_id=new_id(), turn_id=new_id())


def test_sync_and_async_probes_are_asked_and_a_slow_one_times_out() -> None:
    async def found_async(query: ProbeQuery) -> NotOccurred:
        return NotOccurred(evidence={"key": query.idempotency_key})

    async def slow(query: ProbeQuery) -> Occurred:
        await asyncio.sleep(5)
        return Occurred(result="late")

    sync_tool = tool(semantics="unsafe", probe=_found)(_refund_body)
    async_tool = tool(semantics="unsafe", probe=found_async)(_refund_body)
    slow_tool = tool(semantics="unsafe", probe=slow, probe_timeout=0.05)(_refund_body)
    assert run(sync_tool.ask_probe(_query()))["answer"] == "occurred"
    assert run(async_tool.ask_probe(_query())) == {"answer": "not_occurred", "evidence": {"key": "jixu:x"}}
    with pytest.raises(TimeoutError):
        run(slow_tool.ask_probe(_query()))


# --- the policy (decide.py) and the projection, on written histories -----------------------------------


class History:
    """A thread's events written by hand: one turn whose model asked for ``refund``."""

    def __init__(self, *, probe: bool = True, semantics: str = "unsafe") -> None:
        self.events: list[Event] = []
        self.seqs = itertools.count(1)
        self.turn = new_id()
        self.add("thread.created", {"thread_id": new_id(), "agent": {}, "metadata": {}})
        self.add("turn.started", {"turn_id": self.turn, "input": "Refund order 42", "owner": "w", "epoch": 1})
        model = self.intent("model", "scripted", {"turn_id": self.turn, "context_seq": 2, "messages": 1},
                            semantics="read_only")
        self.add("model.dispatched", {"effect_id": model, "attempt": 1})
        self.add("model.completed", {"effect_id": model, "attempt": 1, "result": {
            "text": None, "tool_calls": [{"id": "c1", "name": "refund", "args": {"order": "42"}}]}})
        self.call = self.intent("tool", "refund", {"order": "42"}, semantics=semantics, call_id="c1",
                                **({"probe": True} if probe else {}))

    def add(self, event_type: str, data: dict[str, Any]) -> Event:
        seq = next(self.seqs)
        event = Event(id=new_id(), stream="thread/t", seq=seq, type=event_type, data=data, meta={"actor": "t"},
                      recorded_at="", prev_hash="", hash=f"{seq:064x}")
        self.events.append(event)
        return event

    def intent(self, kind: str, name: str, args: dict[str, Any], *, semantics: str, **extra: Any) -> str:
        effect_id = new_id()
        self.add(f"{kind}.requested", {"effect_id": effect_id, "name": name, "args": args,
                                       "args_hash": content_hash(args), "semantics": semantics,
                                       "idempotency_key": f"jixu:{effect_id}", "requires_approval": False,
                                       "turn_id": self.turn, **extra})
        return effect_id

    def dispatch(self, effect_id: str, attempt: int = 1) -> None:
        self.add(f"{'tool' if effect_id == self.call else 'probe'}.dispatched",
                 {"effect_id": effect_id, "attempt": attempt})

    def probe(self, answer: dict[str, Any] | None, *, attempt: int = 1, failed: bool = False,
              dispatches: int = 1) -> str:
        probe = self.intent("probe", "refund", {"effect_id": self.call, "attempt": attempt}, semantics="read_only")
        for number in range(1, dispatches + 1):
            self.dispatch(probe, number)
        if failed:
            self.add("probe.failed", {"effect_id": probe, "attempt": dispatches, "indeterminate": False,
                                      "error": {"type": "exception", "exception": "OSError", "message": "down"}})
        elif answer is not None:
            self.add("probe.completed", {"effect_id": probe, "attempt": dispatches, "result": answer})
        return probe

    def resolve(self, resolution: str, actor: str, **extra: Any) -> None:
        self.add("tool.outcome_resolved", {"effect_id": self.call, "resolution": resolution,
                                           "resolution_id": new_id(), "actor": actor, "note": None, **extra})

    def state(self) -> ThreadState:
        projection = ThreadProjection()
        state = projection.initial()
        for event in self.events:
            state = projection.apply(state, event)
        return state

    def decide(self, max_attempts: int = 3) -> Any:
        state = self.state()
        return decide(state, state.open_analysis(), max_steps=10, max_attempts=max_attempts)


def _unknown(**options: Any) -> History:
    history = History(**options)
    history.dispatch(history.call)
    return history


def test_an_unknown_unsafe_call_of_a_tool_with_a_probe_is_probed_before_an_operator_is_asked() -> None:
    history = _unknown()
    assert history.decide() == Probe(history.turn, (history.call,))
    without = _unknown(probe=False)
    action = without.decide()
    assert isinstance(action, Stop) and action.status == "waiting" and action.effect_ids == (without.call,)


def test_a_definite_answer_becomes_a_resolution_with_the_probes_evidence() -> None:
    history = _unknown()
    probe = history.probe({"answer": "occurred", "result": "refunded", "evidence": {"line": 7}})
    assert history.decide() == ResolveByProbe(history.call, probe, "refund", "occurred",
                                              {"probe_effect_id": probe, "found": {"line": 7}}, "refunded")
    history = _unknown()
    probe = history.probe({"answer": "not_occurred", "evidence": {"lines": 0}})
    assert history.decide() == ResolveByProbe(history.call, probe, "refund", "not_occurred",
                                              {"probe_effect_id": probe, "searched": {"lines": 0}}, None)


@pytest.mark.parametrize("case", ["dont_know", "failed", "never_answered"])
def test_a_probe_that_cannot_tell_leaves_the_call_to_an_operator_and_is_not_asked_again(case: str) -> None:
    history = _unknown()
    if case == "dont_know":
        history.probe({"answer": "dont_know", "reason": "the payment system is down", "evidence": {}})
    elif case == "failed":
        history.probe(None, failed=True)
    else:
        history.probe(None, dispatches=3)  # killed three times while it ran
    action = history.decide(max_attempts=3)
    assert isinstance(action, Stop) and action.status == "waiting", action
    assert action.effect_ids == (history.call,)
    assert "never answered" in action.reason if case == "never_answered" else "does not know" in action.reason


def test_a_probe_killed_while_it_ran_is_dispatched_again_under_its_own_id() -> None:
    history = _unknown()
    probe = history.probe(None)
    assert history.decide() == Dispatch((probe,))


def test_once_resolved_the_turn_goes_on_and_the_probe_is_not_asked_again() -> None:
    history = _unknown()
    history.probe({"answer": "occurred", "result": "refunded", "evidence": {}})
    history.resolve("occurred", "probe:refund", result="refunded")
    assert history.decide() == RequestModel(history.turn)


def test_an_operators_resolution_before_the_probe_makes_the_probe_unneeded() -> None:
    history = _unknown()
    history.resolve("abandoned_unknown", "operator")
    assert history.decide() == RequestModel(history.turn)


def test_an_exhausted_idempotent_call_is_probed_once_per_attempt() -> None:
    history = History(semantics="idempotent")
    for attempt in (1, 2, 3):
        history.dispatch(history.call, attempt)
    assert history.decide(max_attempts=3) == Probe(history.turn, (history.call,))
    history.probe({"answer": "dont_know", "reason": "?", "evidence": {}}, attempt=2)  # an earlier attempt's
    assert history.decide(max_attempts=3) == Probe(history.turn, (history.call,))


def test_calls_of_an_ended_turn_and_of_a_recovered_turn_are_left_to_the_operator() -> None:
    ended = _unknown()
    ended.add("turn.ended", {"turn_id": ended.turn, "outcome": "interrupted", "reason": "stop"})
    action = ended.decide()
    assert isinstance(action, Stop) and action.status == "waiting"
    recovered = _unknown()
    recovered.add("turn.recovered", {"turn_id": recovered.turn, "request_id": "0" * 32, "expected_epoch": 1,
                                     "epoch": 2, "legacy_confirmed_stopped": False, "reason": "lease_expired"})
    action = recovered.decide()
    assert isinstance(action, Stop) and action.status == "waiting" and "reconciliation" in action.reason


def test_the_projection_attaches_each_probes_answer_to_the_call_it_asked_about() -> None:
    history = _unknown()
    first = history.probe(None, failed=True)
    state = history.state()
    [record] = state.probes[history.call]
    assert record["effect_id"] == first and record["attempt"] == 1 and record["tool"] == "refund"
    assert record["answer"]["answer"] == "dont_know" and "down" in record["answer"]["reason"]
    assert record["answer"]["error"]["exception"] == "OSError"
    public = build_state(state, state.open_analysis())
    [waiting] = public.waiting_on
    assert waiting["probe"] == record and public.probes == {history.call: (record,)}
    assert public.to_dict()["probes"] == {history.call: [record]}
    json.dumps(public.to_dict()["waiting_on"])


def test_probes_survive_a_checkpoint_and_are_not_inherited_by_a_fork() -> None:
    history = _unknown()
    history.probe({"answer": "dont_know", "reason": "down", "evidence": {}})
    state = history.state()
    projection = ThreadProjection()
    loaded = projection.load(json.loads(json.dumps(projection.dump(state))))
    assert loaded.probes == state.probes and loaded.probes
    dumped = projection.dump(state)
    del dumped["probes"]  # a fork record written by reducer version 4
    assert projection.load(dumped).probes == {}
    assert fork_state(state).probes == {}
    assert REDUCER_VERSION == 11


def test_the_model_is_told_who_settled_the_call() -> None:
    by_probe, by_operator = _unknown(), _unknown()
    by_probe.resolve("occurred", "probe:refund", result="refunded")
    by_operator.resolve("occurred", "operator", result="refunded")
    [probe_message] = [m for m in by_probe.state().messages if m.get("role") == "tool"]
    [operator_message] = [m for m in by_operator.state().messages if m.get("role") == "tool"]
    assert "A probe of the outside system found" in probe_message["content"]
    assert "An operator confirmed" in operator_message["content"]
    assert probe_message["status"] == operator_message["status"] == "occurred"


# --- threads that use probes ---------------------------------------------------------------------------


class Payments:
    """An outside system: refunds by idempotency key; the call's answer is lost after the refund is made."""

    def __init__(self) -> None:
        self.refunds: dict[str, str] = {}
        self.calls = 0

    def tool(self, probe: Any) -> Any:
        payments = self

        @tool(semantics="unsafe", probe=probe, probe_timeout=0.5 if probe is not None else None)
        def refund(order: str, ctx: ToolContext) -> str:
            """Refund an order; the connection drops before the answer arrives."""
            payments.calls += 1
            payments.refunds[ctx.idempotency_key] = order
            raise ConnectionResetError("the connection dropped before the answer")

        return refund

    def find(self, query: ProbeQuery) -> Occurred | NotOccurred:
        if query.idempotency_key in self.refunds:
            return Occurred(result=f"refunded order {query.args['order']}",
                            evidence={"key": query.idempotency_key})
        return NotOccurred(evidence={"searched": sorted(self.refunds)})


def _step(messages: list[dict[str, Any]]) -> str | ToolCall:
    last = messages[-1]
    if last.get("role") == "user":
        return ToolCall("refund", {"order": "42"})
    return f"{last.get('status')}: {last.get('content')}"


def test_a_call_whose_answer_was_lost_is_settled_by_its_probe_and_every_reading_agrees(ledger: Ledger) -> None:
    payments = Payments()
    harness = ledger.harness(Agent("refunder", ScriptedModel(_step), tools=[payments.tool(payments.find)]))

    async def go() -> None:
        thread = await harness.create_thread()
        await thread.send("Refund order 42")
        state = await assert_same_answer(harness, thread)
        assert state.status == "idle" and state.last_reply is not None
        assert state.last_reply.startswith("occurred:") and "refunded order 42" in state.last_reply
        assert payments.calls == 1
        events = await thread.events()
        [resolved] = of_type(events, "tool.outcome_resolved")
        assert resolved.data["actor"] == "probe:refund"
        assert of_type(events, "tool.requested")[0].data["probe"] is True

    run(go())


@pytest.mark.parametrize("probe, reason", [
    (lambda query: DontKnow("the ledger is being rebuilt"), "the ledger is being rebuilt"),
    (lambda query: 1 / 0, "ZeroDivisionError"),
    (lambda query: "yes", "not Occurred, NotOccurred or DontKnow"),
    (lambda query: __import__("time").sleep(2), "no answer within 0.5s"),
])
def test_a_probe_that_cannot_tell_leaves_the_call_waiting_with_its_answer_then_an_operator_decides(
        probe: Any, reason: str) -> None:
    payments = Payments()
    agent = Agent("refunder", ScriptedModel(_step), tools=[payments.tool(probe)])

    async def go() -> None:
        async with Harness(agent, MemoryStore()) as harness:
            thread = await harness.create_thread()
            await thread.send("Refund order 42")
            state = await thread.wait()
            assert state.status == "waiting", state.reason
            [waiting] = state.waiting_on
            answer = waiting["probe"]["answer"]
            assert answer["answer"] == "dont_know" and reason in answer["reason"], answer
            reopened = await harness.open_thread(thread.thread_id)
            assert reopened.state().status == "waiting" and not reopened.running, "no second probe"
            state = await thread.resolve_tool_outcome(waiting["effect_id"], "not_occurred", note="checked by hand")
            state = await thread.wait()
            assert state.status == "idle" and state.last_reply is not None
            assert state.last_reply.startswith("not_occurred:")
            assert len(of_type(await thread.events(), "probe.requested")) == 1

    run(go())


def test_a_thread_whose_unknown_call_expects_a_probe_is_not_continued_by_an_agent_without_the_probe() -> None:
    payments = Payments()
    store = MemoryStore()

    async def go() -> None:
        cannot_tell = payments.tool(lambda query: DontKnow(reason="the payment system is down"))
        with_probe = Harness(Agent("refunder", ScriptedModel(_step), tools=[cannot_tell]), store)
        thread = await with_probe.create_thread()
        await thread.send("Refund order 42")
        state = await thread.wait()
        assert state.status == "waiting", state.reason
        [waiting] = state.waiting_on
        without = Harness(Agent("refunder", ScriptedModel(_step), tools=[payments.tool(None)]), store)
        with pytest.raises(IncompatibleAgent) as refused:
            await without.open_thread(thread.thread_id)
        assert waiting["effect_id"] in refused.value.message and "tool 'refund' changed" in refused.value.message

    run(go())


def test_several_unknown_calls_are_probed_side_by_side_and_each_gets_its_own_resolution() -> None:
    payments = Payments()
    started: list[str] = []

    async def find(query: ProbeQuery) -> Occurred | NotOccurred:
        started.append(query.effect_id)
        while len(started) < 2:  # both probes run at once, or this one never returns (the test times out)
            await asyncio.sleep(0.001)
        return payments.find(query)

    def step(messages: list[dict[str, Any]]) -> str | list[ToolCall]:
        last = messages[-1]
        if last.get("role") == "user":
            return [ToolCall("refund", {"order": "41"}), ToolCall("refund", {"order": "42"})]
        return "done: " + ",".join(str(m.get("status")) for m in messages if m.get("role") == "tool")

    agent = Agent("refunder", ScriptedModel(step), tools=[payments.tool(find)])

    async def go() -> None:
        async with Harness(agent, MemoryStore()) as harness:
            thread = await harness.create_thread()
            await thread.send("Refund orders 41 and 42")
            state = await asyncio.wait_for(thread.wait(), 10)
            assert state.status == "idle" and state.last_reply == "done: occurred,occurred", state.reason
            events = await thread.events()
            asked = of_type(events, "probe.requested")
            assert len(asked) == 2 and {e.data["args"]["effect_id"] for e in asked} == set(started)
            assert asked[1].seq == asked[0].seq + 1, "every probe intent and marker in one append"
            resolved = of_type(events, "tool.outcome_resolved")
            assert sorted(e.data["effect_id"] for e in resolved) == sorted(started)
            assert {e.data["resolution_id"] for e in resolved} == {e.data["effect_id"] for e in asked}

    run(go())
