"""Decision 0024: threads that share one event loop share their commits (always: the one commit path).

Every append still returns only once it is durable, and each thread's record
is exactly what it would be alone; what changes is that the appends the
threads of one loop make while a commit runs are committed together (one
transaction and one fsync on SQLite) by :class:`~jixu.kernel.Commits`.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

import jixu
from jixu.errors import StreamBusy, ThreadBusy
from jixu.kernel import Commits
from jixu.ledger import MemoryStore, SQLiteStore
from jixu.ledger.event import Event
from jixu.ledger.store import AppendRequest
from jixu.recovery import RecoveryResolver
from jixu.threads import Agent, ModelRequest, ModelResponse, ScriptedModel, ToolCall, ToolContext, tool
from jixu.threads.log import ThreadLog, stream_of
from tests.threads.conftest import Ledger, assert_lifecycle_order, assert_same_answer, run, types_of

THREADS = 12
STEPS = 5


def _counting_agent(tools: list[Any]) -> Agent:
    def script(messages: list[dict[str, Any]]) -> Any:
        done = sum(1 for m in messages if m["role"] == "tool")
        return ToolCall(tools[0].name, {}) if done < STEPS else "done"

    return Agent("grouped", ScriptedModel(script), tools=tools, max_steps=STEPS + 2)


@tool(semantics="read_only")
async def look() -> str:
    """A read-only call that yields to the loop, as real I/O does."""
    await asyncio.sleep(0)
    return "seen"


def test_threads_on_one_loop_share_commits_and_record_what_they_would_alone(ledger: Ledger) -> None:
    async def scenario() -> None:
        harness = ledger.harness(_counting_agent([look]))
        threads = [await harness.create_thread() for _ in range(THREADS)]
        await asyncio.gather(*(thread.send("go") for thread in threads))
        states = await asyncio.gather(*(thread.wait() for thread in threads))
        assert all(s.status == "idle" and s.last_reply == "done" for s in states)
        commits = Commits.of(harness.store)
        assert commits.commits < commits.appends, "no two appends ever shared a commit"
        for thread in threads:
            events = await thread.events()
            assert_lifecycle_order(events)
            assert types_of(events).count("tool.completed") == STEPS
            assert harness.store.verify(thread.stream).valid
            await assert_same_answer(harness, thread)

    run(scenario())


def test_each_call_leaves_only_after_its_intent_marker_and_the_previous_receipt_are_durable(
        sqlite_ledger: Ledger) -> None:
    observer = SQLiteStore(sqlite_ledger.path)  # another connection: it sees committed events only
    seen: list[tuple[str, list[Event]]] = []

    class Watching:
        """A model that reads the store before answering, as a provider would receive the request."""

        name = "watching"

        async def complete(self, request: ModelRequest) -> ModelResponse:
            seen.append(("model", observer.read(stream_of(request.thread_id))))
            await asyncio.sleep(0)
            done = sum(1 for m in request.messages if m["role"] == "tool")
            if done < STEPS:
                return ModelResponse(tool_calls=(ToolCall("probe", {}),), model=self.name, stop_reason="tool_use")
            return ModelResponse(text="done", model=self.name, stop_reason="end_turn")

    @tool(semantics="read_only")
    async def probe(ctx: ToolContext) -> str:
        """A read-only call that looks at the ledger first."""
        seen.append(("tool", observer.read(stream_of(ctx.thread_id))))
        await asyncio.sleep(0)
        return "ok"

    async def scenario() -> None:
        harness = sqlite_ledger.harness(Agent("watched", Watching(), tools=[probe], max_steps=STEPS + 2))
        threads = [await harness.create_thread() for _ in range(4)]
        for thread in threads:
            await thread.send("go")
        states = await asyncio.gather(*(thread.wait() for thread in threads))
        assert all(s.last_reply == "done" for s in states)

    try:
        run(scenario())
    finally:
        observer.close()
    assert len(seen) == 4 * (2 * STEPS + 1)
    for kind, stored in seen:
        # The call's own intent and dispatch marker are the last durable events of its thread, and every earlier
        # call of the thread has its receipt stored.
        assert types_of(stored)[-2:] == [f"{kind}.requested", f"{kind}.dispatched"]
        dispatched = {e.data["effect_id"] for e in stored if e.type.endswith(".dispatched")}
        received = {e.data["effect_id"] for e in stored if e.type.endswith((".completed", ".failed"))}
        assert dispatched - received == {stored[-1].data["effect_id"]}


def test_reading_and_refreshing_while_commits_run_never_applies_an_event_twice(sqlite_ledger: Ledger) -> None:
    async def scenario() -> None:
        harness = sqlite_ledger.harness(_counting_agent([look]))
        threads = [await harness.create_thread() for _ in range(3)]
        for thread in threads:
            await thread.send("go")

        async def keep_refreshing() -> int:
            refreshed = 0
            while any(t.running for t in threads):
                for thread in threads:
                    await thread.refresh()  # waits for the thread's commit in flight, never reads under it
                    refreshed += 1
                await asyncio.sleep(0)
            return refreshed

        refreshed, *_ = await asyncio.gather(keep_refreshing(), *(t.wait() for t in threads))
        assert refreshed > 0
        for thread in threads:
            assert thread.log.state.seq == harness.store.stream_info(thread.stream).head_seq  # type: ignore[union-attr]
            await assert_same_answer(harness, thread)

    run(scenario())


class SlowCommits(MemoryStore):
    """A store whose shared commits take a while, so a waiter can be cancelled during one."""

    def append_many(self, requests: Sequence[AppendRequest]) -> list[Any]:
        time.sleep(0.05)
        return super().append_many(requests)


class WhereCommits(MemoryStore):
    """Records the OS thread of each shared commit and how many appends it carried."""

    def __init__(self) -> None:
        super().__init__()
        self.commits: list[tuple[int, int]] = []

    def append_many(self, requests: Sequence[AppendRequest]) -> list[Any]:
        self.commits.append((threading.get_ident(), len(requests)))
        return super().append_many(requests)


def test_commits_run_in_the_loop_while_every_thread_waits_and_in_a_worker_while_one_naps() -> None:
    """Decision 0021: while every running thread waits for the commit, nothing of theirs could run during it,
    and it runs in the loop's own thread; while one thread waits for something else (here a slow tool), the
    others' commits run in a worker thread, so that it can go on meanwhile. Turn starts that no running
    thread waits for commit in a worker too."""
    store = WhereCommits()
    napping: list[str] = []

    @tool(semantics="read_only")
    async def nap(ctx: ToolContext) -> str:
        """Slow for the first thread only."""
        if ctx.thread_id in napping:
            await asyncio.sleep(0.3)
        return "rested"

    async def scenario() -> None:
        from jixu.threads import Harness

        harness = Harness(_counting_agent([nap]), store)
        threads = [await harness.create_thread() for _ in range(3)]
        await asyncio.gather(*(thread.send("go") for thread in threads))
        states = await asyncio.gather(*(thread.wait() for thread in threads))
        assert all(s.status == "idle" and s.last_reply == "done" for s in states)
        lockstep = list(store.commits)
        store.commits.clear()
        more = [await harness.create_thread() for _ in range(3)]
        napping.append(more[0].thread_id)
        await asyncio.gather(*(thread.send("go") for thread in more))
        states = await asyncio.gather(*(thread.wait() for thread in more))
        assert all(s.status == "idle" and s.last_reply == "done" for s in states)
        loop_thread = threading.get_ident()
        assert lockstep[0] != (loop_thread, 3), "the turn starts (no agent loop waits for them) commit in a worker"
        assert len(lockstep) > 3 and all(ident == loop_thread for ident, _appends in lockstep[1:]), \
            "threads in lockstep commit in the loop's thread"
        assert store.commits[0] != (loop_thread, 3), "the turn starts commit in a worker"
        in_worker = [appends for ident, appends in store.commits[1:] if ident != loop_thread]
        assert len(in_worker) > 3 and max(in_worker) <= 2, "the others' commits ran in a worker while one napped"
        commits = Commits.of(harness.store)
        assert 0 < commits.commits_in_loop < commits.commits
        for thread in [*threads, *more]:
            await assert_same_answer(harness, thread)

    run(scenario())


def test_a_waiter_cancelled_during_its_commit_keeps_the_state_equal_to_the_store() -> None:
    store = SlowCommits()

    @tool(semantics="read_only")
    async def wait_a_bit() -> str:
        """A call that returns after a short while."""
        await asyncio.sleep(0.01)
        return "ok"

    async def scenario() -> None:
        from jixu.threads import Harness

        harness = Harness(_counting_agent([wait_a_bit]), store)
        thread, other = await harness.create_thread(), await harness.create_thread()
        await other.send("keep me company")  # while two threads run, appends wait for shared commits
        await thread.send("go")
        for _ in range(200):  # until a batched append of the thread waits for its commit
            if thread.log.appending:
                break
            await asyncio.sleep(0.001)
        assert thread.log.appending
        with pytest.raises(StreamBusy):
            thread.log.sync()  # reading under a commit in flight would apply its events twice
        state = await thread.interrupt("stop now")
        assert not thread.log.appending
        assert thread.log.state.seq == store.stream_info(thread.stream).head_seq  # type: ignore[union-attr]
        assert state.turns[-1]["status"] == "interrupted"
        assert store.verify(thread.stream).valid
        await assert_same_answer(harness, thread, checkpoint=False)
        assert (await other.wait()).last_reply == "done"

    run(scenario())


def test_turns_started_together_share_one_commit_and_a_thread_starting_refuses_a_second_turn(
        sqlite_ledger: Ledger) -> None:
    """``send`` commits ``turn.started`` through the shared commits: sends made together share
    one commit (one time stamp) instead of holding the loop for one each, and each returns once it is
    durable. While a send waits, the loop runs other tasks, and the same thread refuses another turn."""

    async def scenario() -> None:
        harness = sqlite_ledger.harness(_counting_agent([look]))
        threads = [await harness.create_thread() for _ in range(5)]
        first = asyncio.ensure_future(threads[0].send("go"))
        await asyncio.sleep(0)  # first is waiting for its commit now
        assert not first.done()
        with pytest.raises(ThreadBusy):
            await threads[0].send("again")
        await asyncio.gather(first, *(thread.send("go") for thread in threads[1:]))
        observer = SQLiteStore(sqlite_ledger.path)  # another connection: committed events only
        try:
            started = [next(e for e in observer.read(t.stream) if e.type == "turn.started") for t in threads]
        finally:
            observer.close()
        assert len({event.recorded_at for event in started[1:]}) == 1, "the sends made together shared no commit"
        states = await asyncio.gather(*(thread.wait() for thread in threads))
        assert all(state.status == "idle" and state.last_reply == "done" for state in states)
        for thread in threads:
            assert types_of(await thread.events()).count("turn.started") == 1
            await assert_same_answer(harness, thread)

    run(scenario())


def test_a_thread_running_alone_commits_at_once_and_stages_its_receipts(sqlite_ledger: Ledger) -> None:
    """A thread that runs alone on its loop makes each commit at once (no queue, no yield): two per step."""

    async def scenario() -> None:
        harness = sqlite_ledger.harness(_counting_agent([look]))
        store = harness.store
        assert isinstance(store, SQLiteStore)
        thread = await harness.create_thread()
        commits = store.commit_count
        await thread.send("go")
        assert (await thread.wait()).last_reply == "done"
        # turn.started; the first model intent + marker; two per step; the last receipt + turn.ended.
        assert store.commit_count - commits == 1 + 1 + 2 * STEPS + 1
        shared = Commits.of(store)
        # Only turn.started was queued (turns started together share its commit, see send).
        assert shared.appends - shared.commits_at_once == 1 and shared.running == 0
        await assert_same_answer(harness, thread)

    run(scenario())


@tool(semantics="read_only")
async def instant() -> str:
    """A read-only call that never waits (pure computation)."""
    return "done at once"


def test_threads_whose_calls_never_wait_still_run_side_by_side_and_share_commits(ledger: Ledger) -> None:
    """Every few appends the loop yields once, so a thread that never waits cannot run its whole turn
    before the others start (and never share a commit with them)."""

    async def scenario() -> None:
        harness = ledger.harness(_counting_agent([instant]))
        threads = [await harness.create_thread() for _ in range(4)]
        await asyncio.gather(*(thread.send("go") for thread in threads))
        states = await asyncio.gather(*(thread.wait() for thread in threads))
        assert all(s.status == "idle" and s.last_reply == "done" for s in states)
        commits = Commits.of(harness.store)
        assert 0 < commits.commits < commits.appends
        for thread in threads:
            assert_lifecycle_order(await thread.events())
            await assert_same_answer(harness, thread)

    run(scenario())


def test_a_program_that_fails_while_its_threads_share_commits_still_ends_and_its_records_stay_whole(
        tmp_path: Path) -> None:
    """``asyncio.run`` cancels every task on its way out (an exception, Ctrl-C), the commit task's too:
    a commit in flight still answers its waiters, so the program ends instead of hanging forever."""
    path = tmp_path / "t.db"
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(jixu.__file__).parents[1]), str(root),
                                                        os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "tests.threads.shutdown_child", str(path)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=root, check=False)
    assert done.returncode == 0, done.stderr
    assert "ended: the program fails while its threads run" in done.stdout
    with SQLiteStore(path) as store:
        streams = [info.stream for info in store.list_streams("thread/")]
        assert len(streams) == 4
        for stream in streams:
            assert store.verify(stream).valid
            events = store.read(stream)
            analysis = RecoveryResolver.analyze(events)
            assert not analysis.has_corruption
            # Interrupted mid-run: at most the call in flight is open, and it is safe to retry.
            assert all(d.state == "completed" or d.retry_safe for d in analysis.decisions.values())
            log = ThreadLog.load(store, stream.removeprefix("thread/"))
            assert log.state.seq == events[-1].seq
