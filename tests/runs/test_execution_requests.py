"""Execution requests: publication through git and a GitHub-shaped pull-request API, cancellation with proof of
drain, evidence-based reconciliation, and SIGKILL of the worker between a publication's dispatch and receipt.

Every test asserts how many pushes the origin received (a pre-receive hook counts them) and how many pull
requests the fake API was asked to create: never more than one per admitted attempt.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import (
    AlreadyReconciled,
    InvalidInput,
    ReconciliationNeedsProof,
    RequestNotFound,
    RequestStateError,
    RunStateError,
    UnknownProvider,
)
from jixu.ledger import SQLiteStore, Store
from jixu.runs import GitPublisher, PullRequestPublisher, Runs, ScriptedProvider, change_origin
from jixu.runs.workspace import remote_branch
from tests.helpers import python_env
from tests.runs.fake_github import TOKEN, FakeGitHub, count_pushes, pushes
from tests.runs.run_helpers import fix, git, make_origin, register, run

RECONCILE_A = "a" * 32
RECONCILE_B = "b" * 32
RECONCILE_C = "c" * 32


class Scene:
    """A SQLite ledger file, a bare origin counting pushes, a fake GitHub over it, a succeeded run."""

    def __init__(self, tmp_path: Path, *, succeed: bool = True) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "ledger.db"
        self.url = f"sqlite:///{self.db}"
        self.store: Store = SQLiteStore(self.db)
        self.origin = make_origin(tmp_path)
        self.push_log = count_pushes(self.origin)
        self.github = FakeGitHub("acme/calc", self.origin).start()
        self.root = tmp_path / "ws"
        register(self.store, self.origin)
        self.runs = self.service()
        self.run_id: str = run(self.runs.create_run("calc", "fix add()", provider="scripted"))
        if succeed:
            assert run(self.runs.execute(self.run_id)).status == "succeeded"

    def publishers(self) -> dict[str, Any]:
        return {"git": GitPublisher(), "github": PullRequestPublisher(self.github.url, "acme/calc", TOKEN,
                                                                       name="github")}

    def service(self, owner: str = "runner") -> Runs:
        return Runs(self.store, self.root, {"scripted": ScriptedProvider("scripted", [fix] * 5)}, owner=owner,
                    publishers=self.publishers(), lease_ttl=1.0, drain_timeout=5.0)

    def pushes(self) -> list[str]:
        return pushes(self.push_log)

    def journal_types(self) -> list[str]:
        return [e.type for e in self.store.read(f"run/{self.run_id}")]

    def request_types(self, request_id: str) -> list[str]:
        return [e.type for e in self.store.read(f"request/{request_id}")]

    def close(self) -> None:
        self.github.stop()


@pytest.fixture
def scene(tmp_path: Path) -> Any:
    made = Scene(tmp_path)
    yield made
    made.close()


# --- the crash child ---------------------------------------------------------------------------

CHILD = """
import asyncio, sys, time
from pathlib import Path
from jixu.ledger import open_store
from jixu.runs import GitPublisher, PullRequestPublisher, Runs
from jixu.runs import requests as requests_module

url, root, request_id, api, token, where, marker = sys.argv[1:8]

def hold(what):
    Path(marker).write_text(what)
    while True:
        time.sleep(0.05)

class Holding(PullRequestPublisher):
    async def publish(self, context):
        if where == "before_effect":
            hold("dispatched")
        evidence = await super().publish(context)
        if where == "after_effect":
            hold("published")
        return evidence

original = requests_module.RequestLog.append

def append(self, events):
    if where == "before_request_receipt" and any(e.type == "publication.completed" for e in events):
        hold("journal receipt recorded")
    return original(self, events)

requests_module.RequestLog.append = append
publishers = {"git": GitPublisher(), "github": Holding(api, "acme/calc", token, name="github")}
runs = Runs(open_store(url), root, {}, owner="crash-worker", publishers=publishers)
asyncio.run(runs.execute_request(request_id))
"""


def crash_publication(scene: Scene, request_id: str, where: str) -> None:
    """A real worker process executes the request; SIGKILL it at ``where``."""
    marker = scene.tmp / f"reached-{where}"
    log = (scene.tmp / f"child-{where}.log").open("w")
    child = subprocess.Popen([sys.executable, "-c", CHILD, scene.url, str(scene.root), request_id, scene.github.url,
                              TOKEN, where, str(marker)], env=python_env(), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    deadline = time.monotonic() + 60
    while not marker.exists():
        assert child.poll() is None, (scene.tmp / f"child-{where}.log").read_text()
        assert time.monotonic() < deadline, f"the child never reached {where}"
        time.sleep(0.01)
    child.kill()
    child.wait()


# --- publication that works ---------------------------------------------------------------------


def test_git_publication_pushes_the_verified_tree_once_with_intent_dispatch_and_receipt_in_both_streams(
        scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="git", actor="alice"))
    assert run(scene.runs.execution_request(scene.run_id, request_id)).status == "pending"
    view = run(scene.runs.execute_request(request_id))
    assert view.status == "succeeded", view.reason
    assert (view.kind, view.attempt, view.actor) == ("publication", 1, "alice")
    assert view.chain_valid and scene.store.verify(f"request/{request_id}").valid
    assert scene.request_types(request_id) == ["request.admitted", "publication.requested", "publication.dispatched",
                                               "publication.completed"]
    # The run journal holds its own intent and receipt of the remote task, after the run finished.
    assert scene.journal_types()[-4:] == ["run.request_admitted", "task.requested", "task.dispatched",
                                          "task.completed"]
    assert scene.store.verify(f"run/{scene.run_id}").valid
    intent = view.intent or {}
    commit, branch = intent["args"]["commit"], intent["args"]["branch"]
    assert branch == f"jixu/{scene.run_id}"
    assert remote_branch(str(scene.origin), branch) == commit
    # The published commit holds exactly the verified tree on the source commit.
    state = run(scene.runs.state(scene.run_id))
    assert git("rev-parse", f"{commit}^{{tree}}", cwd=scene.origin) == view.admitted_source["tree"]
    assert git("rev-parse", f"{commit}^", cwd=scene.origin) == state.source["commit"]
    assert (view.receipt or {})["result"]["pushed_commit"] == commit
    # Executing again does nothing: the request is settled.
    assert run(scene.runs.execute_request(request_id)).status == "succeeded"
    assert scene.pushes() == [f"refs/heads/{branch} {commit}"]
    assert scene.github.creation_requests == 0
    # The run itself stays succeeded, and a second publication is refused (it was published).
    assert state.status == "succeeded"
    with pytest.raises(RequestStateError, match="already published"):
        run(scene.runs.request_publication(scene.run_id, publisher="git"))


def test_pull_request_publication_pushes_once_and_opens_one_pull_request(scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github", title="Fix add()"))
    view = run(scene.runs.execute_request(request_id))
    assert view.status == "succeeded", view.reason
    result = (view.receipt or {})["result"]
    assert result["pr_number"] == 1 and result["pr_url"] == "https://github.example/acme/calc/pull/1"
    [pull] = scene.github.pulls
    assert (pull["title"], pull["base"]["ref"], pull["head"]["ref"]) == ("Fix add()", "main", f"jixu/{scene.run_id}")
    assert pull["head"]["sha"] == result["pushed_commit"] == (view.intent or {})["args"]["commit"]
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1
    # A terminal worker receipt settles reconciliation; the same id returns the same retained result.
    first = run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A, actor="ops"))
    assert first["settled"] and first["outcome"] == "succeeded"
    again = run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A, actor="ops"))
    assert again == first
    with pytest.raises(AlreadyReconciled):
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_B))
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1


# --- SIGKILL between dispatch and receipt -------------------------------------------------------


@pytest.mark.crash
def test_killed_after_the_push_and_pull_request_nothing_settles_it_but_retained_evidence(scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    crash_publication(scene, request_id, "after_effect")
    view = run(scene.runs.execution_request(scene.run_id, request_id))
    assert view.status == "needs_reconciliation"
    assert (view.decision or {})["state"] == "unknown"
    branch, commit = (view.intent or {})["args"]["branch"], (view.intent or {})["args"]["commit"]
    # The push is visible on the origin and the pull request exists: mutable state, not proof.
    assert remote_branch(str(scene.origin), branch) == commit and len(scene.github.pulls) == 1
    with pytest.raises(ReconciliationNeedsProof) as refused:
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A, actor="ops"))
    retained = refused.value.details["result"]
    assert retained["settled"] is False and retained["outcome"] == "unknown"
    assert "no terminal receipt" in retained["reason"]
    with pytest.raises(ReconciliationNeedsProof) as again:
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A, actor="ops"))
    assert again.value.details["result"] == retained
    assert run(scene.runs.execution_request(scene.run_id, request_id)).status == "needs_reconciliation"
    # Nothing re-dispatches it: a worker executing the request again calls nothing.
    assert run(scene.service("another").execute_request(request_id)).status == "needs_reconciliation"
    # And no further attempt is admitted while this intent is unresolved.
    with pytest.raises(RequestStateError, match="unresolved"):
        run(scene.runs.request_publication(scene.run_id, publisher="github"))
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1
    # The operator inspects the provider (read-only); the finding is retained, then cited by a resolution.
    with pytest.raises(RequestStateError, match="inspect"):
        run(scene.runs.resolve_request_outcome(scene.run_id, request_id, "occurred", actor="ops"))
    found = run(scene.runs.inspect_remote(scene.run_id, request_id, actor="ops"))
    assert found["found"]["remote_commit"] == commit
    assert [p["number"] for p in found["found"]["pull_requests"]] == [1]
    # The inspection is the probe: it found the admitted branch at the intent's commit and a pull request with
    # that head, so it settles the request itself, citing what it compared.
    assert found["settled"] is True and found["evidence"]["shown"] is True
    resolved = run(scene.runs.execution_request(scene.run_id, request_id))
    assert resolved.status == "succeeded" and "probe:github" in resolved.reason
    assert scene.request_types(request_id)[-2:] == ["request.inspected", "publication.outcome_resolved"]
    [settling] = [e for e in scene.store.read(f"request/{request_id}") if e.type == "publication.outcome_resolved"]
    assert settling.data["actor"] == "probe:github" and settling.data["resolution"] == "occurred"
    assert settling.data["evidence"]["inspection_event_id"] == found["event_id"]
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1
    assert scene.store.verify(f"request/{request_id}").valid and scene.store.verify(f"run/{scene.run_id}").valid


@pytest.mark.crash
def test_killed_before_the_request_receipt_the_runs_intent_and_receipt_prove_it(scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    crash_publication(scene, request_id, "before_request_receipt")
    assert run(scene.runs.execution_request(scene.run_id, request_id)).status == "needs_reconciliation"
    assert scene.journal_types()[-1] == "task.completed"
    settled = run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A, actor="ops"))
    assert settled["settled"] and settled["outcome"] == "succeeded"
    assert [p["type"] for p in settled["proof"]] == ["task.requested", "task.completed"]
    assert settled["evidence"]["pr_url"] == "https://github.example/acme/calc/pull/1"
    assert settled["checked"]["project_authority"]["ok"] is True
    view = run(scene.runs.execution_request(scene.run_id, request_id))
    assert view.status == "succeeded"
    assert run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A)) == settled
    with pytest.raises(AlreadyReconciled):
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_B))
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1


@pytest.mark.crash
def test_killed_after_dispatch_before_the_push_stays_unknown_until_an_operator_resolves_it(scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    crash_publication(scene, request_id, "before_effect")
    assert run(scene.runs.execution_request(scene.run_id, request_id)).status == "needs_reconciliation"
    with pytest.raises(ReconciliationNeedsProof):
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A))
    assert scene.pushes() == [] and scene.github.creation_requests == 0
    found = run(scene.runs.inspect_remote(scene.run_id, request_id, actor="ops"))
    assert found["found"]["remote_commit"] is None and found["found"]["pull_requests"] == []
    view = run(scene.runs.resolve_request_outcome(scene.run_id, request_id, "not_occurred", actor="ops",
                                                  note="no branch, no pull request"))
    assert view.status == "failed"
    # Settled as not occurred: one more attempt may be admitted, and it publishes exactly once.
    retry_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    assert run(scene.runs.execute_request(retry_id)).status == "succeeded"
    assert [v.attempt for v in run(scene.runs.execution_requests(scene.run_id))] == [1, 2]
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1


# --- the failure rules ----------------------------------------------------------------------------


def test_rejections_before_dispatch_fail_the_request_and_at_most_three_attempts_are_admitted(scene: Scene) -> None:
    hidden = scene.origin.with_name("hidden.git")
    scene.origin.rename(hidden)  # the origin cannot be read: every preflight rejects
    for attempt in (1, 2, 3):
        request_id = run(scene.runs.request_publication(scene.run_id, publisher="git"))
        view = run(scene.runs.execute_request(request_id))
        assert (view.status, view.attempt) == ("failed", attempt)
        assert "rejected before dispatch" in view.reason
        assert scene.request_types(request_id) == ["request.admitted", "publication.requested", "publication.failed"]
    with pytest.raises(RequestStateError, match="3 publication attempts"):
        run(scene.runs.request_publication(scene.run_id, publisher="git"))
    hidden.rename(scene.origin)
    assert len(run(scene.runs.execution_requests(scene.run_id))) == 3
    assert scene.pushes() == [] and scene.github.creation_requests == 0


def test_a_failure_after_dispatch_keeps_the_outcome_unknown_whatever_the_error_says(scene: Scene) -> None:
    scene.github.fail_creations = True
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    view = run(scene.runs.execute_request(request_id))
    assert view.status == "needs_reconciliation"
    assert (view.receipt or {})["indeterminate"] is True and "500" in (view.receipt or {})["error"]["message"]
    with pytest.raises(RequestStateError, match="unresolved"):
        run(scene.runs.request_publication(scene.run_id, publisher="github"))
    with pytest.raises(ReconciliationNeedsProof):
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A))
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1


def test_an_existing_branch_at_another_commit_is_a_rejection_not_an_overwrite(scene: Scene) -> None:
    work = scene.tmp / "other"
    git("clone", "-q", str(scene.origin), str(work))
    (work / "other.txt").write_text("someone else's work\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "other", cwd=work)
    git("push", "-q", "origin", f"HEAD:refs/heads/jixu/{scene.run_id}", cwd=work)
    before = remote_branch(str(scene.origin), f"jixu/{scene.run_id}")
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="git"))
    view = run(scene.runs.execute_request(request_id))
    assert view.status == "failed" and "refusing to overwrite" in view.reason
    assert remote_branch(str(scene.origin), f"jixu/{scene.run_id}") == before
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 0  # the other clone's push only


def test_a_pull_request_token_without_push_permission_is_rejected_before_dispatch(scene: Scene) -> None:
    scene.github.can_push = False
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    view = run(scene.runs.execute_request(request_id))
    assert view.status == "failed" and "may not push" in view.reason
    assert scene.pushes() == [] and scene.github.creation_requests == 0


def test_changed_project_authority_blocks_admission_and_settlement(scene: Scene,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from jixu.runs import requests as requests_module

    request_id = run(scene.runs.request_publication(scene.run_id, publisher="git"))
    original = requests_module.RequestLog.append

    def stop_before_the_request_receipt(self: Any, events: list[Any]) -> Any:
        if any(e.type == "publication.completed" for e in events):
            raise SystemExit("the worker stops here")
        return original(self, events)

    monkeypatch.setattr(requests_module.RequestLog, "append", stop_before_the_request_receipt)
    with pytest.raises(SystemExit):
        run(scene.runs.execute_request(request_id))
    monkeypatch.setattr(requests_module.RequestLog, "append", original)
    # The project is re-pointed at another origin: the run's origin is no longer authorized.
    change_origin(scene.store, "calc", str(make_origin(scene.tmp, "elsewhere")), actor="admin")
    with pytest.raises(ReconciliationNeedsProof) as refused:
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A))
    assert "project authority" in refused.value.details["result"]["reason"]
    with pytest.raises(RequestStateError, match="authorizes origin"):
        run(scene.runs.request_publication(scene.run_id, publisher="git"))
    # Authority restored: the retained intent and receipt in the run's journal settle it (a new id).
    change_origin(scene.store, "calc", str(scene.origin), actor="admin")
    settled = run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_B))
    assert settled["settled"] and settled["checked"]["project_authority"]["ok"]
    assert len(scene.pushes()) == 1 and scene.github.creation_requests == 0


# --- cancellation -----------------------------------------------------------------------------------


def test_cancelling_an_idle_run_completes_with_a_drain_receipt(tmp_path: Path) -> None:
    scene = Scene(tmp_path, succeed=False)
    try:
        state = run(scene.runs.cancel(scene.run_id, "ops", reason="not needed"))
        assert state.status == "cancelled"
        [request] = run(scene.runs.execution_requests(scene.run_id))
        assert (request.kind, request.status) == ("cancellation", "succeeded")
        assert scene.journal_types()[-2:] == ["run.finished", "run.drained"]
        settled = run(scene.runs.reconcile_execution_request(scene.run_id, request.request_id, RECONCILE_A))
        assert settled["settled"]
        with pytest.raises(RunStateError):
            run(scene.runs.cancel(scene.run_id, "ops"))
        assert scene.pushes() == [] and scene.github.creation_requests == 0
    finally:
        scene.close()


CANCEL_CHILD = """
import asyncio, sys, time
from pathlib import Path
from jixu.ledger import open_store
from jixu.runs import ImplementResult, Runs, ScriptedProvider

url, root, run_id, marker = sys.argv[1:5]

def step(workspace, context):
    Path(marker).write_text("implementing")
    while True:
        time.sleep(0.05)

runs = Runs(open_store(url), root, {"scripted": ScriptedProvider("scripted", [step])}, owner="busy-worker",
            lease_ttl=1.0)
asyncio.run(runs.execute(run_id))
"""


@pytest.mark.crash
def test_cancellation_needs_a_receipt_proving_the_work_drained(tmp_path: Path) -> None:
    scene = Scene(tmp_path, succeed=False)
    try:
        marker = tmp_path / "implementing"
        child = subprocess.Popen([sys.executable, "-c", CANCEL_CHILD, scene.url, str(scene.root), scene.run_id,
                                  str(marker)], env=python_env(), start_new_session=True)
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        state = run(scene.runs.cancel(scene.run_id, "ops"))
        assert state.status == "cancelled"
        [request] = run(scene.runs.execution_requests(scene.run_id))
        assert request.status == "in_progress"  # the busy worker still holds the run
        with pytest.raises(ReconciliationNeedsProof) as refused:
            run(scene.runs.reconcile_execution_request(scene.run_id, request.request_id, RECONCILE_A))
        assert "drained" in refused.value.details["result"]["reason"]
        child.kill()
        child.wait()
        # Its lease expires by the store's clock; the request's worker observes the drain and records it.
        view = run(scene.runs.execute_request(request.request_id))
        assert view.status == "succeeded", view.reason
        assert scene.journal_types()[-1] == "run.drained"
        drained = [e for e in scene.store.read(f"run/{scene.run_id}") if e.type == "run.drained"]
        assert drained[0].data["lease"]["owner"] == "busy-worker"
        settled = run(scene.runs.reconcile_execution_request(scene.run_id, request.request_id, RECONCILE_B))
        assert settled["settled"] and settled["outcome"] == "succeeded"
        assert scene.pushes() == [] and scene.github.creation_requests == 0
    finally:
        scene.close()


# --- bad input changes nothing ------------------------------------------------------------------------


def test_bad_input_is_refused_with_typed_errors_and_writes_nothing(scene: Scene) -> None:
    with pytest.raises(UnknownProvider):
        run(scene.runs.request_publication(scene.run_id, publisher="gitlab"))
    with pytest.raises(InvalidInput) as bad_branch:
        run(scene.runs.request_publication(scene.run_id, publisher="git", branch="../main"))
    assert bad_branch.value.details["field"] == "branch"
    with pytest.raises(RequestNotFound):
        run(scene.runs.execution_request(scene.run_id, "0" * 26))
    assert run(scene.runs.execution_requests(scene.run_id)) == []
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="git"))
    head = scene.store.stream_info(f"run/{scene.run_id}").head_seq
    for bad in ("A" * 32, "a" * 31, "g" * 32, ""):
        with pytest.raises(InvalidInput) as refused:
            run(scene.runs.reconcile_execution_request(scene.run_id, request_id, bad))
        assert refused.value.details["field"] == "reconciliation_id"
    with pytest.raises(RequestStateError, match="not dispatched"):
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A))
    assert scene.store.stream_info(f"run/{scene.run_id}").head_seq == head
    assert scene.request_types(request_id) == ["request.admitted"]
    assert scene.pushes() == [] and scene.github.creation_requests == 0


def test_only_a_succeeded_run_is_published(tmp_path: Path) -> None:
    scene = Scene(tmp_path, succeed=False)
    try:
        with pytest.raises(RequestStateError, match="has not succeeded"):
            run(scene.runs.request_publication(scene.run_id, publisher="git"))
        assert run(scene.runs.execution_requests(scene.run_id)) == []
        assert scene.pushes() == [] and scene.github.creation_requests == 0
    finally:
        scene.close()
