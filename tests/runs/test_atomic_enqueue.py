"""A queued turn's start (and a run's admitted request) and its queue row commit in one transaction; a sweep
repairs what older versions left.

Before issue 23 ``submit_turn`` wrote ``turn.started`` and then the queue row in a second transaction: a
process killed between them left a started turn no worker would ever claim, and the next ``submit_turn``
answered ``ThreadBusy``. Admitting an execution request (a cancellation, a publication) did the same with the
journal's ``run.request_admitted``: killed between, the journal named a request no worker would ever carry out.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from jixu.errors import InvalidInput
from jixu.ledger import Store
from jixu.runs import Runs, ScriptedProvider, request_work_key
from jixu.runs.engine import CANCEL_HEAD_START
from jixu.runs.journal import RunLog
from jixu.scheduling import Worker, WorkerConfig, create_thread_for, submit_turn, thread_work_key
from jixu.scheduling.work import repair_queue
from jixu.threads.log import ThreadLog
from tests.conftest import StoreFactory
from tests.helpers import python_env
from tests.runs.agents import counter_agent
from tests.runs.conftest import WAIT, thread_state
from tests.runs.run_helpers import make_origin, register

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


KILLED_ADMITTING = r"""
import os, signal, sys
from pathlib import Path
from jixu.ledger import open_store
from jixu.runs import Runs
store = open_store(sys.argv[1])

def die(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # the journal's event is written, its transaction not committed

type(store)._work_in = die
Runs(store, Path(sys.argv[3]), {}).requests.admit_cancellation(sys.argv[2], reason="stop")
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
    assert asyncio.run(repair_queue(store, page=2)) == [thread_work_key(stranded)]
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


def _queued_run(store: Store, tmp_path: Path) -> tuple[Runs, str]:
    register(store, make_origin(tmp_path))
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [])})
    return runs, asyncio.run(runs.create_run("calc", "fix add()", provider="scripted"))


@pytest.mark.crash
def test_a_kill_inside_an_admission_leaves_neither_the_journals_request_nor_its_queue_row(
        durable_factory: StoreFactory, tmp_path: Path) -> None:
    assert durable_factory.url is not None
    store = durable_factory()
    runs, run_id = _queued_run(store, tmp_path)
    child = subprocess.run([sys.executable, "-c", KILLED_ADMITTING, durable_factory.url, run_id,
                            str(tmp_path / "ws")], env=python_env(), capture_output=True, text=True, timeout=WAIT,
                           check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert RunLog(store, run_id).record.requests == {}, "the journal named a request whose queue row was never written"
    assert [item.key for item in store.list_work() if item.key.startswith("request/")] == []
    cancelled = asyncio.run(runs.cancel(run_id, "ops", reason="stop"))  # nothing half-written is in the way
    assert cancelled.status == "cancelled"


def test_a_cancelling_caller_has_a_head_start_before_a_worker_may_take_its_request(
        store: Store, tmp_path: Path) -> None:
    """The caller carries its cancellation out at once; the queue row (the backstop, should the caller stop) is
    not ready before CANCEL_HEAD_START, so a worker does not race the caller, whose answer is the finished run
    (a worker that took the request first left the caller answering ``paused``)."""
    runs, run_id = _queued_run(store, tmp_path)
    done = asyncio.run(runs.cancel(run_id, "ops", reason="stop"))
    assert done.status == "cancelled"
    [request_id] = list(RunLog(store, run_id).record.requests)
    queued = store.get_work(request_work_key(request_id))
    assert queued is not None and queued.ready_at - queued.enqueued_at == pytest.approx(CANCEL_HEAD_START, abs=1e-3)


def test_the_sweep_enqueues_an_admitted_request_an_older_version_left_without_a_queue_row(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs, run_id = _queued_run(store, tmp_path)
    # What the two-write admission committed when killed between its writes: the journal's event only.
    monkeypatch.setattr(store, "append_and_enqueue", lambda stream, events, expected, *, key, group, fence=None,
                        delay=0.0: store.append(stream, events, expected, fence))
    stranded = runs.requests.admit_cancellation(run_id, reason="stop")
    monkeypatch.undo()
    assert store.get_work(request_work_key(stranded)) is None and stranded in RunLog(store, run_id).record.requests
    assert asyncio.run(repair_queue(store, threads=False)) == [request_work_key(stranded)]
    assert asyncio.run(repair_queue(store)) == [], "a second sweep finds nothing"
    assert asyncio.run(repair_queue(store, requests=False)) == []


def test_a_bad_head_start_is_refused_before_anything_is_written(store: Store, tmp_path: Path) -> None:
    runs, run_id = _queued_run(store, tmp_path)
    before = store.list_streams("request/")
    for bad in (-1, float("inf"), "10", True):
        with pytest.raises(InvalidInput, match="delay"):
            runs.requests.admit_cancellation(run_id, reason="stop", delay=bad)  # type: ignore[arg-type]
    assert store.list_streams("request/") == before and RunLog(store, run_id).record.requests == {}


KILLED_CREATING = r"""
import os, signal, sys
from jixu.ledger.sqlite import SQLiteStore
from jixu.ledger.postgres import PostgresStore
from jixu.cli.main import main

def die(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # the run's events are written, its transaction (or the next) not

for kind in (SQLiteStore, PostgresStore):
    kind._work_in = die
sys.argv = ["jixu", "runs", *sys.argv[1:]]
main()
"""


def scripted_providers() -> dict[str, ScriptedProvider]:
    """The providers ``jixu runs create --providers tests.runs.test_atomic_enqueue:scripted_providers`` loads."""
    return {"scripted": ScriptedProvider("scripted", [])}


@pytest.mark.crash
@pytest.mark.parametrize("command", ["create", "retry"])
def test_a_kill_while_creating_a_queued_run_leaves_neither_the_run_nor_its_queue_row(
        durable_factory: StoreFactory, tmp_path: Path, command: str) -> None:
    """`jixu runs create --queue` (and `POST /runs`, and a retry with --queue) recorded the run and then, in a second
    transaction, its queue row: killed in between, the run stayed `queued` and no worker would ever claim it. Both
    are written in one transaction now: a kill leaves neither."""
    assert durable_factory.url is not None
    store = durable_factory()
    runs, failed = _queued_run(store, tmp_path)
    args = ["create", durable_factory.url, "calc", "--brief", "fix add()", "--provider", "scripted"]
    if command == "retry":
        asyncio.run(runs.cancel(failed, "ops", reason="stop"))  # a cancelled run is retried
        args = ["retry", durable_factory.url, failed]
    child = subprocess.run([sys.executable, "-c", KILLED_CREATING, *args, "--queue", "--providers",
                            "tests.runs.test_atomic_enqueue:scripted_providers", "--workspace-root",
                            str(tmp_path / "ws")], env=python_env(), capture_output=True, text=True, timeout=WAIT,
                           check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    existing = [info.stream for info in store.list_streams("run/")]
    queued = [item.key for item in store.list_work() if item.key.startswith("run/")]
    assert existing == [f"run/{failed}"] or command == "retry", (existing, queued)
    created = [stream for stream in existing if stream != f"run/{failed}"]
    assert created == [] and queued == [], f"a run was created without its queue row: {created}, {queued}"


KILLED_FORKING = r"""
import os, signal, sys
from jixu.ledger import open_store
from jixu.scheduling import thread_work_key
from jixu.threads.log import ThreadLog
store = open_store(sys.argv[1])

def die(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # the child's events are written, their transaction not committed

type(store)._work_in = die
log = ThreadLog.load(store, sys.argv[2])
log.fork(sys.argv[3], input="and then?", enqueue=lambda child: (thread_work_key(child), "default"))
"""


@pytest.mark.crash
def test_a_kill_while_forking_with_an_input_leaves_neither_the_child_nor_its_queue_row(
        durable_factory: StoreFactory) -> None:
    """A fork with an input (``POST /threads/{id}/fork`` with ``input``) recorded the child with its queued turn,
    then its queue row in a second transaction: killed in between, no worker claimed the turn and every input to
    the child was refused as busy. One transaction now: a kill leaves neither."""
    assert durable_factory.url is not None
    store = durable_factory()
    thread_id = create_thread_for(store, counter_agent())
    [created] = store.read(f"thread/{thread_id}")
    child = subprocess.run([sys.executable, "-c", KILLED_FORKING, durable_factory.url, thread_id, created.id],
                           env=python_env(), capture_output=True, text=True, timeout=WAIT, check=False)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert [info.stream for info in store.list_streams("thread/")] == [f"thread/{thread_id}"]
    assert [item.key for item in store.list_work()] == []
