"""The ``jixu`` command as a user runs it: a real subprocess, real files, exit codes that mean something."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

import pytest

from jixu.ledger import SQLiteStore
from jixu.ledger.encoding import content_hash
from tests.helpers import run_jixu


def jixu(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return run_jixu(*args, cwd=cwd)


def test_the_readme_main_job_appends_and_verifies(tmp_path: Path) -> None:
    appended = jixu("ledger", "append", "jixu.db", "orders/42", "order.placed", '{"total": 42}', cwd=tmp_path)
    assert appended.returncode == 0, appended.stderr
    assert "seq 1" in appended.stdout
    verified = jixu("verify", "jixu.db", cwd=tmp_path)
    assert verified.returncode == 0, verified.stderr
    assert "orders/42" in verified.stdout and "all valid" in verified.stdout


def test_verify_json_names_the_first_bad_seq_and_exits_1(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    for n in range(5):
        assert jixu("ledger", "append", str(db), "orders/1", "order.noted", json.dumps({"n": n})).returncode == 0
    raw = sqlite3.connect(db)
    raw.execute("DROP TRIGGER jixu_events_no_update")
    raw.execute("""UPDATE jixu_events SET data = '{"n":7}' WHERE seq = 3""")
    raw.commit()
    raw.close()
    result = jixu("verify", str(db), "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["valid"] is False
    assert report["streams"][0]["first_bad_seq"] == 3
    assert report["streams"][0]["reason"] == "payload_changed"
    human = jixu("verify", str(db))
    assert human.returncode == 1 and "INVALID" in human.stdout
    refused = jixu("ledger", "append", str(db), "orders/1", "order.noted", '{"n": 5}', "--json")
    assert refused.returncode == 1, refused.stdout
    error = json.loads(refused.stdout)["error"]
    assert (error["code"], error["first_bad_seq"], error["reason"]) == ("stream_corrupt", 3, "payload_changed")
    with SQLiteStore(db) as store:
        assert store.stream_info("orders/1").head_seq == 5, "nothing is appended to a broken chain"


def test_append_json_output_is_the_stored_event(tmp_path: Path) -> None:
    result = jixu("ledger", "append", str(tmp_path / "t.db"), "orders/1", "order.placed", '{"a": 1}',
                  "--actor", "alice", "--json")
    event = json.loads(result.stdout)
    assert (event["seq"], event["data"], event["meta"]) == (1, {"a": 1}, {"actor": "alice"})
    listed = json.loads(jixu("ledger", "events", str(tmp_path / "t.db"), "orders/1", "--json").stdout)
    assert listed == [event]
    streams = json.loads(jixu("ledger", "streams", str(tmp_path / "t.db"), "--json").stdout)
    assert [s["stream"] for s in streams] == ["orders/1"]


def test_errors_have_distinct_exit_codes_and_change_nothing(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    assert jixu("ledger", "append", str(db), "orders/1", "order.placed").returncode == 0
    missing = jixu("verify", str(tmp_path / "absent.db"))
    assert missing.returncode == 3 and "no such database" in missing.stderr
    assert not (tmp_path / "absent.db").exists()
    assert jixu("verify", str(db), "--stream", "orders/999").returncode == 3
    bad_json = jixu("ledger", "append", str(db), "orders/1", "order.paid", "{not json")
    assert bad_json.returncode == 6 and "not valid JSON" in bad_json.stderr
    bad_type = jixu("ledger", "append", str(db), "orders/1", "Order Paid")
    assert bad_type.returncode == 6
    stale = jixu("ledger", "append", str(db), "orders/1", "order.paid", "--expected-seq", "0", "--json")
    assert stale.returncode == 4 and json.loads(stale.stdout)["error"]["code"] == "concurrency_conflict"
    nobody = jixu("ledger", "append", str(db), "orders/1", "order.paid", "--actor", " ")
    assert nobody.returncode == 6 and "--actor" in nobody.stderr
    assert jixu("ledger", "events", str(db), "orders/999").returncode == 3, "as verify --stream and effects answer"
    with SQLiteStore(db) as store:
        assert len(store.read("orders/1")) == 1


def test_effects_shows_the_resolver_decisions_and_exits_1_when_an_operator_is_needed(tmp_path: Path) -> None:
    db = tmp_path / "t.db"
    args = {"to": "a@example.com"}
    intent = {"effect_id": "e1", "name": "send_email", "args": args, "args_hash": content_hash(args),
              "semantics": "unsafe", "idempotency_key": "k1", "requires_approval": False}
    steps = [("tool.requested", intent), ("tool.dispatched", {"effect_id": "e1", "attempt": 1})]
    for event_type, data in steps:
        assert jixu("ledger", "append", str(db), "threads/1", event_type, json.dumps(data)).returncode == 0
    result = jixu("effects", str(db), "threads/1", "--json")
    assert result.returncode == 1, result.stderr
    analysis = json.loads(result.stdout)
    assert analysis["decisions"]["e1"]["state"] == "unknown"
    assert analysis["requires_resolution"] == ["e1"]
    human = jixu("effects", str(db), "threads/1")
    assert "unknown" in human.stdout and "send_email" in human.stdout
    receipt = {"effect_id": "e1", "attempt": 1, "result": "sent"}
    assert jixu("ledger", "append", str(db), "threads/1", "tool.completed", json.dumps(receipt)).returncode == 0
    done = jixu("effects", str(db), "threads/1", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["decisions"]["e1"]["state"] == "completed"


def test_error_messages_are_printed_verbatim_not_as_markup(tmp_path: Path) -> None:
    result = jixu("ledger", "append", str(tmp_path / "t.db"), "orders/1", "order.placed", "[1, 2]")
    assert result.returncode == 6
    assert "data must be a JSON object" in result.stderr
    bad = jixu("ledger", "append", str(tmp_path / "t.db"), "bad[stream]", "order.placed")
    assert bad.returncode == 6 and "'bad[stream]'" in bad.stderr


def test_verify_names_a_rewrite_under_a_genuine_checkpoint_contradicted_and_an_edited_one_forged(
        tmp_path: Path) -> None:
    """The summary line counts each failed checkpoint by what was found: a checkpoint sealed here whose events
    were rewritten (every hash recomputed) is ``contradicted``, not ``forged`` (seen: "1 forged")."""
    from tests.attacker import Raw, forge_checkpoint, rewrite_from
    from tests.tamper_cases import _two_turns, run

    rewritten, edited = tmp_path / "rewritten.db", tmp_path / "edited.db"
    for path in (rewritten, edited):
        with SQLiteStore(path) as store:
            thread_id, checkpoint_seq = run(lambda store=store, path=path: _two_turns(store, Raw(path), "head"))
        assert checkpoint_seq is not None
        stream = f"thread/{thread_id}"
        if path == rewritten:
            rewrite_from(Raw(path), stream, 5)
        else:
            forge_checkpoint(Raw(path), stream, "thread", lambda state: state.replace("paid", "PAID"), recompute=True)
    found = run_jixu("verify", str(rewritten))
    assert found.returncode == 1
    assert "(1 contradicted)" in found.stdout and "forged" not in found.stdout.split("\n")[-2], found.stdout
    found = run_jixu("verify", str(edited))
    assert found.returncode == 1
    assert "(1 forged)" in found.stdout, found.stdout


@pytest.mark.parametrize("stream", ["thread/01M98TFAAYE54KGZDV00346BK4", "run/01M98TFAAYE54KGZDV00346BK4",
                                    "request/01M98TFAAYE54KGZDV00346BK4", "project/calc", "auth/token/t1",
                                    "idempotency/k1", "artifact/a1"])
def test_a_raw_append_to_a_stream_jixu_keeps_needs_force(tmp_path: Path, stream: str) -> None:
    """An audit: a raw `tool.outcome_resolved` onto a thread whose owner was mid-call was recorded (the owner's
    real receipt then refused), where `jixu threads resolve` refuses it while the call may run. A stream jixu keeps
    is not appended to raw unless asked with --force."""
    db = tmp_path / "t.db"
    resolution = json.dumps({"effect_id": "e1", "resolution": "not_occurred", "resolution_id": "r1"})
    refused = jixu("ledger", "append", str(db), stream, "tool.outcome_resolved", resolution, "--json")
    assert refused.returncode == 6, refused.stderr
    assert json.loads(refused.stdout)["error"]["code"] == "invalid_input" and "--force" in refused.stdout
    with SQLiteStore(db) as store:
        assert store.stream_info(stream) is None, "nothing was appended"
    forced = jixu("ledger", "append", str(db), stream, "tool.outcome_resolved", resolution, "--force")
    assert forced.returncode == 0, forced.stderr
    with SQLiteStore(db) as store:
        assert [e.type for e in store.read(stream)] == ["tool.outcome_resolved"]


def test_the_streams_refused_raw_are_every_prefix_jixu_keeps() -> None:
    from jixu.cli.ledger import _KEPT_BY_JIXU
    from jixu.ledger.artifacts import ARTIFACT_PREFIX
    from jixu.runs.model import PROJECT_PREFIX, RUN_PREFIX
    from jixu.runs.requests.status import REQUEST_PREFIX
    from jixu.server.auth import TOKEN_PREFIX
    from jixu.server.idempotency import REQUEST_PREFIX as IDEMPOTENCY_PREFIX
    from jixu.threads.log import THREAD_PREFIX

    assert set(_KEPT_BY_JIXU) == {THREAD_PREFIX, RUN_PREFIX, REQUEST_PREFIX, PROJECT_PREFIX, TOKEN_PREFIX,
                                  IDEMPOTENCY_PREFIX, ARTIFACT_PREFIX}
