"""SIGKILL of a real worker process during prepare, implement and verify; resume reconciles the workspace,
does not clone again after a completed prepare, does not redo completed tasks; tampering is detected."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from jixu.errors import WorkspaceMismatch
from jixu.ledger import SQLiteStore, Store
from jixu.runs import ImplementContext, ImplementResult, RunLog, Runs, ScriptedProvider
from jixu.runs.orphans import survey
from tests.runs.run_helpers import (
    FIXED,
    CrashChild,
    clones,
    fix,
    git,
    install_git_shim,
    make_origin,
    register,
    run,
    task_events,
    types,
)

pytestmark = pytest.mark.crash


class Scene:
    """A SQLite ledger, an origin, a registered project, a run created, the git shim counting clones."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        shim_dir, self.clone_log = install_git_shim(tmp_path)
        monkeypatch.setenv("PATH", f"{shim_dir}:{os.environ['PATH']}")
        monkeypatch.setenv("JIXU_TEST_GIT_LOG", str(self.clone_log))
        self.tmp = tmp_path
        self.db = tmp_path / "ledger.db"
        self.url = f"sqlite:///{self.db}"
        self.store: Store = SQLiteStore(self.db)
        self.root = tmp_path / "ws"
        register(self.store, make_origin(tmp_path))
        creator = Runs(self.store, self.root, {"scripted": ScriptedProvider("scripted", [])})
        self.run_id: str = run(creator.create_run("calc", "fix add()", provider="scripted"))
        self.workspace = self.root / self.run_id
        self.marker = tmp_path / "reached"

    def crash(self, mode: str, *, owner: str = "crash-worker", ttl: float = 30.0) -> None:
        """Start a worker executing the run, let it reach ``mode``, SIGKILL its process group."""
        env: dict[str, str] = {}
        hold = self.tmp / "hold"
        if mode == "prepare":
            hold.touch()
            env["JIXU_TEST_CLONE_HOLD"] = str(hold)
            reached = Path(f"{hold}.reached")
        elif mode == "verify":
            hold.touch()
            env["JIXU_TEST_CHECK_HOLD"] = str(hold)
            reached = Path(f"{hold}.reached")
        else:
            reached = self.marker
        child = CrashChild(self.url, self.root, self.run_id, mode, self.marker, owner=owner, ttl=ttl, env=env)
        child.wait_for(reached)
        child.kill()
        hold.unlink(missing_ok=True)  # the orphaned check (a process group of its own) may now end by itself
        if mode == "verify":  # and resume refuses until it has (test_orphans.py): wait for it here
            log = RunLog(self.store, self.run_id)
            assert [p["what"] for p in log.record.processes] == ["check unit"]
            deadline = time.monotonic() + 30
            while survey(RunLog(self.store, self.run_id).record):
                assert time.monotonic() < deadline, "the orphaned check never ended"
                time.sleep(0.02)

    def runs(self, steps: list[object], owner: str = "crash-worker") -> tuple[Runs, ScriptedProvider]:
        provider = ScriptedProvider("scripted", steps)  # type: ignore[arg-type]
        return Runs(self.store, self.root, {"scripted": provider}, owner=owner), provider

    def journal(self) -> tuple[list[dict[str, object]], bool]:
        runs, _ = self.runs([])
        result: tuple[list[dict[str, object]], bool] = run(runs.journal(self.run_id))
        return result


def test_killed_during_prepare_resume_prepares_again_from_a_clean_slate(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    scene.crash("prepare")
    assert not scene.workspace.exists()  # the clone was made aside and never renamed into place
    assert list(scene.root.glob(f".{scene.run_id}.partial-*"))
    runs, _provider = scene.runs([fix])

    async def scenario() -> None:
        state = await runs.state(scene.run_id)
        assert state.status == "interrupted" and "prepare" in state.reason
        assert state.plan.tasks[0].status == "unknown"
        resumed = await runs.resume(scene.run_id, "ops")
        assert resumed.reconciliations[-1]["outcome"] == "consistent"
        done = await runs.execute(scene.run_id)
        assert done.status == "succeeded", done.reason
        prepare = done.plan.tasks[0]
        assert len(prepare.attempts) == 1 and prepare.attempts[0]["decision"]["attempts"] == 2

    run(scenario())
    entries, valid = scene.journal()
    assert valid
    assert len(task_events(entries, "prepare", "dispatched")) == 2  # the same intent, dispatched again
    assert clones(scene.clone_log) == 2 and not list(scene.root.glob(f".{scene.run_id}.partial-*"))


def test_killed_during_implement_resume_keeps_the_clone_and_the_partial_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    scene.crash("implement")
    git_dir = scene.workspace / ".git"
    identity = (git_dir.stat().st_ino, (git_dir / "HEAD").stat().st_mtime_ns, (git_dir / "config").stat().st_ino)
    assert (scene.workspace / "partial.txt").exists()

    def finish(workspace: Path, context: ImplementContext) -> ImplementResult:
        assert (workspace / "partial.txt").read_text() == "half of the work\n"
        (workspace / "calc.py").write_text(FIXED)
        return ImplementResult("finished")

    runs, provider = scene.runs([finish])

    async def scenario() -> None:
        state = await runs.state(scene.run_id)
        assert state.status == "interrupted" and "implement" in state.reason
        assert [t.status for t in state.plan.tasks] == ["done", "unknown", "pending"]
        length = len((await runs.journal(scene.run_id))[0])
        assert (await runs.execute(scene.run_id)).status == "interrupted"  # not without an explicit resume
        assert len((await runs.journal(scene.run_id))[0]) == length
        resumed = await runs.resume(scene.run_id, "ops")
        reconciled = resumed.reconciliations[-1]
        assert reconciled["outcome"] == "consistent" and reconciled["expected"]["tree_may_differ"] is True
        assert reconciled["evidence"]["git_root"] == str(scene.workspace.resolve())
        done = await runs.execute(scene.run_id)
        assert done.status == "succeeded", done.reason
        claims = [e for e in (await runs.journal(scene.run_id))[0] if e["type"] == "run.claimed"]
        assert [c["data"]["reason"] for c in claims] == ["claimed", "reclaimed_by_same_owner"]

    run(scenario())
    assert (git_dir.stat().st_ino, (git_dir / "HEAD").stat().st_mtime_ns, (git_dir / "config").stat().st_ino) \
        == identity
    assert (scene.workspace / "partial.txt").exists() and len(provider.calls) == 1
    entries, valid = scene.journal()
    assert valid and clones(scene.clone_log) == 1
    assert len(task_events(entries, "prepare", "dispatched")) == 1
    assert len(task_events(entries, "implement", "requested")) == 1
    assert len(task_events(entries, "implement", "dispatched")) == 2  # the same retry-safe intent, again


def test_killed_during_verify_resume_verifies_again_without_redoing_the_implementation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    scene.crash("verify")
    runs, provider = scene.runs([])  # any provider call would fail the run

    async def scenario() -> None:
        state = await runs.state(scene.run_id)
        assert state.status == "interrupted" and "verify" in state.reason
        assert [t.status for t in state.plan.tasks] == ["done", "done", "unknown"]
        await runs.resume(scene.run_id, "ops")
        done = await runs.execute(scene.run_id)
        assert done.status == "succeeded", done.reason

    run(scenario())
    assert provider.calls == []
    entries, valid = scene.journal()
    assert valid and clones(scene.clone_log) == 1
    assert len(task_events(entries, "implement", "dispatched")) == 1
    assert len(task_events(entries, "verify", "dispatched")) == 2
    assert types(entries).count("run.reconciled") == 1


def test_a_head_moved_between_crash_and_resume_needs_reconciliation_and_nothing_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    scene.crash("verify")
    git("commit", "-q", "--allow-empty", "-m", "someone else's commit", cwd=scene.workspace)
    runs, provider = scene.runs([fix])

    async def scenario() -> None:
        length = len((await runs.journal(scene.run_id))[0])
        with pytest.raises(WorkspaceMismatch) as caught:
            await runs.resume(scene.run_id, "ops")
        assert any("HEAD" in detail for detail in caught.value.details["details"])
        state = await runs.state(scene.run_id)
        assert state.status == "needs_reconciliation" and "HEAD" in state.reason
        assert state.reconciliations[-1]["outcome"] == "mismatch"
        entries, valid = await runs.journal(scene.run_id)
        assert valid and len(entries) == length + 1 and entries[-1]["type"] == "run.reconciled"
        assert (await runs.execute(scene.run_id)).status == "needs_reconciliation"
        assert len((await runs.journal(scene.run_id))[0]) == length + 1

    run(scenario())
    assert provider.calls == []


def test_an_origin_changed_between_crash_and_resume_is_detected_and_restoring_it_lets_the_run_continue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    scene.crash("implement")
    authorized = git("remote", "get-url", "origin", cwd=scene.workspace)
    git("remote", "set-url", "origin", "https://example.invalid/someone-else.git", cwd=scene.workspace)
    runs, _provider = scene.runs([fix])

    async def scenario() -> None:
        with pytest.raises(WorkspaceMismatch):
            await runs.resume(scene.run_id, "ops")
        state = await runs.state(scene.run_id)
        assert state.status == "needs_reconciliation" and "origin" in state.reason
        git("remote", "set-url", "origin", authorized, cwd=scene.workspace)
        resumed = await runs.resume(scene.run_id, "ops")
        assert [r["outcome"] for r in resumed.reconciliations] == ["mismatch", "consistent"]
        assert (await runs.execute(scene.run_id)).status == "succeeded"

    run(scenario())
    assert scene.journal()[1] and clones(scene.clone_log) == 1


def test_another_owner_takes_over_a_worker_proven_dead_without_waiting_for_its_lease(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scene = Scene(tmp_path, monkeypatch)
    scene.crash("verify", owner="worker-a", ttl=30.0)  # its lease is valid for 30 s more
    runs, _provider = scene.runs([], owner="worker-b")

    async def scenario() -> None:
        state = await runs.state(scene.run_id)
        # Same machine: the claim's recorded process (pid + start time + boot id) is gone, which proves the
        # owner dead; the run is interrupted at once, the proof in its owner info.
        assert state.status == "interrupted" and state.owner is not None and state.owner["owner"] == "worker-a"
        assert state.owner["owner_gone"]["found"] == "no such process"
        await runs.resume(scene.run_id, "ops")
        done = await runs.execute(scene.run_id)
        assert done.status == "succeeded", done.reason
        claims = [e["data"] for e in (await runs.journal(scene.run_id))[0] if e["type"] == "run.claimed"]
        assert [(c["owner"], c["reason"]) for c in claims] == [("worker-a", "claimed"),
                                                               ("worker-b", "took_over_dead_owner")]

    run(scenario())


def test_a_second_process_under_the_same_owner_name_neither_takes_the_run_nor_calls_it_interrupted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two `jixu runs execute` at once on one host with the default --owner (`runs@<hostname>`): the second took
    the live lease as its own restart would (``reclaimed_by_same_owner``) and prepared the workspace again under
    the first, or said the run was interrupted while the first was implementing it. A same-named lease held by a
    live process is that process's: the run is running, execute is refused (RunOwned), nothing is written."""
    from jixu.errors import RunOwned

    scene = Scene(tmp_path, monkeypatch)
    child = CrashChild(scene.url, scene.root, scene.run_id, "implement", scene.marker, owner="runs@host")
    try:
        child.wait_for(scene.marker)
        runs, provider = scene.runs([fix], owner="runs@host")
        before, _ = scene.journal()

        async def scenario() -> None:
            state = await runs.state(scene.run_id)
            assert state.status == "running", state.reason
            with pytest.raises(RunOwned):
                await runs.execute(scene.run_id)

        run(scenario())
        after, _ = scene.journal()
        assert after == before and provider.calls == []
    finally:
        child.kill()


KILLED_RESUMING = r"""
import asyncio, os, signal, sys
from pathlib import Path
from jixu.ledger import open_store
from jixu.runs import Runs, ScriptedProvider
store = open_store(sys.argv[1])

def die(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)  # run.resumed is written, its transaction not committed

type(store)._work_in = die
runs = Runs(store, Path(sys.argv[3]), {"scripted": ScriptedProvider("scripted", [])}, owner="operator-process")
asyncio.run(runs.resume(sys.argv[2], "ops", queue=True))
"""


def test_a_kill_while_resuming_a_run_to_be_queued_leaves_neither_the_resume_nor_its_queue_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`POST /runs/{id}/resume` (and hand off, and a task's resolution) recorded the operator's decision, then queued
    the run in a second transaction: killed in between, the run was resumed but no worker would continue it, and the
    same request again was refused (nothing to resume). One transaction now: a kill leaves neither."""
    import subprocess
    import sys

    from tests.helpers import python_env

    scene = Scene(tmp_path, monkeypatch)
    scene.crash("implement")
    before, _ = scene.journal()
    child = subprocess.run([sys.executable, "-c", KILLED_RESUMING, scene.url, scene.run_id, str(scene.root)],
                           env=python_env(), capture_output=True, text=True, timeout=60, check=False)
    assert child.returncode == -9, child.stderr
    after, _ = scene.journal()
    assert "run.resumed" not in types(after) and len(after) == len(before), types(after)[len(before):]
    assert scene.store.get_work(f"run/{scene.run_id}") is None
