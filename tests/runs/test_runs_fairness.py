"""Runs as queued work: two projects, 50 runs against 2, two slots globally and one per project. The small
project's runs start before the big backlog drains (the store's fair claims, with submit_run's keys)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from jixu.ledger import SQLiteStore
from jixu.runs import Runs, ScriptedProvider, register_project, run_id_of, run_work_key
from jixu.scheduling import submit_run
from jixu.scheduling.queue import claim as claim_work
from tests.runs.run_helpers import fix, make_origin, policy, run

BIG, SMALL = "backlog", "hotfix"


def test_a_small_projects_runs_start_before_a_large_backlog_drains(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    quick = policy(checks=[{"name": "true", "argv": ["true"], "timeout_s": 10}])
    register_project(store, BIG, str(make_origin(tmp_path, "big")), quick)
    register_project(store, SMALL, str(make_origin(tmp_path, "small")), quick)
    provider = ScriptedProvider("scripted", [fix] * 60)
    runs = Runs(store, tmp_path / "ws", {"scripted": provider}, owner="test-loop")
    started: list[tuple[str, str]] = []
    running: dict[str, str] = {}
    peaks = {"total": 0, BIG: 0, SMALL: 0}

    async def scenario() -> None:
        big = [await runs.create_run(BIG, f"task {i}", provider="scripted") for i in range(50)]
        small = [await runs.create_run(SMALL, f"urgent {i}", provider="scripted") for i in range(2)]
        for run_id in big + small:  # the backlog is queued first
            item = submit_run(store, run_id)
            assert (item.key, item.state) == (run_work_key(run_id), "pending")
        finished: set[str] = set()

        async def slot(name: str) -> None:
            while not set(small) <= finished:
                claim = claim_work(store, name, 30.0, global_limit=2, default_project_limit=1)
                if claim is None:
                    await asyncio.sleep(0.005)
                    continue
                run_id = run_id_of(claim.key)
                assert run_id is not None
                started.append((claim.group, run_id))
                running[run_id] = claim.group
                peaks["total"] = max(peaks["total"], len(running))
                for project in (BIG, SMALL):
                    peaks[project] = max(peaks[project], list(running.values()).count(project))
                state = await runs.execute(run_id)
                assert state.status == "succeeded", state.reason
                del running[run_id]
                finished.add(run_id)
                store.finish_work(claim)

        await asyncio.wait_for(asyncio.gather(slot("slot-1"), slot("slot-2")), 120)

    run(scenario())
    order = [project for project, _run in started]
    small_positions = [i for i, project in enumerate(order) if project == SMALL]
    assert len(small_positions) == 2 and small_positions[1] <= 3, order
    assert peaks == {"total": 2, BIG: 1, SMALL: 1}
    pending = store.list_work(BIG, "pending")
    assert len(pending) >= 45  # the backlog is far from drained
