"""What a dead worker's tools left running (a subprocess still at work) acts for it: nothing settles or repeats
the call while it runs, a worker taking the call over stops it first, and a worker that cut calls off at its
drain stops what they started before it exits.

Real ``jixu worker`` processes leading their own process groups (as a shell's job, a service or a pool's worker
does), killed with SIGKILL; the tools' subprocesses append ``acted`` to a file once they slept.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from jixu.errors import TurnOwned
from jixu.ledger import SQLiteStore, Store
from jixu.scheduling import WorkerPool, create_thread_for, submit_turn
from jixu.threads.log import ThreadLog, stream_of
from tests.conftest import StoreFactory
from tests.helpers import ROOT, process_exited, python_env
from tests.runs.agents import spawning_agent
from tests.runs.conftest import Spawn, WorkerProcess, jixu, outside_lines, thread_state, wait_until


def late_acts(path: Path) -> int:
    return path.read_text().count("acted") if path.exists() else 0


def _env(tmp_path: Path, child_sleep: float) -> dict[str, str]:
    return {"JIXU_TEST_OUTSIDE": str(tmp_path / "outside.txt"), "JIXU_TEST_LATE": str(tmp_path / "late.txt"),
            "JIXU_TEST_CHILD_SLEEP": str(child_sleep)}


def _killed_mid_call(sqlite: StoreFactory, workers: Spawn, tmp_path: Path, word: str, child_sleep: float
                     ) -> tuple[Store, dict[str, str], str, WorkerProcess, str, int]:
    """A worker leading its group ran ``word``'s tool, whose subprocess acts after ``child_sleep`` s, and was
    SIGKILLed in the middle: ``(store, env, thread id, the dead worker, the call's effect id, its subprocess)``."""
    store = sqlite()
    assert sqlite.url is not None
    env = _env(tmp_path, child_sleep)
    outside = tmp_path / "outside.txt"
    thread_id = create_thread_for(store, spawning_agent())
    submit_turn(store, thread_id, f"{word} 1")
    first = workers(sqlite.url, "first", "--lease-ttl", "3", agent="spawning_agent", env=env, session=True)
    wait_until(lambda: len(outside_lines(outside)) == 1, "the tool's subprocess")
    [[_thread, effect_id, worker_pid, child_pid]] = outside_lines(outside)
    assert int(worker_pid) == first.pid
    first.process.send_signal(signal.SIGKILL)
    first.process.wait()
    assert not process_exited(int(child_pid)), "the subprocess outlives its worker"
    return store, env, thread_id, first, effect_id, int(child_pid)


def test_a_killed_workers_subprocess_still_at_work_keeps_its_unsafe_call_from_the_operator_until_it_ends(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """The worker died mid-call; the call's subprocess runs on and acts 4 s later. Its owner was proven gone,
    so the call showed as waiting for an operator and ``not_occurred`` was accepted while the subprocess could
    still act. Now the turn shows in progress in the dead worker's process group, resolving and recovering it
    are refused until the subprocess ended, and nothing dispatches the call again meanwhile."""
    store, env, thread_id, first, effect_id, child = _killed_mid_call(sqlite, workers, tmp_path, "spawn", 4.0)
    outside, late = tmp_path / "outside.txt", tmp_path / "late.txt"
    assert sqlite.url is not None
    other = workers(sqlite.url, "other", "--lease-ttl", "3", agent="spawning_agent", env=env)
    time.sleep(3.5)  # past the dead worker's lease
    assert not process_exited(child)
    state = thread_state(store, thread_id)
    assert state["status"] == "running" and f"process group {first.pid}" in state["reason"], state
    log = ThreadLog.load(store, thread_id)
    with pytest.raises(TurnOwned, match=rf"kill -TERM {child}"):
        log.resolve(effect_id, "not_occurred", note="nothing seen yet")
    turn_id = log.state.active_turn().turn_id  # type: ignore[union-attr]
    lease = store.get_lease(f"thread/{thread_id}/turn")
    assert lease is not None
    refused = jixu("turns", "recover", sqlite.url, thread_id, turn_id, "--request-id", "ab" * 16,
                   "--expected-epoch", str(lease.epoch))
    assert refused.returncode == 4 and "still run in its process group" in refused.stderr, refused
    wait_until(lambda: process_exited(child), "the subprocess's end")
    assert late_acts(late) == 1
    wait_until(lambda: thread_state(store, thread_id)["status"] == "waiting", "the call waiting for an operator")
    log = ThreadLog.load(store, thread_id)
    assert log.resolve(effect_id, "occurred", note="it acted")
    assert len(outside_lines(outside)) == 1, "nothing dispatched the call again"
    assert other.stop() == 0, other.output()


def test_a_worker_taking_over_a_dead_workers_idempotent_call_stops_its_subprocess_before_running_it_again(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """An idempotent call is run again by the worker that takes the dead one's turn over: its first attempt's
    subprocess was left running alongside the second (both acted). The claim now stops the dead worker's process
    group first, and records how."""
    store, env, thread_id, first, _effect_id, first_child = _killed_mid_call(sqlite, workers, tmp_path, "respawn",
                                                                             8.0)
    late = tmp_path / "late.txt"
    assert sqlite.url is not None
    second = workers(sqlite.url, "second", agent="spawning_agent", env=env)
    wait_until(lambda: thread_state(store, thread_id)["status"] == "idle", "the turn's end in the second worker")
    assert process_exited(first_child)
    assert late_acts(late) == 1, "only the second attempt's subprocess acted"
    [claimed] = [e for e in store.read(stream_of(thread_id)) if e.type == "turn.claimed"
                 and e.data["owner"] == "second"]
    stopped = claimed.data["stopped"]
    assert stopped["outcome"] == "terminated" and first_child in stopped["members"], stopped
    assert stopped["process"]["pgid"] == first.pid
    assert claimed.data["reason"] == "took_over_dead_owner"
    assert second.stop() == 0, second.output()


@pytest.mark.parametrize("word", ["aspawn", "spawn"])
def test_a_worker_that_cut_calls_off_at_its_drain_stops_their_subprocesses_before_it_exits(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path, word: str) -> None:
    """The drain records a call it cut off as unknown and the worker exits; the call's subprocess (an ``async``
    tool's or a ``def`` tool's) ran on and acted after that record. The worker now stops it first."""
    store = sqlite()
    assert sqlite.url is not None
    env = _env(tmp_path, 4.0)
    outside, late = tmp_path / "outside.txt", tmp_path / "late.txt"
    thread_id = create_thread_for(store, spawning_agent())
    submit_turn(store, thread_id, f"{word} 1")
    worker = workers(sqlite.url, "cut", "--drain-timeout", "1", agent="spawning_agent", env=env)
    wait_until(lambda: len(outside_lines(outside)) == 1, "the tool's subprocess")
    child = int(outside_lines(outside)[0][3])
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    assert process_exited(child), worker.output()
    assert f"stopped the processes this one still ran (pids {child})" in worker.output()
    time.sleep(4.5)
    assert late_acts(late) == 0, "the cut-off call's subprocess acted after its worker stopped"
    assert thread_state(store, thread_id)["status"] == "waiting"


def test_every_worker_of_a_pool_leads_a_process_group_of_its_own(sqlite: StoreFactory) -> None:
    """What a pool's worker starts is then told from its siblings' once it died (and stopped by its successor)."""
    sqlite()
    assert sqlite.url is not None
    pool = WorkerPool("tests.runs.agents:counter_agent", sqlite.url, processes=2, quiet=True, env=python_env(),
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with pool:
        assert [os.getpgid(pid) for pid in pool.pids] == pool.pids
        assert os.getpgid(pool.pids[0]) != os.getpgrp()


DRAINING_APP = r"""
import asyncio, os, sys, time
from jixu import Harness
from jixu.ledger import SQLiteStore
from tests.runs.agents import spawning_agent

async def main() -> None:
    harness = Harness(spawning_agent(), SQLiteStore(sys.argv[1]), owner="app")
    thread = await harness.create_thread()
    print("THREAD", thread.thread_id, flush=True)
    await thread.send("apoll 1")
    while not os.path.exists(os.environ["JIXU_TEST_OUTSIDE"]):
        await asyncio.sleep(0.02)
    await harness.shutdown(0.2)  # cuts the call off: recorded unknown, the turn's claim given back

asyncio.run(main())
"""


def test_a_call_an_application_drained_is_not_settled_while_its_subprocess_still_runs(tmp_path: Path) -> None:
    """An application (not a jixu serving process) drained its harness, cutting off an ``async`` tool's call that
    polls a plain ``Popen``, and ended: the claim was given back, and ``not_occurred`` was accepted while the call's subprocess still ran and
    then acted. The resolution now waits for what the gone holder left running."""
    env = {**python_env(), **_env(tmp_path, 4.0)}
    outside, late, path = tmp_path / "outside.txt", tmp_path / "late.txt", tmp_path / "app.db"
    output = tmp_path / "app.out"
    with output.open("w") as out:  # a file, not a pipe: the subprocess holds it open after the application ended
        app = subprocess.Popen([sys.executable, "-c", DRAINING_APP, str(path)], env=env, cwd=ROOT, text=True,
                               stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        assert app.wait(60) == 0, output.read_text()
    thread_id = output.read_text().split()[1]
    [[_thread, effect_id, _pid, child_pid]] = outside_lines(outside)
    child = int(child_pid)
    assert not process_exited(child), "the cut-off call's subprocess outlives the application"
    store = SQLiteStore(path)
    try:
        lease = store.get_lease(f"thread/{thread_id}/turn")
        assert lease is not None and lease.released
        log = ThreadLog.load(store, thread_id)
        assert log.snapshot().effects[effect_id].state == "unknown"
        with pytest.raises(TurnOwned, match=rf"kill -TERM {child}"):
            log.resolve(effect_id, "not_occurred", note="nothing seen yet")
        wait_until(lambda: process_exited(child), "the subprocess's end")
        assert late_acts(late) == 1
        assert ThreadLog.load(store, thread_id).resolve(effect_id, "occurred", note="it acted")
    finally:
        store.close()
