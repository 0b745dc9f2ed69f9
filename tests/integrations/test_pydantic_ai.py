"""An unchanged pydantic-ai agent made durable with ``jixu.integrations.pydantic_ai.JixuAgent``, against the real
pydantic-ai package: its ``OpenAIChatModel`` talking to a local server that speaks the Chat Completions wire format
(``tests/providers/fake_servers.py``), or its own offline ``FunctionModel``.

The crash tests SIGKILL a child process (``tests/integrations/pydantic_ai_child.py``) inside the unsafe ``charge``
tool and run the same agent again in this process; every charge is a line in a file, so the counts are what really
ran, and every model request the server received is counted too.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai import Agent, ModelRetry
from pydantic_ai.exceptions import ModelHTTPError
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import RequestUsage

from jixu import (
    NotOccurred,
    Occurred,
    ProbeQuery,
    RecoveryResolver,
    StepFailed,
    StepMismatch,
    StepOutcomeUnknown,
    ToolError,
)
from jixu.errors import InvalidInput, ToolDefinitionError
from jixu.integrations.pydantic_ai import (
    MODEL_STEP,
    OCCURRED_WITHOUT_RESULT,
    JixuAgent,
    current_effect,
    dump_response,
    effect,
    load_response,
)
from jixu.ledger import open_store
from jixu.threads.log import ThreadLog
from tests.helpers import ROOT, python_env
from tests.integrations.pydantic_ai_child import PROMPT, durable_orders
from tests.providers.fake_servers import Call, Completion, Failure, FakeOpenAI, Slow
from tests.threads.steps_child import lines

CHILD_TIMEOUT = 60.0
CHARGE = Completion(calls=[Call("call_charge_7", "charge", '{"order": 7}')])
DONE = Completion(text="Order 7 is charged.")


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    found = FakeOpenAI().start()
    yield found
    found.stop()


def _crash(mode: str, url: str, directory: Path, server: FakeOpenAI) -> str:
    """Run the child until it SIGKILLs itself inside ``charge``; the thread id it reported."""
    server.script(CHARGE)
    proc = subprocess.run([sys.executable, "-m", "tests.integrations.pydantic_ai_child", mode, url, str(directory),
                           server.url], env=python_env(), cwd=ROOT, text=True, capture_output=True,
                          timeout=CHILD_TIMEOUT, check=False)
    assert proc.returncode == -signal.SIGKILL, f"the child exited {proc.returncode}: {proc.stderr[-3000:]}"
    assert len(server.requests) == 1, "the child asked the model once, then died inside the tool"
    [thread_id] = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("T ")]
    return thread_id


def _events(url: str, thread_id: str) -> tuple[ThreadLog, Any]:
    store = open_store(url)
    return ThreadLog.load(store, thread_id, verify=True), store


def _charge_effect(url: str, thread_id: str) -> str:
    """The record the dead child left: the model request completed, the charge dispatched with no receipt."""
    log, store = _events(url, thread_id)
    try:
        analysis = RecoveryResolver.analyze(log.events())
        [charge] = [d for d in analysis.decisions.values() if d.name == "charge"]
        [request] = [d for d in analysis.decisions.values() if d.name == MODEL_STEP]
        assert request.state == "completed" and request.semantics == "idempotent"
        assert charge.semantics == "unsafe"
        assert charge.state == "unknown" and charge.reason == "dispatched_without_receipt", charge
        assert log.snapshot().status == "waiting"
        return charge.effect_id
    finally:
        store.close()


def _tool_messages(server: FakeOpenAI) -> list[str]:
    """What the model was told about each tool call, in the last request it received."""
    return [m["content"] for m in server.bodies[-1]["messages"] if m.get("role") == "tool"]


@pytest.mark.crash
def test_killed_after_the_unsafe_side_effect_the_call_is_unknown_the_probe_settles_it_and_nothing_repeats(
        tmp_path: Path, server: FakeOpenAI) -> None:
    url = f"sqlite:///{tmp_path / 'jixu.db'}"
    thread_id = _crash("after", url, tmp_path, server)
    assert len(lines(tmp_path / "bank.log")) == 1
    charge = _charge_effect(url, thread_id)

    server.script(DONE)
    durable = durable_orders(url, tmp_path, server.url)
    try:
        result = asyncio.run(durable.run(PROMPT, thread_id=thread_id))
    finally:
        durable.close()

    assert result.output == "Order 7 is charged."
    assert len(lines(tmp_path / "bank.log")) == 1, "the unsafe call was not repeated"
    assert len(server.requests) == 2, "the recorded model response was returned, not asked for again"
    assert json.loads(_tool_messages(server)[0]) == {"charged": 7, "line": 1}, "the model got the probe's result"
    log, store = _events(url, thread_id)
    try:
        events = log.events()
        assert [e.data["attempt"] for e in events if e.type == "tool.dispatched"
                and e.data["effect_id"] == charge] == [1]
        [resolved] = [e for e in events if e.type == "tool.outcome_resolved"]
        assert resolved.data["effect_id"] == charge and resolved.data["resolution"] == "occurred"
        assert resolved.data["actor"] == "probe:charge"
        assert [e.data["reason"] for e in events if e.type == "turn.claimed"] == ["took_over_dead_owner"]
        [ended] = [e for e in events if e.type == "turn.ended"]
        assert ended.data["outcome"] == "completed" and ended.data["reply"] == "Order 7 is charged."
        state = log.snapshot()
        assert state.status == "idle" and state.analysis.safe_to_continue
        assert RecoveryResolver.analyze(events).decisions == state.effects, "online == replayed"
    finally:
        store.close()


@pytest.mark.crash
def test_without_a_probe_the_run_stops_until_an_operator_resolves_the_call_with_jixu_threads_resolve(
        tmp_path: Path, server: FakeOpenAI) -> None:
    url = f"sqlite:///{tmp_path / 'jixu.db'}"
    thread_id = _crash("after", url, tmp_path, server)
    charge = _charge_effect(url, thread_id)

    durable = durable_orders(url, tmp_path, server.url, probe=False)
    try:
        with pytest.raises(StepOutcomeUnknown) as raised:
            asyncio.run(durable.run(PROMPT, thread_id=thread_id))
        assert raised.value.details["effect_id"] == charge
        assert f"jixu threads resolve STORE {thread_id} {charge}" in raised.value.message
        assert len(lines(tmp_path / "bank.log")) == 1 and len(server.requests) == 1, "nothing ran, nothing asked"

        resolved = subprocess.run([sys.executable, "-m", "jixu", "threads", "resolve", url, thread_id, charge,
                                   "--resolution", "occurred", "--note", "the bank shows the charge"],
                                  env=python_env(), cwd=ROOT, text=True, capture_output=True, timeout=60, check=False)
        assert resolved.returncode == 0, resolved.stdout + resolved.stderr

        server.script(DONE)
        result = asyncio.run(durable.run(PROMPT, thread_id=thread_id))
    finally:
        durable.close()
    assert result.output == "Order 7 is charged."
    assert len(lines(tmp_path / "bank.log")) == 1, "exactly one charge"
    assert _tool_messages(server) == [OCCURRED_WITHOUT_RESULT]


@pytest.mark.crash
def test_killed_before_the_side_effect_the_probe_finds_nothing_and_the_call_runs_once(
        tmp_path: Path, server: FakeOpenAI) -> None:
    url = f"sqlite:///{tmp_path / 'jixu.db'}"
    thread_id = _crash("before", url, tmp_path, server)
    assert not lines(tmp_path / "bank.log")
    charge = _charge_effect(url, thread_id)

    server.script(DONE)
    durable = durable_orders(url, tmp_path, server.url)
    try:
        result = asyncio.run(durable.run(PROMPT, thread_id=thread_id))
    finally:
        durable.close()

    assert result.output == "Order 7 is charged."
    [line] = lines(tmp_path / "bank.log")
    assert len(server.requests) == 2
    log, store = _events(url, thread_id)
    try:
        events = log.events()
        [resolved] = [e for e in events if e.type == "tool.outcome_resolved"]
        assert resolved.data["effect_id"] == charge and resolved.data["resolution"] == "not_occurred"
        [again] = [e for e in events if e.type == "tool.requested" and e.data["name"] == "charge"
                   and e.data["effect_id"] != charge]
        assert f"key=jixu:{again.data['effect_id']}" in line, "the call ran once more, under a new effect"
    finally:
        store.close()


@pytest.mark.crash
def test_a_rerun_that_asks_something_else_is_a_step_mismatch_and_runs_nothing(
        tmp_path: Path, server: FakeOpenAI) -> None:
    url = f"sqlite:///{tmp_path / 'jixu.db'}"
    thread_id = _crash("after", url, tmp_path, server)
    durable = durable_orders(url, tmp_path, server.url)
    try:
        with pytest.raises(StepMismatch) as raised:
            asyncio.run(durable.run("Charge order 8.", thread_id=thread_id))
    finally:
        durable.close()
    assert raised.value.details["step"] == f"{MODEL_STEP}#1"
    assert len(server.requests) == 1 and len(lines(tmp_path / "bank.log")) == 1, "nothing was asked or run"
    _charge_effect(url, thread_id)  # the record is as the child left it


# --- in one process ---------------------------------------------------------------------------


def test_requests_and_calls_are_steps_and_each_response_is_the_one_rebuilt_from_its_record(
        tmp_path: Path, server: FakeOpenAI) -> None:
    server.script(Completion(calls=[Call("c1", "reserve", '{"order": 7}')], input_tokens=30, output_tokens=5), DONE)
    keys: list[str] = []
    agent = Agent(_openai(server), name="orders")

    @agent.tool_plain
    @effect(semantics="idempotent")
    def reserve(order: int) -> str:
        keys.append(current_effect().idempotency_key)
        return f"reserved {order}"

    with JixuAgent(agent, tmp_path / "jixu.db") as durable:
        thread_id = durable.new_thread_sync()
        result = durable.run_sync("Reserve order 7.", thread_id=thread_id)
        state = asyncio.run(durable.harness.open_thread(thread_id, resume=False)).state()
    assert result.output == "Order 7 is charged."
    assert [d.name for d in state.effects.values()] == [MODEL_STEP, "reserve", MODEL_STEP]
    [reserve_effect] = [d for d in state.effects.values() if d.name == "reserve"]
    assert reserve_effect.semantics == "idempotent" and keys == [f"jixu:{reserve_effect.effect_id}"]
    assert _tool_messages(server) == ["reserved 7"]
    first = result.all_messages()[1]
    assert isinstance(first, ModelResponse) and first.usage.input_tokens == 30
    assert first.parts[0] == ToolCallPart("reserve", '{"order": 7}', tool_call_id="c1")
    assert state.turns[-1]["reply"] == "Order 7 is charged."


def test_a_response_survives_its_record_exactly() -> None:
    response = ModelResponse(
        parts=[ThinkingPart("weigh it", signature="sig"), TextPart("hi ✓"),
               ToolCallPart("charge", {"order": 7, "note": None}, tool_call_id="call_1")],
        usage=RequestUsage(input_tokens=11, output_tokens=3, details={"reasoning_tokens": 2}),
        model_name="gpt-4o-mini", provider_name="openai", provider_response_id="chatcmpl-1",
        provider_details={"finish_reason": "tool_calls"}, finish_reason="tool_call", run_id="r", conversation_id="c")
    payload = dump_response(response)
    assert json.loads(json.dumps(payload)) == payload, "plain JSON"
    assert load_response(payload) == response


def test_a_provider_error_leaves_the_run_unfinished_and_its_rerun_asks_again_without_redoing_a_step(
        tmp_path: Path, server: FakeOpenAI) -> None:
    """The provider answers 503 to the request after an unsafe charge ran. The caller gets pydantic-ai's own
    error, and the run stays unfinished: running it again returns the charge from its record and asks the
    model again (under a new step), once. Before, the request was retried three times at once and then left
    for an operator for good; a run ended failed instead would start afresh and charge a second time."""
    from openai import AsyncOpenAI
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    unavailable = Failure(503, {"error": {"message": "The server is overloaded", "type": "server_error"}})
    server.script(CHARGE, unavailable, DONE, DONE)
    client = AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
    agent = Agent(OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client)), name="orders")
    charged: list[int] = []

    @agent.tool_plain
    @effect(semantics="unsafe")
    def charge(order: int) -> str:
        charged.append(order)
        return f"charged {order}"

    async def scenario() -> Any:
        # One event loop for all three runs: the OpenAI client keeps its connections on it.
        async with JixuAgent(agent, tmp_path / "jixu.db") as durable:
            thread_id = await durable.new_thread()
            with pytest.raises(ModelHTTPError) as raised:
                await durable.run("Charge order 7.", thread_id=thread_id)
            assert raised.value.status_code == 503 and len(server.requests) == 2, "asked once, not three times"
            assert (await durable.run("Charge order 7.", thread_id=thread_id)).output == "Order 7 is charged."
            assert charged == [7], "the charge came from its record"
            assert len(server.requests) == 3, "the failed request was asked once more, the answered one not"
            assert (await durable.run("Hello?", thread_id=thread_id)).output == "Order 7 is charged."  # next run
            return (await durable.harness.open_thread(thread_id, resume=False)).state()

    state = asyncio.run(scenario())
    assert [t["status"] for t in state.turns] == ["completed", "completed"]
    requests = [d for d in state.effects.values() if d.name == MODEL_STEP]
    assert [d.reason for d in requests] == ["succeeded", "failed", "succeeded", "succeeded"]


def test_a_request_an_operator_settled_without_its_response_is_asked_again(tmp_path: Path,
                                                                         server: FakeOpenAI) -> None:
    """A request cut off with no attempts left is ``unknown``; an operator resolves it ``occurred`` (one of the
    answers offered). There is no response to replay, so the rerun asks again: it used to fail with a
    ``TypeError`` and end the run failed for good."""
    server.script(Slow(30, DONE), DONE)
    with JixuAgent(Agent(_openai(server), name="chat"), tmp_path / "jixu.db", max_attempts=1) as durable:
        thread_id = durable.new_thread_sync()

        async def cut_off() -> None:
            task = asyncio.create_task(durable.run("Hello?", thread_id=thread_id))
            for _ in range(500):
                await asyncio.sleep(0.01)
                if server.requests:
                    break
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(cut_off())
        with pytest.raises(StepOutcomeUnknown) as unknown:
            durable.run_sync("Hello?", thread_id=thread_id)
        effect_id = unknown.value.details["effect_id"]
        log, store = _events(f"sqlite:///{tmp_path / 'jixu.db'}", thread_id)
        try:
            log.resolve(effect_id, "occurred", actor="ops", note="the provider's log shows it answered")
        finally:
            store.close()
        assert durable.run_sync("Hello?", thread_id=thread_id).output == "Order 7 is charged."
    assert len(server.requests) == 2


def _charging(server: FakeOpenAI, error: Exception) -> tuple[Agent[Any, Any], list[int]]:
    """An agent on ``server`` whose one tool, ``charge`` (unsafe), notes each call and raises ``error``."""
    calls: list[int] = []
    agent = Agent(_openai(server), name="shop")

    @agent.tool_plain
    def charge(order: int) -> str:
        """Charge an order."""
        calls.append(order)
        raise error

    return agent, calls


def test_an_abandoned_unknown_call_is_told_to_the_model_and_a_rerun_repeats_nothing(tmp_path: Path,
                                                                                   server: FakeOpenAI) -> None:
    """An operator's ``abandoned_unknown`` (offered by the error) ends the step with what the model is told, as for a
    jixu agent; it used to end the run failed, and the same call again then started a new run that charged again."""
    url = f"sqlite:///{tmp_path / 'jixu.db'}"
    agent, charged = _charging(server, ConnectionResetError("the bank hung up after taking the charge"))
    server.script(CHARGE)
    with JixuAgent(agent, url) as durable:
        thread_id = durable.new_thread_sync()
        with pytest.raises(StepOutcomeUnknown) as unknown:
            durable.run_sync(PROMPT, thread_id=thread_id)
        log, store = _events(url, thread_id)
        try:
            log.resolve(unknown.value.details["effect_id"], "abandoned_unknown", actor="ops", note="cannot tell")
        finally:
            store.close()
        server.script(DONE)
        assert durable.run_sync(PROMPT, thread_id=thread_id).output == "Order 7 is charged."
        assert charged == [7] and len(server.requests) == 2, "nothing was charged or asked again"
        assert _tool_messages(server)[0].startswith("The outcome of this call is unknown")
        server.script(DONE)
        assert durable.run_sync(PROMPT, thread_id=thread_id).output == "Order 7 is charged."
    assert charged == [7], "the next run did not charge again"


def test_a_tool_error_is_told_to_the_model_as_pydantic_ai_tells_a_failed_tool(tmp_path: Path,
                                                                             server: FakeOpenAI) -> None:
    """An unsafe tool raising ``jixu.ToolError`` (it knows it did no harm) is a determinate failure: the model is
    told, as pydantic-ai's ``ToolFailed`` tells it, and the run goes on (it used to end failed)."""
    url = f"sqlite:///{tmp_path / 'jixu.db'}"
    agent, tried = _charging(server, ToolError("card declined: nothing was charged", code="declined"))
    server.script(CHARGE, Completion(text="The card was declined."))
    with JixuAgent(agent, url) as durable:
        thread_id = durable.new_thread_sync()
        assert durable.run_sync(PROMPT, thread_id=thread_id).output == "The card was declined."
    assert tried == [7] and len(server.requests) == 2
    assert "card declined: nothing was charged" in _tool_messages(server)[0]
    log, store = _events(url, thread_id)
    try:
        [failed] = [e for e in log.events() if e.type == "tool.failed"]
        assert failed.data["error"]["code"] == "declined" and failed.data["indeterminate"] is False
        assert [e.data["outcome"] for e in log.events() if e.type == "turn.ended"] == ["completed"]
    finally:
        store.close()


async def _parked(url: str, thread_id: str, task: asyncio.Task[Any]) -> str:
    """Wait until the run's one call is parked; its effect id."""
    operator, store = _events(url, thread_id)
    try:
        for _ in range(500):
            await asyncio.sleep(0.01)
            operator.sync()
            waiting = operator.snapshot().waiting_on
            if waiting:
                assert [w["state"] for w in waiting] == ["parked"] and not task.done()
                return str(waiting[0]["effect_id"])
    finally:
        store.close()
    raise AssertionError("the call never parked")


def test_a_tool_needing_approval_parks_and_resumes_once_approved_even_in_another_run(tmp_path: Path) -> None:
    ran: list[int] = []
    url = f"sqlite:///{tmp_path / 'jixu.db'}"

    async def first() -> tuple[str, str]:
        async with _payments(url, ran) as durable:
            thread_id = await durable.new_thread()
            task = asyncio.create_task(durable.run("Wire 100.", thread_id=thread_id))
            effect_id = await _parked(url, thread_id, task)
            task.cancel()  # the process stops waiting: the run stays unfinished, the call parked
            with pytest.raises(asyncio.CancelledError):
                await task
            return thread_id, effect_id

    thread_id, effect_id = asyncio.run(first())
    assert not ran
    approved = subprocess.run([sys.executable, "-m", "jixu", "threads", "approve", url, thread_id, effect_id,
                               "--note", "within the limit"], env=python_env(), cwd=ROOT, text=True,
                              capture_output=True, timeout=60, check=False)
    assert approved.returncode == 0, approved.stdout + approved.stderr

    with _payments(url, ran) as durable:
        result = durable.run_sync("Wire 100.", thread_id=thread_id)
        state = asyncio.run(durable.harness.open_thread(thread_id, resume=False)).state()
    assert result.output == "wired 100" and ran == [100]
    assert [t["status"] for t in state.turns] == ["completed"], "the parked run itself continued"
    assert state.effects[effect_id].state == "completed"


def test_a_denied_call_never_runs_and_the_model_is_told_as_pydantic_ai_tells_it(tmp_path: Path) -> None:
    ran: list[int] = []
    url = f"sqlite:///{tmp_path / 'jixu.db'}"

    async def scenario() -> Any:
        async with _payments(url, ran) as durable:
            thread_id = await durable.new_thread()
            task = asyncio.create_task(durable.run("Wire 100.", thread_id=thread_id))
            effect_id = await _parked(url, thread_id, task)
            operator, store = _events(url, thread_id)
            try:
                operator.decide_parked(effect_id, "denied", actor="ops", note="over the limit")  # as `deny`
            finally:
                store.close()
            return await task

    result = asyncio.run(scenario())
    assert result.output == "The tool call was denied: over the limit" and not ran
    [denied] = [p for m in result.all_messages() for p in m.parts if isinstance(p, ToolReturnPart)]
    assert denied.outcome == "denied"


def test_pydantic_ai_control_flow_is_recorded_and_raised_again_from_the_record(tmp_path: Path) -> None:
    calls: list[str] = []
    asked: list[int] = []
    echo = _call_then_echo("lookup", {"key": "a"})

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        asked.append(len(messages))
        return echo(messages, info)

    agent = Agent(FunctionModel(model), name="retrying")

    @agent.tool_plain
    @effect(semantics="read_only")
    def lookup(key: str) -> str:
        calls.append("retry" if not calls else "die" if len(calls) == 1 else "value")
        if calls[-1] == "retry":
            raise ModelRetry("try again with the same key")
        if calls[-1] == "die":
            raise SystemExit("the process stops inside the second call, before its receipt")
        return f"value of {key}"

    with JixuAgent(agent, tmp_path / "jixu.db") as durable:
        thread_id = durable.new_thread_sync()
        with pytest.raises(SystemExit):
            durable.run_sync("Look up a.", thread_id=thread_id)
        assert calls == ["retry", "die"] and len(asked) == 2
        result = durable.run_sync("Look up a.", thread_id=thread_id)
        state = asyncio.run(durable.harness.open_thread(thread_id, resume=False)).state()
    assert result.output == "value of a"
    assert calls == ["retry", "die", "value"], "the recorded ModelRetry was raised again without calling the tool"
    assert len(asked) == 3, "the two recorded model responses were not asked for again"
    lookups = [d for d in state.effects.values() if d.name == "lookup"]
    assert [(d.state, d.attempts) for d in lookups] == [("completed", 1), ("completed", 2)]
    [retried] = [p for m in result.all_messages() for p in m.parts
                 if isinstance(p, ToolReturnPart) and p.outcome == "retried"]
    assert retried.content == "try again with the same key", "pydantic-ai got its ModelRetry back"
    assert [t["status"] for t in state.turns] == ["completed"], "one run, continued"


def test_streamed_requests_are_steps_and_their_events_reach_the_handler(tmp_path: Path, server: FakeOpenAI) -> None:
    server.script(Completion(text="streamed answer"))
    seen: list[str] = []

    async def handler(ctx: Any, events: Any) -> None:
        async for event in events:
            seen.append(type(event).__name__)

    with JixuAgent(Agent(_openai(server), name="streaming"), tmp_path / "jixu.db") as durable:
        thread_id = durable.new_thread_sync()
        result = durable.run_sync("Stream it.", thread_id=thread_id, event_stream_handler=handler)
    assert result.output == "streamed answer"
    assert server.bodies[0].get("stream") is True
    assert "PartStartEvent" in seen


def test_declarations_are_checked_when_made(tmp_path: Path) -> None:
    agent = Agent(FunctionModel(_call_then_echo("noop", {})), name="checked")

    @agent.tool_plain
    def noop() -> str:
        return "ok"

    with pytest.raises(ToolDefinitionError):
        JixuAgent(agent, tmp_path / "a.db", tool_semantics={"noop": "read_only"}, probes={"noop": lambda q: None})
    with pytest.raises(InvalidInput):
        JixuAgent(agent, tmp_path / "b.db", tool_semantics={"noop": "sometimes"})  # type: ignore[dict-item]
    with pytest.raises(InvalidInput):
        current_effect()
    with pytest.raises(InvalidInput, match="recorded model response"):
        load_response({})
    # A misspelt tool name would leave the real tool undeclared (unsafe, no probe) without a word: a run, which
    # knows every tool it offers (the agent's, added since, its own toolsets'), refuses it before anything runs.
    with JixuAgent(agent, tmp_path / "c.db", tool_semantics={"nop": "read_only"}) as durable:
        thread_id = durable.new_thread_sync()
        with pytest.raises(InvalidInput, match=r"'nop'.*its tools: 'noop'") as unknown:
            durable.run_sync("hello", thread_id=thread_id)
        assert unknown.value.details["field"] == "tool_semantics"
        assert [e.type for e in ThreadLog.load(durable.harness.store, thread_id).events()] == ["thread.created"]
    with JixuAgent(agent, tmp_path / "d.db", probes={"noop_": lambda q: None}) as durable, \
            pytest.raises(InvalidInput, match="probes names no tool"):
        durable.run_sync("hello", thread_id=durable.new_thread_sync())


def test_a_declaration_may_name_a_tool_the_run_brings_or_one_added_since(tmp_path: Path) -> None:
    """The review of the check above: a tool of the run's own toolsets, or one added to the agent after the
    JixuAgent was made, is declared by name as before."""
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"found {key}"

    agent = Agent(FunctionModel(_call_then_echo("lookup", {"key": "k"})), name="declared")
    url = f"sqlite:///{tmp_path / 'a.db'}"
    with JixuAgent(agent, url, tool_semantics={"lookup": "read_only", "later": "idempotent"}) as durable:

        @agent.tool_plain
        def later() -> str:
            """Added after the JixuAgent."""
            return "later"

        thread_id = durable.new_thread_sync()
        result = durable.run_sync("go", thread_id=thread_id, toolsets=[FunctionToolset([lookup])])
        assert result.output == "found k"
        intents = [e.data for e in ThreadLog.load(durable.harness.store, thread_id).events()
                   if e.type == "tool.requested" and e.data["name"] != MODEL_STEP]
        assert [(i["name"], i["semantics"]) for i in intents] == [("lookup", "read_only")]


def test_a_run_without_a_thread_id_is_refused_and_records_nothing(tmp_path: Path) -> None:
    """``thread_id=None`` ran on a new thread whose id the caller never learnt: after a crash it could not be
    continued."""
    agent = Agent(FunctionModel(_call_then_echo("noop", {})), name="unkept")
    with JixuAgent(agent, tmp_path / "a.db") as durable, pytest.raises(InvalidInput, match="new_thread"):
        durable.run_sync("hello", thread_id=None)  # type: ignore[arg-type]
    with open_store(f"sqlite:///{tmp_path / 'a.db'}") as store:
        assert store.list_streams("thread/", after="", limit=10) == []


def test_importing_without_pydantic_ai_names_the_extra_to_install() -> None:
    code = ("import sys; sys.modules['pydantic_ai'] = None\n"
            "try:\n    import jixu.integrations.pydantic_ai\nexcept ImportError as e:\n    print(e)")
    proc = subprocess.run([sys.executable, "-c", code], env=python_env(), cwd=ROOT, text=True, capture_output=True,
                          timeout=60, check=False)
    assert 'pip install "jixu[pydantic-ai]"' in proc.stdout, proc.stdout + proc.stderr


def test_the_example_runs_offline_and_shows_a_crash_settled_without_a_second_charge(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "pydantic_ai_durable.py")], env=python_env(),
                          cwd=tmp_path, text=True, capture_output=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "killed inside charge" in out and "charge unknown" in out, out
    assert "charges in the bank: 1" in out, out
    assert "answer: Charged order 7" in out, out


# --- helpers ---------------------------------------------------------------------------------


def _payments(url: str, ran: list[int]) -> JixuAgent:
    """An agent whose ``wire`` tool needs approval (pydantic-ai's ``requires_approval=True``)."""
    agent = Agent(FunctionModel(_call_then_echo("wire", {"amount": 100})), name="payments")

    @agent.tool_plain(requires_approval=True)
    def wire(amount: int) -> str:
        ran.append(amount)
        return f"wired {amount}"

    return JixuAgent(agent, url, approval_poll=0.02)


def _openai(server: FakeOpenAI) -> Any:
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    return OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=server.url, api_key="sk-test"))


def _call_then_echo(tool: str, args: dict[str, Any]) -> Any:
    """A FunctionModel's function: call ``tool`` until it returned, then answer with what it returned."""

    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart) and p.outcome != "retried"]
        if returns:
            return ModelResponse(parts=[TextPart(str(returns[-1].content))])
        return ModelResponse(parts=[ToolCallPart(tool, args, tool_call_id=f"call_{len(messages)}")])

    return respond



def _charging_agent(server: FakeOpenAI, charges: list[int]) -> Agent[None, str]:
    """An agent whose model asks to charge order 7 once, then says it is charged; the charges land in ``charges``."""
    server.script(CHARGE, DONE)
    agent = Agent(_openai(server), name="orders")

    @agent.tool_plain
    @effect(semantics="unsafe")
    def charge(order: int) -> str:
        charges.append(order)
        return f"charged {order}"

    return agent


def test_a_keyed_run_that_ended_is_replayed_by_the_same_call_without_asking_or_charging_again(
        tmp_path: Path, server: FakeOpenAI) -> None:
    """The code crashed after its run ended, before it learnt so (decision 0051): the same call with the run key
    returns the recorded result; without the key it would have been the thread's next run, charging again."""
    charges: list[int] = []
    agent = _charging_agent(server, charges)

    with JixuAgent(agent, tmp_path / "jixu.db") as durable:
        thread_id = durable.new_thread_sync()
        first = durable.run_sync("Charge order 7.", thread_id=thread_id, run_key="order-7")
        log, store = _events(f"sqlite:///{tmp_path / 'jixu.db'}", thread_id)
        recorded = [(e.type, e.seq) for e in log.events()]
        store.close()
        again = durable.run_sync("Charge order 7.", thread_id=thread_id, run_key="order-7")
    assert again.output == first.output == "Order 7 is charged."
    assert charges == [7] and len(server.requests) == 2, "no model request and no charge on the replay"
    log, store = _events(f"sqlite:///{tmp_path / 'jixu.db'}", thread_id)
    try:
        assert [(e.type, e.seq) for e in log.events()] == recorded, "the replay appended nothing"
    finally:
        store.close()


@pytest.mark.parametrize("finish", ["length", "content_filter"])
def test_tool_calls_of_an_answer_the_model_did_not_finish_are_never_run(tmp_path: Path, server: FakeOpenAI,
                                                                        finish: str) -> None:
    """An answer cut off at the token limit (or stopped by a filter) asks for an unsafe charge whose arguments
    look whole: none is run, as in a jixu agent (pydantic-ai itself would run it), and the run fails with a
    typed error naming the stop reason; running it again meets the same recorded answer and still charges
    nothing."""
    from jixu.errors import ModelError

    server.script(Completion(calls=[Call("call_charge_7", "charge", '{"order": 7}')], stop=finish))
    agent = Agent(_openai(server), name="orders")
    charged: list[int] = []

    @agent.tool_plain
    @effect(semantics="unsafe")
    def charge(order: int) -> str:
        charged.append(order)
        return f"charged {order}"

    with JixuAgent(agent, tmp_path / "jixu.db") as durable:
        thread_id = durable.new_thread_sync()
        for _ in range(2):
            with pytest.raises(ModelError) as raised:
                durable.run_sync("Charge order 7.", thread_id=thread_id)
            assert raised.value.kind == "output_truncated" and "none was run" in raised.value.message
    assert charged == [] and len(server.requests) == 1, "asked once, replayed once, charged never"


RENAMING_APP = r"""
import os, signal, sys
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from jixu.integrations.pydantic_ai import JixuAgent, current_effect

version, url, bank, thread_file = sys.argv[1:5]


def model(messages, info):  # does what the tools offered and the errors say
    parts = [part for message in messages for part in message.parts]
    names = [tool.name for tool in info.function_tools]
    if any(isinstance(p, ToolReturnPart) for p in parts):
        return ModelResponse(parts=[TextPart("charged")])
    call_id = "c7b" if any(isinstance(p, RetryPromptPart) for p in parts) else "c7"
    return ModelResponse(parts=[ToolCallPart(names[0], {"order": 7}, tool_call_id=call_id)])


agent = Agent(FunctionModel(model), name="shop")


def pay(order: int) -> str:
    with open(bank, "a") as out:
        out.write(f"charge {order} {current_effect().idempotency_key}\n")
    if version == "v1":
        os.kill(os.getpid(), signal.SIGKILL)  # between the side effect and its receipt
    return "ok"


agent.tool_plain(name="charge" if version == "v1" else "charge_order")(pay)  # v2 of the app renamed the tool
durable = JixuAgent(agent, url)
if version == "v1":
    thread_id = durable.new_thread_sync()
    open(thread_file, "w").write(thread_id)
else:
    thread_id = open(thread_file).read()
print("output:", durable.run_sync("Charge order 7", thread_id=thread_id).output, flush=True)
"""


def test_a_tool_renamed_after_a_crash_is_a_step_mismatch_not_a_second_charge(tmp_path: Path) -> None:
    """The rerun offered the model a renamed tool: pydantic-ai told it the recorded call's tool was unknown, the
    model called the renamed one and the order was charged twice, the run ending ``completed`` with its first call
    still unknown. The tools offered are part of a request's record now: the rerun stops with a mismatch."""
    url, bank, thread_file = f"sqlite:///{tmp_path / 'shop.db'}", tmp_path / "bank.log", tmp_path / "thread"
    args = [url, str(bank), str(thread_file)]
    crashed = subprocess.run([sys.executable, "-c", RENAMING_APP, "v1", *args], check=False, env=python_env(),
                             cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    rerun = subprocess.run([sys.executable, "-c", RENAMING_APP, "v2", *args], check=False, env=python_env(),
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert rerun.returncode != 0 and "StepMismatch" in rerun.stderr, (rerun.stdout, rerun.stderr)
    assert len(lines(bank)) == 1, "the order was charged once"


def test_a_request_recorded_before_the_tools_were_part_of_its_record_still_replays(
        tmp_path: Path, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run recorded by a version whose request record had no ``tools`` replays without a mismatch."""
    from jixu.integrations import pydantic_ai as integration

    charges: list[int] = []
    agent = _charging_agent(server, charges)

    current = integration.request_args
    with JixuAgent(agent, tmp_path / "jixu.db") as durable:
        thread_id = durable.new_thread_sync()
        monkeypatch.setattr(integration, "request_args",
                            lambda model, messages, parameters=None: current(model, messages))
        first = durable.run_sync("Charge order 7.", thread_id=thread_id, run_key="order-7")
        monkeypatch.setattr(integration, "request_args", current)
        again = durable.run_sync("Charge order 7.", thread_id=thread_id, run_key="order-7")
    assert again.output == first.output == "Order 7 is charged."
    assert charges == [7] and len(server.requests) == 2
    log, store = _events(f"sqlite:///{tmp_path / 'jixu.db'}", thread_id)
    try:
        assert all("tools" not in e.data["args"] for e in log.events() if e.type == "tool.requested"
                   and e.data.get("name") == MODEL_STEP)
    finally:
        store.close()


def _shop(tmp_path: Path) -> tuple[Path, Agent[Any, Any], Any, Any]:
    """An empty bank file, an agent whose model asks to charge order 7 once and then reports the tool's answer, the
    bank's probe (occurred when a line carries the call's idempotency key) and the slow sync ``charge`` (0.8 s, its
    line written at the end), not yet registered as a tool."""
    bank = tmp_path / "bank.log"
    bank.write_text("")

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [part for message in messages for part in message.parts if isinstance(part, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart(f"Done: {returns[-1].content}")])
        return ModelResponse(parts=[ToolCallPart("charge", {"order": 7}, tool_call_id="c7")])

    def find_charge(query: ProbeQuery) -> Occurred | NotOccurred:
        if query.idempotency_key in bank.read_text():
            return Occurred(result="found", evidence={})
        return NotOccurred(evidence={})


    def charge(order: int) -> str:
        """Charge an order (a slow payment API)."""
        key = current_effect().idempotency_key
        time.sleep(0.8)
        with bank.open("a") as out:
            out.write(f"{order} {key}\n")
        return f"charged {order}"

    return bank, Agent(FunctionModel(model), name="shop"), find_charge, charge


def test_a_sync_tool_past_its_timeout_is_probed_once_it_returned_and_charged_once(tmp_path: Path) -> None:
    """pydantic-ai runs a sync tool in a worker thread of its own: past its ``timeout=`` the call went on there, its
    probe was asked at once, answered ``not_occurred``, and the tool was called again each time: three charges in
    one run. The tool's thread now counts as its call in flight until it returns."""
    bank, agent, find_charge, charge = _shop(tmp_path)
    agent.tool_plain(effect(semantics="unsafe", probe=find_charge, timeout=0.2)(charge))

    async def main() -> str:
        durable = JixuAgent(agent, tmp_path / "shop.db")
        try:
            thread_id = await durable.new_thread()
            return str((await durable.run("Charge order 7.", thread_id=thread_id)).output)
        finally:
            durable.close()

    assert asyncio.run(main()) == "Done: found"
    assert len(lines(bank)) == 1


def test_a_sync_tool_declared_by_name_cut_off_by_a_cancelled_run_is_probed_once_it_returned(tmp_path: Path) -> None:
    """A tool declared only by ``tool_semantics=`` / ``probes=`` (no ``@effect``) ran in pydantic-ai's own thread,
    unseen: after ``asyncio.wait_for`` cut the run off, the documented rerun asked the probe while the charge still
    slept in its thread, was told ``not_occurred`` and charged a second time. pydantic-ai's sync tools now run on
    jixu's call-tracking executor."""
    bank, agent, find_charge, charge = _shop(tmp_path)
    agent.tool_plain(charge)

    async def main() -> str:
        durable = JixuAgent(agent, tmp_path / "shop.db", tool_semantics={"charge": "unsafe"},
                            probes={"charge": find_charge})
        try:
            thread_id = await durable.new_thread()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(durable.run("Charge order 7.", thread_id=thread_id), 0.3)
            return str((await durable.run("Charge order 7.", thread_id=thread_id)).output)
        finally:
            durable.close()

    assert asyncio.run(main()) == "Done: found"
    assert len(lines(bank)) == 1, "charged once"


@pytest.mark.parametrize("declared", ["tool", "prefixed-toolset"])
def test_an_unsafe_tools_pydantic_ai_timeout_leaves_its_call_unknown_and_the_model_never_retries_it(
        tmp_path: Path, declared: str) -> None:
    """pydantic-ai's tool ``timeout=`` answered the model "Timed out, retry" about a call that had acted (recorded
    as a completed step); the model called again under a new key: two charges. The timeout is now the step's:
    the run stops with the call unknown, for its probe or an operator. A ``FunctionToolset(timeout=...)`` under
    ``.prefixed()`` (or any wrapper) was missed at first: the wrapper has no timeout of its own."""
    from pydantic_ai.toolsets import FunctionToolset

    bank = tmp_path / "bank.log"
    bank.write_text("")
    requests: list[int] = []
    name = "charge" if declared == "tool" else "pay_charge"

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        requests.append(len(messages))
        calls = sum(isinstance(part, ToolCallPart) for message in messages for part in message.parts)
        if calls < 2:
            return ModelResponse(parts=[ToolCallPart(name, {"order": 7}, tool_call_id=f"c{calls}")])
        return ModelResponse(parts=[TextPart("charged twice")])

    async def charge(order: int) -> str:
        """Charge an order (the payment API answers late)."""
        with bank.open("a") as out:
            out.write(f"{order} {current_effect().idempotency_key}\n")
        await asyncio.sleep(1)
        return f"charged {order}"

    if declared == "tool":
        agent = Agent(FunctionModel(model), name="shop")
        agent.tool_plain(timeout=0.2)(charge)
    else:
        toolset: FunctionToolset[Any] = FunctionToolset(timeout=0.2)
        toolset.tool_plain(charge)
        agent = Agent(FunctionModel(model), name="shop", toolsets=[toolset.prefixed("pay")])

    async def main() -> None:
        durable = JixuAgent(agent, tmp_path / "shop.db", tool_semantics={name: "unsafe"})
        try:
            thread_id = await durable.new_thread()
            with pytest.raises(StepOutcomeUnknown):
                await durable.run("Charge order 7.", thread_id=thread_id)
        finally:
            durable.close()

    asyncio.run(main())
    assert len(lines(bank)) == 1, "charged once"
    assert len(requests) == 1, "the model was not told of a timeout"


def test_a_sibling_failing_leaves_the_run_unfinished_while_a_call_of_it_is_unknown(tmp_path: Path) -> None:
    """An audit: `charge` (async, unsafe, timeout 0.2, probe) went on past its timeout; `lookup`, asked in the same
    response, failed, pydantic-ai cancelled `charge`, and the run was ended `failed` with `charge` unknown: the
    next run on the thread asked the model again and charged again (two charges). A run does not end while a step
    of it is unknown: the next run continues it (its probe, if it gets to ask, finds the charge; else the thread
    waits for an operator), and never asks the model for the charge again."""
    bank = tmp_path / "bank.log"
    bank.write_text("")
    broken = {"lookup": True}

    def find(query: ProbeQuery) -> Occurred | NotOccurred:
        found = query.idempotency_key in bank.read_text()
        return Occurred(result="charged 7", evidence={}) if found else NotOccurred(evidence={})

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if returns:
            return ModelResponse(parts=[TextPart("Done: " + ", ".join(str(r.content) for r in returns))])
        return ModelResponse(parts=[ToolCallPart("charge", {"order": 7}, tool_call_id="c1"),
                                    ToolCallPart("lookup", {"order": 7}, tool_call_id="c2")])

    agent = Agent(FunctionModel(model), name="shop")

    @agent.tool_plain
    @effect(semantics="unsafe", probe=find, timeout=0.2)
    async def charge(order: int) -> str:
        """Charge an order (the payment system charges 0.6 s after the request, whatever its client does)."""
        key = current_effect().idempotency_key

        def land() -> None:
            with bank.open("a") as out:
                out.write(f"{order} {key}\n")

        asyncio.get_running_loop().call_later(0.6, land)
        await asyncio.sleep(0.65)
        return f"charged {order}"

    @agent.tool_plain
    @effect(semantics="read_only")
    async def lookup(order: int) -> str:
        """Look an order up."""
        await asyncio.sleep(0.3)
        if broken["lookup"]:
            raise RuntimeError("lookup service down")  # (a jixu.ToolError is told to the model: no failure)
        return "found"

    async def main() -> tuple[str, str]:
        durable = JixuAgent(agent, tmp_path / "shop.db")
        try:
            thread_id = await durable.new_thread()
            with pytest.raises(StepOutcomeUnknown, match=r"lookup"):
                await durable.run("Charge order 7.", thread_id=thread_id)
            first = [e.type for e in ThreadLog.load(durable.harness.store, thread_id).events()]
            await asyncio.sleep(0.8)  # the payment system's charge has landed
            broken["lookup"] = False
            with pytest.raises((StepFailed, StepOutcomeUnknown)):  # the lookup's recorded failure replays
                await durable.run("Charge order 7.", thread_id=thread_id)
            events = ThreadLog.load(durable.harness.store, thread_id).events()
            return ",".join(first), [(e.type, e.data.get("name")) for e in events]
        finally:
            durable.close()

    first, events = asyncio.run(main())
    assert "turn.ended" not in first, "the run ended while its charge was unknown"
    assert len(bank.read_text().splitlines()) == 1, bank.read_text()
    assert [t for t, _name in events].count("turn.started") == 1, "a new run started beside the unfinished one"
    assert events.count(("tool.requested", "charge")) == 1, "the charge was asked for again"


def test_a_def_sibling_that_completes_while_another_call_fails_keeps_its_result(tmp_path: Path) -> None:
    """An audit: `boom` (unsafe, raises after acting) and `slow_sync` (a plain `def`, 0.5 s) asked at once;
    pydantic-ai cancelled `slow_sync` when `boom` raised, and its step recorded it interrupted (unknown) while its
    thread went on and returned "sync ok", which the run waited for and dropped: an operator had to settle a call
    that completed. The failing step now waits for its siblings in threads first."""
    ended: list[str] = []

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return ModelResponse(parts=[ToolCallPart("boom", {}, tool_call_id="b1"),
                                    ToolCallPart("slow_sync", {}, tool_call_id="s1")])

    agent = Agent(FunctionModel(model), name="siblings")

    @agent.tool_plain
    async def boom() -> str:
        """Act, then fail without an answer."""
        await asyncio.sleep(0.05)
        raise ConnectionResetError("the server hung up after acting")

    @agent.tool_plain
    def slow_sync() -> str:
        """Take a while, then answer."""
        time.sleep(0.5)
        ended.append("sync ok")
        return "sync ok"

    url = f"sqlite:///{tmp_path / 'jixu.db'}"
    with JixuAgent(agent, url) as durable:
        thread_id = durable.new_thread_sync()
        with pytest.raises(StepOutcomeUnknown, match="boom"):
            durable.run_sync("Go.", thread_id=thread_id)
    assert ended == ["sync ok"]
    log, store = _events(url, thread_id)
    try:
        decisions = {d.name: d for d in RecoveryResolver.analyze(log.events()).decisions.values()}
        assert decisions["boom"].state == "unknown"
        assert (decisions["slow_sync"].state, decisions["slow_sync"].reason) == ("completed", "succeeded")
        [completed] = [e for e in log.events() if e.type == "tool.completed"
                       and e.data["effect_id"] == decisions["slow_sync"].effect_id]
        assert "sync ok" in json.dumps(completed.data["result"])
    finally:
        store.close()


def test_an_output_function_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """An audit: with `output_type=send_email`, a SIGKILL while `send_email` ran and the rerun sent the mail twice:
    pydantic-ai calls an output function outside the agent's toolsets, so no step records it, and the rerun
    replayed the model's answer and called it again. It is refused (make it a tool), by the agent and by a run."""
    from pydantic_ai import NativeOutput, TextOutput, ToolOutput

    def send_email(to: str) -> str:
        """Send a mail."""
        return f"sent to {to}"

    def echo(text: str) -> str:
        return text

    for spec in (send_email, [str, ToolOutput(send_email)], TextOutput(echo), NativeOutput([send_email])):
        with pytest.raises(InvalidInput, match="nothing would record that call"):
            JixuAgent(Agent(FunctionModel(_call_then_echo("noop", {})), output_type=spec), tmp_path / "a.db")
    agent = Agent(FunctionModel(_call_then_echo("noop", {})), name="plain")
    with JixuAgent(agent, tmp_path / "b.db") as durable:
        thread_id = durable.new_thread_sync()
        with pytest.raises(InvalidInput, match="'send_email'"):
            durable.run_sync("mail ada", thread_id=thread_id, output_type=send_email)
        assert [e.type for e in ThreadLog.load(durable.harness.store, thread_id).events()] == ["thread.created"]
    assert not (tmp_path / "a.db").exists()


def test_an_unsafe_tool_whose_return_cannot_be_recorded_says_so_and_stays_unknown(tmp_path: Path,
                                                                                server: FakeOpenAI) -> None:
    """An audit: an unsafe tool that returned a value pydantic-ai cannot serialize was an outcome "unknown" and the
    error said nothing of why. It stays unknown (the call returned: its effect happened, its result is lost), and
    the error names the value that cannot be recorded; the tool ran once."""
    url = f"sqlite:///{tmp_path / 'jixu.db'}"
    calls: list[int] = []
    agent = Agent(_openai(server), name="shop")

    @agent.tool_plain
    def charge(order: int) -> dict[str, Any]:
        """Charge an order."""
        calls.append(order)
        return {"charged": order, "handle": object()}

    server.script(CHARGE)
    with JixuAgent(agent, url) as durable:
        thread_id = durable.new_thread_sync()
        with pytest.raises(StepOutcomeUnknown) as unknown:
            durable.run_sync(PROMPT, thread_id=thread_id)
    assert calls == [7]
    assert "cannot be recorded as JSON" in unknown.value.message, unknown.value.message
    log, store = _events(url, thread_id)
    try:
        [failed] = [e for e in log.events() if e.type == "tool.failed"]
        assert failed.data["indeterminate"] is True and "cannot be recorded" in str(failed.data["error"])
    finally:
        store.close()
