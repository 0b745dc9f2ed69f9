"""Evidence beats assertion (issue 23): an operator cannot mark a publication done against the inspection.

A real worker process dispatches a publication to a real bare git origin and is SIGKILLed before it pushes.
The publisher's inspection (the probe) then finds nothing; on SQLite and PostgreSQL:

* ``occurred`` is refused (``ResolutionNeedsEvidence``, a 409) naming what is missing, and nothing is written;
* a branch at another commit is not evidence either;
* ``abandoned_unknown`` settles the request without claiming success, counts as an attempt, and the next
  attempt, which publishes, says that the earlier one stays unknown;
* when the origin does show the intent's commit, the inspection settles the request by itself.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import RequestStateError, ResolutionNeedsEvidence
from jixu.runs import GitPublisher, Runs, ScriptedProvider
from jixu.runs.workspace import remote_branch
from jixu.server.problems import status_of
from tests.conftest import StoreFactory
from tests.helpers import python_env
from tests.runs.fake_github import count_pushes, pushes
from tests.runs.run_helpers import fix, git, make_origin, register, run

pytestmark = pytest.mark.crash

CHILD = """
import asyncio, sys, time
from pathlib import Path
from jixu.ledger import open_store
from jixu.runs import GitPublisher, Runs

url, root, request_id, marker = sys.argv[1:5]

class Holding(GitPublisher):
    async def publish(self, context):
        Path(marker).write_text("dispatched")
        while True:
            time.sleep(0.05)

runs = Runs(open_store(url), root, {}, owner="publisher-worker", publishers={"git": Holding()})
asyncio.run(runs.execute_request(request_id))
"""


class Scene:
    """A store, a bare origin counting pushes, a succeeded run."""

    def __init__(self, tmp_path: Path, stores: StoreFactory) -> None:
        assert stores.url is not None
        self.tmp, self.url, self.store = tmp_path, stores.url, stores()
        self.origin = make_origin(tmp_path)
        self.push_log = count_pushes(self.origin)
        self.root = tmp_path / "ws"
        register(self.store, self.origin)
        self.runs = Runs(self.store, self.root, {"scripted": ScriptedProvider("scripted", [fix])},
                         publishers={"git": GitPublisher()})
        self.run_id: str = run(self.runs.create_run("calc", "fix add()", provider="scripted"))
        assert run(self.runs.execute(self.run_id)).status == "succeeded"

    def crash_before_the_push(self, request_id: str) -> None:
        marker = self.tmp / f"dispatched-{request_id}"
        with (self.tmp / "child.log").open("w") as log:
            child = subprocess.Popen([sys.executable, "-c", CHILD, self.url, str(self.root), request_id,
                                      str(marker)], env=python_env(), stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
            deadline = time.monotonic() + 60
            while not marker.exists():
                assert child.poll() is None, (self.tmp / "child.log").read_text()
                assert time.monotonic() < deadline
                time.sleep(0.01)
            child.kill()
            child.wait()

    def request_types(self, request_id: str) -> list[str]:
        return [e.type for e in self.store.read(f"request/{request_id}")]

    def view(self, request_id: str) -> Any:
        return run(self.runs.execution_request(self.run_id, request_id))


@pytest.fixture(params=["sqlite", "postgres"])
def scene(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Scene]:
    yield Scene(tmp_path, request.getfixturevalue(request.param))


def test_a_publication_cannot_be_marked_done_against_an_inspection_that_found_nothing(scene: Scene) -> None:
    first = run(scene.runs.request_publication(scene.run_id, publisher="git", actor="alice"))
    scene.crash_before_the_push(first)
    assert scene.view(first).status == "needs_reconciliation"
    found = run(scene.runs.inspect_remote(scene.run_id, first, actor="ops"))
    assert found["found"]["remote_commit"] is None and found["settled"] is False
    assert found["evidence"]["shown"] is False and "does not exist on the origin" in found["evidence"]["missing"][0]
    before = scene.request_types(first)
    with pytest.raises(ResolutionNeedsEvidence) as refused:
        run(scene.runs.resolve_request_outcome(scene.run_id, first, "occurred", actor="ops", note="I am sure"))
    assert "does not exist on the origin" in refused.value.message and "abandoned_unknown" in refused.value.message
    assert refused.value.details["inspection"]["event_id"] == found["event_id"]
    assert status_of(refused.value) == 409 and refused.value.code == "resolution_needs_evidence"
    assert scene.request_types(first) == before  # nothing recorded
    assert scene.view(first).status == "needs_reconciliation"
    with pytest.raises(RequestStateError, match="unresolved"):
        run(scene.runs.request_publication(scene.run_id, publisher="git"))

    # Someone else's commit on the branch is not the admitted source either.
    intent = scene.view(first).intent
    branch, commit = intent["args"]["branch"], intent["args"]["commit"]
    work = scene.tmp / "other"
    git("clone", "-q", str(scene.origin), str(work))
    (work / "other.txt").write_text("not the verified tree\n")
    git("add", "-A", cwd=work)
    git("commit", "-q", "-m", "other", cwd=work)
    git("push", "-q", "origin", f"HEAD:refs/heads/{branch}", cwd=work)
    other = remote_branch(str(scene.origin), branch)
    assert other is not None and other != commit
    found = run(scene.runs.inspect_remote(scene.run_id, first, actor="ops"))
    assert found["settled"] is False and f"not at the intent's commit {commit}" in found["evidence"]["missing"][0]
    with pytest.raises(ResolutionNeedsEvidence, match="not at the intent's commit"):
        run(scene.runs.resolve_request_outcome(scene.run_id, first, "occurred", actor="ops"))
    git("push", "-q", "origin", f":refs/heads/{branch}", cwd=work)  # the other clone takes its branch back

    # Abandoned: settled without a claim of success; it counts as an attempt.
    view = run(scene.runs.resolve_request_outcome(scene.run_id, first, "abandoned_unknown", actor="ops",
                                                  note="cannot tell"))
    assert view.status == "abandoned"
    second = run(scene.runs.request_publication(scene.run_id, publisher="git"))
    published = run(scene.runs.execute_request(second))
    assert (published.status, published.attempt) == ("succeeded", 2)
    assert f"earlier attempt(s) {first} stay unknown" in published.reason
    assert scene.view(first).status == "abandoned"  # the later success says nothing about the first
    assert [line.split()[0] for line in pushes(scene.push_log)].count(f"refs/heads/{branch}") == 3
    with pytest.raises(RequestStateError, match="already published"):
        run(scene.runs.request_publication(scene.run_id, publisher="git"))


def test_an_inspection_that_finds_the_intents_commit_settles_the_request_and_not_occurred_is_refused(
        scene: Scene) -> None:
    request_id = run(scene.runs.request_publication(scene.run_id, publisher="git"))
    scene.crash_before_the_push(request_id)
    intent = scene.view(request_id).intent
    branch, commit = intent["args"]["branch"], intent["args"]["commit"]
    # The push did happen after all (say, the git process outlived the worker): the origin has the commit.
    git("push", "-q", str(scene.origin), f"{commit}:refs/heads/{branch}", cwd=scene.root / scene.run_id)
    with pytest.raises(RequestStateError, match="inspect the provider first"):
        run(scene.runs.resolve_request_outcome(scene.run_id, request_id, "not_occurred", actor="ops"))
    found = run(scene.runs.inspect_remote(scene.run_id, request_id, actor="ops"))
    assert found["settled"] is True and found["evidence"]["compared"]["found_commit"] == commit
    view = scene.view(request_id)
    assert view.status == "succeeded" and "probe:git" in view.reason
    with pytest.raises(ResolutionNeedsEvidence, match="contradicts"):
        run(scene.runs.resolve_request_outcome(scene.run_id, request_id, "not_occurred", actor="ops"))
    assert scene.request_types(request_id)[-2:] == ["request.inspected", "publication.outcome_resolved"]
