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
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
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

