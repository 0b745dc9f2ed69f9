"""The child program of ``tests/threads/test_steps_crash.py``: a loop of its own, made durable with
``jixu.durable``, SIGKILLed inside its unsafe ``charge`` step.

Run as ``python -m tests.threads.steps_child MODE STORE DIR``:

``after``
    Starts a durable run, prints ``T <thread_id>``, runs ``reserve`` (idempotent), then ``charge`` (unsafe), and
    SIGKILLs itself inside ``charge`` right *after* the charge's line is durable in the bank's file, before jixu
    records a receipt.
``before``
    The same, but the process dies inside ``charge`` *before* the line is written.
``parallel``
    Charges orders 7 and 8 at once and dies inside charge 8, charge 7 still in flight (both lines durable).
``ended``
    The whole loop under the run key :data:`RUN_KEY`; the process dies right after the run's ``turn.ended`` is
    committed, before the loop returns (the code never learns that its run ended).

Every side effect is one fsynced line in a file of DIR (``reserve.log``, ``bank.log``, ``ship.log``), so the
parent counts how often each really ran. The parent runs the same loop (:func:`order_loop`) again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jixu
from jixu import NotOccurred, Occurred, ProbeQuery, ToolContext

RUN = "order-7"
RUN_KEY = "order-7/attempt-1"


def say(*fields: object) -> None:
    os.write(1, (" ".join(map(str, fields)) + "\n").encode())


def write_line(path: Path, text: str) -> None:
    """Append ``text`` as one line (one ``write``, then ``fsync``: it is on disk before the call returns)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def lines(path: Path) -> list[str]:
    """The lines written so far (none when the file does not exist yet)."""
    return path.read_text().splitlines() if path.exists() else []


def find_charge(directory: Path) -> Callable[[ProbeQuery], Any]:
    """The bank's lookup by idempotency key: read-only."""

    def probe(query: ProbeQuery) -> Occurred | NotOccurred:
        for number, line in enumerate(lines(directory / "bank.log"), start=1):
            if f"key={query.idempotency_key}" in line:
                return Occurred(result={"charged": query.args["order"], "line": number}, evidence={"line": number})
        return NotOccurred(evidence={"searched": len(lines(directory / "bank.log"))})

    return probe


async def _two_charges_at_once(run: jixu.DurableRun, directory: Path, *, kill: bool) -> str:
    """Orders 7 and 8 charged at once (``asyncio.gather``); with ``kill`` the process dies inside charge 8 after
    its line is durable, while charge 7, whose line is durable too, is still in flight."""
    written = asyncio.Event()

    async def charge(ctx: ToolContext, order: int) -> dict[str, Any]:
        if order == 8:
            await written.wait()  # charge 7 is in flight: it wrote its line and has not returned
        write_line(directory / "bank.log", f"charge order={order} key={ctx.idempotency_key}")
        if order == 7:
            written.set()
            await asyncio.sleep(5 if kill else 0)
        elif kill:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"charged": order, "line": len(lines(directory / "bank.log"))}

    def step(order: int) -> Any:
        return run.effect("charge", {"order": order}, semantics="unsafe", key=f"charge-{order}",
                          call=lambda ctx: charge(ctx, order), probe=find_charge(directory))

    charged = await asyncio.gather(step(7), step(8))
    run.reply = f"charged {[c['charged'] for c in charged]}"
    return run.reply


async def order_loop(url: str, directory: Path, thread_id: str | None, *, crash: str | None = None,
                     probe: bool = True, started: Callable[[str], None] | None = None,
                     run_key: str | None = None, parallel: bool = False) -> Any:
    """The user's loop: reserve, charge, ship (``parallel``: two charges at once). Returns what the run recorded
    as its reply."""

    def reserve(ctx: ToolContext) -> str:
        write_line(directory / "reserve.log", f"reserve key={ctx.idempotency_key}")
        return "reserved"

    def charge(ctx: ToolContext) -> dict[str, Any]:
        if crash == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        write_line(directory / "bank.log", f"charge order=7 key={ctx.idempotency_key}")
        if crash == "after":
            os.kill(os.getpid(), signal.SIGKILL)
        return {"charged": 7, "line": len(lines(directory / "bank.log"))}

    def ship(ctx: ToolContext) -> str:
        write_line(directory / "ship.log", f"ship key={ctx.idempotency_key}")
        return "shipped"

    async with jixu.durable(url, thread_id, name=RUN, agent="orders", run_key=run_key) as run:
        if started is not None:
            started(run.thread_id)
        if crash == "parallel" or parallel:
            return await _two_charges_at_once(run, directory, kill=crash == "parallel")
        reserved = await run.effect("reserve", {"order": 7}, semantics="idempotent", call=reserve)
        charged = await run.effect("charge", {"order": 7}, semantics="unsafe", call=charge,
                                   probe=find_charge(directory) if probe else None)
        shipped = await run.effect("ship", {"order": 7}, semantics="idempotent", call=ship)
        run.reply = f"{reserved}, {charged}, {shipped}"
    if crash == "ended":
        os.kill(os.getpid(), signal.SIGKILL)
    return run.reply


def main(argv: Sequence[str]) -> None:
    mode, url, directory = argv
    asyncio.run(order_loop(url, Path(directory), None, crash=mode, started=lambda tid: say("T", tid),
                           run_key=RUN_KEY if mode == "ended" else None))
    raise SystemExit("the charge never killed this process")


if __name__ == "__main__":
    main(sys.argv[1:])
