"""Execution requests over HTTP: list them, and reconcile one from retained evidence (operator only; 409
without proof). The interrupted publications are made by the runs suite's real crash child (SIGKILL)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from jixu.server import create_app, create_token
from tests.runs.run_helpers import run
from tests.runs.test_execution_requests import RECONCILE_A, RECONCILE_B, Scene, crash_publication
from tests.server.conftest import LiveServer
from tests.server.test_auth_and_problems import assert_problem
from tests.server.test_cli_remote import jixu


@pytest.fixture
def scene(tmp_path: Path) -> Iterator[Scene]:
    made = Scene(tmp_path)
    yield made
    made.close()


def tokens_of(client: httpx.Client) -> str:
    return str(client.headers["Authorization"]).removeprefix("Bearer ")


def clients(scene: Scene, *, publishers: bool = False) -> tuple[LiveServer, dict[str, httpx.Client]]:
    """A live server over the scene's store (with its publishers: git and the fake GitHub) and a client per role."""
    tokens = {role: create_token(scene.store, f"calc-{role}", roles={"calc": role})[1]
              for role in ("viewer", "editor", "operator")}
    tokens["outsider"] = create_token(scene.store, "outsider", roles={"other": "operator"})[1]
    server = LiveServer(create_app(scene.store, workspace_root=scene.root,
                                   publishers=scene.publishers() if publishers else None))
    server.start()
    return server, {who: httpx.Client(base_url=f"{server.url}/api/v1", headers={"Authorization": f"Bearer {t}"},
                                      timeout=30) for who, t in tokens.items()}


@pytest.mark.crash
def test_without_proof_reconcile_is_409_and_the_request_stays_unknown(scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    crash_publication(scene, request_id, "after_effect")
    server, http = clients(scene)
    try:
        listed = http["viewer"].get(f"/runs/{scene.run_id}/execution-requests")
        assert listed.status_code == 200, listed.text
        [request] = listed.json()["requests"]
        assert request["request_id"] == request_id and request["status"] == "needs_reconciliation"
        path = f"/runs/{scene.run_id}/execution-requests/{request_id}/reconcile"
        assert_problem(http["editor"].post(path, json={"reconciliation_id": RECONCILE_A}), 403, "forbidden")
        assert_problem(http["outsider"].post(path, json={"reconciliation_id": RECONCILE_A}), 404, "run_not_found")
        assert_problem(http["outsider"].get(f"/runs/{scene.run_id}/execution-requests"), 404, "run_not_found")
        bad = assert_problem(http["operator"].post(path, json={"reconciliation_id": "xyz"}), 422, "invalid_input")
        assert bad["field"] == "reconciliation_id"
        refused = assert_problem(http["operator"].post(path, json={"reconciliation_id": RECONCILE_A}), 409,
                                 "reconciliation_needs_proof")
        assert refused["result"]["settled"] is False
        after = http["viewer"].get(f"/runs/{scene.run_id}/execution-requests").json()["requests"][0]
        assert after["status"] == "needs_reconciliation"
        # The same through the CLI's remote mode: exit 4 (conflict) without proof.
        env = {"JIXU_SERVER": server.url, "JIXU_TOKEN": tokens_of(http["operator"])}
        listed_cli = jixu("remote", "runs", "execution-requests", scene.run_id, "--json", env=env)
        assert json.loads(listed_cli.stdout)[0]["status"] == "needs_reconciliation"
        cli = jixu("remote", "runs", "reconcile-execution-request", scene.run_id, request_id,
                   "--reconciliation-id", RECONCILE_B, env=env)
        assert cli.returncode == 4 and "reconciliation_needs_proof" in cli.stderr
        assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1  # nothing was repeated
    finally:
        for client in http.values():
            client.close()
        server.stop()


@pytest.mark.crash
def test_with_proof_an_operator_settles_the_request_once(scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    crash_publication(scene, request_id, "before_request_receipt")
    server, http = clients(scene)
    try:
        path = f"/runs/{scene.run_id}/execution-requests/{request_id}/reconcile"
        settled = http["operator"].post(path, json={"reconciliation_id": RECONCILE_A})
        assert settled.status_code == 200, settled.text
        assert settled.json()["settled"] is True and settled.json()["outcome"] == "succeeded"
        operator_id = http["operator"].get("/whoami").json()["actor"]
        assert settled.json()["actor"] == operator_id
        again = http["operator"].post(path, json={"reconciliation_id": RECONCILE_A})
        assert again.status_code == 200 and again.json() == settled.json()
        assert_problem(http["operator"].post(path, json={"reconciliation_id": RECONCILE_B}), 409,
                       "already_reconciled")
        listed = http["viewer"].get(f"/runs/{scene.run_id}/execution-requests").json()["requests"]
        assert listed[0]["status"] == "succeeded"
    finally:
        for client in http.values():
            client.close()
        server.stop()


def test_publish_over_http_then_a_worker_carries_it_out(scene: Scene) -> None:
    server, http = clients(scene, publishers=True)
    try:
        path = f"/runs/{scene.run_id}/publications"
        assert_problem(http["editor"].post(path, json={"publisher": "github"}), 403, "forbidden")
        assert_problem(http["operator"].post(path, json={"publisher": "gitlab"}), 422, "unknown_provider")
        admitted = http["operator"].post(path, json={"publisher": "github", "title": "Fix add()"},
                                         headers={"Idempotency-Key": "publish-once"})
        assert admitted.status_code == 201, admitted.text
        request = admitted.json()
        assert (request["status"], request["actor"], request["kind"]) == ("pending", request["actor"], "publication")
        assert request["actor"].startswith("token:")
        again = http["operator"].post(path, json={"publisher": "github", "title": "Fix add()"},
                                      headers={"Idempotency-Key": "publish-once"})
        assert again.status_code == 201 and again.json()["request_id"] == request["request_id"]
        assert_problem(http["operator"].post(path, json={"publisher": "github"}), 409, "request_state_error")
        assert scene.pushes() == [] and scene.github.creation_requests == 0  # admitted, not yet carried out
        run(scene.runs.execute_request(request["request_id"]))  # what a worker does with the queued request
        shown = http["viewer"].get(f"/runs/{scene.run_id}/execution-requests/{request['request_id']}")
        assert shown.status_code == 200 and shown.json()["status"] == "succeeded"
        assert shown.json()["receipt"]["result"]["pr_number"] == 1
        assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1
    finally:
        for client in http.values():
            client.close()
        server.stop()


@pytest.mark.crash
def test_inspect_then_resolve_an_unknown_publication_over_http(scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    crash_publication(scene, request_id, "after_effect")
    server, http = clients(scene, publishers=True)
    try:
        base = f"/runs/{scene.run_id}/execution-requests/{request_id}"
        resolve = {"resolution": "occurred", "note": "PR #1 is ours"}
        assert_problem(http["operator"].post(f"{base}/resolve", json=resolve), 409, "request_state_error")
        assert_problem(http["editor"].post(f"{base}/inspect", json={}), 403, "forbidden")
        found = http["operator"].post(f"{base}/inspect", json={})
        assert found.status_code == 200, found.text
        assert [p["number"] for p in found.json()["found"]["pull_requests"]] == [1]
        assert found.json()["settled"] is True  # the inspection is the probe: it found the admitted source
        shown = http["viewer"].get(base)
        assert shown.status_code == 200 and shown.json()["status"] == "succeeded"
        assert "probe:github" in shown.json()["reason"]
        contradicts = {"resolution": "not_occurred", "note": "nothing happened"}
        assert_problem(http["operator"].post(f"{base}/resolve", json=contradicts), 409, "resolution_needs_evidence")
        assert_problem(http["operator"].post(f"/runs/{scene.run_id}/execution-requests/{'0' * 26}/inspect",
                                             json={}), 404, "request_not_found")
        assert_problem(http["operator"].post(f"/runs/{scene.run_id}/tasks/{'0' * 26}/resolve",
                                             json={"resolution": "not_occurred", "note": "n"}), 404, "not_found")
        assert len(scene.pushes()) == 1 and scene.github.creation_requests == 1
    finally:
        for client in http.values():
            client.close()
        server.stop()


@pytest.mark.crash
def test_remote_cli_inspects_resolves_and_publishes(scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="github"))
    crash_publication(scene, request_id, "before_effect")  # dispatched, nothing pushed
    server, http = clients(scene, publishers=True)
    try:
        env = {"JIXU_SERVER": server.url, "JIXU_TOKEN": tokens_of(http["operator"])}
        found = jixu("remote", "runs", "inspect-remote", scene.run_id, request_id, "--json", env=env)
        assert found.returncode == 0, found.stderr
        assert json.loads(found.stdout)["found"]["remote_commit"] is None
        resolved = jixu("remote", "runs", "resolve-request", scene.run_id, request_id, "--resolution",
                        "not_occurred", "--note", "no branch, no pull request", "--json", env=env)
        assert resolved.returncode == 0 and json.loads(resolved.stdout)["status"] == "failed"
        bad = jixu("remote", "runs", "remote-task", scene.run_id, "--kind", "deploy", "--provider", "x",
                   "--parameters", "[1]", env=env)
        assert bad.returncode == 6
        again = jixu("remote", "runs", "publish", scene.run_id, "--publisher", "github", "--json", env=env)
        assert again.returncode == 0, again.stderr
        second = json.loads(again.stdout)
        assert (second["attempt"], second["status"]) == (2, "pending")
        viewer = {"JIXU_SERVER": server.url, "JIXU_TOKEN": tokens_of(http["viewer"])}
        refused = jixu("remote", "runs", "publish", scene.run_id, env=viewer)
        assert refused.returncode == 7
        assert scene.pushes() == [] and scene.github.creation_requests == 0
    finally:
        for client in http.values():
            client.close()
        server.stop()
