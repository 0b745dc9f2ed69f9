"""A cancellation whose process is SIGKILLed between its dispatch marker (``cancellation.dispatched``) and the
one write that is its effect (``run.finished`` naming the request), and an ``execute`` during an automatic pause.

While the cancellation is in doubt nothing acts on the run as if it were not cancelled: ``execute``, ``resume``
and ``handoff`` refuse, naming the request and the command that settles it, and an operator cannot assert its
outcome. The run's journal shows whether the effect happened; a run finishes once, so the request's worker or a
reconciliation completes it without ever doing it twice. A run that finished otherwise meanwhile settles the
request as failed, the journal's ``run.finished`` its proof.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import RequestStateError, ResolutionNeedsEvidence, RunStateError
from jixu.ledger import SQLiteStore, Store
from jixu.runs import ImplementContext, ImplementResult, ProviderError, Runs, ScriptedProvider
from jixu.runs.operations import next_operations
from tests.helpers import python_env
from tests.runs.run_helpers import fix, make_origin, register, run

RECONCILE_A = "a" * 32
RECONCILE_B = "b" * 32

CANCELLER = """
import asyncio, sys, time
from pathlib import Path
from jixu.ledger import open_store
from jixu.runs import Runs
from jixu.runs.journal import RunLog

url, root, run_id, marker = sys.argv[1:5]
original = RunLog.append

def append(self, events, *args, **kwargs):
    if any(e.type == "run.finished" for e in events):
        # The request's dispatch marker is committed; its effect, run.finished, is not: hold here to be killed.
        Path(marker).write_text("dispatched")
        while True:
            time.sleep(0.05)
    return original(self, events, *args, **kwargs)

RunLog.append = append
runs = Runs(open_store(url), root, {}, owner="canceller")
asyncio.run(runs.cancel(run_id, "ops", reason="stop it"))
"""


class Scene:
    """A SQLite ledger file, a bare origin, a registered project and a created (queued) run."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "ledger.db"
        self.url = f"sqlite:///{self.db}"
        self.store: Store = SQLiteStore(self.db)
        register(self.store, make_origin(tmp_path))
        self.root = tmp_path / "ws"
        self.runs = self.service("operator")
        self.run_id: str = run(self.runs.create_run("calc", "fix add()", provider="scripted"))

    def service(self, owner: str, steps: list[Any] | None = None, **options: Any) -> Runs:
        return Runs(self.store, self.root, {"scripted": ScriptedProvider("scripted", steps or [fix] * 3)},
                    owner=owner, lease_ttl=1.0, drain_timeout=5.0, **options)

    def journal(self) -> list[Any]:
        return self.store.read(f"run/{self.run_id}")

    def request_events(self, request_id: str) -> list[Any]:
        return self.store.read(f"request/{request_id}")

    def kill_canceller(self) -> str:
        """A real ``runs.cancel`` in a child process, SIGKILLed after its dispatch marker; the request id."""
        marker = self.tmp / "dispatched"
        out = (self.tmp / "canceller.log").open("w")
        child = subprocess.Popen([sys.executable, "-c", CANCELLER, self.url, str(self.root), self.run_id,
                                  str(marker)], env=python_env(), stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        deadline = time.monotonic() + 60
        while not marker.exists():
            assert child.poll() is None, (self.tmp / "canceller.log").read_text()
            assert time.monotonic() < deadline, "the canceller never reached its dispatch marker"
            time.sleep(0.01)
        child.kill()
        child.wait()
        out.close()
        [request] = run(self.runs.execution_requests(self.run_id))
        assert [e.type for e in self.request_events(request.request_id)] == [
            "request.admitted", "cancellation.requested", "cancellation.dispatched"]
        assert "run.finished" not in [e.type for e in self.journal()]
        assert request.status == "needs_reconciliation"
        return str(request.request_id)


@pytest.fixture
def scene(tmp_path: Path) -> Scene:
    return Scene(tmp_path)


def _finished(scene: Scene) -> list[Any]:
    return [e for e in scene.journal() if e.type == "run.finished"]


@pytest.mark.crash
def test_an_in_doubt_cancellation_blocks_the_run_until_reconciliation_completes_it(scene: Scene) -> None:
    request_id = scene.kill_canceller()
    before = (len(scene.journal()), len(scene.request_events(request_id)))
    worker = scene.service("worker")
    # Every surface says so and offers only what settles it (the Studio and `runs show` offered execute, resume,
    # hand off and cancel, all refused).
    blocked = run(worker.state(scene.run_id))
    assert blocked.blocked is not None and blocked.blocked["by"] == "cancellation"
    assert blocked.blocked["request_id"] == request_id and blocked.to_dict()["blocked"] == blocked.blocked
    assert [op["operation"] for op in next_operations(blocked, "ops.db")] == ["reconcile-execution-request"]
    # Nothing acts on the run as if it were not cancelled: each refusal names the request and what settles it.
    for operation, what in ((worker.execute(scene.run_id), "executed"),
                            (worker.resume(scene.run_id, "ops"), "resumed"),
                            (worker.handoff(scene.run_id, "scripted", "ops"), "handed off")):
        with pytest.raises(RunStateError) as refused:
            run(operation)
        assert f"cannot be {what}" in refused.value.message and request_id in refused.value.message
        assert refused.value.details["request_id"] == request_id
        assert refused.value.details["command"].startswith("jixu runs reconcile-execution-request STORE ")
    # Nor is its outcome asserted by an operator, nor another cancellation admitted beside it.
    for resolution in ("not_occurred", "occurred", "abandoned_unknown"):
        with pytest.raises(RequestStateError, match="never finished"):
            run(scene.runs.resolve_request_outcome(scene.run_id, request_id, resolution, note="guess"))
    with pytest.raises(RequestStateError, match="reconcile-execution-request") as again:
        run(scene.runs.cancel(scene.run_id, "ops"))
    assert again.value.details["request_id"] == request_id
    assert (len(scene.journal()), len(scene.request_events(request_id))) == before, "every refusal wrote nothing"

    # Reconciliation re-observes the journal: no run.finished, so the effect did not happen; it completes it.
    settled = run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A, actor="ops"))
    assert settled["settled"] and settled["outcome"] == "succeeded", settled
    [finished] = _finished(scene)
    assert finished.data["outcome"] == "cancelled" and finished.data["request_id"] == request_id
    assert finished.data["reason"] == "stop it" and finished.data["actor"] == "ops"
    assert finished.data["evidence"]["completed_by"] == {"by": "ops", "trigger": "reconciliation",
                                                          "reconciliation_id": RECONCILE_A}
    assert [e.type for e in scene.journal()][-2:] == ["run.finished", "run.drained"]
    assert run(scene.runs.execution_request(scene.run_id, request_id)).status == "succeeded"
    assert run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A)) == settled
    length = len(scene.journal())
    state = run(worker.execute(scene.run_id))
    assert state.status == "cancelled" and len(scene.journal()) == length and state.blocked is None
    assert not [e for e in scene.journal() if e.type.startswith("task.")], "the cancelled run never ran"
    assert scene.store.verify(f"run/{scene.run_id}").valid and scene.store.verify(f"request/{request_id}").valid


@pytest.mark.crash
def test_the_requests_worker_completes_an_in_doubt_cancellation_once(scene: Scene) -> None:
    request_id = scene.kill_canceller()
    view = run(scene.service("worker").execute_request(request_id))
    assert view.status == "succeeded", view.reason
    [finished] = _finished(scene)
    assert finished.data["request_id"] == request_id
    assert finished.data["evidence"]["completed_by"] == {"by": "worker", "trigger": "execute"}
    assert run(scene.runs.state(scene.run_id)).status == "cancelled"
    # Executed again, or reconciled: observed, never done twice.
    assert run(scene.service("another").execute_request(request_id)).status == "succeeded"
    settled = run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_A))
    assert settled["settled"] and settled["outcome"] == "succeeded"
    assert len(_finished(scene)) == 1
    assert [e.type for e in scene.journal()].count("run.drained") == 1


@pytest.mark.crash
def test_a_run_that_finished_otherwise_settles_the_in_doubt_cancellation_as_failed(scene: Scene) -> None:
    """The canceller is killed while another process executes the run; the executor finishes the run."""
    killed: list[str] = []

    async def cancelled_meanwhile(workspace: Path, context: ImplementContext) -> ImplementResult:
        import asyncio

        killed.append(await asyncio.to_thread(scene.kill_canceller))
        return fix(workspace, context)

    state = run(scene.service("executor", [cancelled_meanwhile]).execute(scene.run_id))
    assert state.status == "succeeded", state.reason
    [request_id] = killed
    assert run(scene.runs.execution_request(scene.run_id, request_id)).status == "needs_reconciliation"
    with pytest.raises(ResolutionNeedsEvidence, match="without this request"):  # the journal contradicts it
        run(scene.runs.resolve_request_outcome(scene.run_id, request_id, "occurred", note="guess"))
    settled = run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE_B, actor="ops"))
    assert settled["settled"] and settled["outcome"] == "failed", settled
    [finished] = _finished(scene)
    assert finished.data["outcome"] == "succeeded"
    assert settled["proof"] == [{"stream": f"run/{scene.run_id}", "seq": finished.seq, "type": "run.finished"}]
    view = run(scene.runs.execution_request(scene.run_id, request_id))
    assert view.status == "failed"
    assert [e.type for e in scene.request_events(request_id)][-2:] == [
        "cancellation.outcome_resolved", "request.reconciled"]
    assert run(scene.runs.state(scene.run_id)).status == "succeeded"


def test_execute_during_an_automatic_pause_it_does_not_wait_for_writes_nothing(scene: Scene) -> None:
    limited = ProviderError("429 Too Many Requests", kind="rate_limit", retry_after=3600)
    first = scene.service("w0", [limited, fix], wait_automatic_pauses=False)
    state = run(first.execute(scene.run_id))
    assert (state.status, state.pause_reason) == ("paused", "rate_limit")
    entries = [e.id for e in scene.journal()]
    work = scene.store.list_work()
    lease = scene.store.get_lease(f"run/{scene.run_id}/owner")
    for owner in ("w0", "w1", "w2", "w3", "w4"):  # the same owner again, and others
        state = run(scene.service(owner, [fix], wait_automatic_pauses=False).execute(scene.run_id))
        assert (state.status, state.pause_reason) == ("paused", "rate_limit")
    assert [e.id for e in scene.journal()] == entries, "no run.claimed (or anything else) while paused"
    assert scene.store.list_work() == work and scene.store.get_lease(f"run/{scene.run_id}/owner") == lease
