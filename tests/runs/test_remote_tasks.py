"""Deploy, rollback and knowledge writes as remote tasks through a command provider: the provider-reported job id
or version is the evidence; a failure after dispatch stays unknown; SIGKILL between dispatch and receipt.

The provider is a real script (``deployer.py``) run as a subprocess. It appends one line per deployment it
performs to ``deployments.log`` and every test asserts how many there were.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import InvalidInput, ReconciliationNeedsProof, RequestStateError, UnknownProvider
from jixu.ledger import SQLiteStore
from jixu.runs import CommandRemote, Runs, ScriptedProvider
from tests.helpers import python_env
from tests.runs.run_helpers import fix, make_origin, register, run

DEPLOYER = """\
import json, os, sys, time
from pathlib import Path

mode = sys.argv[1]
log = Path(os.environ["DEPLOY_LOG"])
behaviour = os.environ.get("DEPLOY_BEHAVIOUR", "ok")
if mode == "preflight":
    if behaviour == "reject":
        print("the target environment is frozen", file=sys.stderr)
        sys.exit(3)
    sys.exit(0)
if mode == "inspect":
    lines = log.read_text().splitlines() if log.exists() else []
    print(json.dumps({"jobs": [json.loads(line) for line in lines]}))
    sys.exit(0)
number = len(log.read_text().splitlines()) + 1 if log.exists() else 1
record = {"job_id": f"job-{number}", "kind": os.environ["JIXU_TASK_KIND"], "run": os.environ["JIXU_RUN_ID"],
          "tree": os.environ["JIXU_SOURCE_TREE"], "key": os.environ["JIXU_IDEMPOTENCY_KEY"],
          "parameters": json.loads(os.environ["JIXU_PARAMETERS"])}
with log.open("a") as handle:
    handle.write(json.dumps(record) + "\\n")
hold = os.environ.get("DEPLOY_HOLD")
if hold:
    Path(hold + ".tmp").write_text(str(os.getpid()))  # the test kills this process (a session of its own)
    os.replace(hold + ".tmp", hold)  # appears whole
    while Path(hold).exists():  # or lets it finish, by removing the file
        time.sleep(0.05)
if behaviour == "fail_after":
    print("gateway timeout", file=sys.stderr)
    sys.exit(1)
if behaviour == "no_id":
    print("done")
    sys.exit(0)
print(json.dumps({"job_id": record["job_id"]}))
"""
RECONCILE = "d" * 32


class Scene:
    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "ledger.db"
        self.store = SQLiteStore(self.db)
        self.script = tmp_path / "deployer.py"
        self.script.write_text(DEPLOYER)
        self.log = tmp_path / "deployments.log"
        monkeypatch.setenv("DEPLOY_LOG", str(self.log))
        register(self.store, make_origin(tmp_path))
        self.runs = self.service()
        self.run_id: str = run(self.runs.create_run("calc", "fix add()", provider="scripted"))
        assert run(self.runs.execute(self.run_id)).status == "succeeded"

    def remotes(self, kinds: tuple[str, ...] = ("deploy", "rollback", "knowledge_write")) -> dict[str, Any]:
        return {"deployer": CommandRemote("deployer", [sys.executable, str(self.script)], kinds=kinds,
                                          env={"DEPLOY_TOKEN": "secret"}, timeout_s=60)}

    def service(self, kinds: tuple[str, ...] = ("deploy", "rollback", "knowledge_write")) -> Runs:
        return Runs(self.store, self.tmp / "ws", {"scripted": ScriptedProvider("scripted", [fix])},
                    remotes=self.remotes(kinds))

    def executing(self, request_id: str, code: str, **options: Any) -> tuple[subprocess.Popen[str], Path]:
        """A child process executing ``request_id`` with ``code`` (its own session), returned once its deploy
        command holds (the hold file appeared), with that file."""
        hold = self.tmp / "deployed"
        child = subprocess.Popen([sys.executable, "-c", code, f"sqlite:///{self.db}", str(self.tmp / "ws"),
                                  request_id, str(self.script)],
                                 env={**python_env(), "DEPLOY_LOG": str(self.log), "DEPLOY_HOLD": str(hold)},
                                 start_new_session=True, text=True, **options)
        deadline = time.monotonic() + 60
        while not hold.exists():
            assert child.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        return child, hold

    def deployments(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.log.read_text().splitlines()] if self.log.exists() else []


@pytest.fixture
def scene(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Scene:
    return Scene(tmp_path, monkeypatch)


def test_a_deploy_records_the_provider_job_id_as_its_evidence(scene: Scene) -> None:
    request_id = run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer",
                                               parameters={"environment": "staging"}, actor="alice"))
    view = run(scene.runs.execute_request(request_id))
    assert view.status == "succeeded", view.reason
    assert (view.receipt or {})["result"]["job_id"] == "job-1"
    [deployed] = scene.deployments()
    assert deployed["parameters"] == {"environment": "staging"} and deployed["kind"] == "deploy"
    assert deployed["tree"] == view.admitted_source["tree"]
    assert deployed["key"] == (view.intent or {})["idempotency_key"]
    journal = [e.type for e in scene.store.read(f"run/{scene.run_id}")]
    assert journal[-4:] == ["run.request_admitted", "task.requested", "task.dispatched", "task.completed"]
    settled = run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE))
    assert settled["settled"] and settled["outcome"] == "succeeded"
    # The provider's settings are recorded without the secret's value.
    assert view.target["settings"]["env"] == ["DEPLOY_TOKEN"] and "secret" not in json.dumps(view.to_dict())
    with pytest.raises(RequestStateError, match="already had a successful deploy"):
        run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer"))
    # Another kind of remote task is its own history.
    rollback = run(scene.runs.request_remote(scene.run_id, "rollback", provider="deployer",
                                             parameters={"to_version": "v41"}))
    assert run(scene.runs.execute_request(rollback)).status == "succeeded"
    assert [d["kind"] for d in scene.deployments()] == ["deploy", "rollback"]


def test_a_failure_after_dispatch_stays_unknown_until_inspected_and_resolved(scene: Scene,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_BEHAVIOUR", "fail_after")
    request_id = run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer"))
    view = run(scene.runs.execute_request(request_id))
    assert view.status == "needs_reconciliation" and (view.receipt or {})["indeterminate"] is True
    with pytest.raises(ReconciliationNeedsProof):
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE))
    with pytest.raises(RequestStateError, match="unresolved"):
        run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer"))
    found = run(scene.runs.inspect_remote(scene.run_id, request_id, actor="ops"))
    assert [job["job_id"] for job in found["found"]["reported"]["jobs"]] == ["job-1"]
    # The provider reports job-1 under this task's idempotency key: the inspection (the probe) settles it.
    assert found["settled"] is True and found["evidence"]["compared"]["job"]["job_id"] == "job-1"
    resolved = run(scene.runs.execution_request(scene.run_id, request_id))
    assert resolved.status == "succeeded" and "probe:deployer" in resolved.reason
    assert len(scene.deployments()) == 1


def test_a_perform_without_a_job_id_or_version_is_not_a_receipt(scene: Scene,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_BEHAVIOUR", "no_id")
    request_id = run(scene.runs.request_remote(scene.run_id, "knowledge_write", provider="deployer",
                                               parameters={"document": "runbook"}))
    view = run(scene.runs.execute_request(request_id))
    assert view.status == "needs_reconciliation" and "no job_id or version" in (view.receipt or {})["error"]["message"]
    assert len(scene.deployments()) == 1


def test_preflight_rejections_fail_and_at_most_three_attempts_are_admitted(scene: Scene,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_BEHAVIOUR", "reject")
    for attempt in (1, 2, 3):
        request_id = run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer"))
        view = run(scene.runs.execute_request(request_id))
        assert (view.status, view.attempt) == ("failed", attempt) and "frozen" in view.reason
    with pytest.raises(RequestStateError, match="3 deploy attempts"):
        run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer"))
    assert scene.deployments() == []


def test_a_provider_refuses_kinds_it_was_not_configured_for(scene: Scene) -> None:
    runs = scene.service(kinds=("deploy",))
    request_id = run(runs.request_remote(scene.run_id, "rollback", provider="deployer"))
    assert run(runs.execute_request(request_id)).status == "failed"
    with pytest.raises(UnknownProvider):
        run(runs.request_remote(scene.run_id, "deploy", provider="nope"))
    for kind, parameters in (("publish", None), ("deploy", ["not", "an", "object"])):
        with pytest.raises(InvalidInput):
            run(runs.request_remote(scene.run_id, kind, provider="deployer", parameters=parameters))  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        CommandRemote("bad", [])
    with pytest.raises(InvalidInput):
        CommandRemote("bad", ["true"], kinds=("publish",))
    assert scene.deployments() == []


CHILD = """
import asyncio, sys
from jixu.ledger import open_store
from jixu.runs import CommandRemote, Runs

url, root, request_id, script = sys.argv[1:5]
runs = Runs(open_store(url), root, {}, owner="crash-worker",
            remotes={"deployer": CommandRemote("deployer", [sys.executable, script], timeout_s=120)})
asyncio.run(runs.execute_request(request_id))
"""


@pytest.mark.crash
def test_sigkill_between_dispatch_and_receipt_leaves_the_deploy_unknown(scene: Scene,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    request_id = run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer"))
    child, hold = scene.executing(request_id, CHILD)
    os.killpg(child.pid, signal.SIGKILL)  # the worker and the deploy command it started
    child.wait()
    with contextlib.suppress(ProcessLookupError):  # the deploy command's own session outlives the worker's group
        os.kill(int(hold.read_text()), signal.SIGKILL)
    view = run(scene.runs.execution_request(scene.run_id, request_id))
    assert view.status == "needs_reconciliation" and (view.decision or {})["reason"] == "dispatched_without_receipt"
    with pytest.raises(ReconciliationNeedsProof) as refused:
        run(scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE))
    assert "no terminal receipt" in refused.value.details["result"]["reason"]
    assert run(scene.service().execute_request(request_id)).status == "needs_reconciliation"  # never redone
    assert len(scene.deployments()) == 1
    assert scene.store.verify(f"request/{request_id}").valid and scene.store.verify(f"run/{scene.run_id}").valid


def test_a_stopping_worker_cuts_off_a_remote_call_at_its_drain_timeout_and_requeues_the_request(
        scene: Scene, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker asked to stop while a deploy runs waits for it within its drain timeout only, then cancels it:
    the provider's process group is killed, the call's outcome is recorded unknown (it was dispatched), the
    request's item goes back in the queue, and the worker exits in time. Before, the drain did not reach
    execution requests: the worker waited for the deploy's own timeout, past any supervisor's patience."""
    import asyncio

    from jixu.scheduling import Worker, WorkerConfig

    hold = tmp_path / "deployer.pid"
    monkeypatch.setenv("DEPLOY_HOLD", str(hold))
    (tmp_path / "held_remotes.py").write_text(
        "import sys\nfrom jixu.runs import CommandRemote\n\n\ndef remotes():\n"
        f"    return {{'deployer': CommandRemote('deployer', [sys.executable, {str(scene.script)!r}], timeout_s=600)}}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    request_id = run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer",
                                               parameters={"environment": "staging"}, actor="alice"))
    # The providers are given in-process; their spec is only named in the operator commands it prints.
    config = WorkerConfig(store_url=str(scene.store.url), providers="given:in-process", owner="drained",
                          poll_interval=0.02, lease_ttl=2.0,
                          drain_timeout=2.0, workspace_root=str(tmp_path / "ws"), remotes="held_remotes:remotes")
    reports: list[tuple[str, str]] = []
    worker = Worker(None, scene.store, config, providers={"scripted": ScriptedProvider("scripted", [fix])},
                    report=lambda kind, text: reports.append((kind, text)))

    async def main() -> float:
        running = asyncio.create_task(worker.run())
        while not hold.exists():
            assert not running.done(), reports
            await asyncio.sleep(0.02)
        asked = time.monotonic()
        worker.stop("SIGTERM received")
        await asyncio.wait_for(running, 15)
        return time.monotonic() - asked

    try:
        took = asyncio.run(main())
    finally:
        if hold.exists():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(hold.read_text()), signal.SIGKILL)
    assert took < config.drain_timeout + 1.0, (took, reports)
    with pytest.raises(ProcessLookupError):
        os.kill(int(hold.read_text()), 0)  # the deploy's process is gone, not left running
    assert ("requeue", f"request/{request_id}: cut off by the drain; the request continues elsewhere (requeued)") \
        in reports, reports
    assert [item.key for item in scene.store.list_work(state="pending")] == [f"request/{request_id}"]
    assert not scene.store.list_work(state="claimed")
    view = run(scene.runs.execution_request(scene.run_id, request_id))
    assert view.status in ("unknown", "needs_reconciliation"), view.status
    assert len(scene.deployments()) == 1, "performed once, never again by the drain"


@pytest.mark.crash
def test_a_deploy_in_progress_in_another_process_is_shown_so_and_nobody_settles_it_meanwhile(
        scene: Scene) -> None:
    """While another process still performs the deploy, the request showed ``needs_reconciliation``: an inspection
    found nothing yet, ``not_occurred`` was accepted, a second deploy was admitted and run, and the first one's
    receipt was then refused. The executor's claim on the request (taken before its dispatch marker, renewed until
    its receipt) keeps it ``in_progress``; inspect, resolve and reconcile are refused (RequestOwned) and the
    deploy's own receipt settles it."""
    from jixu.errors import RequestOwned

    request_id = run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer"))
    child, hold = scene.executing(request_id, CHILD)
    try:
        view = run(scene.runs.execution_request(scene.run_id, request_id))
        assert view.status == "in_progress" and f"being carried out by crash-worker:{child.pid}" in view.reason, view.reason
        for operation in (lambda: scene.runs.inspect_remote(scene.run_id, request_id),
                          lambda: scene.runs.resolve_request_outcome(scene.run_id, request_id, "not_occurred"),
                          lambda: scene.runs.reconcile_execution_request(scene.run_id, request_id, RECONCILE)):
            with pytest.raises(RequestOwned):
                run(operation())
        assert run(scene.service().execute_request(request_id)).status == "in_progress"
        hold.unlink()  # the deploy goes on to its answer
        assert child.wait(60) == 0
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    view = run(scene.runs.execution_request(scene.run_id, request_id))
    assert view.status == "succeeded" and (view.receipt or {})["result"]["job_id"] == "job-1", view.reason
    assert len(scene.deployments()) == 1
    assert scene.store.get_lease(f"request/{request_id}/execution").released


CHILD_SHORT_CLAIM = """
import asyncio, sys
import jixu.runs.requests.execution as execution
from jixu.ledger import open_store
from jixu.runs import CommandRemote, Runs

execution.DEFAULT_LEASE_TTL = 0.6  # a claim that lapses while this process is stopped for a second
url, root, request_id, script = sys.argv[1:5]
runs = Runs(open_store(url), root, {}, owner="stopped-worker",
            remotes={"deployer": CommandRemote("deployer", [sys.executable, script], timeout_s=120)})
try:
    asyncio.run(runs.execute_request(request_id))
except BaseException as error:
    print("RAISED", type(error).__name__, getattr(error, "code", ""), flush=True)
    raise SystemExit(3)
"""


@pytest.mark.crash
def test_a_claim_lost_while_the_provider_works_ends_the_call_unknown_with_a_typed_error(scene: Scene) -> None:
    """The executor is stopped past its claim on the request, then goes on: its heartbeat finds the claim lost and
    cuts the call off (recorded unknown). It raised a bare CancelledError (a traceback from the CLI, "cut off by
    the drain" in a worker's log); it raises OwnershipLost, typed."""
    request_id = run(scene.runs.request_remote(scene.run_id, "deploy", provider="deployer"))
    child, hold = scene.executing(request_id, CHILD_SHORT_CLAIM, stdout=subprocess.PIPE)
    try:
        os.kill(child.pid, signal.SIGSTOP)
        time.sleep(1.5)  # past the claim
        os.kill(child.pid, signal.SIGCONT)
        out, _ = child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int(hold.read_text()), signal.SIGKILL)  # the deploy command, in a session of its own
    assert "RAISED OwnershipLost ownership_lost" in out, out
    view = run(scene.runs.execution_request(scene.run_id, request_id))
    assert view.status == "needs_reconciliation", view.reason
