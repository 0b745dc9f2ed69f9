"""``jixu worker`` executing runs: a queued run to success, an automatic pause requeued until its resume time, a run
that needs an operator finished with the command to use, and workers that leave work of another kind queued."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from jixu.errors import InvalidInput
from jixu.ledger import SQLiteStore, Store
from jixu.runs import ImplementContext, ImplementResult, ProviderError, Runs, ScriptedProvider, run_work_key
from jixu.runs.model import run_stream
from jixu.runs.providers import Provider
from jixu.scheduling import Worker, WorkerConfig, create_thread_for, submit_run, submit_turn
from tests.runs.agents import counter_agent
from tests.runs.conftest import WAIT, jixu
from tests.runs.run_helpers import events_of, fix, make_origin, register, run

SPEC = "tests.runs.test_run_worker:no_providers"


def no_providers() -> dict[str, Provider]:
    """A providers factory for the configuration (the tests hand the worker its providers directly)."""
    return {}


Said = list[tuple[str, str]]


def run_worker(store: Store, until: Callable[[], bool], *, providers: Mapping[str, Provider] | None,
               workspace_root: Path, with_agent: bool = False, said: Said | None = None) -> Said:
    """Run one in-process worker on ``store`` until ``until()`` holds; what it reported."""
    said = [] if said is None else said
    config = WorkerConfig(store_url=str(store.url), agent="tests.runs.agents:counter_agent" if with_agent else None,
                          providers=SPEC if providers is not None else None, workspace_root=str(workspace_root),
                          owner="w-1", poll_interval=0.01, lease_ttl=5)
    worker = Worker(counter_agent() if with_agent else None, store, config, providers=providers,
                    report=lambda kind, text: said.append((kind, text)))

    async def main() -> None:
        task = asyncio.create_task(worker.run())
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while not until():
            assert loop.time() < deadline, said
            assert not task.done(), said
            await asyncio.sleep(0.01)
        worker.stop("test over")
        await asyncio.wait_for(task, WAIT)

    asyncio.run(main())
    return said


def queued_run(store: Store, tmp_path: Path, provider: ScriptedProvider) -> str:
    register(store, make_origin(tmp_path))
    runs = Runs(store, tmp_path / "ws", {provider.name: provider}, owner="creator")
    run_id: str = run(runs.create_run("calc", "fix add()", provider=provider.name))
    item = submit_run(store, run_id)
    assert (item.key, item.state) == (run_work_key(run_id), "pending")
    return run_id


def status_of(store: Store, run_id: str) -> str:
    return str(run(Runs(store, "ws", {}, owner="observer").state(run_id)).status)


def test_a_worker_executes_a_queued_run_to_success(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    provider = ScriptedProvider("scripted", [fix])
    run_id = queued_run(store, tmp_path, provider)
    said = run_worker(store, lambda: bool(store.list_work(state="done")), providers={"scripted": provider},
                      workspace_root=tmp_path / "ws")
    assert status_of(store, run_id) == "succeeded"
    assert any(kind == "finish" and text.startswith(f"run/{run_id}: succeeded: all 1 checks passed")
               for kind, text in said), said
    claimed = [e for e in store.read(run_stream(run_id)) if e.type == "run.claimed"]
    assert [e.data["owner"] for e in claimed] == ["w-1"], "executed under the worker's name"
    assert store.get_lease(f"run/{run_id}/owner") is not None
    assert [item.state for item in store.list_work()] == ["done"]


def test_a_rate_limited_run_is_requeued_until_its_recorded_resume_then_finished(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    provider = ScriptedProvider("scripted", [ProviderError("429", kind="rate_limit", retry_after=1.5), fix])
    run_id = queued_run(store, tmp_path, provider)
    providers = {"scripted": provider}

    def requeued() -> bool:
        [item] = store.list_work()
        return item.epoch >= 1 and item.state == "pending"

    said = run_worker(store, requeued, providers=providers, workspace_root=tmp_path / "ws")
    [item] = store.list_work()
    [pause] = [e.data for e in store.read(run_stream(run_id)) if e.type == "run.paused"]
    assert pause["automatic"] and pause["delay"] == 1.5
    assert abs(item.ready_at - pause["resume_at"]) < 0.5, (item.ready_at, pause)
    assert item.ready_at > store.now(), "requeued with the pause's delay, not slept out holding the slot"
    assert status_of(store, run_id) == "paused"
    assert any(kind == "requeue" and text.startswith(f"run/{run_id}: paused (rate_limit): resumes automatically")
               for kind, text in said), said
    assert not any(e.type == "run.resumed" for e in store.read(run_stream(run_id)))

    said = run_worker(store, lambda: bool(store.list_work(state="done")), providers=providers,
                      workspace_root=tmp_path / "ws")
    assert status_of(store, run_id) == "succeeded"
    assert any(kind == "finish" and text.startswith(f"run/{run_id}: succeeded: all 1 checks passed")
               for kind, text in said), said
    entries = [{"type": e.type, "data": e.data} for e in store.read(run_stream(run_id))]
    assert [r["data"]["reason"] for r in events_of(entries, "run.resumed")] == ["automatic"]
    assert [c.attempt for c in provider.calls] == [1, 2]


def test_a_run_needing_an_operator_is_finished_with_the_command_to_use(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    provider = ScriptedProvider("scripted", [ProviderError("quota exhausted", kind="quota"), fix])
    run_id = queued_run(store, tmp_path, provider)
    said = run_worker(store, lambda: bool(store.list_work(state="done")), providers={"scripted": provider},
                      workspace_root=tmp_path / "ws")
    assert status_of(store, run_id) == "paused"
    [operator] = [text for kind, text in said if kind == "operator"]
    assert operator.startswith(f"run/{run_id}: paused: quota"), operator
    assert "operator needed" in operator
    assert f"jixu runs resume {store.url} {run_id} --providers {SPEC} --execute" in operator, operator
    assert [item.state for item in store.list_work()] == ["done"]


def test_workers_leave_work_of_a_kind_they_cannot_do_in_the_queue(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    provider = ScriptedProvider("scripted", [fix])
    run_id = queued_run(store, tmp_path, provider)
    events = len(store.read(run_stream(run_id)))

    def tried(key: str) -> Callable[[], bool]:
        def check() -> bool:
            [item] = [i for i in store.list_work() if i.key == key]
            return item.epoch >= 1 and item.state == "pending"
        return check

    said = run_worker(store, tried(f"run/{run_id}"), providers=None, with_agent=True,
                      workspace_root=tmp_path / "ws")
    assert any(kind == "error" and text.startswith(f"run/{run_id}: not a thread: left in the queue")
               for kind, text in said), said
    assert len(store.read(run_stream(run_id))) == events and status_of(store, run_id) == "queued"
    assert provider.calls == []

    thread_id = create_thread_for(store, counter_agent())
    submit_turn(store, thread_id, "charge")
    said = run_worker(store, tried(f"thread/{thread_id}"), providers={"scripted": provider},
                      workspace_root=tmp_path / "ws")
    assert any(kind == "error" and text.startswith(f"thread/{thread_id}: not a run: left in the queue")
               for kind, text in said), said
    [item] = [i for i in store.list_work() if i.key == f"thread/{thread_id}"]
    assert item.state == "pending"


def test_a_worker_needs_an_agent_or_providers(tmp_path: Path) -> None:
    with pytest.raises(InvalidInput, match="agent"):
        WorkerConfig(store_url="memory://")
    config = WorkerConfig(store_url="x.db", providers=SPEC, workspace_root="/tmp/ws", owner="w")
    assert WorkerConfig.from_json(config.to_json()) == config
    result = jixu("worker", "--store", f"sqlite:///{tmp_path / 'w.db'}")
    assert result.returncode == 6 and "--providers" in result.stderr, result.stderr
    bad = jixu("worker", "--store", f"sqlite:///{tmp_path / 'w.db'}", "--providers", "tests.runs.agents:nope")
    assert bad.returncode == 6 and "no attribute" in bad.stderr, bad.stderr
    assert not (tmp_path / "w.db").exists()


def test_a_worker_carries_out_an_admitted_publication_request(tmp_path: Path) -> None:
    from jixu.runs import request_work_key
    from jixu.runs.requests import RequestLog
    from tests.runs.fake_github import count_pushes, pushes

    store = SQLiteStore(tmp_path / "ledger.db")
    origin = make_origin(tmp_path)
    log = count_pushes(origin)
    register(store, origin)
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
    run_id = run(runs.create_run("calc", "fix add()", provider="scripted"))
    assert run(runs.execute(run_id)).status == "succeeded"
    request_id = run(runs.request_publication(run_id, actor="alice"))
    assert store.get_work(request_work_key(request_id)) is not None  # admission queued it
    providers = {"scripted": ScriptedProvider("scripted", [])}

    def published() -> bool:  # read synchronously: the worker's event loop is running
        return RequestLog(store, request_id).status()[0] == "succeeded"

    said = run_worker(store, published, providers=providers, workspace_root=tmp_path / "ws")
    assert any(kind == "finish" and "publication request succeeded" in text for kind, text in said), said
    assert len(pushes(log)) == 1


def test_a_run_whose_lease_lapsed_while_the_loop_was_held_is_left_to_an_operator_not_to_nobody(
        tmp_path: Path) -> None:
    """The worker's loop is held past the run's lease while its implement task is in flight: the run learns it
    lost its lease. Its work item goes back in the queue, and the next claim finds the run interrupted with that
    task in doubt and finishes the item with the operator's command. Finished at once instead ("lost"), the item
    would leave nobody to say what the run needs."""
    import threading
    import time

    store = SQLiteStore(tmp_path / "ledger.db")
    in_flight = threading.Event()

    def slow_fix(workspace: Path, context: ImplementContext) -> ImplementResult:
        in_flight.set()
        time.sleep(0.3)
        return fix(workspace, context)

    provider = ScriptedProvider("scripted", [slow_fix])
    run_id = queued_run(store, tmp_path, provider)
    said: Said = []
    config = WorkerConfig(store_url=str(store.url), providers=SPEC, workspace_root=str(tmp_path / "ws"), owner="w-1",
                          poll_interval=0.01, lease_ttl=0.6)
    worker = Worker(None, store, config, providers={"scripted": provider},
                    report=lambda kind, text: said.append((kind, text)))

    async def main() -> None:
        task = asyncio.create_task(worker.run())
        while not in_flight.is_set():
            await asyncio.sleep(0.01)
        time.sleep(1.5)  # the loop held 2.5 lease lengths: the run's lease lapses under its task
        loop = asyncio.get_running_loop()
        deadline = loop.time() + WAIT
        while not store.list_work(state="done"):
            assert loop.time() < deadline and not task.done(), said
            await asyncio.sleep(0.01)
        worker.stop("test over")
        await asyncio.wait_for(task, WAIT)

    asyncio.run(main())
    assert any(kind == "lost" and "(requeued)" in text for kind, text in said), said
    assert status_of(store, run_id) == "interrupted"
    [operator] = [text for kind, text in said if kind == "operator"]
    assert operator.startswith(f"run/{run_id}: interrupted") and "jixu runs resume" in operator, operator
    assert [item.state for item in store.list_work()] == ["done"]
    assert len(provider.calls) == 1, "the task in doubt was not run again"
