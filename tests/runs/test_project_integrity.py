"""Nothing acts on a project, a run's frozen policy or a run's lineage it did not verify (decision 0025).

An attacker with write access to the SQLite file (the immutability triggers
dropped first) changes the project's stream: its registered policy, or an
origin change edited back to the revoked origin. Creating a run, admitting a
deploy or a publication, and changing the project are then refused with
:class:`~jixu.errors.ProjectCorrupt` naming the first bad seq and reason, and
nothing is appended anywhere. Likewise a run's ``run.created`` whose policy no
longer matches its ``policy_digest`` (every hash recomputed), a request of a
corrupt run, and a new run naming a corrupt run as its parent.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import ProjectCorrupt, RunCorrupt
from jixu.ledger import SQLiteStore
from jixu.ledger.chain import row_hash
from jixu.ledger.encoding import canonical_text
from jixu.ledger.event import StoredRow
from jixu.runs import (
    CommandRemote,
    Runs,
    ScriptedProvider,
    change_origin,
    get_project,
    list_projects,
    update_policy,
)
from jixu.runs.model import project_stream, run_stream
from tests.attacker import KINDS, Raw, flip_data_byte
from tests.runs.run_helpers import fix, make_origin, policy, register, run

PROJECT = project_stream("calc")


def _events(db: Path) -> list[tuple[Any, ...]]:
    """Every event (stream, seq, hash): equal before and after means nothing was appended."""
    with Raw(db).transaction() as sql:
        return sql("SELECT stream, seq, hash FROM jixu_events ORDER BY stream, seq")


def _edit_data(db: Path, stream: str, seq: int, edit: Any) -> None:
    """Replace the data of ``stream``'s event ``seq`` with ``edit(data)`` (its stored hash kept: a break)."""
    row = Raw(db).row(stream, seq)
    data = edit(json.loads(row.data_json))
    with Raw(db).transaction() as sql:
        sql("UPDATE jixu_events SET data = ? WHERE stream = ? AND seq = ?", canonical_text(data), stream, seq)


def _rewrite(db: Path, stream: str, seq: int, edit: Any) -> None:
    """Replace the data of event ``seq`` and recompute every hash from there to the head: a chain that verifies."""
    raw = Raw(db)
    head = raw.head(stream)
    rows = [raw.row(stream, s) for s in range(seq, head + 1)]
    prev = rows[0].prev_hash
    with raw.transaction() as sql:
        for index, row in enumerate(rows):
            data = canonical_text(edit(json.loads(row.data_json))) if index == 0 else row.data_json
            new_hash = row_hash(StoredRow(row.id, row.stream, row.seq, row.type, data, row.meta_json,
                                          row.recorded_at, prev, ""))
            sql("UPDATE jixu_events SET data = ?, prev_hash = ?, hash = ? WHERE stream = ? AND seq = ?", data, prev,
                new_hash, stream, row.seq)
            prev = new_hash
        sql("UPDATE jixu_streams SET head_hash = ? WHERE stream = ?", prev, stream)


def _always_passes(data: dict[str, Any]) -> dict[str, Any]:
    data["policy"]["checks"][0]["argv"] = ["true"]
    return data


def _services(db: Path, tmp_path: Path) -> tuple[SQLiteStore, Runs]:
    store = SQLiteStore(db)
    deployer = CommandRemote("cmd", [sys.executable, "-c", f"open({str(tmp_path / 'deployed')!r}, 'a').write('x')"])
    return store, Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix, fix])},
                       remotes={"cmd": deployer})


def _refused(error: pytest.ExceptionInfo[ProjectCorrupt] | pytest.ExceptionInfo[RunCorrupt], seq: int,
             reason: str) -> None:
    assert (error.value.details["first_bad_seq"], error.value.details["reason"]) == (seq, reason), error.value


@pytest.mark.parametrize("kind", ["data_byte", "actor", "policy"])
def test_a_changed_registration_refuses_every_use_of_the_project_and_writes_nothing(tmp_path: Path,
                                                                                    kind: str) -> None:
    db = tmp_path / "ledger.db"
    with SQLiteStore(db) as store:
        register(store, make_origin(tmp_path))
    if kind == "policy":  # the auditor's case: the one check replaced by `true`, so a broken change "passes"
        _edit_data(db, PROJECT, 1, _always_passes)
        reason = "payload_changed"
    else:
        tamper, reason = KINDS[kind]
        tamper(Raw(db), PROJECT, 1)
    before = _events(db)
    store, runs = _services(db, tmp_path)
    with store:
        with pytest.raises(ProjectCorrupt) as caught:
            run(runs.create_run("calc", "fix add()", provider="scripted"))
        _refused(caught, 1, reason)
        assert caught.value.code == "project_corrupt"
        for attempt in (lambda: get_project(store, "calc"), lambda: list_projects(store),
                        lambda: update_policy(store, "calc", policy(repairs=2)),
                        lambda: change_origin(store, "calc", str(make_origin(tmp_path, "other")))):
            with pytest.raises(ProjectCorrupt) as caught:
                attempt()
            _refused(caught, 1, reason)
    assert _events(db) == before, "nothing may be written under a project that does not verify"


def test_an_origin_change_edited_back_refuses_deploy_and_publication_admission(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    store, runs = _services(db, tmp_path)
    with store:
        register(store, make_origin(tmp_path))
        run_id = run(runs.create_run("calc", "fix add()", provider="scripted"))
        assert run(runs.execute(run_id)).status == "succeeded"
        revoked = change_origin(store, "calc", str(make_origin(tmp_path, "other")))
    seq = revoked.seq
    _edit_data(db, PROJECT, seq, lambda data: {**data, "origin": data["previous_origin"]})
    before = _events(db)
    store, runs = _services(db, tmp_path)
    with store:
        for attempt in (runs.request_remote(run_id, "deploy", provider="cmd"), runs.request_publication(run_id)):
            with pytest.raises(ProjectCorrupt) as caught:
                run(attempt)
            _refused(caught, seq, "payload_changed")
        assert not (tmp_path / "deployed").exists()
    assert _events(db) == before, "an admission under a project that does not verify writes nothing"


def test_a_frozen_policy_that_no_longer_matches_its_digest_makes_the_run_corrupt(tmp_path: Path) -> None:
    """run.created rewritten with every hash recomputed (the chain verifies): its policy is not its digest's."""
    db = tmp_path / "ledger.db"
    store, runs = _services(db, tmp_path)
    with store:
        register(store, make_origin(tmp_path))
        run_id = run(runs.create_run("calc", "fix add()", provider="scripted"))
    _rewrite(db, run_stream(run_id), 1, _always_passes)
    before = _events(db)
    store, runs = _services(db, tmp_path)
    with store:
        state = run(runs.state(run_id))
        assert state.status == "corrupt" and state.corruption is not None
        assert (state.corruption.first_bad_seq, state.corruption.reason) == (1, "contradictory_record")
        assert run(runs.execute(run_id)).status == "corrupt"
        with pytest.raises(RunCorrupt) as caught:
            run(runs.cancel(run_id))
        _refused(caught, 1, "contradictory_record")
    assert _events(db) == before
    assert not (tmp_path / "ws" / run_id).exists(), "nothing ran with the rewritten policy"


def _deploy_admitted(tmp_path: Path) -> tuple[Path, str, str]:
    """A succeeded run of project calc with a deploy admitted: (db, run, request)."""
    db = tmp_path / "ledger.db"
    store, runs = _services(db, tmp_path)
    with store:
        register(store, make_origin(tmp_path))
        run_id = run(runs.create_run("calc", "fix add()", provider="scripted"))
        assert run(runs.execute(run_id)).status == "succeeded"
        request_id = run(runs.request_remote(run_id, "deploy", provider="cmd"))
    return db, run_id, request_id


def _corrupt_succeeded_run(tmp_path: Path) -> tuple[Path, str, str]:
    """:func:`_deploy_admitted`, then one byte of the run's journal's seq 4 changed: (db, run, request)."""
    db, run_id, request_id = _deploy_admitted(tmp_path)
    flip_data_byte(Raw(db), run_stream(run_id), 4)
    return db, run_id, request_id


def test_executing_a_request_of_a_corrupt_run_is_refused_and_nothing_runs(tmp_path: Path) -> None:
    db, _run_id, request_id = _corrupt_succeeded_run(tmp_path)
    before = _events(db)
    store, runs = _services(db, tmp_path)
    with store:
        with pytest.raises(RunCorrupt) as caught:
            run(runs.execute_request(request_id))  # it used to answer "pending"
        _refused(caught, 4, "payload_changed")
    assert not (tmp_path / "deployed").exists(), "the deploy never ran"
    assert _events(db) == before


def test_a_run_naming_a_corrupt_run_as_its_parent_is_refused(tmp_path: Path) -> None:
    db, run_id, _request_id = _corrupt_succeeded_run(tmp_path)
    before = _events(db)
    store, runs = _services(db, tmp_path)
    with store:
        with pytest.raises(RunCorrupt) as caught:
            run(runs.create_run("calc", "again", provider="scripted", parent_run_id=run_id))
        _refused(caught, 4, "payload_changed")
    assert _events(db) == before


def test_a_worker_hands_a_request_of_a_corrupt_run_to_an_operator_instead_of_requeueing_it(tmp_path: Path) -> None:
    """Execute_request refuses with RunCorrupt; the worker used to treat that as a bug and put the item back every
    lease, for ever. It is an operator's now: the item is done, nothing ran, nothing was appended."""
    import asyncio

    from jixu.scheduling import Worker, WorkerConfig

    db, _run_id, request_id = _corrupt_succeeded_run(tmp_path)
    before = _events(db)
    store, runs = _services(db, tmp_path)
    said: list[tuple[str, str]] = []
    with store:
        config = WorkerConfig(store_url=str(store.url), providers="given:directly",  # a label: the worker gets its providers below
                              workspace_root=str(tmp_path / "ws"), owner="w-1", poll_interval=0.01,
                              exit_when_idle=True)
        worker = Worker(None, store, config, providers={}, report=lambda kind, text: said.append((kind, text)))
        worker.runs = runs  # with the deploy command's remote
        asyncio.run(asyncio.wait_for(worker.run(), 30))
        assert [(item.key, item.state) for item in store.list_work()] == [(f"request/{request_id}", "done")]
    assert [kind for kind, _ in said if kind in ("operator", "error")] == ["operator"], said
    assert not (tmp_path / "deployed").exists() and _events(db) == before


def test_a_listing_shows_a_corrupt_project_as_corrupt_and_still_lists_the_others(tmp_path: Path) -> None:
    """One tampered project stream made every listing fail (409 for every caller, naming a project the caller may
    not see). The HTTP listing and `jixu projects list` now show it corrupt (no origin, no policy), to those who may
    see it, beside the sound ones."""
    import httpx

    from jixu.runs import survey_projects
    from jixu.server import create_app, create_token
    from tests.helpers import run_jixu
    from tests.server.conftest import LiveServer

    db = tmp_path / "ledger.db"
    with SQLiteStore(db) as store:
        register(store, make_origin(tmp_path), "calc")
        register(store, make_origin(tmp_path, "other"), "docs")
        _, admin = create_token(store, "root", admin=True, actor="test")
        _, docs_only = create_token(store, "docs-viewer", roles={"docs": "viewer"}, actor="test")
    _edit_data(db, project_stream("calc"), 1, _always_passes)
    with SQLiteStore(db) as store:
        sound, broken = survey_projects(store)
        assert [p.name for p in sound] == ["docs"] and [e.details["project"] for e in broken] == ["calc"]
        server = LiveServer(create_app(store))
        server.start()
        try:
            def listed(token: str) -> list[dict[str, Any]]:
                answer = httpx.get(f"{server.url}/api/v1/projects", headers={"Authorization": f"Bearer {token}"})
                assert answer.status_code == 200, answer.text
                rows: list[dict[str, Any]] = answer.json()["projects"]
                return rows

            rows = {row["name"]: row for row in listed(admin)}
            assert rows["calc"]["corrupt"]["first_bad_seq"] == 1 and "origin" not in rows["calc"]
            assert rows["docs"]["origin"] and rows["docs"].get("corrupt") is None
            assert [row["name"] for row in listed(docs_only)] == ["docs"], "a hidden project stays hidden"
        finally:
            server.stop()
    shown = run_jixu("projects", "list", str(db), "--json")
    assert shown.returncode == 1 and [row["name"] for row in json.loads(shown.stdout)] == ["docs", "calc"]


def test_a_corrupt_projects_runs_are_not_retried_queued_or_executed_and_no_surface_offers_it(tmp_path: Path) -> None:
    """The project's own reads were refused, but its runs were still retried (the Studio offered Retry and the
    server's worker ran the new run), queued and executed."""
    from jixu.runs import ImplementResult, ScriptedProvider
    from jixu.runs.operations import next_operations
    from jixu.server import create_token
    from tests.helpers import run_jixu
    from tests.runs.run_helpers import studio_browser

    def give_up(workspace: Path, context: Any) -> ImplementResult:
        return ImplementResult("changed nothing", {})  # the check still fails: the run fails

    db = tmp_path / "ledger.db"
    with SQLiteStore(db) as store:
        register(store, make_origin(tmp_path), repairs=0)
        runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [give_up])})
        failed = run(runs.create_run("calc", "fix add()", provider="scripted"))
        assert run(runs.execute(failed)).status == "failed"
        queued = run(runs.create_run("calc", "again", provider="scripted"))
        _, admin = create_token(store, "root", admin=True, actor="test")
    _edit_data(db, PROJECT, 1, _always_passes)
    before = _events(db)
    with SQLiteStore(db) as store:
        runs = Runs(store, tmp_path / "ws", {"scripted": ScriptedProvider("scripted", [fix])})
        for operation in (runs.retry(failed, "ops"), runs.execute(queued), runs.resume(queued, "ops")):
            with pytest.raises(ProjectCorrupt):
                run(operation)
        for run_id in (failed, queued):
            state = run(runs.state(run_id))
            assert state.blocked is not None and state.blocked["by"] == "project_corrupt"
            assert next_operations(state, str(db)) == []
        with studio_browser(store, tmp_path / "ws", admin) as browser:
            page = browser.get(f"/studio/runs/{failed}").text
        assert 'id="blocked"' in page and "/retry" not in page and "/resume" not in page
    queue = run_jixu("runs", "queue", str(db), queued)
    assert queue.returncode == 1 and "project_corrupt" in queue.stderr, queue.stderr
    assert _events(db) == before, "nothing was written for a corrupt project's runs"


def test_another_attempt_beside_a_corrupt_request_is_refused_saying_it_is_corrupt(tmp_path: Path) -> None:
    """The refusal said "reconcile it", which every reconciliation of a corrupt request refuses."""
    from jixu.errors import RequestStateError

    db, run_id, request_id = _deploy_admitted(tmp_path)
    flip_data_byte(Raw(db), f"request/{request_id}", 1)
    before = _events(db)
    store, runs = _services(db, tmp_path)
    with store, pytest.raises(RequestStateError) as refused:
        run(runs.request_remote(run_id, "deploy", provider="cmd"))
    assert "is corrupt" in refused.value.message and "reconcile it" not in refused.value.message
    assert refused.value.details["request_status"] == "corrupt" and _events(db) == before
