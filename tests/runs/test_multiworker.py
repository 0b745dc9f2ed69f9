"""Many worker processes over one ledger: every turn runs exactly once, within the limits, fairly.

The workers are a real ``jixu worker --processes N`` pool; the test process
queues the threads, samples the live claims every few milliseconds through its
own connection, and counts the tool calls in an outside file.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

from jixu.ledger import Store
from jixu.scheduling import create_thread_for, submit_turn
from tests.conftest import StoreFactory
from tests.runs.agents import counter_agent
from tests.runs.conftest import WAIT, Spawn, outside_lines, wait_until

LIMITS = {"big": 2, "mid": 1, "small": 1}
GLOBAL = 3


class Sampler(threading.Thread):
    """Reads the live claims every few ms; keeps the peak in total and per project."""

    def __init__(self, store: Store) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.peak: Counter[str] = Counter()
        self.samples = 0
        self.done = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.done.is_set():
                live = Counter(item.group for item in self.store.list_work(state="claimed"))
                live["*"] = sum(live.values())
                for key, value in live.items():
                    self.peak[key] = max(self.peak[key], value)
                self.samples += 1
                time.sleep(0.003)
        except BaseException as error:  # pragma: no cover - reported by the test
            self.error = error


def queue_threads(store: Store, sizes: dict[str, int]) -> dict[str, str]:
    """Create and queue one turn per thread, project by project (big backlog first); thread id -> project."""
    agent = counter_agent()
    projects: dict[str, str] = {}
    for project, count in sizes.items():
        for _ in range(count):
            thread_id = create_thread_for(store, agent, project=project)
            submit_turn(store, thread_id, "charge the order")
            projects[thread_id] = project
    return projects


def run_pool(factory: StoreFactory, workers: Spawn, tmp_path: Path, sizes: dict[str, int], processes: int) -> None:
    store = factory()
    outside = tmp_path / "outside.txt"
    projects = queue_threads(store, sizes)
    total = sum(sizes.values())
    assert len(store.list_work(state="pending")) == total
    sampler = Sampler(factory())
    sampler.start()
    assert factory.url is not None
    limits = [arg for project, n in LIMITS.items() for arg in ("--project-limit", f"{project}={n}")]
    pool = workers(factory.url, "pool", "--processes", str(processes), "--global-limit", str(GLOBAL), *limits,
                   "--lease-ttl", "10", "--drain-timeout", "5", env={"JIXU_TEST_OUTSIDE": str(outside)})
    try:
        wait_until(lambda: len(store.list_work(state="done")) == total, f"all {total} threads done", timeout=WAIT * 2,
                   interval=0.05)
    finally:
        sampler.done.set()
        sampler.join(WAIT)
    started = time.monotonic()
    pool.signal(signal.SIGTERM)
    assert pool.wait() == 0, pool.output()
    assert time.monotonic() - started < 5 + 5, "the pool stops within the drain timeout (+ grace)"
    assert sampler.error is None and sampler.samples > 20

    # Exactly once: one outside call and one completed turn per thread, every chain intact.
    lines = outside_lines(outside)
    calls = Counter(line[0] for line in lines)
    assert set(calls) == set(projects) and set(calls.values()) == {1}, calls.most_common(3)
    for thread_id in projects:
        events = store.read(f"thread/{thread_id}")
        ended = [e for e in events if e.type == "turn.ended"]
        assert [e.data["outcome"] for e in ended] == ["completed"], thread_id
        assert len([e for e in events if e.type == "tool.dispatched"]) == 1
        assert store.verify(f"thread/{thread_id}").valid
    # The limits were never exceeded (as sampled), and the workers did run in parallel.
    peak = sampler.peak
    assert peak["*"] <= GLOBAL and all(peak[p] <= n for p, n in LIMITS.items()), peak
    assert peak["*"] >= 2, f"expected parallel claims: {peak}"
    # Not starved, in the store's own order of claims (each claim carries its number; the processes' log lines
    # interleave in any order). Every project is served once before any is served twice: fewest live claims
    # first, then the one served longest ago, then the oldest item, so the first round is exactly the projects
    # in the order they were enqueued, whatever finished in between (FIFO over the backlog, enqueued big first,
    # would put the others after every big item).
    found = re.findall(r" claimed thread/\S+ \(project (\w+), epoch \d+, claim #(\d+)\)", pool.output())
    claims = [project for _, project in sorted((int(number), project) for project, number in found)]
    assert sorted(int(number) for _, number in found) == list(range(1, total + 1)), "one number per claim"
    assert claims[:len(sizes)] == list(sizes), claims[:20]
    output = pool.output()
    assert output.count("claimed thread/") == total and "stopped (SIGTERM received)" in output


def test_four_workers_run_200_threads_of_3_projects_once_each_within_the_limits_on_postgres(
        postgres: StoreFactory, workers: Spawn, tmp_path: Path) -> None:
    run_pool(postgres, workers, tmp_path, {"big": 180, "mid": 15, "small": 5}, processes=4)


def test_three_workers_share_a_sqlite_ledger_the_same_way(sqlite: StoreFactory, workers: Spawn,
                                                           tmp_path: Path) -> None:
    run_pool(sqlite, workers, tmp_path, {"big": 30, "mid": 6, "small": 4}, processes=3)
