"""The child program of ``tests/threads/test_probe_crash.py``: a thread whose unsafe refund gets SIGKILLed.

Run as ``python -m tests.threads.probe_child MODE STORE OUTSIDE [THREAD_ID]``:

``after``
    Creates a thread, sends "Refund order 42" and SIGKILLs itself inside the
    ``refund`` tool right *after* the refund's line is durable in OUTSIDE (the
    "payment system"), before jixu records a receipt.
``before``
    The same, but the process dies inside the tool *before* the line is
    written: the call was dispatched and never happened.
``hang THREAD_ID``
    Reopens the thread with a probe that reports ``P`` and then never returns:
    the parent SIGKILLs this process while the probe runs.

Every mode prints ``T <thread_id>`` once the thread exists. The parent builds
the same agent (:func:`refund_agent`, its own probe): the contract matches.
Each process has its own (default) owner name, so a process that opens the
thread after a kill takes it over by proving the owner's process gone.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jixu import Agent, Harness, NotOccurred, Occurred, ProbeQuery, ScriptedModel, ToolCall, ToolContext, tool
from jixu.threads.tools import Tool

REQUEST = "Refund order 42"
REPLY = "Refunded order 42."


def say(*fields: object) -> None:
    """One report line, one write."""
    os.write(1, (" ".join(map(str, fields)) + "\n").encode())


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def write_refund(outside: str, ctx: ToolContext, order: str) -> None:
    """The payment system records the refund: one appended line, fsynced."""
    line = f"refund order={order} effect={ctx.effect_id} key={ctx.idempotency_key}\n".encode()
    fd = os.open(outside, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        os.fsync(fd)
    finally:
        os.close(fd)


def refunds(outside: str | Path) -> list[str]:
    """Every line of the payment system."""
    path = Path(outside)
    return path.read_text().splitlines() if path.exists() else []


def find_refund(outside: str) -> Callable[[ProbeQuery], Any]:
    """The honest probe: look the refund up by its idempotency key."""

    def probe(query: ProbeQuery) -> Occurred | NotOccurred:
        lines = refunds(outside)
        for number, line in enumerate(lines, start=1):
            if f" key={query.idempotency_key}" in line:
                return Occurred(result=f"refunded order {query.args['order']}",
                                evidence={"file": outside, "line": number, "text": line})
        return NotOccurred(evidence={"file": outside, "key": query.idempotency_key, "lines_searched": len(lines)})

    return probe


def step(messages: list[dict[str, Any]]) -> str | ToolCall:
    """Refund order 42; call again only when the call did not happen."""
    last = messages[-1]
    if last.get("role") == "user":
        return ToolCall("refund", {"order": "42"})
    if last.get("role") == "tool" and last.get("status") == "not_occurred":
        return ToolCall("refund", {"order": "42"})
    if last.get("role") == "tool" and last.get("status") in ("ok", "occurred"):
        return REPLY
    return f"Could not confirm the refund ({last.get('status')})."


def refund_agent(outside: str, probe: Callable[[ProbeQuery], Any], *, crash: str | None = None,
                 ran: list[str] | None = None) -> Agent:
    """One unsafe tool, ``refund``, with ``probe``; ``crash`` (``before`` / ``after``) kills the process in it."""

    def refund(order: str, ctx: ToolContext) -> str:
        """Refund an order (a retry could refund twice)."""
        if crash == "before":
            die()
        write_refund(outside, ctx, order)
        if ran is not None:
            ran.append(ctx.effect_id)
        if crash == "after":
            die()
        return f"refunded order {order}"

    made: Tool = tool(semantics="unsafe", probe=probe, probe_timeout=5.0)(refund)
    return Agent("refunder", ScriptedModel(step), tools=[made])


async def crash(url: str, outside: str, when: str) -> None:
    harness = Harness(refund_agent(outside, find_refund(outside), crash=when), url)
    thread = await harness.create_thread()
    say("T", thread.thread_id)
    await thread.send(REQUEST)
    await asyncio.wait_for(thread.wait(), 30)
    raise SystemExit("the refund never killed this process")


async def hang(url: str, outside: str, thread_id: str) -> None:
    def probe(query: ProbeQuery) -> Occurred:
        say("P", query.effect_id)
        time.sleep(3600)  # the parent kills the process here
        raise AssertionError("unreachable")

    harness = Harness(refund_agent(outside, probe), url)
    thread = await harness.open_thread(thread_id)
    say("T", thread.thread_id)
    state = await asyncio.wait_for(thread.wait(), 60)
    raise SystemExit(f"the probe returned; the thread is {state.status}: {state.reason}")


def main(argv: Sequence[str]) -> None:
    mode, url, outside, *rest = argv
    if mode in ("after", "before"):
        asyncio.run(crash(url, outside, mode))
    elif mode == "hang":
        asyncio.run(hang(url, outside, rest[0]))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
