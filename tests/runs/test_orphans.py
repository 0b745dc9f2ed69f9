"""No orphaned agents, and cancellations settled once their executor is provably gone (issue 23).

A real worker process executes a run whose provider is a real agent CLI (``CommandProvider`` starting a
``python -c`` agent that keeps writing a file, with a child of its own that ignores SIGTERM). The worker is
SIGKILLed; the agent, in a session of its own, outlives it. On SQLite and PostgreSQL:

* a cancellation's ``run.drained`` receipt is written only once no process of the agent's group remains
  (checked here with ``/proc``, not with the code under test);
* resume refuses while the old agent lives, and ``stop_agents`` stops it (SIGTERM, then SIGKILL) first;
* a cancellation whose executor was SIGKILLed settles through reconcile, without any worker.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import AgentStillRunning, ReconciliationNeedsProof
from jixu.ledger import Store
from jixu.runs import CommandProvider, Runs, ScriptedProvider
from jixu.server.problems import status_of
from tests.conftest import StoreFactory
from tests.helpers import python_env, run_jixu
from tests.runs.run_helpers import FIXED, make_origin, register, run

pytestmark = pytest.mark.crash

AGENT = """
import os, signal, subprocess, sys, time
d = os.environ["AGENT_DIR"]
hold, writes = os.path.join(d, "hold"), os.path.join(d, "writes")
CHILD = '''
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
hold, writes = sys.argv[1], sys.argv[2]
while os.path.exists(hold):
    with open(writes, "a") as f:
        f.write("child\\\\n")
    time.sleep(0.02)
'''
child = subprocess.Popen([sys.executable, "-c", CHILD, hold, writes])
with open(os.path.join(d, "pids"), "a") as f:
    f.write(f"{os.getpid()} {child.pid}\\n")
while os.path.exists(hold):
    with open(writes, "a") as f:
        f.write("agent\\n")
    time.sleep(0.02)
child.wait()
with open("calc.py", "w") as f:
    f.write("def add(a, b):\\n    return a + b\\n")
print("fixed add")
"""

WORKER = """
import asyncio, sys
from jixu.ledger import open_store
from jixu.runs import CommandProvider, Runs, ScriptedProvider
from jixu.server.problems import status_of
url, root, run_id, agent, agent_dir, busy = sys.argv[1:7]
if busy == "scripted":
    import time
    from pathlib import Path
    from jixu.runs import ScriptedProvider
    def step(workspace, context):
        Path(agent_dir, "implementing").write_text("yes")
        while True:
            time.sleep(0.05)
    provider = ScriptedProvider("scripted", [step])
else:
    provider = CommandProvider("agent", [sys.executable, "-c", agent], env={"AGENT_DIR": agent_dir})
runs = Runs(open_store(url), root, {provider.name: provider}, owner="worker-1", lease_ttl=30.0)
asyncio.run(runs.execute(run_id))
"""


def running(pid: int) -> bool:
    """Whether ``pid`` is a running process (a zombie has exited), read from /proc."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


class Scene:
    """A store (SQLite or PostgreSQL), an origin, a run whose provider is the agent CLI above."""

    def __init__(self, tmp_path: Path, stores: StoreFactory, provider: str = "agent") -> None:
        assert stores.url is not None
        self.tmp, self.url, self.store = tmp_path, stores.url, stores()
        self.root = tmp_path / "ws"
        self.agent_dir = tmp_path / "agent"
        self.agent_dir.mkdir()
        self.hold = self.agent_dir / "hold"
        self.hold.touch()
        register(self.store, make_origin(tmp_path))
        self.runs = self.service()
        self.run_id: str = run(self.runs.create_run("calc", "fix add()", provider=provider))
        self.worker: subprocess.Popen[bytes] | None = None

    def provider(self) -> CommandProvider:
        return CommandProvider("agent", [sys.executable, "-c", AGENT], env={"AGENT_DIR": str(self.agent_dir)})

    def service(self, store: Store | None = None) -> Runs:
        return Runs(store or self.store, self.root, {"agent": self.provider(),
                                                     "scripted": ScriptedProvider("scripted", [])}, owner="operator-side",
                    drain_timeout=5.0, stop_grace=0.5)

    def start_worker(self, busy: str = "agent") -> None:
        """A real worker process (a session of its own) executing the run."""
        log = (self.tmp / "worker.log").open("w")
        self.worker = subprocess.Popen([sys.executable, "-c", WORKER, self.url, str(self.root), self.run_id, AGENT,
                                        str(self.agent_dir), busy], env=python_env(), stdout=log,
                                       stderr=subprocess.STDOUT, start_new_session=True)

    def wait_for(self, path: Path) -> None:
        deadline = time.monotonic() + 60
        while not path.exists() or not path.read_text().strip():
            assert self.worker is not None and self.worker.poll() is None, (self.tmp / "worker.log").read_text()
            assert time.monotonic() < deadline, f"never saw {path}"
            time.sleep(0.01)

    def kill_worker(self) -> None:
        """SIGKILL the worker process alone (as the OOM killer or a lost machine would)."""
        assert self.worker is not None
        os.kill(self.worker.pid, signal.SIGKILL)
        self.worker.wait(30)

    def agent_pids(self) -> list[int]:
        return [int(p) for line in (self.agent_dir / "pids").read_text().splitlines() for p in line.split()]

    def writes(self) -> int:
        path = self.agent_dir / "writes"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def still_writing(self) -> bool:
        before = self.writes()
        time.sleep(0.3)
        return self.writes() > before

    def journal(self) -> list[Any]:
        return list(self.store.read(f"run/{self.run_id}"))

    def cleanup(self) -> None:
        self.hold.unlink(missing_ok=True)
        if self.worker is not None and self.worker.poll() is None:
            self.worker.kill()
        pids = self.agent_pids() if (self.agent_dir / "pids").exists() else []
        for pid in pids:
            if running(pid):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(params=["sqlite", "postgres"])
def scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    made = Scene(tmp_path, request.getfixturevalue(request.param))
    yield made
    made.cleanup()


@pytest.fixture(params=["sqlite", "postgres"])
def busy_scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    """A run whose (scripted, in-process) implementation never returns: its executor stays busy."""
    made = Scene(tmp_path, request.getfixturevalue(request.param), provider="scripted")
    yield made
    made.cleanup()


def _agent_outlives_its_worker(scene: Scene) -> list[int]:
    scene.start_worker()
    scene.wait_for(scene.agent_dir / "pids")
    scene.wait_for(scene.agent_dir / "writes")
    scene.kill_worker()
    pids = scene.agent_pids()
    assert len(pids) == 2 and all(running(pid) for pid in pids)
    assert scene.still_writing(), "the agent should outlive its SIGKILLed worker (a session of its own)"
    [started] = [e for e in scene.journal() if e.type == "run.process_started"]
    assert started.data["what"] == "provider agent" and started.data["process"]["pid"] == pids[0]
    return pids


def test_no_agent_process_survives_a_drained_receipt(scene: Scene) -> None:
    pids = _agent_outlives_its_worker(scene)
    state = run(scene.runs.cancel(scene.run_id, "ops", reason="stop it"))
    assert state.status == "cancelled"
    [request] = run(scene.runs.execution_requests(scene.run_id))
    assert request.status == "succeeded", request.reason
    journal = scene.journal()
    types = [e.type for e in journal]
    assert types[-3:] == ["run.finished", "run.process_stopped", "run.drained"]
    # The receipt exists, so nothing of the run may run: the agent and its TERM-ignoring child are gone.
    assert not any(running(pid) for pid in pids)
    assert not scene.still_writing()
    stopped = journal[-2].data
    assert stopped["outcome"] == "killed" and stopped["signals"] == ["SIGTERM", "SIGKILL"]
    assert sorted(stopped["members"]) == sorted(pids)
    drained = journal[-1].data
    assert drained["processes_stopped"] == 1 and drained["lease"]["owner"] == "worker-1"
    assert drained["lease"]["gone"] == "the lease holder's process is proven gone"


def test_resume_refuses_while_the_old_agent_lives_and_stops_it_when_asked(scene: Scene) -> None:
    pids = _agent_outlives_its_worker(scene)
    assert run(scene.runs.state(scene.run_id)).status == "interrupted"
    head = len(scene.journal())
    with pytest.raises(AgentStillRunning) as refused:
        run(scene.runs.resume(scene.run_id, "ops"))
    assert f"pid {pids[0]}" in refused.value.message and "--stop-agents" in refused.value.message
    assert refused.value.details["processes"][0]["state"] == "alive" and status_of(refused.value) == 409
    assert len(scene.journal()) == head and all(running(pid) for pid in pids)  # nothing written, nothing stopped
    # What `jixu runs show` offers says so (an audit: it offered a plain resume, which was then refused).
    shown = run_jixu("runs", "show", scene.url, scene.run_id, "--json")
    offered = {op["operation"]: op for op in json.loads(shown.stdout)["next_operations"]}
    assert offered["resume"]["command"].endswith("--stop-agents") and "handoff" not in offered, offered
    assert str(pids[0]) in offered["resume"]["why"]
    assert run(scene.runs.execute(scene.run_id)).status == "interrupted"  # a worker starts nothing either
    assert len(scene.journal()) == head and scene.still_writing()
    run(scene.runs.resume(scene.run_id, "ops", stop_agents=True))
    assert not any(running(pid) for pid in pids) and not scene.still_writing()
    stopped = [e.data for e in scene.journal() if e.type == "run.process_stopped"]
    assert [(s["trigger"], s["outcome"]) for s in stopped] == [("resume", "killed")]
    # One agent at a time: the next attempt's agent runs alone and finishes the work.
    scene.hold.unlink()
    done = run(scene.runs.execute(scene.run_id))
    assert done.status == "succeeded", done.reason
    assert (Path(done.workspace) / "calc.py").read_text() == FIXED
    assert len((scene.agent_dir / "pids").read_text().splitlines()) == 2  # the first agent and its successor


def test_a_cancellation_whose_executor_was_sigkilled_settles_through_reconcile_without_a_worker(
        busy_scene: Scene) -> None:
    scene = busy_scene
    scene.start_worker(busy="scripted")
    scene.wait_for(scene.agent_dir / "implementing")
    state = run(scene.runs.cancel(scene.run_id, "ops"))
    assert state.status == "cancelled"
    [request] = run(scene.runs.execution_requests(scene.run_id))
    assert request.status == "in_progress"  # the executor is alive and holds the run
    with pytest.raises(ReconciliationNeedsProof) as refused:
        run(scene.runs.reconcile_execution_request(scene.run_id, request.request_id, "a" * 32))
    assert "still holds its lease" in refused.value.details["result"]["reason"]
    scene.kill_worker()
    # No worker, no execute-request: reconciliation sees the executor is gone (its recorded process is dead,
    # though its lease has 30 s left by the store's clock) and that nothing of the run runs.
    settled = run(scene.runs.reconcile_execution_request(scene.run_id, request.request_id, "b" * 32,
                                                         actor="ops"))
    assert settled["settled"] and settled["outcome"] == "succeeded"
    assert [p["type"] for p in settled["proof"]] == ["run.drained"]
    [drained] = [e.data for e in scene.journal() if e.type == "run.drained"]
    assert drained["trigger"] == "reconciliation" and drained["by"] == "ops"
    assert drained["lease"]["gone"] == "the lease holder's process is proven gone"
    assert run(scene.runs.execution_request(scene.run_id, request.request_id)).status == "succeeded"


def test_the_gate_records_the_group_before_the_program_and_a_missing_program_is_a_start_error(
        tmp_path: Path) -> None:
    from jixu.runs.checks import run_process

    seen: list[dict[str, Any]] = []

    async def started(identity: dict[str, Any]) -> None:
        seen.append(identity)

    with (tmp_path / "out").open("w+b") as out:
        status, timed_out, error = run(run_process(["/nonexistent/agent-cli"], tmp_path, 10.0, stdout=out,
                                                   started=started))
    assert status is None and not timed_out and error is not None and "No such file" in error
    assert len(seen) == 1 and seen[0]["pgid"] == seen[0]["pid"] and isinstance(seen[0]["start_time"], int)

    async def refuse(identity: dict[str, Any]) -> None:
        await asyncio.sleep(1.0)  # long enough for a program let go early to write its marker
        raise RuntimeError("not recorded")

    marker = tmp_path / "ran"
    with (tmp_path / "out2").open("w+b") as out, pytest.raises(RuntimeError):
        run(run_process([sys.executable, "-c", f"open({str(marker)!r}, 'w')"], tmp_path, 10.0, stdout=out,
                        started=refuse))
    time.sleep(0.2)
    assert not marker.exists()  # a group that could not be recorded never runs its program


def test_a_cancel_that_comes_while_a_refused_start_is_undone_is_not_swallowed(tmp_path: Path) -> None:
    """The hook recording a new process fails (the store refuses) and, while the gate is killed and reaped, the
    task is cancelled (a drain): the cancellation goes on. It was swallowed, so a draining worker's run carried
    on and recorded a failure instead of stopping to be requeued."""
    from jixu.runs.processes import start_gated

    marker = tmp_path / "ran"

    async def scenario() -> None:
        me = asyncio.current_task()
        assert me is not None

        async def refuse(identity: Any) -> None:
            asyncio.get_running_loop().call_soon(me.cancel)  # the drain's cancel lands during the reaping
            raise RuntimeError("could not record the process")

        with pytest.raises(asyncio.CancelledError) as raised:
            await start_gated(["touch", str(marker)], started=refuse)
        assert isinstance(raised.value.__cause__, RuntimeError)
        assert me.cancelling() == 1, "the task is still being cancelled"
        me.uncancel()

        async def refuse_only(identity: Any) -> None:
            raise RuntimeError("could not record the process")

        with pytest.raises(RuntimeError):  # no cancel: the hook's error, as before
            await start_gated(["touch", str(marker)], started=refuse_only)

    asyncio.run(scenario())
    assert not marker.exists(), "nothing ran behind a refused start"
