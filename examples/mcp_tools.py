"""MCP tools as durable jixu tools, offline: this file is also the MCP server it starts over stdio.

    pip install "jixu[mcp]"
    python examples/mcp_tools.py

The server (``python examples/mcp_tools.py serve``) is written with the MCP SDK's MCPServer: a read-only
``price`` and an unsafe ``charge`` that declares an ``idempotency_key`` argument, which jixu fills in. An agent
(a scripted model, so no API key is needed) looks up a price and charges it; then the thread is opened again
and nothing is called twice.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path


def serve() -> None:
    from mcp.server.mcpserver import MCPServer
    from mcp.types import ToolAnnotations

    server = MCPServer("example-shop")
    charges: dict[str, int] = {}  # by idempotency key: a second charge with the same key is the first

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def price(sku: str) -> int:
        """The price of a product, in cents."""
        return {"apple": 120, "pear": 90}[sku]

    @server.tool()
    def charge(order: str, cents: int, idempotency_key: str) -> str:
        """Charge an order."""
        charges.setdefault(idempotency_key, cents)
        return f"charged {charges[idempotency_key]} cents for {order}"

    server.run("stdio")


async def main(store: Path) -> None:
    import jixu
    from jixu.integrations import mcp as jixu_mcp

    script = [jixu.ToolCall("price", {"sku": "apple"}), jixu.ToolCall("charge", {"order": "o-7", "cents": 120}),
              "Charged 1.20 for order o-7."]
    with open(store.with_suffix(".server.log"), "w") as errlog:
        async with jixu_mcp.connect_stdio(sys.executable, [__file__, "serve"], errlog=errlog) as shop:
            for tool in shop.tools():
                print(f"tool {tool.name}: {tool.semantics}")
            agent = jixu.Agent("clerk", jixu.ScriptedModel(script), tools=[*shop.tools()])
            thread = await jixu.Harness(agent, store).create_thread()
            await thread.send("Buy an apple for order o-7.")
            state = await thread.wait()
            print(state.status, "-", state.last_reply)
            for message in state.messages:
                if message["role"] == "tool":
                    print(f"  {message['name']} -> {message['content']}")
            calls = [e for e in state.effects.values() if e.kind == "tool"]
            again = await jixu.Harness(agent, store).open_thread(thread.thread_id)
            reopened = await again.wait()
            calls_after = [e for e in reopened.effects.values() if e.kind == "tool"]
            print(f"reopened: {reopened.status}; tool calls recorded before {len(calls)}, after {len(calls_after)}, "
                  f"all {', '.join(sorted({e.state for e in calls_after}))}")


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        with tempfile.TemporaryDirectory() as folder:
            asyncio.run(main(Path(folder) / "mcp-example.db"))
