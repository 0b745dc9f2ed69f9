"""An assistant's reasoning is shown as such in the Studio (issue 26): thinking and summaries readable under
"Thinking", redacted and encrypted parts named, their opaque content (signatures included) never on the page.
Real Chromium over a thread a real Harness wrote into the served store."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from playwright.sync_api import expect

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.ledger import SQLiteStore
from jixu.scheduling import create_thread_for
from jixu.threads import ModelResponse
from tests.studio.conftest import Shots, Studio, log_in


@tool(semantics="read_only")
def lookup(order: str) -> str:
    """Read an order's status."""
    return f"order {order} shipped"


def _thread_with_reasoning(store_path: Path, project: str) -> str:
    thinking = {"format": "anthropic", "model": "claude-sonnet-4-5", "items": [
        {"type": "thinking", "thinking": "The customer means order 1; look it up first.", "signature": "SIG-7f3a"},
        {"type": "redacted_thinking", "data": "OPAQUE-REDACTED-91"}]}
    agent = Agent("reasoner", ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("lookup", {"order": "1"}),), reasoning=thinking),
        "Order 1 has shipped."]), tools=[lookup])

    async def record() -> str:
        with SQLiteStore(store_path) as store:
            thread_id = create_thread_for(store, agent, project=project)
            thread = await Harness(agent, store).open_thread(thread_id)
            await thread.send("where is my order?")
            assert (await thread.wait()).last_reply == "Order 1 has shipped."
            return thread_id

    # Playwright's sync API holds an event loop in this thread: the harness runs in a thread of its own.
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, record()).result()


def test_thinking_is_shown_as_such_and_its_opaque_parts_never(studio: Studio, page: Any, shots: Shots) -> None:
    f = studio.fixture
    store_path = Path(studio.log).parent / "studio.db"
    thread_id = _thread_with_reasoning(store_path, f["project"])
    log_in(page, studio, f["operator_token"])
    page.goto(f"{studio.studio}/threads/{thread_id}")
    assistant = page.locator(".message.role-assistant").first
    thinking = assistant.locator("details.thinking")
    expect(thinking.locator("summary")).to_have_text("Thinking")
    thinking.locator("summary").click()
    expect(thinking).to_contain_text("The customer means order 1; look it up first. [redacted thinking]")
    expect(assistant).to_contain_text('calls lookup(order="1")')
    content = page.content()
    for opaque in ("SIG-7f3a", "OPAQUE-REDACTED-91"):
        assert opaque not in page.locator("section[aria-labelledby=messages-title]").inner_html(), opaque
    assert "Order 1 has shipped." in content
    shots(page, "reasoning")
