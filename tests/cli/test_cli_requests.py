"""``jixu runs publish | execution-requests | reconcile-execution-request | inspect-remote | resolve-request |
resolve-task`` as an operator runs them: real ``python -m jixu`` subprocesses over a real bare origin."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.cli.test_cli_runs import Env, make_env

PUBLISHERS = """\
from jixu.runs import GitPublisher


class Flaky(GitPublisher):
    async def publish(self, context):
        await super().publish(context)  # the push happens ...
        raise RuntimeError("connection reset by peer")  # ... but the answer is lost


def publishers():
    return {"git": GitPublisher(), "flaky": Flaky("flaky")}
"""
SPEC = "runs_publishers:publishers"
HEX_A, HEX_B = "a" * 32, "b" * 32


@pytest.fixture
def project(tmp_path: Path) -> Env:
    made = make_env(tmp_path)
    made.register()
    return made


def succeeded_run(env: Env) -> str:
    code, body = env.create("fixer", "--execute")
    assert code == 0 and body["run"]["status"] == "succeeded", body
    return str(body["run_id"])


def branch_on_origin(env: Env, branch: str) -> str:
    return subprocess.run(["git", "ls-remote", "--heads", str(env.origin), f"refs/heads/{branch}"],
                          capture_output=True, text=True, check=True).stdout.split("\t")[0]


def test_publish_list_and_reconcile_a_publication(project: Env) -> None:
    env = project
    run_id = succeeded_run(env)
    code, published = env.json("runs", "publish", str(env.db), run_id, "--execute", "--actor", "alice")
    assert code == 0, published
    request = published["request"]
    assert (request["status"], request["kind"], request["actor"]) == ("succeeded", "publication", "alice")
    commit = request["receipt"]["result"]["pushed_commit"]
    assert branch_on_origin(env, f"jixu/{run_id}") == commit
    code, listed = env.json("runs", "execution-requests", str(env.db), run_id)
    assert code == 0 and [r["request_id"] for r in listed["requests"]] == [request["request_id"]]
    human = env.jixu("runs", "execution-requests", str(env.db), run_id)
    assert human.returncode == 0 and "publication" in human.stdout and commit[:12] in human.stdout

    reconcile = ("runs", "reconcile-execution-request", str(env.db), run_id, request["request_id"])
    code, first = env.json(*reconcile, "--reconciliation-id", HEX_A)
    assert code == 0 and first["result"]["settled"] is True
    code, again = env.json(*reconcile, "--reconciliation-id", HEX_A)
    assert code == 0 and again == first
    code, other = env.json(*reconcile, "--reconciliation-id", HEX_B)
    assert code == 4 and other["error"]["code"] == "already_reconciled"
    code, bad = env.json(*reconcile, "--reconciliation-id", "XYZ")
    assert code == 6 and bad["error"]["field"] == "reconciliation_id"
    code, twice = env.json("runs", "publish", str(env.db), run_id, "--execute")
    assert code == 4 and twice["error"]["code"] == "request_state_error"
    code, missing = env.json("runs", "execution-requests", str(env.db), "0" * 26)
    assert code == 3 and missing["error"]["code"] == "run_not_found"


def test_an_unknown_publication_needs_inspection_and_an_operator_decision(project: Env) -> None:
    env = project
    (env.root / "runs_publishers.py").write_text(PUBLISHERS)
    run_id = succeeded_run(env)
    code, published = env.json("runs", "publish", str(env.db), run_id, "--publisher", "flaky", "--execute",
                               "--publishers", SPEC)
    assert code == 1, published  # the outcome is unknown: an operator is needed
    request: dict[str, Any] = published["request"]
    request_id = request["request_id"]
    assert request["status"] == "needs_reconciliation"
    assert "connection reset" in request["receipt"]["error"]["message"]
    pushed = branch_on_origin(env, f"jixu/{run_id}")
    assert pushed == request["intent"]["args"]["commit"]  # visible on the origin, still not proof

    refused = env.jixu("runs", "reconcile-execution-request", str(env.db), run_id, request_id,
                       "--reconciliation-id", HEX_A)
    assert refused.returncode == 4 and "no proof" in refused.stdout and "reconciliation_needs_proof" in refused.stderr
    code, early = env.json("runs", "resolve-request", str(env.db), run_id, request_id, "--resolution", "occurred",
                           "--note", "I think so")
    assert code == 4 and "inspect" in early["error"]["message"]
    code, found = env.json("runs", "inspect-remote", str(env.db), run_id, request_id, "--publishers", SPEC)
    assert code == 0 and found["found"]["remote_commit"] == pushed
    # The inspection is the probe: the branch at the intent's exact commit settles the request.
    assert found["settled"] is True
    human = env.jixu("runs", "inspect-remote", str(env.db), run_id, request_id, "--publishers", SPEC)
    assert human.returncode == 0 and pushed in human.stdout and "settled already" in human.stdout
    code, listed = env.json("runs", "execution-requests", str(env.db), run_id)
    [settled] = listed["requests"]
    assert settled["status"] == "succeeded" and "probe:flaky" in settled["reason"]
    code, contradicts = env.json("runs", "resolve-request", str(env.db), run_id, request_id, "--resolution",
                                 "not_occurred", "--note", "no", "--actor", "ops")
    assert code == 4 and contradicts["error"]["code"] == "resolution_needs_evidence"
    assert "contradicts" in contradicts["error"]["message"]
    code, body = env.json("runs", "resolve-task", str(env.db), run_id, "0" * 26, "--resolution", "not_occurred")
    assert code in (3, 4) and body["error"]["code"] in ("not_found", "run_state_error")


def test_cancel_records_a_cancellation_request(project: Env) -> None:
    env = project
    code, created = env.create("fixer")
    assert code == 0
    run_id = created["run_id"]
    code, cancelled = env.json("runs", "cancel", str(env.db), run_id, "--reason", "not needed")
    assert code == 0 and cancelled["run"]["status"] == "cancelled"
    code, listed = env.json("runs", "execution-requests", str(env.db), run_id)
    assert [(r["kind"], r["status"]) for r in listed["requests"]] == [("cancellation", "succeeded")]


REMOTES = """\
import sys
from pathlib import Path
from jixu.runs import CommandRemote

SCRIPT = Path(__file__).with_name("deploy_script.py")


def remotes():
    return {"deployer": CommandRemote("deployer", [sys.executable, str(SCRIPT)], timeout_s=60)}
"""
DEPLOY_SCRIPT = """\
import json, os, sys
if sys.argv[1] == "perform":
    with open(os.path.join(os.path.dirname(__file__), "deployed.log"), "a") as log:
        log.write(os.environ["JIXU_PARAMETERS"] + "\\n")
    print(json.dumps({"version": "v42"}))
elif sys.argv[1] == "inspect":
    print(json.dumps({"live_version": "v42"}))
"""


def test_remote_task_deploys_with_the_provider_version_as_evidence(project: Env) -> None:
    env = project
    (env.root / "runs_remotes.py").write_text(REMOTES)
    (env.root / "deploy_script.py").write_text(DEPLOY_SCRIPT)
    run_id = succeeded_run(env)
    code, bad = env.json("runs", "remote-task", str(env.db), run_id, "--kind", "deploy", "--provider", "deployer",
                         "--parameters", "{not json", "--remotes", "runs_remotes:remotes")
    assert code == 6 and bad["error"]["field"] == "parameters"
    code, done = env.json("runs", "remote-task", str(env.db), run_id, "--kind", "deploy", "--provider", "deployer",
                          "--parameters", '{"environment": "prod"}', "--remotes", "runs_remotes:remotes", "--execute")
    assert code == 0, done
    assert done["request"]["status"] == "succeeded" and done["request"]["receipt"]["result"]["version"] == "v42"
    assert (env.root / "deployed.log").read_text() == '{"environment": "prod"}\n'
    human = env.jixu("runs", "execution-requests", str(env.db), run_id)
    assert "deploy v42" in human.stdout
    code, found = env.json("runs", "inspect-remote", str(env.db), run_id, done["request_id"], "--remotes",
                           "runs_remotes:remotes")
    assert code == 0 and found["found"]["reported"] == {"live_version": "v42"}
