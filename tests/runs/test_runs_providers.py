"""The command provider (an external agent CLI) and the scripted provider, on their own and in a run."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

from jixu.ledger import SQLiteStore
from jixu.runs import (
    CommandProvider,
    ImplementContext,
    ImplementResult,
    ProviderError,
    Runs,
    ScriptedProvider,
)
from jixu.runs.command_provider import parse_marker
from jixu.runs.providers import provider_snapshot
from tests.runs.run_helpers import FIXED, make_origin, register, run

AGENT = """
import json, os, sys
brief = sys.stdin.read()
repair = os.environ["JIXU_REPAIR_OF"]
open("calc.py", "w").write("def add(a, b):\\n    return a + b\\n")
open("agent.log", "w").write(json.dumps({"brief": brief, "env_brief": os.environ["JIXU_BRIEF"],
                                          "attempt": os.environ["JIXU_ATTEMPT"], "repair": repair,
                                          "token": os.environ["AGENT_TOKEN"]}))
print("thinking...")
print("fixed add() in calc.py")
"""


def context(**changes: object) -> ImplementContext:
    return ImplementContext(**{"run_id": "R", "brief": "do it", "attempt": 1, **changes})  # type: ignore[arg-type]


def test_a_command_provider_runs_an_agent_cli_in_the_workspace(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "ledger.db")
    register(store, make_origin(tmp_path), allowed_paths=["calc.py", "agent.log"])
    agent = CommandProvider("cli-agent", [sys.executable, "-c", AGENT], env={"AGENT_TOKEN": "s3cret"}, timeout=30)
    runs = Runs(store, tmp_path / "ws", {"cli-agent": agent})

    async def scenario() -> None:
        run_id = await runs.create_run("calc", "make add() add", provider="cli-agent")
        state = await runs.execute(run_id)
        assert state.status == "succeeded", state.reason
        assert state.provider["settings"] == {"argv": [sys.executable, "-c", AGENT], "env_keys": ["AGENT_TOKEN"],
                                              "timeout_s": 30.0, "test_argv": None}
        assert "s3cret" not in json.dumps((await runs.journal(run_id))[0])  # secrets stay out of the journal
        implement = state.plan.tasks[1].evidence
        assert implement is not None and implement["summary"] == "fixed add() in calc.py"
        assert implement["details"]["exit_status"] == 0
        log = json.loads((Path(state.workspace) / "agent.log").read_text())
        assert log == {"brief": "make add() add", "env_brief": "make add() add", "attempt": "1", "repair": "",
                       "token": "s3cret"}
        assert (Path(state.workspace) / "calc.py").read_text() == FIXED

    run(scenario())


@pytest.mark.parametrize(("code", "stderr", "kind", "retry_after"), [
    (69, "", "rate_limit", None),
    (75, "", "transient", None),
    (76, "", "quota", None),
    (77, "", "authentication", None),
    (3, "", "invalid", None),
    (1, "JIXU_PROVIDER_ERROR: rate_limit retry_after=2.5 slow down", "rate_limit", 2.5),
    (1, "noise\nJIXU_PROVIDER_ERROR: quota credits exhausted\n", "quota", None),
])
def test_command_exit_statuses_and_stderr_markers_map_to_provider_errors(
        tmp_path: Path, code: int, stderr: str, kind: str, retry_after: float | None) -> None:
    script = f"import sys; sys.stderr.write({stderr!r}); sys.exit({code})"
    provider = CommandProvider("cli", [sys.executable, "-c", script], timeout=10)
    with pytest.raises(ProviderError) as caught:
        asyncio.run(provider.implement(tmp_path, context()))
    assert (caught.value.kind, caught.value.retry_after) == (kind, retry_after)
    assert caught.value.details["exit_status"] == code


def test_a_command_that_outlives_its_timeout_is_killed_and_reported_transient(tmp_path: Path) -> None:
    provider = CommandProvider("cli", [sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.3)
    with pytest.raises(ProviderError) as caught:
        asyncio.run(provider.implement(tmp_path, context()))
    assert caught.value.kind == "transient" and caught.value.details["timed_out"] is True


def test_command_provider_tests_and_markers(tmp_path: Path) -> None:
    assert not asyncio.run(CommandProvider("x", ["/no/such/agent"]).test()).ok
    assert asyncio.run(CommandProvider("x", [sys.executable]).test()).ok
    failing = CommandProvider("x", [sys.executable], test_argv=[sys.executable, "-c", "import sys; sys.exit(2)"])
    assert not asyncio.run(failing.test()).ok
    passing = CommandProvider("x", [sys.executable], test_argv=[sys.executable, "-c", "print('logged in')"])
    assert asyncio.run(passing.test()).message == "logged in"
    with pytest.raises(ProviderError) as caught:
        asyncio.run(CommandProvider("x", ["/no/such/agent"]).implement(tmp_path, context()))
    assert caught.value.kind == "invalid"
    assert parse_marker("JIXU_PROVIDER_ERROR: bogus\n") is None
    assert parse_marker("JIXU_PROVIDER_ERROR: transient\nJIXU_PROVIDER_ERROR: authentication expired token") == (
        "authentication", None, "expired token")


def test_scripted_provider_plays_its_steps_in_order_and_snapshots_are_stable(tmp_path: Path) -> None:
    async def async_step(workspace: Path, ctx: ImplementContext) -> ImplementResult:
        return ImplementResult("async", {"attempt": ctx.attempt})

    provider = ScriptedProvider("s", [async_step, ProviderError("no", kind="quota"),
                                      lambda ws, ctx: ImplementResult("sync")], settings={"k": 1})
    assert asyncio.run(provider.implement(tmp_path, context())).summary == "async"
    with pytest.raises(ProviderError):
        asyncio.run(provider.implement(tmp_path, context()))
    assert asyncio.run(provider.implement(tmp_path, context())).summary == "sync"
    with pytest.raises(ProviderError) as caught:
        asyncio.run(provider.implement(tmp_path, context()))
    assert caught.value.kind == "invalid" and len(provider.calls) == 4
    one, two = provider_snapshot(provider, 1), provider_snapshot(ScriptedProvider("s", [], settings={"k": 1}), 1)
    assert one == two and one["settings"] == {"k": 1}
    assert provider_snapshot(ScriptedProvider("s", [], settings={"k": 2}), 1)["digest"] != one["digest"]
