"""A break another process found and recorded stops every record of the stream held open here (issue 22).

A thread handle, a durable run or a run journal read before the tampering acts
on the state it established; once another process (``jixu verify``, another
server) has found the break and recorded it in the store, the stream is known
to be broken, and nothing held open here may act on it any more: the next
operation, agent step or durable step reads the recorded break (one row) and
refuses, with nothing appended and no tool called. An operation reads it at once; a loop's step asks this
process's watch, which reads every stream's at once, at most every ``BREAK_WATCH_INTERVAL_S`` (decision 0066).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import jixu
from jixu import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.errors import RunCorrupt, StoreError, ThreadCorrupt
from jixu.kernel.writer import BREAK_WATCH_INTERVAL_S
from jixu.ledger import SQLiteStore
from jixu.ledger.trust import verdict
from jixu.runs.journal import RunLog
from jixu.threads.log import ThreadLog
from tests.attacker import Raw, flip_data_byte
from tests.tamper_cases import TOOL_CALLS, agent, run, run_fixture


def _found_elsewhere(path: Path, stream: str) -> None:
    """What ``jixu verify`` in another process does: verify on a connection of its own and record the break."""
    with SQLiteStore(path) as other:
        report = verdict(other, stream)
    assert not report.valid and report.first_bad_seq == 5


async def _two_lookups(store: SQLiteStore, owner: str) -> Any:
    """A thread of the tamper agent held open here, after two finished turns."""
    thread = await Harness(agent(), store, owner=owner).create_thread()
    for text in ("look up 41", "look up 42"):
        await thread.send(text)
        await thread.wait()
    return thread


def test_a_handle_held_open_refuses_to_send_once_a_break_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "held.db"

    async def scenario() -> None:
        with SQLiteStore(path) as store:
            thread = await _two_lookups(store, "long-lived")
            stream = f"thread/{thread.thread_id}"
            flip_data_byte(Raw(path), stream, 5)
            _found_elsewhere(path, stream)
            head = Raw(path).head(stream)
            TOOL_CALLS.clear()
            with pytest.raises(ThreadCorrupt) as refused:
                await thread.send("refund 7")
            assert refused.value.details["first_bad_seq"] == 5
            assert TOOL_CALLS == []
            assert Raw(path).head(stream) == head
            assert thread.state().status == "corrupt"

    run(scenario)


def test_a_running_turn_takes_no_further_step_once_a_break_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "running.db"
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    @tool(semantics="read_only")
    def slow_lookup(order: str) -> str:
        """Look an order up (waits until the test lets it go)."""
        calls.append(f"slow_lookup {order}")
        started.set()
        assert release.wait(10)
        return f"order {order}: paid"

    @tool(semantics="unsafe")
    def refund(order: str) -> str:
        """Refund an order."""
        calls.append(f"refund {order}")
        return "refunded"

    def script(messages: list[dict[str, Any]]) -> str | ToolCall:
        tool_results = [m for m in messages if m.get("role") == "tool"]
        if not tool_results:
            return ToolCall("slow_lookup", {"order": "7"})
        if len(tool_results) == 1:
            return ToolCall("refund", {"order": "7"})
        return "done"

    async def scenario() -> None:
        with SQLiteStore(path) as store:
            harness = Harness(Agent("heed", ScriptedModel(script), tools=[slow_lookup, refund]), store)
            thread = await harness.create_thread()
            await thread.send("refund order 7 if it is paid")
            assert await asyncio.to_thread(started.wait, 10)
            stream = f"thread/{thread.thread_id}"
            flip_data_byte(Raw(path), stream, 5)  # an event of this turn, before the call running now
            await asyncio.to_thread(_found_elsewhere, path, stream)
            await asyncio.sleep(BREAK_WATCH_INTERVAL_S + 0.1)  # a loop's step knows of it at most this late
            release.set()
            state = await thread.wait()
            assert calls == ["slow_lookup 7"]  # the next step (the unsafe refund) never ran
            assert state.status == "corrupt"

    run(scenario)


def test_a_durable_run_takes_no_further_step_once_a_break_is_recorded(tmp_path: Path) -> None:
    path = tmp_path / "steps.db"
    charged: list[int] = []

    async def scenario() -> None:
        with pytest.raises(ThreadCorrupt):
            async with jixu.durable(f"sqlite:///{path}", None, name="order-7") as durable_run:
                await durable_run.effect("reserve", {"order": 7}, semantics="idempotent",
                                         call=lambda ctx: "reserved")
                stream = f"thread/{durable_run.thread_id}"
                flip_data_byte(Raw(path), stream, 3)
                with SQLiteStore(path) as other:
                    assert not verdict(other, stream).valid
                await asyncio.sleep(BREAK_WATCH_INTERVAL_S + 0.1)  # a step knows of it at most this late
                head = Raw(path).head(stream)
                try:
                    await durable_run.effect("charge", {"order": 7}, semantics="unsafe",
                                             call=lambda ctx: charged.append(1) or "charged")
                finally:
                    assert charged == []
                    assert Raw(path).head(stream) == head

    run(scenario)


def test_a_run_journal_held_open_refuses_once_a_break_is_recorded(tmp_path: Path) -> None:
    path, fixture = run_fixture(tmp_path)
    with SQLiteStore(path) as store:
        journal = RunLog(store, fixture["failed_check_run"])
        journal.open_to_act()  # sound when read
        stream = journal.stream
        flip_data_byte(Raw(path), stream, 3)
        with SQLiteStore(path) as other:
            report = verdict(other, stream)
        assert not report.valid
        with pytest.raises(RunCorrupt) as refused:
            journal.open_to_act()
        assert refused.value.details["first_bad_seq"] == report.first_bad_seq


def test_a_run_being_executed_dispatches_no_further_task_once_a_break_is_recorded(tmp_path: Path) -> None:
    """The run's first implement step changes an event of the journal and records the break, as another
    process would while this one executes the run: the verification (the next task) is never dispatched."""
    from jixu.runs import ImplementContext, ImplementResult, Runs, ScriptedProvider
    from jixu.runs.model import run_stream
    from tests.runs.run_helpers import fix, make_origin, register
    from tests.runs.run_helpers import run as run_coroutine

    path = tmp_path / "runs.db"
    store = SQLiteStore(path)
    found: list[int | None] = []

    def fix_then_break_found_elsewhere(workspace: Path, context: ImplementContext) -> ImplementResult:
        stream = run_stream(context.run_id)
        flip_data_byte(Raw(path), stream, 3)
        with SQLiteStore(path) as other:
            found.append(verdict(other, stream).first_bad_seq)
        time.sleep(BREAK_WATCH_INTERVAL_S + 0.1)  # the run's next task knows of it at most this late
        return fix(workspace, context)

    try:
        register(store, make_origin(tmp_path))
        runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix_then_break_found_elsewhere])},
                    owner="worker-1")

        async def scenario() -> None:
            run_id = await runs.create_run("calc", "fix add()", provider="scripted")
            try:
                state = await runs.execute(run_id)
            except RunCorrupt as refused:
                assert refused.details["first_bad_seq"] == found[0] == 3
            else:
                assert state.status == "corrupt", state.reason
            events = store.read(run_stream(run_id))
            assert [e.data.get("name") for e in events if e.type == "task.requested"] == ["prepare", "implement"]
            assert [e.type for e in events[-1:]] == ["task.completed"]  # the implement's receipt, then nothing

        run_coroutine(scenario())
    finally:
        store.close()


def test_a_handle_held_open_forks_nothing_at_or_after_a_recorded_break(tmp_path: Path) -> None:
    """Seen by an audit: ``fork`` on a handle held open forked at an event after the break another process had
    recorded (a fresh handle refuses), and the child's turn ran the unsafe refund."""
    path = tmp_path / "fork.db"

    async def scenario() -> None:
        with SQLiteStore(path) as store:
            thread = await _two_lookups(store, "held")
            stream = f"thread/{thread.thread_id}"
            last = store.read(stream)[-1].id
            flip_data_byte(Raw(path), stream, 5)
            _found_elsewhere(path, stream)
            TOOL_CALLS.clear()
            with pytest.raises(ThreadCorrupt):
                await thread.fork(last, input="refund 7")
            assert TOOL_CALLS == []

    run(scenario)


def test_a_held_handle_whose_loop_starts_after_a_break_was_recorded_claims_nothing(tmp_path: Path) -> None:
    """Seen by an audit: a parked call approved by another process, the break recorded, then ``wait()`` on the
    handle held open: its loop appended ``turn.claimed`` after the recorded break before it stopped."""
    path = tmp_path / "claim.db"

    async def scenario() -> None:
        with SQLiteStore(path) as store:
            thread = await Harness(agent(), store, owner="held").create_thread()
            await thread.send("look up 41")
            await thread.wait()
            await thread.send("charge 9")
            assert (await thread.wait()).status == "waiting"
            stream = f"thread/{thread.thread_id}"
            [effect_id] = [e.data["effect_id"] for e in store.read(stream) if e.type == "tool.parked"]
            with SQLiteStore(path) as other:  # the CLI's approval: recorded, no loop run there
                ThreadLog.load(other, thread.thread_id, verify=True).decide_parked(effect_id, "approved")
            flip_data_byte(Raw(path), stream, 5)
            _found_elsewhere(path, stream)
            await asyncio.sleep(BREAK_WATCH_INTERVAL_S + 0.1)  # a loop starting knows of it at most this late
            head = Raw(path).head(stream)
            TOOL_CALLS.clear()
            with contextlib.suppress(ThreadCorrupt):
                await thread.wait()
            assert Raw(path).head(stream) == head, [e.type for e in store.read(stream, head + 1)]
            assert TOOL_CALLS == []
            assert thread.state().status == "corrupt"

    run(scenario)


@pytest.mark.parametrize("digest", [b"\x00\xff", "hmac-sha256:k1:00", "sha256:00", None],
                         ids=["blob", "forged", "unsealed", "not-utf8"])
def test_a_verdict_row_nobody_sealed_stops_its_own_thread_only(tmp_path: Path, digest: object) -> None:
    """A verdict row written by raw SQL without the key is a break no key checks (decision 0069): it stops its
    own thread, and only that one. Seen by an audit: one whose digest was stored as a BLOB made the watch's read
    raise TypeError into the step of another, untouched thread (its turn failed and it showed running for good)."""
    path = tmp_path / "forged-verdict.db"

    async def scenario() -> None:
        with SQLiteStore(path) as store:
            harness = Harness(agent(), store, owner="held")
            one, two = await harness.create_thread(), await harness.create_thread()
            for thread in (one, two):
                await thread.send("look up 41")
                await thread.wait()
            state = '{"count":1,"detail":"x","first_bad_seq":1,"head_hash":"' + "0" * 64 + '","reason":"payload_changed"}'
            with Raw(path).transaction() as sql:
                if digest is None:  # what no UTF-8 decoder reads (seen by an audit: it failed every stream's read)
                    sql("INSERT INTO jixu_checkpoints VALUES (?, 'jixu/verdict', 1, 1, ?, CAST(x'ff' AS TEXT), "
                        "CAST(x'ff' AS TEXT), '2026-12-07T00:00:00Z')", f"thread/{one.thread_id}", "0" * 64)
                else:
                    sql("INSERT INTO jixu_checkpoints VALUES (?, 'jixu/verdict', 1, 1, ?, ?, ?, '2026-12-07T00:00:00Z')",
                        f"thread/{one.thread_id}", "0" * 64, state, digest)
            await asyncio.sleep(BREAK_WATCH_INTERVAL_S + 0.1)
            await two.send("look up 42")  # an untouched thread: its steps read every watched stream's break at once
            assert (await two.wait()).status == "idle"
            calls = len(TOOL_CALLS)
            # The thread whose row it is: a break recorded, whoever sealed it (a row no decoder reads: the store's
            # error, refusing as well).
            with pytest.raises(ThreadCorrupt if digest is not None else StoreError,
                               match="cannot be checked" if digest is not None else "decode"):
                await one.send("look up 42")
            assert len(TOOL_CALLS) == calls

    run(scenario)
