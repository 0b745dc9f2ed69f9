"""``jixu turns list|recover`` as an operator runs them: a real subprocess over a real ledger."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from jixu import Agent, ScriptedModel, ToolCall, tool
from jixu.ledger import NewEvent, SQLiteStore
from jixu.scheduling import create_thread_for, submit_turn
from jixu.threads.log import ThreadLog, stream_of
from tests.helpers import run_jixu

REQUEST = "00112233445566778899aabbccddeeff"
LEGACY_TURN = "01JD0000000000000000000001"


@tool(semantics="unsafe")
def charge(order: str) -> str:
    """Charge an order."""
    return f"charged {order}"


def agent() -> Agent:
    return Agent("shop", ScriptedModel([ToolCall("charge", {"order": "42"}), "Charged."]), tools=[charge])


@dataclass
class Ledger:
    """Threads with: an expired owned turn, a live owned turn, a legacy turn, an idle thread, a queued turn."""

    db: Path
    expired: str
    expired_turn: str
    live: str
    live_turn: str
    legacy: str
    idle: str
    queued: str

    def count(self, thread_id: str) -> int:
        with SQLiteStore(self.db) as store:
            return len(store.read(stream_of(thread_id)))


@pytest.fixture
def ledger(tmp_path: Path) -> Ledger:
    db = tmp_path / "turns.db"
    with SQLiteStore(db) as store:
        record = agent().describe()
        expired = create_thread_for(store, record, project="shop")
        expired_turn, _ = ThreadLog.load(store, expired).start_turn("charge 42", owner="worker-a", ttl=0.2)
        store.enqueue(f"thread/{expired}", "shop")  # a worker's thread: recovery puts it back in the queue
        live = create_thread_for(store, record)
        live_turn, _ = ThreadLog.load(store, live).start_turn("charge 43", owner="worker-b", ttl=300)
        legacy = create_thread_for(store, record)
        store.append(stream_of(legacy), [NewEvent("turn.started", {"turn_id": LEGACY_TURN, "input": "old"})], 1)
        idle = create_thread_for(store, record)
        queued = create_thread_for(store, record, project="shop")
        submit_turn(store, queued, "charge 44")
    time.sleep(0.3)  # worker-a's lease expires by the store's clock
    return Ledger(db, expired, expired_turn, live, live_turn, legacy, idle, queued)


def jixu(*args: str) -> subprocess.CompletedProcess[str]:
    return run_jixu("turns", *args)


def as_json(*args: str) -> tuple[int, Any]:
    result = jixu(*args, "--json")
    return result.returncode, json.loads(result.stdout)


def recover(ledger: Ledger, *extra: str, thread: str | None = None, turn: str | None = None,
            request: str = REQUEST, epoch: str = "1") -> tuple[int, Any]:
    return as_json("recover", str(ledger.db), thread or ledger.expired, turn or ledger.expired_turn,
                   "--request-id", request, "--expected-epoch", epoch, *extra)


def test_list_shows_every_active_turn_with_its_ownership_by_the_store_clock(ledger: Ledger) -> None:
    code, rows = as_json("list", str(ledger.db))
    assert code == 0
    by_id = {row["thread_id"]: row for row in rows}
    assert set(by_id) == {ledger.expired, ledger.live, ledger.legacy, ledger.queued}
    expired = by_id[ledger.expired]
    assert (expired["owner"], expired["epoch"], expired["expired"], expired["legacy"]) == ("worker-a", 1, True, False)
    assert expired["expires_in"] < 0 and expired["heartbeat_at"] is not None and expired["work"]["state"] == "pending"
    live = by_id[ledger.live]
    assert (live["owner"], live["expired"], live["legacy"]) == ("worker-b", False, False)
    assert 250 < live["expires_in"] <= 300 and live["turn_id"] == ledger.live_turn
    assert by_id[ledger.legacy]["legacy"] is True and by_id[ledger.legacy]["owner"] is None
    queued = by_id[ledger.queued]
    assert (queued["queued"], queued["legacy"], queued["owner"], queued["work"]["project"]) == (
        True, False, None, "shop")
    code, expired_rows = as_json("list", str(ledger.db), "--expired")
    assert code == 0 and {r["thread_id"] for r in expired_rows} == {ledger.expired, ledger.legacy}
    human = jixu("list", str(ledger.db))
    assert human.returncode == 0, human.stderr
    assert "worker-a" in human.stdout and "expired" in human.stdout and "legacy" in human.stdout
    assert f"jixu turns recover {ledger.db} {ledger.expired} {ledger.expired_turn}" in human.stdout
    assert "--legacy-confirmed-stopped" in human.stdout


def test_recover_records_a_receipt_replays_it_and_requeues_the_thread(ledger: Ledger) -> None:
    before = ledger.count(ledger.expired)
    code, out = recover(ledger, "--actor", "ops", "--note", "worker-a's host was replaced")
    assert code == 0, out
    receipt = out["receipt"]
    assert out["recorded"] is True and receipt["note"] == "worker-a's host was replaced"
    assert (receipt["turn_id"], receipt["epoch"], receipt["previous_owner"], receipt["reason"], receipt["actor"]) == (
        ledger.expired_turn, 2, "worker-a", "lease_expired", "ops")
    assert out["thread"]["status"] == "waiting" and "needs reconciliation" in out["thread"]["reason"]
    assert out["work"]["state"] == "pending"
    assert ledger.count(ledger.expired) == before + 1
    code, again = recover(ledger, "--actor", "ops")
    assert code == 0 and again["receipt"] == receipt and again["recorded"] is False
    assert ledger.count(ledger.expired) == before + 1, "a replayed request writes nothing"
    code, changed = recover(ledger, "--actor", "ops", epoch="2")
    assert code == 4 and changed["error"]["code"] == "resolution_conflict"


def test_recover_prints_the_receipt_for_a_person(ledger: Ledger) -> None:
    result = jixu("recover", str(ledger.db), ledger.expired, ledger.expired_turn, "--request-id", REQUEST,
                  "--expected-epoch", "1")
    assert result.returncode == 0, result.stderr
    assert "recovered turn" in result.stdout and "lease_expired" in result.stdout and "worker-a" in result.stdout
    assert "queued for a worker" in result.stdout
    replay = jixu("recover", str(ledger.db), ledger.expired, ledger.expired_turn, "--request-id", REQUEST,
                  "--expected-epoch", "1")
    assert replay.returncode == 0 and "already recovered" in replay.stdout


def test_recover_refuses_a_live_lease_and_a_moved_epoch_with_exit_4(ledger: Ledger) -> None:
    before = ledger.count(ledger.live)
    code, live = recover(ledger, thread=ledger.live, turn=ledger.live_turn)
    assert code == 4 and live["error"]["code"] == "turn_owned"
    code, moved = recover(ledger, epoch="5")
    assert code == 4 and moved["error"]["code"] == "stale_fence"
    assert ledger.count(ledger.live) == before
    result = jixu("recover", str(ledger.db), ledger.live, ledger.live_turn, "--request-id", REQUEST,
                  "--expected-epoch", "1")
    assert result.returncode == 4 and "still owned" in result.stderr


def test_bad_input_exits_6_and_writes_nothing(ledger: Ledger) -> None:
    before = ledger.count(ledger.expired)
    for kwargs in ({"request": "not-hex"}, {"request": REQUEST.upper()}, {"epoch": "x"}, {"epoch": "-1"}):
        code, out = recover(ledger, **kwargs)
        assert code == 6, (kwargs, out)
    code, out = recover(ledger, "--legacy-confirmed-stopped")
    assert code == 6 and out["error"]["field"] == "legacy_confirmed_stopped"
    code, out = recover(ledger, thread=ledger.legacy, turn=LEGACY_TURN, epoch="0")
    assert code == 6 and "legacy_confirmed_stopped" in out["error"]["message"]
    code, out = recover(ledger, thread="not-an-id")
    assert code == 6
    code, out = recover(ledger, turn="badturn")  # a malformed turn id is bad input, not an unknown turn
    assert code == 6 and out["error"]["code"] == "invalid_id"
    assert ledger.count(ledger.expired) == before


def test_unknown_threads_and_turns_exit_3(ledger: Ledger) -> None:
    code, out = recover(ledger, thread="01JD0000000000000000000009")
    assert code == 3 and out["error"]["code"] == "thread_not_found"
    code, out = recover(ledger, thread=ledger.idle, turn="01JD0000000000000000000009")
    assert code == 3
    missing = jixu("list", str(ledger.db.parent / "nope.db"))
    assert missing.returncode == 3


def test_a_legacy_turn_is_recovered_with_the_explicit_assertion(ledger: Ledger) -> None:
    code, out = recover(ledger, "--legacy-confirmed-stopped", thread=ledger.legacy, turn=LEGACY_TURN, epoch="0")
    assert code == 0, out
    assert out["receipt"]["reason"] == "legacy_confirmed_stopped" and out["receipt"]["legacy_confirmed_stopped"]
    assert out["work"] is None, "a thread outside the work queue is not put into it"


def test_list_offers_no_recovery_on_a_thread_whose_history_was_changed_before_its_checkpoint(
        ledger: Ledger) -> None:
    """The expired turn's thread is checkpointed, then an event before the checkpoint is changed in the file
    (triggers dropped). Opening from the checkpoint does not read that event, so the list showed the turn as
    expired and printed its ``jixu turns recover`` command. A turn an operator might recover has its whole
    history verified first: the row says ``corrupt`` and offers nothing."""
    from tests.attacker import Raw, flip_data_byte

    with SQLiteStore(ledger.db) as store:
        assert ThreadLog.load(store, ledger.expired).checkpoint()
    flip_data_byte(Raw(ledger.db), stream_of(ledger.expired), 1)
    code, rows = as_json("list", str(ledger.db))
    assert code == 0
    [row] = [r for r in rows if r["thread_id"] == ledger.expired]
    assert row["status"] == "corrupt" and row["corruption"]["first_bad_seq"] == 1, row
    assert not row.get("expired")
    shown = jixu("list", str(ledger.db))
    assert shown.returncode == 0 and f"recover {ledger.expired}" not in shown.stdout, shown.stdout
    assert "corrupt" in shown.stdout
    assert f"recover {ledger.legacy}" in shown.stdout  # the others are offered as before
