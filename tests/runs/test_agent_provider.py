"""The built-in jixu agent provider: a thread with the workspace tools, mapped onto the Provider interface.

Scripted models drive real threads over real stores in a real git workspace.
The crash tests SIGKILL a child process running the provider, then call the
provider again for the same run attempt and check that the thread continues
where it stopped instead of repeating tool calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import InvalidInput, ModelError
from jixu.kernel import ownership
from jixu.ledger import Event, MemoryStore, SQLiteStore, Store
from jixu.runs.agent_provider import (
    CONTINUE_MESSAGE,
    DEFAULT_INSTRUCTIONS,
    REPAIR_MESSAGE,
    AgentImplementationFailed,
    AgentProvider,
    run_threads,
    thread_key,
)
from jixu.runs.providers import ImplementContext, Provider, ProviderError, provider_snapshot
from jixu.threads import ModelRequest, ModelResponse, ScriptedModel, ToolCall
from jixu.threads.log import ThreadLog, stream_of
from jixu.threads.model import Step
from tests.helpers import spawn_python

BUGGY = "def add(a, b):\n    return a - b\n"
FIXED = "def add(a, b):\n    return a + b\n"
CHECK = "import calc; assert calc.add(2, 3) == 5, calc.add(2, 3); print('checks pass')"


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=root,
                          check=True, capture_output=True, text=True).stdout


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """A git workspace with a buggy ``calc.py``, committed."""
    root = tmp_path / "ws"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / "calc.py").write_text(BUGGY)
    (root / "README.md").write_text("# calc\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "initial")
    return root


def context(brief: str = "Fix add() in calc.py so that the checks pass.", *, run_id: str = "R1",
            attempt: int = 1, **extra: Any) -> ImplementContext:
    return ImplementContext(run_id=run_id, brief=brief, attempt=attempt, **extra)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def events_of(store: Store, thread_id: str, kind: str | None = None) -> list[Event]:
    events = store.read(stream_of(thread_id))
    return [e for e in events if kind is None or e.type == kind]


def tool_events(store: Store, thread_id: str, phase: str, name: str) -> list[Event]:
    """``tool.<phase>`` events of calls to tool ``name``."""
    names = {e.data["effect_id"]: e.data["name"] for e in events_of(store, thread_id, "tool.requested")}
    return [e for e in events_of(store, thread_id, f"tool.{phase}") if names.get(e.data["effect_id"]) == name]


def fixing_script() -> list[Step]:
    """Look around, read, fix, note, run the checks, finish."""
    return [
        ToolCall("list_files", {}),
        ToolCall("read_file", {"path": "calc.py"}),
        ToolCall("edit_file", {"path": "calc.py", "old": "return a - b", "new": "return a + b"}),
        ToolCall("write_file", {"path": "NOTES.md", "content": "add() subtracted; it adds now.\n"}),
        ToolCall("run_command", {"argv": [sys.executable, "-c", CHECK]}),
        "Fixed add() to add; the checks pass.",
    ]


class FlakyModel:
    """Raises the scripted errors in order, then answers with ``reply``."""

    name = "flaky"

    def __init__(self, errors: list[ModelError], reply: str = "done") -> None:
        self.errors = errors
        self.reply = reply
        self.requests: list[ModelRequest] = []

    async def complete(self, request: ModelRequest) -> ModelResponse:
        self.requests.append(request)
        if self.errors:
            raise self.errors.pop(0)
        return ModelResponse(text=self.reply, model=self.name, stop_reason="end_turn")


# --- the Provider interface -----------------------------------------------------------------


def test_kind_name_and_settings_without_secrets() -> None:
    store = MemoryStore()
    provider = AgentProvider("jixu-agent", ScriptedModel(["hi"], name="scripted:one"), store=store, max_steps=12,
                             allowed_paths=["src/**", "tests/**"])
    checked: Provider = provider
    assert checked.kind == "agent" and checked.name == "jixu-agent"
    settings = provider.settings()
    assert settings["model"] == "scripted:one" and settings["max_steps"] == 12
    assert settings["allowed_paths"] == ["src/**", "tests/**"]
    assert set(settings) == {"model", "max_steps", "allowed_paths", "instructions_digest", "context_budget",
                             "command_timeout"}
    snapshot = provider_snapshot(provider, 1)
    assert snapshot["kind"] == "agent" and snapshot["revision"] == 1
    same = AgentProvider("jixu-agent", ScriptedModel(["other"], name="scripted:one"), store=store, max_steps=12,
                         allowed_paths=["src/**", "tests/**"])
    assert provider_snapshot(same, 1)["digest"] == snapshot["digest"]
    other = AgentProvider("jixu-agent", ScriptedModel(["hi"], name="scripted:one"), store=store, max_steps=12,
                          allowed_paths=["src/**", "tests/**"], instructions="Be terse.")
    assert other.settings()["instructions_digest"] != settings["instructions_digest"]
    assert provider_snapshot(other, 1)["digest"] != snapshot["digest"]


@pytest.mark.parametrize("options", [
    {"name": ""}, {"name": "x" * 101}, {"model": object()}, {"max_steps": 0}, {"allowed_paths": "**"},
    {"allowed_paths": ["/etc/**"]}, {"context_budget": 0}, {"instructions": ""}, {"owner": ""},
    {"command_timeout": 0}, {"store": None},
])
def test_bad_configuration_is_refused(options: dict[str, Any]) -> None:
    arguments: dict[str, Any] = {"name": "agent", "model": ScriptedModel(["x"]), "store": MemoryStore(), **options}
    name, model = arguments.pop("name"), arguments.pop("model")
    with pytest.raises(InvalidInput):
        AgentProvider(name, model, **arguments)


def test_a_store_given_by_url_is_opened_and_closed(tmp_path: Path) -> None:
    provider = AgentProvider("agent", ScriptedModel(["x"]), store=f"sqlite:///{tmp_path}/a.db")
    assert run(provider.test()).ok
    provider.close()
    assert (tmp_path / "a.db").exists()


def test_test_makes_no_call_for_a_scripted_model() -> None:
    model = ScriptedModel(["x"])
    result = run(AgentProvider("agent", model, store=MemoryStore()).test())
    assert result.ok and "no call" in result.message and model.calls == []
    assert not run(AgentProvider("agent", ScriptedModel([]), store=MemoryStore()).test()).ok
    assert run(AgentProvider("agent", ScriptedModel(lambda messages: "x"), store=MemoryStore()).test()).ok


def test_test_makes_one_tiny_call_for_a_real_driver() -> None:
    model = FlakyModel([])
    result = run(AgentProvider("agent", model, store=MemoryStore()).test())
    assert result.ok and len(model.requests) == 1 and model.requests[0].tools == ()
    refusing = FlakyModel([ModelError("bad key", kind="authentication", indeterminate=False)])
    result = run(AgentProvider("agent", refusing, store=MemoryStore()).test())
    assert not result.ok and "authentication" in result.message and "bad key" in result.message


# --- implementing a brief ---------------------------------------------------------------------


def test_the_agent_reads_edits_writes_runs_a_command_and_finishes(ws: Path) -> None:
    store = MemoryStore()
    model = ScriptedModel(fixing_script(), name="scripted:fixer")
    provider = AgentProvider("jixu-agent", model, store=store)
    result = run(provider.implement(ws, context()))

    assert result.summary == "Fixed add() to add; the checks pass."
    assert (ws / "calc.py").read_text() == FIXED
    assert (ws / "NOTES.md").read_text() == "add() subtracted; it adds now.\n"
    assert sorted(git(ws, "status", "--porcelain").splitlines()) == [" M calc.py", "?? NOTES.md"]
    details = result.details
    thread_id = details["thread_id"]
    assert details["reopened"] is False and details["settled_unknown"] == []
    assert details["usage"]["model_calls"] == 6 and details["usage"]["tool_calls"] == 5
    assert details["model"] == "scripted:fixer"
    # Every tool ran once, through the thread's recorded effects.
    listed = tool_events(store, thread_id, "completed", "list_files")[0].data["result"]
    assert listed == ["README.md", "calc.py"]
    command = tool_events(store, thread_id, "completed", "run_command")[0].data["result"]
    assert command["exit_status"] == 0 and command["stdout"] == "checks pass\n"
    semantics = {e.data["name"]: e.data["semantics"] for e in events_of(store, thread_id, "tool.requested")}
    assert semantics == {"list_files": "read_only", "read_file": "read_only", "edit_file": "unsafe",
                         "write_file": "idempotent", "run_command": "unsafe"}
    # The thread is tied to its run attempt; the instructions carry the brief and the workspace rules.
    created = events_of(store, thread_id, "thread.created")[0]
    assert created.data["metadata"] == {**thread_key(context(), "jixu-agent"), "attempt": 1}
    assert run_threads(store, "R1") == [(thread_id, created.data["metadata"])]
    request = model.calls[0]
    assert request.instructions.startswith(DEFAULT_INSTRUCTIONS)
    assert "## Brief\nFix add() in calc.py" in request.instructions and "never .git" in request.instructions
    assert request.messages[0]["content"] == "Fix add() in calc.py so that the checks pass."
    assert sorted(t["name"] for t in request.tools) == ["edit_file", "list_files", "read_file", "run_command",
                                                        "write_file"]
    assert store.verify(stream_of(thread_id)).valid


def test_tool_refusals_reach_the_model_and_the_agent_goes_on(ws: Path) -> None:
    store = MemoryStore()
    model = ScriptedModel([
        ToolCall("write_file", {"path": "README.md", "content": "rewritten\n"}),
        ToolCall("read_file", {"path": "../../etc/passwd"}),
        ToolCall("edit_file", {"path": ".git/config", "old": "[core]", "new": "[x]"}),
        "I may only touch src/**; nothing else was changed.",
    ])
    provider = AgentProvider("agent", model, store=store, allowed_paths=["src/**"])
    result = run(provider.implement(ws, context()))
    assert result.summary.startswith("I may only touch src/**")
    failures = events_of(store, result.details["thread_id"], "tool.failed")
    assert [(f.data["error"]["code"], f.data["indeterminate"]) for f in failures] == [
        ("not_allowed", False), ("outside_workspace", False), ("not_allowed", False)]
    assert (ws / "README.md").read_text() == "# calc\n" and git(ws, "status", "--porcelain") == ""
    tool_messages = [m for m in model.calls[-1].messages if m["role"] == "tool"]
    assert len(tool_messages) == 3 and "allowed paths" in tool_messages[0]["content"]


def test_a_finished_thread_is_not_run_again(ws: Path) -> None:
    store = MemoryStore()
    model = ScriptedModel(fixing_script())
    provider = AgentProvider("agent", model, store=store)
    first = run(provider.implement(ws, context()))
    calls = len(model.calls)
    # A fresh provider object (as after a restart) finds the thread by its metadata; the same task attempt
    # dispatched again (the run lost the receipt) and a later attempt both get the recorded reply.
    for attempt in (1, 2):
        again = run(AgentProvider("agent", model, store=store).implement(ws, context(attempt=attempt)))
        assert again.summary == first.summary and again.details["thread_id"] == first.details["thread_id"]
        assert again.details["reopened"] is True and len(model.calls) == calls
    assert len(tool_events(store, first.details["thread_id"], "dispatched", "edit_file")) == 1


def test_a_repair_another_brief_another_provider_or_run_gets_a_fresh_thread(ws: Path) -> None:
    store = MemoryStore()
    provider = AgentProvider("agent", ScriptedModel(["done"]), store=store)
    first = run(provider.implement(ws, context())).details["thread_id"]
    evidence = {"checks": [{"name": "unit", "exit_status": 1, "output_excerpt": "AssertionError: -1 != 5"}]}
    model = ScriptedModel(["repaired"])
    repair = run(AgentProvider("agent", model, store=store).implement(ws, context(repair_of=evidence, attempt=1)))
    brief = run(provider.implement(ws, context("Another brief."))).details["thread_id"]
    other = run(AgentProvider("other-agent", ScriptedModel(["done"]), store=store).implement(ws, context()))
    run_2 = run(provider.implement(ws, context(run_id="R2"))).details["thread_id"]
    ids = {first, repair.details["thread_id"], brief, other.details["thread_id"], run_2}
    assert len(ids) == 5
    assert "## Repair" in model.calls[0].instructions and "AssertionError: -1 != 5" in model.calls[0].instructions
    assert model.calls[0].messages[0]["content"].endswith(REPAIR_MESSAGE)
    assert len(run_threads(store, "R1")) == 4 and [t for t, _ in run_threads(store, "R2")] == [run_2]
    assert len(run_threads(store)) == 5


def test_knowledge_goes_into_the_instructions(ws: Path) -> None:
    model = ScriptedModel(["ok"])
    run(AgentProvider("agent", model, store=MemoryStore()).implement(
        ws, context(knowledge={"notes": "calc.py is imported by the checks", "digest": "abc"})))
    assert "## Knowledge" in model.calls[0].instructions and "imported by the checks" in model.calls[0].instructions


def test_bad_input_writes_nothing(ws: Path) -> None:
    store = MemoryStore()
    provider = AgentProvider("agent", ScriptedModel(["x"]), store=store)
    for bad_context in (context(run_id=""), context(attempt=-1), context(brief=" ")):
        with pytest.raises(InvalidInput):
            run(provider.implement(ws, bad_context))
    with pytest.raises(InvalidInput):
        run(provider.implement(ws / "missing", context()))
    assert store.list_streams("thread/") == []


# --- outcomes that are not a finished implementation ------------------------------------------


@pytest.mark.parametrize("kind", ["quota", "authentication"])
def test_quota_and_authentication_pauses_raise_and_a_second_call_resumes_the_same_thread(
        ws: Path, kind: str) -> None:
    store = MemoryStore()
    model = FlakyModel([ModelError(f"{kind} problem", kind=kind, indeterminate=False, retry_after=30.0)],
                       reply="done after the pause")
    provider = AgentProvider("agent", model, store=store)
    with pytest.raises(ProviderError) as caught:
        run(provider.implement(ws, context()))
    error = caught.value
    assert error.kind == kind and error.retry_after == 30.0
    thread_id = error.details["thread_id"]
    assert len(model.requests) == 1  # operator pauses do not retry by themselves
    state = ThreadLog.load(store, thread_id).snapshot()
    assert state.status == "paused"

    # The run calls again with its next task attempt (after an operator's resume): the same thread goes on.
    result = run(AgentProvider("agent", model, store=store).implement(ws, context(attempt=2)))
    assert result.summary == "done after the pause" and result.details["thread_id"] == thread_id
    resumed = events_of(store, thread_id, "turn.resumed")
    assert [(e.data["reason"], e.data["actor"]) for e in resumed] == [("explicit", "run:R1")]
    assert len(events_of(store, thread_id, "turn.started")) == 1


def test_rate_limits_are_retried_by_the_thread_then_raise_rate_limit(ws: Path) -> None:
    store = MemoryStore()
    model = FlakyModel([ModelError("429", kind="rate_limit", indeterminate=False, retry_after=0.01)
                        for _ in range(4)], reply="finally")
    provider = AgentProvider("agent", model, store=store)
    with pytest.raises(ProviderError) as caught:
        run(provider.implement(ws, context()))
    assert caught.value.kind == "rate_limit" and caught.value.retry_after == 0.01
    assert caught.value.details["automatic_retries_used"] == 3 and len(model.requests) == 4
    result = run(provider.implement(ws, context(attempt=2)))
    assert result.summary == "finally" and len(model.requests) == 5


def test_a_transient_failure_within_the_automatic_retries_is_absorbed(ws: Path) -> None:
    store = MemoryStore()
    model = FlakyModel([ModelError("503", kind="transient", indeterminate=False, retry_after=0.01)],
                       reply="ok")
    result = run(AgentProvider("agent", model, store=store).implement(ws, context()))
    assert result.summary == "ok"
    pauses = events_of(store, result.details["thread_id"], "turn.paused")
    assert [(p.data["reason"], p.data["automatic"]) for p in pauses] == [("transient", True)]


def test_a_failed_thread_raises_implementation_failed_every_time(ws: Path) -> None:
    store = MemoryStore()
    model = ScriptedModel([ToolCall("list_files", {})])  # the script runs out: a determinate model error
    provider = AgentProvider("agent", model, store=store)
    with pytest.raises(AgentImplementationFailed) as caught:
        run(provider.implement(ws, context()))
    assert caught.value.code == "agent_implementation_failed"
    assert caught.value.details["status"] == "failed" and "invalid_request" in str(caught.value.details["error"])
    calls = len(model.calls)
    with pytest.raises(AgentImplementationFailed):
        run(provider.implement(ws, context()))
    assert len(model.calls) == calls


def test_max_steps_fails_the_implementation(ws: Path) -> None:
    model = ScriptedModel(lambda messages: ToolCall("list_files", {}))
    provider = AgentProvider("agent", model, store=MemoryStore(), max_steps=3)
    with pytest.raises(AgentImplementationFailed) as caught:
        run(provider.implement(ws, context()))
    assert caught.value.details["error"]["type"] == "max_steps" and len(model.calls) == 3


def test_an_unknown_tool_outcome_is_settled_against_the_workspace_and_the_agent_goes_on(ws: Path) -> None:
    store = MemoryStore()
    state = {"raised": False}

    def script(messages: list[dict[str, Any]]) -> Step:
        tool_results = [m for m in messages if m["role"] == "tool"]
        if not tool_results:
            # A command whose tool breaks unexpectedly (an exception that is not a ToolError): unknown outcome.
            return ToolCall("run_command", {"argv": [sys.executable, "-c", "print(1)"]})
        if len(tool_results) == 1:
            return ToolCall("read_file", {"path": "calc.py"})
        return f"inspected after: {tool_results[0]['content'][:40]}"

    provider = AgentProvider("agent", ScriptedModel(script), store=store)
    original = AgentProvider.agent_for

    def agent_for(self: AgentProvider, root: Path, ctx: ImplementContext) -> Any:
        agent = original(self, root, ctx)
        command = next(t for t in agent.tools if t.name == "run_command")
        real = command.fn

        async def breaking(argv: list[str], timeout: float | None = None) -> dict[str, Any]:
            result: dict[str, Any] = await real(argv, timeout)
            if not state["raised"]:
                state["raised"] = True
                raise RuntimeError("the worker's pipe broke after the command ran")
            return result

        object.__setattr__(command, "_fn", breaking)
        return agent

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(AgentProvider, "agent_for", agent_for)
        result = run(provider.implement(ws, context()))
    thread_id = result.details["thread_id"]
    [settled] = result.details["settled_unknown"]
    assert settled["tool"] == "run_command"
    [resolution] = events_of(store, thread_id, "tool.outcome_resolved")
    assert resolution.data["resolution"] == "abandoned_unknown" and resolution.data["actor"] == "run:R1"
    evidence = resolution.data["evidence"]["workspace"]
    assert evidence["head"] == git(ws, "rev-parse", "HEAD").strip() and evidence["changed_count"] == 0
    assert result.summary.startswith("inspected after: The outcome of this call is unknown")
    assert len(tool_events(store, thread_id, "dispatched", "run_command")) == 1


# --- crashes ----------------------------------------------------------------------------------

CHILD = """
import asyncio, sys
from tests.runs.test_agent_provider import crash_child
asyncio.run(crash_child(*sys.argv[1:]))
"""


async def crash_child(url: str, workspace: str, marker: str, mode: str, owner: str, lease_ttl: str) -> None:
    """Run in a child process: the provider works until ``marker`` exists, then hangs there (to be killed)."""

    async def script(messages: list[dict[str, Any]]) -> Step:
        done = sum(1 for m in messages if m["role"] == "assistant")
        if mode == "write" and done == 0:
            return ToolCall("write_file", {"path": "calc.py", "content": FIXED})
        if mode == "write":  # the second model call is cut off by the kill
            Path(marker).write_text("x")
            await asyncio.sleep(3600)
        pid_file = Path(workspace).parent / "command.pid"
        code = (f"import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); "
                f"open({marker!r}, 'w').write('x'); time.sleep(60)")
        return ToolCall("run_command", {"argv": [sys.executable, "-c", code]})

    provider = AgentProvider("agent", ScriptedModel(script), store=url, owner=owner, lease_ttl=float(lease_ttl))
    await provider.implement(Path(workspace), context())


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for child in started:
        if child.poll() is None:
            child.kill()
            child.wait(30)


def start_and_kill(children: list[subprocess.Popen[str]], url: str, ws: Path, mode: str, owner: str,
                   lease_ttl: float = 30.0) -> None:
    marker = ws.parent / "marker"
    child = spawn_python(CHILD, url, str(ws), str(marker), mode, owner, str(lease_ttl))
    children.append(child)
    deadline = time.monotonic() + 30
    while not marker.exists():
        if child.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the child stopped early: {child.communicate()}")
        time.sleep(0.01)
    child.send_signal(signal.SIGKILL)
    child.wait(30)


def continuing(reply: str) -> ScriptedModel:
    """The model after the crash: runs the checks, then finishes."""
    def script(messages: list[dict[str, Any]]) -> Step:
        if not any(m["role"] == "tool" and m["name"] == "run_command" for m in messages):
            return ToolCall("run_command", {"argv": [sys.executable, "-c", CHECK]})
        return reply
    return ScriptedModel(script)


@pytest.mark.crash
def test_a_killed_worker_resumes_the_same_thread_without_repeating_the_write(
        ws: Path, tmp_path: Path, children: list[subprocess.Popen[str]]) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    start_and_kill(children, url, ws, "write", owner="worker-1")
    assert (ws / "calc.py").read_text() == FIXED  # the write happened before the kill

    store = SQLiteStore(tmp_path / "ledger.db")
    [(thread_id, _)] = run_threads(store, "R1")
    provider = AgentProvider("agent", continuing("fixed and checked"), store=store, owner="worker-1")
    result = run(provider.implement(ws, context()))
    assert result.summary == "fixed and checked" and result.details["thread_id"] == thread_id
    assert result.details["reopened"] is True
    assert len(tool_events(store, thread_id, "requested", "write_file")) == 1
    assert len(tool_events(store, thread_id, "dispatched", "write_file")) == 1  # the write tool ran once
    command = tool_events(store, thread_id, "completed", "run_command")[0].data["result"]
    assert command["stdout"] == "checks pass\n"
    claims = [e.data["reason"] for e in events_of(store, thread_id, "turn.claimed")]
    assert claims[-1] == "reclaimed_by_same_owner"
    # The model call cut off by the kill was retried under its own identity.
    dispatched = events_of(store, thread_id, "model.dispatched")
    assert [e.data["attempt"] for e in dispatched].count(2) == 1
    assert run_threads(store, "R1") == [(thread_id, {**thread_key(context(), "agent"), "attempt": 1})]
    assert store.verify(stream_of(thread_id)).valid
    store.close()


@pytest.mark.crash
def test_another_worker_on_this_machine_takes_a_dead_owner_over_at_once(
        ws: Path, tmp_path: Path, children: list[subprocess.Popen[str]]) -> None:
    """The dead worker's process is proven gone (same boot, pid gone): its live lease is not waited for."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    start_and_kill(children, url, ws, "write", owner="worker-1", lease_ttl=30.0)
    store = SQLiteStore(tmp_path / "ledger.db")
    provider = AgentProvider("agent", continuing("taken over"), store=store, owner="worker-2", lease_ttl=30.0)
    result = run(provider.implement(ws, context()))
    assert result.summary == "taken over"
    thread_id = result.details["thread_id"]
    [*_, taken] = events_of(store, thread_id, "turn.claimed")
    assert taken.data["reason"] == "took_over_dead_owner" and taken.data["proof"]["found"] == "no such process"
    assert len(tool_events(store, thread_id, "dispatched", "write_file")) == 1
    store.close()


def test_another_machine_waits_for_the_dead_owners_lease_then_takes_over(
        ws: Path, tmp_path: Path, children: list[subprocess.Popen[str]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen from another machine (another boot id) nothing proves the owner gone: its lease is honoured."""
    url = f"sqlite:///{tmp_path}/ledger.db"
    start_and_kill(children, url, ws, "write", owner="worker-1", lease_ttl=3.0)
    monkeypatch.setattr(ownership, "_IDENTITY", (os.getpid(), {**ownership.process_identity(), "boot_id": "elsewhere"}))
    store = SQLiteStore(tmp_path / "ledger.db")
    provider = AgentProvider("agent", continuing("taken over"), store=store, owner="worker-2", lease_ttl=3.0)
    with pytest.raises(ProviderError) as caught:
        run(provider.implement(ws, context()))
    assert caught.value.kind == "transient" and 0 < (caught.value.retry_after or 0) <= 3.1
    assert "owned by another process" in caught.value.message
    time.sleep(caught.value.retry_after or 0)
    result = run(provider.implement(ws, context()))
    assert result.summary == "taken over"
    thread_id = result.details["thread_id"]
    assert [e.data["reason"] for e in events_of(store, thread_id, "turn.claimed")][-1] == "took_over_expired"
    assert len(tool_events(store, thread_id, "dispatched", "write_file")) == 1
    store.close()


@pytest.mark.crash
def test_a_command_cut_off_by_a_kill_is_settled_not_rerun(
        ws: Path, tmp_path: Path, children: list[subprocess.Popen[str]]) -> None:
    url = f"sqlite:///{tmp_path}/ledger.db"
    pid_file = tmp_path / "command.pid"
    try:
        start_and_kill(children, url, ws, "command", owner="worker-1")
    finally:
        # The command ran in its own session: the kill of its worker did not reach it (this test started it).
        with contextlib.suppress(ValueError, FileNotFoundError, ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    store = SQLiteStore(tmp_path / "ledger.db")
    [(thread_id, _)] = run_threads(store, "R1")
    assert ThreadLog.load(store, thread_id).snapshot().status == "waiting"

    def script(messages: list[dict[str, Any]]) -> Step:
        answer = [m for m in messages if m["role"] == "tool"][-1]
        return f"saw: {answer['content'][:30]}"

    provider = AgentProvider("agent", ScriptedModel(script), store=store, owner="worker-1")
    result = run(provider.implement(ws, context()))
    assert result.summary == "saw: The outcome of this call is un"
    assert [s["tool"] for s in result.details["settled_unknown"]] == ["run_command"]
    assert len(tool_events(store, thread_id, "dispatched", "run_command")) == 1  # not run again
    [resolution] = events_of(store, thread_id, "tool.outcome_resolved")
    assert resolution.data["resolution"] == "abandoned_unknown"
    assert resolution.data["evidence"]["workspace"]["head"] == git(ws, "rev-parse", "HEAD").strip()
    assert store.verify(stream_of(thread_id)).valid
    store.close()


def test_a_live_owner_s_unknown_call_is_not_settled(ws: Path) -> None:
    """A thread waiting on a call another live process may still be running: transient, nothing recorded."""
    store = MemoryStore()
    started = asyncio.Event()

    async def scenario() -> None:
        async def script(messages: list[dict[str, Any]]) -> Step:
            if not any(m["role"] == "tool" for m in messages):
                return ToolCall("run_command", {"argv": ["sleep", "30"]})
            return "done"

        first = AgentProvider("agent", ScriptedModel(script), store=store, owner="worker-1")
        task = asyncio.ensure_future(first.implement(ws, context()))
        deadline = time.monotonic() + 10
        while not any(e.type == "tool.dispatched" for t, _ in run_threads(store, "R1") for e in
                      events_of(store, t)):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        started.set()
        # The running call has no receipt yet: to another process the thread waits on an unknown outcome.
        second = AgentProvider("agent", ScriptedModel(["never"]), store=store, owner="worker-2")
        with pytest.raises(ProviderError) as caught:
            await second.implement(ws, context())
        assert caught.value.kind == "transient"
        [(thread_id, _)] = run_threads(store, "R1")
        assert events_of(store, thread_id, "tool.outcome_resolved") == []
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    run(scenario())
    assert started.is_set()


def test_cancelling_implement_stops_the_thread_and_a_later_call_continues(ws: Path) -> None:
    store = MemoryStore()
    gate = asyncio.Event()

    async def scenario() -> None:
        async def slow(messages: list[dict[str, Any]]) -> Step:
            done = sum(1 for m in messages if m["role"] == "assistant")
            if done == 0:
                return ToolCall("write_file", {"path": "calc.py", "content": FIXED})
            gate.set()
            await asyncio.sleep(3600)
            return "unreachable"

        provider = AgentProvider("agent", ScriptedModel(slow), store=store, owner="worker-1")
        task = asyncio.ensure_future(provider.implement(ws, context()))
        await asyncio.wait_for(gate.wait(), 10)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        [(thread_id, _)] = run_threads(store, "R1")
        failed = events_of(store, thread_id, "model.failed")
        assert failed and failed[-1].data["error"] == {"type": "interrupted"}
        result = await AgentProvider("agent", continuing("continued"), store=store,
                                     owner="worker-1").implement(ws, context())
        assert result.summary == "continued" and result.details["thread_id"] == thread_id
        assert len(tool_events(store, thread_id, "dispatched", "write_file")) == 1

    run(scenario())


def test_an_interrupted_turn_is_continued_with_a_new_turn(ws: Path) -> None:
    store = MemoryStore()

    async def scenario() -> None:
        gate = asyncio.Event()

        async def slow(messages: list[dict[str, Any]]) -> Step:
            gate.set()
            await asyncio.sleep(3600)
            return "unreachable"

        provider = AgentProvider("agent", ScriptedModel(slow), store=store)
        task = asyncio.ensure_future(provider.implement(ws, context()))
        await asyncio.wait_for(gate.wait(), 10)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        [(thread_id, _)] = run_threads(store, "R1")
        # An operator ends the stuck turn (jixu threads interrupt): the thread is idle without a reply.
        harness_thread = await provider_harness(provider, ws).open_thread(thread_id, resume=False)
        await harness_thread.interrupt("operator stopped it")
        model = ScriptedModel(lambda messages: "picked up again")
        result = await AgentProvider("agent", model, store=store).implement(ws, context())
        assert result.summary == "picked up again"
        assert model.calls[-1].messages[-1]["content"] == CONTINUE_MESSAGE
        assert len(events_of(store, thread_id, "turn.started")) == 2

    run(scenario())


def provider_harness(provider: AgentProvider, ws: Path) -> Any:
    from jixu.threads import Harness

    return Harness(provider.agent_for(ws.resolve(), context()), provider.store)
