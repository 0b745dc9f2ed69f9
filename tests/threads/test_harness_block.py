"""Leaving ``async with Harness(...)`` drains what the harness runs before it closes the store.

The block used to close the store under a turn still running: the turn's task died on "the store is closed"
(an exception nobody retrieved) and the thread was left half-run.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from jixu import Agent, Harness, ScriptedModel, ToolCall, ToolContext, tool


def _agent(calls: list[str]) -> Agent:
    @tool(semantics="idempotent")
    async def note(text: str, ctx: ToolContext) -> str:
        """Write a note down."""
        calls.append(text)
        await asyncio.sleep(0.05)
        return "noted"

    return Agent("notes", ScriptedModel([ToolCall("note", {"text": "one"}), "Noted."]), tools=[note])


def test_leaving_the_block_with_a_turn_running_drains_it_and_closes_cleanly(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    url, calls = f"sqlite:///{tmp_path / 'h.db'}", []

    async def leave_early() -> str:
        async with Harness(_agent(calls), store=url) as harness:
            thread = await harness.create_thread()
            await thread.send("note one")
            return thread.thread_id

    with caplog.at_level(logging.ERROR, logger="asyncio"):
        thread_id = asyncio.run(leave_early())
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == [], "no task died unseen"

    async def continue_it() -> tuple[str, str | None]:
        async with Harness(_agent(calls), store=url) as harness:
            thread = await harness.open_thread(thread_id)
            state = await thread.wait()
            return state.status, state.last_reply

    assert asyncio.run(continue_it()) == ("idle", "Noted.")
    assert calls == ["one"], "the drained turn was continued, its call made once"
