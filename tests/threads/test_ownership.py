"""Turn ownership (SPEC 4.5): one owner per active turn, fenced appends, explicit recovery by the store's clock."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path
from typing import Any

import pytest

from jixu import Agent, ScriptedModel, ToolCall, tool
from jixu.errors import (
    FencingError,
    InvalidInput,
    NotFound,
    OwnershipLost,
    ResolutionConflict,
    ThreadBusy,
    TurnOwned,
)
from jixu.ledger import NewEvent
from jixu.ledger.store import Fence, LeaseTake
from jixu.scheduling import submit_turn
from jixu.threads.log import NOBODY_RUNS, ThreadLog
from tests.threads.conftest import Ledger, of_type, run, wait_for

REQUEST = "0123456789abcdef0123456789abcdef"


def blocking_agent(ran: list[str], block: float) -> Agent:
    """An agent whose unsafe tool blocks the event loop (so the owner cannot heartbeat) for ``block`` s."""

    @tool(semantics="unsafe")
    async def charge(order: str) -> str:
        ran.append(order)
        time.sleep(block)  # deliberately blocks the loop: the lease is not renewed meanwhile
        return f"charged {order}"

    return Agent("shop", ScriptedModel([ToolCall("charge", {"order": "42"}), "Charged."]), tools=[charge])


def quick_agent(calls: list[Any] | None = None) -> Agent:
    model = ScriptedModel([ToolCall("charge", {"order": "42"}), "Charged."])

    @tool(semantics="unsafe")
    def charge(order: str) -> str:
        if calls is not None:
            calls.append(order)
        return f"charged {order}"

    return Agent("shop", model, tools=[charge])


def test_a_turn_is_started_by_a_claim_and_every_event_is_fenced(ledger: Ledger) -> None:
    harness = ledger.harness(quick_agent(), owner="worker-a")

    async def scenario() -> None:
        thread = await harness.create_thread()
        await thread.send("charge 42")
        state = await thread.wait()
        assert state.status == "idle"
        [started] = of_type(await thread.events(), "turn.started")
        assert (started.data["owner"], started.data["epoch"]) == ("worker-a", 1)
        lease = ledger.store().get_lease(thread.log.turn_key)
        assert lease is not None and lease.released and lease.owner == "worker-a"

    run(scenario())


def test_a_second_process_reads_but_does_not_run_a_live_owners_turn(ledger: Ledger) -> None:
    ran: list[str] = []
    owner = ledger.harness(blocking_agent(ran, 0.0), owner="worker-a", lease_ttl=30)
    other = ledger.harness(blocking_agent(ran, 0.0), owner="worker-b", lease_ttl=30)

    async def scenario() -> None:
        thread = await owner.create_thread()
        # Record a claimed turn without running it: the owner "is busy elsewhere".
        thread.log.start_turn("charge 42", owner="worker-a", ttl=30)
        seen = await other.open_thread(thread.thread_id)
        assert not seen.running and seen.state().status == "running"
        problem = seen.claim_problem()
        assert problem is not None and "owned by worker-a" in problem
        with pytest.raises(TurnOwned):
            await seen.wait()
        assert ran == []

    run(scenario())


def test_another_process_cannot_interrupt_a_turn_a_live_owner_runs(ledger: Ledger) -> None:
    """Interrupting from a process that does not own the turn would end it under its owner (unfenced), whose call
    goes on and whose wait() then finds its turn gone: refused, as a resolution is, and nothing is written."""
    release = asyncio.Event()
    started = asyncio.Event()

    @tool(semantics="unsafe")
    async def charge(order: str) -> str:
        started.set()
        await release.wait()
        return f"charged {order}"

    def agent() -> Agent:
        return Agent("shop", ScriptedModel([ToolCall("charge", {"order": "42"}), "Charged."]), tools=[charge])

    owner = ledger.harness(agent(), owner="worker-a", lease_ttl=30)
    other = ledger.harness(agent(), owner="worker-b", lease_ttl=30)

    async def scenario() -> None:
        thread = await owner.create_thread()
        await thread.send("charge 42")
        await asyncio.wait_for(started.wait(), 10)
        try:
            seen = await other.open_thread(thread.thread_id)
            head = len(await seen.events())
            with pytest.raises(TurnOwned, match="worker-a"):
                await seen.interrupt("from elsewhere")
            assert len(await seen.events()) == head, "nothing is written under a live owner"
        finally:
            release.set()  # the call ends whatever happened (a loop's end waits for a call in flight)
        state = await asyncio.wait_for(thread.wait(), 10)
        assert (state.status, state.last_reply) == ("idle", "Charged.")
        ended = of_type(await thread.events(), "turn.ended")
        assert [e.data["outcome"] for e in ended] == ["completed"]

    run(scenario())


def test_a_turn_nobody_holds_says_so_and_one_held_elsewhere_names_its_holder(ledger: Ledger) -> None:
    """An audit: after a drain gave a turn's claim back (its work queued again), every surface showed `running`
    with no reason, read as a worker stuck on it."""
    owner = ledger.harness(quick_agent(), owner="worker-a", lease_ttl=30)
    viewer = ledger.harness(quick_agent(), owner="viewer", lease_ttl=30)

    async def scenario() -> None:
        thread = await owner.create_thread()
        submit_turn(ledger.store(), thread.thread_id, "charge 42")  # queued: nobody holds it yet
        seen = await viewer.open_thread(thread.thread_id, resume=False)
        state = seen.state()
        assert (state.status, state.reason) == ("running", NOBODY_RUNS)
        other = await owner.create_thread()
        other.log.start_turn("charge 43", owner="worker-a", ttl=30)  # held by a live process
        state = (await viewer.open_thread(other.thread_id, resume=False)).state()
        assert state.status == "running" and "is in progress in worker-a" in state.reason, state.reason
        # Its claim expired while its holder is not proven gone (recorded on another machine): an operator's
        # recovery continues it, not a worker (the review of the reason above).
        lease = ledger.store().get_lease(other.log.turn_key)
        assert lease is not None
        ledger.store().renew_lease(Fence(other.log.turn_key, lease.owner, lease.epoch), 0.05)
        await asyncio.sleep(0.1)
        state = (await viewer.open_thread(other.thread_id, resume=False)).state()
        assert state.status == "running" and "jixu turns recover" in state.reason, state.reason
        # Seen by its own owner, which takes it back at once: nobody runs it (the review of the reason above).
        mine = ledger.harness(quick_agent(), owner="worker-a", lease_ttl=30)
        state = (await mine.open_thread(other.thread_id, resume=False)).state()
        assert (state.status, state.reason) == ("running", NOBODY_RUNS)

    run(scenario())


@pytest.mark.parametrize("late_owner", ["worker-a", "worker-b"])
def test_a_lease_that_moves_on_between_the_look_and_the_take_is_looked_at_again(ledger: Ledger,
                                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                                 late_owner: str) -> None:
    # A killed process's last commit (its claim of the lease) can land on the server after a restarted process
    # of the same owner read the lease: the take then meets a newer epoch. The claim (kernel.ownership's
    # take_claim, which runs take the same way) looks again and takes the lease from there instead of failing
    # the turn; a live lease of another owner found on the second look is still refused (LeaseHeld).
    calls: list[Any] = []
    first = ledger.harness(quick_agent(calls), owner="worker-a", lease_ttl=30)
    again = ledger.harness(quick_agent(calls), owner="worker-a", lease_ttl=30)

    async def scenario() -> None:
        thread = await first.create_thread()
        thread.log.start_turn("charge 42", owner="worker-a", ttl=30)  # claimed at epoch 1, then the process died
        reopened = await again.open_thread(thread.thread_id, resume=False)
        store = reopened.log.store
        takes = store.take_over_leases
        late: list[int] = []

        def late_commit_first(requests: Any) -> Any:
            if not late:  # the dead process's claim lands now, between the look and this take
                [taken] = takes([LeaseTake(reopened.log.turn_key, late_owner, 30, 1, False)])
                assert isinstance(taken, Fence)
                late.append(taken.epoch)
            return takes(requests)

        monkeypatch.setattr(store, "take_over_leases", late_commit_first)
        if late_owner != "worker-a":  # another owner's live lease: the second look refuses, nothing runs
            with pytest.raises(TurnOwned):
                await reopened.wait()
            assert late == [2] and calls == []
            return
        state = await reopened.wait()
        assert late == [2] and state.status == "idle" and calls == ["42"]
        claims = [e.data for e in of_type(reopened.log.events(), "turn.claimed")]
        assert [c["epoch"] for c in claims] == [3], "the claim looked again and took the lease at epoch 3"

    run(scenario())


def test_an_expired_turn_stays_until_it_is_recovered_with_the_observed_epoch(ledger: Ledger) -> None:
    calls: list[Any] = []
    first = ledger.harness(quick_agent(calls), owner="worker-a", lease_ttl=0.2)
    second = ledger.harness(quick_agent(calls), owner="worker-b")

    async def scenario() -> None:
        thread = await first.create_thread()
        turn_id, _fence = thread.log.start_turn("charge 42", owner="worker-a", ttl=0.2)
        await asyncio.sleep(0.3)  # the owner "died": its lease expires by the store's clock
        seen = await second.open_thread(thread.thread_id)
        assert not seen.running, "an expired turn is not taken over without an explicit decision"
        assert "recover the turn explicitly" in (seen.claim_problem() or "")
        log = seen.log
        ownership = log.ownership()
        assert ownership is not None and ownership["expired"] and ownership["epoch"] == 1
        assert log.recovery_reason(ownership) == "lease_expired", "the forecast the Studio offers its form on"
        with pytest.raises(FencingError):
            log.recover_turn(turn_id, request_id=REQUEST, expected_epoch=7)
        before = len(await seen.events())
        receipt = log.recover_turn(turn_id, request_id=REQUEST, expected_epoch=1, actor="ops")
        assert receipt["reason"] == "lease_expired" and receipt["epoch"] == 2
        assert receipt["previous_owner"] == "worker-a"
        assert log.recovery_reason(log.ownership()) is None, "a recovered turn is not offered again"
        events = await seen.events()
        assert [e.type for e in events[before:]] == ["turn.recovered"]
        assert seen.state().status == "waiting" and "needs reconciliation" in seen.state().reason
        # Idempotent on the request id; a changed body is refused.
        assert log.recover_turn(turn_id, request_id=REQUEST, expected_epoch=1, actor="ops") == receipt
        assert len(await seen.events()) == len(events)
        with pytest.raises(ResolutionConflict):
            log.recover_turn(turn_id, request_id=REQUEST, expected_epoch=2)
        # Recovery retried nothing: no model and no tool was called.
        assert calls == [] and of_type(events, "model.dispatched") == []
        # The former owner's late writes are refused by the fence.
        with pytest.raises(FencingError):
            ledger.store().append(thread.stream, [NewEvent("model.requested", {"late": True})], len(events),
                                  _fence)
        # Continuing after reconciliation is an explicit new claim.
        state = await seen.wait()
        assert state.status == "idle" and state.last_reply == "Charged." and calls == ["42"]
        [claimed] = of_type(await seen.events(), "turn.claimed")
        assert claimed.data["reason"] == "continued" and claimed.data["epoch"] == 3

    run(scenario())


def test_a_claim_taken_but_never_recorded_is_taken_over_once_it_expires_without_an_operator(ledger: Ledger) -> None:
    """A process took the turn's lease and was killed before its ``turn.claimed`` was committed: no event names
    it, so nothing could prove it gone, and the turn waited for an explicit recovery. Its claim is its first
    write under that epoch, so it did nothing under it (and a late write of its would be fenced out): once
    the lease expires, the next process takes the turn over by itself. Before, it is still the holder's."""
    calls: list[Any] = []
    first = ledger.harness(quick_agent(calls), owner="worker-a", lease_ttl=0.2)
    second = ledger.harness(quick_agent(calls), owner="worker-b")

    async def scenario() -> None:
        thread = await first.create_thread()
        _turn_id, fence = thread.log.start_turn("charge 42", owner="worker-a", ttl=0.2)
        ledger.store().take_over_lease(thread.log.turn_key, "ghost", 0.3, expected_epoch=fence.epoch,
                                       require_expired=False)  # ... and killed before recording its claim
        early = await second.open_thread(thread.thread_id, resume=False)
        assert "owned by ghost" in (early.claim_problem() or ""), "a holder may still record its claim"
        await asyncio.sleep(0.4)
        seen = await second.open_thread(thread.thread_id)
        assert seen.claim_problem() is None
        state = await asyncio.wait_for(seen.wait(), 20)
        assert state.status == "idle" and state.last_reply == "Charged." and calls == ["42"]
        [claimed] = of_type(await seen.events(), "turn.claimed")
        assert (claimed.data["reason"], claimed.data["previous_owner"], claimed.data["epoch"]) == (
            "took_over_expired", "ghost", 3)

    run(scenario())


def test_recovering_a_live_turn_is_refused_by_the_store_clock(ledger: Ledger) -> None:
    harness = ledger.harness(quick_agent(), owner="worker-a")

    async def scenario() -> None:
        thread = await harness.create_thread()
        turn_id, _ = thread.log.start_turn("charge 42", owner="worker-a", ttl=30)
        other = ThreadLog.load(ledger.store(), thread.thread_id)
        before = len(other.events())
        assert other.recovery_reason(other.ownership()) is None
        with pytest.raises(TurnOwned):
            other.recover_turn(turn_id, request_id=REQUEST, expected_epoch=1)
        with pytest.raises(InvalidInput):
            other.recover_turn(turn_id, request_id="not-hex", expected_epoch=1)
        with pytest.raises(InvalidInput):
            other.recover_turn(turn_id, request_id=REQUEST, expected_epoch=1, legacy_confirmed_stopped=True)
        with pytest.raises(NotFound):
            other.recover_turn("01JD0000000000000000000000", request_id=REQUEST, expected_epoch=1)
        assert len(other.events()) == before

    run(scenario())


def test_a_legacy_turn_needs_an_explicit_assertion_recorded_as_such(ledger: Ledger) -> None:
    harness = ledger.harness(quick_agent(), owner="worker-a")

    async def scenario() -> None:
        thread = await harness.create_thread()
        # A turn recorded before ownership existed: no owner, epoch 0, not queued.
        store = ledger.store()
        store.append(thread.stream, [NewEvent("turn.started", {"turn_id": "01JD0000000000000000000001",
                                                               "input": "old"})], 1)
        log = ThreadLog.load(store, thread.thread_id)
        assert log.recovery_reason(log.ownership()) == "legacy_confirmed_stopped"
        assert log.recovery_reason(None) is None
        with pytest.raises(InvalidInput, match="legacy_confirmed_stopped"):
            log.recover_turn("01JD0000000000000000000001", request_id=REQUEST, expected_epoch=0)
        receipt = log.recover_turn("01JD0000000000000000000001", request_id=REQUEST, expected_epoch=0,
                                   legacy_confirmed_stopped=True)
        assert receipt["reason"] == "legacy_confirmed_stopped" and receipt["legacy_confirmed_stopped"] is True
        assert log.recovery_reason(log.ownership()) is None

    run(scenario())


def test_a_late_reply_from_the_former_owner_is_rejected(durable_ledger: Ledger) -> None:
    """The owner blocks past its lease; another connection recovers; the owner's receipt cannot be written."""
    ran: list[str] = []
    owner = durable_ledger.harness(blocking_agent(ran, 0.8), owner="worker-a", lease_ttl=0.2)

    def recover_when_expired(thread_id: str) -> dict[str, Any]:
        # Runs in another OS thread, with its own connection, while the owner's loop is blocked in the tool.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.05)
            log = ThreadLog.load(durable_ledger.store(), thread_id)
            turn, ownership = log.state.active_turn(), log.ownership()
            if turn is not None and ownership and ownership["expired"] and of_type(log.events(), "tool.dispatched"):
                return log.recover_turn(turn.turn_id, request_id=REQUEST, expected_epoch=ownership["epoch"])
        raise AssertionError("the owner's lease never expired")

    async def scenario() -> None:
        thread = await owner.create_thread()
        recovery = asyncio.get_running_loop().run_in_executor(None, recover_when_expired, thread.thread_id)
        turn_id = await thread.send("charge 42")
        with pytest.raises(OwnershipLost):
            await thread.wait()
        receipt = await recovery
        events = await thread.events()
        assert of_type(events, "tool.completed") == [], "the late receipt must not be recorded"
        assert events[-1].type == "turn.recovered" and receipt["turn_id"] == turn_id
        assert ran == ["42"]

    run(scenario())


def test_wait_reports_a_background_loop_that_failed_before_anyone_waited(durable_ledger: Ledger,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    """send() runs the loop in the background. When it stops with an error before anyone waits for it, the
    next wait() raises that error (so it is retrieved, never lost), and only the wait() after it starts the
    loop again (which now finds the turn owned by the process that took it)."""
    thief = durable_ledger.store()
    logs: list[ThreadLog] = []

    @tool(semantics="read_only")
    def look() -> str:
        """Another process takes the turn over while this call runs."""
        log = logs[0]
        lease = thief.get_lease(log.turn_key)
        assert lease is not None
        thief.take_over_lease(log.turn_key, "thief", 30.0, expected_epoch=lease.epoch, require_expired=False)
        return "looked"

    harness = durable_ledger.harness(Agent("stolen", ScriptedModel([ToolCall("look"), "done"]), tools=[look]),
                                     owner="worker-a")

    async def scenario() -> None:
        thread = await harness.create_thread()
        logs.append(thread.log)
        await thread.send("look around")
        started = thread.running
        while thread.running:
            await asyncio.sleep(0.01)
        assert started, "the loop ran in the background and stopped before anyone waited"
        with pytest.raises(OwnershipLost, match="no longer owns"):
            await thread.wait()
        with pytest.raises(TurnOwned, match="thief"):
            await thread.wait()
        assert of_type(await thread.events(), "tool.completed") == [], "the fenced-out receipt was not recorded"

    run(scenario())
    gc.collect()  # a task whose exception nobody retrieved logs it when it is collected
    assert "exception was never retrieved" not in caplog.text


def test_safe_takeover_continues_an_expired_turn_only_when_no_outcome_is_in_doubt(ledger: Ledger) -> None:
    calls: list[Any] = []
    dead = ledger.harness(quick_agent(calls), owner="worker-a", lease_ttl=0.2)
    rescuer = ledger.harness(quick_agent(calls), owner="worker-b", takeover="safe")

    async def scenario() -> None:
        thread = await dead.create_thread()
        thread.log.start_turn("charge 42", owner="worker-a", ttl=0.2)  # claimed, then the owner died
        await asyncio.sleep(0.3)
        seen = await rescuer.open_thread(thread.thread_id)
        state = await seen.wait()
        assert state.status == "idle" and calls == ["42"]
        [claimed] = of_type(await seen.events(), "turn.claimed")
        assert (claimed.data["reason"], claimed.data["previous_owner"]) == ("took_over_expired", "worker-a")

    run(scenario())


def test_safe_takeover_refuses_when_an_unsafe_outcome_is_unknown(ledger: Ledger) -> None:
    dead = ledger.harness(quick_agent(), owner="worker-a", lease_ttl=0.2)
    rescuer = ledger.harness(quick_agent(), owner="worker-b", takeover="safe")

    async def scenario() -> None:
        thread = await dead.create_thread()
        _turn, fence = thread.log.start_turn("charge 42", owner="worker-a", ttl=0.2)
        # The owner recorded a dispatched unsafe call and died before its receipt.
        from jixu.ledger import content_hash

        args = {"order": "42"}
        thread.log.append([
            NewEvent("tool.requested", {"effect_id": "e1", "name": "charge", "args": args,
                                        "args_hash": content_hash(args), "semantics": "unsafe",
                                        "idempotency_key": "jixu:e1", "turn_id": _turn, "call_id": "c1"}),
            NewEvent("tool.dispatched", {"effect_id": "e1", "attempt": 1}),
        ], fence)
        await asyncio.sleep(0.3)
        seen = await rescuer.open_thread(thread.thread_id)
        assert not seen.running and "recover the turn explicitly" in (seen.claim_problem() or "")

    run(scenario())


def test_the_store_clock_decides_expiry_whatever_the_workers_clock_says(durable_ledger: Ledger,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    harness = durable_ledger.harness(quick_agent(), owner="worker-a", lease_ttl=30)

    async def scenario() -> None:
        thread = await harness.create_thread()
        turn_id, _ = thread.log.start_turn("charge 42", owner="worker-a", ttl=30)
        skewed = time.time() + 3600  # this process's clock is an hour fast
        monkeypatch.setattr(time, "time", lambda: skewed)
        log = ThreadLog.load(durable_ledger.store(), thread.thread_id)
        ownership = log.ownership()
        assert ownership is not None and not ownership["expired"]
        with pytest.raises(TurnOwned):
            log.recover_turn(turn_id, request_id=REQUEST, expected_epoch=1)

    run(scenario())


def test_shutdown_drains_running_work_and_leaves_the_turn_for_another_process(ledger: Ledger) -> None:
    ran: list[str] = []
    release = asyncio.Event()

    @tool(semantics="unsafe")
    async def charge(order: str) -> str:
        ran.append(order)
        await release.wait()
        return f"charged {order}"

    def agent() -> Agent:
        return Agent("shop", ScriptedModel([ToolCall("charge", {"order": "42"}), "Charged."]), tools=[charge])

    first = ledger.harness(agent(), owner="worker-a")
    second = ledger.harness(agent(), owner="worker-b")

    async def scenario() -> None:
        thread = await first.create_thread()
        await thread.send("charge 42")
        await wait_for(lambda: bool(ran))
        shutting = asyncio.create_task(first.shutdown(drain_timeout=5))
        await asyncio.sleep(0.05)
        with pytest.raises(ThreadBusy):
            await first.create_thread()
        release.set()  # the call in flight finishes within the drain timeout
        await shutting
        events = ledger.store().read(thread.stream)  # the first harness closed its store
        assert len(of_type(events, "tool.completed")) == 1 and of_type(events, "turn.ended") == []
        continued = await second.open_thread(thread.thread_id)
        state = await continued.wait()
        assert state.status == "idle" and state.last_reply == "Charged." and ran == ["42"]

    run(scenario())


def test_a_turn_starting_when_shutdown_begins_is_left_for_another_process_not_run_on_a_closed_store(
        ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    """``send`` is committing its turn's start (a slow disk) when the harness begins to shut down. The shutdown
    waits for that commit, then the turn is left as a drained one is: recorded, no loop started, its lease
    released, so another process continues it at once. Before, the shutdown closed the store under the start,
    and a loop started afterwards on the closed store, leaving the lease held for nobody."""
    original = ThreadLog.start_turn_async
    gates: dict[str, asyncio.Event] = {}

    async def slow_start(self: ThreadLog, *args: Any, **kwargs: Any) -> Any:
        gates["entered"].set()
        await gates["go_on"].wait()
        return await original(self, *args, **kwargs)

    first = ledger.harness(Agent("shop", ScriptedModel(["Hello."])), owner="worker-a")
    second = ledger.harness(Agent("shop", ScriptedModel(["Hello."])), owner="worker-b")

    async def scenario() -> None:
        gates.update(entered=asyncio.Event(), go_on=asyncio.Event())
        thread = await first.create_thread()
        monkeypatch.setattr(ThreadLog, "start_turn_async", slow_start)
        sending = asyncio.create_task(thread.send("hi"))
        await gates["entered"].wait()
        shutting = asyncio.create_task(first.shutdown(drain_timeout=5))
        await asyncio.sleep(0.05)
        assert not shutting.done(), "the shutdown waits for the turn's start"
        gates["go_on"].set()
        turn_id = await sending
        await shutting
        monkeypatch.setattr(ThreadLog, "start_turn_async", original)
        store = ledger.store()
        lease = store.get_lease(f"thread/{thread.thread_id}/turn")
        assert lease is not None and lease.released and lease.owner == "worker-a"
        events = store.read(thread.stream)
        assert [e.type for e in events][-1] == "turn.started" and events[-1].data["turn_id"] == turn_id
        continued = await second.open_thread(thread.thread_id)
        state = await continued.wait()
        assert (state.status, state.last_reply) == ("idle", "Hello.")

    run(scenario())


def test_a_loop_cut_off_while_recording_its_claim_gives_the_lease_back(tmp_path: Any) -> None:
    """The shutdown's deadline cancels a turn's loop while its ``turn.claimed`` is being committed (a slow disk):
    the claim is recorded, and its lease must be given back, so another process continues the turn at once.
    Left held, it would expire and look like a crashed owner's, for an operator to recover."""
    from jixu import Harness
    from jixu.kernel.commits import Commits
    from jixu.scheduling import create_thread_for, submit_turn
    from tests.helpers import CommitHeld

    store = CommitHeld(tmp_path / "ledger.db", "turn.claimed")
    agent = Agent("shop", ScriptedModel(["Hello."]))
    thread_id = create_thread_for(store, agent)
    submit_turn(store, thread_id, "hi")  # a queued turn: unowned, for whoever opens the thread
    key = f"thread/{thread_id}/turn"

    async def scenario() -> None:
        first = Harness(agent, store, owner="worker-a")
        # Another user of the loop's commits, busy elsewhere (a second turn awaiting its model): the claim is
        # committed in the commit thread while the loop awaits it, not at once in the loop.
        with Commits.of(store).user():
            await first.open_thread(thread_id)
            while not store.entered.is_set():
                await asyncio.sleep(0.01)
            asyncio.get_running_loop().call_later(0.5, store.release.set)
            await first.shutdown(drain_timeout=0.2)  # its deadline cuts the loop off in the claim's commit
        lease = store.get_lease(key)
        assert lease is not None and lease.owner == "worker-a" and lease.released, lease
        assert [e.type for e in store.read(f"thread/{thread_id}")][-1] == "turn.claimed"
        second = Harness(agent, store, owner="worker-b")
        state = await (await second.open_thread(thread_id)).wait()
        assert (state.status, state.last_reply) == ("idle", "Hello."), state

    run(scenario())
    store.close()


def test_a_turn_whose_claim_was_given_back_is_not_offered_for_recovery(tmp_path: Path) -> None:
    """Found by an audit: the Studio offered every waiting thread's recovery ("held by an owner that is gone") once
    the claim its loop gave back had passed its expiry, though nobody held it and `jixu turns list --expired` listed
    nothing; the operator's resolution alone continues such a turn."""
    from jixu import Harness

    @tool(semantics="unsafe")
    async def charge() -> str:
        """Charge (its answer is lost: the outcome stays unknown)."""
        raise ConnectionResetError("the gateway hung up")

    async def main() -> tuple[dict[str, Any], str | None]:
        async with Harness(Agent("lost", ScriptedModel([ToolCall("charge"), "done"]), tools=[charge]),
                           f"sqlite:///{tmp_path / 'given-back.db'}", lease_ttl=0.3) as harness:
            thread = await harness.create_thread()
            await thread.send("charge")
            assert (await thread.wait()).status == "waiting"
            await asyncio.sleep(0.5)  # past the claim's expiry
            log = ThreadLog.load(harness.store, thread.thread_id)
            ownership = log.ownership()
            assert ownership is not None
            return ownership, log.recovery_reason(ownership)

    ownership, reason = asyncio.run(main())
    assert ownership["released"] and ownership["expired"], ownership
    assert reason is None
