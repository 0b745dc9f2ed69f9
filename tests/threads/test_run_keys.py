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
from jixu import (
    InvalidInput,
    StepFailed,
    StepMismatch,
    StepOutcomeUnknown,
    ThreadBusy,
    ToolContext,
    ToolError,
)
from jixu.ledger import SQLiteStore, Store
from jixu.threads.log import ThreadLog
from jixu.threads.steps import steps_agent


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
    assert calls == ["charge", "read"] and not first.finished and first.outcome == "completed"
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
    assert results == ({"charged": 7, "call": 1}, None) and first.outcome == "failed"
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


def test_two_entries_of_one_process_at_once_refuse_the_second_and_leave_the_first_its_claim(tmp_path: Path) -> None:
    """Both entries have the harness's owner, so the lease gives both the same epoch: the second used to start,
    fail, and give that shared claim back, and the first run's receipts were refused (its step left unknown)."""
    calls: list[str] = []

    async def entry(harness: jixu.Harness, thread_id: str) -> str:
        try:
            async with harness.durable(thread_id, name="job", run_key="K") as durable_run:
                await durable_run.effect("s0", {}, call=lambda ctx: calls.append("s0") or "r0")
                await asyncio.sleep(0.2)
                await durable_run.effect("s1", {}, call=lambda ctx: calls.append("s1") or "r1")
            return "ok"
        except ThreadBusy as error:
            return f"busy: {error.message}"

    async def go() -> list[str]:
        async with jixu.Harness(steps_agent(), f"sqlite:///{tmp_path / 'j.db'}") as harness:
            thread = await harness.create_thread()
            outcomes = await asyncio.gather(entry(harness, thread.thread_id), entry(harness, thread.thread_id))
            state = (await harness.open_thread(thread.thread_id, resume=False)).state()
            assert [(t["status"], t["run_key"]) for t in state.turns] == [("completed", "K")]
            return sorted(outcomes)

    busy, ok = run(go())
    assert ok == "ok" and busy.startswith("busy: ") and "in this process" in busy
    assert calls == ["s0", "s1"]


def test_a_step_an_interrupted_keyed_run_left_unknown_is_unknown_on_replay_even_with_a_probe(tmp_path: Path) -> None:
    """The replay of an ended run asks no probe; such a step used to be a StepMismatch advising a new run (which
    would repeat it). It is StepOutcomeUnknown, which an operator's resolution then settles for the next replay."""
    store, calls = SQLiteStore(tmp_path / "j.db"), []

    def never_found(query: jixu.ProbeQuery) -> jixu.NotOccurred:
        raise AssertionError("a replay asks no probe")

    async def cut_off() -> str:
        async with jixu.durable(store, None, name="job", run_key="K") as durable_run:
            thread_id = durable_run.thread_id
            await durable_run.effect("s0", {}, call=lambda ctx: calls.append("s0") or "r0")
            step = asyncio.ensure_future(durable_run.effect("s1", {}, call=_blocked(calls), probe=never_found))
            while "s1" not in calls:
                await asyncio.sleep(0.01)
            step.cancel()  # the process stops while s1 is in flight: its outcome is unknown
            with pytest.raises(asyncio.CancelledError):
                await step
            raise RuntimeError("stopped")
        return thread_id  # pragma: no cover - the block raised

    with pytest.raises(RuntimeError):
        run(cut_off())
    [stream] = store.list_streams("thread/")
    thread_id = stream.stream.split("/", 1)[1]
    log = ThreadLog.load(store, thread_id)
    assert log.end_running_turn("an operator stopped it")
    before = events(store, thread_id)

    async def replay() -> None:
        async with jixu.durable(store, thread_id, name="job", run_key="K") as durable_run:
            assert durable_run.finished and durable_run.outcome == "interrupted"
            assert await durable_run.effect("s0", {}, call=lambda ctx: calls.append("again")) == "r0"
            await durable_run.effect("s1", {}, call=lambda ctx: calls.append("again"), probe=never_found)

    with pytest.raises(StepOutcomeUnknown):
        run(replay())
    assert calls == ["s0", "s1"] and events(store, thread_id) == before


def _blocked(calls: list[str]) -> Any:
    async def call(ctx: ToolContext) -> str:
        calls.append("s1")
        await asyncio.sleep(60)
        return "r1"

    return call


def test_a_replay_stops_at_shutdown_and_a_key_json_cannot_hold_is_refused_before_anything(tmp_path: Path) -> None:
    store, calls = SQLiteStore(tmp_path / "j.db"), []
    first, _ = run(order(store, None, calls, run_key="order-7"))

    async def across_shutdown() -> None:
        harness = jixu.Harness(steps_agent(), store)
        async with harness.durable(first.thread_id, name="order", run_key="order-7") as durable_run:
            await harness.shutdown(1)
            await durable_run.effect("charge", {"order": 7}, call=lambda ctx: calls.append("charge"))

    with pytest.raises(ThreadBusy, match="shutting down"):
        run(across_shutdown())
    streams = len(SQLiteStore(tmp_path / "j.db").list_streams("thread/"))
    with pytest.raises(InvalidInput):
        jixu.durable(tmp_path / "j.db", None, run_key="order-\ud800")
    assert len(SQLiteStore(tmp_path / "j.db").list_streams("thread/")) == streams and calls == ["charge", "read"]


def test_a_keyed_run_a_fork_inherited_is_refused_there_naming_the_parent_and_nothing_runs(tmp_path: Path) -> None:
    """The inherited run's events are in the parent's stream: the child once read its own stream at the parent's
    event numbers (a StepMismatch on a step that had run), or refused the key for good (forked mid-run)."""
    store, calls = SQLiteStore(tmp_path / "j.db"), []
    first, _ = run(order(store, None, calls, run_key="order-7"))

    async def fork_and_enter() -> tuple[str, list[tuple[str, int]]]:
        harness = jixu.Harness(steps_agent(), store)
        parent = await harness.open_thread(first.thread_id, resume=False)
        last = (await parent.events())[-1]
        child = await parent.fork(at=last.id)
        before = events(store, child.thread_id)
        with pytest.raises(StepMismatch) as raised:
            await order(store, child.thread_id, calls, run_key="order-7")
        assert raised.value.details["parent_thread_id"] == first.thread_id
        return child.thread_id, before

    child_id, before = run(fork_and_enter())
    assert events(store, child_id) == before and calls == ["charge", "read"]
    assert [t["inherited"] for t in ThreadLog.load(store, child_id).snapshot().turns] == [True]
