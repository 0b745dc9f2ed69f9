"""The agent the API tests serve (``tests.server.agents:agent``): scripted by the user's words.

- input containing ``charge``: calls the unsafe tool ``charge``, which fails
  indeterminately (the outcome is unknown: an operator must resolve it);
- input containing ``approve``: calls ``refund``, which needs approval (parked);
- input containing ``transfer``: calls the unsafe tool ``transfer``, which stays in flight until the test sets
  :data:`TRANSFER_GATE` (the worker runs in the test's process); ``transfer and refund``: both calls at once;
- anything else: replies ``echo: <input>``.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from jixu import Agent, ScriptedModel, ToolCall, tool

TRANSFER_GATE = threading.Event()


@tool(semantics="unsafe")
async def charge(amount: int) -> str:
    """Charge a card (always loses its answer: the outcome stays unknown)."""
    raise ConnectionResetError("the payment gateway hung up")


@tool(semantics="unsafe", requires_approval=True)
async def refund(amount: int) -> str:
    """Refund an order (needs approval)."""
    return f"refunded {amount}"


@tool(semantics="unsafe", timeout=60)
async def transfer(amount: int) -> str:
    """Move money (in flight until the test opens the gate)."""
    while not TRANSFER_GATE.is_set():
        await asyncio.sleep(0.01)
    return f"transferred {amount}"


def _script(messages: list[dict[str, Any]]) -> str | ToolCall | list[ToolCall]:
    last = messages[-1]
    if last.get("role") != "user":
        return "done"
    text = str(last.get("content") or "")
    if "charge" in text:
        return ToolCall("charge", {"amount": 42})
    if "transfer and refund" in text:  # two calls at once: one in flight, one parked
        return [ToolCall("transfer", {"amount": 9}), ToolCall("refund", {"amount": 7})]
    if "transfer" in text:
        return ToolCall("transfer", {"amount": 9})
    if "approve" in text:
        return ToolCall("refund", {"amount": 7})
    return f"echo: {text}"


def agent() -> Agent:
    """The test agent."""
    return Agent("api-test", ScriptedModel(_script), tools=[charge, refund, transfer])
