"""Turn fencing between real worker processes: a stopped owner, an explicit recovery, a rejected late reply.

Also: a worker whose own clock is an hour off still has its lease judged by
the store's clock, both while it heartbeats and once it stopped.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from jixu.ledger import Store
from jixu.scheduling import create_thread_for, enqueue_thread, submit_turn
from jixu.threads.log import ThreadLog
from tests.conftest import StoreFactory
from tests.runs.agents import booking_agent, counter_agent
from tests.runs.conftest import Spawn, WorkerProcess, jixu_json, outside_lines, thread_state, wait_until

REQUEST = "5f3c0e4b9a1d4c2e8f7a6b5c4d3e2f10"


def queued_thread(store: Store) -> tuple[str, str]:
    thread_id = create_thread_for(store, counter_agent(), project="shop")
    return thread_id, submit_turn(store, thread_id, "charge order 42")


def ownership(store: Store, thread_id: str) -> dict[str, Any]:
    own = ThreadLog.load(store, thread_id).ownership()
    assert own is not None
    return own


def pause_when_the_effect_runs(worker: WorkerProcess, outside: Path, count: int = 1) -> None:
    """SIGSTOP ``worker`` as soon as its unsafe call reached the outside system (the call is still in flight)."""
    wait_until(lambda: len(outside_lines(outside)) >= count, "the tool call to reach the outside system")
    worker.signal(signal.SIGSTOP)


def test_a_paused_owner_is_fenced_out_after_recovery_and_its_late_reply_is_rejected(
        postgres: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    store = postgres()
    assert postgres.url is not None
    outside = tmp_path / "outside.txt"
    thread_id, turn_id = queued_thread(store)
    # worker-a runs on another machine: nothing here can tell that it is only paused (see the next test).
    first = workers(postgres.url, "worker-a", "--lease-ttl", "1",
                    env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_TOOL_SLEEP": "3",
                         "JIXU_TEST_BOOT_ID": "another-machine"})
    pause_when_the_effect_runs(first, outside)
    second = workers(postgres.url, "worker-b", "--lease-ttl", "1", env={"JIXU_TEST_OUTSIDE": str(outside)})
    # worker-a's claims expire by the store's clock; worker-b claims the item but does not take the turn over.
    wait_until(lambda: ownership(store, thread_id)["expired"], "worker-a's turn lease to expire")
    wait_until(lambda: "needs an operator" in second.output(), "worker-b to leave the expired turn to an operator")
    code, rows = jixu_json("turns", "list", postgres.url, "--expired")
    assert code == 0
    [row] = rows
    assert (row["thread_id"], row["turn_id"], row["owner"], row["epoch"], row["expired"]) == (
        thread_id, turn_id, "worker-a", 1, True)
    # The operator recovers the turn with the epoch they observed.
    code, stale = jixu_json("turns", "recover", postgres.url, thread_id, turn_id, "--request-id", "0" * 32,
                            "--expected-epoch", "7")
    assert code == 4 and stale["error"]["code"] == "stale_fence"
    code, recovered = jixu_json("turns", "recover", postgres.url, thread_id, turn_id, "--request-id", REQUEST,
                                "--expected-epoch", str(row["epoch"]), "--actor", "ops")
    assert code == 0, recovered
    receipt = recovered["receipt"]
    assert (receipt["previous_owner"], receipt["epoch"], receipt["reason"]) == ("worker-a", 2, "lease_expired")
    assert recovered["recorded"] and recovered["work"]["key"] == f"thread/{thread_id}"
    code, again = jixu_json("turns", "recover", postgres.url, thread_id, turn_id, "--request-id", REQUEST,
                            "--expected-epoch", str(row["epoch"]), "--actor", "ops")
    assert code == 0 and again["receipt"] == receipt and not again["recorded"]
    # The unsafe call is unknown: the operator checks the outside system and settles it; then it continues.
    [line] = outside_lines(outside)
    log = ThreadLog.load(store, thread_id)
    effect_id = line[1]
    assert log.snapshot().effects[effect_id].state == "unknown"
    log.resolve(effect_id, "occurred", note="the charge is in the outside system", actor="ops",
                result="charged")
    enqueue_thread(store, thread_id)
    wait_until(lambda: thread_state(store, thread_id)["status"] == "idle", "worker-b to finish the turn")
    assert thread_state(store, thread_id)["last_reply"] == "done"
    settled = store.read(f"thread/{thread_id}")
    # worker-a wakes up: its call returns, and its late receipt is refused by the fence.
    first.signal(signal.SIGCONT)
    wait_until(lambda: "OwnershipLost" in first.output(), "worker-a to report that it lost the turn")
    time.sleep(0.3)
    events = store.read(f"thread/{thread_id}")
    assert [e.to_dict() for e in events] == [e.to_dict() for e in settled], "nothing from worker-a was appended"
    assert not [e for e in events if e.type in ("tool.completed", "tool.failed") and e.data["effect_id"] == effect_id]
    assert len([e for e in events if e.type == "tool.dispatched"]) == 1
    assert len(outside_lines(outside)) == 1, "the unsafe effect ran once"
    assert [e.data["reason"] for e in events if e.type == "turn.claimed"] == ["claimed", "continued"]
    assert store.verify(f"thread/{thread_id}").valid
    assert first.stop() == 0 and second.stop() == 0


def test_a_paused_owner_on_this_machine_keeps_its_turn_from_recovery_until_it_is_stopped(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """Its lease expired, but the process still runs here: resumed, its call in flight goes on. Recovering the turn
    took the expired claim anyway, and the resolution it leads to was then accepted while that call could still
    act. Recovery is refused until the process stops; then it succeeds."""
    store = sqlite()
    assert sqlite.url is not None
    outside = tmp_path / "outside.txt"
    thread_id, turn_id = queued_thread(store)
    first = workers(sqlite.url, "worker-a", "--lease-ttl", "1",
                    env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_TOOL_SLEEP": "3"})
    pause_when_the_effect_runs(first, outside)
    wait_until(lambda: ownership(store, thread_id)["expired"], "worker-a's turn lease to expire")
    code, refused = jixu_json("turns", "recover", sqlite.url, thread_id, turn_id, "--request-id", REQUEST,
                              "--expected-epoch", "1")
    assert code == 4 and refused["error"]["code"] == "turn_owned", refused
    assert "still runs on this machine" in refused["error"]["message"]
    # Another worker finding the turn says the same (it used to advise the recovery just refused).
    second = workers(sqlite.url, "worker-b", "--lease-ttl", "1", env={"JIXU_TEST_OUTSIDE": str(outside)})
    wait_until(lambda: "needs an operator" in second.output(), "worker-b to leave the turn to an operator")
    advice = second.output()
    assert "still runs on this machine: stop it first" in advice and "jixu turns recover" not in advice, advice
    assert second.stop() == 0
    first.kill()
    code, recovered = jixu_json("turns", "recover", sqlite.url, thread_id, turn_id, "--request-id", REQUEST,
                                "--expected-epoch", "1")
    assert code == 0 and recovered["receipt"]["previous_owner"] == "worker-a", recovered


def test_a_worker_with_a_skewed_clock_is_judged_by_the_store_clock(sqlite: StoreFactory, workers: Spawn,
                                                                  tmp_path: Path) -> None:
    """The worker's ``time.time`` runs an hour fast; its lease still lives and dies by the store's clock."""
    store = sqlite()
    assert sqlite.url is not None
    outside = tmp_path / "outside.txt"
    thread_id, turn_id = queued_thread(store)
    # 3 s: long enough that a heartbeat delayed by a loaded machine does not let the lease lapse mid-call.
    release = tmp_path / "release"
    skewed = workers(sqlite.url, "skewed", "--lease-ttl", "3",
                     env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_TOOL_SLEEP": "120",
                          "JIXU_TEST_TOOL_RELEASE": str(release), "JIXU_TEST_CLOCK_SKEW": "3600",
                          "JIXU_TEST_BOOT_ID": "another-machine"})  # its stop is then not seen from here
    wait_until(lambda: len(outside_lines(outside)) == 1, "the skewed worker's tool call")
    # While it heartbeats, its lease is live by the store's clock (and only 3 s long, not an hour). The tool
    # call lasts until these three looks (six CLI processes) are done, however loaded the machine is.
    for _ in range(3):
        code, [row] = jixu_json("turns", "list", sqlite.url)
        assert code == 0 and row["owner"] == "skewed" and not row["expired"]
        assert 0 < row["expires_in"] <= 3.05 and abs(row["expires_at"] - store.now()) < 3.5
        code, refused = jixu_json("turns", "recover", sqlite.url, thread_id, turn_id, "--request-id", REQUEST,
                                  "--expected-epoch", str(row["epoch"]))
        assert code == 4 and refused["error"]["code"] == "turn_owned", refused
        time.sleep(0.5)
    release.touch()
    wait_until(lambda: thread_state(store, thread_id)["status"] == "idle", "the skewed worker to finish")
    # Stopped, its lease expires by the store's clock although its own clock says another hour is left.
    release.unlink()  # the second call lasts until it is released again
    second_turn = submit_turn(store, thread_id, "charge order 43")
    pause_when_the_effect_runs(skewed, outside, count=2)
    wait_until(lambda: ownership(store, thread_id)["expired"], "the stopped worker's lease to expire")
    epoch = ownership(store, thread_id)["epoch"]
    code, recovered = jixu_json("turns", "recover", sqlite.url, thread_id, second_turn, "--request-id", REQUEST,
                                "--expected-epoch", str(epoch))
    assert code == 0 and recovered["receipt"]["previous_owner"] == "skewed", recovered
    before = store.read(f"thread/{thread_id}")
    release.touch()
    skewed.signal(signal.SIGCONT)
    wait_until(lambda: "OwnershipLost" in skewed.output(), "the skewed worker to lose the turn")
    assert [e.to_dict() for e in store.read(f"thread/{thread_id}")] == [e.to_dict() for e in before]
    assert len(outside_lines(outside)) == 2 and store.verify(f"thread/{thread_id}").valid
    assert skewed.stop() == 0


def test_a_turn_left_to_an_operator_while_its_holder_runs_goes_on_once_that_holder_is_gone(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """Found by an audit: a worker that met an expired claim whose holder still ran here finished the work item
    ("needs an operator"); once the holder let go (after a PostgreSQL outage it had given the turn up), nobody
    claimed the thread again and it showed "running" for good. The item is looked at again after a lease's time:
    here the holder, frozen in an idempotent call, is killed, and the other worker takes the turn over and
    finishes it without anyone re-enqueueing the thread."""
    store = sqlite()
    assert sqlite.url is not None
    outside = tmp_path / "outside.txt"
    thread_id = create_thread_for(store, booking_agent(), project="shop")
    submit_turn(store, thread_id, "book it")
    env = {"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_TOOL_SLEEP": "3"}
    first = workers(sqlite.url, "worker-a", "--lease-ttl", "1", agent="booking_agent", env=env)
    pause_when_the_effect_runs(first, outside)
    wait_until(lambda: ownership(store, thread_id)["expired"], "worker-a's turn lease to expire")
    second = workers(sqlite.url, "worker-b", "--lease-ttl", "1", agent="booking_agent",
                     env={"JIXU_TEST_OUTSIDE": str(outside)})
    wait_until(lambda: "needs an operator" in second.output(), "worker-b to leave the turn to an operator")
    first.kill()
    wait_until(lambda: thread_state(store, thread_id)["status"] == "idle", "worker-b to finish the turn")
    claims = [e.data["owner"] for e in store.read(f"thread/{thread_id}") if e.type == "turn.claimed"]
    assert claims == ["worker-a", "worker-b"], claims
    assert second.stop() == 0
