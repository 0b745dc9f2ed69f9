"""A queued turn's start and its queue row commit in one transaction; a sweep repairs what older versions left.

Before issue 23 ``submit_turn`` wrote ``turn.started`` and then the queue row in a second transaction: a
process killed between them left a started turn no worker would ever claim, and the next ``submit_turn``
answered ``ThreadBusy``.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from jixu.ledger import Store
from jixu.scheduling import Worker, WorkerConfig, create_thread_for, submit_turn, thread_work_key
from jixu.scheduling.work import repair_queue
from jixu.threads.log import ThreadLog
from tests.conftest import StoreFactory
from tests.helpers import python_env
from tests.runs.agents import counter_agent
from tests.runs.conftest import WAIT, thread_state

KILLED_INSIDE = r"""
import os, signal, sys
from jixu.ledger import open_store
from jixu.scheduling import submit_turn
store = open_store(sys.argv[1])
kind = type(store)

def die(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # the turn's event is written, its transaction not committed

kind._work_in = die
submit_turn(store, sys.argv[2], "charge order 42")
"""


@pytest.fixture(params=["sqlite", "postgres"])
def durable_factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    """Stores another process can open (by ``url``)."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    factory = StoreFactory(request.param, tmp_path, dsn)
    request.addfinalizer(factory.close)
    return factory


@pytest.mark.crash
def test_a_kill_inside_submit_turn_leaves_neither_the_turn_nor_its_queue_row(
        durable_factory: StoreFactory) -> None:
    store_factory = durable_factory
    assert store_factory.url is not None
    store = store_factory()
    thread_id = create_thread_for(store, counter_agent())
    child = subprocess.run([sys.executable, "-c", KILLED_INSIDE, store_factory.url, thread_id], env=python_env(),
                           capture_output=True, text=True, timeout=WAIT, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    log = ThreadLog.load(store, thread_id)
    assert log.state.active_turn() is None, "the turn's event outlived its transaction"
    assert store.get_work(thread_work_key(thread_id)) is None
    submit_turn(store, thread_id, "charge order 42")  # not ThreadBusy: nothing half-written is in the way
    assert ThreadLog.load(store, thread_id).state.active_turn() is not None
    assert store.get_work(thread_work_key(thread_id)) is not None


def _older_versions_queued_turn(store: Store) -> str:
    """A queued turn without its queue row: what the two-write submit_turn left when killed between them."""
    thread_id = create_thread_for(store, counter_agent())
    ThreadLog.load(store, thread_id).start_turn("charge order 42")
    assert store.get_work(thread_work_key(thread_id)) is None
    return thread_id


def test_the_sweep_enqueues_queued_turns_without_a_queue_row_and_nothing_else(store: Store) -> None:
    stranded = _older_versions_queued_turn(store)
    idle = create_thread_for(store, counter_agent())
    queued = create_thread_for(store, counter_agent())
    submit_turn(store, queued, "already in the queue")
    owned = create_thread_for(store, counter_agent())
    ThreadLog.load(store, owned).start_turn("an application runs this one", owner="app", ttl=30)
    assert asyncio.run(repair_queue(store, page=2)) == [stranded]
    assert store.get_work(thread_work_key(stranded)) is not None
    assert store.get_work(thread_work_key(idle)) is None and store.get_work(thread_work_key(owned)) is None
    assert asyncio.run(repair_queue(store)) == [], "a second sweep finds nothing"


def test_a_starting_worker_repairs_and_runs_a_stranded_queued_turn(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JIXU_TEST_OUTSIDE", str(tmp_path / "outside.txt"))
    stranded = _older_versions_queued_turn(store)
    said: list[tuple[str, str]] = []
    config = WorkerConfig(store_url="memory://", agent="tests.runs.agents:counter_agent", owner="w-1",
                          poll_interval=0.01, lease_ttl=5)
    worker = Worker(counter_agent(), store, config, report=lambda kind, text: said.append((kind, text)))

    async def main(until: Callable[[], bool]) -> None:
        task = asyncio.create_task(worker.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while not until():
            assert loop.time() < deadline, said
            await asyncio.sleep(0.01)
        worker.stop("test over")
        await asyncio.wait_for(task, WAIT)

    asyncio.run(main(lambda: thread_state(store, stranded)["status"] == "idle"))
    assert any(kind == "repair" and stranded in text for kind, text in said), said
