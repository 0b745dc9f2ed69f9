"""Real SIGKILLs of a process in the middle of an unsafe refund, on SQLite and PostgreSQL: the tool's probe
settles the call from the outside system's record before any operator is asked, and a probe that cannot tell
leaves it unknown (its answer shown) for the operator path.

A child (``tests/threads/probe_child.py``) sends "Refund order 42" and SIGKILLs itself inside the unsafe
``refund`` tool, after its line is durable in the "payment system" file or before it is written. This
process then opens the thread with its own (default) owner name, so it takes the dead owner's turn over at
once, and the agent's probe looks the refund up by its idempotency key.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu import DontKnow, Harness, ProbeQuery, RecoveryResolver
from jixu.ledger import Event
from tests.conftest import PostgresSchema
from tests.helpers import ROOT, python_env
from tests.threads.probe_child import REPLY, find_refund, refund_agent, refunds

pytestmark = pytest.mark.crash

CHILD_TIMEOUT = 60.0


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jixu.db'}"
        return
    schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
    try:
        yield schema.url
    finally:
        schema.drop()


def _child(*args: str, kill_on: str | None = None) -> list[str]:
    """Run the child until it SIGKILLs itself (or, with ``kill_on``, until it prints a line starting with it, and
    kill it then); its report lines."""
    proc = subprocess.Popen([sys.executable, "-m", "tests.threads.probe_child", *args], env=python_env(), cwd=ROOT,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    lines: list[str] = []
    try:
        if kill_on is None:
            out, err = proc.communicate(timeout=CHILD_TIMEOUT)
            lines = out.splitlines()
        else:
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))
                if line.startswith(kill_on):
                    proc.send_signal(signal.SIGKILL)
                    break
            err = ""
    finally:
        if proc.poll() is None and kill_on is None:
            proc.kill()
        proc.wait(CHILD_TIMEOUT)
    assert proc.returncode == -signal.SIGKILL, f"the child exited {proc.returncode}: {err[-3000:]}"
    return lines


def _thread_of(lines: list[str]) -> str:
    found = [line.split()[1] for line in lines if line.startswith("T ")]
    assert found, lines
    return found[0]


def _recover(url: str, outside: str, probe: Callable[[ProbeQuery], Any], thread_id: str,
             then: Callable[[Any], Any] | None = None) -> tuple[Any, list[Event], list[str]]:
    """Open the thread in this process and let it run; the state, every event and the tool runs here."""
    ran: list[str] = []

    async def go() -> tuple[Any, list[Event]]:
        harness = Harness(refund_agent(outside, probe, ran=ran), url)
        try:
            thread = await harness.open_thread(thread_id)
            state = await asyncio.wait_for(thread.wait(), 30)
            if then is not None:
                state = await then(thread)
            return state, await thread.events()
        finally:
            harness.close()

    state, events = asyncio.run(go())
    return state, events, ran


def _of(events: list[Event], event_type: str) -> list[Event]:
    return [e for e in events if e.type == event_type]


def test_a_probe_that_finds_the_refund_settles_it_occurred_and_the_thread_finishes_without_running_it_again(
        url: str, tmp_path: Path) -> None:
    outside = str(tmp_path / "payments.log")
    thread_id = _thread_of(_child("after", url, outside))
    assert len(refunds(outside)) == 1, "the child died after the refund reached the payment system"

    state, events, ran = _recover(url, outside, find_refund(outside), thread_id)

    assert state.status == "idle" and state.last_reply == REPLY, state.reason
    assert ran == [] and len(refunds(outside)) == 1, "the refund ran exactly once"
    assert len(_of(events, "tool.dispatched")) == 1 and not _of(events, "tool.completed")
    [resolved] = _of(events, "tool.outcome_resolved")
    [call] = _of(events, "tool.requested")
    assert resolved.data["effect_id"] == call.data["effect_id"] and resolved.data["resolution"] == "occurred"
    assert resolved.data["actor"] == "probe:refund" and resolved.meta["actor"] == "probe:refund"
    [asked] = _of(events, "probe.requested")
    assert resolved.data["resolution_id"] == asked.data["effect_id"]
    assert resolved.data["evidence"]["found"]["line"] == 1
    assert call.data["idempotency_key"] in resolved.data["evidence"]["found"]["text"]
    assert resolved.data["result"] == "refunded order 42"
    assert [e.seq for e in events].index(resolved.seq) > [e.seq for e in events].index(asked.seq)
    tool_message = next(m for m in state.messages if m.get("role") == "tool")
    assert tool_message["status"] == "occurred" and "refunded order 42" in tool_message["content"]
    [claimed] = _of(events, "turn.claimed")
    assert claimed.data["reason"] == "took_over_dead_owner"
    decision = state.effects[call.data["effect_id"]]
    assert decision.state == "unknown" and decision.reason == "resolved_by_operator"
    assert decision.resolution is not None and decision.resolution["actor"] == "probe:refund"
    assert RecoveryResolver.analyze(events).safe_to_continue


def test_a_probe_that_searched_and_found_nothing_settles_it_not_occurred_and_the_model_calls_again(
        url: str, tmp_path: Path) -> None:
    outside = str(tmp_path / "payments.log")
    thread_id = _thread_of(_child("before", url, outside))
    assert refunds(outside) == [], "the child died before the refund reached the payment system"

    state, events, ran = _recover(url, outside, find_refund(outside), thread_id)

    assert state.status == "idle" and state.last_reply == REPLY, state.reason
    first, second = _of(events, "tool.requested")
    [resolved] = _of(events, "tool.outcome_resolved")
    assert resolved.data["effect_id"] == first.data["effect_id"]
    assert resolved.data["resolution"] == "not_occurred" and resolved.data["actor"] == "probe:refund"
    assert resolved.data["evidence"]["searched"]["lines_searched"] == 0
    assert "result" not in resolved.data
    assert ran == [second.data["effect_id"]] != [first.data["effect_id"]], "a new call, under a new effect id"
    assert len(refunds(outside)) == 1 and second.data["idempotency_key"] in refunds(outside)[0]
    assert state.effects[second.data["effect_id"]].state == "completed"


def test_a_failing_probe_leaves_the_refund_unknown_with_its_answer_and_the_operator_path_still_works(
        url: str, tmp_path: Path) -> None:
    outside = str(tmp_path / "payments.log")
    thread_id = _thread_of(_child("after", url, outside))

    def unreachable(query: ProbeQuery) -> DontKnow:
        raise ConnectionError("the payment system is unreachable")

    async def operator(thread: Any) -> Any:
        state = thread.state()
        assert state.status == "waiting", state.reason
        [waiting] = state.waiting_on
        assert waiting["probe"]["answer"]["answer"] == "dont_know"
        assert "the payment system is unreachable" in waiting["probe"]["answer"]["reason"]
        assert "its probe does not know" in state.reason
        again = await thread.wait()  # asked to run again: the probe is not asked twice about one attempt
        assert again.status == "waiting" and len(again.probes[waiting["effect_id"]]) == 1
        await thread.resolve_tool_outcome(waiting["effect_id"], "occurred", note="found it by hand")
        return await asyncio.wait_for(thread.wait(), 30)

    state, events, ran = _recover(url, outside, unreachable, thread_id, operator)

    assert state.status == "idle" and state.last_reply == REPLY, state.reason
    assert ran == [] and len(refunds(outside)) == 1
    [failed] = _of(events, "probe.failed")
    assert failed.data["indeterminate"] is False and failed.data["error"]["exception"] == "ConnectionError"
    [resolved] = _of(events, "tool.outcome_resolved")
    assert resolved.data["actor"] == "operator"


def test_a_probe_killed_while_it_runs_runs_again_under_the_same_effect_on_the_next_open(
        url: str, tmp_path: Path) -> None:
    outside = str(tmp_path / "payments.log")
    thread_id = _thread_of(_child("after", url, outside))
    hung = _child("hang", url, outside, thread_id, kill_on="P ")
    assert any(line.startswith("P ") for line in hung)

    state, events, ran = _recover(url, outside, find_refund(outside), thread_id)

    assert state.status == "idle" and state.last_reply == REPLY, state.reason
    assert ran == [] and len(refunds(outside)) == 1
    [asked] = _of(events, "probe.requested")
    dispatched = _of(events, "probe.dispatched")
    assert [e.data["attempt"] for e in dispatched] == [1, 2]
    assert {e.data["effect_id"] for e in dispatched} == {asked.data["effect_id"]}
    [answered] = _of(events, "probe.completed")
    assert answered.data["attempt"] == 2 and answered.data["result"]["answer"] == "occurred"
    [resolved] = _of(events, "tool.outcome_resolved")
    assert resolved.data["actor"] == "probe:refund" and resolved.data["resolution_id"] == asked.data["effect_id"]
    assert [e.data["reason"] for e in _of(events, "turn.claimed")] == ["took_over_dead_owner"] * 2
