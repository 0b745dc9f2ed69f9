"""The child program of the streamed-call crash test in ``tests/providers/test_scenarios.py``.

Run as ``python -m tests.providers.stream_crash_child STORE BASE_URL OWNER KILL_AFTER``: creates a
thread under :func:`stream_agent` (an ``OpenAIModel(stream=True)`` pointed at the parent's fake
server, and a read-only ``add`` tool), sends one input and SIGKILLs itself when it has received
KILL_AFTER text deltas of a streamed model call, in the middle of the stream. It never exits on its own.

It prints, flushed, one line per fact:

- ``T <thread_id>``: the thread exists;
- ``D <effect_id> <attempt> <text>``: a text delta arrived (``text`` JSON-encoded).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Sequence

from jixu import Agent, Harness, tool
from jixu.threads.openai import OpenAIModel
from jixu.threads.streaming import Signal, SignalCallback

API_KEY = "sk-test-crash-child-0123456789"
QUESTION = "What is 2 + 3?"


@tool(semantics="read_only")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def stream_agent(model: OpenAIModel) -> Agent:
    """The agent both the child and the recovering parent run (the contract must match)."""
    return Agent("stream-crash", model, instructions="Use the add tool.", tools=[add])


def driver(base_url: str, on_signal: SignalCallback | None = None) -> OpenAIModel:
    """The streaming driver, pointed at the parent's fake server."""
    return OpenAIModel("gpt-4o-mini", base_url=base_url, api_key=API_KEY, stream=True, on_signal=on_signal)


def say(*fields: object) -> None:
    """One report line in a single ``write`` (a kill leaves whole lines only)."""
    os.write(1, (" ".join(map(str, fields)) + "\n").encode())


async def run(url: str, base_url: str, owner: str, kill_after: int) -> None:
    deltas = 0

    def on_signal(event: Signal) -> None:
        nonlocal deltas
        if event.kind != "text_delta":
            return
        deltas += 1
        say("D", event.effect_id, event.attempt, json.dumps(event.data["text"]))
        if deltas >= kill_after:
            os.kill(os.getpid(), signal.SIGKILL)  # mid-stream: no receipt, no cleanup

    harness = Harness(stream_agent(driver(base_url, on_signal)), store=url, owner=owner)
    thread = await harness.create_thread()
    say("T", thread.thread_id)
    await thread.send(QUESTION)
    state = await asyncio.wait_for(thread.wait(), 30)
    raise SystemExit(f"the stream was never cut: the thread is {state.status} ({state.reason})")


def main(argv: Sequence[str]) -> None:
    url, base_url, owner, kill_after = argv
    asyncio.run(run(url, base_url, owner, int(kill_after)))


if __name__ == "__main__":
    main(sys.argv[1:])
