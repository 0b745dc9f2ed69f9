"""Issue 22's tamper matrix for a run's journal and an execution request's stream (the Studio: tests/studio).

The Studio fixture (``jixu studio-fixture``: a paused run offering Resume, a
succeeded run whose publication request needs reconciliation) is recorded
once; each case is a copy of its store in which one stream was changed by raw
SQL (triggers dropped): the paused run's journal with no checkpoint, one at
its head or one in the middle, or the request's stream. The runs service, the
CLI and the HTTP API must all say ``corrupt``, name the same first bad seq and
reason, and refuse every operation with nothing appended.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu.cli.studio import fixture_agent, fixture_providers
from jixu.errors import RequestCorrupt, RunCorrupt
from jixu.ledger import SQLiteStore
from jixu.runs import Runs
from jixu.runs.operations import next_operations
from jixu.server import create_app
from jixu.server.auth import create_token
from tests.attacker import KINDS, Raw
from tests.helpers import run_jixu
from tests.server.conftest import LiveServer
from tests.tamper_cases import RunCase, copy_store, run, run_cases, run_fixture

PLACES = ("none", "head", "middle", "request")
NAMES = [f"{kind}-{place}" for place in PLACES for kind in KINDS]


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, RunCase]:
    base = tmp_path_factory.mktemp("run-matrix")
    path, fixture = run_fixture(base)
    made = {case.name: case for case in run_cases(base, path, fixture)}
    assert sorted(made) == sorted(NAMES)
    return made


def _events(case: RunCase) -> list[tuple[Any, ...]]:
    with Raw(case.path).transaction() as sql:
        return sql("SELECT stream, seq, hash FROM jixu_events WHERE stream LIKE 'run/%' OR stream LIKE 'request/%' "
                   "ORDER BY stream, seq")


def _names_it(found: dict[str, Any] | None, case: RunCase) -> None:
    assert found is not None, case.name
    assert (found["first_bad_seq"], found["reason"]) == (case.expected_seq, case.expected_reason), (case.name, found)


def _runs(store: SQLiteStore, case: RunCase) -> Runs:
    return Runs(store, case.fixture["workspace_root"], fixture_providers(), owner="matrix", actor="operator")


@pytest.mark.parametrize("name", NAMES)
def test_the_runs_service_shows_corrupt_and_refuses_every_operation(cases: dict[str, RunCase], name: str) -> None:
    case = cases[name]
    before = _events(case)
    with SQLiteStore(case.path) as store:
        runs = _runs(store, case)

        async def scenario() -> None:
            if case.placement == "request":
                view = await runs.execution_request(case.run_id, case.request_id)
                assert view.status == "corrupt" and not view.chain_valid
                _names_it(view.corruption, case)
                for attempt in (runs.reconcile_execution_request(case.run_id, case.request_id, "ab" * 16),
                                runs.inspect_remote(case.run_id, case.request_id),
                                runs.resolve_request_outcome(case.run_id, case.request_id, "not_occurred",
                                                             note="x")):
                    with pytest.raises(RequestCorrupt) as caught:
                        await attempt
                    assert (caught.value.details["first_bad_seq"], caught.value.details["reason"]) == (
                        case.expected_seq, case.expected_reason)
                assert (await runs.execute_request(case.request_id)).status == "corrupt"
                return
            state = await runs.state(case.run_id)
            assert state.status == "corrupt", state.reason
            assert state.corruption is not None
            _names_it(state.corruption.to_dict(), case)
            assert next_operations(state, str(case.path)) == [], "no operation is offered on a corrupt run"
            _entries, valid = await runs.journal(case.run_id)
            assert valid is False
            for attempt in (runs.resume(case.run_id), runs.handoff(case.run_id, "fixture-agent"),
                            runs.cancel(case.run_id), runs.retry(case.run_id),
                            runs.resolve_task_outcome(case.run_id, "01ARZ3NDEKTSV4RRFFQ69G5FAV", "not_occurred",
                                                      note="x")):
                with pytest.raises(RunCorrupt) as caught:
                    await attempt
                assert (caught.value.details["first_bad_seq"], caught.value.details["reason"]) == (
                    case.expected_seq, case.expected_reason)
            assert (await runs.execute(case.run_id)).status == "corrupt"
            assert [s.status for s in await runs.list_runs() if s.run_id == case.run_id] == ["corrupt"]
            # Its request, whether or not the record before the bad event still names it: the run is corrupt.
            for attempt in (runs.execution_request(case.run_id, case.request_id),
                            runs.reconcile_execution_request(case.run_id, case.request_id, "ab" * 16),
                            runs.inspect_remote(case.run_id, case.request_id),
                            runs.resolve_request_outcome(case.run_id, case.request_id, "not_occurred", note="x")):
                with pytest.raises(RunCorrupt):
                    await attempt

        run(scenario)
    assert _events(case) == before, "nothing may be appended to a broken stream"


def _jixu(*args: str) -> subprocess.CompletedProcess[str]:
    return run_jixu(*args)


@pytest.mark.parametrize("name", NAMES)
def test_jixu_verify_names_it(cases: dict[str, RunCase], name: str) -> None:
    case = cases[name]
    done = _jixu("verify", str(case.path), "--stream", case.stream, "--json")
    assert done.returncode == 1, done.stderr
    [entry] = json.loads(done.stdout)["streams"]
    assert (entry["valid"], entry["first_bad_seq"], entry["reason"]) == (False, case.expected_seq,
                                                                         case.expected_reason), entry


@pytest.fixture(scope="module")
def servers(cases: dict[str, RunCase]) -> Iterator[dict[str, tuple[LiveServer, httpx.Client]]]:
    """A real HTTP server over each tampered copy (the fixture's operator token)."""
    started: dict[str, tuple[LiveServer, httpx.Client]] = {}
    stores = []
    try:
        for name, case in cases.items():
            store = SQLiteStore(case.path)
            stores.append(store)
            server = LiveServer(create_app(store, agent=fixture_agent(), providers=fixture_providers(),
                                           workspace_root=case.fixture["workspace_root"]))
            server.start()
            client = httpx.Client(base_url=f"{server.url}/api/v1", timeout=30,
                                  headers={"Authorization": f"Bearer {case.fixture['operator_token']}"})
            started[name] = (server, client)
        yield started
    finally:
        for server, client in started.values():
            client.close()
            server.stop()
        for store in stores:
            store.close()


def _refused(answer: httpx.Response, case: RunCase, code: str) -> None:
    assert answer.status_code == 409, (answer.status_code, answer.text)
    assert answer.headers["content-type"].startswith("application/problem+json")
    problem = answer.json()
    assert problem["code"] == code, problem
    assert (problem["first_bad_seq"], problem["reason"]) == (case.expected_seq, case.expected_reason), problem


@pytest.mark.parametrize("name", NAMES)
def test_the_http_api_shows_corrupt_and_refuses_every_mutation(cases: dict[str, RunCase],
                                                               servers: dict[str, tuple[LiveServer, httpx.Client]],
                                                               name: str) -> None:
    case = cases[name]
    _server, client = servers[name]
    before = _events(case)
    if case.placement == "request":
        base = f"/runs/{case.run_id}/execution-requests/{case.request_id}"
        view = client.get(base).json()
        assert view["status"] == "corrupt"
        _names_it(view["corruption"], case)
        _refused(client.post(f"{base}/reconcile", json={"reconciliation_id": "cd" * 16}), case, "request_corrupt")
        _refused(client.post(f"{base}/inspect", json={}), case, "request_corrupt")
        _refused(client.post(f"{base}/resolve", json={"resolution": "not_occurred", "note": "x"}), case,
                 "request_corrupt")
    else:
        state = client.get(f"/runs/{case.run_id}").json()
        assert state["status"] == "corrupt"
        _names_it(state["corruption"], case)
        journal = client.get(f"/runs/{case.run_id}/journal").json()
        assert journal["valid"] is False
        _names_it(journal["corruption"], case)
        _names_it(client.get(f"/runs/{case.run_id}/execution-requests").json()["corruption"], case)
        for path, body in (("/resume", {}), ("/cancel", {}), ("/retry", {}), ("/handoff", {"agent": "fixture-agent"}),
                           ("/tasks/01ARZ3NDEKTSV4RRFFQ69G5FAV/resolve", {"resolution": "not_occurred", "note": "x"})):
            _refused(client.post(f"/runs/{case.run_id}{path}", json=body), case, "run_corrupt")
    assert _events(case) == before


@pytest.mark.parametrize("kind", ["data_byte", "delete", "actor"])
def test_a_run_whose_first_event_was_changed_is_corrupt_under_its_own_id(tmp_path: Path, kind: str) -> None:
    """``run.created`` names the run and its project: changed, the record stops before it. The run is still the
    stream's (never a run with no id), an admin sees and lists it as corrupt, every mutation is refused; its
    project is not known, so a project token gets the 404 of a run it cannot see."""
    path, fixture = run_fixture(tmp_path)
    copy = copy_store(path, tmp_path / "first-event.db")
    run_id = str(fixture["failed_check_run"])
    change, reason = KINDS[kind]
    change(Raw(copy), f"run/{run_id}", 1)
    case = RunCase(f"{kind}-first", kind, "none", copy, fixture, f"run/{run_id}", 1, reason)
    before = _events(case)
    with SQLiteStore(copy) as store:
        _info, admin_token = create_token(store, "root", admin=True, actor="test")
        server = LiveServer(create_app(store, agent=fixture_agent(), providers=fixture_providers(),
                                       workspace_root=fixture["workspace_root"]))
        server.start()
        admin = httpx.Client(base_url=f"{server.url}/api/v1", timeout=30,
                             headers={"Authorization": f"Bearer {admin_token}"})
        member = httpx.Client(base_url=f"{server.url}/api/v1", timeout=30,
                              headers={"Authorization": f"Bearer {fixture['operator_token']}"})
        try:
            state = admin.get(f"/runs/{run_id}").json()
            assert (state["run_id"], state["status"]) == (run_id, "corrupt"), state
            _names_it(state["corruption"], case)
            assert [(r["run_id"], r["status"]) for r in admin.get("/runs").json()["runs"]
                    if r["status"] == "corrupt"] == [(run_id, "corrupt")]
            for path_, body in (("/resume", {}), ("/cancel", {}), ("/retry", {})):
                _refused(admin.post(f"/runs/{run_id}{path_}", json=body), case, "run_corrupt")
            assert member.get(f"/runs/{run_id}").status_code == 404
            assert run_id not in [r["run_id"] for r in member.get("/runs").json()["runs"]]
        finally:
            admin.close()
            member.close()
            server.stop()
    assert _events(case) == before
