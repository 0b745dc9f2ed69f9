"""The SDK agent of ``tests/integrations/test_openai_agents.py``, and the child program its SIGKILL tests run.

The agent is an unchanged ``agents.Agent`` whose model is the SDK's own ``OpenAIChatCompletionsModel`` talking to
a fake Chat Completions server (``tests/providers/fake_servers.py``) and whose one tool, ``append_line``, is
unsafe: its side effect is one fsynced line in ``DIR/lines.log`` carrying the call's idempotency key.

Run as ``python -m tests.integrations.openai_agents_child MODE STORE DIR``: starts a fake server scripted to ask
for ``append_line("hello")``, runs the agent with :class:`DurableRunner` on STORE, prints ``T <thread_id>``, and
SIGKILLs itself inside the tool, *after* the line is durable (``after``) or *before* it is written (``before``);
``nested-after`` runs the same agent as a tool of :func:`boss`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from agents import Agent, OpenAIChatCompletionsModel, function_tool, set_tracing_disabled
from openai import AsyncOpenAI

from jixu import NotOccurred, Occurred, ProbeQuery
from jixu.integrations.openai_agents import DurableRunner, ToolPolicy, current_effect
from tests.providers.fake_servers import Call, Completion, FakeOpenAI
from tests.threads.steps_child import lines, say, write_line

set_tracing_disabled(True)  # the SDK would export traces to OpenAI

INPUT = "Write hello"
HELLO = Completion(calls=[Call("call_hello", "append_line", '{"text": "hello"}')])
DONE = Completion(text="wrote it")


def find_line(directory: Path) -> Callable[[ProbeQuery], Any]:
    """The file's lookup by idempotency key: read-only."""

    def probe(query: ProbeQuery) -> Occurred | NotOccurred:
        for number, line in enumerate(lines(directory / "lines.log"), start=1):
            if f"key={query.idempotency_key}" in line:
                return Occurred(result=f"line {number} written", evidence={"line": number})
        return NotOccurred(evidence={"searched": len(lines(directory / "lines.log"))})

    return probe


def writer(base_url: str, directory: Path, *, crash: str | None = None, instructions: str = "Write what is asked.",
           needs_approval: bool = False) -> Agent[Any]:
    """The SDK agent, unchanged by jixu: a real OpenAI model class, one unsafe function tool."""

    @function_tool(needs_approval=needs_approval)
    def append_line(text: str) -> str:
        """Append one line of text to the log."""
        if crash == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        write_line(directory / "lines.log", f"{text} key={current_effect().idempotency_key}")
        if crash == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return f"line {len(lines(directory / 'lines.log'))} written"

    client = AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    return Agent(name="writer", instructions=instructions,
                 model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client), tools=[append_line])


BOSS = Completion(calls=[Call("call_boss", "writer", '{"input": "Write hello"}')])
"""The boss agent's first answer: ask the writer agent, used as a tool, to write hello."""


def boss(base_url: str, directory: Path, *, crash: str | None = None) -> Agent[Any]:
    """An SDK agent that uses :func:`writer`'s agent as a tool (``Agent.as_tool``), unchanged by jixu."""
    client = AsyncOpenAI(base_url=base_url, api_key="sk-test", max_retries=0)
    return Agent(name="boss", instructions="Delegate the writing.",
                 model=OpenAIChatCompletionsModel(model="gpt-4o-mini", openai_client=client),
                 tools=[writer(base_url, directory, crash=crash).as_tool("writer", "Writes lines to the log.")])


def runner(url: str, directory: Path, *, probe: bool = True) -> DurableRunner:
    return DurableRunner(url, tools={"append_line": ToolPolicy("unsafe", probe=find_line(directory) if probe
                                                                else None)})


def main(argv: Sequence[str]) -> None:
    mode, url, directory = argv
    server = FakeOpenAI().start()
    if mode.startswith("nested-"):  # the writer agent used as a tool by the boss agent
        server.script(BOSS, HELLO)
        agent = boss(server.url, Path(directory), crash=mode.removeprefix("nested-"))
    else:
        server.script(HELLO)
        agent = writer(server.url, Path(directory), crash=mode)
    asyncio.run(runner(url, Path(directory)).run(agent, INPUT, started=lambda thread_id: say("T", thread_id)))
    raise SystemExit("the tool never killed this process")


if __name__ == "__main__":
    main(sys.argv[1:])
