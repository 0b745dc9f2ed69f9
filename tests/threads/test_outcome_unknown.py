"""After an append whose outcome is unknown (a failed COMMIT or fsync, a connection broken before the answer:
OutcomeUnknown), nothing assumes either way.

A real SQLite store reports one append's outcome as unknown: after committing it (it is stored) or without
committing it (it is not). A thread's kernel commits the same events again (the same ids: a stored batch is
answered as stored) and goes on; a run stops with OutcomeUnknown and its next execution re-reads its journal.
Either way an unsafe call is never called twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.errors import JixuError, OutcomeUnknown
from jixu.ledger import Event, Fence, NewEvent, SQLiteStore
from jixu.ledger.event import PreparedEvent
from jixu.ledger.store import AppendRequest

CALLS: list[str] = []


@tool(semantics="unsafe")
def pay(order: str) -> str:
    """Pay an order (unsafe)."""
    CALLS.append(order)
    return f"paid {order}"


def _agent() -> Agent:
    return Agent("outcome-unknown", ScriptedModel([ToolCall("pay", {"order": "42"}), "Paid."]), tools=[pay])


class UnknownCommit(SQLiteStore):
    """Reports the first append carrying an event of type ``when`` as OutcomeUnknown, stored or not."""

    def __init__(self, path: Path, *, when: str, stored: bool) -> None:
        super().__init__(path)
        self.when, self.stored, self.armed = when, stored, True

    def append(self, stream: str, events: Sequence[NewEvent | PreparedEvent], expected_seq: int,
               fence: Fence | None = None, **options: Any) -> list[Event]:
        if self.armed and any(event.type == self.when for event in events):
            self.armed = False
            if self.stored:
                super().append(stream, events, expected_seq, fence, **options)
            raise OutcomeUnknown("COMMIT failed: disk I/O error (injected); the append may or may not be stored")
        return super().append(stream, events, expected_seq, fence, **options)

    def append_many(self, requests: Sequence[AppendRequest]) -> list[list[Event] | JixuError]:
        results: list[list[Event] | JixuError] = []
        for request in requests:  # one by one, so the injected failure hits exactly one append
            try:
                results.append(self.append(request.stream, request.events, request.expected_seq, request.fence))
            except JixuError as error:
                results.append(error)
        return results


@pytest.mark.parametrize("stored", [True, False], ids=["commit_was_durable", "commit_was_lost"])
def test_a_thread_commits_a_receipt_in_doubt_again_and_goes_on(tmp_path: Path, stored: bool) -> None:
    """The receipt's commit had an unknown outcome: the kernel commits the same events again (the same ids: one
    that was stored is answered as stored, one that was not is stored now) and the turn goes on. The unsafe call
    ran once and is ``completed`` either way; a reopening reads the same."""
    CALLS.clear()
    with UnknownCommit(tmp_path / "t.db", when="tool.completed", stored=stored) as store:
        async def scenario() -> None:
            harness = Harness(_agent(), store, owner="worker")
            thread = await harness.create_thread()
            await thread.send("pay order 42")
            state = await thread.wait()
            assert CALLS == ["42"], "an unsafe call is never repeated after an unknown outcome"
            receipts = [e for e in store.read(f"thread/{thread.thread_id}") if e.type == "tool.completed"]
            [decision] = [d for d in state.effects.values() if d.kind == "tool"]
            assert len(receipts) == 1 and decision.state == "completed"
            assert state.status == "idle" and state.last_reply == "Paid."
            reopened = await Harness(_agent(), store, owner="other").open_thread(thread.thread_id, resume=False)
            assert reopened.state().status == state.status and reopened.state().seq == state.seq

        asyncio.run(scenario())


@pytest.mark.parametrize("stored", [True, False], ids=["commit_was_durable", "commit_was_lost"])
def test_a_thread_commits_a_dispatch_marker_in_doubt_again_before_the_call_leaves(tmp_path: Path,
                                                                                   stored: bool) -> None:
    """The marker's outcome is unknown, and the call has not left the process: the marker is committed again
    (stored once either way) and only then is the call made, once."""
    CALLS.clear()
    with UnknownCommit(tmp_path / "t.db", when="tool.dispatched", stored=stored) as store:
        async def scenario() -> None:
            thread = await Harness(_agent(), store, owner="worker").create_thread()
            await thread.send("pay order 42")
            state = await thread.wait()
            markers = [e for e in store.read(f"thread/{thread.thread_id}") if e.type == "tool.dispatched"]
            assert len(markers) == 1 and CALLS == ["42"] and state.status == "idle"

        asyncio.run(scenario())


@pytest.mark.parametrize("stored", [True, False], ids=["commit_was_durable", "commit_was_lost"])
def test_a_run_rereads_its_journal_after_an_unknown_append(tmp_path: Path, stored: bool) -> None:
    from jixu.runs import Runs, ScriptedProvider
    from tests.runs.run_helpers import fix, make_origin, register

    implemented: list[int] = []

    def counting_fix(workspace: Path, context: Any) -> Any:
        implemented.append(1)
        return fix(workspace, context)

    with UnknownCommit(tmp_path / "r.db", when="run.finished", stored=stored) as store:
        register(store, make_origin(tmp_path))
        runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [counting_fix, counting_fix])},
                    owner="worker")

        async def scenario() -> None:
            run_id = await runs.create_run("calc", "fix", provider="scripted")
            with pytest.raises(OutcomeUnknown):
                await runs.execute(run_id)
            finished = [e for e in store.read(f"run/{run_id}") if e.type == "run.finished"]
            assert len(finished) == (1 if stored else 0)
            state = await runs.execute(run_id)  # loads the journal again: what is stored decides
            assert state.status == "succeeded", state.reason
            assert len([e for e in store.read(f"run/{run_id}") if e.type == "run.finished"]) == 1
            assert implemented == [1], "the work that was done is not done again"

        asyncio.run(scenario())
