"""The runs and projects endpoints over a real server whose in-process worker executes runs (real git origins)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.ledger import SQLiteStore
from jixu.runs import ProviderError, ScriptedProvider
from tests.runs.run_helpers import fix, make_origin, policy
from tests.server.conftest import Api, start_api, wait_for
from tests.server.test_auth_and_problems import assert_problem


@pytest.fixture
def runs_api(tmp_path: Path) -> Iterator[tuple[Api, Path]]:
    """A live server over SQLite with scripted providers, and a git origin to register as a project."""
    providers: dict[str, Any] = {
        "fixer": ScriptedProvider("fixer", [fix] * 10),
        "quota": ScriptedProvider("quota", [ProviderError("credits exhausted", kind="quota"), fix]),
        "broken": ScriptedProvider("broken", []),
    }
    store = SQLiteStore(tmp_path / "runs.db")
    api, server = start_api(store, tmp_path, providers=providers)
    try:
        yield api, make_origin(tmp_path)
    finally:
        api.close()
        server.stop()
        store.close()


def register(api: Api, origin: Path, name: str = "alpha") -> None:
    made = api.client("admin").post("/projects", json={"name": name, "origin": str(origin), "policy": policy()})
    assert made.status_code == 201, made.text


def finished(client: httpx.Client, run_id: str, *statuses: str) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        state: dict[str, Any] = client.get(f"/runs/{run_id}").json()
        return state if state["status"] in statuses else None

    found: dict[str, Any] = wait_for(check, f"run {run_id} to be {statuses}", timeout=60)
    return found


def test_a_run_created_over_http_is_executed_and_its_journal_verifies(runs_api: tuple[Api, Path]) -> None:
    api, origin = runs_api
    register(api, origin)
    editor, viewer = api.client("alpha-editor"), api.client("alpha-viewer")
    assert_problem(viewer.post("/runs", json={"project": "alpha", "brief": "fix add", "provider": "fixer"}), 403,
                   "forbidden")
    created = editor.post("/runs", json={"project": "alpha", "brief": "fix add", "provider": "fixer"})
    assert created.status_code == 201, created.text
    run_id = created.json()["run_id"]
    state = finished(viewer, run_id, "succeeded", "failed")
    assert state["status"] == "succeeded", state
    plan = viewer.get(f"/runs/{run_id}/plan").json()
    assert [t["kind"] for t in plan["tasks"]] == ["prepare", "implement", "verify"]
    journal = viewer.get(f"/runs/{run_id}/journal").json()
    assert journal["valid"] is True and journal["entries"][0]["type"] == "run.created"
    assert viewer.get(f"/runs/{run_id}/execution-requests").json()["corruption"] is None
    assert journal["entries"][0]["meta"]["actor"] == f"token:{api.token_ids['alpha-editor']}"
    assert [r["run_id"] for r in viewer.get("/runs").json()["runs"]] == [run_id]
    assert viewer.get("/runs", params={"status": "failed"}).json()["runs"] == []
    unknown = assert_problem(editor.post("/runs", json={"project": "alpha", "brief": "b", "provider": "nobody"}),
                             422, "unknown_provider")
    assert "nobody" in unknown["detail"]


def test_a_quota_pause_is_handed_off_only_by_an_operator(runs_api: tuple[Api, Path]) -> None:
    api, origin = runs_api
    register(api, origin)
    editor, operator = api.client("alpha-editor"), api.client("alpha-operator")
    run_id = editor.post("/runs", json={"project": "alpha", "brief": "fix add", "provider": "quota"}).json()["run_id"]
    paused = finished(editor, run_id, "paused")
    assert paused["pause_reason"] == "quota" or "quota" in str(paused)
    assert_problem(editor.post(f"/runs/{run_id}/handoff", json={"agent": "fixer"}), 403, "forbidden")
    handed = operator.post(f"/runs/{run_id}/handoff", json={"agent": "fixer", "note": "other account"})
    assert handed.status_code == 200, handed.text
    state = finished(editor, run_id, "succeeded", "failed")
    assert state["status"] == "succeeded"
    journal = editor.get(f"/runs/{run_id}/journal").json()
    [handoff] = [e for e in journal["entries"] if e["type"] == "run.handed_off"]
    assert handoff["meta"]["actor"] == f"token:{api.token_ids['alpha-operator']}"
    revisions = editor.get(f"/runs/{run_id}/plan").json()
    assert revisions["revision"] == 2


def test_resume_takes_an_empty_body_and_an_editor(runs_api: tuple[Api, Path]) -> None:
    api, origin = runs_api
    register(api, origin)
    editor, viewer = api.client("alpha-editor"), api.client("alpha-viewer")
    run_id = editor.post("/runs", json={"project": "alpha", "brief": "fix", "provider": "quota"}).json()["run_id"]
    finished(editor, run_id, "paused")
    assert_problem(viewer.post(f"/runs/{run_id}/resume", json={}), 403, "forbidden")
    resumed = editor.post(f"/runs/{run_id}/resume", json={})
    assert resumed.status_code == 200, resumed.text
    assert finished(editor, run_id, "succeeded", "failed")["status"] == "succeeded"
    assert_problem(editor.post(f"/runs/{run_id}/resume", json={}), 409, "run_state_error")


def test_a_failed_run_is_retried_as_a_new_run_and_cancel_needs_an_operator(runs_api: tuple[Api, Path]) -> None:
    api, origin = runs_api
    register(api, origin)
    editor, operator = api.client("alpha-editor"), api.client("alpha-operator")
    run_id = editor.post("/runs", json={"project": "alpha", "brief": "fix", "provider": "broken"}).json()["run_id"]
    assert finished(editor, run_id, "failed", "succeeded")["status"] == "failed"
    retried = editor.post(f"/runs/{run_id}/retry", json={"provider": "fixer"})
    assert retried.status_code == 201, retried.text
    child = retried.json()
    assert child["run_id"] != run_id and child["lineage"]["parent_run_id"] == run_id
    assert finished(editor, child["run_id"], "succeeded", "failed")["status"] == "succeeded"
    third = editor.post("/runs", json={"project": "alpha", "brief": "fix", "provider": "quota"}).json()["run_id"]
    finished(editor, third, "paused")
    assert_problem(editor.post(f"/runs/{third}/cancel", json={}), 403, "forbidden")
    cancelled = operator.post(f"/runs/{third}/cancel", json={"reason": "not needed"})
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"


def test_other_projects_runs_and_projects_are_404(runs_api: tuple[Api, Path]) -> None:
    api, origin = runs_api
    register(api, origin)
    run_id = api.client("alpha-editor").post("/runs", json={"project": "alpha", "brief": "fix",
                                                            "provider": "fixer"}).json()["run_id"]
    outsider = api.client("beta-operator")
    for suffix in ("", "/plan", "/journal"):
        assert_problem(outsider.get(f"/runs/{run_id}{suffix}"), 404, "run_not_found")
    for suffix, body in (("/resume", {}), ("/handoff", {"agent": "fixer"}), ("/retry", {}), ("/cancel", {})):
        assert_problem(outsider.post(f"/runs/{run_id}{suffix}", json=body), 404, "run_not_found")
    assert outsider.get("/runs").json()["runs"] == []
    assert_problem(outsider.post("/runs", json={"project": "alpha", "brief": "b", "provider": "fixer"}), 404,
                   "project_not_found")
    assert_problem(outsider.get("/projects/alpha"), 404, "project_not_found")
    assert [p["name"] for p in outsider.get("/projects").json()["projects"]] == ["beta"]
    mine = api.client("alpha-viewer").get("/projects/alpha").json()
    assert mine["origin"] == str(origin) and mine["role"] == "viewer"


def test_only_admins_register_projects_and_change_policies(runs_api: tuple[Api, Path]) -> None:
    api, origin = runs_api
    operator, admin = api.client("alpha-operator"), api.client("admin")
    assert_problem(operator.post("/projects", json={"name": "alpha", "origin": str(origin)}), 403, "forbidden")
    register(api, origin)
    assert_problem(operator.put("/projects/alpha/policy", json={"policy": policy(repairs=2)}), 403, "forbidden")
    changed = admin.put("/projects/alpha/policy", json={"policy": policy(repairs=2)})
    assert changed.status_code == 200 and changed.json()["policy"]["limits"]["max_repair_attempts"] == 2
    bad = assert_problem(admin.put("/projects/alpha/policy", json={"policy": {"checks": "nope"}}), 422,
                         "invalid_policy")
    assert bad["detail"]
    assert_problem(admin.put("/projects/nowhere/policy", json={"policy": policy()}), 404, "project_not_found")


def _problems_alike(missing: dict[str, Any], hidden: dict[str, Any], missing_id: str, real_id: str) -> None:
    """Two 404 bodies are the same but for the id the caller sent itself."""
    assert {k: str(v).replace(missing_id, real_id) for k, v in missing.items()} == {k: str(v) for k, v in
                                                                                     hidden.items()}


def test_another_projects_run_and_a_missing_run_answer_the_same_404_without_the_store_location(
        runs_api: tuple[Api, Path]) -> None:
    api, origin = runs_api
    register(api, origin)
    run = api.client("alpha-editor").post("/runs", json={"project": "alpha", "brief": "fix", "provider": "fixer"})
    assert run.status_code == 201, run.text
    run_id = run.json()["run_id"]
    missing_id = "01" + "3" * 24
    outsider = api.client("beta-operator")
    rid = "01" + "4" * 24
    gets = ["", "/plan", "/journal", "/execution-requests", f"/execution-requests/{rid}"]
    posts = {"/resume": {}, "/handoff": {"agent": "ok"}, "/retry": {}, "/cancel": {},
             "/publications": {}, "/remote-tasks": {"kind": "deploy", "provider": "p"},
             f"/execution-requests/{rid}/reconcile": {"reconciliation_id": "a" * 32},
             f"/execution-requests/{rid}/inspect": {},
             f"/execution-requests/{rid}/resolve": {"resolution": "occurred", "note": "n"},
             f"/tasks/{rid}/resolve": {"resolution": "not_occurred", "note": "n"}}
    calls = [("GET", suffix, None) for suffix in gets] + [("POST", suffix, body) for suffix, body in posts.items()]
    for method, suffix, body in calls:
        hidden = assert_problem(outsider.request(method, f"/runs/{run_id}{suffix}", json=body), 404, "run_not_found")
        missing = assert_problem(outsider.request(method, f"/runs/{missing_id}{suffix}", json=body), 404,
                                 "run_not_found")
        _problems_alike(missing, hidden, missing_id, run_id)
        assert str(api.store.url) not in str(missing) and "sqlite" not in str(missing)
    # The caller's own project: a missing run there does not name the store either.
    own = assert_problem(api.client("alpha-viewer").get(f"/runs/{missing_id}"), 404, "run_not_found")
    assert "sqlite" not in str(own)
