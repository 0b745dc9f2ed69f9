"""A fleet of turns per worker process: many at once, within the limits, a blocking tool stalls nothing, SIGTERM
drains them all, SIGKILL loses none of them.

Real ``jixu worker`` processes over real stores (PostgreSQL from the ``postgres_dsn`` fixture); the outside
system is a file each tool call appends one line to.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from jixu import Agent, ScriptedModel
from jixu.ledger import MemoryStore, Store
from jixu.ledger.encoding import JSONObject
from jixu.scheduling import Worker, WorkerConfig, create_thread_for, submit_turn
from jixu.threads.log import ThreadLog
from jixu.threads.model import Step
from tests.conftest import StoreFactory
from tests.runs.agents import blocking_agent, counter_agent, mixed_agent
from tests.runs.conftest import WAIT, Spawn, outside_lines, thread_state, wait_until
from tests.runs.test_multiworker import Sampler


def stats_of(output: str) -> dict[str, float]:
    """The stats a worker printed when it stopped."""
    [found] = re.findall(r"stopped \([^)]*\): (\{.*\})", output)
    stats: dict[str, float] = json.loads(found)
    return stats


def most_at_once(starts: list[float], seconds: float) -> int:
    """The most calls that started within ``seconds`` of each other (calls of that duration running together)."""
    ordered = sorted(starts)
    return max(sum(1 for t in ordered if s <= t < s + seconds) for s in ordered)


def test_two_workers_on_postgres_run_n_turns_at_once_each_and_never_more_per_project_than_its_limit(
        postgres: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    store = postgres()
    assert postgres.url is not None
    outside = tmp_path / "outside.txt"
    agent = counter_agent()
    projects: dict[str, str] = {}
    for project, count in (("a", 40), ("b", 60)):
        for _ in range(count):
            thread_id = create_thread_for(store, agent, project=project)
            submit_turn(store, thread_id, "charge the order")
            projects[thread_id] = project
    sampler = Sampler(postgres())
    sampler.start()
    env = {"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_TOOL_SLEEP": "1.5"}
    options = ("--concurrency", "15", "--project-limit", "a=8", "--lease-ttl", "9", "--drain-timeout", "5")
    pool = [workers(postgres.url, f"fleet-{n}", *options, env=env) for n in (1, 2)]
    try:
        wait_until(lambda: len(store.list_work(state="done")) == len(projects), "all 100 turns done",
                   timeout=WAIT * 2, interval=0.05)
    finally:
        sampler.done.set()
        sampler.join(WAIT)
    for worker in pool:
        worker.signal(signal.SIGTERM)
    assert [worker.wait() for worker in pool] == [0, 0], [w.output() for w in pool]
    assert sampler.error is None and sampler.samples > 20
    # Each process ran its full concurrency at once, and never more; project a never above its limit of 8.
    assert [stats_of(w.output())["max_in_flight"] for w in pool] == [15, 15]
    assert sampler.peak["*"] <= 30 and sampler.peak["a"] <= 8, sampler.peak
    assert sampler.peak["*"] >= 25, f"expected ~30 claims at once: {sampler.peak}"
    lines = outside_lines(outside)
    by_process = Counter(line[3] for line in lines)
    assert len(by_process) == 2, "both processes ran turns"
    at_once = most_at_once([float(line[4]) for line in lines], 1.5)
    assert 25 <= at_once <= 30, f"{at_once} calls ran at once across the two processes (2 x 15 allowed)"
    # Exactly once each.
    calls = Counter(line[0] for line in lines)
    assert set(calls) == set(projects) and set(calls.values()) == {1}
    for thread_id in projects:
        assert thread_state(store, thread_id)["last_reply"] == "done"
        assert store.verify(f"thread/{thread_id}").valid


def test_a_blocking_def_tool_does_not_stall_the_other_turns_and_runs_in_a_bounded_pool(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """Ten turns call a plain ``def`` tool that blocks its thread for 6 s; twenty others call an async tool. With
    --tool-threads 8, eight blockers run at once (the pool is bounded) and the twenty others finish meanwhile:
    neither the event loop nor the commits wait for a blocked thread."""
    store = sqlite()
    assert sqlite.url is not None
    outside = tmp_path / "outside.txt"
    agent = blocking_agent()
    blockers, others = [], []
    for n in range(10):
        blockers.append(create_thread_for(store, agent))
        submit_turn(store, blockers[-1], f"block {n}")
    for n in range(20):
        others.append(create_thread_for(store, agent))
        submit_turn(store, others[-1], f"charge {n}")
    worker = workers(sqlite.url, "blocked", "--concurrency", "30", "--tool-threads", "8", "--lease-ttl", "9",
                     agent="blocking_agent", env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_BLOCK_SLEEP": "6"})
    blocked = set(blockers)
    wait_until(lambda: len({line[0] for line in outside_lines(outside)} & blocked) >= 8, "eight blocking calls")
    first_block = min(float(line[4]) for line in outside_lines(outside) if line[0] in blocked)
    waited = wait_until(lambda: all(thread_state(store, t)["status"] == "idle" for t in others),
                        "the twenty other turns", interval=0.05)
    lines = outside_lines(outside)
    block_starts = sorted(float(line[4]) for line in lines if line[0] in blocked)
    assert len(block_starts) == 8 or block_starts[8] - first_block > 5, "more than 8 blocking calls at once"
    done_before_unblocked = time.monotonic() - first_block
    print(f"the 20 other turns were done {waited:.2f}s after the 8th blocking call started")
    assert done_before_unblocked < 5.5, "the other turns waited for the blocked threads"
    wait_until(lambda: all(thread_state(store, t)["status"] == "idle" for t in blockers), "the blocking turns",
               timeout=WAIT)
    assert most_at_once(sorted(float(line[4]) for line in outside_lines(outside) if line[0] in blocked), 5.9) == 8
    assert worker.stop() == 0
    assert Counter(line[0] for line in outside_lines(outside)) == Counter({t: 1 for t in blockers + others})


def test_sigterm_drains_every_turn_in_flight_within_the_timeout_and_leaves_nothing_claimed(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    store = sqlite()
    assert sqlite.url is not None
    outside = tmp_path / "outside.txt"
    threads = []
    for n in range(40):
        threads.append(create_thread_for(store, mixed_agent()))
        submit_turn(store, threads[-1], f"book table {n}")
    env = {"JIXU_TEST_OUTSIDE": str(outside)}
    worker = workers(sqlite.url, "drained", "--concurrency", "40", "--drain-timeout", "5", "--lease-ttl", "9",
                     agent="mixed_agent", env={**env, "JIXU_TEST_TOOL_SLEEP": "2.5"})
    wait_until(lambda: len(outside_lines(outside)) == 40, "all 40 calls in flight")
    stopped_at = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    took = time.monotonic() - stopped_at
    print(f"40 turns drained; the worker exited {took:.2f}s after SIGTERM (drain timeout 5s)")
    assert took < 5, f"exited {took:.2f}s after SIGTERM; the drain timeout is 5s"
    assert "draining the 40 turns in flight" in worker.output()
    # Every call in flight finished within the drain and was recorded; each turn stopped after it, its item put
    # back in the queue; nothing is left claimed.
    items = Counter(item.state for item in store.list_work())
    assert items == Counter({"pending": 40}), items
    for thread_id in threads:
        events = store.read(f"thread/{thread_id}")
        assert [e.type for e in events if e.type in ("tool.completed", "tool.failed")] == ["tool.completed"]
        assert store.verify(f"thread/{thread_id}").valid
    assert stats_of(worker.output())["requeued"] == 40
    again = workers(sqlite.url, "drained", "--drain-timeout", "4", agent="mixed_agent", env=env)
    wait_until(lambda: all(thread_state(store, t)["status"] == "idle" for t in threads), "every turn to finish",
               interval=0.05)
    assert again.stop() == 0
    assert Counter(line[0] for line in outside_lines(outside)) == Counter({t: 1 for t in threads})


def test_sigkill_of_a_worker_holding_50_turns_the_other_recovers_all_50_and_no_unsafe_call_runs_twice(
        postgres: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """Worker A holds 50 turns, each with its tool call in flight (25 unsafe ``charge``, 25 idempotent ``book``),
    and is SIGKILLed. Worker B (``--takeover safe``) takes every one of the 50 over: the idempotent calls are
    retried under their own effect id and key and the turns finish; the unsafe calls become unknown and wait for
    an operator (B writes nothing to those threads), never run a second time."""
    store = postgres()
    assert postgres.url is not None
    outside = tmp_path / "outside.txt"
    agent = mixed_agent()
    kind: dict[str, str] = {}
    for n in range(50):
        word = "charge" if n % 2 else "book"
        thread_id = create_thread_for(store, agent)
        submit_turn(store, thread_id, f"{word} order {n}")
        kind[thread_id] = word
    first = workers(postgres.url, "fleet-a", "--concurrency", "50", "--lease-ttl", "3", agent="mixed_agent",
                    env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_TOOL_SLEEP": "60"})
    wait_until(lambda: len(outside_lines(outside)) == 50, "worker A to have all 50 calls in flight")
    assert len(store.list_work(state="claimed")) == 50
    first.signal(signal.SIGKILL)
    first.wait()
    second = workers(postgres.url, "fleet-b", "--concurrency", "50", "--lease-ttl", "3", "--takeover", "safe",
                     agent="mixed_agent", env={"JIXU_TEST_OUTSIDE": str(outside)})
    wait_until(lambda: len(store.list_work(state="done")) == 50, "worker B to settle all 50 items", timeout=WAIT * 2,
               interval=0.05)
    assert second.stop() == 0, second.output()
    assert not store.list_work(state="claimed") and not store.list_work(state="pending")
    calls: dict[str, list[list[str]]] = defaultdict(list)
    for line in outside_lines(outside):
        calls[line[0]].append(line)
    output = second.output()
    for thread_id, word in kind.items():
        events = store.read(f"thread/{thread_id}")
        assert store.verify(f"thread/{thread_id}").valid
        state = thread_state(store, thread_id)
        claimed = [e.data["reason"] for e in events if e.type == "turn.claimed"]
        if word == "book":  # retry-safe: taken over by B, retried under the same identity, and finished
            assert claimed[-1] == "took_over_dead_owner", claimed
            assert state["status"] == "idle" and state["last_reply"] == "done", state["status"]
            assert len(calls[thread_id]) == 2 and len({(c[1], c[2]) for c in calls[thread_id]}) == 1
            assert {c[3] for c in calls[thread_id]} == {str(first.pid), str(second.pid)}
        else:  # unsafe: in doubt, left to an operator, never run again
            assert len(calls[thread_id]) == 1, calls[thread_id]
            assert len([e for e in events if e.type == "tool.dispatched"]) == 1
            effect = ThreadLog.load(store, thread_id).snapshot().effects[calls[thread_id][0][1]]
            assert (effect.name, effect.state) == ("charge", "unknown"), effect
            assert state["status"] == "waiting", state["status"]
            assert f"thread/{thread_id}: waiting: effects with an unknown outcome need an operator" in output
    assert output.count("claimed thread/") >= 50


def test_claims_stop_while_the_event_loop_runs_late_and_resume_once_it_caught_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Back-pressure: while something holds the loop (0.1 s at a time, for 1 s), the worker's measured lag is
    above its limit (0.03 s) and it claims (almost) nothing; afterwards it claims and runs every turn."""
    monkeypatch.setenv("JIXU_TEST_OUTSIDE", str(tmp_path / "outside.txt"))
    store = MemoryStore()
    threads = [create_thread_for(store, counter_agent()) for _ in range(20)]
    for thread_id in threads:
        submit_turn(store, thread_id, "charge")
    claims: list[float] = []
    config = WorkerConfig(store_url="memory://", agent="tests.runs.agents:counter_agent", owner="w-1",
                          poll_interval=0.01, lease_ttl=5, concurrency=100, max_loop_lag=0.03, exit_when_idle=True)
    worker = Worker(counter_agent(), store, config,
                    report=lambda kind, text: claims.append(time.monotonic()) if kind == "claim" else None)
    hog_until = 0.0

    async def main() -> None:
        nonlocal hog_until
        hog_until = time.monotonic() + 1.0

        async def hog() -> None:
            while time.monotonic() < hog_until:
                time.sleep(0.1)  # holds the loop, as a CPU-bound stretch or a blocking call would
                await asyncio.sleep(0)

        hogging = asyncio.create_task(hog())
        await asyncio.wait_for(worker.run(), WAIT)
        await hogging

    asyncio.run(main())
    during = [t for t in claims if t < hog_until]
    assert len(during) <= 3, f"{len(during)} claims while the loop ran 0.1 s late"
    assert worker.stats.held_back > 0 and worker.stats.max_loop_lag >= 0.08, worker.stats
    assert worker.stats.finished == 20
    assert all(thread_state(store, t)["status"] == "idle" for t in threads)


def test_a_turn_whose_lease_lapsed_while_the_loop_was_held_is_continued_not_left_running(
        sqlite: StoreFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Something holds the worker's loop (a CPU-bound stretch, a blocking call in an async tool, a stopped
    process) past the turn leases of the calls in flight: each turn learns it no longer owns its turn. Its work
    item must go back in the queue, not be finished: the turn is then claimed again. Finished instead, the thread
    would stay ``running`` with no worker and no queue item to ever continue it. Each call in flight finished
    while its claim had lapsed; nobody else claimed the turn, so the same worker's next claim records what the
    call returned (decision 0070): neither the idempotent ``book`` nor the unsafe ``charge`` runs again, and no
    operator is needed (before, ``book`` ran twice and every ``charge`` waited for an operator)."""
    outside = tmp_path / "outside.txt"
    monkeypatch.setenv("JIXU_TEST_OUTSIDE", str(outside))
    monkeypatch.setenv("JIXU_TEST_TOOL_SLEEP", "0.3")
    store = sqlite()
    kind: dict[str, str] = {}
    for n in range(6):
        word = "charge" if n % 2 else "book"
        thread_id = create_thread_for(store, mixed_agent())
        submit_turn(store, thread_id, f"{word} order {n}")
        kind[thread_id] = word
    config = WorkerConfig(store_url=str(sqlite.url), agent="tests.runs.agents:mixed_agent", owner="held",
                          poll_interval=0.02, lease_ttl=0.6, concurrency=10, exit_when_idle=True)
    reports: list[tuple[str, str]] = []
    worker = Worker(mixed_agent(), store, config, report=lambda kind, text: reports.append((kind, text)))

    async def main() -> None:
        async def hold_the_loop() -> None:
            while len(outside_lines(outside)) < len(kind):
                await asyncio.sleep(0.01)
            time.sleep(1.5)  # every call in flight; the loop held 2.5 lease lengths: the leases lapse

        holding = asyncio.create_task(hold_the_loop())
        await asyncio.wait_for(worker.run(), WAIT)
        await holding

    asyncio.run(main())
    assert any(kind == "lost" for kind, _text in reports), reports  # the leases did lapse
    assert not store.list_work(state="claimed") and not store.list_work(state="pending")
    calls = Counter(line[0] for line in outside_lines(outside))
    for thread_id in kind:
        state = thread_state(store, thread_id)
        assert store.verify(f"thread/{thread_id}").valid
        assert (state["status"], state["last_reply"]) == ("idle", "done"), (state["status"], reports)
        assert calls[thread_id] == 1
        claims = [e.data["epoch"] for e in store.read(f"thread/{thread_id}") if e.type == "turn.claimed"]
        assert len(claims) >= 2, claims  # the receipt was recorded under the turn's next claim


def answered_after_one_retry(store: Store, replies: dict[str, str], seen: object) -> None:
    """Each thread idle with its reply and a valid chain, its model called twice: the call in flight when the
    lease was lost, then its retry under the next claim."""
    for thread_id, reply in replies.items():
        state = thread_state(store, thread_id)
        assert (state["status"], state["last_reply"]) == ("idle", reply), (state, seen)
        assert store.verify(f"thread/{thread_id}").valid
        assert len([e for e in store.read(f"thread/{thread_id}") if e.type == "model.dispatched"]) == 2


def test_a_worker_process_stopped_past_its_leases_continues_every_turn_it_held(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """A real ``jixu worker`` holding 12 turns, each with its model call in flight, is stopped (SIGSTOP: a frozen
    VM, a pause of the whole process) for three lease lengths. On SIGCONT every lease is found lost (an expired
    lease is never renewed); each turn stops as ``OwnershipLost``, its item goes back in the queue, and the
    worker's next claims continue every turn (the read-only model call retried) to its reply. None is finished
    while still ``running``."""
    store = sqlite()
    assert sqlite.url is not None
    outside = tmp_path / "outside.txt"
    agent_threads = {}
    for n in range(12):
        thread_id = create_thread_for(store, Agent("slow-model", ScriptedModel(["unused"])))
        submit_turn(store, thread_id, f"question {n}")
        agent_threads[thread_id] = f"question {n}"
    worker = workers(sqlite.url, "stopped", "--concurrency", "20", "--lease-ttl", "1", "--exit-when-idle",
                     agent="slow_model_agent", env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_MODEL_SLEEP": "8"})
    wait_until(lambda: len(outside_lines(outside)) == 12, "every turn's model call to be in flight")
    worker.signal(signal.SIGSTOP)
    time.sleep(3)  # three lease lengths: every turn lease and work claim expires by the store's clock
    worker.signal(signal.SIGCONT)
    assert worker.wait() == 0, worker.output()
    output = worker.output()
    assert not re.search(r"finish .*: running", output), output
    assert output.count("OwnershipLost") >= 12, output
    assert not store.list_work(state="claimed") and not store.list_work(state="pending")
    answered_after_one_retry(store, {t: f"answered {q}" for t, q in agent_threads.items()}, output)


def test_a_turn_whose_lease_lapsed_during_its_model_call_is_continued_not_left_running(
        sqlite: StoreFactory, tmp_path: Path) -> None:
    """As above, with the model's answer in flight when the lease is found lost: the heartbeat cancels the turn
    in its model call, and the record of the interrupted call is refused by the fence. Its item goes back in the
    queue all the same, and the next claim retries the model call (read-only: the resolver finds it unknown and
    safe to retry) and finishes the turn."""
    store = sqlite()
    asked: set[str] = set()

    async def slow_first_answer(messages: list[JSONObject]) -> Step:
        text = str(messages[-1].get("content"))
        if text not in asked:  # the first call of each turn answers after the loop was held
            asked.add(text)
            await asyncio.sleep(3)
        return f"answered {text}"

    agent = Agent("slow-model", ScriptedModel(slow_first_answer))
    threads = []
    for n in range(5):
        threads.append(create_thread_for(store, agent))
        submit_turn(store, threads[-1], f"question {n}")
    config = WorkerConfig(store_url=str(sqlite.url), agent="tests.runs.agents:counter_agent", owner="held",
                          poll_interval=0.02, lease_ttl=0.6, concurrency=10, exit_when_idle=True)
    reports: list[tuple[str, str]] = []
    worker = Worker(agent, store, config, report=lambda kind, text: reports.append((kind, text)))

    async def main() -> None:
        async def hold_the_loop() -> None:
            while len(asked) < len(threads):
                await asyncio.sleep(0.01)
            time.sleep(1.5)  # every model call in flight; the loop held 2.5 lease lengths

        holding = asyncio.create_task(hold_the_loop())
        await asyncio.wait_for(worker.run(), WAIT)
        await holding

    asyncio.run(main())
    assert not any(kind == "finish" and ": running" in text for kind, text in reports), reports
    assert not store.list_work(state="claimed") and not store.list_work(state="pending")
    answered_after_one_retry(store, {t: f"answered question {n}" for n, t in enumerate(threads)}, reports)


def test_a_turn_cancelled_by_its_lost_lease_while_awaiting_a_commit_is_requeued_not_finished_running(
        tmp_path: Path) -> None:
    """The heartbeat finds the turn's lease taken (here by another connection, as an operator's recovery does)
    while the turn awaits the commit of its model call's dispatch marker: the turn is cancelled with nothing
    staged, so no fenced append reports the loss. The turn must still stop as ``OwnershipLost`` and its item go
    back in the queue; the lease given back, the next claim runs the turn to its end. A plain cancellation
    instead made the worker finish the item of a turn still ``running``, for nobody to continue."""
    from jixu.kernel.commits import Commits
    from jixu.ledger import SQLiteStore
    from tests.helpers import CommitHeld

    store = CommitHeld(tmp_path / "ledger.db", "model.dispatched")
    agent = Agent("answers", ScriptedModel(["the answer"]))
    thread_id = create_thread_for(store, agent)
    submit_turn(store, thread_id, "a question")
    config = WorkerConfig(store_url=str(store.url), agent="tests.runs.agents:counter_agent", owner="worker",
                          poll_interval=0.02, lease_ttl=0.6, concurrency=4, exit_when_idle=True)
    reports: list[tuple[str, str]] = []
    worker = Worker(agent, store, config, report=lambda kind, text: reports.append((kind, text)))

    def reports_of(kind: str) -> list[str]:
        return [text for reported, text in reports if reported == kind]

    async def main() -> None:
        # Another user of the loop's commits, busy elsewhere (as a second turn awaiting its model is): the turn's
        # appends are then committed in the commit thread while the turn awaits them, not at once in the loop.
        with Commits.of(store).user():
            await drive()

    async def drive() -> None:
        running = asyncio.create_task(worker.run())
        while not store.entered.is_set():
            await asyncio.sleep(0.01)
        with SQLiteStore(tmp_path / "ledger.db") as other:
            key = f"thread/{thread_id}/turn"
            lease = other.get_lease(key)
            assert lease is not None and lease.owner == "worker"
            taken = other.take_over_lease(key, "operator", 5, expected_epoch=lease.epoch, require_expired=False)
            # The heartbeat (every lease_ttl / 3) finds it out and cancels the turn, which stays at its await
            # until the commit's verdict is in (a started commit is never taken back).
            await asyncio.sleep(5 * config.lease_ttl)
            assert not running.done() and not reports_of("lost")
            other.release_lease(taken)
        store.release.set()
        await asyncio.wait_for(running, WAIT)

    asyncio.run(main())
    assert not any(": running" in text for text in reports_of("finish")), reports
    assert any("OwnershipLost" in text and "(requeued)" in text for text in reports_of("lost")), reports
    state = thread_state(store, thread_id)
    assert (state["status"], state["last_reply"]) == ("idle", "the answer"), (state, reports)
    assert store.verify(f"thread/{thread_id}").valid
    assert not store.list_work(state="claimed") and not store.list_work(state="pending")


def test_a_burst_of_queued_turns_is_claimed_sixteen_at_a_time_once_the_loop_keeps_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from jixu.scheduling.workers import CLAIMS_AT_ONCE

    monkeypatch.setenv("JIXU_TEST_OUTSIDE", str(tmp_path / "outside.txt"))

    class Counting(MemoryStore):
        """Claims that take 10 ms each call, as a durable commit does: the loop's lag is measured meanwhile."""

        def __init__(self) -> None:
            super().__init__()
            self.sizes: list[int] = []

        def claim_works(self, owner: str, ttl: float, order: object, count: int) -> list[object]:  # type: ignore[override]
            time.sleep(0.01)
            claims = super().claim_works(owner, ttl, order, count)  # type: ignore[arg-type]
            if claims:
                self.sizes.append(len(claims))
            return claims  # type: ignore[return-value]

    store = Counting()
    threads = [create_thread_for(store, counter_agent()) for _ in range(100)]
    for thread_id in threads:
        submit_turn(store, thread_id, "charge")
    config = WorkerConfig(store_url="memory://", agent="tests.runs.agents:counter_agent", owner="w-1",
                          poll_interval=0.01, lease_ttl=5, concurrency=200, exit_when_idle=True)
    worker = Worker(counter_agent(), store, config)
    asyncio.run(asyncio.wait_for(worker.run(), WAIT))
    assert worker.stats.finished == 100
    sizes = store.sizes
    assert sum(sizes) == 100 and sizes[0] == 1, f"one at a time before the loop's lag is measured: {sizes}"
    assert max(sizes) == CLAIMS_AT_ONCE and len(sizes) < 50, f"then up to {CLAIMS_AT_ONCE} per commit: {sizes}"


def test_sigterm_ends_a_worker_within_its_drain_though_a_def_tool_still_blocks_and_that_call_acts_no_more(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """A plain ``def`` tool blocks its thread past the drain timeout. The drain recorded the call as unknown and
    gave its claim back, but the process waited for the thread (a thread cannot be stopped) well past the drain,
    and the call went on to act after that record (an operator could have settled it ``not_occurred`` meanwhile).
    The worker now ends within its drain, and the call with it, as a crash would: it stays unknown."""
    store = sqlite()
    assert sqlite.url is not None
    outside, late = tmp_path / "outside.txt", tmp_path / "late.txt"
    thread_id = create_thread_for(store, blocking_agent())
    submit_turn(store, thread_id, "block 1")
    worker = workers(sqlite.url, "cut", "--drain-timeout", "1", "--lease-ttl", "9", agent="blocking_agent",
                     env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_BLOCK_SLEEP": "4",
                          "JIXU_TEST_BLOCK_LATE": str(late)})
    wait_until(lambda: len(outside_lines(outside)) == 1, "the blocking call")
    called_at = time.monotonic()
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    took = time.monotonic() - called_at
    assert took < 3.5, f"exited {took:.2f}s after SIGTERM; the drain timeout is 1s and the tool blocks 4s"
    assert "cut off by ending the process" in worker.output()
    time.sleep(max(0.0, called_at + 5.0 - time.monotonic()))  # past the moment the tool would have gone on
    assert not late.exists(), "the cut-off call acted after its worker stopped"
    state = thread_state(store, thread_id)
    assert state["status"] == "waiting", state
    lease = store.get_lease(f"thread/{thread_id}/turn")
    assert lease is not None and lease.released


COLLECTOR_AFTER_SERVE = """
import asyncio, gc, json, sys
from jixu.scheduling.workers import SERVING_GC_THRESHOLD, WorkerConfig, serve
if sys.argv[1] == "off":
    gc.disable()
elif sys.argv[1] == "high":
    gc.set_threshold(50_000, 10, 10)
seen = {}
def ready(worker):
    seen.update(threshold=gc.get_threshold(), frozen=gc.get_freeze_count(), enabled=gc.isenabled())
config = WorkerConfig(store_url="memory://", agent="tests.runs.agents:counter_agent", owner="gc",
                      poll_interval=0.01, exit_when_idle=True, quiet=True)
asyncio.run(serve(config, on_ready=ready))
print(json.dumps({**seen, "serving": SERVING_GC_THRESHOLD}))
"""


@pytest.mark.parametrize("before", ["default", "off", "high"])
def test_a_worker_process_collects_cycles_rarely_and_leaves_start_up_objects_out(before: str) -> None:
    """A serving worker process freezes what start-up made and collects its youngest generation every 10,000
    allocations (CPython's 700 made collections ~9 % of a worker's CPU in bench/fleet.py, with full ones of
    ~40 ms on the event loop); a collector switched off or set higher before stays as it was."""
    from tests.helpers import spawn_python

    process = spawn_python(COLLECTOR_AFTER_SERVE, before)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    seen = json.loads(out.strip().splitlines()[-1])
    assert seen["frozen"] > 1000, seen
    expected = {"default": seen["serving"], "off": 700, "high": 50_000}[before]
    assert (seen["threshold"][0], seen["enabled"]) == (expected, before != "off"), seen


def test_a_store_stalled_past_the_lease_leaves_no_call_in_doubt_when_nobody_else_took_the_turns(
        sqlite: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    """Seen by an audit: another connection held SQLite's write lock for longer than the lease while a worker's
    unsafe calls ran; every call finished, but its receipt could not be recorded (the claim had lapsed), the same
    worker claimed each turn again and found the call in doubt: an operator's case per turn, the result it held
    thrown away. Claimed again at the very next epoch by the same worker, the turn now records what the lost claim
    observed."""
    import sqlite3

    store = sqlite()
    assert sqlite.url is not None
    outside = tmp_path / "outside.txt"
    agent = counter_agent()
    threads = [create_thread_for(store, agent) for _ in range(4)]
    for thread_id in threads:
        submit_turn(store, thread_id, "charge the order")
    worker = workers(sqlite.url, "stalled", "--concurrency", "10", "--lease-ttl", "1.5",
                     env={"JIXU_TEST_OUTSIDE": str(outside), "JIXU_TEST_TOOL_SLEEP": "1.0"})
    wait_until(lambda: len(outside_lines(outside)) == 4, "the four calls")
    locker = sqlite3.connect(tmp_path / "ledger.db", timeout=30, isolation_level=None)
    locker.execute("BEGIN EXCLUSIVE")  # every write of the worker waits: its claims lapse meanwhile
    time.sleep(3.5)
    locker.execute("COMMIT")
    locker.close()
    def settled() -> bool:  # every turn ended and nothing left in the queue (a requeued turn is claimed again)
        return not store.list_work(state="pending") and not store.list_work(state="claimed") and all(
            thread_state(store, t)["status"] != "running" for t in threads)

    wait_until(settled, "the turns to end")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    assert len(outside_lines(outside)) == 4, "each call ran once"
    states = {t: thread_state(store, t)["status"] for t in threads}
    assert set(states.values()) == {"idle"}, (states, worker.output()[-3000:])


def test_a_worker_told_to_stop_while_it_starts_exits_0_and_says_so(sqlite: StoreFactory, workers: Spawn,
                                                                   tmp_path: Path) -> None:
    """Seen by an audit: `jixu worker` SIGTERMed while it loaded its agent died of the signal (exit 143, nothing
    printed), though its help promises exit 0 for SIGTERM. The signal is kept until the worker runs, which then
    stops at once."""
    sqlite()
    assert sqlite.url is not None
    starting = tmp_path / "starting.txt"
    worker = workers(sqlite.url, "early", agent="slow_start_agent",
                     env={"JIXU_TEST_STARTING": str(starting), "JIXU_TEST_START_SLEEP": "1.5"})
    wait_until(starting.exists, "the agent to start loading")
    worker.signal(signal.SIGTERM)
    assert worker.wait() == 0, worker.output()
    assert "SIGTERM received while starting" in worker.output()


def test_a_librarys_warning_in_a_worker_is_one_of_its_lines(sqlite: StoreFactory, workers: Spawn,
                                                             tmp_path: Path) -> None:
    """Seen by an audit: psycopg_pool's "discarding closed connection" warnings went to Python's last-resort
    handler, bare, among the worker's timed and named lines. They are the worker's lines now."""
    from tests.runs.agents import noisy_agent

    store = sqlite()
    assert sqlite.url is not None
    submit_turn(store, create_thread_for(store, noisy_agent()), "charge it")
    worker = workers(sqlite.url, "noisy", "--exit-when-idle", agent="noisy_agent",
                     env={"JIXU_TEST_OUTSIDE": str(tmp_path / "outside.txt")})
    assert worker.wait() == 0, worker.output()
    [line] = [line for line in worker.output().splitlines() if "discarding closed connection" in line]
    assert re.match(r"^\d\d:\d\d:\d\d noisy psycopg\.pool: discarding closed connection", line), line
