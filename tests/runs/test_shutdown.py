"""SIGTERM during work: the worker drains within its timeout, loses nothing, and a restarted worker finishes."""

from __future__ import annotations

import signal
import time
from collections import defaultdict
from pathlib import Path

import pytest

from jixu.scheduling import create_thread_for, submit_turn
from tests.conftest import StoreFactory
from tests.runs.agents import booking_agent
from tests.runs.conftest import Spawn, outside_lines, thread_state, wait_until


@pytest.mark.parametrize(("kind", "tool_seconds", "drain"), [
    ("sqlite", 5.0, 3.0),     # the call in flight outlasts the drain: cut off, recorded, retried later
    ("postgres", 0.5, 3.0),   # the call in flight finishes within the drain; the turn stops after it
], ids=["cut-off-sqlite", "drained-postgres"])
def test_sigterm_drains_within_the_timeout_loses_nothing_and_a_restarted_worker_finishes(
        kind: str, tool_seconds: float, drain: float, workers: Spawn, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    factory: StoreFactory = request.getfixturevalue(kind)
    store = factory()
    assert factory.url is not None
    outside = tmp_path / "outside.txt"
    threads = []
    for n in range(4):
        thread_id = create_thread_for(store, booking_agent(), project=f"p{n % 2}")
        submit_turn(store, thread_id, f"book table {n}")
        threads.append(thread_id)
    env = {"JIXU_TEST_OUTSIDE": str(outside)}
    worker = workers(factory.url, "worker-1", "--concurrency", "1", "--drain-timeout", str(drain), "--lease-ttl", "5",
                     agent="booking_agent", env={**env, "JIXU_TEST_TOOL_SLEEP": str(tool_seconds)})
    wait_until(lambda: len(outside_lines(outside)) == 1, "the first call to be in flight")
    stopped_at = time.monotonic()
    worker.signal(signal.SIGTERM)
    code = worker.wait()
    took = time.monotonic() - stopped_at
    output = worker.output()
    print(f"{kind}: the worker exited {took:.2f}s after SIGTERM (drain timeout {drain}s)")
    assert code == 0, output
    assert took < drain, f"exited {took:.2f}s after SIGTERM; the drain timeout is {drain}s"
    assert "draining the turn in flight" in output and "(requeued)" in output
    [first_call] = outside_lines(outside)
    cut_thread = first_call[0]
    # Nothing lost: every chain verifies, and these events stay exactly as they are from here on.
    before = {t: [e.to_dict() for e in store.read(f"thread/{t}")] for t in threads}
    assert all(store.verify(f"thread/{t}").valid for t in threads)
    cut_events = store.read(f"thread/{cut_thread}")
    receipts = [e for e in cut_events if e.type in ("tool.completed", "tool.failed")]
    if tool_seconds > drain:
        [failed] = receipts
        assert failed.type == "tool.failed" and failed.data["indeterminate"] is True
    else:
        assert [e.type for e in receipts] == ["tool.completed"]
    assert not [e for e in cut_events if e.type == "turn.ended"], "a drained turn stays active for the next worker"
    assert {i.key: i.state for i in store.list_work()}[f"thread/{cut_thread}"] == "pending"
    # A restarted worker (same name) finishes every turn.
    again = workers(factory.url, "worker-1", "--concurrency", "1", "--drain-timeout", str(drain), "--lease-ttl", "5",
                    agent="booking_agent", env=env)
    wait_until(lambda: all(thread_state(store, t)["status"] == "idle" for t in threads), "every turn to finish",
               interval=0.05)
    assert again.stop() == 0
    calls: dict[str, list[list[str]]] = defaultdict(list)
    for line in outside_lines(outside):
        calls[line[0]].append(line)
    for thread_id in threads:
        events = store.read(f"thread/{thread_id}")
        assert [e.to_dict() for e in events[:len(before[thread_id])]] == before[thread_id]
        assert store.verify(f"thread/{thread_id}").valid
        assert [e.data["outcome"] for e in events if e.type == "turn.ended"] == ["completed"]
        assert thread_state(store, thread_id)["last_reply"] == "done"
        # The outside system saw one booking per thread (deduplicated by the idempotency key).
        assert len({line[2] for line in calls[thread_id]}) == 1
    expected_cut_calls = 2 if tool_seconds > drain else 1  # a cut-off idempotent call is retried, same key
    assert len(calls[cut_thread]) == expected_cut_calls
    assert {line[1] for line in calls[cut_thread]} == {first_call[1]}, "retried under the original effect id"
