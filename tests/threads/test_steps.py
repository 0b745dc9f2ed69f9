"""Durable steps (decision 0032) in one process: matching by step key, the typed errors, retries under the same
identity, parked steps, and what every other surface (replay, fork, the agent loop) makes of a run.

The crash cases (a real SIGKILL inside an unsafe step, SQLite and PostgreSQL) are in test_steps_crash.py.
"""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path
from typing import Any

import pytest

import jixu
from jixu import (
    Harness,
    MemoryStore,
    NotOccurred,
    ProbeQuery,
    StepFailed,
    StepMismatch,
    StepOutcomeUnknown,
    ToolContext,
    ToolError,
)
from jixu.errors import OwnershipLost, StoreError
from jixu.ledger import SQLiteStore, Store
from jixu.threads.log import ThreadLog
from jixu.threads.steps import steps_agent
from tests.helpers import run_jixu


class Boom(Exception):
    """The user's code stopping half-way (a crash without a receipt missing: the run stays unfinished)."""


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def types(store: Store, thread_id: str) -> list[str]:
    return [e.type for e in ThreadLog.load(store, thread_id).events()]


def test_a_completed_step_returns_its_recorded_result_and_is_not_called_again() -> None:
    store, calls = MemoryStore(), []

    async def loop(thread_id: str | None, stop: bool) -> tuple[str, Any]:
        async with jixu.durable(store, thread_id) as run:
            first = await run.effect("fetch", {"id": 1}, semantics="read_only",
                                     call=lambda ctx: calls.append(ctx.effect_id) or {"v": len(calls)})
            if stop:
                raise Boom
            second = await run.effect("fetch", {"id": 2}, semantics="read_only", call=lambda ctx: "two")
            return run.thread_id, (first, second)

    async def go() -> None:
        with pytest.raises(Boom):
            await loop(None, True)
        [thread_id] = [s.stream.split("/", 1)[1] for s in store.list_streams("thread/")]
        assert ThreadLog.load(store, thread_id).snapshot().status == "waiting"  # unfinished: its code continues it
        again, results = await loop(thread_id, False)
        assert again == thread_id and results == ({"v": 1}, "two")
        assert len(calls) == 1, "the recorded step did not run again"
        assert types(store, thread_id).count("turn.started") == 1 and types(store, thread_id)[-1] == "turn.ended"

    run(go())


def test_a_step_that_differs_from_its_record_is_a_step_mismatch_and_nothing_runs() -> None:
    store, calls = MemoryStore(), []

    async def go() -> None:
        with pytest.raises(Boom):
            async with jixu.durable(store) as run:
                thread_id = run.thread_id
                await run.effect("charge", {"order": 7}, call=lambda ctx: calls.append(7) or "ok")
                raise Boom
        before = types(store, thread_id)
        for args, semantics in (({"order": 8}, "unsafe"), ({"order": 7}, "idempotent")):
            with pytest.raises(StepMismatch) as raised:
                async with jixu.durable(store, thread_id) as run:
                    await run.effect("charge", args, semantics=semantics, call=lambda ctx: calls.append(0) or "x")
            assert "charge#1" in raised.value.message and raised.value.details["step"] == "charge#1"
        assert calls == [7]
        after = types(store, thread_id)
        assert after[:len(before)] == before and set(after[len(before):]) == {"turn.claimed"}, after

    run(go())


def test_a_retry_safe_step_with_an_unknown_outcome_is_retried_under_the_same_effect_and_key() -> None:
    store, keys = MemoryStore(), []

    def flaky(ctx: ToolContext) -> str:
        keys.append((ctx.effect_id, ctx.idempotency_key, ctx.attempt))
        if len(keys) == 1:
            raise ConnectionError("the answer was lost")
        return "booked"

    async def go() -> None:
        async with jixu.durable(store) as run:
            assert await run.effect("book", {"room": 4}, semantics="idempotent", call=flaky) == "booked"
            thread_id = run.thread_id
        assert [k[:2] for k in keys] == [keys[0][:2]] * 2 and [k[2] for k in keys] == [1, 2]
        assert keys[0][1] == f"jixu:{keys[0][0]}"
        events = ThreadLog.load(store, thread_id).events()
        assert [e.data["attempt"] for e in events if e.type == "tool.dispatched"] == [1, 2]
        assert [e.data["indeterminate"] for e in events if e.type == "tool.failed"] == [True]

    run(go())


def test_an_unsafe_step_whose_call_failed_without_a_receipt_raises_step_outcome_unknown_and_is_not_retried() -> None:
    store, calls = MemoryStore(), []

    def charge(ctx: ToolContext) -> str:
        calls.append(ctx.attempt)
        raise ConnectionError("reset after the request was sent")

    async def go() -> None:
        thread_id: str | None = None
        for _ in range(2):
            with pytest.raises(StepOutcomeUnknown) as raised:
                async with jixu.durable(store, thread_id) as run:
                    thread_id = run.thread_id
                    await run.effect("charge", {"order": 7}, call=charge)
            assert isinstance(raised.value.__cause__, ConnectionError) or calls == [1]
            assert f"jixu threads resolve STORE {thread_id}" in raised.value.message
        assert calls == [1], "an unsafe step is never dispatched twice"
        state = ThreadLog.load(store, thread_id).snapshot()
        assert state.status == "waiting" and [w["name"] for w in state.waiting_on] == ["charge"]

    run(go())


def test_a_probe_that_finds_nothing_lets_the_step_run_again_under_a_new_effect_id() -> None:
    store, calls = MemoryStore(), []

    def charge(ctx: ToolContext) -> str:
        calls.append(ctx.effect_id)
        if len(calls) == 1:
            raise ConnectionError("refused before anything was sent")
        return "charged"

    async def go() -> None:
        async with jixu.durable(store) as run:
            result = await run.effect("charge", {"order": 7}, call=charge,
                                      probe=lambda query: NotOccurred(evidence={"searched": query.idempotency_key}))
            thread_id = run.thread_id
        assert result == "charged" and len(set(calls)) == 2
        events = ThreadLog.load(store, thread_id).events()
        [resolved] = [e for e in events if e.type == "tool.outcome_resolved"]
        assert resolved.data["effect_id"] == calls[0] and resolved.data["actor"] == "probe:charge"
        assert [e.data["effect_id"] for e in events if e.type == "tool.requested"] == calls

    run(go())


def test_a_step_run_again_after_not_occurred_gets_a_new_idempotency_key(tmp_path: Path) -> None:
    """A probe's not_occurred says the first request did not happen: the step runs again as a new operation, under
    a new key. Decision 0063 kept the first key and was withdrawn: an API that stores every answer under its key
    (Stripe keeps even a 500) answered each retry with the first failure, and the step never succeeded."""
    answers: dict[str, str] = {}
    charged: list[str] = []

    def charge(ctx: ToolContext) -> str:
        if ctx.idempotency_key in answers:  # the stored answer of an earlier request with this key
            raise ConnectionError(answers[ctx.idempotency_key])
        if not answers:
            answers[ctx.idempotency_key] = "500 internal error (nothing charged)"
            raise ConnectionError(answers[ctx.idempotency_key])
        charged.append(ctx.idempotency_key)
        return "charged"

    def find_charge(query: ProbeQuery) -> Any:
        if query.idempotency_key in charged:
            return jixu.Occurred(result="charged (found)", evidence={})
        return NotOccurred(evidence={"searched": query.idempotency_key})

    async def go() -> None:
        store = SQLiteStore(tmp_path / "keys.db")
        async with jixu.durable(store) as run:
            result = await run.effect("charge", {"order": 7}, call=charge, probe=find_charge)
            thread_id = run.thread_id
        intents = [e.data for e in ThreadLog.load(store, thread_id).events() if e.type == "tool.requested"]
        assert result == "charged" and len(charged) == 1
        assert [intent["idempotency_key"] for intent in intents] == [f"jixu:{i['effect_id']}" for i in intents]
        assert len({intent["idempotency_key"] for intent in intents}) == 2
        store.close()

    run(go())


def test_an_unsafe_async_step_past_its_timeout_goes_on_and_its_probe_waits_for_it(tmp_path: Path) -> None:
    """An audit: an async unsafe step past its timeout was cancelled and its probe asked at once, while its request
    was still on its way: not_occurred, run again, three charges. Past the timeout the call now goes on (as a call
    in a thread does) and its probe is asked once it ended: it finds the one charge."""
    charges: list[str] = []
    ended: list[float] = []
    asked: list[float] = []

    async def charge(ctx: ToolContext) -> str:
        await asyncio.sleep(0.4)  # the payment system answers after 0.4 s
        charges.append(ctx.idempotency_key)
        ended.append(asyncio.get_running_loop().time())
        return "charged"

    def find_charge(query: ProbeQuery) -> Any:
        asked.append(0.0)
        if query.idempotency_key in charges:
            return jixu.Occurred(result="charged (found)", evidence={})
        return NotOccurred(evidence={"searched": query.idempotency_key})

    async def go() -> None:
        store = SQLiteStore(tmp_path / "timeout.db")
        async with jixu.durable(store) as run:
            started = asyncio.get_running_loop().time()
            result = await run.effect("charge", {"order": 7}, call=charge, probe=find_charge, timeout=0.1)
            waited = asyncio.get_running_loop().time() - started
            thread_id = run.thread_id
        events = ThreadLog.load(store, thread_id).events()
        [failed] = [e for e in events if e.type == "tool.failed"]
        assert failed.data["error"]["type"] == "timeout" and failed.data["indeterminate"] is True
        [resolved] = [e for e in events if e.type == "tool.outcome_resolved"]
        assert resolved.data["resolution"] == "occurred" and resolved.data["actor"] == "probe:charge"
        assert result == "charged (found)" and len(charges) == 1 and len(asked) == 1
        assert waited >= 0.35, "the probe was asked before the call ended"
        store.close()

    run(go())


def test_a_determinate_failure_is_a_step_failed_again_on_every_rerun_without_calling_again() -> None:
    store, calls = MemoryStore(), []

    def charge(ctx: ToolContext) -> str:
        calls.append(1)
        raise ToolError("card declined", code="declined")

    async def go() -> None:
        thread_id = None
        for _ in range(2):
            with pytest.raises(StepFailed) as raised:
                async with jixu.durable(store, thread_id) as run:
                    thread_id = run.thread_id
                    await run.effect("charge", {"order": 7}, call=charge)
            assert raised.value.details["reason"] == "failed" and "card declined" in raised.value.message
        assert calls == [1]

    run(go())


def test_a_parked_step_waits_for_its_approval_and_a_denied_one_is_step_failed() -> None:
    store, calls = MemoryStore(), []

    async def go() -> None:
        async def loop() -> Any:
            async with jixu.durable(store, approval_poll=0.01) as run:
                found.append(run.thread_id)
                return await run.effect("wire", {"amount": 100}, requires_approval=True,
                                        call=lambda ctx: calls.append(1) or "sent")

        for decision in ("approved", "denied"):
            found: list[str] = []
            task = asyncio.create_task(loop())
            for _ in range(500):
                await asyncio.sleep(0.01)
                if found and ThreadLog.load(store, found[0]).snapshot().waiting_on:
                    break
            operator = ThreadLog.load(store, found[0])
            [parked] = operator.snapshot().waiting_on
            assert parked["state"] == "parked" and not task.done() and calls == [1] * (decision == "denied")
            operator.decide_parked(parked["effect_id"], decision, actor="ops")  # as `jixu threads approve|deny`
            if decision == "approved":
                assert await asyncio.wait_for(task, 10) == "sent"
            else:
                with pytest.raises(StepFailed) as raised:
                    await asyncio.wait_for(task, 10)
                assert raised.value.details["reason"] == "denied"
        assert calls == [1]

    run(go())


def test_the_agent_loop_never_acts_on_a_durable_run_and_replay_and_fork_see_its_steps() -> None:
    store = MemoryStore()

    async def go() -> None:
        harness = Harness(steps_agent(), store)
        with pytest.raises(Boom):
            async with harness.durable(name="nightly") as run:
                thread_id = run.thread_id
                await run.effect("fetch", {"id": 1}, semantics="read_only", call=lambda ctx: {"rows": 3})
                assert run.state().status == "running"
                raise Boom
        before = types(store, thread_id)
        thread = await harness.open_thread(thread_id)  # resume: the agent loop must not touch the run
        state = await thread.wait()
        assert state.status == "waiting" and "durable run" in state.reason and not state.waiting_on
        assert types(store, thread_id) == before, "the agent loop recorded nothing (its model was never called)"
        replayed = await thread.replay()
        assert replayed.effects == state.effects and replayed.turns == state.turns
        assert replayed.turns[0]["steps"] is True and replayed.turns[0]["input"] == "nightly"
        [completed] = [e for e in await thread.events() if e.type == "tool.completed"]
        child = await thread.fork(completed.id)
        assert [m["content"] for m in child.state().messages if m["role"] == "tool"] == ['{"rows": 3}']
        with pytest.raises(StepMismatch):
            async with harness.durable(thread_id, name="another"):
                pass

    run(go())


def test_bad_step_declarations_are_refused_before_anything_is_recorded() -> None:
    store = MemoryStore()

    def probe(query: ProbeQuery) -> NotOccurred:
        return NotOccurred()

    async def go() -> None:
        async with jixu.durable(store) as run:
            head = len(ThreadLog.load(store, run.thread_id).events())
            for bad in (dict(name="no spaces"), dict(name="ok", semantics="read_only", probe=probe),
                        dict(name="ok", args=[1]), dict(name="ok", key="")):
                with pytest.raises(jixu.JixuError):
                    await run.effect(**{"call": lambda ctx: 1, **bad})  # type: ignore[arg-type]
            assert len(ThreadLog.load(store, run.thread_id).events()) == head

    run(go())


def test_a_durable_run_whose_lease_another_owner_took_stops_with_ownership_lost_not_a_bare_cancellation(
        tmp_path: Path) -> None:
    """The heartbeat finds the run's lease taken (an operator's recovery, from another connection) while the
    user's code awaits its own work between steps: the block stops with ``OwnershipLost`` naming the new holder,
    and nothing more is written. Left a bare ``CancelledError``, the code around it (a framework's runner, an
    ``asyncio.run``) could not tell a lost run from its own cancel. A cancel of the user's own still is one."""
    store = SQLiteStore(tmp_path / "ledger.db")

    async def take_the_lease_then(work: Any) -> str:
        async with jixu.durable(store, lease_ttl=0.6) as run:
            await run.effect("fetch", {"id": 1}, semantics="read_only", call=lambda ctx: "one")
            with SQLiteStore(tmp_path / "ledger.db") as operator:
                key = f"thread/{run.thread_id}/turn"
                lease = operator.get_lease(key)
                assert lease is not None
                operator.take_over_lease(key, "operator", 30, expected_epoch=lease.epoch, require_expired=False)
            await work()  # the heartbeat (every 0.2 s) finds the lease taken meanwhile
            return run.thread_id

    with pytest.raises(OwnershipLost) as raised:
        run(take_the_lease_then(lambda: asyncio.sleep(5)))
    assert "held by 'operator'" in raised.value.message and raised.value.details["thread_id"]
    thread_id = raised.value.details["thread_id"]
    assert types(store, thread_id)[-1] == "tool.completed", "nothing written after the loss"
    assert store.verify(f"thread/{thread_id}").valid

    async def cancelled_by_its_user() -> None:
        task = asyncio.create_task(jixu_run_that_sleeps())
        await asyncio.sleep(0.3)
        task.cancel()
        await task

    async def jixu_run_that_sleeps() -> None:
        async with jixu.durable(store, lease_ttl=0.6) as run:
            await run.effect("fetch", {"id": 2}, semantics="read_only", call=lambda ctx: "two")
            await asyncio.sleep(5)

    with pytest.raises(asyncio.CancelledError):
        run(cancelled_by_its_user())
    store.close()


def test_a_durable_run_whose_start_failed_stays_unfinished_and_its_done_steps_are_not_done_again(
        tmp_path: Path) -> None:
    """The code runs again with the thread id of its unfinished run, under a revised agent definition; its
    start fails (the revision's write refused: a full disk) after the turn was claimed. The run must stay
    unfinished: ended there, the next run of the code would start a new run and charge a second time."""

    class RefusesTheRevision(SQLiteStore):
        armed = False

        def append(self, stream: str, events: Any, expected_seq: int, fence: Any = None, **kw: Any) -> Any:
            if self.armed and any(getattr(event, "type", "") == "agent.revised" for event in events):
                self.armed = False
                raise StoreError("disk I/O error (simulated): nothing was written")
            return super().append(stream, events, expected_seq, fence, **kw)

    store = RefusesTheRevision(tmp_path / "ledger.db")
    charged: list[str] = []

    async def charge_order(harness: Harness, thread_id: str | None) -> str:
        async with harness.durable(thread_id) as run:
            await run.effect("charge", {"order": 7}, call=lambda ctx: charged.append(ctx.effect_id) or "charged")
            if thread_id is None:
                raise Boom  # the first run of the code stops after its charge
            return run.thread_id

    async def go() -> None:
        first = steps_agent()
        revised = jixu.Agent(first.name, first.model, instructions="charge politely")
        with pytest.raises(Boom):
            await charge_order(Harness(first, store), None)
        [thread_id] = [s.stream.split("/", 1)[1] for s in store.list_streams("thread/")]
        store.armed = True
        with pytest.raises(StoreError):
            await charge_order(Harness(revised, store), thread_id)
        assert "turn.ended" not in types(store, thread_id), "a run that never started was not ended"
        assert await charge_order(Harness(revised, store), thread_id) == thread_id
        assert len(charged) == 1, "the charge done by the first run was not done again"
        ended = [e for e in ThreadLog.load(store, thread_id).events() if e.type == "turn.ended"]
        assert [e.data["outcome"] for e in ended] == ["completed"]

    run(go())
    store.close()


def test_a_durable_run_whose_lease_was_taken_during_a_step_stops_with_ownership_lost(tmp_path: Path) -> None:
    """The lease is taken while a step's call is in flight: the record of the interrupted call is refused by the
    fence. The block ends with ``OwnershipLost`` (not the ``FencingError`` of that refusal), and the task is not
    left marked as being cancelled (a ``TaskGroup`` or ``asyncio.timeout`` around it would misread that)."""
    store = SQLiteStore(tmp_path / "ledger.db")

    async def go() -> None:
        me = asyncio.current_task()
        assert me is not None
        with pytest.raises(OwnershipLost) as raised:
            async with jixu.durable(store, lease_ttl=0.6) as run:
                async def slow(ctx: ToolContext) -> str:
                    with SQLiteStore(tmp_path / "ledger.db") as operator:
                        key = f"thread/{run.thread_id}/turn"
                        lease = operator.get_lease(key)
                        assert lease is not None
                        operator.take_over_lease(key, "operator", 30, expected_epoch=lease.epoch,
                                                 require_expired=False)
                    await asyncio.sleep(5)
                    return "late"

                await run.effect("fetch", {"id": 1}, semantics="read_only", call=slow)
        assert "held by 'operator'" in raised.value.message
        assert me.cancelling() == 0
        assert types(store, raised.value.details["thread_id"])[-1] == "tool.dispatched", "nothing after the loss"

    run(go())
    store.close()


def test_harness_shutdown_drains_a_durable_run_before_it_closes_the_store(tmp_path: Path) -> None:
    """``Harness.shutdown`` reaches durable runs as it reaches agent turns: the step in flight finishes and is
    recorded, the next step is refused (the run stays unfinished, its lease given back at once), and only then
    is the store closed. Running the code again continues the run without redoing the finished step."""
    path, calls = tmp_path / "ledger.db", []

    async def go() -> str:
        harness = Harness(steps_agent(), path)
        stopping: list[asyncio.Task[None]] = []
        holder: list[str] = []

        async def slow(ctx: ToolContext) -> str:
            stopping.append(asyncio.create_task(harness.shutdown(drain_timeout=10)))
            await asyncio.sleep(0.3)
            calls.append("one")
            return "one"

        with pytest.raises(jixu.ThreadBusy, match="shutting down"):
            async with harness.durable() as run:
                holder.append(run.thread_id)
                await run.effect("first", {}, call=slow)
                assert not stopping[0].done(), "the store stays open while the run's block goes on"
                await run.effect("second", {}, call=lambda ctx: calls.append("two") or "two")
        await stopping[0]
        return holder[0]

    thread_id = run(go())
    assert calls == ["one"]
    with SQLiteStore(path) as store:
        assert types(store, thread_id)[-1] == "tool.completed" and "turn.ended" not in types(store, thread_id)
        lease = store.get_lease(f"thread/{thread_id}/turn")
        assert lease is None or lease.released, "the drained run gave its lease back"

    async def again() -> None:
        async with jixu.durable(path, thread_id) as run:
            assert await run.effect("first", {}, call=lambda ctx: calls.append("again") or "x") == "one"
            assert await run.effect("second", {}, call=lambda ctx: calls.append("two") or "two") == "two"

    run(again())
    assert calls == ["one", "two"]


def test_harness_shutdown_cancels_a_durable_run_still_in_a_step_at_the_drain_timeout(tmp_path: Path) -> None:
    """A step still running at the drain timeout is cancelled: its outcome is recorded unknown, the block stops,
    the lease is given back, and shutdown returns without waiting for the step's own minutes."""
    path = tmp_path / "ledger.db"

    async def go() -> tuple[str, float]:
        harness = Harness(steps_agent(), path)
        started = asyncio.Event()

        async def stuck(ctx: ToolContext) -> str:
            started.set()
            await asyncio.sleep(60)
            return "late"

        async def block() -> str:
            async with harness.durable() as run:
                holder.append(run.thread_id)
                await run.effect("charge", {"order": 7}, call=stuck)
            return "finished"

        holder: list[str] = []
        task = asyncio.create_task(block())
        await started.wait()
        began = asyncio.get_running_loop().time()
        await harness.shutdown(drain_timeout=0.3)
        took = asyncio.get_running_loop().time() - began
        assert task.done()
        with pytest.raises(asyncio.CancelledError):
            task.result()
        return holder[0], took

    thread_id, took = run(go())
    assert took < 10
    with SQLiteStore(path) as store:
        assert "tool.completed" not in types(store, thread_id) and "turn.ended" not in types(store, thread_id)
        lease = store.get_lease(f"thread/{thread_id}/turn")
        assert lease is None or lease.released
    with pytest.raises(StepOutcomeUnknown):
        run(_charge_again(path, thread_id))


async def _charge_again(path: Path, thread_id: str) -> None:
    async with jixu.durable(path, thread_id) as run:
        await run.effect("charge", {"order": 7}, call=lambda ctx: "twice")


def test_steps_of_one_run_run_at_once_and_a_retry_safe_ones_intent_is_committed_with_its_marker(
        tmp_path: Path) -> None:
    """An SDK runs a response's tool calls at once. Before, the run carried its steps out one at a time, so two
    steps that wait for each other never finished (and four 1 s tools took 4 s)."""
    store = SQLiteStore(tmp_path / "steps.db")
    calls: list[str] = []

    async def go() -> tuple[str, list[Any]]:
        async with jixu.durable(store, name="at once") as run:
            ready = {name: asyncio.Event() for name in ("a", "b", "c")}

            async def meet(name: str, ctx: ToolContext) -> str:
                calls.append(name)
                ready[name].set()
                for event in ready.values():  # each step waits until every other one started
                    await event.wait()
                return name

            def step(name: str, semantics: Any) -> Any:
                return run.effect("meet", {"who": name}, semantics=semantics, key=f"meet-{name}",
                                  call=lambda ctx: meet(name, ctx))

            results = await asyncio.wait_for(asyncio.gather(step("a", "unsafe"), step("b", "read_only"),
                                                            step("c", "idempotent")), 30)
            return run.thread_id, results

    try:
        thread_id, results = run(go())
        assert results == ["a", "b", "c"] and sorted(calls) == ["a", "b", "c"]
        log = ThreadLog.load(store, thread_id, verify=True)
        events = log.events()
        analysis = jixu.RecoveryResolver.analyze(events)
        steps = {e.data["step"]: e for e in events if e.type == "tool.requested"}
        assert {analysis.decisions[e.data["effect_id"]].state for e in steps.values()} == {"completed"}
        for key in ("meet-b", "meet-c"):  # retry-safe: the intent and its marker in one append, adjacent
            intent = steps[key]
            [marker] = [e for e in events if e.type == "tool.dispatched" and e.data["effect_id"] ==
                        intent.data["effect_id"]]
            assert marker.seq == intent.seq + 1
    finally:
        store.close()


def test_the_same_step_asked_twice_at_once_runs_once_and_both_get_its_result() -> None:
    store, calls = MemoryStore(), []

    async def fetch(ctx: ToolContext) -> dict[str, Any]:
        calls.append(ctx.effect_id)
        await asyncio.sleep(0.05)
        return {"v": 1}

    async def go() -> list[Any]:
        async with jixu.durable(store, name="twice") as run:
            return list(await asyncio.gather(*(run.effect("fetch", {"id": 1}, semantics="unsafe", key="fetch",
                                                          call=fetch) for _ in range(2))))

    assert run(go()) == [{"v": 1}, {"v": 1}]
    assert len(calls) == 1


def test_a_block_that_ends_while_a_sibling_step_runs_gives_the_run_back_only_once_that_step_ended(
        tmp_path: Path) -> None:
    """``asyncio.gather`` raises at the first failing step and leaves the others running: the block gave the run
    back while an unsafe charge was still in its call, the retry continued the run at once, the charge's probe said
    ``not_occurred`` (truly, so far) and the charge was made again. The block now waits for its steps."""
    url, bank, checks = f"sqlite:///{tmp_path / 'retry.db'}", [], []

    async def charge(ctx: ToolContext) -> str:
        await asyncio.sleep(0.3)
        bank.append(ctx.idempotency_key)
        return "charged"

    def check(ctx: ToolContext) -> str:
        checks.append(1)
        if len(checks) == 1:
            raise ToolError("the check failed once")
        return "ok"

    def probe(query: ProbeQuery) -> Any:
        return jixu.Occurred(result="charged") if query.idempotency_key in bank else NotOccurred()

    async def go() -> list[Any]:
        thread_id = None
        for attempt in range(3):
            try:
                async with jixu.durable(url, thread_id, name="retry") as run:
                    thread_id = run.thread_id
                    return list(await asyncio.gather(
                        run.effect("charge", {"order": 7}, key="charge", call=charge, probe=probe),
                        run.effect("check", {"n": attempt}, key=f"check-{attempt}", call=check)))
            except StepFailed:
                continue
        raise AssertionError("never finished")

    assert run(go()) == ["charged", "ok"]
    assert len(bank) == 1, "charged once"


def test_a_drain_lets_the_steps_in_flight_finish_and_records_them(tmp_path: Path) -> None:
    """A step asked during a drain is refused, which ends the gather and the block: the steps still in flight ran
    on and acted, but the store closed before their receipts. Their receipts are recorded before the run is given
    back."""
    ran: list[int] = []
    entered: list[int] = []

    async def step(ctx: ToolContext, number: int) -> int:
        entered.append(number)
        await asyncio.sleep(0.2 * number)
        ran.append(number)
        return number

    async def go() -> str:
        harness = Harness(steps_agent("steps"), tmp_path / "drain.db")
        thread_id: list[str] = []
        draining = asyncio.Event()

        async def block() -> None:
            async with harness.durable(None, name="drained") as run:
                thread_id.append(run.thread_id)

                async def late() -> Any:
                    await draining.wait()  # asked once the drain began (not after a guessed delay: CI is slow)
                    return await run.effect("late", {}, key="late", call=lambda ctx: "late")

                await asyncio.gather(*(run.effect("s", {"n": n}, key=f"s{n}", call=lambda ctx, n=n: step(ctx, n))
                                       for n in (1, 2, 3)), late())

        task = asyncio.create_task(block())
        deadline = asyncio.get_running_loop().time() + 30
        while len(entered) < 3 and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.01)
        assert sorted(entered) == [1, 2, 3], "the three steps are in flight"
        shutdown = asyncio.create_task(harness.shutdown(drain_timeout=5))
        while not harness.closing:
            await asyncio.sleep(0)
        draining.set()
        await shutdown
        with pytest.raises(jixu.ThreadBusy):
            await task
        return thread_id[0]

    thread_id = run(go())
    with SQLiteStore(tmp_path / "drain.db") as store:
        log = ThreadLog.load(store, thread_id, verify=True)
        analysis = jixu.RecoveryResolver.analyze(log.events())
        states = {e.data["step"]: analysis.decisions[e.data["effect_id"]].state for e in log.events()
                  if e.type == "tool.requested"}
    assert sorted(ran) == [1, 2, 3]
    assert states == {"s1": "completed", "s2": "completed", "s3": "completed"}


def test_another_writers_append_while_a_step_records_is_read_and_the_step_decided_again(tmp_path: Path) -> None:
    """An operator approves a parked step (another connection) just before a sibling's intent and marker are
    appended: the append was refused, the step raised ConcurrencyError, and its key kept an intent that was never
    stored (asked again: "the thread is corrupt"). The step now reads the new events and records again."""
    from jixu.ledger import open_store

    url, calls = f"sqlite:///{tmp_path / 'conflict.db'}", []

    async def go() -> tuple[Any, Any]:
        async with jixu.durable(url, name="conflict", approval_poll=0.05) as run:
            store, approved = run._live().log.store, []

            def approve_now() -> None:
                other = open_store(url)
                try:
                    log = ThreadLog.load(other, run.thread_id)
                    [parked] = [e for e, d in log.open_analysis().decisions.items() if d.state == "parked"]
                    log.decide_parked(parked, "approved", actor="ops")
                    approved.append(parked)
                finally:
                    other.close()

            _before_first_append(store, approve_now, when="sibling")  # the operator commits just before it
            gated = asyncio.create_task(run.effect("gated", {}, requires_approval=True, key="gated",
                                                   call=lambda ctx: "gated ran"))
            await asyncio.sleep(0.2)
            sibling = await run.effect("sibling", {"x": 1}, semantics="idempotent", key="sibling",
                                       call=lambda ctx: calls.append(ctx.effect_id) or "sibling ran")
            assert approved, "the operator's approval raced the sibling's append"
            return sibling, await gated

    assert run(go()) == ("sibling ran", "gated ran")
    assert len(calls) == 1


def test_an_operators_approval_refused_by_another_writers_append_is_decided_again(tmp_path: Path) -> None:
    """Steps of a run append while one of them is parked, so an operator's approval often met another writer's
    append first: `jixu threads approve` exited 4 (concurrency_conflict) and an approver that did not retry left
    the step waiting for good. The decision is now taken again on the new events."""
    from jixu.ledger import open_store

    url = f"sqlite:///{tmp_path / 'approve.db'}"

    async def go() -> list[Any]:
        async with jixu.durable(url, name="approvals", approval_poll=0.05) as run:
            gated = [asyncio.create_task(run.effect("gated", {"n": n}, requires_approval=True, key=f"gated-{n}",
                                                    call=lambda ctx, n=n: f"gated {n} ran")) for n in (1, 2)]
            await asyncio.sleep(0.2)
            first, second = open_store(url), open_store(url)
            try:
                logs = [ThreadLog.load(store, run.thread_id) for store in (first, second)]
                parked = sorted(e for e, d in logs[0].open_analysis().decisions.items() if d.state == "parked")
                raced = _before_first_append(second, lambda: logs[0].decide_parked(parked[0], "approved",
                                                                                   actor="ops-1"))
                logs[1].decide_parked(parked[1], "approved", actor="ops-2")
                assert raced, "the other operator's approval was committed first"
            finally:
                first.close()
                second.close()
            return list(await asyncio.wait_for(asyncio.gather(*gated), 30))

    assert run(go()) == ["gated 1 ran", "gated 2 ran"]


def _before_first_append(store: Store, first: Any, *, when: str = "") -> list[bool]:
    """Make ``store`` call ``first()`` once, just before its first append whose arguments mention ``when`` (another
    writer committing first); the list returned holds True once it did."""
    done: list[bool] = []

    def racing(append: Any) -> Any:
        def append_now(*args: Any, **kwargs: Any) -> Any:
            if not done and when in repr(args):
                done.append(True)
                first()
            return append(*args, **kwargs)
        return append_now

    for name in ("append", "append_many"):
        setattr(store, name, racing(getattr(store, name)))
    return done


def test_a_block_settling_its_steps_refuses_new_ones_and_still_gives_its_run_back(tmp_path: Path) -> None:
    """While the ending block waited for a call's worker thread, a gather sibling started its next step: the set of
    calls changed under the wait (RuntimeError), the block's own error was lost, and its session kept renewing the
    lease (every retry TurnOwned until the process ended). A step asked while the block ends is now refused."""
    import time

    url, started = f"sqlite:///{tmp_path / 'settle.db'}", []

    def slow(ctx: ToolContext) -> str:
        time.sleep(0.6)  # outlives its 0.1 s timeout in its thread
        return "slow"

    async def lookup_then_charge(run: Any) -> Any:
        await run.effect("lookup", {}, key="lookup", semantics="read_only", call=lambda ctx: asyncio.sleep(0.2))
        return await run.effect("charge", {}, key="charge", call=lambda ctx: started.append(1) or "charged")

    async def go() -> None:
        thread_id = None
        with pytest.raises(StepOutcomeUnknown):
            async with jixu.durable(url, None, name="settle") as run:
                thread_id = run.thread_id
                await asyncio.gather(lookup_then_charge(run), run.effect("slow", {}, key="slow", call=slow,
                                                                          timeout=0.1))
        assert started == [], "no step started once the block was ending"
        with pytest.raises(StepOutcomeUnknown):  # the run was given back: the next entry claims it at once
            async with jixu.durable(url, thread_id, name="settle") as again:
                await again.effect("slow", {}, key="slow", call=slow, timeout=0.1)

    run(go())


def test_a_retry_safe_step_past_its_timeout_is_called_again_once_its_first_call_returned(tmp_path: Path) -> None:
    """The next attempt waited for the first attempt's worker thread inside its own timeout: every attempt timed
    out without calling, and the step ended unknown, for an operator. The wait now comes before the attempt."""
    import time

    calls: list[int] = []

    def fetch(ctx: ToolContext) -> str:
        calls.append(ctx.attempt)
        time.sleep(0.5 if len(calls) == 1 else 0.0)
        return "fetched"

    async def go() -> Any:
        async with jixu.durable(f"sqlite:///{tmp_path / 'retry.db'}", name="retry") as run:
            return await run.effect("fetch", {}, key="fetch", semantics="idempotent", call=fetch, timeout=0.2)

    assert run(go()) == "fetched"
    assert calls == [1, 2]


def test_shutdown_past_its_drain_timeout_gives_a_run_back_once_its_call_in_a_thread_returned(tmp_path: Path) -> None:
    """A sync call still running in its thread at the drain timeout: the block waited for it, but the store was
    closed under it, so its lease was never given back (TurnOwned here until the process ended). Shutdown now waits
    for the call, then the run gives its lease back and the store closes."""
    import time

    url, returned, started = f"sqlite:///{tmp_path / 'shutdown.db'}", [], []

    def charge(ctx: ToolContext) -> str:
        started.append(ctx.attempt)
        time.sleep(1.3)  # longer than the drain waited for a cancelled block before (max(timeout, 1 s))
        returned.append(ctx.attempt)
        return "charged"

    async def go() -> str:
        harness = Harness(steps_agent("steps"), url)
        thread_id: list[str] = []

        async def block() -> None:
            async with harness.durable(None, name="shut") as run:
                thread_id.append(run.thread_id)
                await run.effect("charge", {}, key="charge", semantics="idempotent", call=charge)

        task = asyncio.create_task(block())
        deadline = asyncio.get_running_loop().time() + 30
        while not started and asyncio.get_running_loop().time() < deadline:  # not a guessed delay: CI is slow
            await asyncio.sleep(0.01)
        await harness.shutdown(drain_timeout=0.1)
        assert returned == [1], "shutdown returned once the call in its thread had returned"
        with pytest.raises(asyncio.CancelledError):
            await task
        async with jixu.durable(url, thread_id[0], name="shut") as again:  # given back: claimed at once
            return str(await again.effect("charge", {}, key="charge", semantics="idempotent", call=charge))

    assert run(go()) == "charged"


def test_a_block_that_returns_with_an_unsafe_step_unknown_says_its_run_stays_unfinished(tmp_path: Path) -> None:
    """A run does not end while an unsafe step of it is unknown (decision 0064): a block that caught the
    StepOutcomeUnknown and returned is told, not left to believe the run ended. A read-only step whose attempts ran
    out does not hold the run (an audit: such a run could never end, and a rerun never called the lookup again)."""
    store = SQLiteStore(tmp_path / "unfinished.db")
    lookups: list[int] = []

    def lookup(ctx: ToolContext) -> str:
        lookups.append(ctx.attempt)
        raise ConnectionError("the lookup service is down")

    def charge(ctx: ToolContext) -> str:
        raise ConnectionError("the connection dropped after the request went out")

    async def go() -> None:
        async with jixu.durable(store) as run:  # only a read-only step left unknown: the run ends
            with pytest.raises(StepOutcomeUnknown):
                await run.effect("lookup", {"order": 7}, call=lookup, semantics="read_only")
            first = run.thread_id
        assert ThreadLog.load(store, first).events()[-1].type == "turn.ended" and len(lookups) == 3
        with pytest.raises(StepOutcomeUnknown, match="stays unfinished") as unfinished:
            async with jixu.durable(store) as run:
                with pytest.raises(StepOutcomeUnknown):
                    await run.effect("charge", {"order": 7}, call=charge)
                second = run.thread_id
        assert unfinished.value.details["thread_id"] == second
        assert "turn.ended" not in types(store, second)

    run(go())
    store.close()


async def _interrupted_with_an_unknown_charge(target: Any, charge: Any) -> str:
    """A durable run whose unsafe ``charge`` step is left unknown, then ended by an operator's interrupt: its
    thread's id."""
    with pytest.raises(StepOutcomeUnknown):
        async with jixu.durable(target) as run:
            thread_id = run.thread_id
            await run.effect("charge", {"order": 7}, call=charge)
    harness = Harness(steps_agent(), target)
    await (await harness.open_thread(thread_id, resume=False)).interrupt("stopped by the operator")
    await harness.shutdown()
    return thread_id


def test_a_new_run_is_refused_while_an_ended_runs_unsafe_step_is_unknown(tmp_path: Path) -> None:
    """An audit: `interrupt()` ended a run whose unsafe step was unknown, and the next run started and made the
    call again (two charges). As `send` refuses a thread waiting on an unknown call, a new durable run does."""
    store = SQLiteStore(tmp_path / "interrupted.db")
    charges: list[str] = []

    def charge(ctx: ToolContext) -> str:
        charges.append(ctx.idempotency_key)
        raise ConnectionError("the connection dropped after the request went out")

    async def go() -> None:
        thread_id = await _interrupted_with_an_unknown_charge(store, charge)
        assert types(store, thread_id)[-1] == "turn.ended"
        with pytest.raises(jixu.ThreadBusy, match="unknown outcome"):
            async with jixu.durable(store, thread_id) as run:
                await run.effect("charge", {"order": 7}, call=charge)
        assert len(charges) == 1

    run(go())
    store.close()


def test_an_idempotent_step_left_unknown_holds_its_run_and_a_refused_entry_leaves_nothing_open(tmp_path: Path) -> None:
    """An audit: an idempotent step left unknown no longer held its run; the run ended, the next run made the call
    again under a new key (a key-deduplicating bank charged twice). It holds the run, as an unsafe one does; and a
    `jixu.durable(path)` refused because its thread waits for an operator closed nothing (one open file each)."""
    db = tmp_path / "idempotent.db"
    keys: list[str] = []

    def charge(ctx: ToolContext) -> str:
        keys.append(ctx.idempotency_key)
        raise ConnectionError("no answer")

    def open_files() -> int:
        return len(list(Path("/proc/self/fd").iterdir()))

    async def go() -> None:
        with pytest.raises(StepOutcomeUnknown, match="stays unfinished"):
            async with jixu.durable(db) as run:
                with pytest.raises(StepOutcomeUnknown):
                    await run.effect("charge", {"order": 7}, call=charge, semantics="idempotent")
                thread_id = run.thread_id
        with SQLiteStore(db) as store:
            assert "turn.ended" not in types(store, thread_id)
        assert len(set(keys)) == 1  # every attempt under the step's one key
        # An operator abandons it, then interrupts: a new run is refused while another call is unknown (none is
        # now: the first run is continued instead), and refusals leave nothing open.
        harness = Harness(steps_agent(), db)
        thread = await harness.open_thread(thread_id, resume=False)
        await thread.interrupt("stopped by the operator")
        await harness.shutdown()
        before = open_files()
        for _ in range(5):
            with pytest.raises(jixu.ThreadBusy, match="waiting for an operator"):
                async with jixu.durable(db, thread_id) as run:
                    await run.effect("charge", {"order": 7}, call=charge, semantics="idempotent")
        assert open_files() <= before, "a refused entry left its store open"
        assert len(set(keys)) == 1

    run(go())


def test_the_refusals_resolve_command_works_when_pasted_with_a_space_in_the_stores_path(tmp_path: Path) -> None:
    """An audit: the printed `jixu threads resolve` command did not quote the store's URL, so a path with a space
    failed when pasted (exit 2)."""
    db = tmp_path / "my dir" / "s.db"
    db.parent.mkdir()

    def charge(ctx: ToolContext) -> str:
        raise ConnectionError("the connection dropped after the request went out")

    async def go() -> str:
        thread_id = await _interrupted_with_an_unknown_charge(db, charge)
        with pytest.raises(jixu.ThreadBusy) as refused:
            async with jixu.durable(db, thread_id) as run:
                await run.effect("charge", {"order": 7}, call=charge)
        return str(refused.value)

    message = run(go())
    command = message.split("`")[1].replace("RESOLUTION", "occurred").replace("...", "checked")
    words = shlex.split(command)
    assert words[:3] == ["jixu", "threads", "resolve"]
    done = run_jixu(*words[1:])
    assert done.returncode == 0, (command, done.stdout, done.stderr)
