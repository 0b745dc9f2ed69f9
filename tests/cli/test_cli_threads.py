"""``jixu threads …`` as an operator runs it: a real subprocess over a ledger a real Harness wrote."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.ledger import SQLiteStore, new_id
from jixu.ledger.encoding import JSONObject
from jixu.threads.log import ThreadLog, stream_of
from jixu.threads.model import Step
from tests.helpers import run_jixu


@tool(semantics="unsafe")
def pay(order: str, amount: float) -> str:
    """Charge an order; the connection drops after the request was sent (an indeterminate failure)."""
    raise RuntimeError(f"connection reset after sending the payment for {order}")


@tool(requires_approval=True)
def delete_account(user: str) -> str:
    """Delete a user's account (needs an operator's approval)."""
    return f"deleted {user}"


@tool(semantics="read_only")
def lookup(order: str) -> str:
    """Read an order's status."""
    return f"order {order} shipped"


def script(messages: list[JSONObject]) -> Step:
    """Call the tool the user asked for, then report the tool message's status."""
    last = messages[-1]
    if last.get("role") == "tool":
        return f"done: {last.get('status')}"
    text = str(last.get("content"))
    if text.startswith("pay"):
        return ToolCall("pay", {"order": "1", "amount": 9.5})
    if text.startswith("delete"):
        return ToolCall("delete_account", {"user": "bob"})
    return ToolCall("lookup", {"order": "1"})


def make_agent() -> Agent:
    return Agent("ops", ScriptedModel(script), tools=[pay, delete_account, lookup])


@dataclass
class Ledger:
    """A store with three threads: an unknown unsafe payment, a parked deletion, a finished lookup."""

    db: Path
    unknown: str
    pay_effect: str
    parked: str
    delete_effect: str
    done: str

    def count(self, thread_id: str) -> int:
        with SQLiteStore(self.db) as store:
            return len(store.read(stream_of(thread_id)))

    def streams(self) -> int:
        with SQLiteStore(self.db) as store:
            return len(store.list_streams("", limit=10_000))

    def state(self, thread_id: str) -> dict[str, Any]:
        with SQLiteStore(self.db) as store:
            return ThreadLog.load(store, thread_id).snapshot().to_dict()


async def _build(db: Path) -> Ledger:
    async with Harness(make_agent(), db) as harness:
        ids = []
        for text in ("pay order 1", "delete user bob", "lookup order 1"):
            thread = await harness.create_thread()
            await thread.send(text)
            await thread.wait()
            ids.append(thread)
        unknown, parked, done = ids
        pay_effect = next(e for e, d in unknown.state().effects.items() if d.name == "pay")
        delete_effect = next(e for e, d in parked.state().effects.items() if d.name == "delete_account")
        return Ledger(db, unknown.thread_id, pay_effect, parked.thread_id, delete_effect, done.thread_id)


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    return asyncio.run(_build(tmp_path / "ops.db"))


async def _continue(db: Path, thread_id: str) -> dict[str, Any]:
    """What the application that owns the agent does: open the thread and let it continue."""
    async with Harness(make_agent(), db) as harness:
        thread = await harness.open_thread(thread_id)
        return (await thread.wait()).to_dict()


def jixu(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_jixu("threads", *args, cwd=cwd)


def as_json(*args: str) -> tuple[int, Any]:
    result = jixu(*args, "--json")
    return result.returncode, json.loads(result.stdout)


def test_the_ledger_the_tests_build_is_what_they_claim(ledger: Ledger) -> None:
    unknown = ledger.state(ledger.unknown)
    assert unknown["status"] == "waiting"
    assert unknown["effects"][ledger.pay_effect]["state"] == "unknown"
    assert unknown["effects"][ledger.pay_effect]["reason"] == "indeterminate_failure"
    parked = ledger.state(ledger.parked)
    assert parked["status"] == "waiting" and parked["effects"][ledger.delete_effect]["state"] == "parked"
    assert ledger.state(ledger.done)["last_reply"] == "done: ok"


def test_list_shows_each_thread_with_its_status(ledger: Ledger) -> None:
    code, rows = as_json("list", str(ledger.db))
    assert code == 0
    by_id = {row["thread_id"]: row for row in rows}
    assert set(by_id) == {ledger.unknown, ledger.parked, ledger.done}
    assert by_id[ledger.unknown]["status"] == "waiting"
    assert by_id[ledger.unknown]["waiting_on"] == [ledger.pay_effect]
    assert by_id[ledger.done]["status"] == "idle" and by_id[ledger.done]["last_reply"] == "done: ok"
    assert by_id[ledger.done]["events"] == ledger.count(ledger.done)
    human = jixu("list", str(ledger.db))
    assert human.returncode == 0, human.stderr
    assert ledger.unknown in human.stdout and "waiting" in human.stdout and "done: ok" in human.stdout
    assert "3 thread(s)" in human.stdout


def test_show_gives_the_resolver_table_and_the_exact_command_to_resolve(ledger: Ledger) -> None:
    code, state = as_json("show", str(ledger.db), ledger.unknown)
    assert code == 0
    assert state == ledger.state(ledger.unknown)
    human = jixu("show", str(ledger.db), ledger.unknown)
    assert human.returncode == 0, human.stderr
    out = human.stdout
    assert "waiting" in out and "unknown" in out and "indeterminate_failure" in out and "pay" in out
    assert "open (waiting)" in out and "running" not in out, "its unended turn is shown as its thread is"
    assert (f"jixu threads resolve {ledger.db} {ledger.unknown} {ledger.pay_effect} --resolution not_occurred "
            '--note "what you checked"') in out
    parked = jixu("show", str(ledger.db), ledger.parked)
    assert f"jixu threads approve {ledger.db} {ledger.parked} {ledger.delete_effect}" in parked.stdout
    assert "parked" in parked.stdout


def test_events_lists_the_thread_in_order_from_a_seq(ledger: Ledger) -> None:
    code, events = as_json("events", str(ledger.db), ledger.unknown)
    assert code == 0
    assert [e["seq"] for e in events] == list(range(1, ledger.count(ledger.unknown) + 1))
    assert events[0]["type"] == "thread.created"
    assert [e["type"] for e in events[-2:]] == ["tool.dispatched", "tool.failed"]
    code, tail = as_json("events", str(ledger.db), ledger.unknown, "--from-seq", "3")
    assert code == 0 and tail == events[2:]
    human = jixu("events", str(ledger.db), ledger.unknown)
    assert "tool.failed" in human.stdout and ledger.pay_effect in human.stdout


def test_verify_passes_and_exits_1_once_the_ledger_is_tampered_with(ledger: Ledger) -> None:
    code, report = as_json("verify", str(ledger.db), ledger.done)
    assert code == 0 and report["valid"] is True
    assert report["chain"]["count"] == ledger.count(ledger.done)
    assert "valid" in jixu("verify", str(ledger.db), ledger.done).stdout
    raw = sqlite3.connect(ledger.db)
    raw.execute("DROP TRIGGER jixu_events_no_update")
    raw.execute("UPDATE jixu_events SET data = replace(data, 'shipped', 'lost') WHERE stream = ? AND "
                "type = 'tool.completed'", (stream_of(ledger.done),))
    raw.commit()
    raw.close()
    code, report = as_json("verify", str(ledger.db), ledger.done)
    assert code == 1 and report["valid"] is False and report["chain"]["reason"] == "payload_changed"
    human = jixu("verify", str(ledger.db), ledger.done)
    assert human.returncode == 1 and "INVALID" in human.stdout
    shown = jixu("show", str(ledger.db), ledger.done, "--json")
    assert shown.returncode == 1 and json.loads(shown.stdout)["status"] == "corrupt"


def test_replay_rebuilds_any_point_of_the_history_and_writes_nothing(ledger: Ledger) -> None:
    before = ledger.count(ledger.done)
    code, full = as_json("replay", str(ledger.db), ledger.done)
    assert code == 0
    live = ledger.state(ledger.done)
    assert {k: full[k] for k in ("status", "last_reply", "effects", "seq", "head_hash")} == {
        k: live[k] for k in ("status", "last_reply", "effects", "seq", "head_hash")}
    code, early = as_json("replay", str(ledger.db), ledger.done, "--upto", "2")
    assert code == 0 and early["seq"] == 2 and early["effects"] == {} and early["last_reply"] is None
    events = json.loads(jixu("events", str(ledger.db), ledger.done, "--json").stdout)
    tool_requested = next(e for e in events if e["type"] == "tool.requested")
    code, mid = as_json("replay", str(ledger.db), ledger.done, "--upto", tool_requested["id"])
    assert code == 0 and mid["seq"] == tool_requested["seq"]
    assert mid["effects"][tool_requested["data"]["effect_id"]]["state"] == "not_dispatched"
    human = jixu("replay", str(ledger.db), ledger.done)
    assert human.returncode == 0 and "No model, tool or other driver was called" in human.stdout
    assert jixu("replay", str(ledger.db), ledger.done, "--upto", "0").returncode == 6
    assert jixu("replay", str(ledger.db), ledger.done, "--upto", "not-an-id").returncode == 6
    assert jixu("replay", str(ledger.db), ledger.done, "--upto", new_id()).returncode == 3
    assert ledger.count(ledger.done) == before


def test_resolve_records_the_decision_once_and_the_application_continues(ledger: Ledger) -> None:
    before = ledger.count(ledger.unknown)
    rid = new_id()
    args = ("resolve", str(ledger.db), ledger.unknown, ledger.pay_effect, "--resolution", "occurred",
            "--note", "the bank statement shows the charge", "--resolution-id", rid, "--actor", "alice")
    code, first = as_json(*args)
    assert code == 0, first
    assert first["recorded"] is True
    assert first["effect"]["state"] == "unknown" and first["effect"]["reason"] == "resolved_by_operator"
    assert first["effect"]["resolution"]["resolution"] == "occurred"
    assert first["effect"]["resolution"]["actor"] == "alice"
    assert ledger.count(ledger.unknown) == before + 1
    code, again = as_json(*args)
    assert code == 0 and again["recorded"] is False
    assert ledger.count(ledger.unknown) == before + 1
    human = jixu(*args)
    assert human.returncode == 0 and "nothing written" in human.stdout
    changed = list(args)
    changed[changed.index("--note") + 1] = "a different note"
    code, conflict = as_json(*changed)
    assert code == 4 and conflict["error"]["code"] == "resolution_conflict"
    other_id = list(args)
    other_id[other_id.index("--resolution-id") + 1] = new_id()
    assert jixu(*other_id).returncode == 4
    assert ledger.count(ledger.unknown) == before + 1
    finished = asyncio.run(_continue(ledger.db, ledger.unknown))
    assert finished["status"] == "idle" and finished["last_reply"] == "done: occurred"


def test_resolve_human_output_prints_the_effect_and_how_the_thread_continues(ledger: Ledger) -> None:
    result = jixu("resolve", str(ledger.db), ledger.unknown, ledger.pay_effect, "--resolution", "not_occurred",
                  "--note", "no charge at the bank")
    assert result.returncode == 0, result.stderr
    assert "resolved as not_occurred" in result.stdout and "resolved_by_operator" in result.stdout
    assert "Harness.open_thread" in result.stdout
    recorded = ledger.state(ledger.unknown)["effects"][ledger.pay_effect]["resolution"]
    assert recorded["actor"].startswith("cli:") and recorded["note"] == "no charge at the bank"


def test_resolve_records_evidence_with_the_decision(ledger: Ledger) -> None:
    code, result = as_json("resolve", str(ledger.db), ledger.unknown, ledger.pay_effect, "--resolution", "occurred",
                           "--note", "statement line 14", "--evidence", '{"bank_ref": "TX-991"}')
    assert code == 0, result
    assert result["effect"]["resolution"]["evidence"] == {"bank_ref": "TX-991"}


def test_resolve_occurred_with_the_observed_result_records_it_for_the_model(ledger: Ledger) -> None:
    code, result = as_json("resolve", str(ledger.db), ledger.unknown, ledger.pay_effect, "--resolution", "occurred",
                           "--note", "statement line 14", "--result", '{"charged": "TX-991"}')
    assert code == 0, result
    with SQLiteStore(ledger.db) as store:
        [resolved] = [e.data for e in store.read(f"thread/{ledger.unknown}") if e.type == "tool.outcome_resolved"]
    assert resolved["result"] == {"charged": "TX-991"} and resolved["resolution"] == "occurred"


@pytest.mark.parametrize(("args", "code"), [
    ((), 6),                                                    # no --resolution, no --note
    (("--resolution", "occurred"), 6),                          # the note is required
    (("--resolution", "occurred", "--note", "   "), 6),         # and must say something
    (("--resolution", "happened", "--note", "checked"), 6),     # not a resolution
    (("--resolution", "occurred", "--note", "x", "--resolution-id", ""), 6),
    (("--resolution", "occurred", "--note", "x", "--evidence", "{not json"), 6),
    (("--resolution", "occurred", "--note", "x", "--evidence", "[1, 2]"), 6),
    (("--resolution", "occurred", "--note", "x", "--result", "charged"), 6),    # a text must be JSON-quoted
    (("--resolution", "not_occurred", "--note", "x", "--result", '"x"'), 6),  # a result only with occurred
])
def test_resolve_rejects_bad_input_and_writes_nothing(ledger: Ledger, args: tuple[str, ...], code: int) -> None:
    before = ledger.count(ledger.unknown)
    result = jixu("resolve", str(ledger.db), ledger.unknown, ledger.pay_effect, *args)
    assert result.returncode == code, result.stderr
    assert "error" in result.stderr
    assert ledger.count(ledger.unknown) == before


def test_resolve_refuses_bad_ids_and_settled_effects_and_writes_nothing(tmp_path: Path, ledger: Ledger) -> None:
    before = {t: ledger.count(t) for t in (ledger.unknown, ledger.parked, ledger.done)}
    ok = ("--resolution", "occurred", "--note", "checked")
    db = str(ledger.db)
    assert jixu("resolve", db, "not-a-thread", ledger.pay_effect, *ok).returncode == 6
    assert jixu("resolve", db, ledger.unknown, "not-an-effect", *ok).returncode == 6
    missing_thread = jixu("resolve", db, new_id(), ledger.pay_effect, *ok, "--json")
    assert missing_thread.returncode == 3
    assert json.loads(missing_thread.stdout)["error"]["code"] == "thread_not_found"
    assert jixu("resolve", db, ledger.unknown, new_id(), *ok).returncode == 3
    completed = next(e for e, d in ledger.state(ledger.done)["effects"].items() if d["kind"] == "tool")
    settled = jixu("resolve", db, ledger.done, completed, *ok, "--json")
    assert settled.returncode == 4 and json.loads(settled.stdout)["error"]["code"] == "effect_not_unknown"
    parked = jixu("resolve", db, ledger.parked, ledger.delete_effect, *ok)
    assert parked.returncode == 4 and "not unknown" in parked.stderr
    absent = tmp_path / "absent.db"
    assert jixu("resolve", str(absent), ledger.unknown, ledger.pay_effect, *ok).returncode == 3
    assert not absent.exists()
    assert {t: ledger.count(t) for t in before} == before


def test_approve_lets_the_application_run_the_parked_call(ledger: Ledger) -> None:
    before = ledger.count(ledger.parked)
    code, approved = as_json("approve", str(ledger.db), ledger.parked, ledger.delete_effect, "--note",
                             "ticket 7 asks for it", "--actor", "bob")
    assert code == 0, approved
    assert approved["effect"]["state"] == "not_dispatched" and approved["thread"]["status"] == "running"
    assert ledger.count(ledger.parked) == before + 1
    again = jixu("approve", str(ledger.db), ledger.parked, ledger.delete_effect, "--json")
    assert again.returncode == 4 and json.loads(again.stdout)["error"]["code"] == "effect_not_parked"
    assert jixu("deny", str(ledger.db), ledger.parked, ledger.delete_effect).returncode == 4
    assert ledger.count(ledger.parked) == before + 1
    finished = asyncio.run(_continue(ledger.db, ledger.parked))
    assert finished["status"] == "idle" and finished["last_reply"] == "done: ok"


def test_deny_settles_the_call_and_the_model_is_told(ledger: Ledger) -> None:
    human = jixu("deny", str(ledger.db), ledger.parked, ledger.delete_effect, "--note", "not without a ticket")
    assert human.returncode == 0, human.stderr
    assert "denied" in human.stdout and "completed" in human.stdout
    effect = ledger.state(ledger.parked)["effects"][ledger.delete_effect]
    assert (effect["state"], effect["reason"]) == ("completed", "denied")
    finished = asyncio.run(_continue(ledger.db, ledger.parked))
    assert finished["last_reply"] == "done: denied"


def test_approve_and_deny_refuse_bad_ids_and_unparked_calls(ledger: Ledger) -> None:
    before = ledger.count(ledger.unknown), ledger.count(ledger.parked)
    db = str(ledger.db)
    assert jixu("approve", db, ledger.parked, "nope").returncode == 6
    assert jixu("approve", db, "nope", ledger.delete_effect).returncode == 6
    assert jixu("approve", db, ledger.parked, new_id()).returncode == 3
    assert jixu("deny", db, ledger.unknown, ledger.pay_effect).returncode == 4
    assert (ledger.count(ledger.unknown), ledger.count(ledger.parked)) == before


def test_fork_makes_a_child_with_lineage_and_leaves_the_parent_alone(ledger: Ledger) -> None:
    events = json.loads(jixu("events", str(ledger.db), ledger.unknown, "--json").stdout)
    asked = next(e for e in events if e["type"] == "model.completed")
    before = ledger.count(ledger.unknown), events[-1]["hash"]
    code, child = as_json("fork", str(ledger.db), ledger.unknown, "--at", asked["id"], "--input",
                          "lookup order 1 instead")
    assert code == 0, child
    assert child["parent"] == {"thread_id": ledger.unknown, "event_id": asked["id"], "seq": asked["seq"],
                               "hash": asked["hash"]}
    assert child["turn_id"] and child["status"] == "running"
    after = json.loads(jixu("events", str(ledger.db), ledger.unknown, "--json").stdout)
    assert (len(after), after[-1]["hash"]) == before
    code, report = as_json("verify", str(ledger.db), child["thread_id"])
    assert code == 0 and report["valid"] is True
    state = ledger.state(child["thread_id"])
    assert state["effects"] == {} and ledger.pay_effect not in json.dumps(state["effects"])
    assert [m.get("status") for m in state["messages"] if m["role"] == "tool"] == ["not_inherited"]
    finished = asyncio.run(_continue(ledger.db, child["thread_id"]))
    assert finished["status"] == "idle" and finished["last_reply"] == "done: ok"
    human = jixu("fork", str(ledger.db), ledger.unknown, "--at", asked["id"])
    assert human.returncode == 0 and f"parent thread {ledger.unknown}" in human.stdout
    assert asked["hash"] in human.stdout


def test_fork_refuses_bad_points_and_input_and_writes_nothing(ledger: Ledger) -> None:
    streams = ledger.streams()
    db = str(ledger.db)
    other = json.loads(jixu("events", db, ledger.done, "--json").stdout)[0]["id"]
    assert jixu("fork", db, ledger.unknown, "--at", "not-an-id").returncode == 6
    assert jixu("fork", db, ledger.unknown, "--at", new_id()).returncode == 3
    assert jixu("fork", db, ledger.unknown, "--at", other).returncode == 3
    first = json.loads(jixu("events", db, ledger.unknown, "--json").stdout)[0]["id"]
    assert jixu("fork", db, ledger.unknown, "--at", first, "--input", "  ").returncode == 6
    assert jixu("fork", db, ledger.unknown).returncode == 2
    assert ledger.streams() == streams


def test_help_says_the_cli_records_decisions_and_the_application_continues() -> None:
    result = jixu("--help")
    assert result.returncode == 0
    assert "Harness.open_thread" in result.stdout
    for command in ("list", "show", "events", "verify", "replay", "resolve", "approve", "deny", "fork"):
        assert command in result.stdout


def test_a_decision_puts_a_thread_that_workers_run_back_in_their_queue(ledger: Ledger) -> None:
    from jixu.scheduling import claim, thread_work_key

    key = thread_work_key(ledger.parked)
    with SQLiteStore(ledger.db) as store:
        store.enqueue(key, "default")
        held = claim(store, "worker-a", 30, global_limit=1, project_limits={}, default_project_limit=1)
        assert held is not None and held.key == key
        store.finish_work(held)  # the worker stopped: the call is parked, an operator is needed
        assert store.get_work(key).state == "done"  # type: ignore[union-attr]
        untouched = thread_work_key(ledger.done)
        assert store.get_work(untouched) is None
    result = jixu("approve", str(ledger.db), ledger.parked, ledger.delete_effect, "--note", "checked")
    assert result.returncode == 0, result.stderr
    with SQLiteStore(ledger.db) as store:
        assert store.get_work(key).state == "pending"  # type: ignore[union-attr]
        assert store.get_work(untouched) is None, "threads no worker runs are not enqueued"


def test_show_puts_a_probes_answer_next_to_the_unknown_call_it_could_not_settle(tmp_path: Path) -> None:
    from jixu import DontKnow, ProbeQuery

    def ask_the_bank(query: ProbeQuery) -> DontKnow:
        return DontKnow("the bank's search is down", evidence={"key": query.idempotency_key})

    @tool(semantics="unsafe", probe=ask_the_bank)
    def pay(order: str, amount: float) -> str:
        """Charge an order; the connection drops after the request was sent."""
        raise RuntimeError("connection reset")

    db = tmp_path / "probe.db"

    async def build() -> str:
        async with Harness(Agent("ops", ScriptedModel(script), tools=[pay]), db) as harness:
            thread = await harness.create_thread()
            await thread.send("pay order 1")
            state = await thread.wait()
            assert state.status == "waiting", state.reason
            return thread.thread_id

    thread_id = asyncio.run(build())
    code, state = as_json("show", str(db), thread_id)
    assert code == 0
    [waiting] = state["waiting_on"]
    assert waiting["probe"]["answer"] == {"answer": "dont_know", "reason": "the bank's search is down",
                                          "evidence": {"key": f"jixu:{waiting['effect_id']}"}}
    assert state["probes"][waiting["effect_id"]] == [waiting["probe"]]
    human = jixu("show", str(db), thread_id)
    assert human.returncode == 0, human.stderr
    assert "answered don't know: the bank's search is down" in human.stdout
    assert f"jixu threads resolve {db} {thread_id} {waiting['effect_id']} --resolution occurred" in human.stdout


def test_show_marks_an_assistants_reasoning_and_never_prints_its_opaque_parts(tmp_path: Path) -> None:
    """Thinking is shown as such (issue 26); signatures, redacted and encrypted content stay out of the output."""
    from jixu.threads import ModelResponse

    reasoning = {"format": "anthropic", "model": "claude-sonnet-4-5", "items": [
        {"type": "thinking", "thinking": "The order id is 1, so I look it up.", "signature": "SIG-SECRET-123"},
        {"type": "redacted_thinking", "data": "REDACTED-OPAQUE-456"}]}
    agent = Agent("ops", ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("lookup", {"order": "1"}),), reasoning=reasoning),
        ModelResponse(tool_calls=(ToolCall("lookup", {"order": "2"}),), reasoning={
            "format": "openai-responses", "model": "o4-mini", "items": [
                {"type": "reasoning", "summary": [], "encrypted_content": "ENCRYPTED-789"}]}),
        "It shipped [twice].",
    ]), tools=[pay, delete_account, lookup])
    path = tmp_path / "r.db"

    async def record() -> str:
        with SQLiteStore(path) as store:
            thread = await Harness(agent, store).create_thread()
            await thread.send("where is order 1?")
            assert (await thread.wait()).last_reply == "It shipped [twice]."
            return thread.thread_id

    thread_id = asyncio.run(record())
    shown = jixu("show", str(path), thread_id)
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    assert "(thinking: The order id is 1, so I look it up. [redacted thinking])" in text, shown.stdout
    assert "(thinking: [encrypted reasoning]) calls lookup(order='2')" in text, shown.stdout
    assert "It shipped [twice]." in text, "a message's text is shown as written, brackets included"
    for opaque in ("SIG-SECRET-123", "REDACTED-OPAQUE-456", "ENCRYPTED-789"):
        assert opaque not in shown.stdout


def test_agent_factories_in_the_current_directory_are_found_and_a_broken_one_is_one_line_exit_6(
        tmp_path: Path) -> None:
    """`--agent MODULE:FACTORY` imports from the current directory, as its help says (a real child process, so
    its sys.path is a fresh command's); a module that raises while it is imported is exit 6, no traceback."""
    (tmp_path / "myagents.py").write_text(
        "from jixu import Agent, ScriptedModel\n\n\ndef make_agent() -> Agent:\n"
        "    return Agent('mine', ScriptedModel(['hi']))\n")
    (tmp_path / "badagents.py").write_text("raise RuntimeError('the config file is missing')\n")
    made = run_jixu("threads", "create", "q.db", "--agent", "myagents:make_agent", cwd=tmp_path, own_process=True)
    assert made.returncode == 0, made.stderr
    before = (tmp_path / "q.db").read_bytes()
    broken = run_jixu("threads", "create", "q.db", "--agent", "badagents:x", cwd=tmp_path, own_process=True)
    assert broken.returncode == 6, broken.stderr
    assert "RuntimeError: the config file is missing" in broken.stderr and "Traceback" not in broken.stderr
    assert (tmp_path / "q.db").read_bytes() == before


def test_show_says_a_durable_steps_probe_is_asked_when_its_code_runs_again(tmp_path: Path) -> None:
    """A durable run killed inside an unsafe step that has a probe: the probe lives in the run's code, so only
    running the code again asks it. `show` said an operator must decide, and showed the turn `running`."""
    import signal
    import sys

    db = tmp_path / "steps.db"
    child = f"""
import asyncio, os, signal
import jixu

async def main():
    async with jixu.durable({f"sqlite:///{db}"!r}, name="charge run") as run:
        print(run.thread_id, flush=True)
        def charge(ctx):
            os.kill(os.getpid(), signal.SIGKILL)
        await run.effect("charge", {{"order": 7}}, call=charge, probe=lambda query: jixu.NotOccurred())

asyncio.run(main())
"""
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    thread_id = proc.stdout.split()[0]
    human = jixu("show", str(db), thread_id)
    assert human.returncode == 0, human.stderr
    out = " ".join(human.stdout.split())
    assert "its probe is asked when the run's code runs again; or settle it now with one of:" in out
    assert "open (waiting)" in out and "running" not in out



def test_resume_records_an_explicit_resume_of_a_paused_turn_and_refuses_one_that_is_not(tmp_path: Path) -> None:
    """A quota or authentication pause waits for an explicit resume; the CLI had no command for it (the pause's
    reason named the Python API only)."""
    from jixu.errors import ModelError
    from jixu.threads.model import ModelRequest, ModelResponse

    class OutOfCredits:
        name = "credits"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            raise ModelError("out of credits", kind="quota", indeterminate=False)

    db = tmp_path / "paused.db"

    async def build() -> str:
        async with Harness(Agent("ops", OutOfCredits()), db) as harness:
            thread = await harness.create_thread()
            await thread.send("hello")
            state = await thread.wait()
            assert state.status == "paused" and "jixu threads resume" in state.reason, state.reason
            return thread.thread_id

    thread_id = asyncio.run(build())
    code, answer = as_json("resume", str(db), thread_id, "--note", "credits added", "--actor", "ops")
    assert code == 0 and answer["recorded"] is True, answer
    with SQLiteStore(db) as store:
        [resumed] = [e for e in ThreadLog.load(store, thread_id).events() if e.type == "turn.resumed"]
    assert (resumed.data["reason"], resumed.data["actor"], resumed.data["note"]) == ("explicit", "ops",
                                                                                      "credits added")
    again = jixu("resume", str(db), thread_id)
    assert again.returncode == 4 and "no paused turn" in again.stderr
