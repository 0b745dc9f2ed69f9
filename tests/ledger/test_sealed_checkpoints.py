"""Checkpoints are sealed with a key held outside the store; a forged one is never used (decision 0025).

Real stores (SQLite files, PostgreSQL schemas) are tampered with by raw SQL
with the triggers dropped (tests/attacker.py), as anybody with write access
to the database could.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import KeyUnavailable
from jixu.ledger import NewEvent, SQLiteStore, Store, project, save_checkpoint
from jixu.ledger import keys as keys_module
from jixu.ledger.keys import (
    KEY_FILE_ENV,
    Keyring,
    default_key_path,
    keyring,
    retire_keys,
    rotate_keys,
    sealing_keyring,
)
from jixu.ledger.projection import audit_checkpoint
from jixu.ledger.trust import VERDICT_NAME, record_break, recorded_break, verdict
from tests.attacker import Raw, flip_data_byte, forge_checkpoint, public_digest, rewrite_from
from tests.helpers import spawn_python
from tests.ledger.test_projection import TallyProjection, fill

STREAM = "t/1"


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A key file of this test's own (not made yet)."""
    path = tmp_path / "config" / "jixu" / "checkpoint-keys"
    monkeypatch.setenv(KEY_FILE_ENV, str(path))
    return path


def test_the_default_key_file_follows_the_environment_as_it_changes(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The default path is remembered per environment, never across a change of it."""
    monkeypatch.delenv(KEY_FILE_ENV, raising=False)
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "one"))
    assert default_key_path() == tmp_path / "one" / ".config" / "jixu" / "checkpoint-keys"
    monkeypatch.setenv("HOME", str(tmp_path / "two"))
    assert default_key_path() == tmp_path / "two" / ".config" / "jixu" / "checkpoint-keys"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert default_key_path() == tmp_path / "xdg" / "jixu" / "checkpoint-keys"
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "given"))
    assert default_key_path() == tmp_path / "given"
    monkeypatch.delenv(KEY_FILE_ENV)
    monkeypatch.delenv("XDG_CONFIG_HOME")
    assert default_key_path() == tmp_path / "two" / ".config" / "jixu" / "checkpoint-keys"
    # A key made under one home is not found under another.
    monkeypatch.setenv(KEY_FILE_ENV, str(tmp_path / "two" / ".config" / "jixu" / "checkpoint-keys"))
    assert sealing_keyring().keys
    monkeypatch.delenv(KEY_FILE_ENV)
    assert keyring().keys
    monkeypatch.setenv("HOME", str(tmp_path / "one"))
    assert not keyring().keys


def _ledger(tmp_path: Path, events: int = 20, at: int | None = None) -> Path:
    """A SQLite file holding ``STREAM`` with a sealed checkpoint at ``at`` (default: the head)."""
    path = tmp_path / "ledger.db"
    with SQLiteStore(path) as store:
        fill(store, STREAM, 0, at or events)
        save_checkpoint(store, STREAM, TallyProjection(), project(store, STREAM, TallyProjection()))
        if at is not None and at < events:
            fill(store, STREAM, at, events - at)
    return path


def _total(n: int) -> int:
    return n * (n - 1) // 2


# --- the key file ---------------------------------------------------------------------------------------


def test_the_first_seal_makes_the_key_file_with_owner_only_permissions(key_file: Path, tmp_path: Path) -> None:
    assert not key_file.exists()
    assert keyring().keys == () and "does not exist" in str(keyring().problem)
    _ledger(tmp_path)
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(key_file.parent.stat().st_mode) == 0o700
    lines = [line for line in key_file.read_text().splitlines() if not line.startswith("#")]
    assert len(lines) == 1 and lines[0].startswith("jixu-key-v1 ") and len(lines[0].split()[2]) == 64
    with SQLiteStore(tmp_path / "ledger.db") as store:
        checkpoint = store.read_checkpoint(STREAM, "tally")
        assert checkpoint is not None and checkpoint.digest.startswith(f"hmac-sha256:{keyring().current}:")
        assert project(store, STREAM, TallyProjection()).checkpoint == "used"


def test_processes_making_the_key_at_once_end_up_with_one_key(key_file: Path) -> None:
    code = ("import sys, time; from jixu.ledger.keys import sealing_keyring\n"
            "time.sleep(max(0.0, float(sys.argv[1]) - time.time())); print(sealing_keyring().current)")
    start = str(time.time() + 1.0)
    children = [spawn_python(code, start) for _ in range(6)]
    made = set()
    for child in children:
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err
        made.add(out.strip())
    assert made == {keyring().current}
    assert not [p for p in key_file.parent.iterdir() if p.name != key_file.name]  # no temporary file left


def test_a_key_file_made_by_another_process_after_the_first_look_is_used(key_file: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # The race the test above can hit: this process looks, finds no file, and another process makes it before
    # this one would. Its key is then the key (seen once in a loaded CI run: KeyUnavailable "does not exist").
    made = spawn_python("from jixu.ledger.keys import sealing_keyring; print(sealing_keyring().current)")
    out, err = made.communicate(timeout=60)
    assert made.returncode == 0, err
    looks: list[Keyring] = []
    real = keys_module.keyring

    def first_look_before_the_other_process(path: Any = None) -> Keyring:
        if not looks:
            looks.append(Keyring(key_file, problem=f"the key file {key_file} does not exist"))
            return looks[0]
        looks.append(real(path))
        return looks[-1]

    monkeypatch.setattr(keys_module, "keyring", first_look_before_the_other_process)
    assert sealing_keyring().current == out.strip() and len(looks) == 2


def test_a_key_file_others_can_read_is_not_used(key_file: Path, tmp_path: Path) -> None:
    path = _ledger(tmp_path)
    os.chmod(key_file, 0o644)
    found = keyring()
    assert found.keys == () and "chmod 600" in str(found.problem)
    with pytest.raises(KeyUnavailable, match="chmod 600"):
        sealing_keyring()
    with SQLiteStore(path) as store:
        result = project(store, STREAM, TallyProjection())
    assert result.checkpoint == "unsealed" and result.state.total == _total(20) and result.events_applied == 20


def test_a_missing_or_malformed_key_file_means_replay_never_a_trusted_checkpoint(key_file: Path,
                                                                                 tmp_path: Path) -> None:
    path = _ledger(tmp_path)
    text = key_file.read_text()
    key_file.write_text(text.replace("jixu-key-v1", "jixu-key-v0"))
    with SQLiteStore(path) as store:
        assert project(store, STREAM, TallyProjection()).checkpoint == "unsealed"
        key_file.unlink()
        result = project(store, STREAM, TallyProjection())
        assert (result.checkpoint, result.state.total, result.events_applied) == ("unsealed", _total(20), 20)
        # A new key made now does not vouch for what the lost key sealed.
        sealing_keyring()
        assert project(store, STREAM, TallyProjection()).checkpoint == "unsealed"


def test_rotation_keeps_old_checkpoints_usable_and_retiring_the_old_key_ends_that(key_file: Path,
                                                                                  tmp_path: Path) -> None:
    path = _ledger(tmp_path)
    old = keyring().current
    rotated = rotate_keys()
    assert rotated.current != old and [k for k, _ in rotated.keys] == [rotated.current, old]
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    with SQLiteStore(path) as store:
        assert project(store, STREAM, TallyProjection()).checkpoint == "used"
        fill(store, STREAM, 20, 1)
        rewritten = save_checkpoint(store, STREAM, TallyProjection(), project(store, STREAM, TallyProjection()))
        assert rewritten.digest.startswith(f"hmac-sha256:{rotated.current}:")
        retire_keys()
        assert [k for k, _ in keyring().keys] == [rotated.current]
        assert project(store, STREAM, TallyProjection()).checkpoint == "used"


def test_a_checkpoint_sealed_by_a_retired_key_is_not_trusted(key_file: Path, tmp_path: Path) -> None:
    path = _ledger(tmp_path)
    rotate_keys()
    retire_keys()
    with SQLiteStore(path) as store:
        result = project(store, STREAM, TallyProjection())
    assert result.checkpoint == "unsealed" and result.state.total == _total(20)


# --- forged checkpoints -----------------------------------------------------------------------------------


@pytest.mark.parametrize("recompute", [False, True], ids=["naive_edit", "recomputed_digest"])
def test_a_forged_checkpoint_is_never_used_and_the_audit_names_it(tmp_path: Path, recompute: bool) -> None:
    path = _ledger(tmp_path)
    forge_checkpoint(Raw(path), STREAM, "tally", lambda s: s.replace(f'"total":{_total(20)}', '"total":999999'),
                     recompute=recompute)
    with SQLiteStore(path) as store:
        result = project(store, STREAM, TallyProjection())
        assert result.state.total == _total(20) and result.events_applied == 20 and result.chain.valid
        assert result.checkpoint == ("unsealed" if recompute else "digest_mismatch")
        audit = audit_checkpoint(store, STREAM, TallyProjection())
        assert audit is not None and audit.status == "forged" and audit.failed, audit
        assert verdict(store, STREAM, checkpoints=["tally"]).valid  # the events are intact


def test_an_unkeyed_checkpoint_that_matches_the_events_is_reported_harmless(tmp_path: Path) -> None:
    """A checkpoint of an older version (an unkeyed digest) with the true state: not used, not an alarm."""
    path = _ledger(tmp_path)
    raw = Raw(path)
    found = raw.checkpoint(STREAM, "tally")
    assert found is not None
    with raw.transaction() as run:
        run("UPDATE jixu_checkpoints SET digest = ? WHERE stream = ? AND name = 'tally'",
            public_digest(STREAM, "tally", found["seq"], found["reducer_version"], found["head_hash"], found["state"]),
            STREAM)
    with SQLiteStore(path) as store:
        assert project(store, STREAM, TallyProjection()).checkpoint == "unsealed"
        audit = audit_checkpoint(store, STREAM, TallyProjection())
        assert audit is not None and (audit.status, audit.failed) == ("unsealed", False), audit
        fill(store, STREAM, 20, 1)
        save_checkpoint(store, STREAM, TallyProjection(), project(store, STREAM, TallyProjection()))
        audit = audit_checkpoint(store, STREAM, TallyProjection())
        assert audit is not None and audit.status == "valid", audit


def test_the_anchor_check_recomputes_the_anchor_events_hash(tmp_path: Path) -> None:
    """Changing the anchor event's data (its stored hash left as it was) makes the checkpoint unusable."""
    path = _ledger(tmp_path, 20, at=10)
    flip_data_byte(Raw(path), STREAM, 10)
    with SQLiteStore(path) as store:
        result = project(store, STREAM, TallyProjection())
        assert result.checkpoint == "contradicted"
        assert (result.chain.valid, result.chain.first_bad_seq, result.chain.reason) == (False, 10,
                                                                                         "payload_changed")
        assert result.seq == 9  # the state stops before the first bad event


# --- a rewrite under a sealed checkpoint, and the verdict ----------------------------------------------


@pytest.mark.parametrize("at", [None, 15], ids=["checkpoint_at_head", "checkpoint_in_the_middle"])
def test_a_rewrite_with_recomputed_hashes_is_found_by_a_sealed_checkpoint(tmp_path: Path, at: int | None) -> None:
    path = _ledger(tmp_path, 20, at=at)
    rewrite_from(Raw(path), STREAM, 5)
    with SQLiteStore(path) as store:
        assert store.verify(STREAM).valid  # the chain itself verifies: only the sealed checkpoint knows
        anchor = at or 20
        result = project(store, STREAM, TallyProjection())
        assert result.checkpoint == "contradicted" and not result.chain.valid
        assert (result.chain.first_bad_seq, result.chain.reason) == (anchor, "rewritten")
        report = verdict(store, STREAM, checkpoints=["tally"])
        assert (report.valid, report.first_bad_seq, report.reason) == (False, anchor, "rewritten")
        audit = audit_checkpoint(store, STREAM, TallyProjection())
        assert audit is not None and audit.status == "contradicted"


def test_a_checkpoint_past_the_head_proves_events_were_removed(tmp_path: Path) -> None:
    path = _ledger(tmp_path, 20)
    raw = Raw(path)
    hash_18 = raw.row(STREAM, 18).hash
    with raw.transaction() as run:
        run("DELETE FROM jixu_events WHERE stream = ? AND seq > 18", STREAM)
        run("UPDATE jixu_streams SET head_seq = 18, head_hash = ? WHERE stream = ?", hash_18, STREAM)
    with SQLiteStore(path) as store:
        assert store.verify(STREAM).valid
        report = verdict(store, STREAM, checkpoints=["tally"])
        assert (report.first_bad_seq, report.reason) == (19, "rewritten")


def test_a_break_once_found_is_kept_even_if_the_event_is_put_back(tmp_path: Path) -> None:
    path = _ledger(tmp_path, 20, at=20)
    raw = Raw(path)
    original = raw.row(STREAM, 7).data_json
    flip_data_byte(raw, STREAM, 7)
    with SQLiteStore(path) as store:
        # Opening from the checkpoint does not read seq 7; the verdict does, and records the break.
        assert project(store, STREAM, TallyProjection()).chain.valid
        report = verdict(store, STREAM, checkpoints=["tally"])
        assert (report.first_bad_seq, report.reason) == (7, "payload_changed")
        assert recorded_break(store, STREAM) is not None
    with raw.transaction() as run:
        run("UPDATE jixu_events SET data = ? WHERE stream = ? AND seq = 7", original, STREAM)
    with SQLiteStore(path) as store:
        assert store.verify(STREAM).valid
        for result in (project(store, STREAM, TallyProjection()).chain, verdict(store, STREAM)):
            assert (result.valid, result.first_bad_seq, result.reason) == (False, 7, "payload_changed"), result
        assert project(store, STREAM, TallyProjection()).checkpoint == "broken"


def test_a_break_record_no_key_here_checks_still_stops_the_stream(tmp_path: Path) -> None:
    """Decision 0069: a recorded break whose seal fails (edited) is still a break, vouching for nothing."""
    path = _ledger(tmp_path, 20)
    raw = Raw(path)
    original = raw.row(STREAM, 7).data_json
    flip_data_byte(raw, STREAM, 7)
    with SQLiteStore(path) as store:
        assert not verdict(store, STREAM).valid
        assert recorded_break(store, STREAM) is not None
    with raw.transaction() as run:
        run("UPDATE jixu_checkpoints SET digest = ? WHERE stream = ? AND name = ?", "0" * 64, STREAM, VERDICT_NAME)
        run("UPDATE jixu_events SET data = ? WHERE stream = ? AND seq = 7", original, STREAM)
    with SQLiteStore(path) as store:
        found = recorded_break(store, STREAM)
        assert found is not None and (found.reason, found.first_bad_seq, found.vouched_before) == (
            "break_unchecked", 7, 1)
        assert "not sealed" in (found.detail or "")
        again = verdict(store, STREAM)
        assert (again.valid, again.reason) == (False, "break_unchecked")
        assert project(store, STREAM, TallyProjection()).chain.reason == "break_unchecked"


@pytest.mark.parametrize("lose", ["delete", "garbage", "open_to_others", "rotate_then_retire"])
def test_a_break_recorded_under_a_key_since_lost_or_retired_is_still_a_break(key_file: Path, tmp_path: Path,
                                                                             lose: str) -> None:
    """Seen by an audit: a rewrite found (and recorded) under one key was acted on again once that key was
    deleted, replaced by garbage, opened to others or rotated out and retired, and the next checkpoint, sealed
    by a new key, then vouched for the rewritten history."""
    path = _ledger(tmp_path, 20)
    rewrite_from(Raw(path), STREAM, 5)
    with SQLiteStore(path) as store:
        assert verdict(store, STREAM, checkpoints=[TallyProjection.name]).reason == "rewritten"
    if lose == "delete":
        key_file.unlink()
    elif lose == "garbage":
        key_file.write_text("hello\n")
    elif lose == "open_to_others":
        key_file.chmod(0o644)
    else:
        rotate_keys()
        retire_keys()
    with SQLiteStore(path) as store:
        if lose == "delete":
            sealing_keyring()  # a new key where the old one was (a process sealing something else made it)
        opened = project(store, STREAM, TallyProjection())
        assert (opened.chain.valid, opened.chain.reason, opened.checkpoint) == (False, "break_unchecked", "broken")
        checked = verdict(store, STREAM, checkpoints=[TallyProjection.name])
        assert (checked.valid, checked.reason, checked.vouched_before) == (False, "break_unchecked", 1)
        assert "not held here" in (checked.detail or "") or "not sealed" in (checked.detail or "")


def test_breaks_are_kept_in_every_store(store: Store) -> None:
    """The recorded break is a checkpoint-table row: every backend keeps and returns it."""
    fill(store, STREAM, 0, 5)
    from jixu.ledger.chain import VerifyReport

    broken = VerifyReport(stream=STREAM, valid=False, count=2, head_hash="a" * 64, first_bad_seq=3,
                          reason="gap", detail="test")
    assert record_break(store, broken)
    found = recorded_break(store, STREAM)
    assert found is not None and (found.first_bad_seq, found.reason) == (3, "gap")
    assert not record_break(store, broken)  # an equal or later break does not replace it
    assert project(store, STREAM, TallyProjection()).chain.first_bad_seq == 3
    assert store.read_checkpoint(STREAM, VERDICT_NAME) is not None


def test_postgres_rewrite_under_a_sealed_checkpoint_is_found(postgres_dsn: str) -> None:
    from jixu.ledger import PostgresStore
    from tests.conftest import PostgresSchema

    schema = PostgresSchema(postgres_dsn)
    try:
        with PostgresStore(schema.url) as store:
            fill(store, STREAM, 0, 20)
            save_checkpoint(store, STREAM, TallyProjection(), project(store, STREAM, TallyProjection()))
        rewrite_from(Raw(schema.url), STREAM, 3)
        with PostgresStore(schema.url) as store:
            assert store.verify(STREAM).valid
            report = verdict(store, STREAM, checkpoints=["tally"])
            assert (report.first_bad_seq, report.reason) == (20, "rewritten")
            assert project(store, STREAM, TallyProjection()).chain.first_bad_seq == 20
    finally:
        schema.drop()


def test_values_nested_deeper_than_the_limit_are_refused_with_their_path_and_nothing_is_written(
        store: Store) -> None:
    from jixu.errors import MalformedEvent
    from jixu.ledger.encoding import MAX_NESTING

    deep: object = 1
    for _ in range(MAX_NESTING):
        deep = [deep]
    with pytest.raises(MalformedEvent, match="nested too deeply") as caught:
        store.append("deep/1", [NewEvent("x.y", {"free": deep})], 0)
    assert caught.value.details["path"].startswith("data.free")
    assert store.stream_info("deep/1") is None
    ok: object = 1
    for _ in range(MAX_NESTING - 2):
        ok = [ok]
    [stored] = store.append("deep/1", [NewEvent("x.y", {"free": ok})], 0)
    assert store.read("deep/1")[0].data == stored.data


def test_a_read_only_store_still_reports_the_break_it_cannot_record(tmp_path: Path) -> None:
    path = _ledger(tmp_path, 20)
    flip_data_byte(Raw(path), STREAM, 7)
    with SQLiteStore(path, read_only=True) as store:
        report = verdict(store, STREAM, checkpoints=["tally"])
        assert (report.valid, report.first_bad_seq, report.reason) == (False, 7, "payload_changed")
        assert recorded_break(store, STREAM) is None


@pytest.mark.parametrize("reader", ["project", "verdict"])
def test_a_checkpoint_written_between_a_readers_two_reads_is_no_rewrite(tmp_path: Path, reader: str) -> None:
    """Another connection appends and writes its sealed checkpoint between the reader's read of the head (or of
    the chain) and its read of the checkpoints, as a worker finishing a run does while the API shows the run. The
    checkpoint then lay past the head the reader had seen and read as a rewrite, which a run's journal recorded
    as its break: a valid run was corrupt for good. Whichever of the two reads comes first, the writer's turn
    comes right after it here."""
    path = _ledger(tmp_path, 20)
    with SQLiteStore(path) as writer, SQLiteStore(path) as store:
        first_read_done = False

        def then_the_writer(result: Any) -> Any:
            nonlocal first_read_done
            if not first_read_done:
                first_read_done = True
                fill(writer, STREAM, 20, 1)
                save_checkpoint(writer, STREAM, TallyProjection(), project(writer, STREAM, TallyProjection()))
            return result

        for name in ("stream_info", "verify", "read_checkpoints"):
            real = getattr(store, name)
            setattr(store, name, lambda *a, _real=real, **kw: then_the_writer(_real(*a, **kw)))
        if reader == "project":
            report = project(store, STREAM, TallyProjection()).chain
        else:
            report = verdict(store, STREAM, checkpoints=["tally"])
        assert report.valid, report
        assert recorded_break(store, STREAM) is None
        assert writer.read_checkpoint(STREAM, "tally").seq == 21  # type: ignore[union-attr]


def test_retiring_keys_with_the_store_keeps_its_breaks_checkable(key_file: Path, tmp_path: Path) -> None:
    """`jixu keys retire --store`: a break recorded under the old key is sealed again by the current key, and a
    rewrite only an old key's checkpoint proves is found and recorded, before the old key goes (decision 0069)."""
    from tests.helpers import run_jixu

    class AsThread(TallyProjection):
        name = "thread"  # the checkpoint a thread's stream keeps (what `jixu verify` checks)

    thread, sound = "thread/01M9900000000000000000000T", "thread/01M9900000000000000000000S"
    path = _ledger(tmp_path, 20)
    with SQLiteStore(path) as store:
        for name in (thread, sound):
            fill(store, name, 0, 10)
            save_checkpoint(store, name, AsThread(), project(store, name, AsThread()))
    flip_data_byte(Raw(path), STREAM, 7)
    with SQLiteStore(path) as store:
        assert verdict(store, STREAM).reason == "payload_changed"  # recorded under the first key
    rotate_keys()
    rewrite_from(Raw(path), thread, 4)  # found by nobody yet: only its checkpoint, sealed by the first key, knows
    retired = run_jixu("keys", "retire", "--store", f"sqlite:///{path}", "--json")
    assert retired.returncode == 0, retired.stderr
    report = __import__("json").loads(retired.stdout)
    assert len(report["keys"]) == 1
    # STREAM's break sealed again; of the checkpoints, only the sound thread's (the other one no longer holds)
    assert list(report["sealed_again"].values()) == [{"breaks": 1, "checkpoints": 1}]
    with SQLiteStore(path) as store:
        first = recorded_break(store, STREAM)
        assert first is not None and (first.reason, first.first_bad_seq) == ("payload_changed", 7)
        second = recorded_break(store, thread)
        assert second is not None and second.reason == "rewritten"
        assert project(store, thread, AsThread()).chain.reason == "rewritten"
        assert project(store, sound, AsThread()).checkpoint == "used"  # still vouched for, under the current key


def test_a_key_file_others_could_replace_is_not_used(key_file: Path, tmp_path: Path) -> None:
    """Seen by an audit: a key in a world-writable directory, or a key file owned by another user, was used (and
    said "seals; verifies"): whoever can replace the file can forge checkpoints and verdicts."""
    path = _ledger(tmp_path, 5)
    assert keyring().keys and keyring().problem is None
    folder = key_file.parent
    folder.chmod(0o777)
    found = keyring()
    assert not found.keys and "writable by others" in (found.problem or "")
    with SQLiteStore(path) as store:
        assert project(store, STREAM, TallyProjection()).checkpoint == "unsealed"  # nothing trusted
    with pytest.raises(KeyUnavailable, match="writable by others"):
        sealing_keyring()
    folder.chmod(0o1777)  # sticky, as /tmp: nobody but the owner replaces the file
    assert keyring().keys
    folder.chmod(0o700)
    if os.geteuid() != 0:
        return  # only root can give the file to another user (CI runs as root)
    os.chown(key_file, 12345, 12345)
    found = keyring()
    assert not found.keys and "belongs to user 12345" in (found.problem or "")
    os.chown(key_file, os.geteuid(), os.getegid())
    assert keyring().keys


def test_retiring_keys_with_a_store_that_cannot_keep_a_break_retires_nothing(key_file: Path, tmp_path: Path) -> None:
    """Found by a review: on a read-only store, the rewrite only the old key's checkpoint proves could not be
    recorded, the keys were retired anyway (exit 0), and nothing could find the rewrite again."""
    from tests.helpers import run_jixu

    class AsThread(TallyProjection):
        name = "thread"

    thread = "thread/01M9900000000000000000000T"
    path = tmp_path / "ledger.db"
    with SQLiteStore(path) as store:
        fill(store, thread, 0, 10)
        save_checkpoint(store, thread, AsThread(), project(store, thread, AsThread()))
    rotate_keys()
    rewrite_from(Raw(path), thread, 4)
    refused = run_jixu("keys", "retire", "--store", f"sqlite:///{path}?read_only=true")
    assert refused.returncode != 0 and "nothing retired" in refused.stderr, refused.stderr
    assert len(keyring().keys) == 2, "both keys kept"
    with SQLiteStore(path) as store:
        assert verdict(store, thread, checkpoints=["thread"], record=False).reason == "rewritten"


def test_a_verdict_row_whose_seal_is_not_ascii_is_a_break_not_an_error(key_file: Path, tmp_path: Path) -> None:
    """Found by a review: a seal naming a key held here with a non-ASCII mac made the key check raise TypeError,
    and the break watch reads many streams at once: an untouched stream's read failed with it."""
    path = _ledger(tmp_path, 5)
    current = keyring().current
    with Raw(path).transaction() as run:
        run("INSERT INTO jixu_checkpoints VALUES (?, ?, 3, 1, ?, ?, ?, '2026-12-07T00:00:00Z')", STREAM, VERDICT_NAME,
            "0" * 64, '{"first_bad_seq":3}', f"hmac-sha256:{current}:\u00e9")
    with SQLiteStore(path) as store:
        found = recorded_break(store, STREAM)
        assert found is not None and (found.reason, found.first_bad_seq) == ("break_unchecked", 3)
        assert "changed" in (found.detail or "")
        from jixu.ledger.trust import recorded_breaks
        assert set(recorded_breaks(store, [STREAM, "t/none"])) == {STREAM}


def test_a_break_no_key_checks_already_does_not_stop_retiring(key_file: Path, tmp_path: Path) -> None:
    """A store that holds a break recorded under a key lost long ago (``break_unchecked``) would otherwise never
    let its keys be retired again: retiring loses nothing of that break."""
    from tests.helpers import run_jixu

    path = _ledger(tmp_path, 5)
    with Raw(path).transaction() as run:
        run("INSERT INTO jixu_checkpoints VALUES (?, ?, 3, 1, ?, ?, ?, '2026-12-07T00:00:00Z')", STREAM, VERDICT_NAME,
            "0" * 64, '{"first_bad_seq":3}', "hmac-sha256:0123456789abcdef:00")
    rotate_keys()
    retired = run_jixu("keys", "retire", "--store", f"sqlite:///{path}")
    assert retired.returncode == 0, retired.stderr
    assert len(keyring().keys) == 1
    with SQLiteStore(path) as store:
        found = recorded_break(store, STREAM)
        assert found is not None and found.reason == "break_unchecked"
