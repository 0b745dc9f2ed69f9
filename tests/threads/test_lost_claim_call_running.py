"""A turn whose claim lapsed while a plain ``def`` tool still runs in its worker thread keeps the claim until
that call ended (decision 0058: a call in a thread is in flight; it cannot be stopped).

Seen by an audit with real workers: a worker stopped (SIGSTOP) past its lease while its unsafe ``def`` tool ran;
on waking, its heartbeat found the claim lost, the loop stopped, and its ``finally`` gave the lapsed claim back.
A released claim is nobody's: the thread showed "waiting for an operator", an operator's ``not_occurred`` was
accepted, the model was told the call did not happen, and the charge landed 8 s later. Here the lapse is made
by moving the lease's expiry into the past, as a stall past it leaves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jixu import Agent, Harness, ScriptedModel, ToolCall, ToolContext, tool
from jixu.errors import OwnershipLost
from jixu.ledger import SQLiteStore
from tests.attacker import Raw
from tests.helpers import run_jixu
from tests.tamper_cases import run


def test_a_lapsed_claim_is_kept_until_the_call_in_its_thread_ended(tmp_path: Path) -> None:
    path = tmp_path / "lapsed.db"
    started, let_go = threading.Event(), threading.Event()
    charged: list[str] = []

    @tool(semantics="unsafe")
    def charge(order: str) -> str:
        """Charge an order (a plain def: it runs in a worker thread)."""
        started.set()
        assert let_go.wait(20)
        charged.append(order)
        return "charged"

    def script(messages: list[dict[str, Any]]) -> str | ToolCall:
        return ToolCall("charge", {"order": "7"}) if messages[-1].get("role") == "user" else "done"

    async def scenario() -> None:
        with SQLiteStore(path) as store:
            harness = Harness(Agent("lapse", ScriptedModel(script), tools=[charge]), store, owner="worker-a",
                              lease_ttl=0.6)
            thread = await harness.create_thread()
            await thread.send("charge order 7")
            assert await asyncio.to_thread(started.wait, 10)
            key = thread.log.turn_key
            with Raw(path).transaction() as sql:  # the worker stalled past its lease
                sql("UPDATE jixu_leases SET expires_at = expires_at - 100 WHERE key = ?", key)
            with pytest.raises(OwnershipLost):
                await thread.wait()
            lease = store.get_lease(key)
            assert lease is not None and not lease.released  # kept: the call still runs here
            [effect_id] = [e.data["effect_id"] for e in store.read(thread.log.stream) if e.type == "tool.dispatched"]

            refused = await asyncio.to_thread(run_jixu, "threads", "resolve", str(path), thread.thread_id, effect_id,
                                              "--resolution", "not_occurred", "--note", "no charge found",
                                              own_process=True)
            assert refused.returncode != 0 and "turn_owned" in refused.stdout + refused.stderr, refused
            assert charged == []
            assert [e.type for e in store.read(thread.log.stream)][-1] == "tool.dispatched"  # nothing settled it
            let_go.set()
            deadline = time.monotonic() + 10
            while not (lease := store.get_lease(key)) or not lease.released:  # given back once the call ended
                assert time.monotonic() < deadline, "the claim was not given back after the call ended"
                await asyncio.sleep(0.05)
            assert charged == ["7"]

    run(scenario)



def test_a_claim_taken_again_here_is_not_given_back_when_the_earlier_call_ends(tmp_path: Path) -> None:
    """Seen by an audit: a turn interrupted while its read-only ``def`` call ran left its claim held for that
    call; the next turn, sent at once, got the same epoch back, and when the earlier call ended its give-back
    released the new turn's claim mid-turn (its next append was fenced out: OwnershipLost)."""
    path = tmp_path / "again.db"
    started = threading.Event()

    @tool(semantics="read_only")
    def lookup(order: str) -> str:
        """Look an order up: the first takes 1 s, the second 2 s."""
        started.set()
        time.sleep(1.0 if order == "1" else 2.0)
        return f"order {order}: paid"

    def script(messages: list[dict[str, Any]]) -> str | ToolCall:
        last = messages[-1]
        if last.get("role") == "user":
            return ToolCall("lookup", {"order": "1" if "first" in str(last.get("content")) else "2"})
        return "done"

    async def scenario() -> None:
        with SQLiteStore(path) as store:
            harness = Harness(Agent("again", ScriptedModel(script), tools=[lookup]), store, owner="svc", lease_ttl=20)
            thread = await harness.create_thread()
            await thread.send("first")
            assert await asyncio.to_thread(started.wait, 5)
            await thread.interrupt("stop the first turn")
            lease = store.get_lease(thread.log.turn_key)
            assert lease is not None and not lease.released  # held: the first call still runs here
            await thread.send("second")
            state = await thread.wait()  # the first call ends meanwhile
            assert state.status == "idle", state.reason
            assert [e.data.get("outcome") for e in store.read(thread.log.stream) if e.type == "turn.ended"] == [
                "interrupted", "completed"]

    run(scenario)


@pytest.mark.parametrize("relative", [False, True], ids=["absolute", "relative-then-chdir"])
def test_a_claim_held_for_a_call_is_given_back_when_it_ends_after_the_loop_and_the_store_closed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, relative: bool) -> None:
    """Seen by an audit: a harness shut down (its drain cut a ``def`` call off) and closed, in a process that goes
    on (a service, a notebook): the claim held for the call was never given back, and another process could
    neither settle the call nor start a turn on the thread for as long as this one ran. Then, seen by the next
    audit: a store opened by a relative path, and the process changed directory meanwhile: the give-back opened
    the wrong file (the same with a PostgreSQL URL whose password its ``url`` shows masked)."""
    path = tmp_path / "loop-ended.db"
    if relative:
        monkeypatch.chdir(tmp_path)
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
    started = threading.Event()
    ids: dict[str, str] = {}

    @tool(semantics="unsafe")
    def charge(order: str) -> str:
        """Charge an order (a plain def taking 1.5 s)."""
        started.set()
        time.sleep(1.5)
        return "charged"

    def script(messages: list[dict[str, Any]]) -> str | ToolCall:
        return ToolCall("charge", {"order": "7"}) if messages[-1].get("role") == "user" else "done"

    async def job() -> None:
        store = SQLiteStore(path.name if relative else path)
        harness = Harness(Agent("ended", ScriptedModel(script), tools=[charge]), store, owner="svc", lease_ttl=30)
        thread = await harness.create_thread()
        ids["thread"] = thread.thread_id
        await thread.send("charge 7")
        assert await asyncio.to_thread(started.wait, 5)
        await harness.shutdown(drain_timeout=0.2)  # the call is cut off: it goes on in its thread
        with SQLiteStore(path) as look:
            lease = look.get_lease(f"thread/{thread.thread_id}/turn")
            assert lease is not None and not lease.released  # held while the call runs
        harness.close()
        store.close()
        if relative:
            monkeypatch.chdir(elsewhere)

    run(job)
    deadline = time.monotonic() + 10
    with SQLiteStore(path) as store:
        while not (lease := store.get_lease(f"thread/{ids['thread']}/turn")) or not lease.released:
            assert time.monotonic() < deadline, "the claim was never given back"
            time.sleep(0.05)


@pytest.mark.parametrize("taken_meanwhile", [False, True], ids=["nobody-else", "claimed-by-another"])
def test_a_receipt_the_lost_claim_could_not_record_is_recorded_by_the_next_claim_only_if_nobody_claimed_between(
        tmp_path: Path, taken_meanwhile: bool) -> None:
    """Decision 0070. The loop is held past the lease while an unsafe call runs: its receipt is refused (the fence
    is stale). Claimed again by the same harness at the next epoch, the turn records it (the call is completed, the
    turn goes on); when another owner claimed the turn in between (its lease row moved on), the receipt is
    dropped and the call stays unknown, for an operator."""
    ran: list[str] = []

    @tool(semantics="unsafe")
    async def charge(ctx: ToolContext) -> str:
        """Charge once (the loop is held meanwhile: nothing renews the claim)."""
        ran.append(ctx.effect_id)
        time.sleep(1.2)  # a blocking stretch in an async tool: the claim (0.4 s) lapses
        return "charged"

    agent = Agent("held", ScriptedModel([ToolCall("charge"), "done"]), tools=[charge])
    path = tmp_path / "held.db"

    async def main() -> tuple[str, str | None]:
        async with Harness(agent, f"sqlite:///{path}", owner="holder", lease_ttl=0.4) as harness:
            thread = await harness.create_thread()
            await thread.send("charge it")
            with pytest.raises(OwnershipLost):
                await thread.wait()
            assert harness.held_receipts, "the refused receipt is held"
            if taken_meanwhile:  # another process's claim, as it would be written (then it gave up)
                with Raw(path).transaction() as sql:
                    sql("UPDATE jixu_leases SET owner = 'other', epoch = epoch + 1, released = 1 WHERE key = ?",
                        f"thread/{thread.thread_id}/turn")
            again = await harness.open_thread(thread.thread_id)
            state = await again.wait()
            return state.status, state.last_reply

    status, reply = asyncio.run(main())
    assert len(ran) == 1, "the call ran once"
    assert (status, reply) == (("waiting", None) if taken_meanwhile else ("idle", "done"))



@pytest.mark.parametrize("meanwhile", ["another_event", "turn_ended"])
def test_held_receipts_go_with_their_claim_event_or_not_at_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             meanwhile: str) -> None:
    """Found by a review: when another writer appended just before the claim's append, the writer's conflict path
    recorded the held receipt on its own (before ``turn.claimed``, or after an operator's ``turn.ended``, under a
    claim never recorded). Receipts appended with a claim stand on it: after the conflict the claim is decided
    again, with them (the turn still active) or without them (the turn ended)."""
    import jixu.threads.thread as thread_module
    from jixu.ledger import NewEvent

    @tool(semantics="unsafe")
    async def charge(ctx: ToolContext) -> str:
        """Charge once (the loop is held meanwhile: nothing renews the claim)."""
        time.sleep(1.2)
        return "charged"

    agent = Agent("held", ScriptedModel([ToolCall("charge"), "done"]), tools=[charge])
    path = tmp_path / "held.db"
    real_claim_stream = thread_module.claim_stream
    injected: list[str] = []

    async def racing_claim_stream(writer: Any, key: str, owner: str, ttl: float, claimed: Any, **options: Any) -> Any:
        def claimed_after_another_writer(claim: Any) -> Any:
            events = claimed(claim)
            if not injected:  # another connection appends between the claim's look and its append
                with SQLiteStore(path) as other:
                    head = other.read(writer.stream)[-1].seq
                    turn = writer.state.active_turn()
                    event = (NewEvent("turn.ended", {"turn_id": turn.turn_id, "outcome": "interrupted",
                                                     "reason": "an operator"}, {"actor": "operator"})
                             if meanwhile == "turn_ended" else NewEvent("agent.noted", {}, {"actor": "operator"}))
                    other.append(writer.stream, [event], head)
                injected.append(event.type)
            return events

        return await real_claim_stream(writer, key, owner, ttl, claimed_after_another_writer, **options)

    async def main() -> list[str]:
        async with Harness(agent, f"sqlite:///{path}", owner="holder", lease_ttl=0.4) as harness:
            thread = await harness.create_thread()
            await thread.send("charge it")
            with pytest.raises(OwnershipLost):
                await thread.wait()
            monkeypatch.setattr(thread_module, "claim_stream", racing_claim_stream)
            again = await harness.open_thread(thread.thread_id)
            with contextlib.suppress(Exception):
                await again.wait()
            return [e.type for e in await again.events()]

    types = asyncio.run(main())
    assert injected, "the other writer's event went in"
    if meanwhile == "turn_ended":
        assert "tool.completed" not in types, types  # the turn ended before: nothing recorded for it after
    else:
        assert types.index("tool.completed") == types.index("turn.claimed", types.index("agent.noted")) + 1, types


def test_a_durable_run_records_its_lost_claims_receipt_when_it_is_entered_again(tmp_path: Path) -> None:
    """Decision 0070 for durable runs (found by a review: only agent turns held them). A step's call holds the
    loop past the lease: its receipt is refused and the block ends with ``OwnershipLost``. Entered again through
    the same harness (nobody claimed the run in between), the step returns the recorded result without running
    again and the run ends, instead of waiting for an operator."""
    ran: list[str] = []

    async def charge(ctx: ToolContext) -> str:
        ran.append(ctx.effect_id)
        time.sleep(1.2)  # a blocking stretch in an async call: the claim (0.4 s) lapses
        return "charged"

    async def main() -> tuple[Any, str, list[str]]:
        async with Harness(Agent("held", ScriptedModel(["done"])), f"sqlite:///{tmp_path / 'held.db'}",
                           owner="holder", lease_ttl=0.4) as harness:
            thread = await harness.create_thread()
            with pytest.raises(OwnershipLost):
                async with harness.durable(thread.thread_id) as first:
                    await first.effect("charge", {"order": 7}, call=charge)
            assert harness.held_receipts, "the refused receipt is held"
            async with harness.durable(thread.thread_id) as again:
                result = await again.effect("charge", {"order": 7}, call=charge)
            events = [e.type for e in harness.store.read(thread.log.stream)]
            return result, again.outcome or "", events

    result, ended, events = asyncio.run(main())
    assert len(ran) == 1, "the call ran once"
    assert result == "charged" and ended == "completed", (result, ended)
    assert events.index("turn.claimed") < events.index("tool.completed"), events  # under the new claim
