"""Every bad input gives a typed error and writes nothing, or the failure is recorded honestly."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from jixu.errors import (
    InvalidInput,
    InvalidPolicy,
    ProjectExists,
    ProjectNotFound,
    ProviderMismatch,
    RunCorrupt,
    RunNotFound,
    RunOwned,
    RunStateError,
    SourceUnavailable,
    UnknownProvider,
)
from jixu.ledger import NewEvent, SQLiteStore, Store, new_id
from jixu.runs import Runs, ScriptedProvider, get_project, register_project, update_policy
from jixu.runs.model import run_lease_key, run_stream
from tests.runs.run_helpers import fix, make_origin, policy, register, run, write


def snapshot(store: Store) -> list[tuple[str, int]]:
    """Every stream and its head: equal before and after means nothing was written."""
    return [(s.stream, s.head_seq) for s in store.list_streams()]


@pytest.fixture
def ledger(tmp_path: Path) -> Store:
    return SQLiteStore(tmp_path / "ledger.db")


def test_unknown_or_malformed_run_ids_are_typed_errors_and_write_nothing(ledger: Store, tmp_path: Path) -> None:
    register(ledger, make_origin(tmp_path))
    runs = Runs(ledger, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
    before = snapshot(ledger)

    async def scenario() -> None:
        missing = new_id()
        for operation in (runs.state(missing), runs.plan(missing), runs.journal(missing), runs.execute(missing),
                          runs.resume(missing, "ops"), runs.handoff(missing, "scripted", "ops"),
                          runs.retry(missing, "ops"), runs.cancel(missing, "ops")):
            with pytest.raises(RunNotFound):
                await operation
        with pytest.raises(InvalidInput):
            await runs.state("not-an-id")
        with pytest.raises(RunNotFound):
            await runs.create_run("calc", "fix", provider="scripted", parent_run_id=missing)

    run(scenario())
    assert snapshot(ledger) == before


def test_creating_a_run_with_bad_input_writes_nothing(ledger: Store, tmp_path: Path) -> None:
    register(ledger, make_origin(tmp_path))
    runs = Runs(ledger, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
    before = snapshot(ledger)

    async def scenario() -> None:
        cases = [
            (ProjectNotFound, runs.create_run("nope", "fix", provider="scripted")),
            (InvalidInput, runs.create_run("bad name!", "fix", provider="scripted")),
            (UnknownProvider, runs.create_run("calc", "fix", provider="nobody")),
            (InvalidInput, runs.create_run("calc", "   ", provider="scripted")),
            (SourceUnavailable, runs.create_run("calc", "fix", provider="scripted", commit="no-such-branch")),
            (SourceUnavailable, runs.create_run("calc", "fix", provider="scripted", commit="0" * 40)),
            (InvalidInput, runs.create_run("calc", "fix", provider="scripted", commit="--upload-pack=evil")),
        ]
        for error, operation in cases:
            with pytest.raises(error):
                await operation
        # A ref and a commit id of the origin both resolve to the commit.
        by_ref = await runs.state(await runs.create_run("calc", "fix", provider="scripted", commit="main"))
        by_id = await runs.state(await runs.create_run("calc", "fix", provider="scripted",
                                                       commit=by_ref.source["commit"][:10]))
        assert by_id.source["commit"] == by_ref.source["commit"] and by_id.source["ref"] is None

    run(scenario())
    assert [s for s in snapshot(ledger) if not s[0].startswith("run/")] == before


def test_resuming_a_succeeded_run_is_refused_and_writes_nothing(ledger: Store, tmp_path: Path) -> None:
    register(ledger, make_origin(tmp_path))
    runs = Runs(ledger, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix", provider="scripted")
        queued_before = snapshot(ledger)
        with pytest.raises(RunStateError):  # a queued run has nothing to resume
            await runs.resume(run_id, "ops")
        assert snapshot(ledger) == queued_before
        assert (await runs.execute(run_id)).status == "succeeded"
        before = snapshot(ledger)
        for operation in (runs.resume(run_id, "ops"), runs.handoff(run_id, "scripted", "ops"),
                          runs.cancel(run_id, "ops"), runs.retry(run_id, "ops")):
            with pytest.raises(RunStateError) as caught:
                await operation
            assert caught.value.details["status"] == "succeeded"
        with pytest.raises(InvalidInput):
            await runs.resume(run_id, "")
        assert snapshot(ledger) == before

    run(scenario())


def test_a_run_another_process_executes_or_a_changed_provider_config_is_refused_before_writing(
        ledger: Store, tmp_path: Path) -> None:
    register(ledger, make_origin(tmp_path))
    runs = Runs(ledger, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix], settings={"v": 1})})
    run_id = run(runs.create_run("calc", "fix", provider="scripted"))
    changed = Runs(ledger, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix], settings={"v": 2})})
    unconfigured = Runs(ledger, tmp_path / "ws", {"other": ScriptedProvider("other", [fix])})
    before = snapshot(ledger)
    for engine in (changed, unconfigured):
        with pytest.raises(ProviderMismatch):
            run(engine.execute(run_id))
    ledger.acquire_lease(run_lease_key(run_id), "someone-else", 30)
    with pytest.raises(RunOwned):
        run(runs.execute(run_id))
    assert run(runs.state(run_id)).status == "running"
    assert snapshot(ledger) == before
    with pytest.raises(InvalidInput):
        Runs(ledger, tmp_path / "ws", {"misnamed": ScriptedProvider("scripted", [])})


def test_a_check_that_times_out_is_killed_with_its_process_group_and_recorded_honestly(
        ledger: Store, tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    hang = ("import subprocess, sys, time; "
            f"p = subprocess.Popen(['sleep', '60']); open({str(pid_file)!r}, 'w').write(str(p.pid)); time.sleep(60)")
    checks = [{"name": "hangs", "argv": [sys.executable, "-c", hang], "timeout_s": 0.5},
              {"name": "missing", "argv": ["/nonexistent/check-binary"], "timeout_s": 5},
              {"name": "unit", "argv": [sys.executable, "-B", "check.py"]}]
    register_project(ledger, "calc", str(make_origin(tmp_path)), policy(checks=checks, repairs=0))
    runs = Runs(ledger, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix", provider="scripted")
        started = time.monotonic()
        state = await runs.execute(run_id)
        assert time.monotonic() - started < 20
        assert state.status == "failed" and "hangs" in state.reason and "missing" in state.reason
        verify = state.plan.tasks[2].evidence
        assert verify is not None and state.plan.tasks[2].status == "done"  # done means receipt, not success
        hangs, missing, unit = verify["checks"]
        assert (hangs["exit_status"], hangs["timed_out"], hangs["passed"]) == (None, True, False)
        assert 0.5 <= hangs["duration_s"] < 10 and hangs["timeout_s"] == 0.5
        assert (missing["exit_status"], missing["timed_out"]) == (None, False) and "FileNotFoundError" in missing[
            "error"]
        assert (unit["exit_status"], unit["passed"]) == (0, True)
        entries, valid = await runs.journal(run_id)
        assert valid and entries[-1]["type"] == "run.finished"

    run(scenario())
    grandchild = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the timed-out check's grandchild survived the process-group kill")


def test_paths_outside_the_policy_fail_the_run_with_the_offending_paths(ledger: Store, tmp_path: Path) -> None:
    register(ledger, make_origin(tmp_path), allowed_paths=["calc.py", "tests/*"])
    runs = Runs(ledger, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [write("secrets/key.txt", "x")])})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix", provider="scripted")
        state = await runs.execute(run_id)
        assert state.status == "failed" and "secrets/key.txt" in state.reason
        assert state.plan.tasks[2].status == "pending"  # never verified

    run(scenario())


def test_a_contradictory_journal_is_corrupt_and_refuses_operations(ledger: Store, tmp_path: Path) -> None:
    register(ledger, make_origin(tmp_path))
    runs = Runs(ledger, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
    run_id = run(runs.create_run("calc", "fix", provider="scripted"))
    ledger.append(run_stream(run_id), [NewEvent("plan.revised", {"revision": 7, "provider_revision": 1,
                                                                 "reason": "initial", "tasks": []})], 2)
    state = run(runs.state(run_id))
    assert state.status == "corrupt" and "contradictory_record" in state.reason and state.problems
    assert state.corruption is not None and (state.corruption.first_bad_seq, state.corruption.reason) == (
        3, "contradictory_record")
    before = snapshot(ledger)
    assert run(runs.execute(run_id)).status == "corrupt"
    with pytest.raises(RunCorrupt) as caught:
        run(runs.resume(run_id, "ops"))
    assert caught.value.details["first_bad_seq"] == 3
    assert snapshot(ledger) == before


def test_project_registration_validates_everything_before_writing(ledger: Store, tmp_path: Path) -> None:
    origin = str(make_origin(tmp_path))
    bad_policies: list[object] = [
        None, {}, {"checks": []}, {"checks": "pytest"}, {"checks": [{"name": "t", "argv": "python -m pytest"}]},
        {"checks": [{"name": "t", "argv": []}]}, {"checks": [{"name": "t", "argv": [""]}]},
        {"checks": [{"name": "t", "argv": ["x"], "timeout_s": 0}]},
        {"checks": [{"name": "t", "argv": ["x"], "timeout_s": True}]},
        {"checks": [{"name": "t", "argv": ["x"]}, {"name": "t", "argv": ["y"]}]},
        {"checks": [{"name": "bad name", "argv": ["x"]}]},
        {"checks": [{"name": "t", "argv": ["x"], "shell": True}]},
        {"checks": [{"name": "t", "argv": ["x"]}], "allowed_paths": ["../outside"]},
        {"checks": [{"name": "t", "argv": ["x"]}], "limits": {"max_repair_attempts": 99}},
        {"checks": [{"name": "t", "argv": ["x"]}], "limits": {"check_timeout_s": -1}},
        {"checks": [{"name": "t", "argv": ["x"]}], "extra": 1},
    ]
    for bad in bad_policies:
        with pytest.raises(InvalidPolicy):
            register_project(ledger, "calc", origin, bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        register_project(ledger, "no spaces", origin, policy())
    with pytest.raises(InvalidInput):
        register_project(ledger, "calc", "-oProxyCommand=x", policy())
    with pytest.raises(SourceUnavailable):
        register_project(ledger, "calc", str(tmp_path / "missing.git"), policy())
    with pytest.raises(ProjectNotFound):
        get_project(ledger, "calc")
    assert snapshot(ledger) == []

    project = register_project(ledger, "calc", origin, policy())
    assert (project.default_branch, project.policy["limits"]["check_timeout_s"], project.policy["allowed_paths"]) == (
        "main", 600.0, ["*"])
    assert register_project(ledger, "calc", origin, policy()) == project  # idempotent
    with pytest.raises(ProjectExists):
        register_project(ledger, "calc", origin, policy(repairs=2))
    updated = update_policy(ledger, "calc", policy(repairs=2))
    assert updated.policy_revision == 2 and updated.policy_digest != project.policy_digest
    assert snapshot(ledger) == [("project/calc", 2)]


@pytest.mark.parametrize(("field", "value"), [
    ("retry_backoff", -1), ("retry_backoff", "1"), ("retry_backoff", float("nan")), ("retry_backoff_cap", 3601),
    ("retry_backoff_cap", True), ("retry_backoff_cap", None)])
def test_a_bad_retry_backoff_is_refused_as_the_harness_refuses_it(ledger: Store, tmp_path: Path, field: str,
                                                                 value: object) -> None:
    providers = {"scripted": ScriptedProvider("scripted", [fix])}
    with pytest.raises(InvalidInput) as caught:
        Runs(ledger, tmp_path / "ws", providers, **{field: value})  # type: ignore[arg-type]
    assert caught.value.details.get("field") == field
    assert Runs(ledger, tmp_path / "ws", providers, **{field: 0}).__getattribute__(field) == 0.0  # type: ignore[arg-type]
