"""A turn is stopped from any process (decision 0071): ``ThreadLog.interrupt``, ``jixu threads interrupt`` and
``POST /threads/{id}/interrupt`` (its test is in tests/server/test_threads_api.py).

Before, only the program running a turn could stop it (``Thread.interrupt``); every other process met
``TurnOwned``, so a runaway turn in a worker or a served thread could not be stopped short of killing the worker.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.errors import NoActiveTurn, ThreadBusy, ThreadCorrupt
from jixu.ledger import SQLiteStore
from jixu.scheduling import create_thread_for, submit_turn
from jixu.threads.log import ThreadLog
from tests.attacker import Raw
from tests.helpers import run_jixu


def test_another_process_interrupts_a_running_turn_and_it_ends_at_its_next_step(tmp_path: Path) -> None:
    """``jixu threads interrupt`` in its own process while this one's turn runs a slow call: the interrupt is
    recorded, the call finishes and its receipt is recorded, the turn ends ``interrupted`` and the model is asked
    nothing more (its second answer would have called the tool again)."""
    path = tmp_path / "anywhere.db"
    started, let_go = threading.Event(), threading.Event()
    calls: list[str] = []

    @tool(semantics="unsafe")
    async def wire(amount: int) -> str:
        """Wire money (slow)."""
        calls.append("wire")
        started.set()
        while not let_go.is_set():
            await asyncio.sleep(0.01)
        return f"wired {amount}"

    answers: list[Any] = [ToolCall("wire", {"amount": 5}), ToolCall("wire", {"amount": 6}), "done"]
    asked: list[int] = []

    def script(messages: list[dict[str, Any]]) -> Any:
        asked.append(len(messages))
        return answers[len(asked) - 1]

    async def main() -> tuple[Any, str, list[Any]]:
        with SQLiteStore(path) as store:
            async with Harness(Agent("wirer", ScriptedModel(script), tools=[wire]), store, owner="runner") as harness:
                thread = await harness.create_thread()
                await thread.send("wire 5, then 6")
                assert await asyncio.to_thread(started.wait, 10)
                done = await asyncio.to_thread(run_jixu, "threads", "interrupt", str(path), thread.thread_id,
                                               "--reason", "wrong account", "--actor", "ops", "--json",
                                               own_process=True)
                assert done.returncode == 0, done.stderr
                let_go.set()
                state = await thread.wait()
                return state, done.stdout, list(store.read(thread.log.stream))

    state, printed, events = asyncio.run(main())
    assert json.loads(printed)["outcome"] == "requested"
    assert state.status == "idle", state.reason
    types = [e.type for e in events]
    assert types[-3:] == ["turn.interrupt_requested", "tool.completed", "turn.ended"], types
    assert events[-1].data["outcome"] == "interrupted" and events[-1].data["requested_by"] == "ops"
    assert calls == ["wire"] and len(asked) == 1, "nothing started after the interrupt"


def test_a_turn_no_process_runs_is_ended_at_once_under_a_claim_of_its_own(tmp_path: Path) -> None:
    """A queued turn no worker has claimed: ended now (no ask left for a process that may never come), under a
    claim the interrupt takes and gives back; interrupting again says there is no turn."""
    with SQLiteStore(tmp_path / "queued.db") as store:
        agent = Agent("queued", ScriptedModel(["never asked"]))
        thread_id = create_thread_for(store, agent)
        submit_turn(store, thread_id, "hello")
        log = ThreadLog.load(store, thread_id)
        assert log.interrupt(actor="ops", reason="not needed") == "ended"
        [ended] = [e for e in store.read(log.stream) if e.type == "turn.ended"]
        assert ended.data["outcome"] == "interrupted" and ended.data["reason"] == "interrupted by ops: not needed"
        assert "turn.interrupt_requested" not in [e.type for e in store.read(log.stream)]
        lease = store.get_lease(log.turn_key)
        assert lease is not None and lease.released and lease.owner.startswith("interrupt:")
        with pytest.raises(NoActiveTurn):
            log.interrupt(actor="ops")

        async def opened() -> str:  # a worker opening it later finds nothing to run
            async with Harness(agent, store) as harness:
                return (await (await harness.open_thread(thread_id)).wait()).status

        assert asyncio.run(opened()) == "idle"


def test_an_interrupt_writes_nothing_on_a_corrupt_thread_or_a_durable_run(tmp_path: Path) -> None:
    path = tmp_path / "refused.db"
    with SQLiteStore(path) as store:
        agent = Agent("refused", ScriptedModel(["x"]))
        broken = create_thread_for(store, agent)
        submit_turn(store, broken, "hello")
        log = ThreadLog.load(store, broken)
        head = store.stream_info(log.stream).head_seq  # type: ignore[union-attr]
        with Raw(path).transaction() as sql:
            sql("DROP TRIGGER IF EXISTS jixu_events_no_update")
            sql("UPDATE jixu_events SET data = replace(data, 'hello', 'HELLO') WHERE stream = ? AND seq = 2",
                log.stream)
        with pytest.raises(ThreadCorrupt):
            ThreadLog.load(store, broken).interrupt(actor="ops")
        assert store.stream_info(log.stream).head_seq == head  # type: ignore[union-attr]

    async def durable() -> None:
        async with Harness(Agent("steps", ScriptedModel(["x"])), f"sqlite:///{path}") as harness, \
                harness.durable() as run:
            with pytest.raises(ThreadBusy, match="durable run"):
                ThreadLog.load(harness.store, run.thread_id).interrupt(actor="ops")

    asyncio.run(durable())


def test_an_asked_interrupt_whose_runner_is_gone_says_how_it_ends_and_a_second_one_ends_it(tmp_path: Path) -> None:
    """Found by a review: an interrupt asked of a process that then died showed "the turn ends at its next step"
    for good. The ask stays (the next claimer ends the turn), the status says nobody runs it and how to end it
    now, and interrupting again ends it at once."""
    from jixu.ledger import NewEvent

    with SQLiteStore(tmp_path / "gone.db") as store:
        thread_id = create_thread_for(store, Agent("gone", ScriptedModel(["never asked"])))
        turn_id = submit_turn(store, thread_id, "hello")
        log = ThreadLog.load(store, thread_id)
        # As a process that ran the turn and died right after the ask would leave it: the ask, nobody's claim.
        log.append([NewEvent("turn.interrupt_requested", {"turn_id": turn_id, "actor": "ops", "reason": None},
                             log.meta("ops"))])
        state = ThreadLog.load(store, thread_id).snapshot()
        assert state.status == "running" and "interrupt it again to end it at once" in state.reason, state.reason
        assert ThreadLog.load(store, thread_id).interrupt(actor="ops") == "ended"
        assert ThreadLog.load(store, thread_id).snapshot().status == "idle"
