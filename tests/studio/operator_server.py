"""A served store for the Studio's operator tests (issue 27): real threads a real Harness recorded, a real
uvicorn server with the API, the Studio and an in-process worker, and named tokens.

Threads (project ``ops`` unless said): two with an ``unknown`` charge, two with a ``refund`` parked for
approval, three idle (one of them forked, one tampered so it is ``corrupt``), one in project ``ops-2``, and a
long one of about 2,000 events (read-only lookups in batches). The agent also answers ``slow N`` with N
sequential slow lookups, so a test can watch a thread run, and ``lookup, charge and refund`` with the three
calls at once (a completed lookup, an unknown charge, a parked refund).
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.ledger import SQLiteStore
from jixu.scheduling import WorkerConfig, create_thread_for
from jixu.server import create_app, create_token
from jixu.server.background import BackgroundWorker
from jixu.server.studio import studio_router
from jixu.threads import ModelResponse
from jixu.threads.log import ThreadLog
from tests.attacker import Raw, flip_data_byte
from tests.server.conftest import LiveServer

PROJECT = "ops"
OTHER_PROJECT = "ops-2"
SLOW_SECONDS = 0.15
BATCH = 50
LONG_CALLS = 655
"""Read-only calls of the long thread: about three events each, some 2,000 events in all."""


@tool(semantics="unsafe")
async def charge(amount: int) -> str:
    """Charge the card (the gateway always hangs up: the outcome stays unknown)."""
    raise ConnectionResetError("the payment gateway hung up before answering")


@tool(semantics="unsafe", requires_approval=True)
async def refund(amount: int, order: str) -> str:
    """Refund an order (needs an operator's approval)."""
    return f"refunded {amount} for order {order}"


@tool(semantics="read_only")
async def lookup(order: str) -> str:
    """Read an order's status."""
    return f"order {order} shipped"


@tool(semantics="read_only")
async def slow_lookup(order: str) -> str:
    """Read an order's status from a slow system."""
    await asyncio.sleep(SLOW_SECONDS)
    return f"order {order} shipped (slowly)"


def _script(messages: list[dict[str, Any]]) -> str | ToolCall | ModelResponse:
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    text = str(messages[users[-1]].get("content") or "") if users else ""
    done = sum(1 for m in messages[users[-1] + 1:] if m.get("role") == "tool") if users else 0
    words = text.lower().split()
    if len(words) == 2 and words[0] in ("slow", "big") and words[1].isdigit():
        wanted = int(words[1])
        if done < wanted and words[0] == "slow":
            return ToolCall("slow_lookup", {"order": str(done)})
        if done < wanted:
            return ModelResponse(tool_calls=tuple(ToolCall("lookup", {"order": str(done + i)})
                                                  for i in range(min(BATCH, wanted - done))))
    if messages[-1].get("role") != "user":
        return f"Done after {done} calls."
    if words == ["lookup,", "charge", "and", "refund"]:  # one of each: completed, unknown, parked
        return ModelResponse(tool_calls=(ToolCall("lookup", {"order": "1001"}), ToolCall("charge", {"amount": 42}),
                                         ToolCall("refund", {"amount": 7, "order": "1002"})))
    if "charge" in words:
        return ToolCall("charge", {"amount": 42})
    if "refund" in words:
        return ToolCall("refund", {"amount": 7, "order": "1002"})
    return f"echo: {text}"


def agent() -> Agent:
    """The agent of every thread here (and of the server's worker)."""
    return Agent("ops-agent", ScriptedModel(_script), tools=[charge, refund, lookup, slow_lookup])


@dataclass
class Served:
    """The running server, its store and what the fixture recorded."""

    url: str
    store: SQLiteStore
    server: LiveServer
    tokens: dict[str, str]
    threads: dict[str, str] = field(default_factory=dict)

    @property
    def studio(self) -> str:
        """The Studio's base URL."""
        return f"{self.url}/studio"

    def stop(self) -> None:
        """Stop the server and close the store."""
        self.server.stop()
        self.store.close()


async def _record(path: Path) -> dict[str, str]:
    made: dict[str, str] = {}
    with SQLiteStore(path) as store:
        harness = Harness(agent(), store)

        async def thread(name: str, text: str, project: str = PROJECT) -> str:
            thread_id = create_thread_for(store, agent(), project=project)
            opened = await harness.open_thread(thread_id)
            await opened.send(text)
            await opened.wait()
            made[name] = thread_id
            return thread_id

        await thread("old_idle", "hello there")
        for name in ("unknown", "unknown_2"):
            await thread(name, "charge the customer")
        for name in ("parked", "parked_2"):
            await thread(name, "refund order 1002")
        parent = await thread("idle", "how are you")
        await thread("other_project", "hello from the other project", project=OTHER_PROJECT)
        corrupt = await thread("corrupt", "this one gets tampered")
        await thread("long", f"big {LONG_CALLS}")
        log = ThreadLog.load(store, parent)
        child = log.fork(log.events()[1].id)
        made["fork"] = child.thread_id
    flip_data_byte(Raw(path), f"thread/{corrupt}", 2)
    return made


def serve(tmp: Path) -> Served:
    """Record the threads, make the tokens, start the server."""
    path = tmp / "ops.db"
    with ThreadPoolExecutor(1) as pool:  # Playwright's sync API holds an event loop in this thread
        threads = pool.submit(asyncio.run, _record(path)).result()
    store = SQLiteStore(path)
    tokens = {}
    for name, roles in (("alice-operator", {PROJECT: "operator", OTHER_PROJECT: "operator"}),
                        ("bob-operator", {PROJECT: "operator"}), ("vera-viewer", {PROJECT: "viewer"})):
        _info, tokens[name] = create_token(store, name, roles=roles, actor="test")
    config = WorkerConfig(store_url=store.url or "", agent="tests.studio.operator_server:agent",
                          owner="studio-worker", poll_interval=0.02, quiet=True, drain_timeout=2)
    background = BackgroundWorker(store, config, agent=agent())
    server = LiveServer(create_app(store, agent=agent(), routers=[studio_router()], lifespan=[background.lifespan],
                                   stream_poll_interval=0.05))
    server.start()
    return Served(server.url, store, server, tokens, threads)
