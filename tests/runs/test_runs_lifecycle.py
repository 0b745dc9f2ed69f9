"""End-to-end runs on a real bare git origin: success, a repair, automatic retries after 429s, a quota pause
handed off, a retry with lineage, cancellation."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import ProviderTestFailed, RunStateError, UnknownProvider
from jixu.kernel.loop import MAX_RETRY_AFTER
from jixu.ledger import Store
from jixu.ledger.encoding import canonical_text
from jixu.runs import ImplementContext, ImplementResult, ProviderError, ProviderTest, Runs, ScriptedProvider
from jixu.runs.model import run_stream
from tests.runs.run_helpers import (
    FIXED,
    STILL_WRONG,
    clones,
    events_of,
    fix,
    install_git_shim,
    make_origin,
    register,
    run,
    task_events,
    types,
    write,
)

HEX64 = re.compile(r"^[0-9a-f]{64}$")


@pytest.fixture
def counted_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Every git clone in this test is logged; returns the log."""
    shim_dir, log = install_git_shim(tmp_path)
    monkeypatch.setenv("PATH", f"{shim_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("JIXU_TEST_GIT_LOG", str(log))
    return log


def test_a_run_succeeds_and_its_journal_tells_the_whole_story(store: Store, tmp_path: Path,
                                                               counted_git: Path) -> None:
    origin = make_origin(tmp_path)
    register(store, origin)
    provider = ScriptedProvider("scripted", [fix])
    runs = Runs(store, tmp_path / "ws", {"scripted": provider}, owner="worker-1")

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        queued = await runs.state(run_id)
        assert (queued.status, queued.plan.revision, [t.kind for t in queued.plan.tasks]) == (
            "queued", 1, ["prepare", "implement", "verify"])
        assert queued.source["commit"] and queued.source["ref"] == "refs/heads/main"
        assert queued.source["origin"] == str(origin)
        assert queued.provider["revision"] == 1 and HEX64.match(queued.provider["digest"])
        assert HEX64.match(queued.policy_digest) and queued.workspace == str((tmp_path / "ws" / run_id).resolve())

        state = await runs.execute(run_id)
        assert state.status == "succeeded", state.reason
        assert [t.status for t in state.plan.tasks] == ["done", "done", "done"]
        assert all(a["decision"]["state"] == "completed" for t in state.plan.tasks for a in t.attempts)
        verify = state.plan.tasks[2].evidence
        assert verify is not None and verify["passed"] and verify["tree"] == verify["tree_after"]
        [check] = verify["checks"]
        assert check["exit_status"] == 0 and not check["timed_out"] and HEX64.match(check["output_digest"])
        assert "add(2, 3) = 5" in check["output_excerpt"] and check["duration_s"] >= 0
        implement = state.plan.tasks[1].evidence
        assert implement is not None and implement["changed_paths"] == ["calc.py"]
        assert state.finished is not None and state.finished["evidence"]["source"]["tree"] == verify["tree"]
        assert state.finished["evidence"]["final_workspace"]["tree"] == verify["tree"]
        assert (Path(state.workspace) / "calc.py").read_text() == FIXED
        view = state.to_dict()
        canonical_text(view)  # plain JSON all the way down (for the CLI's --json and the HTTP API)
        assert view["status"] == "succeeded" and view["plan"] == (await runs.plan(run_id)).to_dict()
        assert [s.run_id for s in await runs.list_runs(project="calc")] == [run_id]

        entries, valid = await runs.journal(run_id)
        assert valid
        assert types(entries) == [
            "run.created", "plan.revised", "run.claimed",
            "task.requested", "task.dispatched", "task.completed",
            "task.requested", "task.dispatched", "task.completed",
            "task.requested", "task.dispatched", "run.process_started", "task.completed",
            "run.finished"]
        # The check's process group was recorded before the check ran: pid, start time, boot id.
        [started] = events_of(entries, "run.process_started")
        assert started["data"]["what"] == "check unit" and started["data"]["kind"] == "verify"
        assert started["data"]["process"]["pgid"] == started["data"]["process"]["pid"]
        assert isinstance(started["data"]["process"]["start_time"], int)
        intents = events_of(entries, "task.requested")
        assert [i["data"]["name"] for i in intents] == ["prepare", "implement", "verify"]
        assert [i["data"]["semantics"] for i in intents] == ["idempotent", "idempotent", "read_only"]
        assert all(i["data"]["args"]["attempt"] == 1 and i["data"]["args"]["revision"] == 1 for i in intents)
        # Executing a finished run does nothing.
        again = await runs.execute(run_id)
        assert again.status == "succeeded" and len((await runs.journal(run_id))[0]) == len(entries)

    run(scenario())
    assert clones(counted_git) == 1


def test_a_failing_check_gets_one_repair_whose_evidence_is_recorded_before_the_provider_is_called(
        tmp_path: Path, sqlite_path: Path) -> None:
    from jixu.ledger import SQLiteStore

    store = SQLiteStore(sqlite_path)
    register(store, make_origin(tmp_path))
    seen: dict[str, object] = {}

    async def repair(workspace: Path, context: ImplementContext) -> ImplementResult:
        # Runs on the event loop: the journal must already hold the failed verification and the repair plan.
        journal = [e.to_dict() for e in store.read(run_stream(context.run_id))]
        [revised] = [e for e in events_of(journal, "plan.revised") if e["data"]["reason"] == "repair"]
        failed_verify = task_events(journal, "verify", "completed")
        assert len(failed_verify) == 1 and failed_verify[0]["seq"] < revised["seq"]
        assert not failed_verify[0]["data"]["result"]["passed"]
        seen["repair_of"] = context.repair_of
        seen["recorded"] = revised["data"]["repair_of"]
        (workspace / "calc.py").write_text(FIXED)
        return ImplementResult("repaired")

    provider = ScriptedProvider("scripted", [write("calc.py", STILL_WRONG), repair])
    runs = Runs(store, tmp_path / "ws", {"scripted": provider})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        state = await runs.execute(run_id)
        assert state.status == "succeeded", state.reason
        assert (state.plan.revision, state.plan.reason, state.repairs_used) == (2, "repair", 1)
        assert [r["reason"] for r in state.plan.revisions] == ["initial", "repair"]
        assert len(state.plan.revisions[0]["tasks"]) == 3 and len(state.plan.revisions[1]["tasks"]) == 5
        kinds = [(t.kind, t.status) for t in state.plan.tasks]
        assert kinds == [("prepare", "done"), ("implement", "done"), ("verify", "done"), ("implement", "done"),
                         ("verify", "done")]
        first_verify = state.plan.tasks[2].evidence
        assert first_verify is not None and not first_verify["passed"]
        assert first_verify["checks"][0]["exit_status"] == 1 and "add(2, 3) = 6" in first_verify["checks"][0][
            "output_excerpt"]
        assert state.plan.tasks[3].params["repair_of"] == state.plan.tasks[2].task_id
        assert seen["repair_of"] == seen["recorded"]
        assert isinstance(seen["repair_of"], dict) and seen["repair_of"]["failing"] == ["unit"]
        assert len(provider.calls) == 2 and provider.calls[0].repair_of is None
        _entries, valid = await runs.journal(run_id)
        assert valid

    run(scenario())


def test_the_repair_budget_is_bounded_then_the_run_fails_with_its_evidence(store: Store, tmp_path: Path) -> None:
    register(store, make_origin(tmp_path))
    provider = ScriptedProvider("scripted", [write("calc.py", STILL_WRONG), write("calc.py", STILL_WRONG), fix])
    runs = Runs(store, tmp_path / "ws", {"scripted": provider})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        state = await runs.execute(run_id)
        assert state.status == "failed" and "failed after 1 repair attempt" in state.reason
        assert provider.remaining == 1 and len(provider.calls) == 2
        assert state.finished is not None and state.finished["evidence"]["checks"][0]["exit_status"] == 1
        with pytest.raises(RunStateError):
            await runs.resume(run_id, "ops")

    run(scenario())


def test_three_429s_pause_and_resume_automatically_then_the_run_continues(store: Store, tmp_path: Path) -> None:
    register(store, make_origin(tmp_path))
    limited = [ProviderError("429 Too Many Requests", kind="rate_limit", retry_after=0.01) for _ in range(3)]
    provider = ScriptedProvider("scripted", [*limited, fix])
    runs = Runs(store, tmp_path / "ws", {"scripted": provider})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        state = await runs.execute(run_id)
        assert state.status == "succeeded", state.reason
        assert [(p["reason"], p["automatic"], p["delay"], p["closed"]["by"]) for p in state.pauses] == [
            ("rate_limit", True, 0.01, "resumed")] * 3
        assert [p["automatic_retries_used"] for p in state.pauses] == [0, 1, 2]
        assert all(p["resume_at"] is not None for p in state.pauses)
        entries, valid = await runs.journal(run_id)
        assert valid
        resumes = events_of(entries, "run.resumed")
        assert [r["data"]["reason"] for r in resumes] == ["automatic"] * 3
        implement = state.plan.tasks[1]
        assert [a["attempt"] for a in implement.attempts] == [1, 2, 3, 4]
        assert [a["receipt"]["phase"] for a in implement.attempts] == ["failed", "failed", "failed", "completed"]
        assert implement.attempts[0]["receipt"]["error"]["kind"] == "rate_limit"
        assert [c.attempt for c in provider.calls] == [1, 2, 3, 4]
        # Each pause comes after its failed attempt, and each resume before the next intent.
        order = [e["type"] for e in entries if e["type"] in ("run.paused", "run.resumed", "task.requested")]
        assert order == ["task.requested", "task.requested", "run.paused", "run.resumed", "task.requested",
                         "run.paused", "run.resumed", "task.requested", "run.paused", "run.resumed",
                         "task.requested", "task.requested"]

    run(scenario())


def test_a_fourth_429_waits_for_an_operator_and_an_explicit_resume_continues(store: Store, tmp_path: Path) -> None:
    register(store, make_origin(tmp_path))
    limited = [ProviderError("429", kind="rate_limit", retry_after=0.01) for _ in range(4)]
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [*limited, fix])})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        state = await runs.execute(run_id)
        assert (state.status, state.pause_reason) == ("paused", "rate_limit")
        assert [p["automatic"] for p in state.pauses] == [True, True, True, False]
        length = len((await runs.journal(run_id))[0])
        assert (await runs.execute(run_id)).status == "paused"  # not bypassed: nothing runs, nothing written
        assert len((await runs.journal(run_id))[0]) == length
        resumed = await runs.resume(run_id, "ops")
        assert resumed.status == "queued" and resumed.reconciliations[-1]["outcome"] == "consistent"
        assert (await runs.execute(run_id)).status == "succeeded"

    run(scenario())


def test_a_retry_after_beyond_an_hour_waits_for_an_operator_not_for_the_provider(store: Store, tmp_path: Path) -> None:
    register(store, make_origin(tmp_path))
    limited = ProviderError("429", kind="rate_limit", retry_after=MAX_RETRY_AFTER + 1)
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [limited, fix])})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        state = await asyncio.wait_for(runs.execute(run_id), 30)  # not held for the hour and a second asked
        assert (state.status, state.pause_reason) == ("paused", "rate_limit")
        assert [(p["automatic"], p["delay"], p["resume_at"], p["retry_after"]) for p in state.pauses] == [
            (False, None, None, MAX_RETRY_AFTER + 1)]
        assert "the provider asked to wait 3601 s" in state.reason, state.reason
        resumed = await runs.resume(run_id, "ops")
        assert resumed.status == "queued"
        assert (await runs.execute(run_id)).status == "succeeded"

    run(scenario())


@pytest.mark.parametrize("mismatch", [False, True])
@pytest.mark.parametrize("operation", ["resume", "handoff"])
def test_two_operators_resuming_at_once_one_wins_and_the_other_is_told_at_run_level(
        store: Store, tmp_path: Path, operation: str, mismatch: bool) -> None:
    """An audit: the second of two concurrent resumes (or handoffs) got the ledger's bare ConcurrencyError; also
    when its own look at the workspace found a mismatch (its record of it met the first one's)."""
    register(store, make_origin(tmp_path))
    providers = {"scripted": ScriptedProvider("scripted", [ProviderError("credits", kind="quota"), fix]),
                 "other": ScriptedProvider("other", [fix])}
    first, second = (Runs(store, tmp_path / "ws", providers, owner=owner) for owner in ("ops-a", "ops-b"))

    async def scenario() -> None:
        run_id = await first.create_run("calc", "fix add()", provider="scripted")
        assert (await first.execute(run_id)).status == "paused"
        reached, go = asyncio.Event(), asyncio.Event()
        reconcile = second._reconciliation

        async def held(*args: Any, **kwargs: Any) -> Any:  # the second has read the journal and decided
            found, outcome = await reconcile(*args, **kwargs)
            reached.set()
            await go.wait()
            return found, "mismatch" if mismatch else outcome

        second._reconciliation = held  # type: ignore[method-assign]
        act = (lambda runs, who: runs.resume(run_id, who)) if operation == "resume" else (
            lambda runs, who: runs.handoff(run_id, "other", who))
        late = asyncio.create_task(act(second, "ops-b"))
        await asyncio.wait_for(reached.wait(), 10)
        assert (await act(first, "ops-a")).status == "queued"
        go.set()
        with pytest.raises(RunStateError, match=r"changed while it was being .* nothing was recorded"):
            await late
        entries, valid = await first.journal(run_id)
        kind = "run.resumed" if operation == "resume" else "run.handed_off"
        assert valid and [e["data"]["actor"] for e in entries if e["type"] == kind] == ["ops-a"]

    run(scenario())


@pytest.mark.parametrize("asked", [float("inf"), float("nan"), -1.0, True, "soon"])
def test_a_retry_after_no_wait_can_be_made_of_is_dropped_and_the_backoff_used(store: Store, tmp_path: Path,
                                                                            asked: Any) -> None:
    """The review of the cap above: an infinite or NaN retry-after from a provider of runs could not be recorded
    (the failure's receipt refused), leaving the run interrupted with its task in doubt."""
    register(store, make_origin(tmp_path))
    limited = ProviderError("429", kind="rate_limit", retry_after=asked)
    assert limited.retry_after is None and limited.to_dict()["retry_after"] is None
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [limited, fix])},
                retry_backoff=0.01)

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        state = await asyncio.wait_for(runs.execute(run_id), 30)
        assert state.status == "succeeded", state.reason
        assert [(p["automatic"], p["retry_after"]) for p in state.pauses] == [(True, None)]

    run(scenario())


def test_a_quota_pause_is_resolved_by_handoff_keeping_partial_files_and_earlier_revisions(
        store: Store, tmp_path: Path) -> None:
    register(store, make_origin(tmp_path))

    def partial_then_quota(workspace: Path, context: ImplementContext) -> ImplementResult:
        (workspace / "notes").mkdir()
        (workspace / "notes" / "plan.md").write_text("step 1 of 2 done\n")
        raise ProviderError("credits exhausted", kind="quota")

    def finish(workspace: Path, context: ImplementContext) -> ImplementResult:
        assert (workspace / "notes" / "plan.md").read_text() == "step 1 of 2 done\n"
        (workspace / "calc.py").write_text(FIXED)
        return ImplementResult("finished the plan")

    first = ScriptedProvider("alpha", [partial_then_quota], settings={"model": "a-1"})
    second = ScriptedProvider("beta", [finish], settings={"model": "b-2"})
    failing = ScriptedProvider("gamma", [], test_result=ProviderTest(False, "no credentials"))
    raising = ScriptedProvider("delta", [], test_result=RuntimeError("binary missing"))
    runs = Runs(store, tmp_path / "ws", {"alpha": first, "beta": second, "gamma": failing, "delta": raising})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="alpha")
        state = await runs.execute(run_id)
        assert (state.status, state.pause_reason) == ("paused", "quota")
        assert state.pauses[-1]["automatic"] is False and state.pauses[-1]["delay"] is None
        failed_attempt = state.plan.tasks[1].attempts[0]["receipt"]
        assert failed_attempt["error"]["kind"] == "quota" and failed_attempt["workspace"]["tree"]
        revision_1 = state.plan.revisions[0]
        length = len((await runs.journal(run_id))[0])
        # Not bypassed silently: executing again runs nothing; a failing or unknown provider writes nothing.
        assert (await runs.execute(run_id)).status == "paused"
        for name, error in (("gamma", ProviderTestFailed), ("delta", ProviderTestFailed), ("nobody", UnknownProvider)):
            with pytest.raises(error):
                await runs.handoff(run_id, name, "ops")
        assert len((await runs.journal(run_id))[0]) == length

        handed = await runs.handoff(run_id, "beta", "ops", note="alpha is out of credits")
        assert handed.status == "queued"
        assert [p["name"] for p in handed.providers] == ["alpha", "beta"]
        assert handed.provider["revision"] == 2 and handed.provider["settings"] == {"model": "b-2"}
        assert (handed.plan.revision, handed.plan.provider_revision, handed.plan.reason) == (2, 2, "handoff")
        assert handed.plan.revisions[0] == revision_1
        assert handed.policy_digest == state.policy_digest and handed.policy == state.policy
        assert handed.pauses[-1]["closed"]["by"] == "handed_off"
        assert (Path(handed.workspace) / "notes" / "plan.md").exists()

        done = await runs.execute(run_id)
        assert done.status == "succeeded", done.reason
        attempts = done.plan.tasks[1].attempts
        assert [(a["attempt"], a["revision"]) for a in attempts] == [(1, 1), (2, 2)]
        assert second.calls[0].attempt == 2
        assert (Path(done.workspace) / "notes" / "plan.md").read_text() == "step 1 of 2 done\n"
        assert sorted(done.plan.tasks[1].evidence["changed_paths"]) == ["calc.py", "notes/plan.md"]
        entries, valid = await runs.journal(run_id)
        assert valid and [e["data"]["tested"]["ok"] for e in events_of(entries, "run.handed_off")] == [True]

    run(scenario())


def test_retry_is_a_fresh_run_and_clone_with_lineage_and_the_failed_journal_only_gains_the_retry(
        store: Store, tmp_path: Path, counted_git: Path) -> None:
    register(store, make_origin(tmp_path))
    broken = ScriptedProvider("scripted", [ProviderError("the agent gave up", kind="invalid")])
    runs = Runs(store, tmp_path / "ws", {"scripted": broken})

    async def scenario() -> None:
        failed_id = await runs.create_run("calc", "fix add()", provider="scripted")
        failed = await runs.execute(failed_id)
        assert failed.status == "failed" and "the agent gave up" in failed.reason
        before = (await runs.journal(failed_id))[0]
        with pytest.raises(RunStateError):
            await runs.retry(run_id=(await runs.create_run("calc", "other", provider="scripted")), actor="ops")

        retry_runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
        child_id = await retry_runs.retry(failed_id, "ops")
        assert child_id != failed_id
        child = await retry_runs.state(child_id)
        assert child.lineage == {"parent_run_id": failed_id}
        assert (await runs.state(failed_id)).lineage == {"parent_run_id": None, "retried_as": child_id}
        assert (child.brief, child.source, child.policy_digest) == (failed.brief, failed.source, failed.policy_digest)
        assert child.workspace != failed.workspace
        done = await retry_runs.execute(child_id)
        assert done.status == "succeeded"
        # Its history stays byte for byte; the one event added names the retry (so a second one is refused).
        after, valid = await runs.journal(failed_id)
        assert valid and canonical_text(after[:len(before)]) == canonical_text(before)
        assert [(e["type"], e["data"]["child_run_id"]) for e in after[len(before):]] == [("run.retried", child_id)]
        assert (await runs.state(failed_id)).status == "failed"

    run(scenario())
    assert clones(counted_git) == 2  # one per run: the retry cloned afresh


def test_cancel_finishes_the_run_and_a_cancelled_run_can_be_retried(store: Store, tmp_path: Path) -> None:
    register(store, make_origin(tmp_path))
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        cancelled = await runs.cancel(run_id, "ops", reason="not needed")
        assert (cancelled.status, cancelled.reason) == ("cancelled", "not needed")
        length = len((await runs.journal(run_id))[0])
        assert (await runs.execute(run_id)).status == "cancelled"
        for operation in (runs.cancel(run_id, "ops"), runs.resume(run_id, "ops"), runs.handoff(run_id, "scripted")):
            with pytest.raises(RunStateError):
                await operation
        assert len((await runs.journal(run_id))[0]) == length
        retried = await runs.retry(run_id, "ops")
        assert (await runs.execute(retried)).status == "succeeded"

    run(scenario())


def test_cancelling_a_run_mid_implementation_stops_it_after_the_receipt_is_recorded(
        store: Store, tmp_path: Path) -> None:
    register(store, make_origin(tmp_path))
    operator = Runs(store, tmp_path / "ws", {}, owner="operator")

    async def cancel_while_working(workspace: Path, context: ImplementContext) -> ImplementResult:
        await operator.cancel(context.run_id, "ops", reason="changed our minds")
        (workspace / "calc.py").write_text(FIXED)
        return ImplementResult("done anyway")

    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [cancel_while_working])})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        state = await runs.execute(run_id)
        assert (state.status, state.reason) == ("cancelled", "changed our minds")
        assert state.finished is not None and state.finished["evidence"]["status_before"] == "running"
        entries, valid = await runs.journal(run_id)
        assert valid and not state.problems
        # The implementation's receipt is a fact and is recorded after the cancellation; nothing else runs.
        # The executing process then records that it stopped, which completes the cancellation request.
        assert types(entries)[-3:] == ["run.finished", "task.completed", "run.drained"]
        assert state.plan.tasks[1].status == "done" and state.plan.tasks[2].status == "pending"
        [request] = await runs.execution_requests(run_id)
        assert (request.kind, request.status, request.actor) == ("cancellation", "succeeded", "ops")
        assert request.receipt is not None and request.receipt["result"]["drained_by"] == runs.owner

    run(scenario())


def test_a_worker_fenced_out_mid_task_stops_without_writing_anything_more(tmp_path: Path, sqlite_path: Path) -> None:
    from jixu.errors import OwnershipLost
    from jixu.ledger import SQLiteStore
    from jixu.runs.model import run_lease_key

    store = SQLiteStore(sqlite_path)
    register(store, make_origin(tmp_path))

    async def fenced_out(workspace: Path, context: ImplementContext) -> ImplementResult:
        key = run_lease_key(context.run_id)
        lease = store.get_lease(key)
        assert lease is not None
        store.take_over_lease(key, "intruder", 30, expected_epoch=lease.epoch, require_expired=False)
        seen["length"] = len(store.read(run_stream(context.run_id)))
        return ImplementResult("late")

    seen: dict[str, int] = {}
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fenced_out])})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "fix add()", provider="scripted")
        with pytest.raises(OwnershipLost):
            await runs.execute(run_id)
        entries, valid = await runs.journal(run_id)
        assert valid and len(entries) == seen["length"] and entries[-1]["type"] == "task.dispatched"
        assert (await runs.state(run_id)).status == "running"  # the intruder holds a live lease

    run(scenario())
