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
from typing import Any

import pytest

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


async def _pay_one_order(agent: Agent, tmp_path: Path) -> tuple[Any, list[Any]]:
    """One turn of ``agent`` asked to pay order 1, on a fresh SQLite store: its final state and its events."""
    async with Harness(agent, f"sqlite:///{tmp_path / 'agent.db'}") as harness:
        thread = await harness.create_thread()
        await thread.send("pay order 1")
        state = await thread.wait()
        return state, await thread.events()


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

    agent = Agent("payer", ScriptedModel([ToolCall("pay", {"order": 1}), "done"]), tools=[pay])
    state, events = asyncio.run(_pay_one_order(agent, tmp_path))
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


def _late_payer(bank: Path) -> Agent:
    """An agent whose ``pay`` (async, unsafe, timeout 0.2 s, a probe reading ``bank``) reaches a payment system that
    charges ``SLOW`` seconds after the request whatever its client does; the model calls again only when told the
    call did not happen (at most three times)."""
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

    return Agent("payer", ScriptedModel(model), tools=[pay])


def test_an_agents_unsafe_async_call_past_its_timeout_goes_on_and_is_probed_once_it_ended(tmp_path: Path) -> None:
    """An audit: an async unsafe call past its timeout was cancelled and its probe asked at once, while the payment
    system still worked on its request: ``not_occurred``, the model called again, three charges. Past the timeout
    the coroutine now goes on, as a call in a thread does, and the probe is asked once it ended."""
    bank = _bank(tmp_path)

    state, events = asyncio.run(_pay_one_order(_late_payer(bank), tmp_path))
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


FOREVER = 3600.0
"""An outside system that never answers."""


def _never_found(query: ProbeQuery) -> NotOccurred:
    return NotOccurred(evidence={"searched": query.idempotency_key})


def _never_answering(log: list[str], *, probe: bool = True) -> Any:
    @tool(semantics="unsafe", timeout=0.3, probe=_never_found if probe else None)
    async def pay(order: int, ctx: ToolContext) -> str:
        """Charge an order (the payment system never answers)."""
        log.append("started")
        try:
            await asyncio.sleep(FOREVER)
        except asyncio.CancelledError:
            log.append("cancelled")
            raise
        return "charged"

    return pay


def test_a_durable_block_whose_unsafe_call_never_returns_past_its_timeout_still_ends(tmp_path: Path) -> None:
    """An audit of decision 0064: the block's exit waited for the call gone on past its timeout, for ever, and a
    cancellation of the block did nothing. Without a probe the call is cancelled at its timeout (nothing would ask
    about it), and the run stops."""
    log: list[str] = []
    pay = _never_answering(log, probe=False)

    async def main() -> float:
        started = time.monotonic()
        with pytest.raises(jixu.StepOutcomeUnknown):
            async with jixu.durable(f"sqlite:///{tmp_path / 'run.db'}") as run:
                async def call(ctx: ToolContext) -> str:
                    result: str = await pay.fn(1, ctx)
                    return result

                await run.effect("pay", {"order": 1}, call=call, semantics="unsafe", timeout=0.3)
        return time.monotonic() - started

    took: list[float] = []
    runner = threading.Thread(target=lambda: took.append(asyncio.run(main())), daemon=True)
    runner.start()
    runner.join(10)
    assert took, "the block never ended: it waited for the call gone on past its timeout"
    assert took[0] < 3 and log == ["started", "cancelled"], (took, log)


def test_an_interrupt_stops_an_unsafe_call_gone_on_past_its_timeout(tmp_path: Path) -> None:
    log: list[str] = []
    pay = _never_answering(log)

    async def main() -> tuple[str, list[str]]:
        agent = Agent("payer", ScriptedModel([ToolCall("pay", {"order": 1}), "done"]), tools=[pay])
        async with Harness(agent, f"sqlite:///{tmp_path / 'agent.db'}") as harness:
            thread = await harness.create_thread()
            await thread.send("pay order 1")
            await asyncio.sleep(0.8)  # past the timeout: the call goes on
            assert log == ["started"]
            state = await asyncio.wait_for(thread.interrupt(), 5)
            alive = [t.get_name() for t in asyncio.all_tasks() if t.get_name().startswith("jixu-call")]
            return state.status, alive

    status, alive = asyncio.run(main())
    assert alive == [] and log == ["started", "cancelled"], (alive, log)
    assert status in ("waiting", "idle", "failed"), status


def test_a_loop_ending_while_an_unsafe_call_runs_ends_at_its_timeout(tmp_path: Path) -> None:
    """Decision 0036: a loop's end lets a call in flight reach its receipt. An audit of decision 0064: a call that
    never returned past its timeout then held ``asyncio.run`` for ever; it is cancelled once its receipt is recorded."""
    log: list[str] = []
    pay = _never_answering(log)
    agent = Agent("payer", ScriptedModel([ToolCall("pay", {"order": 1}), "done"]), tools=[pay])
    harness = Harness(agent, f"sqlite:///{tmp_path / 'agent.db'}")

    async def first() -> str:
        thread = await harness.create_thread()
        await thread.send("pay order 1")
        await asyncio.sleep(0.1)  # the call is in flight when the loop ends
        return thread.thread_id

    started = time.monotonic()
    done = threading.Event()
    returned: list[str] = []

    def run_it() -> None:
        returned.append(asyncio.run(first()))
        done.set()

    runner = threading.Thread(target=run_it, daemon=True)
    runner.start()
    assert done.wait(10), "asyncio.run did not return: the call gone on past its timeout held the loop's end"
    assert time.monotonic() - started < 5 and log == ["started", "cancelled"], log
    harness.close()
    with jixu.SQLiteStore(tmp_path / "agent.db") as store:
        types = [e.type for e in store.read(f"thread/{returned[0]}")]
    assert "tool.failed" in types  # its receipt: the outcome unknown (timeout)


def test_a_call_gone_on_past_its_timeout_is_not_resolved_by_an_operator_meanwhile(tmp_path: Path) -> None:
    """An audit of decision 0064: an operator's not_occurred was accepted while the call still ran, the model
    called again, two charges. While a call of the effect runs in this process, a resolution is refused."""
    bank = _bank(tmp_path)

    def find(query: ProbeQuery) -> Occurred | NotOccurred:
        found = query.idempotency_key in bank.read_text()
        return Occurred(result="charged", evidence={}) if found else NotOccurred(evidence={})

    @tool(semantics="unsafe", probe=find, timeout=0.2)
    async def pay(order: int, ctx: ToolContext) -> str:
        """Charge an order (the payment system answers after 0.8 s)."""
        await asyncio.sleep(SLOW)
        with bank.open("a") as out:
            out.write(f"{order} {ctx.idempotency_key}\n")
        return "charged"

    def model(messages: list[dict[str, object]]) -> object:
        told = [str(m.get("content")) for m in messages if m.get("role") == "tool"]
        if not told or ("did NOT happen" in told[-1] and len(told) < 3):
            return ToolCall("pay", {"order": 1})  # the model calls again when told the call did not happen
        return "done"

    async def main() -> object:
        agent = Agent("payer", ScriptedModel(model), tools=[pay])
        async with Harness(agent, f"sqlite:///{tmp_path / 'agent.db'}") as harness:
            thread = await harness.create_thread()
            await thread.send("pay order 1")
            await asyncio.sleep(0.4)  # past the timeout: the call goes on, its probe waits for it
            [effect_id] = [e.data["effect_id"] for e in await thread.events() if e.type == "tool.requested"]
            try:
                await thread.resolve_tool_outcome(effect_id, "not_occurred", note="I looked: nothing there")
            except jixu.ThreadBusy as refused:
                told = str(refused)
            else:
                told = ""
            return told, await thread.wait()

    told, state = asyncio.run(main())
    assert "still runs" in told, told
    assert len(_charges(bank)) == 1 and state.status == "idle"  # type: ignore[attr-defined]


def test_another_harness_shutting_down_does_not_stop_this_ones_call(tmp_path: Path) -> None:
    """An audit of decision 0064: a second harness that opened the thread to look at it and shut down cancelled
    the first one's call gone on past its timeout; its probe found nothing yet, the model called again: two
    charges. A harness stops only the calls it made."""
    bank = _bank(tmp_path)

    async def main() -> object:
        url = f"sqlite:///{tmp_path / 'agent.db'}"
        agent = _late_payer(bank)
        async with Harness(agent, url) as first:
            thread = await first.create_thread()
            await thread.send("pay order 1")
            await asyncio.sleep(0.4)  # past the timeout: the call goes on
            looker = Harness(agent, url)
            looked = await looker.open_thread(thread.thread_id, resume=False)  # held: its shutdown drains it
            await looker.shutdown(1.0)
            assert looked.thread_id == thread.thread_id
            return await thread.wait()

    state = asyncio.run(main())
    time.sleep(SLOW)
    assert len(_charges(bank)) == 1, _charges(bank)
    assert state.status == "idle"  # type: ignore[attr-defined]


def test_a_call_cancelled_while_it_waited_for_a_thread_is_recorded_as_never_run(tmp_path: Path) -> None:
    """Seen by an audit (a drain with ``--tool-threads 2`` and six blocking calls): the four calls still queued for
    a thread were recorded ``interrupted`` (unknown: an operator asked to check calls that never ran). A call
    cancelled before it began records a determinate ``not_started`` failure; the one cut off mid-call stays
    unknown."""
    release = threading.Event()
    ran: list[int] = []

    @tool(semantics="unsafe")
    def slow(n: int) -> str:
        """Block until released (an outside call that takes a while)."""
        ran.append(n)
        release.wait(10)
        return "done"

    agent = Agent("slowpoke", ScriptedModel([[ToolCall("slow", {"n": 1}), ToolCall("slow", {"n": 2})], "ok"]),
                  tools=[slow])

    async def main() -> dict[int, tuple[str, str]]:
        from concurrent.futures import ThreadPoolExecutor

        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        async with Harness(agent, f"sqlite:///{tmp_path / 'queued.db'}") as harness:
            thread = await harness.create_thread()
            await thread.send("go")
            deadline = time.monotonic() + 10
            while not ran and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)  # the second call is queued behind the first (one thread)
            await thread.interrupt("stop")
            release.set()
            events = await thread.events()
            analysis = jixu.RecoveryResolver.analyze(events)
            numbers = {e.data["effect_id"]: e.data["args"]["n"] for e in events if e.type == "tool.requested"}
            failed = {e.data["effect_id"]: e.data["error"]["type"] for e in events if e.type == "tool.failed"}
            return {numbers[effect]: (analysis.decisions[effect].state, failed[effect]) for effect in numbers}

    found = asyncio.run(main())
    assert ran == [1], "the queued call never ran"
    assert found == {1: ("unknown", "interrupted"), 2: ("completed", "not_started")}, found


def test_a_step_that_acted_then_awaited_a_queued_step_is_not_recorded_as_never_run(tmp_path: Path) -> None:
    """Found by a review of the change above: an async step that charged, then awaited an inner ``def`` step queued
    for the one worker thread, was cancelled; both steps were recorded ``not_started`` and running the code again
    charged again. Only the queued call's own step says it never ran; the outer one stays unknown."""
    charged: list[str] = []
    gate = threading.Event()

    async def main() -> dict[str, str]:
        from concurrent.futures import ThreadPoolExecutor

        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        hog = asyncio.ensure_future(asyncio.to_thread(gate.wait, 5))  # the only worker thread is busy
        url = f"sqlite:///{tmp_path / 'nested.db'}"
        try:
            async with jixu.durable(url, None) as run:
                async def outer(ctx: ToolContext) -> Any:
                    charged.append(ctx.idempotency_key)  # the outside effect happens here
                    return await run.effect("inner", call=lambda c: "inner ran", semantics="read_only")

                task = asyncio.ensure_future(run.effect("outer", call=outer, semantics="unsafe"))
                deadline = time.monotonic() + 10
                while not charged and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.1)  # the inner call waits for the busy thread
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                gate.set()
                await hog
                thread_id = run.thread_id
        except jixu.StepOutcomeUnknown:
            pass  # the block ends saying the outer step is in doubt
        store = jixu.open_store(url)
        try:
            events = store.read(f"thread/{thread_id}")
        finally:
            store.close()
        names = {e.data["effect_id"]: e.data["step"].split("#")[0] for e in events if e.type == "tool.requested"}
        return {names[e.data["effect_id"]]: e.data["error"]["type"] for e in events if e.type == "tool.failed"}

    assert asyncio.run(main()) == {"inner": "not_started", "outer": "interrupted"}
    assert len(charged) == 1


def test_a_timeout_on_a_call_queued_for_a_thread_is_a_timeout_not_a_cancelled_turn(tmp_path: Path) -> None:
    """Found by the same review: the first version raised a CancelledError subclass, which Python 3.11's
    ``asyncio.timeout`` does not turn into ``TimeoutError``: a tool whose timeout passed while it waited for the
    worker thread cancelled the whole turn (no ``turn.ended``)."""
    release = threading.Event()

    @tool(semantics="unsafe")
    def slow(n: int) -> str:
        """Block until released."""
        release.wait(5)
        return "slow done"

    @tool(semantics="read_only", timeout=0.2)
    def quick(n: int) -> str:
        """Answer at once (once it has a thread)."""
        return "quick done"

    agent = Agent("timed", ScriptedModel([[ToolCall("slow", {"n": 1}), ToolCall("quick", {"n": 2})], "ok"]),
                  tools=[slow, quick])

    async def main() -> list[str]:
        from concurrent.futures import ThreadPoolExecutor

        asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(max_workers=1))
        async with Harness(agent, f"sqlite:///{tmp_path / 'timed.db'}") as harness:
            thread = await harness.create_thread()
            await thread.send("go")
            await asyncio.sleep(0.6)  # quick's timeout passes while it waits for the thread slow holds
            release.set()
            state = await asyncio.wait_for(thread.wait(), 20)
            assert state.status == "idle", state
            return [e.type for e in await thread.events()]

    assert asyncio.run(main())[-1] == "turn.ended"
