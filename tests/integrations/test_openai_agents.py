"""An unchanged OpenAI Agents SDK agent run durably by ``jixu.integrations.openai_agents`` (decision 0033).

The agents are real ``agents.Agent`` objects run by the real SDK; their model is the SDK's own
``OpenAIChatCompletionsModel`` (or ``OpenAIResponsesModel``) talking to a fake server that speaks the OpenAI wire
format (``tests/providers/fake_servers.py``), so every request a test counts is one the SDK really sent. The
SIGKILL tests kill a child process (``openai_agents_child.py``) inside the unsafe tool, after or before its side
effect (a line in a file), and run the agent again in this process: the file says what really ran.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agents import (
    Agent,
    ModelSettings,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    OpenAIResponsesModel,
    RunConfig,
    RunContextWrapper,
    SQLiteSession,
    function_tool,
    handoff,
)
from agents.models.interface import Model, ModelTracing
from agents.tool import LocalShellTool, default_tool_error_function
from openai import AsyncOpenAI, InternalServerError

from jixu import InvalidInput, RecoveryResolver, StepFailed, StepMismatch, StepOutcomeUnknown, ToolError
from jixu.errors import ToolDefinitionError
from jixu.integrations.openai_agents import (
    DurableRunner,
    ToolPolicy,
    current_effect,
    dump_model_response,
    durable_tool,
    load_model_response,
)
from jixu.ledger import open_store
from jixu.threads.log import ThreadLog
from jixu.threads.steps import OCCURRED_WITHOUT_RESULT
from tests.helpers import ROOT, python_env
from tests.integrations.openai_agents_child import DONE, HELLO, INPUT, boss, lines, runner, writer
from tests.providers.fake_servers import Call, Completion, Failure, FakeOpenAI, FakeResponses, Thinking

CHILD_TIMEOUT = 60.0
SERVER_ERROR = Failure(500, {"error": {"message": "overloaded", "type": "server_error"}})


@pytest.fixture
def openai_server() -> Any:
    server = FakeOpenAI().start()
    yield server
    server.stop()


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'jixu.db'}"


def _log(url: str, thread_id: str) -> ThreadLog:
    return ThreadLog.load(open_store(url), thread_id, verify=True)


def _steps(log: ThreadLog) -> list[str]:
    return [str(e.data["step"]) for e in log.events() if e.type == "tool.requested"]


def _effect(log: ThreadLog, step: str) -> str:
    [found] = [e.data["effect_id"] for e in log.events() if e.type == "tool.requested" and e.data["step"] == step]
    return str(found)


def _tool_messages(body: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in body["messages"] if m.get("role") == "tool"]


def _crash(mode: str, url: str, directory: Path) -> str:
    """Run the child until it SIGKILLs itself inside ``append_line``; the thread id it reported."""
    proc = subprocess.run([sys.executable, "-m", "tests.integrations.openai_agents_child", mode, url, str(directory)],
                          env=python_env(), cwd=ROOT, text=True, capture_output=True, timeout=CHILD_TIMEOUT,
                          check=False)
    assert proc.returncode == -signal.SIGKILL, f"the child exited {proc.returncode}: {proc.stderr[-3000:]}"
    [thread_id] = [line.split()[1] for line in proc.stdout.splitlines() if line.startswith("T ")]
    return thread_id


def _after_the_kill(url: str, thread_id: str) -> str:
    """What the dead child left: the first model call completed, the tool call dispatched without a receipt."""
    log = _log(url, thread_id)
    analysis = RecoveryResolver.analyze(log.events())
    assert _steps(log) == ["model#1", "append_line:call_hello#1"]
    model, tool = _effect(log, "model#1"), _effect(log, "append_line:call_hello#1")
    assert analysis.decisions[model].state == "completed"
    assert analysis.decisions[tool].state == "unknown", analysis.decisions[tool]
    assert analysis.decisions[tool].reason == "dispatched_without_receipt"
    assert log.snapshot().status == "waiting"
    return tool


# --- SIGKILL between the side effect and its receipt ----------------------------------------------------------


@pytest.mark.crash
def test_killed_after_the_unsafe_tool_ran_the_call_is_unknown_the_probe_settles_it_and_it_never_runs_twice(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    url = _url(tmp_path)
    thread_id = _crash("after", url, tmp_path)
    assert len(lines(tmp_path / "lines.log")) == 1
    tool = _after_the_kill(url, thread_id)

    openai_server.script(DONE)
    result = runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, thread_id=thread_id)

    assert result.final_output == "wrote it"
    assert len(lines(tmp_path / "lines.log")) == 1, "the unsafe tool ran exactly once"
    [request] = openai_server.bodies  # the first model call was replayed from its record, not sent again
    assert _tool_messages(request) == ["line 1 written"], "the model got the probe's result as the tool output"
    log = _log(url, thread_id)
    events = log.events()
    assert [e.data["attempt"] for e in events if e.type == "tool.dispatched" and e.data["effect_id"] == tool] == [1]
    [resolved] = [e for e in events if e.type == "tool.outcome_resolved"]
    assert (resolved.data["effect_id"], resolved.data["resolution"], resolved.data["actor"]) == (
        tool, "occurred", "probe:append_line")
    assert _steps(log) == ["model#1", "append_line:call_hello#1", "model#2"]
    assert [e.data["reason"] for e in events if e.type == "turn.claimed"] == ["took_over_dead_owner"]
    [ended] = [e for e in events if e.type == "turn.ended"]
    assert ended.data == {**ended.data, "outcome": "completed", "reply": "wrote it"}
    assert log.snapshot().status == "idle"


@pytest.mark.crash
@pytest.mark.parametrize("given", ["line 1 written", None], ids=["with-its-result", "without-a-result"])
def test_without_a_probe_the_unknown_call_stops_the_agent_until_an_operator_resolves_it(
        tmp_path: Path, openai_server: FakeOpenAI, given: str | None) -> None:
    """Resolved ``occurred`` without a result (an audit), the model is told the call happened, not ``None``: told
    ``None``, a model may well make the call again."""
    url = _url(tmp_path)
    thread_id = _crash("after", url, tmp_path)
    tool = _after_the_kill(url, thread_id)

    with pytest.raises(StepOutcomeUnknown) as raised:
        runner(url, tmp_path, probe=False).run_sync(writer(openai_server.url, tmp_path), INPUT, thread_id=thread_id)
    assert raised.value.details["effect_id"] == tool
    assert f"jixu threads resolve STORE {thread_id} {tool}" in raised.value.message
    assert len(lines(tmp_path / "lines.log")) == 1 and openai_server.requests == []

    # The operator looked at the file: the line is there.
    _log(url, thread_id).resolve(tool, "occurred", note="the line is in the file", result=given, actor="ops")
    openai_server.script(DONE)
    result = runner(url, tmp_path, probe=False).run_sync(writer(openai_server.url, tmp_path), INPUT,
                                                         thread_id=thread_id)

    assert result.final_output == "wrote it"
    assert len(lines(tmp_path / "lines.log")) == 1
    assert _tool_messages(openai_server.bodies[0]) == [given or OCCURRED_WITHOUT_RESULT]
    assert _log(url, thread_id).snapshot().status == "idle"


@pytest.mark.crash
def test_killed_before_the_side_effect_the_probe_finds_nothing_and_the_tool_runs_once_under_a_new_effect(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    url = _url(tmp_path)
    thread_id = _crash("before", url, tmp_path)
    assert lines(tmp_path / "lines.log") == []
    first = _after_the_kill(url, thread_id)

    openai_server.script(DONE)
    result = runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, thread_id=thread_id)

    assert result.final_output == "wrote it"
    [line] = lines(tmp_path / "lines.log")
    log = _log(url, thread_id)
    intents = [e.data for e in log.events() if e.type == "tool.requested" and e.data["name"] == "append_line"]
    assert len(intents) == 2 and intents[0]["effect_id"] == first
    assert line == f"hello key={intents[1]['idempotency_key']}", "the tool saw its effect's idempotency key"
    assert log.snapshot().effects[first].resolution["resolution"] == "not_occurred"  # type: ignore[index]


# --- the record, replay and mismatches -----------------------------------------------------------------------


def test_every_model_and_tool_call_is_an_effect_and_a_failed_model_call_is_asked_again_on_the_rerun(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    url = _url(tmp_path)
    openai_server.script(HELLO, SERVER_ERROR)
    found: list[str] = []
    with pytest.raises(InternalServerError):  # the SDK sees the model's own error, as without jixu
        runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, started=found.append)
    [thread_id] = found
    log = _log(url, thread_id)
    assert [(e.type, e.data.get("name")) for e in log.events()[2:]] == [
        ("tool.requested", "model"), ("tool.dispatched", "model"), ("tool.completed", None),
        ("tool.requested", "append_line"), ("tool.dispatched", "append_line"), ("tool.completed", None),
        ("tool.requested", "model"), ("tool.dispatched", "model"), ("tool.failed", None)]
    assert len(lines(tmp_path / "lines.log")) == 1 and len(openai_server.requests) == 2

    openai_server.script(DONE)
    result = runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, thread_id=thread_id)

    assert result.final_output == "wrote it"
    assert len(lines(tmp_path / "lines.log")) == 1, "the completed tool call returned its recorded output"
    assert len(openai_server.requests) == 3, "only the failed model call was asked again"
    assert openai_server.bodies[2]["messages"] == openai_server.bodies[1]["messages"], "the same request"
    assert _steps(_log(url, thread_id)) == ["model#1", "append_line:call_hello#1", "model#2", "model#2.2"]


def test_a_responses_model_with_reasoning_replays_and_the_retried_request_is_the_same(tmp_path: Path) -> None:
    server = FakeResponses().start()
    try:
        def responses_writer() -> Agent[Any]:
            agent = writer(server.url, tmp_path)
            client = AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
            return agent.clone(model=OpenAIResponsesModel(model="o4-mini", openai_client=client))

        server.script(Completion(thinking=[Thinking("the user wants a line")], calls=HELLO.calls), SERVER_ERROR)
        found: list[str] = []
        with pytest.raises(InternalServerError):
            runner(_url(tmp_path), tmp_path).run_sync(responses_writer(), INPUT, started=found.append)
        server.script(DONE)
        result = runner(_url(tmp_path), tmp_path).run_sync(responses_writer(), INPUT, thread_id=found[0])
    finally:
        server.stop()

    assert result.final_output == "wrote it" and len(lines(tmp_path / "lines.log")) == 1
    failed, retried = server.bodies[1], server.bodies[2]
    assert retried == failed, "the rebuilt reasoning and call items are sent back exactly as the first time"
    assert [item.get("type") for item in retried["input"]][1:3] == ["reasoning", "function_call"]


def test_a_harness_of_yours_records_the_runs_under_its_agent(tmp_path: Path, openai_server: FakeOpenAI) -> None:
    from jixu import Harness
    from jixu.threads.steps import steps_agent

    harness = Harness(steps_agent("sdk-agents"), _url(tmp_path))
    try:
        openai_server.script(HELLO, DONE)
        found: list[str] = []
        result = DurableRunner(harness).run_sync(writer(openai_server.url, tmp_path), INPUT, started=found.append)
        assert result.final_output == "wrote it"
        assert _log(_url(tmp_path), found[0]).state.agent["name"] == "sdk-agents"
        with pytest.raises(InvalidInput, match="lease_ttl"):
            DurableRunner(harness, lease_ttl=5)
    finally:
        harness.close()


def test_a_run_that_would_fail_again_ends_failed_and_the_thread_takes_the_next_run(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    """MaxTurnsExceeded would meet every rerun (the steps replay): the run is recorded failed, not left
    unfinished to lock its thread; the next call on the thread is a new run."""
    from agents.exceptions import MaxTurnsExceeded

    url = _url(tmp_path)
    openai_server.script(HELLO, HELLO)
    found: list[str] = []
    with pytest.raises(MaxTurnsExceeded):
        runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, started=found.append,
                                       max_turns=1)
    log = _log(url, found[0])
    [ended] = [e.data for e in log.events() if e.type == "turn.ended"]
    assert ended["outcome"] == "failed" and ended["error"]["type"] == "MaxTurnsExceeded", ended
    assert log.snapshot().status != "waiting"
    openai_server.script(DONE)
    result = runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), "Say done", thread_id=found[0])
    assert result.final_output == "wrote it"
    assert [e.data["outcome"] for e in _log(url, found[0]).events() if e.type == "turn.ended"] == ["failed",
                                                                                                  "completed"]


def test_a_response_naming_no_tool_of_the_agent_ends_the_run_failed_and_the_thread_takes_the_next_run(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    """Found by an audit: the SDK's ModelBehaviorError for a recorded response naming an unknown tool met every
    rerun (the response replays), so the run stayed unfinished and the thread took no other input, for good."""
    from agents.exceptions import ModelBehaviorError

    url = _url(tmp_path)
    openai_server.script(Completion(calls=[Call("call_nope", "nope", "{}")]))
    found: list[str] = []
    with pytest.raises(ModelBehaviorError):
        runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, started=found.append)
    [ended] = [e.data for e in _log(url, found[0]).events() if e.type == "turn.ended"]
    assert ended["outcome"] == "failed" and ended["error"]["type"] == "ModelBehaviorError", ended
    openai_server.script(DONE)
    result = runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), "Say done", thread_id=found[0])
    assert result.final_output == "wrote it"
    assert not lines(tmp_path / "lines.log"), "no tool ran"


def test_a_rerun_that_asks_the_model_something_else_is_a_step_mismatch_and_runs_nothing(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    url = _url(tmp_path)
    openai_server.script(HELLO, SERVER_ERROR)
    found: list[str] = []
    with pytest.raises(InternalServerError):
        runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, started=found.append)

    changed = writer(openai_server.url, tmp_path, instructions="Write what is asked, in capitals.")
    with pytest.raises(StepMismatch) as raised:
        runner(url, tmp_path).run_sync(changed, INPUT, thread_id=found[0])

    assert raised.value.details["step"] == "model#1"
    assert "args_hash" in raised.value.message
    assert len(openai_server.requests) == 2 and len(lines(tmp_path / "lines.log")) == 1, "nothing ran"
    with pytest.raises(StepMismatch):  # another input is another run: refused while this one is unfinished
        runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), "Write goodbye", thread_id=found[0])


def test_a_handoff_is_a_recorded_step_and_a_rerun_replays_it_without_running_on_handoff_again(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    url = _url(tmp_path)
    handed: list[str] = []

    def agents() -> Agent[Any]:
        target = writer(openai_server.url, tmp_path)
        client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
        return Agent(name="triage", instructions="Hand writing to the writer.",
                     model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                     handoffs=[handoff(target, on_handoff=lambda ctx: handed.append("writer"))])

    openai_server.script(Completion(calls=[Call("call_h", "transfer_to_writer", "{}")]), HELLO, SERVER_ERROR)
    found: list[str] = []
    with pytest.raises(InternalServerError):
        runner(url, tmp_path).run_sync(agents(), INPUT, started=found.append)
    assert handed == ["writer"] and len(lines(tmp_path / "lines.log")) == 1

    openai_server.script(DONE)
    result = runner(url, tmp_path).run_sync(agents(), INPUT, thread_id=found[0])

    assert result.final_output == "wrote it" and result.last_agent.name == "writer"
    assert handed == ["writer"], "the recorded handoff was not taken again"
    assert len(lines(tmp_path / "lines.log")) == 1
    log = _log(url, found[0])
    assert _steps(log) == ["model#1", "handoff#1", "model#2", "append_line:call_hello#1", "model#3", "model#3.2"]
    [taken] = [e.data for e in log.events() if e.type == "tool.requested" and e.data["name"] == "handoff"]
    assert (taken["args"]["from"], taken["args"]["to"], taken["semantics"]) == ("triage", "writer", "idempotent")
    [receipt] = [e.data for e in log.events() if e.type == "tool.completed" and e.data["effect_id"] ==
                 taken["effect_id"]]
    assert receipt["result"] == {"agent": "writer"}


@pytest.mark.parametrize("kind", ["chat", "responses"])
def test_a_recorded_model_response_is_rebuilt_exactly(kind: str) -> None:
    server = (FakeOpenAI() if kind == "chat" else FakeResponses()).start()
    try:
        server.script(Completion(text="thinking done", thinking=[Thinking("first I think")] if kind != "chat"
                                 else (), calls=[Call("call_1", "append_line", '{"text": "x"}')]))
        client = AsyncOpenAI(base_url=server.url, api_key="sk-test", max_retries=0)
        model = (OpenAIChatCompletionsModel if kind == "chat" else OpenAIResponsesModel)(
            model="gpt-4o-mini", openai_client=client)
        response = asyncio.run(model.get_response(
            "Be brief.", "hi", ModelSettings(), [], None, [], ModelTracing.DISABLED, previous_response_id=None,
            conversation_id=None, prompt=None))
    finally:
        server.stop()
    recorded = json.loads(json.dumps(dump_model_response(response)))  # as the ledger stores it

    rebuilt = load_model_response(recorded)

    assert rebuilt == response
    assert [type(i) for i in rebuilt.output] == [type(i) for i in response.output]
    assert rebuilt.to_input_items() == response.to_input_items(), "the next request is the same"
    assert len(response.output) >= (2 if kind == "chat" else 3)
    assert dump_model_response(rebuilt) == recorded
    with pytest.raises(InvalidInput):
        load_model_response({**recorded, "output": [{"class": "os:system", "data": {}}]})


def test_a_tool_that_raises_after_its_side_effect_is_unknown_and_an_abandoned_outcome_is_told_to_the_model(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    sent: list[str] = []

    @function_tool(failure_error_function=None)  # the SDK's handler off: the exception reaches jixu
    def send_mail(to: str) -> str:
        """Send a mail."""
        sent.append(to)
        raise ConnectionResetError("the mail server hung up after accepting the mail")

    def mailer() -> Agent[Any]:  # a client per event loop (each run_sync has its own)
        client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
        return Agent(name="mailer", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                     tools=[send_mail])

    url, found = _url(tmp_path), []
    openai_server.script(Completion(calls=[Call("m1", "send_mail", '{"to": "ada"}')]))
    with pytest.raises(StepOutcomeUnknown) as raised:
        DurableRunner(url).run_sync(mailer(), "Mail ada", started=found.append)
    assert isinstance(raised.value.__cause__, ConnectionResetError) and sent == ["ada"]

    _log(url, found[0]).resolve(raised.value.details["effect_id"], "abandoned_unknown", note="cannot tell",
                                actor="ops")
    openai_server.script(DONE)
    result = DurableRunner(url).run_sync(mailer(), "Mail ada", thread_id=found[0])

    assert result.final_output == "wrote it" and sent == ["ada"], "never sent again"
    [told] = _tool_messages(openai_server.bodies[1])
    assert told.startswith("The outcome of this call is unknown")


@pytest.mark.parametrize("formatter", ["default", "custom", "none"])
def test_an_unsafe_tool_raising_tool_error_is_told_to_the_model_as_the_sdk_tells_a_tool_error(
        tmp_path: Path, openai_server: FakeOpenAI, formatter: str) -> None:
    """``jixu.ToolError`` is a determinate failure (the call did no harm): the model is told through the tool's own
    failure formatter, as the SDK tells it any tool error, and the run goes on; its sibling ran once. It used to end
    the run failed, and the same call again then started a new run that repeated the sibling's charge. With the
    SDK's handler off (``failure_error_function=None``) the error is raised, as the SDK raises it."""
    charged: list[str] = []
    sent: list[str] = []
    options: dict[str, Any] = {} if formatter == "default" else {
        "failure_error_function": None if formatter == "none" else (lambda ctx, error: f"mail failed: {error}")}

    @function_tool
    def charge(order: str) -> str:
        """Charge an order."""
        charged.append(order)
        return f"charged {order}"

    @function_tool(**options)
    def send_mail(to: str) -> str:
        """Send a mail."""
        sent.append(to)
        raise ToolError("the mail server refused the message: nothing was sent", code="refused")

    def shop() -> Agent[Any]:
        client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
        return Agent(name="shop", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                     tools=[charge, send_mail])

    url, found = _url(tmp_path), []
    openai_server.script(Completion(calls=[Call("c1", "charge", '{"order": "7"}'),
                                           Call("m1", "send_mail", '{"to": "ada"}')]), DONE)
    if formatter == "none":
        with pytest.raises(StepFailed):
            DurableRunner(url).run_sync(shop(), "Charge 7, mail ada", started=found.append)
        assert charged == ["7"] and sent == ["ada"] and len(openai_server.requests) == 1
        return
    result = DurableRunner(url).run_sync(shop(), "Charge 7, mail ada", started=found.append)
    assert result.final_output == "wrote it" and charged == ["7"] and sent == ["ada"]
    told = dict(zip(["c1", "m1"], _tool_messages(openai_server.bodies[1]), strict=True))
    assert told["c1"] == "charged 7"
    error = ToolError("the mail server refused the message: nothing was sent")
    assert told["m1"] == (default_tool_error_function(None, error) if formatter == "default"  # type: ignore[arg-type]
                          else "mail failed: the mail server refused the message: nothing was sent")
    log = _log(url, found[0])
    [failed] = [e for e in log.events() if e.type == "tool.failed"]
    assert failed.data["error"]["code"] == "refused" and failed.data["indeterminate"] is False
    assert [e.data["outcome"] for e in log.events() if e.type == "turn.ended"] == ["completed"]


# --- approval ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("decision", ["approve", "deny"])
def test_needs_approval_parks_the_call_and_the_operators_decision_resumes_the_agent(
        decision: str, tmp_path: Path, openai_server: FakeOpenAI) -> None:
    url = _url(tmp_path)
    openai_server.script(HELLO, DONE)
    agent = writer(openai_server.url, tmp_path, needs_approval=True)
    found: list[str] = []

    async def go() -> Any:
        task = asyncio.create_task(DurableRunner(url, approval_poll=0.02).run(agent, INPUT, started=found.append))
        parked: list[dict[str, Any]] = []
        for _ in range(500):
            await asyncio.sleep(0.02)
            parked = list(ThreadLog.load(open_store(url), found[0]).snapshot().waiting_on) if found else []
            if parked:
                break
        [call] = parked
        assert call["state"] == "parked" and not task.done() and lines(tmp_path / "lines.log") == []
        command = [sys.executable, "-m", "jixu", "threads", decision, url, found[0], call["effect_id"], "--note",
                   "checked"]
        done = await asyncio.to_thread(subprocess.run, command, env=python_env(), capture_output=True, text=True,
                                       timeout=60, check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        return await asyncio.wait_for(task, 30)

    result = asyncio.run(go())

    assert result.final_output == "wrote it"
    if decision == "approve":
        assert len(lines(tmp_path / "lines.log")) == 1
        assert _tool_messages(openai_server.bodies[1]) == ["line 1 written"]
    else:
        assert lines(tmp_path / "lines.log") == []
        assert _tool_messages(openai_server.bodies[1]) == ["Tool execution was not approved."]
    assert len(openai_server.requests) == 2


# --- declarations and refusals -------------------------------------------------------------------------------


def test_semantics_come_from_the_mapping_over_the_decorator_and_the_tool_sees_its_effect(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    seen: list[str] = []

    @durable_tool(semantics="idempotent")
    @function_tool
    def lookup(key: str) -> dict[str, Any]:
        """Look a key up."""
        seen.append(current_effect().idempotency_key)
        return {"key": key, "found": True}

    @durable_tool(semantics="idempotent")
    @function_tool
    def store_value(key: str) -> str:
        """Store a key."""
        return "stored"

    client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
    agent = Agent(name="keeper", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                  tools=[lookup, store_value])
    openai_server.script(Completion(calls=[Call("c1", "lookup", '{"key": "a"}'), Call("c2", "store_value",
                                                                                    '{"key": "a"}')]), DONE)
    found: list[str] = []
    DurableRunner(_url(tmp_path), tools={"lookup": "read_only"}).run_sync(agent, "Keep a", started=found.append)

    intents = {e.data["name"]: e.data for e in _log(_url(tmp_path), found[0]).events() if e.type == "tool.requested"}
    assert (intents["lookup"]["semantics"], intents["store_value"]["semantics"]) == ("read_only", "idempotent")
    assert seen == [intents["lookup"]["idempotency_key"]]
    assert _tool_messages(openai_server.bodies[1]) == [str({"key": "a", "found": True}), "stored"]
    with pytest.raises(InvalidInput):
        current_effect()


def test_what_cannot_be_recorded_is_refused_before_anything_runs(tmp_path: Path, openai_server: FakeOpenAI) -> None:
    agent = writer(openai_server.url, tmp_path)
    url = _url(tmp_path)
    with pytest.raises(InvalidInput, match="appendline"):
        DurableRunner(url, tools={"appendline": "idempotent"}).run_sync(agent, INPUT)
    with pytest.raises(InvalidInput, match="session"):
        DurableRunner(url).run_sync(agent, INPUT, session=SQLiteSession("s", str(tmp_path / "s.db")))
    with pytest.raises(InvalidInput, match="LocalShellTool"):
        DurableRunner(url).run_sync(agent.clone(tools=[LocalShellTool(executor=lambda request: "")]), INPUT)
    with pytest.raises(InvalidInput, match="semantics"):
        ToolPolicy("sometimes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="above @function_tool"):
        durable_tool()(lambda ctx: None)  # type: ignore[arg-type]
    # A declaration a jixu tool refuses is refused when made, naming the tool (it was found only once a paid
    # model call had asked for the tool, naming an internal function), as are options nothing would take.
    with pytest.raises(ToolDefinitionError, match=r"append_line.*probe_timeout needs a probe"):
        durable_tool(probe_timeout=5)(function_tool(lambda text: text, name_override="append_line"))
    with pytest.raises(ToolDefinitionError, match="append_line"):
        DurableRunner(url, tools={"append_line": ToolPolicy("unsafe", lambda q: None, -1)})
    with pytest.raises(InvalidInput, match="tools must map"):
        DurableRunner(url, tools=["append_line"])  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="bogus_opt"):
        DurableRunner(url, bogus_opt=1)
    with pytest.raises(InvalidInput, match="recorded model response"):
        load_model_response({})
    assert openai_server.requests == [] and not (tmp_path / "jixu.db").exists()

    async def inside() -> None:
        with pytest.raises(InvalidInput, match="event loop"):
            DurableRunner(url).run_sync(agent, INPUT)

    asyncio.run(inside())


def test_a_needs_approval_policy_is_asked_per_call(tmp_path: Path, openai_server: FakeOpenAI) -> None:
    asked: list[tuple[dict[str, Any], str]] = []

    async def only_long(ctx: RunContextWrapper[Any], params: dict[str, Any], call_id: str) -> bool:
        asked.append((params, call_id))
        return len(params["text"]) > 10

    agent = writer(openai_server.url, tmp_path)
    [tool] = agent.tools
    agent = agent.clone(tools=[tool.__class__(**{**tool.__dict__, "needs_approval": only_long})])  # type: ignore
    openai_server.script(HELLO, DONE)
    found: list[str] = []
    result = runner(_url(tmp_path), tmp_path).run_sync(agent, INPUT, started=found.append)

    assert result.final_output == "wrote it" and asked == [({"text": "hello"}, "call_hello")]
    [intent] = [e.data for e in _log(_url(tmp_path), found[0]).events() if e.type == "tool.requested"
                and e.data["name"] == "append_line"]
    assert intent["requires_approval"] is False


def test_importing_without_the_sdk_names_the_extra_to_install() -> None:
    code = "import sys; sys.modules['agents'] = None; import jixu.integrations.openai_agents"
    done = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode != 0
    assert 'pip install "jixu[openai-agents]"' in done.stderr


@pytest.mark.crash
def test_the_example_kills_its_agent_and_the_rerun_sends_one_invoice(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "examples" / "openai_agents_durable.py")],
                          env={**python_env(), "INVOICE_DIR": str(tmp_path)}, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "child killed by signal 9; invoices.log has 1 line(s)",
        "after the kill: {'model': 'completed', 'send_invoice': 'unknown'}",
        "final output: Invoice sent to ada.",
        "steps: ['model#1', 'send_invoice:call_1#1', 'model#2']",
        "settled by: probe:send_invoice occurred",
        "invoices.log has 1 line(s)",
    ]
    assert len((tmp_path / "invoices.log").read_text().splitlines()) == 1


def test_a_model_call_an_operator_settled_without_its_response_is_asked_again(tmp_path: Path,
                                                                             openai_server: FakeOpenAI) -> None:
    """A model call cut off with no attempts left is ``unknown``; an operator resolves it ``occurred``. There is
    no response to rebuild, so the rerun asks the model again (a new step) instead of failing on a missing
    record."""
    from tests.providers.fake_servers import Slow

    url = _url(tmp_path)
    openai_server.script(Slow(30, DONE), DONE)
    found: list[str] = []

    def durable() -> DurableRunner:
        return DurableRunner(url, tools={"append_line": ToolPolicy("unsafe")}, max_attempts=1)

    async def cut_off() -> None:
        task = asyncio.create_task(durable().run(writer(openai_server.url, tmp_path), INPUT, started=found.append))
        for _ in range(500):
            await asyncio.sleep(0.01)
            if openai_server.requests:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cut_off())
    [thread_id] = found
    with pytest.raises(StepOutcomeUnknown) as unknown:
        durable().run_sync(writer(openai_server.url, tmp_path), INPUT, thread_id=thread_id)
    store = open_store(url)
    try:
        ThreadLog.load(store, thread_id).resolve(unknown.value.details["effect_id"], "occurred", actor="ops",
                                                 note="the provider's log shows it answered")
    finally:
        store.close()
    result = durable().run_sync(writer(openai_server.url, tmp_path), INPUT, thread_id=thread_id)
    assert result.final_output == "wrote it" and len(openai_server.requests) == 2
    assert _steps(_log(url, thread_id)) == ["model#1", "model#1.2"]


def test_an_unsafe_tool_that_raises_after_its_side_effect_is_unknown_not_a_success_the_model_retries(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    """The tool wrote its line, then raised (a timeout reading the reply). The SDK turns a tool's exception into
    text for the model, and the model asks for the same call again: recorded as that text, the call looked
    succeeded and the retry wrote the line twice. The call's outcome is unknown instead: the run stops for its
    probe or an operator, and nothing is written twice."""
    from agents import function_tool

    from jixu.integrations.openai_agents import durable_tool
    from tests.integrations.openai_agents_child import write_line

    retry = Completion(calls=[Call("call_again", "flaky_append", '{"text": "hello"}')])
    openai_server.script(Completion(calls=[Call("call_hello", "flaky_append", '{"text": "hello"}')]), retry, DONE)

    @durable_tool(semantics="unsafe")
    @function_tool
    async def flaky_append(text: str) -> str:
        """Append one line, then fail to read the reply."""
        write_line(tmp_path / "lines.log", text)
        raise TimeoutError("no answer from the remote side")

    client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
    agent = Agent(name="flaky", tools=[flaky_append],
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client))
    with pytest.raises(StepOutcomeUnknown) as unknown:
        DurableRunner(_url(tmp_path)).run_sync(agent, INPUT)
    assert len(lines(tmp_path / "lines.log")) == 1, "the side effect happened once"
    assert unknown.value.details["step"].startswith("flaky_append")
    assert len(openai_server.requests) == 1, "the model was not told to try again"


def test_a_keyed_run_that_ended_is_replayed_by_the_same_call_and_the_tool_does_not_run_twice(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    """The code crashed after its run ended, before it learnt so (decision 0051): the same call with the run key
    returns the recorded output, with no model request and no tool call."""
    url = _url(tmp_path)
    openai_server.script(HELLO, DONE)
    found: list[str] = []
    first = runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, started=found.append,
                                           run_key="write-hello")
    recorded = [(e.type, e.seq) for e in _log(url, found[0]).events()]
    again = runner(url, tmp_path).run_sync(writer(openai_server.url, tmp_path), INPUT, thread_id=found[0],
                                           run_key="write-hello")
    assert again.final_output == first.final_output == "wrote it"
    assert len(lines(tmp_path / "lines.log")) == 1 and len(openai_server.requests) == 2
    assert [(e.type, e.seq) for e in _log(url, found[0]).events()] == recorded, "the replay appended nothing"


@pytest.mark.parametrize("arguments", ['{"text": "hel', '["hello"]', '{"words": "hello"}'],
                         ids=["not-json", "not-an-object", "not-its-schema"])
def test_arguments_an_unsafe_tool_refuses_are_no_step_and_the_model_is_told_as_the_sdk_tells_it(
        tmp_path: Path, openai_server: FakeOpenAI, arguments: str) -> None:
    """The model sends arguments the tool refuses before it runs (JSON cut short, not an object, not its
    parameters). Nothing can have happened outside: no step is opened (or, for the schema, the step ends with the
    refusal as its outcome), the model gets the SDK's own error text and asks again.
    Before, the refusal was recorded as the unsafe call's failure in doubt, and the run and every rerun stopped
    with StepOutcomeUnknown until an operator resolved a call that never ran."""
    from agents import function_tool

    from jixu.integrations.openai_agents import durable_tool
    from tests.integrations.openai_agents_child import write_line

    openai_server.script(Completion(calls=[Call("call_bad", "append", arguments)]),
                         Completion(calls=[Call("call_good", "append", '{"text": "hello"}')]), DONE)

    @durable_tool(semantics="unsafe")
    @function_tool
    async def append(text: str) -> str:
        """Append one line."""
        write_line(tmp_path / "lines.log", text)
        return "appended"

    client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
    agent = Agent(name="appender", tools=[append],
                  model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client))
    result = DurableRunner(_url(tmp_path)).run_sync(agent, INPUT)
    assert result.final_output == DONE.text
    assert lines(tmp_path / "lines.log") == ["hello"]
    told = _tool_messages(openai_server.bodies[1])
    assert len(told) == 1 and told[0].startswith("An error occurred while running the tool"), told
    [thread] = open_store(_url(tmp_path)).list_streams("thread/")
    log = _log(_url(tmp_path), thread.stream.split("/", 1)[1])
    steps = [s for s in _steps(log) if not s.startswith("model")]
    # Not JSON or not an object: no step. Not the tool's schema: a step, whose refusal is its outcome (the SDK's
    # public preparation does not say it refuses), never an unknown one.
    assert steps == ["append:call_good#1"] or (arguments.startswith('{"words"') and len(steps) == 2), steps
    assert {d.state for d in RecoveryResolver.analyze(log.events()).decisions.values()} == {"completed"}


def test_a_sync_tool_cut_off_by_a_cancelled_run_is_probed_once_its_thread_returned(tmp_path: Path) -> None:
    """The SDK runs a sync function tool in a worker thread of its own: ``asyncio.wait_for`` around a run cut the
    call off while it slept there, the documented rerun asked its probe at once, which answered ``not_occurred``,
    and the invoice went out twice. What a call hands the loop's executor now counts as that call in flight."""
    from agents import Agent, function_tool
    from agents.testing import ScriptedModel, assistant_message, function_call

    from jixu import NotOccurred, Occurred, ProbeQuery
    from jixu.integrations.openai_agents import DurableRunner, current_effect, durable_tool

    bank = tmp_path / "bank.log"
    bank.write_text("")

    def find(query: ProbeQuery) -> Occurred | NotOccurred:
        return Occurred(result="sent", evidence={}) if query.idempotency_key in bank.read_text() \
            else NotOccurred(evidence={})

    @durable_tool(semantics="unsafe", probe=find)
    @function_tool
    def send_invoice(customer: str) -> str:
        """Send an invoice (a slow mail API)."""
        key = current_effect().idempotency_key
        time.sleep(0.8)
        with bank.open("a") as out:
            out.write(f"{customer} {key}\n")
        return "sent"

    def agent(*answers: Any) -> Agent[Any]:
        return Agent(name="billing", tools=[send_invoice], model=ScriptedModel(list(answers)))

    async def main() -> str:
        runner = DurableRunner(f"sqlite:///{tmp_path / 'billing.db'}")
        started: list[str] = []
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(runner.run(agent([function_call("send_invoice", {"customer": "ada"},
                                                                   call_id="c1")], [assistant_message("ok")]),
                                              "Invoice ada", started=started.append), 0.2)
        rerun = await runner.run(agent([assistant_message("ok")]), "Invoice ada", thread_id=started[0])
        return str(rerun.final_output)

    assert asyncio.run(main()) == "ok"
    assert len(lines(bank)) == 1, "the invoice went out once"


# --- agents used as tools (Agent.as_tool) ----------------------------------------------------------------------


def _billing(client: AsyncOpenAI, model_kind: str, keys: list[str]) -> tuple[Agent[Any], RunConfig | None]:
    """A boss agent with a billing agent as its tool; the billing agent's unsafe tool notes its idempotency key.
    ``model_kind``: the agents hold model objects, or name their model for the run config's provider."""

    @function_tool
    def charge(amount: int) -> str:
        """Charge an amount."""
        keys.append(current_effect().idempotency_key)
        return f"charged {amount}"

    model: Any = OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
    config = None
    if model_kind == "provider":
        model, config = "gpt-4o-mini", RunConfig(model_provider=OpenAIProvider(openai_client=client,
                                                                                use_responses=False))
    billing = Agent(name="billing", instructions="Charge what is asked.", model=model, tools=[charge])
    return Agent(name="boss", instructions="Delegate billing.", model=model,
                 tools=[billing.as_tool("billing", "Charges amounts.")]), config


@pytest.mark.parametrize("model_kind", ["object", "provider"])
def test_an_agent_used_as_a_tool_runs_durably_each_of_its_calls_a_step_with_its_own_key(
        tmp_path: Path, openai_server: FakeOpenAI, model_kind: str) -> None:
    """Before, its calls were not recorded and its tools saw the outer call's identity (two charges went out
    with one idempotency key); with a model named for the run's provider the run hung for good (the outer
    call held the run's step lock that the agent's first model call waited for). The agent tool is an
    idempotent step of its own, its agent's calls steps keyed under it."""
    url = _url(tmp_path)
    keys: list[str] = []
    openai_server.script(Completion(calls=[Call("o1", "billing", '{"input": "charge 5 and 7"}')]),
                         Completion(calls=[Call("s1", "charge", '{"amount": 5}'), Call("s2", "charge",
                                                                                     '{"amount": 7}')]),
                         Completion(text="charged both"), Completion(text="billing done"))
    found: list[str] = []

    async def run(thread_id: str | None = None) -> Any:
        client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
        agent, config = _billing(client, model_kind, keys)
        return await asyncio.wait_for(DurableRunner(url).run(agent, "Bill order 7", thread_id=thread_id,
                                                             started=found.append, run_config=config,
                                                             run_key="bill-7"), 30)

    result = asyncio.run(run())

    assert result.final_output == "billing done"
    log = _log(url, found[0])
    assert _steps(log) == ["model#1", "billing:o1#1", "billing:o1#1/model#1", "billing:o1#1/charge:s1#1",
                           "billing:o1#1/charge:s2#1", "billing:o1#1/model#2", "model#2"]
    intents = {e.data["step"]: e.data for e in log.events() if e.type == "tool.requested"}
    assert keys == [intents["billing:o1#1/charge:s1#1"]["idempotency_key"],
                    intents["billing:o1#1/charge:s2#1"]["idempotency_key"]]
    assert len(set(keys)) == 2, "each charge went out with its own idempotency key"
    assert _tool_messages(openai_server.bodies[3]) == ["charged both"], "the boss got the agent's answer"
    analysis = RecoveryResolver.analyze(log.events())
    assert {d.state for d in analysis.decisions.values()} == {"completed"}

    recorded = len(log.events())
    again = asyncio.run(run(found[0]))  # the keyed run replays from its record: no request, no charge
    assert again.final_output == "billing done" and len(openai_server.requests) == 4 and len(keys) == 2
    assert len(_log(url, found[0]).events()) == recorded


def test_agents_used_as_tools_at_once_keep_their_step_keys_whatever_order_their_calls_take(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    """Two calls of an agent tool in one response run at once; each agent loop counts its own steps, so a replay
    (whose recorded steps return at once, in another order than the live calls took) finds each step's record."""
    url = _url(tmp_path)
    client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
    keys: list[str] = []
    agent, _config = _billing(client, "object", keys)
    one_charge = Completion(calls=[Call("s1", "charge", '{"amount": 5}')])
    openai_server.script(Completion(calls=[Call("o1", "billing", '{"input": "charge 5 for order 1"}'),
                                           Call("o2", "billing", '{"input": "charge 5 for order 2"}')]),
                         one_charge, one_charge, Completion(text="charged"), Completion(text="charged"),
                         Completion(text="both billed"))
    found: list[str] = []
    first = DurableRunner(url).run_sync(agent, "Bill orders 1 and 2", started=found.append, run_key="bill-1-2")
    steps = _steps(_log(url, found[0]))
    assert sorted(steps) == sorted(["model#1", "billing:o1#1", "billing:o2#1", "billing:o1#1/model#1",
                                    "billing:o2#1/model#1",
                                    "billing:o1#1/charge:s1#1", "billing:o2#1/charge:s1#1",
                                    "billing:o1#1/model#2", "billing:o2#1/model#2", "model#2"])
    assert len(set(keys)) == 2

    again = DurableRunner(url).run_sync(agent, "Bill orders 1 and 2", thread_id=found[0], run_key="bill-1-2")
    assert again.final_output == first.final_output == "both billed"
    assert len(openai_server.requests) == 6 and len(keys) == 2


@pytest.mark.crash
def test_killed_inside_an_agent_used_as_a_tool_the_rerun_replays_to_the_cut_call_and_never_runs_it_twice(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    url = _url(tmp_path)
    thread_id = _crash("nested-after", url, tmp_path)
    assert len(lines(tmp_path / "lines.log")) == 1
    log = _log(url, thread_id)
    assert _steps(log) == ["model#1", "writer:call_boss#1", "writer:call_boss#1/model#1",
                           "writer:call_boss#1/append_line:call_hello#1"]
    cut = _effect(log, "writer:call_boss#1/append_line:call_hello#1")
    assert RecoveryResolver.analyze(log.events()).decisions[cut].state == "unknown"

    openai_server.script(DONE, Completion(text="the writer wrote it"))
    result = runner(url, tmp_path).run_sync(boss(openai_server.url, tmp_path), INPUT, thread_id=thread_id)

    assert result.final_output == "the writer wrote it"
    assert len(lines(tmp_path / "lines.log")) == 1, "the unsafe tool ran exactly once"
    writer_request, boss_request = openai_server.bodies  # both first model calls were replayed from their records
    assert _tool_messages(writer_request) == ["line 1 written"], "the probe's result is the tool's output"
    assert _tool_messages(boss_request) == ["wrote it"], "the boss got the writer agent's answer"
    events = _log(url, thread_id).events()
    [resolved] = [e for e in events if e.type == "tool.outcome_resolved"]
    assert (resolved.data["effect_id"], resolved.data["resolution"]) == (cut, "occurred")


def test_what_an_agent_tool_cannot_record_is_refused_before_anything_runs(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
    sub = Agent(name="sub", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client))

    async def stream(event: Any) -> None:
        return None

    refused = {
        "session": sub.as_tool("sub", "d", session=SQLiteSession("s", str(tmp_path / "session.db"))),
        "on_stream": sub.as_tool("sub", "d", on_stream=stream),
        "needs_approval": sub.as_tool("sub", "d", needs_approval=True),
        "a policy": durable_tool(semantics="idempotent")(sub.as_tool("sub", "d")),
    }
    for what, tool in refused.items():
        agent = Agent(name="boss", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                      tools=[tool])
        with pytest.raises(InvalidInput) as raised:
            DurableRunner(_url(tmp_path)).run_sync(agent, "Go", started=lambda _t: pytest.fail("it started"))
        assert raised.value.details.get("field") == "tools", what
    plain = Agent(name="boss", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                  tools=[sub.as_tool("sub", "d")])
    with pytest.raises(InvalidInput, match="agent used as a tool"):
        DurableRunner(_url(tmp_path), tools={"sub": "idempotent"}).run_sync(plain, "Go")
    assert openai_server.requests == [] and not (tmp_path / "jixu.db").exists()

    @function_tool
    def sub(text: str) -> str:  # an ordinary tool of another agent with the agent tool's name: its policy is fine
        """Note a text."""
        return text

    other = Agent(name="other", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                  tools=[sub])
    both = Agent(name="boss", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                 tools=[plain.tools[0]], handoffs=[other])
    openai_server.script(DONE)
    assert DurableRunner(_url(tmp_path), tools={"sub": "idempotent"}).run_sync(both, "Go").final_output == "wrote it"


def test_agents_that_are_each_others_tools_run(tmp_path: Path, openai_server: FakeOpenAI) -> None:
    client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
    model = OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client)
    first, second = Agent(name="first", model=model), Agent(name="second", model=model)
    first.tools.append(second.as_tool("second", "Asks the second agent."))
    second.tools.append(first.as_tool("first", "Asks the first agent."))
    openai_server.script(Completion(calls=[Call("a", "second", '{"input": "hi"}')]), Completion(text="second here"),
                         Completion(text="done"))
    found: list[str] = []
    result = DurableRunner(_url(tmp_path)).run_sync(first, "Go", started=found.append)
    assert result.final_output == "done"
    assert _steps(_log(_url(tmp_path), found[0])) == ["model#1", "second:a#1", "second:a#1/model#1", "model#2"]


def test_an_agent_tools_failure_the_sdk_told_the_model_is_replayed_not_asked_again(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    """The agent's model answers HTTP 500: the SDK tells the outer model (as without jixu). Its record must give
    the same answer on every rerun: asking the agent's model again (it would answer now) changed what the outer
    model was told, and the keyed run's replay raised StepMismatch."""
    url = _url(tmp_path)
    keys: list[str] = []
    openai_server.script(Completion(calls=[Call("o1", "billing", '{"input": "charge 5"}')]), SERVER_ERROR,
                         Completion(text="billing is down"))

    def run(thread_id: str | None = None) -> Any:
        client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
        agent, _config = _billing(client, "object", keys)
        return DurableRunner(url).run_sync(agent, "Bill order 7", thread_id=thread_id, started=found.append,
                                           run_key="bill-7")

    found: list[str] = []
    first = run()
    told = _tool_messages(openai_server.bodies[2])
    assert first.final_output == "billing is down"
    assert len(told) == 1 and "An error occurred while running the tool" in told[0]
    assert _steps(_log(url, found[0])) == ["model#1", "billing:o1#1", "billing:o1#1/model#1", "model#2"]

    again = run(found[0])  # the keyed run replays: the failure as recorded, no request
    assert again.final_output == "billing is down" and len(openai_server.requests) == 3 and keys == []


def test_an_unsafe_tools_sdk_timeout_leaves_its_call_unknown_and_the_model_never_retries_it(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    """The SDK's ``timeout_seconds`` told the model "timed out" about a call that had acted; the model called
    again under a new key and the run ended completed with the first call unknown: two charges. The timeout is
    now the step's: the run stops with the call unknown, for its probe or an operator."""
    bank = tmp_path / "bank.log"

    @function_tool(timeout=0.2)
    async def charge(order: int) -> str:
        """Charge an order (the payment API answers late)."""
        with bank.open("a") as out:
            out.write(f"{order} {current_effect().idempotency_key}\n")
        await asyncio.sleep(1)
        return "charged"

    client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
    agent = Agent(name="shop", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                  tools=[charge])
    assert charge.timeout_seconds == 0.2
    openai_server.script(Completion(calls=[Call("c1", "charge", '{"order": 7}')]),
                         Completion(calls=[Call("c2", "charge", '{"order": 7}')]), Completion(text="charged twice"))
    found: list[str] = []
    with pytest.raises(StepOutcomeUnknown):
        DurableRunner(_url(tmp_path)).run_sync(agent, "Charge order 7", started=found.append)
    assert len(bank.read_text().splitlines()) == 1, "charged once"
    assert len(openai_server.requests) == 1, "the model was not told of a timeout"
    log = _log(_url(tmp_path), found[0])
    decision = RecoveryResolver.analyze(log.events()).decisions[_effect(log, "charge:c1#1")]
    assert decision.state == "unknown"


def test_a_def_sibling_that_completes_while_an_unsafe_call_fails_keeps_its_result(
        tmp_path: Path, openai_server: FakeOpenAI) -> None:
    """An audit: an unsafe tool's exception reaches the SDK (its handler is off for unsafe tools), and the SDK
    cancels the other calls of the response: a plain `def` sibling, which cannot be stopped, went on, returned,
    and was recorded interrupted (unknown). The failing step now waits for its siblings in threads first."""
    ended: list[str] = []

    @function_tool(failure_error_function=None)
    async def boom() -> str:
        """Act, then fail without an answer."""
        await asyncio.sleep(0.05)
        raise ConnectionResetError("the server hung up after acting")

    @function_tool
    def slow_sync() -> str:
        """Take a while, then answer."""
        time.sleep(0.5)
        ended.append("sync ok")
        return "sync ok"

    client = AsyncOpenAI(base_url=openai_server.url, api_key="sk-test", max_retries=0)
    agent = Agent(name="siblings", model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                  tools=[boom, slow_sync])
    url, found = _url(tmp_path), []
    openai_server.script(Completion(calls=[Call("b1", "boom", "{}"), Call("s1", "slow_sync", "{}")]))
    with pytest.raises(StepOutcomeUnknown):
        DurableRunner(url).run_sync(agent, "Go.", started=found.append)
    assert ended == ["sync ok"]
    decisions = {d.name: d for d in RecoveryResolver.analyze(_log(url, found[0]).events()).decisions.values()}
    assert decisions["boom"].state == "unknown"
    assert (decisions["slow_sync"].state, decisions["slow_sync"].reason) == ("completed", "succeeded")


class _Answers(Model):
    """A model of the SDK's own interface (model fakes are allowed): asks for ``call`` until a tool output is in
    its input, then answers ``done``, noting the outputs it was told; ``fail_at``: the call (1-based) that raises
    ``error`` instead, as a provider or a model wrapper may."""

    def __init__(self, call: str, arguments: str, *, fail_at: int | None = None,
                 error: type[Exception] = RuntimeError, delay: float = 0.0) -> None:
        self.call, self.arguments, self.fail_at, self.error, self.delay = call, arguments, fail_at, error, delay
        self.calls, self.told = 0, []

    async def get_response(self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
        from agents import ModelResponse, Usage
        from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText

        self.calls += 1
        await asyncio.sleep(self.delay)
        if self.calls == self.fail_at:
            raise self.error("the model's answer could not be read this time")
        outputs = [item for item in input if isinstance(item, dict) and item.get("type") == "function_call_output"] \
            if isinstance(input, list) else []
        if not outputs:
            return ModelResponse(output=[ResponseFunctionToolCall(type="function_call", call_id="c1", name=self.call,
                                                                  arguments=self.arguments, id="f1",
                                                                  status="completed")],
                                 usage=Usage(), response_id=None)
        self.told.append(outputs[-1].get("output"))
        return ModelResponse(output=[ResponseOutputMessage(id="m", type="message", role="assistant",
                                                           status="completed", content=[ResponseOutputText(
                                                               type="output_text", text="done", annotations=[])])],
                             usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@pytest.mark.parametrize("error", ["RuntimeError", "ModelBehaviorError"])
def test_an_error_the_model_call_raised_leaves_the_run_unfinished_whatever_its_type(tmp_path: Path,
                                                                                   error: str) -> None:
    """Found by a review: with ModelBehaviorError made final (a recorded response naming no tool), the same error
    raised by the model call itself (a provider or model wrapper) ended the run failed; the same call again then
    started a new run and charged again. A rerun asks the model again, so the run stays unfinished."""
    from agents.exceptions import ModelBehaviorError

    charged: list[int] = []

    @function_tool
    def charge(order: int) -> str:
        """Charge an order."""
        charged.append(order)
        return f"charged {order}"

    model = _Answers("charge", '{"order": 7}', fail_at=2,
                     error=ModelBehaviorError if error == "ModelBehaviorError" else RuntimeError)
    agent = Agent("shop", model=model, tools=[charge])
    url, found = _url(tmp_path), []
    with pytest.raises(Exception, match="could not be read"):
        DurableRunner(url, tools={"charge": "unsafe"}).run_sync(agent, "charge order 7", started=found.append)
    result = DurableRunner(url, tools={"charge": "unsafe"}).run_sync(agent, "charge order 7", thread_id=found[0])
    assert result.final_output == "done" and charged == [7], charged
    assert [e.data["outcome"] for e in _log(url, found[0]).events() if e.type == "turn.ended"] == ["completed"]


def test_an_agent_tool_an_operator_settled_without_a_result_is_told_as_happening_not_none(tmp_path: Path) -> None:
    """Found by a review: the fix for function tools missed an agent used as a tool: resolved ``occurred``
    without a result, the outer model was told 'None'."""
    sub = Agent("sub", model=_Answers("none", "{}", delay=3.0))  # too slow for the tool's timeout
    helper = sub.as_tool(tool_name="helper", tool_description="Helps.")
    helper.timeout_seconds = 0.3
    outer = _Answers("helper", '{"input": "x"}')
    agent = Agent("outer", model=outer, tools=[helper])
    url, found = _url(tmp_path), []
    with pytest.raises(StepOutcomeUnknown):
        DurableRunner(url, max_attempts=1).run_sync(agent, "go", started=found.append)
    log = _log(url, found[0])
    unknown = [d.effect_id for d in log.open_analysis().decisions.values() if d.state == "unknown"]
    assert unknown
    for effect_id in unknown:
        log.resolve(effect_id, "occurred", note="the sub-agent ran", actor="ops")
    assert DurableRunner(url, max_attempts=1).run_sync(agent, "go", thread_id=found[0]).final_output == "done"
    assert outer.told == [OCCURRED_WITHOUT_RESULT]
