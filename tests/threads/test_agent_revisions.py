"""Agent revisions: a thread takes a new definition of its agent as its next revision, unless the change would
alter an effect still open; replay projects each turn under the revision it ran with; the CLI and the HTTP API
show the revision."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from jixu import (
    Agent,
    Harness,
    IncompatibleAgent,
    MemoryStore,
    ScriptedModel,
    SQLiteStore,
    ToolCall,
    tool,
)
from jixu.ledger import Store
from jixu.ledger.encoding import JSONObject
from jixu.threads.log import ThreadLog
from jixu.threads.model import Step
from tests.helpers import python_env


@tool(semantics="read_only")
def lookup(order: str) -> str:
    """Read an order's status."""
    return f"order {order} shipped"


@tool(semantics="unsafe")
def pay(order: str) -> str:
    """Charge an order; the connection drops after the request was sent."""
    raise ConnectionError(f"reset after sending the payment for {order}")


@tool(semantics="unsafe", requires_approval=True)
def wire(amount: int) -> str:
    """Wire money (an operator approves)."""
    return f"wired {amount}"


@tool(semantics="read_only")
def echo(text: str) -> str:
    """An extra tool."""
    return text


def _wire_changed() -> Any:
    def wire(amount: int, currency: str = "EUR") -> str:
        """Wire money in a currency (an operator approves)."""
        return f"wired {amount} {currency}"

    return tool(semantics="unsafe", requires_approval=True)(wire)


def script(messages: list[JSONObject]) -> Step:
    last = messages[-1]
    if last.get("role") == "tool":
        return f"done: {last.get('status')}"
    text = str(last.get("content"))
    if text.startswith("pay"):
        return ToolCall("pay", {"order": "1"})
    if text.startswith("wire"):
        return ToolCall("wire", {"amount": 5})
    if text.startswith("echo"):
        return ToolCall("echo", {"text": "hi"})
    return ToolCall("lookup", {"order": "1"})


def agent(*tools: Any, model: str = "scripted", instructions: str = "") -> Agent:
    return Agent("ops", ScriptedModel(script, name=model), instructions=instructions,
                 tools=list(tools) or [lookup, pay, wire])


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def events_of(store: Store, thread_id: str) -> list[Any]:
    return ThreadLog.load(store, thread_id).events()


async def _thread(store: Store, text: str, made: Agent | None = None) -> tuple[str, Any]:
    harness = Harness(made or agent(), store)
    thread = await harness.create_thread()
    await thread.send(text)
    return thread.thread_id, await thread.wait()


def test_a_new_tool_is_accepted_recorded_as_a_revision_and_offered_from_the_next_turn() -> None:
    store = MemoryStore()

    async def go() -> None:
        thread_id, state = await _thread(store, "lookup 1")
        assert state.status == "idle" and state.revision == 1
        head = len(events_of(store, thread_id))
        newer = Harness(agent(lookup, pay, wire, echo, model="scripted-2", instructions="Be brief."), store)
        thread = await newer.open_thread(thread_id)
        assert len(events_of(store, thread_id)) == head, "opening records nothing"
        await thread.send("echo hi")
        state = await thread.wait()
        assert state.status == "idle" and state.last_reply == "done: ok", state.reason
        events = events_of(store, thread_id)
        kinds = [e.type for e in events[head:]]
        assert kinds[:2] == ["agent.revised", "turn.started"], kinds
        revised = events[head].data
        assert revised["revision"] == 2 and revised["previous"]["revision"] == 1
        assert revised["changes"]["tools_added"] == ["echo"] and revised["changes"]["tools_removed"] == []
        assert revised["changes"]["model"] == {"from": "scripted", "to": "scripted-2"}
        assert revised["agent"]["tools"]["echo"] and revised["agent"]["digest"] == newer.agent.digest
        assert state.revision == 2 and [r["revision"] for r in state.revisions] == [1, 2]
        assert [t["revisions"] for t in state.turns] == [[1], [2]]
        assert state.agent["model"] == "scripted-2"
        again = await newer.open_thread(thread_id)
        await again.send("lookup 2")
        await again.wait()
        assert [e.type for e in events_of(store, thread_id)].count("agent.revised") == 1, "one revision per change"

    run(go())


def test_a_removed_tool_with_an_unknown_call_is_refused_naming_the_effect_until_it_is_resolved() -> None:
    store = MemoryStore()

    async def go() -> None:
        thread_id, state = await _thread(store, "pay 1")
        assert state.status == "waiting"
        [waiting] = state.waiting_on
        effect_id = waiting["effect_id"]
        head = len(events_of(store, thread_id))
        without_pay = Harness(agent(lookup, wire), store)
        with pytest.raises(IncompatibleAgent) as refused:
            await without_pay.open_thread(thread_id)
        message = refused.value.message
        assert effect_id in message and "tool 'pay' was removed" in message and "unknown" in message
        assert f"jixu threads resolve STORE {thread_id} {effect_id}" in message
        assert refused.value.details["effect_id"] == effect_id
        assert len(events_of(store, thread_id)) == head, "a refusal writes nothing"
        ThreadLog.load(store, thread_id).resolve(effect_id, "not_occurred", note="the bank has no charge")
        reopened = await without_pay.open_thread(thread_id)  # nothing open any more: the change is accepted
        state = await reopened.wait()
        assert state.status == "idle" and state.revision == 2, state.reason
        assert state.revisions[-1]["changes"]["tools_removed"] == ["pay"]

    run(go())


def test_a_removed_tool_with_no_open_call_is_accepted() -> None:
    store = MemoryStore()

    async def go() -> None:
        thread_id, _ = await _thread(store, "lookup 1")
        without_pay = Harness(agent(lookup, wire), store)
        thread = await without_pay.open_thread(thread_id)
        await thread.send("lookup 2")
        state = await thread.wait()
        assert state.status == "idle" and state.revision == 2
        assert state.revisions[-1]["changes"]["tools_removed"] == ["pay"]

    run(go())


def test_a_changed_tool_with_a_parked_call_is_refused_and_approving_it_first_settles_it() -> None:
    store = MemoryStore()

    async def go() -> None:
        thread_id, state = await _thread(store, "wire 5")
        [parked] = state.waiting_on
        changed = Harness(agent(lookup, pay, _wire_changed()), store)
        with pytest.raises(IncompatibleAgent) as refused:
            await changed.open_thread(thread_id)
        assert parked["effect_id"] in refused.value.message and "tool 'wire' changed" in refused.value.message
        assert "approve or deny it first" in refused.value.message
        ThreadLog.load(store, thread_id).decide_parked(parked["effect_id"], "denied", actor="ops")
        thread = await changed.open_thread(thread_id)
        state = await thread.wait()
        assert state.status == "idle" and state.revision == 2, state.reason
        assert state.revisions[-1]["changes"]["tools_changed"] == ["wire"]
        assert [t["revisions"] for t in state.turns] == [[1, 2]], "the rest of the turn ran under revision 2"

    run(go())


def test_a_record_without_tool_digests_is_judged_by_the_open_calls_intents() -> None:
    """Threads recorded before revisions existed name no digest per tool: an added tool is accepted while a
    call is unknown; a change of that call's tool (its semantics) is refused."""
    store = MemoryStore()

    async def go() -> None:
        old = agent()
        record = {k: v for k, v in old.describe().items() if k != "tools"}
        log = ThreadLog.create(store, record)
        thread = await Harness(old, store).open_thread(log.thread_id)
        await thread.send("pay 1")
        state = await thread.wait()
        assert state.status == "waiting"

        @tool(semantics="idempotent")
        def pay(order: str) -> str:  # the same tool, now declared idempotent
            """Charge an order."""
            return "paid"

        with pytest.raises(IncompatibleAgent) as refused:
            await Harness(agent(lookup, pay, wire), store).open_thread(log.thread_id)
        assert "semantics" in refused.value.message
        await Harness(agent(lookup, globals()["pay"], wire, echo), store).open_thread(log.thread_id)

    run(go())


def test_replay_and_fork_project_each_turn_under_the_revision_it_ran_with() -> None:
    store = MemoryStore()

    async def go() -> None:
        thread_id, _ = await _thread(store, "lookup 1")
        newer = Harness(agent(lookup, pay, wire, echo), store)
        thread = await newer.open_thread(thread_id)
        await thread.send("echo hi")
        online = await thread.wait()
        events = await thread.events()
        [revised] = [e for e in events if e.type == "agent.revised"]
        whole = await thread.replay()
        assert whole.to_dict()["revisions"] == online.to_dict()["revisions"] and whole.turns == online.turns
        before = await thread.replay(revised.seq - 1)
        assert before.revision == 1 and [t["revisions"] for t in before.turns] == [[1]]
        assert before.agent == online.revisions[0]["agent"]
        reopened = ThreadLog.load(store, thread_id).snapshot()  # from the checkpoint, too
        assert reopened.to_dict()["revisions"] == online.to_dict()["revisions"]
        first_turn_end = next(e for e in events if e.type == "turn.ended")
        child = await thread.fork(first_turn_end.id)
        assert [r["revision"] for r in child.state().revisions] == [1, 2]
        assert child.state().revisions[-1]["changes"] == {"by": "fork"}
        assert [t["revisions"] for t in child.state().turns] == [[1]]
        later = await thread.fork(events[-1].id)
        assert [r["revision"] for r in later.state().revisions] == [1, 2], "the fork's agent is the parent's latest"

    run(go())


def test_the_cli_and_the_http_api_show_the_revision_and_a_durable_run(tmp_path: Path) -> None:
    from tests.server.conftest import start_api

    db = tmp_path / "api.db"
    store = SQLiteStore(db)
    api, server = start_api(store, tmp_path)
    try:
        async def go() -> str:
            harness = Harness(agent(), store)
            thread = await harness.create_thread(metadata={"project": "alpha"})
            await thread.send("lookup 1")
            await thread.wait()
            newer = Harness(agent(lookup, pay, wire, echo), store)
            reopened = await newer.open_thread(thread.thread_id)
            await reopened.send("echo hi")
            await reopened.wait()
            return thread.thread_id

        async def steps() -> str:
            async with Harness(agent(), store).durable(metadata={"project": "alpha"}, name="sync") as durable:
                await durable.effect("lookup_remote", {"id": 3}, semantics="read_only", call=lambda ctx: "found")
                return durable.thread_id

        thread_id = run(go())
        steps_id = run(steps())
        durable_state = api.client().get(f"/threads/{steps_id}").json()
        assert durable_state["status"] == "idle" and durable_state["turns"][0]["steps"] is True
        assert [e["name"] for e in durable_state["effects"].values()] == ["lookup_remote"]
        body = api.client().get(f"/threads/{thread_id}").json()
        assert body["revision"] == 2 and [t["revisions"] for t in body["turns"]] == [[1], [2]], body
        assert body["revisions"][1]["changes"]["tools_added"] == ["echo"]
    finally:
        api.close()
        server.stop()
        store.close()
    shown = subprocess.run([sys.executable, "-m", "jixu", "threads", "show", str(db), thread_id, "--json"],
                           capture_output=True, text=True, env=python_env(), check=False)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["revision"] == 2
    steps_shown = subprocess.run([sys.executable, "-m", "jixu", "threads", "show", str(db), steps_id, "--json"],
                                 capture_output=True, text=True, env=python_env(), check=False)
    assert json.loads(steps_shown.stdout)["effects"], steps_shown.stderr
    human = subprocess.run([sys.executable, "-m", "jixu", "threads", "show", str(db), thread_id],
                           capture_output=True, text=True, env={**python_env(), "COLUMNS": "200"}, check=False)
    assert human.returncode == 0 and "revision 2" in human.stdout, human.stdout + human.stderr
