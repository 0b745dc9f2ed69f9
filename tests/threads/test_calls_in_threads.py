"""A plain ``def`` call cut off by its timeout (or a cancellation) goes on in its worker thread: a thread cannot be
stopped. While it runs, nothing of this process settles or repeats it: its probe is asked once it returned, and
another attempt of it never starts beside it.

Real SQLite files; the outside system is a file the call appends to after sleeping.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import jixu
from jixu import Agent, Harness, NotOccurred, Occurred, ScriptedModel, ToolCall, ToolContext, tool
from jixu.threads.tools import ProbeQuery, call_ended, run_call_in_thread

SLOW = 0.8
"""Seconds the call sleeps before it acts (its timeout is 0.2 s)."""


def _bank(tmp_path: Path) -> Path:
    bank = tmp_path / "bank.txt"
    bank.write_text("")
    return bank


def _charges(bank: Path) -> list[str]:
    return bank.read_text().splitlines()


def test_an_agents_timed_out_call_is_probed_once_its_thread_returned_and_is_found(tmp_path: Path) -> None:
    """The probe was asked 2 ms after the timeout, answered ``not_occurred`` while the call slept in its thread, and
    the model was told the charge did not happen; it landed 1 s later."""
    bank = _bank(tmp_path)

    def find(query: ProbeQuery) -> Occurred | NotOccurred:
        found = query.idempotency_key in bank.read_text()
        return Occurred(result="charged", evidence={"seen": True}) if found else NotOccurred(evidence={"seen": False})

    @tool(semantics="unsafe", probe=find, timeout=0.2)
    def pay(order: int, ctx: ToolContext) -> str:
        """Charge an order (a slow payment API)."""
        time.sleep(SLOW)
        with bank.open("a") as out:
            out.write(f"{order} {ctx.idempotency_key}\n")
        return "charged"

    async def main() -> object:
        agent = Agent("payer", ScriptedModel([ToolCall("pay", {"order": 1}), "done"]), tools=[pay])
        async with Harness(agent, f"sqlite:///{tmp_path / 'agent.db'}") as harness:
            thread = await harness.create_thread()
            await thread.send("pay order 1")
            state = await thread.wait()
            return state, await thread.events()

    state, events = asyncio.run(main())
    assert len(_charges(bank)) == 1
    [probed] = [e for e in events if e.type == "probe.completed"]  # type: ignore[attr-defined]
    assert probed.data["result"]["answer"] == "occurred", probed.data
    [resolved] = [e for e in events if e.type == "tool.outcome_resolved"]  # type: ignore[attr-defined]
    assert resolved.data["resolution"] == "occurred"
    assert state.status == "idle"  # type: ignore[attr-defined]


def test_a_durable_steps_timed_out_call_is_not_called_again_while_its_thread_still_runs(tmp_path: Path) -> None:
    """Each probe answered ``not_occurred`` while the call slept, and the step ran three times: three charges."""
    bank = _bank(tmp_path)

    def find(query: ProbeQuery) -> Occurred | NotOccurred:
        found = query.idempotency_key in bank.read_text()
        return Occurred(result="charged", evidence={}) if found else NotOccurred(evidence={})

    def charge(ctx: ToolContext) -> str:
        time.sleep(SLOW)
        with bank.open("a") as out:
            out.write(f"{ctx.idempotency_key}\n")
        return "charged"

    async def main() -> object:
        async with jixu.durable(f"sqlite:///{tmp_path / 'steps.db'}", None, name="pay") as run:
            return await run.effect("charge", {}, semantics="unsafe", call=charge, probe=find, timeout=0.2)

    assert asyncio.run(main()) == "charged"
    assert len(_charges(bank)) == 1


def test_a_call_cancelled_before_its_thread_started_never_runs_and_is_not_waited_for() -> None:
    """The bounded pool is full: the cancelled call never starts, and nothing waits for it."""
    ran: list[str] = []
    release = threading.Event()

    async def main() -> None:
        loop = asyncio.get_running_loop()
        from concurrent.futures import ThreadPoolExecutor
        loop.set_default_executor(ThreadPoolExecutor(max_workers=1))
        blocker = asyncio.ensure_future(run_call_in_thread("e1", release.wait))
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(run_call_in_thread("e2", ran.append, "e2"))
        await asyncio.sleep(0.05)
        waiting.cancel()
        await asyncio.sleep(0)
        await asyncio.wait_for(call_ended("e2"), 1.0)  # abandoned: nothing to wait for
        ended = asyncio.ensure_future(call_ended("e1"))
        await asyncio.sleep(0.1)
        assert not ended.done(), "e1 still runs in its thread"
        release.set()
        await asyncio.wait_for(ended, 5.0)
        await blocker

    asyncio.run(main())
    time.sleep(0.1)
    assert ran == [], "a call abandoned before it started never runs"


def test_an_agents_unsafe_async_call_past_its_timeout_goes_on_and_is_probed_once_it_ended(tmp_path: Path) -> None:
    """An audit: an async unsafe call past its timeout was cancelled and its probe asked at once, while the payment
    system still worked on its request: ``not_occurred``, the model called again, three charges. Past the timeout
    the coroutine now goes on, as a call in a thread does, and the probe is asked once it ended."""
    bank = _bank(tmp_path)

    def find(query: ProbeQuery) -> Occurred | NotOccurred:
        found = query.idempotency_key in bank.read_text()
        return Occurred(result="charged", evidence={"seen": True}) if found else NotOccurred(evidence={"seen": False})

    @tool(semantics="unsafe", probe=find, timeout=0.2)
    async def pay(order: int, ctx: ToolContext) -> str:
        """Charge an order (a slow payment API, which goes on when its caller stops waiting)."""
        def land() -> None:
            with bank.open("a") as out:
                out.write(f"{order} {ctx.idempotency_key}\n")

        asyncio.get_running_loop().call_later(SLOW, land)
        await asyncio.sleep(SLOW + 0.05)
        return "charged"

    def model(messages: list[dict[str, object]]) -> object:
        told = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
        if not told or ("did NOT happen" in told[-1] and len(told) < 3):
            return ToolCall("pay", {"order": 1})
        return "done"

    async def main() -> object:
        agent = Agent("payer", ScriptedModel(model), tools=[pay])
        async with Harness(agent, f"sqlite:///{tmp_path / 'agent.db'}") as harness:
            thread = await harness.create_thread()
            await thread.send("pay order 1")
            state = await thread.wait()
            return state, await thread.events()

    state, events = asyncio.run(main())
    time.sleep(SLOW)  # anything still on its way has landed
    assert len(_charges(bank)) == 1
    [probed] = [e for e in events if e.type == "probe.completed"]  # type: ignore[attr-defined]
    assert probed.data["result"]["answer"] == "occurred"
    assert state.status == "idle"  # type: ignore[attr-defined]


def test_an_async_retry_safe_call_past_its_timeout_is_cancelled_and_retried(tmp_path: Path) -> None:
    """Only an unsafe coroutine goes on past its timeout: a retry-safe one is cancelled (retrying it is safe)."""
    started: list[int] = []
    finished: list[int] = []

    @tool(semantics="idempotent", timeout=0.2)
    async def look(order: int, ctx: ToolContext) -> str:
        """Look an order up (slow the first time)."""
        started.append(ctx.attempt)
        await asyncio.sleep(SLOW if ctx.attempt == 1 else 0)
        finished.append(ctx.attempt)
        return "found"

    async def main() -> object:
        agent = Agent("reader", ScriptedModel([ToolCall("look", {"order": 1}), "done"]), tools=[look])
        async with Harness(agent, f"sqlite:///{tmp_path / 'agent.db'}") as harness:
            thread = await harness.create_thread()
            await thread.send("look order 1")
            return await thread.wait()

    state = asyncio.run(main())
    assert state.status == "idle"  # type: ignore[attr-defined]
    assert started == [1, 2] and finished == [2], (started, finished)
