"""The child program of a ``test_group_commits`` test: it fails while its threads share a commit.

Run as ``python -m tests.threads.shutdown_child STORE_PATH``. Four threads run
on one event loop, sharing commits; shared commits take 0.2 s (the
store sleeps before each), and as soon as a thread waits for
one, ``main`` raises. On its way out ``asyncio.run`` cancels every task still
running, the commit task's too; the program must then end (printing
``ended: ...``) instead of waiting forever.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any

from jixu.threads import Agent, Harness, ScriptedModel, ToolCall, tool
from tests.helpers import SlowCommits


@tool(semantics="read_only")
async def look() -> str:
    """A read-only call that yields to the loop."""
    await asyncio.sleep(0)
    return "seen"


def script(messages: list[dict[str, Any]]) -> Any:
    return ToolCall("look") if sum(1 for m in messages if m["role"] == "tool") < 1000 else "done"


async def main(path: str) -> None:
    harness = Harness(Agent("shutdown", ScriptedModel(script), tools=[look], max_steps=1001), SlowCommits(path))
    threads = [await harness.create_thread() for _ in range(4)]
    for thread in threads:
        await thread.send("go")
    while not any(thread.log.appending for thread in threads):
        await asyncio.sleep(0)  # until a thread waits for a shared commit that is running
    raise RuntimeError("the program fails while its threads run")


if __name__ == "__main__":
    try:
        asyncio.run(main(sys.argv[1]))  # on the way out, asyncio.run cancels every task still running
    except RuntimeError as error:
        print("ended:", error, flush=True)
