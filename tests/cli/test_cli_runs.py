"""``jixu projects …`` and ``jixu runs …`` as an operator runs them: real ``python -m jixu`` subprocesses, a real
bare git origin made by the test, and scripted providers from a factory module written into the test's directory.

The project: ``status.txt`` says ``broken``; its check (``python -B check.py``) passes only when it says ``fixed``.
Providers (``runs_providers:providers``): ``fixer`` writes ``fixed``; ``quota`` leaves a partial file and raises
``ProviderError(kind="quota")``; ``giveup`` writes something else (the check keeps failing); ``untestable`` fails
its test.
"""

from __future__ import annotations

import json
import os
import shlex
import sqlite3
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jixu.ledger import SQLiteStore, new_id
from jixu.runs.model import run_stream
from tests.helpers import python_env, run_jixu

GIT_ENV = {"GIT_AUTHOR_NAME": "Test", "GIT_AUTHOR_EMAIL": "test@example.com", "GIT_COMMITTER_NAME": "Test",
           "GIT_COMMITTER_EMAIL": "test@example.com", "GIT_CONFIG_NOSYSTEM": "1"}

CHECK = """\
import pathlib
import sys

text = pathlib.Path("status.txt").read_text().strip()
print(f"status: {text}")
sys.exit(0 if text == "fixed" else 1)
"""

PROVIDERS = """\
from jixu.runs import ImplementResult, ProviderError, ProviderTest, ScriptedProvider


def fix(workspace, context):
    notes = workspace / "notes.md"
    if notes.exists():
        notes.write_text(notes.read_text() + "step 2 of 2 done\\n")
    (workspace / "status.txt").write_text("fixed\\n")
    return ImplementResult("fixed the status file", {"attempt": context.attempt})


def partial_then_quota(workspace, context):
    (workspace / "notes.md").write_text("step 1 of 2 done\\n")
    raise ProviderError("credits exhausted", kind="quota")


def give_up(workspace, context):
    (workspace / "status.txt").write_text("still broken\\n")
    return ImplementResult("tried, gave up")


def providers():
    return {
        "fixer": ScriptedProvider("fixer", [fix] * 5, settings={"model": "fixer-1"}),
        "quota": ScriptedProvider("quota", [partial_then_quota] * 5, settings={"model": "quota-1"}),
        "giveup": ScriptedProvider("giveup", [give_up] * 5),
        "untestable": ScriptedProvider("untestable", [], test_result=ProviderTest(False, "no credentials")),
    }


def not_a_dict():
    return ["fixer"]
"""

SPEC = "runs_providers:providers"


def git(*args: str, cwd: Path | None = None) -> None:
    subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, env={**os.environ, **GIT_ENV})


@dataclass
class Env:
    """A test directory with a bare origin, the providers module, and a store path."""

    root: Path
    origin: Path
    db: Path
    workspaces: Path
    env: dict[str, str] = field(default_factory=dict)

    def jixu(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return run_jixu(*args, env={**self.env, **(env or {})}, cwd=self.root)

    def json(self, *args: str, env: dict[str, str] | None = None) -> tuple[int, Any]:
        result = self.jixu(*args, "--json", env=env)
        try:
            return result.returncode, json.loads(result.stdout)
        except ValueError:
            raise AssertionError(f"not JSON (exit {result.returncode}):\n{result.stdout}\n{result.stderr}") from None

    def register(self, name: str = "calc", *extra: str) -> Any:
        code, body = self.json("projects", "register", str(self.db), name, "--origin", str(self.origin),
                               "--check", f"unit={shlex.quote(sys.executable)} -B check.py", "--check-timeout", "30",
                               *extra)
        assert code == 0, body
        return body

    def create(self, provider: str, *extra: str, brief: str = "make the status check pass") -> tuple[int, Any]:
        return self.json("runs", "create", str(self.db), "calc", "--brief", brief, "--provider", provider,
                         "--providers", SPEC, *extra)

    def length(self, run_id: str) -> int:
        with SQLiteStore(self.db, create=False) as store:
            return len(store.read(run_stream(run_id)))

    def entries(self, run_id: str) -> list[dict[str, Any]]:
        with SQLiteStore(self.db, create=False) as store:
            return [e.to_dict() for e in store.read(run_stream(run_id))]

    def run_count(self) -> int:
        with SQLiteStore(self.db, create=False) as store:
            return len(store.list_streams("run/", limit=10_000))


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return make_env(tmp_path)


def make_env(tmp_path: Path) -> Env:
    """A bare origin with the status project, the providers module, and the environment for ``python -m jixu``."""
    work = tmp_path / "calc-src"
    work.mkdir()
    (work / "check.py").write_text(CHECK)
    (work / "status.txt").write_text("broken\n")
    (work / ".gitignore").write_text("__pycache__/\n")
    git("init", "-q", "-b", "main", cwd=work)
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "a broken status", cwd=work)
    origin = tmp_path / "calc.git"
    git("clone", "-q", "--bare", str(work), str(origin))
    (tmp_path / "runs_providers.py").write_text(PROVIDERS)
    variables = python_env()
    variables["PYTHONPATH"] = os.pathsep.join([str(tmp_path), variables["PYTHONPATH"]])
    variables.pop("JIXU_PROVIDERS", None)
    variables["JIXU_WORKSPACE_ROOT"] = str(tmp_path / "ws")
    return Env(tmp_path, origin, tmp_path / "ops.db", tmp_path / "ws", variables)


@pytest.fixture
def project(env: Env) -> Env:
    env.register()
    return env


# --- projects ------------------------------------------------------------------------------------


def test_projects_register_list_show_and_update_policy(env: Env) -> None:
    body = env.register("calc", "--allowed-path", "*.txt", "--allowed-path", "notes/*", "--max-repair-attempts", "2")
    project = body["project"]
    assert body["registered"] is True
    assert project["origin"] == str(env.origin) and project["default_branch"] == "main"
    assert project["policy"] == {
        "checks": [{"name": "unit", "argv": [sys.executable, "-B", "check.py"], "timeout_s": 30.0}],
        "allowed_paths": ["*.txt", "notes/*"], "limits": {"max_repair_attempts": 2, "check_timeout_s": 30.0}}

    again = env.register("calc", "--allowed-path", "*.txt", "--allowed-path", "notes/*", "--max-repair-attempts", "2")
    assert again == {"registered": False, "project": project}
    code, conflict = env.json("projects", "register", str(env.db), "calc", "--origin", str(env.origin),
                              "--check", "unit=true")
    assert code == 4 and conflict["error"]["code"] == "project_exists"

    code, listed = env.json("projects", "list", str(env.db))
    assert code == 0 and [p["name"] for p in listed] == ["calc"]
    code, shown = env.json("projects", "show", str(env.db), "calc")
    assert code == 0 and shown["policy_digest"] == project["policy_digest"] and shown["runs"]["total"] == 0
    human = env.jixu("projects", "show", str(env.db), "calc")
    assert human.returncode == 0 and "-B check.py" in human.stdout and "notes/*" in human.stdout
    assert env.jixu("projects", "show", str(env.db), "nope").returncode == 3

    code, updated = env.json("projects", "update-policy", str(env.db), "calc", "--check", "unit=python check.py",
                             "--check", "lint=python -m pyflakes .")
    assert code == 0 and updated["updated"] is True and updated["project"]["policy_revision"] == 2
    assert [c["argv"] for c in updated["project"]["policy"]["checks"]] == [
        ["python", "check.py"], ["python", "-m", "pyflakes", "."]]
    code, same = env.json("projects", "update-policy", str(env.db), "calc", "--check", "unit=python check.py",
                          "--check", "lint=python -m pyflakes .")
    assert code == 0 and same["updated"] is False and same["project"]["policy_revision"] == 2


def test_malformed_project_input_is_refused_and_writes_nothing(env: Env) -> None:
    fresh = env.root / "fresh.db"
    for checks in (["--check", "unit"], ["--check", "=python check.py"], ["--check", "unit="],
                   ["--check", "unit=python 'unclosed"], ["--check", "bad name!=true"], [],
                   ["--check", "unit=true", "--check", "unit=false"]):
        code, body = env.json("projects", "register", str(fresh), "calc", "--origin", str(env.origin), *checks)
        assert code == 6, (checks, body)
        assert body["error"]["code"] in ("invalid_input", "invalid_policy")
    code, body = env.json("projects", "register", str(fresh), "calc", "--origin", str(env.root / "missing.git"),
                          "--check", "unit=true")
    assert code == 3 and body["error"]["code"] == "source_unavailable"
    code, body = env.json("projects", "register", str(fresh), "calc", "--origin", str(env.origin), "--check",
                          "unit=true", "--max-repair-attempts", "9")
    assert code == 6 and body["error"]["field"] == "policy.limits.max_repair_attempts"
    assert not fresh.exists()  # not even the store file

    env.register()
    with SQLiteStore(env.db, create=False) as store:
        before = [e.to_dict() for e in store.read("project/calc")]
    code, _ = env.json("projects", "update-policy", str(env.db), "calc", "--check", "unit")
    assert code == 6
    with SQLiteStore(env.db, create=False) as store:
        assert [e.to_dict() for e in store.read("project/calc")] == before


def test_a_default_branch_the_origin_does_not_have_is_refused_and_writes_nothing(env: Env) -> None:
    fresh = env.root / "fresh.db"
    code, body = env.json("projects", "register", str(fresh), "calc", "--origin", str(env.origin), "--check",
                          "unit=true", "--default-branch", "nosuch")
    assert code == 6, body
    assert (body["error"]["code"], body["error"]["field"]) == ("invalid_input", "default_branch")
    assert "'nosuch' is not a branch of the origin" in body["error"]["message"]
    assert body["error"]["branches"] == ["main"]
    assert not fresh.exists()  # not even the store file

    env.register("other")  # the store exists now: still nothing is written for the refused registration
    code, body = env.json("projects", "register", str(env.db), "calc", "--origin", str(env.origin), "--check",
                          "unit=true", "--default-branch", "nosuch")
    assert code == 6 and body["error"]["field"] == "default_branch"
    with SQLiteStore(env.db, create=False) as store:
        assert store.stream_info("project/calc") is None
    assert env.jixu("projects", "show", str(env.db), "calc").returncode == 3

    # So the mistake never needs undoing: the right branch registers, and runs start from it.
    git("--git-dir", str(env.origin), "branch", "dev", "main")
    body = env.register("calc", "--default-branch", "dev")
    assert body["registered"] is True and body["project"]["default_branch"] == "dev"
    code, created = env.create("fixer")
    assert code == 0, created


# --- runs ----------------------------------------------------------------------------------------


def test_a_run_succeeds_and_list_show_plan_journal_tell_its_story(project: Env) -> None:
    env = project
    # The providers factory from the environment variable; the workspace root from the flag.
    code, created = env.json("runs", "create", str(env.db), "calc", "--brief", "make the status check pass",
                             "--provider", "fixer", "--workspace-root", str(env.root / "other-ws"), "--execute",
                             env={"JIXU_PROVIDERS": SPEC})
    assert code == 0, created
    run_id = created["run_id"]
    run = created["run"]
    assert created["executed"] is True and run["status"] == "succeeded", run["reason"]
    assert run["workspace"] == str((env.root / "other-ws" / run_id).resolve())
    assert (Path(run["workspace"]) / "status.txt").read_text() == "fixed\n"
    assert [op["operation"] for op in run["next_operations"]] == ["publish"]

    code, listed = env.json("runs", "list", str(env.db))
    assert code == 0 and [(r["run_id"], r["status"], r["provider"]) for r in listed] == [(run_id, "succeeded", "fixer")]
    assert env.json("runs", "list", str(env.db), "--project", "calc", "--status", "succeeded")[1][0]["run_id"] == run_id
    assert env.json("runs", "list", str(env.db), "--status", "failed") == (0, [])
    assert env.json("runs", "list", str(env.db), "--project", "nope")[0] == 3

    code, shown = env.json("runs", "show", str(env.db), run_id)
    assert code == 0
    assert (shown["status"], shown["project"], shown["brief"]) == ("succeeded", "calc", "make the status check pass")
    assert shown["source"]["origin"] == str(env.origin) and len(shown["source"]["commit"]) == 40
    assert (shown["provider"]["name"], shown["provider"]["kind"], shown["provider"]["revision"]) == (
        "fixer", "scripted", 1)
    assert shown["provider"]["settings"] == {"model": "fixer-1"} and len(shown["provider"]["digest"]) == 64
    assert shown["policy"]["checks"][0]["argv"] == [sys.executable, "-B", "check.py"]
    assert len(shown["policy_digest"]) == 64
    assert shown["lineage"] == {"parent_run_id": None, "ancestors": [], "children": []}
    assert [r["reason"] for r in shown["plan"]["revisions"]] == ["initial"]
    assert [(t["kind"], t["status"]) for t in shown["tasks"]] == [
        ("prepare", "done"), ("implement", "done"), ("verify", "done")]
    assert all(a["decision"]["state"] == "completed" for t in shown["tasks"] for a in t["attempts"])
    assert shown["failed_checks"] == [] and shown["pauses"] == []
    assert [op["operation"] for op in shown["next_operations"]] == ["publish"]
    assert shown["journal"]["valid"] is True and shown["journal"]["entries"] == env.length(run_id)
    human = env.jixu("runs", "show", str(env.db), run_id)
    assert human.returncode == 0 and "succeeded" in human.stdout and "fixer (scripted) revision 1" in human.stdout
    assert f"jixu runs publish {env.db} {run_id} --execute" in human.stdout

    code, plan = env.json("runs", "plan", str(env.db), run_id)
    assert code == 0 and (plan["revision"], plan["current"], plan["reason"]) == (1, True, "initial")
    assert [t["status"] for t in plan["tasks"]] == ["done", "done", "done"]
    assert plan["tasks"][2]["evidence"]["checks"][0]["exit_status"] == 0
    assert env.json("runs", "plan", str(env.db), run_id, "--revision", "1")[1] == plan
    code, missing = env.json("runs", "plan", str(env.db), run_id, "--revision", "2")
    assert code == 3 and missing["error"]["code"] == "not_found"

    code, journal = env.json("runs", "journal", str(env.db), run_id)
    assert code == 0 and journal["valid"] is True and journal["count"] == env.length(run_id)
    entries = journal["entries"]
    assert [e["seq"] for e in entries] == list(range(1, len(entries) + 1))
    assert [e["type"] for e in entries[:3]] == ["run.created", "plan.revised", "run.claimed"]
    assert entries[-1]["type"] == "run.finished" and entries[-1]["summary"].startswith("succeeded")
    tasks = [(e["type"], e["task"], e["attempt"]) for e in entries if e["type"].startswith("task.")]
    assert tasks == [(f"task.{phase}", kind, 1) for kind in ("prepare", "implement", "verify")
                     for phase in ("requested", "dispatched", "completed")]
    assert all(e["task_id"] for e in entries if e["type"].startswith("task."))
    assert {"seq", "type", "task", "task_id", "attempt", "summary", "hash", "prev_hash", "data"} <= set(entries[0])
    human = env.jixu("runs", "journal", str(env.db), run_id)
    assert human.returncode == 0 and "hash chain valid" in human.stdout and "run.finished" in human.stdout


def test_create_execute_shows_progress_and_prints_the_run_id_first(project: Env) -> None:
    result = project.jixu("runs", "create", str(project.db), "calc", "--brief", "fix it", "--provider", "fixer",
                          "--providers", SPEC, "--execute")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    run_id = lines[0].strip()
    assert project.length(run_id) > 0
    for text in ("task.dispatched", "implement", "fixed the status file", "passed: unit passed",
                 f"run {run_id}  status succeeded"):
        assert text in result.stdout, text


def test_a_quota_pause_is_handed_off_to_another_provider_and_continues(project: Env) -> None:
    env = project
    code, created = env.create("quota", "--execute")
    run_id, run = created["run_id"], created["run"]
    assert code == 1 and (run["status"], run["pause_reason"]) == ("paused", "quota"), run["reason"]
    assert [op["operation"] for op in run["next_operations"]] == ["resume", "handoff", "cancel"]
    workspace = Path(run["workspace"])
    assert (workspace / "notes.md").read_text() == "step 1 of 2 done\n"
    revision_1 = run["plan"]["revisions"][0]
    length = env.length(run_id)

    # Not bypassed silently: executing again runs nothing; an unknown or failing provider writes nothing.
    code, again = env.json("runs", "execute", str(env.db), run_id, "--providers", SPEC)
    assert code == 1 and again["run"]["status"] == "paused"
    code, unknown = env.json("runs", "handoff", str(env.db), run_id, "--agent", "nobody", "--providers", SPEC)
    assert code == 6 and unknown["error"]["code"] == "unknown_provider"
    code, failing = env.json("runs", "handoff", str(env.db), run_id, "--agent", "untestable", "--providers", SPEC)
    assert code == 1 and failing["error"]["code"] == "provider_test_failed"
    assert "no credentials" in failing["error"]["message"]
    assert env.length(run_id) == length

    code, handed = env.json("runs", "handoff", str(env.db), run_id, "--agent", "fixer", "--providers", SPEC,
                            "--actor", "ops", "--note", "quota is out of credits", "--execute")
    assert code == 0, handed
    done = handed["run"]
    assert handed["handed_off_to"] == "fixer" and done["status"] == "succeeded", done["reason"]
    assert [p["name"] for p in done["providers"]] == ["quota", "fixer"] and done["provider"]["revision"] == 2
    assert (done["plan"]["revision"], done["plan"]["reason"], done["plan"]["provider_revision"]) == (
        2, "handoff", 2)
    assert done["plan"]["revisions"][0] == revision_1  # the earlier revision is kept as it was
    assert done["pauses"][-1]["closed"]["by"] == "handed_off"
    assert (workspace / "notes.md").read_text() == "step 1 of 2 done\nstep 2 of 2 done\n"  # partial work kept
    implement = next(t for t in done["plan"]["tasks"] if t["kind"] == "implement")
    assert [(a["attempt"], a["revision"]) for a in implement["attempts"]] == [(1, 1), (2, 2)]

    code, journal = env.json("runs", "journal", str(env.db), run_id)
    assert code == 0 and journal["valid"] is True
    handoffs = [e for e in journal["entries"] if e["type"] == "run.handed_off"]
    assert len(handoffs) == 1 and handoffs[0]["data"]["actor"] == "ops"
    assert "to fixer (scripted) r2 by ops; tested ok" in handoffs[0]["summary"]
    code, plan_1 = env.json("runs", "plan", str(env.db), run_id, "--revision", "1")
    assert code == 0 and plan_1["current"] is False and plan_1["reason"] == "initial"
    human = env.jixu("runs", "show", str(env.db), run_id)
    assert human.returncode == 0 and "earlier: r1 quota (scripted)" in human.stdout and "handed_off" in human.stdout


def test_a_failed_run_shows_its_check_evidence_and_a_retry_is_a_fresh_run_with_lineage(project: Env) -> None:
    env = project
    code, created = env.create("giveup", "--execute")
    failed_id, failed = created["run_id"], created["run"]
    assert code == 1 and failed["status"] == "failed", failed["reason"]
    assert [op["operation"] for op in failed["next_operations"]] == ["retry"]

    code, shown = env.json("runs", "show", str(env.db), failed_id)
    assert code == 0 and shown["status"] == "failed" and shown["repairs_used"] == 1
    evidence = shown["failed_checks"]
    assert [(c["name"], c["exit_status"], c["revision"]) for c in evidence] == [("unit", 1, 1), ("unit", 1, 2)]
    assert all("status: still broken" in c["output_excerpt"] and len(c["output_digest"]) == 64 for c in evidence)
    assert [r["reason"] for r in shown["plan"]["revisions"]] == ["initial", "repair"]
    human = env.jixu("runs", "show", str(env.db), failed_id)
    assert human.returncode == 0 and "failed checks" in human.stdout and "status: still broken" in human.stdout
    assert f"jixu runs retry {env.db} {failed_id}" in human.stdout
    before = env.entries(failed_id)

    code, refused = env.json("runs", "resume", str(env.db), failed_id)
    assert code == 4 and refused["error"]["code"] == "run_state_error"

    code, retried = env.json("runs", "retry", str(env.db), failed_id, "--providers", SPEC, "--provider", "fixer",
                             "--execute")
    assert code == 0, retried
    child_id = retried["run_id"]
    assert child_id != failed_id and retried["parent_run_id"] == failed_id
    assert retried["lineage"] == [failed_id, child_id]
    child = retried["run"]
    assert child["status"] == "succeeded" and child["lineage"] == {"parent_run_id": failed_id}
    assert (child["brief"], child["source"], child["policy_digest"]) == (
        failed["brief"], failed["source"], failed["policy_digest"])
    assert child["workspace"] != failed["workspace"]
    after = env.entries(failed_id)  # the failed run's history is unchanged; it gains the record of its one retry
    assert after[:len(before)] == before and [e["type"] for e in after[len(before):]] == ["run.retried"]
    assert child_id in json.dumps(after[-1]["data"]), after[-1]["data"]
    again = env.jixu("runs", "retry", str(env.db), failed_id, "--providers", SPEC)
    assert again.returncode == 4 and child_id in again.stderr, again.stderr  # retried once only
    assert env.entries(failed_id) == after

    assert env.json("runs", "show", str(env.db), failed_id)[1]["lineage"]["children"] == [child_id]
    assert env.json("runs", "show", str(env.db), child_id)[1]["lineage"]["ancestors"] == [failed_id]
    listed = {r["run_id"]: r for r in env.json("runs", "list", str(env.db))[1]}
    assert listed[child_id]["parent_run_id"] == failed_id and listed[failed_id]["status"] == "failed"
    human = env.jixu("runs", "retry", str(env.db), child_id, "--providers", SPEC)
    assert human.returncode == 4 and "run_state_error" in human.stderr  # a succeeded run is not retried


def test_cancel_then_retry_into_the_work_queue(project: Env) -> None:
    env = project
    code, created = env.create("fixer")
    run_id = created["run_id"]
    assert code == 0 and created["executed"] is False and created["run"]["status"] == "queued"
    assert [op["operation"] for op in created["run"]["next_operations"]] == ["execute", "cancel"]

    code, cancelled = env.json("runs", "cancel", str(env.db), run_id, "--reason", "not needed", "--actor", "ops")
    assert code == 0 and cancelled["run"]["status"] == "cancelled" and cancelled["run"]["reason"] == "not needed"
    length = env.length(run_id)
    assert env.json("runs", "cancel", str(env.db), run_id)[0] == 4
    code, executed = env.json("runs", "execute", str(env.db), run_id, "--providers", SPEC)
    assert code == 1 and executed["run"]["status"] == "cancelled"
    assert env.length(run_id) == length

    code, retried = env.json("runs", "retry", str(env.db), run_id, "--providers", SPEC, "--queue")
    assert code == 0 and retried["run"]["status"] == "queued" and retried["lineage"] == [run_id, retried["run_id"]]
    assert retried["queued"]["key"] == f"run/{retried['run_id']}" and retried["queued"]["project"] == "calc"
    code, queued = env.create("fixer", "--queue")
    assert code == 0 and queued["queued"]["key"] == f"run/{queued['run_id']}"


def test_a_run_created_without_queue_is_queued_later_and_a_worker_runs_it(project: Env) -> None:
    """`runs create` without --queue said the run was waiting for a worker, yet no command could put it in the work
    queue: `jixu runs queue` does, and a worker then runs it. A finished run is refused."""
    env = project
    code, created = env.create("fixer")
    run_id = created["run_id"]
    assert code == 0 and created["queued"] is None
    code, queued = env.json("runs", "queue", str(env.db), run_id)
    assert code == 0 and queued["queued"]["key"] == f"run/{run_id}" and queued["queued"]["project"] == "calc"
    worked = env.jixu("worker", "--store", str(env.db), "--providers", SPEC, "--exit-when-idle", "--quiet",
                      "--workspace-root", str(env.workspaces))
    assert worked.returncode == 0, worked.stderr
    code, shown = env.json("runs", "show", str(env.db), run_id)
    assert shown["status"] == "succeeded", shown["status"]
    length = env.length(run_id)
    code, refused = env.json("runs", "queue", str(env.db), run_id)
    assert code == 4 and refused["error"]["code"] == "run_state_error", refused
    assert env.json("runs", "queue", str(env.db), "01JD0000000000000000000009")[0] == 3
    assert env.length(run_id) == length


def test_bad_input_gets_a_typed_error_and_writes_nothing(project: Env) -> None:
    env = project
    code, created = env.create("fixer", "--execute")
    assert code == 0
    done = created["run_id"]
    length, runs = env.length(done), env.run_count()
    unknown = new_id()

    # An unknown run: 3, whatever the command.
    for args in (["show"], ["plan"], ["journal"], ["cancel"], ["resume"], ["execute", "--providers", SPEC],
                 ["handoff", "--agent", "fixer", "--providers", SPEC], ["retry", "--providers", SPEC]):
        code, body = env.json("runs", args[0], str(env.db), unknown, *args[1:])
        assert code == 3 and body["error"]["code"] == "run_not_found", (args, body)
    code, body = env.json("runs", "show", str(env.db), "not-a-run-id")
    assert code == 6 and body["error"]["field"] == "run_id"

    # A succeeded run cannot be resumed, handed off, cancelled or retried: 4, nothing written.
    for args in (["resume"], ["handoff", "--agent", "quota", "--providers", SPEC], ["cancel"],
                 ["retry", "--providers", SPEC]):
        code, body = env.json("runs", args[0], str(env.db), done, *args[1:])
        assert code == 4 and body["error"]["code"] == "run_state_error", (args, body)
    # Handing off to a provider nobody configured: invalid input (6), checked before anything else.
    code, body = env.json("runs", "handoff", str(env.db), done, "--agent", "nobody", "--providers", SPEC)
    assert code == 6 and body["error"]["code"] == "unknown_provider"
    assert env.length(done) == length

    # Creating: unknown project (3), provider (6), commit (3); bad or missing providers factories (6);
    # --execute with --queue (6); a missing store (3, not created).
    assert env.json("runs", "create", str(env.db), "nope", "--brief", "b", "--provider", "fixer",
                    "--providers", SPEC)[1]["error"]["code"] == "project_not_found"
    code, body = env.create("nobody")
    assert code == 6 and body["error"]["code"] == "unknown_provider"
    code, body = env.create("fixer", "--commit", "0" * 40)
    assert code == 3 and body["error"]["code"] == "source_unavailable"
    code, body = env.create("fixer", "--execute", "--queue")
    assert code == 6 and body["error"]["field"] == "execute"
    for spec in ("no-colon", "missing_module:providers", "runs_providers:nothing", "runs_providers:not_a_dict"):
        code, body = env.json("runs", "create", str(env.db), "calc", "--brief", "b", "--provider", "fixer",
                              "--providers", spec)
        assert code == 6 and body["error"]["field"] == "providers", (spec, body)
    code, body = env.json("runs", "create", str(env.db), "calc", "--brief", "b", "--provider", "fixer")
    assert code == 6 and "JIXU_PROVIDERS" in body["error"]["message"]
    code, body = env.create("fixer", brief=" ")
    assert code == 6 and body["error"]["field"] == "brief"
    missing = env.root / "missing.db"
    code, body = env.json("runs", "list", str(missing))
    assert code == 3 and body["error"]["code"] == "store_not_found" and not missing.exists()
    assert env.jixu("runs", "list", str(env.db), "--status", "bogus").returncode == 2
    assert env.run_count() == runs and env.length(done) == length


def test_a_tampered_journal_is_reported_invalid_with_exit_1(project: Env) -> None:
    env = project
    code, created = env.create("fixer", "--execute")
    run_id = created["run_id"]
    raw = sqlite3.connect(env.db)
    raw.execute("DROP TRIGGER jixu_events_no_update")
    changed = raw.execute("UPDATE jixu_events SET data = replace(data, 'fixed the status file', 'did nothing') "
                          "WHERE stream = ? AND data LIKE '%fixed the status file%'", (run_stream(run_id),)).rowcount
    raw.commit()
    raw.close()
    assert changed == 1

    code, journal = env.json("runs", "journal", str(env.db), run_id)
    assert code == 1 and journal["valid"] is False and journal["chain"]["reason"] == "payload_changed"
    assert journal["count"] == env.length(run_id)
    human = env.jixu("runs", "journal", str(env.db), run_id)
    assert human.returncode == 1 and "INVALID" in human.stdout
    code, shown = env.json("runs", "show", str(env.db), run_id)
    assert code == 1 and shown["journal"]["valid"] is False and shown["status"] == "corrupt"
    assert shown["next_operations"] == [], "nothing is offered on a journal that does not verify"


def test_resume_reconciles_the_workspace_first_and_a_moved_head_needs_reconciliation(project: Env) -> None:
    env = project
    code, created = env.create("quota", "--execute")
    run_id, workspace = created["run_id"], Path(created["run"]["workspace"])
    assert code == 1 and created["run"]["status"] == "paused"
    git("commit", "-q", "--allow-empty", "-m", "someone committed in the run's workspace", cwd=workspace)  # HEAD moved

    code, refused = env.json("runs", "resume", str(env.db), run_id, "--providers", SPEC, "--execute")
    assert code == 1 and refused["error"]["code"] == "workspace_mismatch"
    code, shown = env.json("runs", "show", str(env.db), run_id)
    assert code == 0 and shown["status"] == "needs_reconciliation"
    assert shown["reconciliations"][-1]["outcome"] == "mismatch"
    assert [op["operation"] for op in shown["next_operations"]] == ["resume", "cancel"]
    human = env.jixu("runs", "show", str(env.db), run_id)
    assert "workspace mismatch" in human.stdout and "HEAD is" in human.stdout

    git("reset", "-q", "--soft", "HEAD~1", cwd=workspace)  # restored: the partial work is still there
    code, resumed = env.json("runs", "resume", str(env.db), run_id, "--actor", "ops", "--note", "restored HEAD",
                             "--providers", SPEC, "--execute")
    # Resumed with the same provider, which is still out of quota: it pauses again, honestly.
    assert code == 1 and resumed["resumed"] is True and resumed["run"]["status"] == "paused"
    entries = env.json("runs", "journal", str(env.db), run_id)[1]["entries"]
    resumes = [e for e in entries if e["type"] == "run.resumed"]
    assert [(e["data"]["reason"], e["data"]["actor"]) for e in resumes] == [("explicit", "ops")]
    assert [e["data"]["outcome"] for e in entries if e["type"] == "run.reconciled"][-1] == "consistent"
