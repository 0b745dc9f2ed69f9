"""A failed run is retried once: ``run.retried`` in its own journal names the one fresh run, first.

A second retry, made after the first or racing it from another process, is a
:class:`~jixu.errors.RunStateError` naming the run it was retried as, and
exactly one child run exists. A process stopped between recording the retry
and creating the child leaves the journal naming a run that does not exist
yet: retrying again creates exactly that run.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import RunStateError
from jixu.ledger import SQLiteStore, Store
from jixu.runs import ProviderError, Runs, ScriptedProvider
from jixu.runs.model import run_stream
from tests.helpers import python_env
from tests.runs.run_helpers import fix, make_origin, register, run

RACER = """
import asyncio, json, sys, time
from jixu.errors import JixuError
from jixu.ledger import SQLiteStore
from jixu.runs import Runs, ScriptedProvider

db, root, run_id, owner, at = sys.argv[1:6]
runs = Runs(SQLiteStore(db), root, {"scripted": ScriptedProvider("scripted", [])}, owner=owner)
while time.time() < float(at):
    time.sleep(0.001)
try:
    print(json.dumps({"child": asyncio.run(runs.retry(run_id, owner))}))
except JixuError as error:
    print(json.dumps({"error": error.code, **error.details}))
"""


def _failed_run(store: Store, tmp_path: Path) -> str:
    register(store, make_origin(tmp_path))
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider(
        "scripted", [ProviderError("the agent gave up", kind="invalid")])})
    run_id: str = run(runs.create_run("calc", "fix add()", provider="scripted"))
    assert run(runs.execute(run_id)).status == "failed"
    return run_id


def _children(runs: Runs, parent: str) -> list[str]:
    return [s.run_id for s in run(runs.list_runs()) if s.lineage.get("parent_run_id") == parent]


def test_a_second_retry_is_refused_naming_the_first_and_one_child_exists(store: Store, tmp_path: Path) -> None:
    failed_id = _failed_run(store, tmp_path)
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
    child_id = run(runs.retry(failed_id, "alice"))
    journal = len(run(runs.journal(failed_id))[0])
    with pytest.raises(RunStateError) as caught:
        run(runs.retry(failed_id, "bob"))
    assert caught.value.details["retried_as"] == child_id and child_id in caught.value.message
    assert _children(runs, failed_id) == [child_id]
    assert len(run(runs.journal(failed_id))[0]) == journal, "the refused retry wrote nothing"
    assert run(runs.state(failed_id)).status == "failed"
    assert run(runs.execute(child_id)).status == "succeeded"


def test_a_retry_stopped_before_its_run_existed_creates_exactly_that_run_when_retried_again(
        store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    failed_id = _failed_run(store, tmp_path)
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})

    def stopped(*args: Any, **kwargs: Any) -> str:
        raise KeyboardInterrupt("the process stopped after recording the retry")

    with monkeypatch.context() as patch:
        patch.setattr(Runs, "_create", stopped)
        with pytest.raises(KeyboardInterrupt):
            run(runs.retry(failed_id, "alice"))
    named = run(runs.state(failed_id)).lineage["retried_as"]
    assert store.stream_info(run_stream(named)) is None and _children(runs, failed_id) == []

    assert run(runs.retry(failed_id, "bob")) == named
    child = run(runs.state(named))
    assert (child.lineage["parent_run_id"], child.status) == (failed_id, "queued")
    with pytest.raises(RunStateError) as caught:
        run(runs.retry(failed_id, "carol"))
    assert caught.value.details["retried_as"] == named
    assert _children(runs, failed_id) == [named]


def test_two_processes_retrying_at_once_make_one_run_and_the_other_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with SQLiteStore(db) as store:
        failed_id = _failed_run(store, tmp_path)
    at = time.time() + 2.0  # both start together, once both have imported jixu
    racers = [subprocess.Popen([sys.executable, "-c", RACER, str(db), str(tmp_path / "ws"), failed_id, owner,
                                str(at)], env=python_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True) for owner in ("racer-a", "racer-b")]
    answers = []
    for racer in racers:
        out, err = racer.communicate(timeout=60)
        assert racer.returncode == 0, err
        answers.append(json.loads(out.strip().splitlines()[-1]))
    [won] = [a["child"] for a in answers if "child" in a]
    [lost] = [a for a in answers if "error" in a]
    assert (lost["error"], lost["retried_as"], lost["run_id"]) == ("run_state_error", won, failed_id)
    with SQLiteStore(db) as store:
        runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
        assert _children(runs, failed_id) == [won]
        entries, valid = run(runs.journal(failed_id))
        assert valid and [e["data"]["child_run_id"] for e in entries if e["type"] == "run.retried"] == [won]


def test_the_studio_links_a_retried_run_to_its_retry_and_offers_no_second_retry(tmp_path: Path) -> None:
    """It offered "Retry as a new run" on a run already retried; the server then refused it (409)."""
    from jixu.server import create_token
    from tests.runs.run_helpers import studio_browser

    store = SQLiteStore(tmp_path / "ledger.db")
    failed = _failed_run(store, tmp_path)
    runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
    _, admin = create_token(store, "root", admin=True, actor="test")
    try:
        with studio_browser(store, tmp_path / "ws", admin) as browser:
            assert f"/runs/{failed}/retry" in browser.get(f"/studio/runs/{failed}").text
            child = run(runs.retry(failed, "ops"))
            page = browser.get(f"/studio/runs/{failed}").text
        assert f"/runs/{failed}/retry" not in page and f'href="/studio/runs/{child}" id="retried-as"' in page
    finally:
        store.close()
