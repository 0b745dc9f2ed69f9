"""A durable run's key (decision 0051): once the keyed run has ended, code entering with its key again replays
the record and carries out nothing, so code that crashed after its run ended, before it learnt so, repeats no
step. Without a key, entering after the end starts the thread's next run (the documented default).

A real SIGKILL right after ``turn.ended`` is committed is in test_steps_crash.py.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import jixu
from jixu import InvalidInput, StepFailed, StepMismatch, ThreadBusy, ToolContext, ToolError
from jixu.ledger import SQLiteStore, Store
from jixu.threads.log import ThreadLog


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def events(store: Store, thread_id: str) -> list[tuple[str, int]]:
    return [(e.type, e.seq) for e in ThreadLog.load(store, thread_id).events()]


async def order(store: Store, thread_id: str | None, calls: list[str], *, run_key: str | None,
                name: str = "order", fail: bool = False) -> tuple[jixu.DurableRun, Any]:
    """The user's loop: an unsafe charge, then a read; every real call is counted in ``calls``."""

    def charge(ctx: ToolContext) -> dict[str, Any]:
        calls.append("charge")
        return {"charged": 7, "call": len(calls)}

    def read(ctx: ToolContext) -> str:
        calls.append("read")
        if fail:
            raise ToolError("the ledger said no")
        return "read"

    async with jixu.durable(store, thread_id, name=name, run_key=run_key) as durable_run:
        charged = await durable_run.effect("charge", {"order": 7}, semantics="unsafe", call=charge)
        try:
            read_back = await durable_run.effect("read", {"order": 7}, semantics="read_only", call=read)
        except StepFailed as error:
            durable_run.error = {"type": "StepFailed", "message": error.message}
            read_back = None
    return durable_run, (charged, read_back)


def test_an_ended_keyed_run_entered_again_replays_its_record_and_runs_nothing(tmp_path: Path) -> None:
    store, calls = SQLiteStore(tmp_path / "j.db"), []
    first, results = run(order(store, None, calls, run_key="order-7"))
    assert calls == ["charge", "read"] and not first.finished and first.outcome is None
    before = events(store, first.thread_id)

    again, replayed = run(order(store, first.thread_id, calls, run_key="order-7"))

    assert again.finished and again.outcome == "completed" and again.turn_id == first.turn_id
    assert replayed == results == ({"charged": 7, "call": 1}, "read")
    assert calls == ["charge", "read"], "no step ran again"
    assert events(store, first.thread_id) == before, "nothing was appended"
    [turn] = ThreadLog.load(store, first.thread_id).snapshot().turns
    assert turn["run_key"] == "order-7" and turn["status"] == "completed"


def test_without_a_key_entering_after_the_end_starts_the_next_run(tmp_path: Path) -> None:
    store, calls = SQLiteStore(tmp_path / "j.db"), []
    first, _ = run(order(store, None, calls, run_key=None))
    second, _ = run(order(store, first.thread_id, calls, run_key=None))
    assert not second.finished and second.turn_id != first.turn_id
    assert calls == ["charge", "read", "charge", "read"]


def test_a_new_key_starts_a_new_run_and_each_key_replays_its_own(tmp_path: Path) -> None:
    store, calls = SQLiteStore(tmp_path / "j.db"), []
    first, one = run(order(store, None, calls, run_key="order-7"))
    second, two = run(order(store, first.thread_id, calls, run_key="order-8"))
    assert not second.finished and one != two and calls.count("charge") == 2
    _, one_again = run(order(store, first.thread_id, calls, run_key="order-7"))
    _, two_again = run(order(store, first.thread_id, calls, run_key="order-8"))
    assert (one_again, two_again) == (one, two) and calls.count("charge") == 2


def test_a_failed_keyed_run_replays_its_failure_without_calling_again(tmp_path: Path) -> None:
    store, calls = SQLiteStore(tmp_path / "j.db"), []
    first, results = run(order(store, None, calls, run_key="order-7", fail=True))
    assert results == ({"charged": 7, "call": 1}, None)
    again, replayed = run(order(store, first.thread_id, calls, run_key="order-7", fail=True))
    assert again.finished and again.outcome == "failed" and replayed == results
    assert calls == ["charge", "read"]


def test_a_step_the_ended_run_did_not_record_is_a_mismatch_and_writes_nothing(tmp_path: Path) -> None:
    store, calls = SQLiteStore(tmp_path / "j.db"), []
    first, _ = run(order(store, None, calls, run_key="order-7"))
    before = events(store, first.thread_id)

    async def changed_code() -> None:
        async with jixu.durable(store, first.thread_id, name="order", run_key="order-7") as durable_run:
            await durable_run.effect("charge", {"order": 7}, call=lambda ctx: calls.append("charge"))
            await durable_run.effect("ship", {"order": 7}, call=lambda ctx: calls.append("ship"))

    with pytest.raises(StepMismatch) as raised:
        run(changed_code())
    assert raised.value.details["step"] == "ship#1" and "order-7" in raised.value.message

    async def other_args() -> None:
        async with jixu.durable(store, first.thread_id, name="order", run_key="order-7") as durable_run:
            await durable_run.effect("charge", {"order": 8}, call=lambda ctx: calls.append("charge"))

    with pytest.raises(StepMismatch):
        run(other_args())
    with pytest.raises(StepMismatch):  # the key names the run "order"
        run(order(store, first.thread_id, calls, run_key="order-7", name="refund"))
    assert calls == ["charge", "read"] and events(store, first.thread_id) == before


def test_an_unfinished_run_under_another_key_is_refused_and_continued_by_its_own(tmp_path: Path) -> None:
    store, calls = SQLiteStore(tmp_path / "j.db"), []

    async def crashed() -> str:
        with pytest.raises(RuntimeError):
            async with jixu.durable(store, None, name="order", run_key="order-7") as durable_run:
                await durable_run.effect("charge", {"order": 7}, call=lambda ctx: calls.append("charge") or 1)
                raise RuntimeError("the process stops here")
        return durable_run.thread_id

    thread_id = run(crashed())
    before = events(store, thread_id)
    with pytest.raises(ThreadBusy) as raised:
        run(order(store, thread_id, calls, run_key="order-8"))
    assert "order-7" in raised.value.message
    assert events(store, thread_id) == before and calls == ["charge"]

    async def continued() -> jixu.DurableRun:
        async with jixu.durable(store, thread_id, name="order", run_key="order-7") as durable_run:
            assert await durable_run.effect("charge", {"order": 7}, call=lambda ctx: calls.append("x")) == 1
        return durable_run

    assert not run(continued()).finished and calls == ["charge"]


@pytest.mark.parametrize("bad", ["", "   ", "k" * 201, 7])
def test_a_bad_run_key_is_refused_before_anything_is_opened(tmp_path: Path, bad: Any) -> None:
    store = SQLiteStore(tmp_path / "j.db")
    with pytest.raises(InvalidInput) as raised:
        jixu.durable(store, None, run_key=bad)
    assert raised.value.details["field"] == "run_key"
    assert list(store.list_streams("thread/")) == []


def test_a_keyed_start_decided_on_stale_events_is_refused_once_the_keyed_run_is_seen(tmp_path: Path) -> None:
    """Two processes entering with one key: the one whose view predates the other's run must not start a second
    run under the key. Its start is appended after the other's events, and decided again on them."""
    path, calls = tmp_path / "j.db", []
    mine, theirs = SQLiteStore(path), SQLiteStore(path)

    async def go() -> None:
        first, _ = await order(mine, None, calls, run_key=None)  # the thread, with one unkeyed run
        stale = ThreadLog.load(theirs, first.thread_id)  # this process's view, before the keyed run
        await order(mine, first.thread_id, calls, run_key="order-7")
        with pytest.raises(ThreadBusy) as raised:
            await stale.start_turn_async("order", owner="them", steps=True, run_key="order-7")
        assert raised.value.details["run_key"] == "order-7"
        assert [t.run_key for t in stale.state.turns] == [None, "order-7"]

        assert [t for t, _ in events(mine, first.thread_id)].count("turn.started") == 2, "no third run started"
        lease = theirs.get_lease(stale.turn_key)
        assert lease is not None and lease.released, "the claim taken for the refused start was given back"

    run(go())
    assert calls == ["charge", "read", "charge", "read"]
