"""The child program of ``tests/integrations/test_pydantic_ai.py``: an unchanged pydantic-ai agent, made durable
with ``JixuAgent``, SIGKILLed inside its unsafe ``charge`` tool.

Run as ``python -m tests.integrations.pydantic_ai_child MODE STORE DIR BASE_URL``:

``after``
    Creates a thread, prints ``T <thread_id>``, runs the agent (its ``OpenAIChatModel`` asks the fake server at
    BASE_URL, which answers with a call of ``charge``) and SIGKILLs itself inside ``charge`` right *after* the
    charge's line is durable in ``DIR/bank.log``, before jixu records a receipt.
``before``
    The same, but the process dies inside ``charge`` *before* the line is written.

The parent runs the same agent (:func:`order_agent`) again with the thread id.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

from jixu.integrations.pydantic_ai import JixuAgent, current_effect
from tests.threads.steps_child import find_charge, lines, say, write_line

PROMPT = "Charge order 7."


def order_agent(directory: Path, base_url: str, *, crash: str | None = None) -> Agent[None, str]:
    """The user's agent, as pydantic-ai has it: a model and an unsafe ``charge`` tool whose side effect is a line."""
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(base_url=base_url, api_key="sk-test-child"))
    agent = Agent(model, name="orders", instructions="You charge orders.")

    @agent.tool_plain
    def charge(order: int) -> dict[str, int]:
        """Charge an order."""
        if crash == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        write_line(directory / "bank.log", f"charge order={order} key={current_effect().idempotency_key}")
        if crash == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"charged": order, "line": len(lines(directory / "bank.log"))}

    return agent


def durable_orders(url: str, directory: Path, base_url: str, *, crash: str | None = None,
                   probe: bool = True) -> JixuAgent:
    """The agent made durable; ``charge`` is unsafe (the default) and has a probe unless ``probe`` is False."""
    probes = {"charge": find_charge(directory)} if probe else None
    return JixuAgent(order_agent(directory, base_url, crash=crash), url, probes=probes, approval_poll=0.02)


async def main(argv: Sequence[str]) -> None:
    mode, url, directory, base_url = argv
    durable = durable_orders(url, Path(directory), base_url, crash=mode)
    thread_id = await durable.new_thread()
    say("T", thread_id)
    await durable.run(PROMPT, thread_id=thread_id)
    raise SystemExit("the charge never killed this process")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
