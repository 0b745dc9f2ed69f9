"""A small MCP server written with the SDK's MCPServer (FastMCP before mcp 2), for tests/integrations/test_mcp.py.

Run over stdio: ``python mcp_server.py``; over streamable HTTP (a real uvicorn server):
``python mcp_server.py --http PORT``. It keeps no state in memory that a test relies on: every call is
appended, when it arrives, to the JSON-lines journal named by ``MCP_JOURNAL`` (tool, arguments, the request's
``_meta``, the server's pid), so a test can count calls across server processes and kill the one serving a call.

``MCP_HANG`` names tools that, after journaling the call, hang until the process is killed; with
``MCP_HANG_ONCE`` (a file path) a tool hangs only while that file does not exist (it creates it), so the
server started again after a kill answers.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("jixu-test-shop")
PRICES = {"apple": 120, "pear": 90}


async def _arrived(tool: str, args: dict[str, Any], ctx: Context) -> None:
    """Journal the call, then hang if this tool is told to."""
    journal = os.environ.get("MCP_JOURNAL")
    meta = ctx.request_context.meta
    if journal:
        entry = {"tool": tool, "args": args, "meta": dict(meta) if meta else {}, "pid": os.getpid()}
        with open(journal, "a", encoding="utf-8") as file:
            file.write(json.dumps(entry, sort_keys=True) + "\n")
    if tool in os.environ.get("MCP_HANG", "").split(","):
        once = os.environ.get("MCP_HANG_ONCE")
        if once:
            if os.path.exists(once):
                return
            open(once, "w").close()
        await asyncio.sleep(3600)


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
async def price(sku: str, ctx: Context) -> dict[str, Any]:
    """The price of a product, in cents."""
    await _arrived("price", {"sku": sku}, ctx)
    if sku not in PRICES:
        raise ToolError(f"no product {sku!r}")
    return {"sku": sku, "cents": PRICES[sku]}


@server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
async def reserve(sku: str, quantity: int, ctx: Context) -> str:
    """Reserve stock of a product (the same reservation twice is one)."""
    await _arrived("reserve", {"sku": sku, "quantity": quantity}, ctx)
    return f"reserved {quantity} {sku}"


@server.tool()
async def charge(order: str, cents: int, idempotency_key: str, ctx: Context) -> str:
    """Charge an order. Declares idempotency_key, so jixu fills it in."""
    await _arrived("charge", {"order": order, "cents": cents, "idempotency_key": idempotency_key}, ctx)
    return f"charged {cents} for {order}"


@server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True))
async def send_note(text: str, ctx: Context) -> str:
    """Send a note to the shop keeper (no idempotency key: the key rides in the request's _meta)."""
    await _arrived("send_note", {"text": text}, ctx)
    return "sent"


@server.tool()
async def ship(order: str, ctx: Context) -> str:
    """Ship an order (unsafe). Order ``lost`` fails *after* the parcel left: the SDK answers isError all the same."""
    await _arrived("ship", {"order": order}, ctx)
    if order == "lost":
        raise ToolError("the carrier did not confirm the pickup")
    return f"shipped {order}"


@server.tool(name="stock.count", annotations=ToolAnnotations(read_only_hint=True))
async def stock_count(ctx: Context) -> int:
    """A tool name jixu cannot use as it is (it has a dot)."""
    await _arrived("stock.count", {}, ctx)
    return 3


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        import uvicorn

        uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run("stdio")


if __name__ == "__main__":
    main()
