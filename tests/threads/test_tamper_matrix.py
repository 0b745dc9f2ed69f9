"""Issue 22's tamper matrix through the harness, replay, the CLI and the HTTP API (the Studio: tests/studio).

Each kind of tampering (tests/attacker.py) x each checkpoint placement (none,
at the head, in the middle), plus a checkpoint edited naively or forged with
the public digest recomputed (tests/tamper_cases.py), in one real SQLite file
tampered with by raw SQL, triggers dropped. Every surface is checked on a
fresh copy of that file, so each is the first to look (a break, once found,
is recorded in the store; the last tests check that every surface then agrees
at once). The same for PostgreSQL, through the harness and ``jixu verify``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from jixu import Harness
from jixu.errors import ThreadCorrupt
from jixu.ledger import SQLiteStore, Store
from jixu.server import create_app, create_token
from tests.attacker import KINDS, Raw
from tests.helpers import run_jixu
from tests.server.conftest import LiveServer
from tests.tamper_cases import (
    CHECKPOINT_EDITS,
    FORGED_TEXT,
    MODEL_SEEN,
    PLACEMENTS,
    TOOL_CALLS,
    Case,
    agent,
    copy_store,
    run,
    tamper_cases,
)

NAMES = [f"{kind}-{placement}" for placement in PLACEMENTS for kind in KINDS] + [
    f"{edit}-{placement}" for placement in PLACEMENTS if placement != "none" for edit in CHECKPOINT_EDITS]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Case]]:
    """The tampered store (closed) and its cases by name."""
    path = tmp_path_factory.mktemp("matrix") / "matrix.db"
    with SQLiteStore(path) as store:
        cases = tamper_cases(store, path)
    by_name = {case.name: case for case in cases}
    assert sorted(by_name) == sorted(NAMES)
    return path, by_name


def _events(raw: Raw, stream: str) -> list[tuple[Any, ...]]:
    with raw.transaction() as sql:
        return sql("SELECT seq, id, hash FROM jixu_events WHERE stream = ? ORDER BY seq", stream)


def _assert_names(found: dict[str, Any] | None, case: Case) -> None:
    assert found is not None, f"{case.name}: no corruption reported"
    assert (found["first_bad_seq"], found["reason"]) == (case.expected_seq, case.expected_reason), (case.name, found)


# --- the harness -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_open_thread_never_acts_on_a_history_that_does_not_verify(matrix: tuple[Path, dict[str, Case]],
                                                                  tmp_path: Path, name: str) -> None:
    path, cases = matrix
    case = cases[name]
    copy = copy_store(path, tmp_path / "copy.db")
    raw = Raw(copy)
    before = _events(raw, case.stream)
    calls, seen = len(TOOL_CALLS), len(MODEL_SEEN)
    with SQLiteStore(copy) as store:
        async def scenario() -> None:
            harness = Harness(agent(), store, owner="matrix")
            thread = await harness.open_thread(case.thread_id)
            if not case.corrupt:
                # A forged checkpoint is not used: the thread acts on what its events say, and only that.
                assert thread.checkpoint_status in ("digest_mismatch", "unsealed"), thread.checkpoint_status
                await thread.send("refund 42")
                state = await thread.wait()
                assert state.status == "idle" and state.corruption is None, state.reason
                assert TOOL_CALLS[calls:] == ["refund 42"]
                sent = [m for conversation in MODEL_SEEN[seen:] for m in conversation]
                assert sent and not any(FORGED_TEXT in json.dumps(m) for m in sent)
                assert any("order 41: 10 EUR, paid" in json.dumps(m) for m in sent)
                return
            with pytest.raises(ThreadCorrupt) as caught:
                await thread.send("refund 42")
            error = caught.value
            assert (error.details["first_bad_seq"], error.details["reason"]) == (case.expected_seq,
                                                                                 case.expected_reason)
            assert f"#{case.expected_seq}" in error.message
            state = await thread.wait()  # the loop refuses too: nothing claimed, nothing dispatched
            assert state.status == "corrupt" and not state.waiting_on
            _assert_names(state.to_dict()["corruption"], case)
            # Known broken now: a plain open (no act) says so at once.
            again = await Harness(agent(), store, owner="other").open_thread(case.thread_id)
            assert again.state().status == "corrupt"
            _assert_names(again.state().to_dict()["corruption"], case)

        run(scenario)
    if case.corrupt:
        assert _events(raw, case.stream) == before, "nothing may be appended to a broken chain"
        assert (TOOL_CALLS[calls:], MODEL_SEEN[seen:]) == ([], []), "no driver may be called"


@pytest.mark.parametrize("name", NAMES)
def test_the_first_reader_after_a_tamper_gets_the_answer_of_every_later_reader(
        matrix: tuple[Path, dict[str, Case]], tmp_path: Path, name: str) -> None:
    """The first opening that verifies the whole history finds the break (and records it); a later one starts
    from that record. Both answer the same state: the events before the first bad one. The first once kept the
    state its sealed checkpoint gave, which holds effects of events at or after the break (the Studio showed an
    effect on the first load that every later load left out)."""
    from jixu.threads.log import ThreadLog

    path, cases = matrix
    case = cases[name]
    with SQLiteStore(copy_store(path, tmp_path / "copy.db")) as store:
        first = ThreadLog.load(store, case.thread_id, verify=True).snapshot().to_dict()
        again = ThreadLog.load(store, case.thread_id, verify=True).snapshot().to_dict()
    for key in ("status", "seq", "head_hash", "effects", "messages", "turns", "corruption"):
        assert first[key] == again[key], (name, key)


@pytest.mark.parametrize("name", NAMES)
def test_replay_names_the_same_first_bad_event(matrix: tuple[Path, dict[str, Case]], tmp_path: Path,
                                               name: str) -> None:
    """Replay answers what opening answers (SPEC 3): the same corruption and the same state, built from the events
    before the first bad one (it once folded the events after the break too, and showed their effects)."""
    from jixu.threads.log import ThreadLog

    path, cases = matrix
    case = cases[name]
    with SQLiteStore(copy_store(path, tmp_path / "copy.db")) as store:
        async def scenario() -> dict[str, Any]:
            thread = await Harness(agent(), store).open_thread(case.thread_id, resume=False)
            return (await thread.replay()).to_dict()

        replayed = run(scenario)
        loaded = ThreadLog.load(store, case.thread_id, verify=True).snapshot().to_dict()
    for key in ("status", "seq", "effects", "messages", "turns", "corruption", "waiting_on"):
        assert replayed[key] == loaded[key], (name, key)
    if case.corrupt:
        assert replayed["status"] == "corrupt"
        _assert_names(replayed["corruption"], case)
    else:
        assert replayed["status"] == "idle" and replayed["corruption"] is None
        assert FORGED_TEXT not in json.dumps(replayed["messages"])


# --- the CLI ---------------------------------------------------------------------------------------------


def _jixu(*args: str) -> subprocess.CompletedProcess[str]:
    return run_jixu(*args)


def test_jixu_verify_names_every_kind_and_every_forged_checkpoint(matrix: tuple[Path, dict[str, Case]],
                                                                  tmp_path: Path) -> None:
    path, cases = matrix
    done = _jixu("verify", str(copy_store(path, tmp_path / "copy.db")), "--json")
    assert done.returncode == 1, done.stderr
    found = json.loads(done.stdout)
    streams = {entry["stream"]: entry for entry in found["streams"]}
    forged = {audit["stream"] for audit in found["forged_checkpoints"]}
    for case in cases.values():
        entry = streams[case.stream]
        if case.corrupt:
            assert (entry["valid"], entry["first_bad_seq"], entry["reason"]) == (
                False, case.expected_seq, case.expected_reason), (case.name, entry)
        else:
            assert entry["valid"], (case.name, entry)
            assert case.stream in forged, case.name
            [audit] = entry["checkpoints"]
            assert (audit["status"], audit["failed"]) == ("forged", True), (case.name, audit)


@pytest.mark.parametrize("name", NAMES)
def test_jixu_threads_verify_and_show_refuse_and_name_it(matrix: tuple[Path, dict[str, Case]], tmp_path: Path,
                                                         name: str) -> None:
    path, cases = matrix
    case = cases[name]
    copy = str(copy_store(path, tmp_path / "copy.db"))
    done = _jixu("threads", "verify", copy, case.thread_id, "--json")
    assert done.returncode == 1, (case.name, done.stdout, done.stderr)
    found = json.loads(done.stdout)
    assert found["valid"] is False
    if case.corrupt:
        _assert_names(found["corruption"], case)
        listed = {row["thread_id"]: row for row in json.loads(_jixu("threads", "list", copy, "--json").stdout)}
        assert listed[case.thread_id]["status"] == "corrupt"
        refused = _jixu("threads", "resolve", copy, case.thread_id, "01ARZ3NDEKTSV4RRFFQ69G5FAV",
                        "--resolution", "not_occurred", "--note", "x", "--json")
        assert refused.returncode == 1, refused.stdout
        error = json.loads(refused.stdout)["error"]
        assert (error["code"], error["first_bad_seq"], error["reason"]) == (
            "thread_corrupt", case.expected_seq, case.expected_reason)
    else:
        assert found["corruption"] is None and found["checkpoint"]["status"] == "forged"


# --- the HTTP API ----------------------------------------------------------------------------------------


class Server:
    def __init__(self, store: Store, server: LiveServer, token: str) -> None:
        self.store, self.server = store, server
        self.client = httpx.Client(base_url=f"{server.url}/api/v1", headers={"Authorization": f"Bearer {token}"},
                                   timeout=30)


@pytest.fixture(scope="module")
def http(matrix: tuple[Path, dict[str, Case]], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A real HTTP server (uvicorn) over a fresh copy of the tampered store."""
    path, _cases = matrix
    copy = copy_store(path, tmp_path_factory.mktemp("http") / "copy.db")
    store = SQLiteStore(copy)
    _info, secret = create_token(store, "op", roles={"alpha": "operator"}, actor="test")
    server = LiveServer(create_app(store, agent=agent()))
    server.start()
    try:
        yield Server(store, server, secret)
    finally:
        server.stop()
        store.close()


@pytest.mark.parametrize("name", NAMES)
def test_the_http_api_shows_corrupt_and_refuses_every_mutation(http: Server, matrix: tuple[Path, dict[str, Case]],
                                                               name: str) -> None:
    case = matrix[1][name]
    raw = Raw(http.store.path)  # type: ignore[attr-defined]
    before = _events(raw, case.stream)
    state = http.client.get(f"/threads/{case.thread_id}").json()
    verified = http.client.get(f"/threads/{case.thread_id}/verify").json()
    assert verified["valid"] is False
    if not case.corrupt:
        assert state["status"] == "idle" and state["corruption"] is None
        assert FORGED_TEXT not in json.dumps(state["messages"])
        assert verified["checkpoint"]["status"] == "forged"
        return
    assert state["status"] == "corrupt" and state["waiting_on"] == []
    _assert_names(state["corruption"], case)
    _assert_names(verified["corruption"], case)
    last = http.client.get(f"/threads/{case.thread_id}/events", params={"after_seq": case.head_seq - 1}).json()
    mutations = [
        ("/inputs", {"input": "refund 42"}),
        ("/resume", {}),
        ("/fork", {"at": last["events"][-1]["id"]} if last["events"] else {"at": "01ARZ3NDEKTSV4RRFFQ69G5FAV"}),
        ("/effects/01ARZ3NDEKTSV4RRFFQ69G5FAV/approve", {}),
        ("/effects/01ARZ3NDEKTSV4RRFFQ69G5FAV/resolve", {"resolution": "not_occurred", "note": "x"}),
    ]
    for path, body in mutations:
        answer = http.client.post(f"/threads/{case.thread_id}{path}", json=body)
        assert answer.status_code == 409, (path, answer.status_code, answer.text)
        assert answer.headers["content-type"].startswith("application/problem+json")
        problem = answer.json()
        assert problem["code"] == "thread_corrupt", (path, problem)
        assert (problem["first_bad_seq"], problem["reason"]) == (case.expected_seq, case.expected_reason), problem
    assert _events(raw, case.stream) == before
    assert http.store.get_work(f"thread/{case.thread_id}") is None, "nothing was queued"


# --- PostgreSQL ------------------------------------------------------------------------------------------


def test_postgres_tamper_matrix_through_the_harness_and_jixu_verify(postgres_dsn: str) -> None:
    from jixu.ledger import PostgresStore
    from tests.conftest import PostgresSchema

    schema = PostgresSchema(postgres_dsn)
    try:
        with PostgresStore(schema.url) as store:
            cases = tamper_cases(store, schema.url, placements=("head", "middle"))
        calls = len(TOOL_CALLS)
        with PostgresStore(schema.url) as store:
            for case in cases:
                async def scenario(case: Case = case) -> None:
                    thread = await Harness(agent(), store, owner="pg").open_thread(case.thread_id)
                    if not case.corrupt:
                        assert thread.checkpoint_status in ("digest_mismatch", "unsealed")
                        assert FORGED_TEXT not in json.dumps(thread.state().messages)
                        return
                    with pytest.raises(ThreadCorrupt) as caught:
                        await thread.send("refund 42")
                    assert (caught.value.details["first_bad_seq"], caught.value.details["reason"]) == (
                        case.expected_seq, case.expected_reason), case.name

                run(scenario)
        assert TOOL_CALLS[calls:] == []
        done = _jixu("verify", schema.url, "--json")
        assert done.returncode == 1, done.stderr
        streams = {entry["stream"]: entry for entry in json.loads(done.stdout)["streams"]}
        for case in cases:
            entry = streams[case.stream]
            if case.corrupt:
                assert (entry["first_bad_seq"], entry["reason"]) == (case.expected_seq, case.expected_reason), case
            else:
                assert entry["checkpoints"][0]["status"] == "forged", case
    finally:
        schema.drop()


@pytest.mark.parametrize("placement", ["head", "middle"])
def test_a_rewrite_under_a_sealed_checkpoint_hidden_behind_one_more_break_is_never_forked(
        tmp_path: Path, placement: str) -> None:
    """The attacker rewrites a tool result before the sealed checkpoint and recomputes every hash up to the head
    (caught alone: ``rewritten``), then breaks one event at or after the checkpoint too, so the first bad seq moves
    there. Before, the events before that break were vouched for and a fork carried the forged text into a new,
    valid thread. A break at or after a sealed checkpoint vouches for no event before it: nothing is forked."""
    from jixu.ledger.chain import row_hash
    from jixu.ledger.event import StoredRow
    from jixu.threads.log import ThreadLog
    from tests.attacker import change_last_event
    from tests.tamper_cases import _two_turns

    path = tmp_path / "rewrite.db"
    with SQLiteStore(path) as store:
        raw = Raw(path)
        thread_id, checkpoint_seq = run(lambda: _two_turns(store, raw, placement))
    stream = f"thread/{thread_id}"
    head = raw.head(stream)
    assert checkpoint_seq is not None
    rows = [raw.row(stream, seq) for seq in range(1, head + 1)]
    first = next(row.seq for row in rows if "order 41: 10 EUR, paid" in row.data_json)
    assert first < checkpoint_seq
    prev = rows[first - 2].hash
    with raw.transaction() as sql:
        for row in rows[first - 1:]:
            data = row.data_json.replace("order 41: 10 EUR, paid", FORGED_TEXT)
            new_hash = row_hash(StoredRow(row.id, row.stream, row.seq, row.type, data, row.meta_json, row.recorded_at,
                                          prev, ""))
            sql("UPDATE jixu_events SET data = ?, prev_hash = ?, hash = ? WHERE stream = ? AND seq = ?", data, prev,
                new_hash, stream, row.seq)
            prev = new_hash
        sql("UPDATE jixu_streams SET head_hash = ? WHERE stream = ?", prev, stream)
    change_last_event(raw, stream, head)  # at or after the checkpoint: the first bad seq becomes the head
    with SQLiteStore(path) as store:
        log = ThreadLog.load(store, thread_id, verify=True)
        found = log.corruption()
        assert found is not None and found.sound_before == 1, found
        harness = Harness(agent(), store, owner="operator")
        thread = run(lambda: harness.open_thread(thread_id, resume=False))
        for event in store.read(stream)[:-1]:
            with pytest.raises(ThreadCorrupt):
                run(lambda at=event.id: thread.fork(at))  # type: ignore[misc]
        assert [s.stream for s in store.list_streams("thread/")] == [stream], "no child was made"
