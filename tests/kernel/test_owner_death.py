"""Owner death as evidence (issue 23): a claimant on the same machine that proves the owner process gone takes
over at once; a live owner, or one on another machine, keeps its lease until it expires by the store's clock.

The crash tests kill a real process with SIGKILL in the middle of an unsafe call and continue the thread in
this process, which has another (the default) owner name, as the README's recovery path does.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import TurnOwned
from jixu.kernel import ownership
from jixu.kernel.ownership import owner_gone, process_identity
from jixu.ledger import SQLiteStore, Store
from jixu.ledger.postgres import PostgresStore
from jixu.threads import Agent, Harness, ScriptedModel, ToolCall, tool
from tests.conftest import PostgresSchema
from tests.helpers import process_exited, python_env

ROOT = Path(__file__).resolve().parents[2]

# --- the proof itself ------------------------------------------------------------------------------------


def _child_identity(code: str) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    child = subprocess.Popen([sys.executable, "-c", code], env=python_env(), text=True, stdout=subprocess.PIPE)
    assert child.stdout is not None
    import json

    return child, json.loads(child.stdout.readline())


IDENTIFY = ("import json, sys, time\nfrom jixu.kernel.ownership import process_identity\n"
            "print(json.dumps(process_identity()), flush=True)\ntime.sleep(60)\n")


def test_a_live_process_is_not_gone_and_a_killed_one_is() -> None:
    child, identity = _child_identity(IDENTIFY)
    try:
        assert identity["pid"] == child.pid and isinstance(identity["start_time"], int)
        assert owner_gone(identity) is None, "a live process was called gone"
    finally:
        child.kill()
        child.wait()
    proof = owner_gone(identity)
    assert proof is not None and proof["found"] == "no such process"
    assert proof["process"]["pid"] == child.pid and proof["checked_by"]["pid"] == os.getpid()


def test_nothing_is_proven_about_another_machine_another_boot_or_this_very_process() -> None:
    child, identity = _child_identity(IDENTIFY)
    child.kill()
    child.wait()
    assert owner_gone(identity) is not None
    assert owner_gone({**identity, "boot_id": "another-boot"}) is None, "another boot (or machine) proves nothing"
    assert owner_gone({**identity, "pid_namespace": "pid:[1]"}) is None, "another pid namespace proves nothing"
    assert owner_gone({**identity, "start_time": None}) is None, "without a start time nothing is proven"
    assert owner_gone(process_identity()) is None, "this process is alive"
    for malformed in (None, "x", {}, {**identity, "pid": True}, {**identity, "pid": -1},
                      {**identity, "start_time": "1"}):
        assert owner_gone(malformed) is None


def test_a_pid_reused_by_another_process_proves_the_owner_gone() -> None:
    me = process_identity()
    reused = {**me, "pid": os.getppid(), "start_time": -1}  # a live pid whose start time is not the owner's
    proof = owner_gone(reused)
    assert proof is not None and "now belongs to a process started at" in proof["found"]


# --- a real crash ------------------------------------------------------------------------------------------


CRASHING = r"""
import asyncio, sys
from jixu import Agent, Harness, ScriptedModel, ToolCall, tool

@tool(semantics="unsafe")
async def refund(order: int) -> str:
    '''Refund an order (the process dies while it runs).'''
    print("RUNNING", flush=True)
    await asyncio.sleep(3600)
    return "refunded"

async def main() -> None:
    harness = Harness(Agent("refunder", ScriptedModel([ToolCall("refund", {"order": 42}), "Refunded."]),
                            tools=[refund]), sys.argv[1])  # the default owner and lease
    thread = await harness.create_thread()
    print("THREAD", thread.thread_id, flush=True)
    await thread.send("refund order 42")
    await thread.wait()

asyncio.run(main())
"""


@tool(semantics="unsafe")
async def refund(order: int) -> str:
    """Refund an order."""
    return "refunded"


def _agent() -> Agent:
    return Agent("refunder", ScriptedModel([ToolCall("refund", {"order": 42}), "Refunded."]), tools=[refund])


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, Callable[[], Store]]]:
    if request.param == "sqlite":
        path = tmp_path / "t.db"
        yield f"sqlite:///{path}", lambda: SQLiteStore(path)
        return
    schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
    try:
        yield schema.url, lambda: PostgresStore(schema.url, max_size=4)
    finally:
        schema.drop()


def _thread_once_running(child: subprocess.Popen[str]) -> str:
    """The thread id ``child`` printed (``THREAD <id>``), read up to its ``RUNNING`` line (its unsafe call runs)."""
    assert child.stdout is not None
    thread_id = ""
    for line in child.stdout:
        if line.startswith("THREAD "):
            thread_id = line.split()[1]
        if line.startswith("RUNNING"):
            break
    return thread_id


def _crash_mid_call(url: str) -> str:
    """Run a thread in a child until its unsafe call runs, SIGKILL it there; the thread id."""
    child = subprocess.Popen([sys.executable, "-c", CRASHING, url], env=python_env(), text=True,
                             stdout=subprocess.PIPE, cwd=ROOT)
    try:
        thread_id = _thread_once_running(child)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert thread_id and child.returncode == -signal.SIGKILL
    return thread_id


def test_a_restarted_script_with_the_default_owner_continues_at_once_after_a_crash(
        ledger: tuple[str, Callable[[], Store]]) -> None:
    """The README's recovery path in a new process with the default owner: open, resolve, continue. The dead
    owner's lease (9 s by default) is not waited for: its process is proven gone, and the claim records the proof."""
    url, opener = ledger
    thread_id = _crash_mid_call(url)
    started = time.monotonic()

    async def recover() -> Any:
        store = opener()
        try:
            harness = Harness(_agent(), store)
            thread = await harness.open_thread(thread_id)
            state = thread.state()
            assert state.status == "waiting", state.reason
            [waiting] = state.waiting_on
            await thread.resolve_tool_outcome(waiting["effect_id"], "occurred", note="the refund is in the ledger")
            state = await thread.wait()
            return state, await thread.events()
        finally:
            store.close()

    state, events = asyncio.run(recover())
    took = time.monotonic() - started
    assert state.status == "idle" and state.last_reply == "Refunded.", state.reason
    assert took < 2.0, f"the recovery waited {took:.1f}s"
    [taken] = [e for e in events if e.type == "turn.claimed"]
    assert taken.data["reason"] == "took_over_dead_owner"
    assert taken.data["proof"]["found"] == "no such process"
    started_event = next(e for e in events if e.type == "turn.started")
    assert taken.data["proof"]["process"]["pid"] == started_event.data["process"]["pid"]
    assert [e.type for e in events].count("tool.dispatched") == 1, "the unsafe call was not dispatched again"


def test_an_owner_on_another_machine_keeps_its_lease_until_it_expires(
        ledger: tuple[str, Callable[[], Store]], monkeypatch: pytest.MonkeyPatch) -> None:
    """Seen from another machine (another boot id) nothing proves the owner gone: the thread shows its turn in
    progress there, not an effect waiting for an operator, and the resolution and the claim are refused while
    its lease lives."""
    url, opener = ledger
    thread_id = _crash_mid_call(url)
    monkeypatch.setattr(ownership, "_IDENTITY", (os.getpid(), {**process_identity(), "boot_id": "elsewhere"}))

    async def try_to_recover() -> None:
        store = opener()
        try:
            harness = Harness(_agent(), store)
            thread = await harness.open_thread(thread_id)
            state = thread.state()
            assert state.status == "running" and "in progress in" in state.reason, state.reason
            assert state.waiting_on == () and thread.log.status() == "running"
            [unknown] = [d for d in state.effects.values() if d.state == "unknown"]
            with pytest.raises(TurnOwned, match="may still be in flight"):
                await thread.resolve_tool_outcome(unknown.effect_id, "occurred")
            problem = thread.claim_problem()
            assert problem is not None and "is owned by" in problem
        finally:
            store.close()

    asyncio.run(try_to_recover())


def test_after_an_operator_ends_a_dead_owners_turn_its_call_is_resolved_at_once_and_shown_so(
        ledger: tuple[str, Callable[[], Store]]) -> None:
    """The holder is proven gone by the claim recorded in its turn; once an operator ended that turn the proof was
    looked for in the active turn only, found nowhere, and the resolution every surface offered was refused
    (turn_owned) until the dead process's lease expired."""
    from jixu.threads.log import ThreadLog

    url, opener = ledger
    thread_id = _crash_mid_call(url)
    store = opener()
    try:
        log = ThreadLog.load(store, thread_id, verify=True)
        assert log.end_running_turn("its process is gone")
        state = log.snapshot()
        assert state.status == "waiting", state.reason
        [waiting] = state.waiting_on
        assert log.resolve(waiting["effect_id"], "occurred", note="the refund is in the ledger")
        assert log.snapshot().status == "idle"
    finally:
        store.close()


def test_another_live_process_is_one_of_this_machine_that_runs_and_is_not_this_one() -> None:
    child, identity = _child_identity(IDENTIFY)
    try:
        assert ownership.another_live_process(identity)
        assert not ownership.another_live_process({**identity, "boot_id": "another-boot"}), "nothing known there"
        assert not ownership.another_live_process(process_identity()), "this very process"
    finally:
        child.kill()
        child.wait()
    assert not ownership.another_live_process(identity), "a killed process runs no more"
    for malformed in (None, "x", {}, {**identity, "start_time": None}):
        assert not ownership.another_live_process(malformed)


RUNNING_AS_APP = CRASHING.replace("sys.argv[1])  # the default owner and lease", "sys.argv[1], owner='app')")


def test_a_process_under_the_same_owner_name_as_a_live_one_does_not_take_its_turn(
        ledger: tuple[str, Callable[[], Store]]) -> None:
    """Two processes run with one owner name (two `jixu worker`s with the default --owner on one host): the second
    took the first's claim for its own, as its own restart would. It showed the unsafe call the first still ran
    as waiting for an operator and accepted a resolution of it. A same-named claim is one's own only when no other
    live process holds it: the turn shows in progress there, and resolving or claiming it is refused
    (TurnOwned) until that process stops."""
    url, opener = ledger
    child = subprocess.Popen([sys.executable, "-c", RUNNING_AS_APP, url], env=python_env(), text=True,
                             stdout=subprocess.PIPE, cwd=ROOT)
    try:
        thread_id = _thread_once_running(child)

        async def try_to_continue() -> list[Any]:
            store = opener()
            try:
                harness = Harness(_agent(), store, owner="app")
                thread = await harness.open_thread(thread_id, resume=False)
                state = thread.state()
                assert state.status == "running" and "in progress in app" in state.reason, state.reason
                [unknown] = [d for d in state.effects.values() if d.state == "unknown"]
                with pytest.raises(TurnOwned, match="may still be in flight"):
                    await thread.resolve_tool_outcome(unknown.effect_id, "occurred")
                problem = thread.claim_problem()
                assert problem is not None and "is owned by app" in problem, problem
                with pytest.raises(TurnOwned):
                    await thread._claim_turn()
                return await thread.events()
            finally:
                store.close()

        events = asyncio.run(try_to_continue())
        assert [e.data.get("reason") for e in events if e.type == "turn.claimed"] == []
        assert [e.type for e in events].count("tool.dispatched") == 1
    finally:
        child.kill()
        child.wait()


def test_an_expired_claim_whose_process_still_runs_here_is_live_until_that_process_ends(tmp_path: Path) -> None:
    """A holder stopped past its lease (SIGSTOP, a debugger, a long GC pause) goes on when resumed: its calls in
    flight can still happen, though its writes to the store are fenced out. Its claim expired, yet it is live while
    that process runs on this machine: an operator settling its call ``not_occurred`` meanwhile saw the deploy
    performed twice. Once the process ends, the expired claim is gone."""
    child, identity = _child_identity(IDENTIFY)
    try:
        store = SQLiteStore(tmp_path / "t.db")
        store.acquire_lease("request/x/execution", "worker:1", 0.05)
        time.sleep(0.1)
        claim = ownership.live_claim(store, "request/x/execution", lambda lease: identity)
        assert claim is not None and claim.left < 0 and claim.left_running == [], claim
        assert "expired" in claim.held_for() and "still runs" in claim.held_for()
        elsewhere = {**identity, "boot_id": "another-machine"}
        assert ownership.live_claim(store, "request/x/execution", lambda lease: elsewhere) is None, \
            "nothing is known of another machine's process: expiry decides"
    finally:
        child.kill()
        child.wait()
    assert ownership.live_claim(store, "request/x/execution", lambda lease: identity) is None
    store.close()


# --- what a dead holder left running -----------------------------------------------------------------------

HOLDER = ("import json, subprocess, sys, time\nfrom jixu.kernel.ownership import process_identity\n"
          "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
          "print(json.dumps({'identity': process_identity(), 'child': child.pid}), flush=True)\ntime.sleep(60)\n")


def _holder_with_a_child(*, leads_its_group: bool) -> tuple[subprocess.Popen[str], dict[str, Any], int]:
    import json

    holder = subprocess.Popen([sys.executable, "-c", HOLDER], env=python_env(), text=True, stdout=subprocess.PIPE,
                              start_new_session=leads_its_group)
    assert holder.stdout is not None
    found = json.loads(holder.stdout.readline())
    return holder, found["identity"], found["child"]


def test_a_dead_holders_subprocess_keeps_its_claim_live_until_the_claimant_stops_it(tmp_path: Path) -> None:
    """A holder that led its process group died; the subprocess it started runs on and can still act for it. Its
    claim stays live past its expiry (an operator would have settled the call meanwhile), and the process that
    takes the claim over stops the group first and records how."""
    holder, identity, child = _holder_with_a_child(leads_its_group=True)
    try:
        assert identity["pgid"] == identity["pid"] == holder.pid
        store = SQLiteStore(tmp_path / "t.db")
        store.acquire_lease("thread/x/turn", "worker-1", 0.05)
        assert ownership.left_running(identity) == [], "its holder runs: nothing is left over"
        holder.kill()
        holder.wait()
        assert ownership.left_running(identity) == [child]
        time.sleep(0.1)
        claim = ownership.live_claim(store, "thread/x/turn", lambda lease: identity)
        assert claim is not None and claim.left < 0 and claim.left_running == [child], claim
        assert f"kill -TERM {child}" in claim.held_for() and f"process group {holder.pid}" in claim.held_for()
        taken = asyncio.run(ownership.take_claim(store, "thread/x/turn", "worker-2", 5.0,
                                                 holder_process=lambda lease: identity))
        assert process_exited(child), "the claimant stopped it"
        assert taken.stopped is not None and taken.stopped["outcome"] == "terminated", taken
        assert taken.stopped["members"] == [child] and taken.record()["stopped"]["process"]["pgid"] == holder.pid
        assert ownership.left_running(identity) == []
        store.close()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(child, signal.SIGKILL)
        holder.kill()
        holder.wait()


def test_the_children_of_a_holder_that_did_not_lead_its_group_are_never_taken_for_its_own(tmp_path: Path) -> None:
    """A holder in another's process group (this test's): what runs in that group is not its to stop."""
    holder, identity, child = _holder_with_a_child(leads_its_group=False)
    try:
        assert "pgid" not in identity
        holder.kill()
        holder.wait()
        assert ownership.left_running(identity) == []
        store = SQLiteStore(tmp_path / "t.db")
        store.acquire_lease("thread/x/turn", "worker-1", 60)
        taken = asyncio.run(ownership.take_claim(store, "thread/x/turn", "worker-2", 5.0,
                                                 holder_process=lambda lease: identity))
        assert taken.reason == "took_over_dead_owner" and taken.stopped is None
        assert not process_exited(child), "nothing was signalled"
        store.close()
    finally:
        os.kill(child, signal.SIGKILL)


def test_a_process_started_after_the_holders_lease_expired_is_not_what_it_left_running() -> None:
    """A later program that got the holder's recycled pid and made a group of it (a daemon's ``setsid``) runs in a
    group with the holder's number: counted as the holder's, it was shown as in progress there for as long as it
    ran, and a claimant killed it. What started after the holder's lease expired is not the holder's."""
    holder, identity, child = _holder_with_a_child(leads_its_group=True)
    try:
        holder.kill()
        holder.wait()
        time.sleep(1.1)  # a scan of /proc is answered again for a second at most
        assert ownership.left_running(identity, alive_until=time.time()) == [child]
        assert ownership.left_running(identity, alive_until=time.time() - 60) == [], \
            "started a minute after the lease expired: not the holder's"
    finally:
        os.kill(child, signal.SIGKILL)


HOLDER_OF_A_LATE_STEP = ("import json, subprocess, sys, time\nfrom jixu.kernel.ownership import process_identity\n"
                         "shell = subprocess.Popen(['sh', '-c', 'sleep 3; sleep 60; true'])\n"
                         "print(json.dumps({'identity': process_identity(), 'shell': shell.pid}), flush=True)\n"
                         "time.sleep(60)\n")


def test_a_later_step_of_what_the_holder_left_running_is_left_running_too(tmp_path: Path) -> None:
    """Seen by an audit: a dead worker's tool ran a shell script whose second step started after the lease's
    expiry (plus the margin). That step was not counted (started too late), the claimant stopped only the shell,
    and the step, left behind in the dead worker's group, acted after the takeover, beside the call run again.
    A process started late is the holder's when it descends from one that is (here: the shell's child)."""
    import json

    holder = subprocess.Popen([sys.executable, "-c", HOLDER_OF_A_LATE_STEP], env=python_env(), text=True,
                              stdout=subprocess.PIPE, start_new_session=True)
    assert holder.stdout is not None
    found = json.loads(holder.stdout.readline())
    identity, shell = found["identity"], found["shell"]
    step: int | None = None
    try:
        holder.kill()
        holder.wait()
        deadline = time.monotonic() + 10
        while not (steps := [pid for pid in ownership.descendants(shell)
                             if Path(f"/proc/{pid}/cmdline").read_bytes() == b"sleep\x0060\x00"]):
            assert time.monotonic() < deadline, "the script's second step did not start"
            time.sleep(0.05)
        [step] = steps
        # The lease expired (plus the margin) after the shell started (3 s before its step) and before its step
        # (1.5 s from both: a start time is read against the boot time, which /proc gives in whole seconds).
        expired = time.time() - 1.5 - ownership.LEFT_RUNNING_MARGIN_S
        time.sleep(1.1)  # a scan of /proc is answered again for a second at most
        assert ownership.left_running(identity, alive_until=expired) == sorted([shell, step])
        path = tmp_path / "t.db"
        store = SQLiteStore(path)
        store.acquire_lease("thread/x/turn", "worker-1", 0.05)
        with sqlite3.connect(path) as sql:
            sql.execute("UPDATE jixu_leases SET expires_at = ? WHERE key = 'thread/x/turn'", (expired,))
        claim = ownership.live_claim(store, "thread/x/turn", lambda lease: identity)
        assert claim is not None and step in claim.left_running and f"{step}" in claim.held_for(), claim
        store.close()
    finally:
        for pid in (shell, step):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


CLAIMANT_IN_THE_GROUP = r"""
import asyncio, json, os, subprocess, sys, time
from pathlib import Path
from jixu.kernel import ownership
from jixu.ledger import SQLiteStore
identity, path, out, go = json.loads(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
mine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
while not go.exists():
    time.sleep(0.02)
left = ownership.left_running(identity)
store = SQLiteStore(path)
claim = asyncio.run(ownership.take_claim(store, "thread/x/turn", "claimant", 5.0, holder_process=lambda lease: identity))
out.write_text(json.dumps({"left": left, "mine": mine.pid, "stopped": claim.stopped, "mine_runs": mine.poll() is None}))
mine.kill()
"""

HOLDER_OF_A_CLAIMANT = r"""
import json, subprocess, sys, time
from jixu.kernel.ownership import process_identity
identity = process_identity()
orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
claimant = subprocess.Popen([sys.executable, sys.argv[1], json.dumps(identity), *sys.argv[2:]])
print(json.dumps({"identity": identity, "orphan": orphan.pid, "claimant": claimant.pid}), flush=True)
time.sleep(60)
"""


def test_a_claimant_in_the_dead_holders_group_neither_counts_nor_stops_itself_or_its_children(
        tmp_path: Path) -> None:
    """A process the holder started (a helper, a script calling the CLI) that takes the claim over once the holder
    died is in the holder's group: it listed itself as left running, SIGTERMed itself and never returned."""
    import json

    store = SQLiteStore(tmp_path / "t.db")
    store.acquire_lease("thread/x/turn", "worker-1", 60)
    store.close()
    (tmp_path / "claimant.py").write_text(CLAIMANT_IN_THE_GROUP)
    out, go = tmp_path / "out.json", tmp_path / "go"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER_OF_A_CLAIMANT, str(tmp_path / "claimant.py"),
                               str(tmp_path / "t.db"), str(out), str(go)], env=python_env(), text=True,
                              stdout=subprocess.PIPE, start_new_session=True)
    assert holder.stdout is not None
    started = json.loads(holder.stdout.readline())
    identity, orphan, claimant = started["identity"], started["orphan"], started["claimant"]
    try:
        holder.kill()
        holder.wait()
        time.sleep(1.1)
        seen_from_outside = ownership.left_running(identity)
        assert orphan in seen_from_outside and claimant in seen_from_outside, seen_from_outside
        go.touch()
        wait_for = time.monotonic() + 30
        while not out.exists() and time.monotonic() < wait_for:
            time.sleep(0.05)
        found = json.loads(out.read_text())
        assert found["left"] == [orphan], found
        assert found["stopped"]["members"] == [orphan] and found["mine_runs"], found
        assert process_exited(orphan), "the orphan was stopped, and the claimant returned"
    finally:
        for pid in (orphan, claimant):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

