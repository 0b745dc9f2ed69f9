"""The work queue's policy, run against every backend: projects' limits and the fairness between them.

The ledger claims atomically in the order a claimer gives it (``tests/ledger/test_queue_contract.py``);
:func:`jixu.scheduling.queue.claim` gives it the order of the projects' limits and fairness. These tests hold
that order to its promises, in one process and across several sharing a store.
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import InvalidInput
from jixu.ledger import Store
from jixu.ledger.store import QueueCensus, WorkClaim
from jixu.scheduling.queue import WorkLimits, check_limits, claim_order
from jixu.scheduling.queue import claim as claim_with_limits
from tests.conftest import StoreFactory
from tests.helpers import spawn_python

TIMEOUT = 60.0
LIMITS: dict[str, Any] = {"global_limit": 3, "project_limits": {"a": 2}, "default_project_limit": 1}


def claim(store: Store, owner: str = "w1", ttl: float = 30.0, **limits: Any) -> WorkClaim | None:
    options = {"global_limit": 100, **limits}
    return claim_with_limits(store, owner, ttl, **options)


@pytest.fixture(params=["sqlite", "postgres"])
def shared_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Stores other processes can open too (a SQLite file, a PostgreSQL schema)."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    factory = StoreFactory(request.param, tmp_path, dsn)
    yield factory
    factory.close()


# --- the order (pure) -----------------------------------------------------------------------------------


def test_the_order_ranks_projects_under_their_limits_by_live_claims_then_service_then_age() -> None:
    limits = check_limits(10, {"held": 0, "full": 1}, None)
    census = QueueCensus(live={"full": 1, "busy": 2, "idle": 0}, last_claimed={"busy": 5, "idle": 7, "full": 6},
                         oldest={"busy": (1.0, 1), "idle": (9.0, 9), "fresh": (5.0, 4), "held": (0.0, 0),
                                 "full": (0.5, 2), "twin": (5.0, 4)})
    assert limits.order(census) == ["fresh", "twin", "idle", "busy"]
    # fresh and twin: no live claim, never served, same oldest item: by name; idle: no live claim but served;
    # busy: 2 live claims; held (limit 0) and full (at its limit) are not eligible.
    assert check_limits(3, None, None).order(census) == [], "3 live claims reach the global limit"
    assert claim_order(census.live, census.oldest, census.last_claimed, limits) == limits.order(census)


def test_bad_limits_raise_a_typed_error_and_claim_nothing(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    bad_claims: list[dict[str, Any]] = [
        {"global_limit": 0}, {"global_limit": True}, {"global_limit": "3"},
        {"global_limit": 2, "project_limits": {"alpha": -1}}, {"global_limit": 2, "project_limits": [("a", 1)]},
        {"global_limit": 2, "project_limits": {"": 1}}, {"global_limit": 2, "default_project_limit": -1},
    ]
    for options in bad_claims:
        with pytest.raises(InvalidInput):
            claim_with_limits(store, "w1", 5, **options)
    item = store.get_work("thread/1")
    assert item is not None and (item.state, item.epoch) == ("pending", 0)
    assert isinstance(check_limits(2, {"alpha": 1}, 0), WorkLimits)


# --- limits and fairness, on every backend --------------------------------------------------------------


def test_limits_bound_live_claims_globally_and_per_project(store: Store) -> None:
    for project in ("a", "b", "c"):
        for n in range(3):
            store.enqueue(f"{project}/{n}", project)
    taken = [claim(store, f"w{n}", **LIMITS) for n in range(4)]
    held = [c for c in taken if c is not None]
    assert len(held) == 3 and taken[3] is None, "the global limit is 3"
    per_project = Counter(c.group for c in held)
    assert per_project["a"] <= 2 and per_project["b"] <= 1 and per_project["c"] <= 1
    # Finishing one frees one slot, for the project with the fewest live claims.
    store.finish_work(held[0])
    assert claim(store, "w9", **LIMITS) is not None
    assert claim(store, "w9", **LIMITS) is None


def test_claims_taken_together_hold_the_limits_and_the_fairness_of_claims_taken_one_by_one(store: Store) -> None:
    from jixu.scheduling.queue import claim_some

    for n in range(3):
        store.enqueue(f"a/{n}", "a")
    store.enqueue("b/0", "b")
    store.enqueue("c/0", "c")
    # As one by one (test_fair_selection_...): oldest first, then the projects with fewer live claims; a's
    # limit of 2 and the global limit of 4 counted again for each claim of the batch.
    batch = claim_some(store, "w1", 30.0, 10, global_limit=4, default_project_limit=2)
    assert [c.key for c in batch] == ["a/0", "b/0", "c/0", "a/1"]
    assert [c.number for c in batch] == [1, 2, 3, 4], "numbered in order within the one transaction"
    assert claim_some(store, "w2", 30.0, 10, global_limit=4) == [], "the global limit is reached"
    with pytest.raises(InvalidInput):
        claim_some(store, "w2", 30.0, 0, global_limit=10)
    with pytest.raises(InvalidInput):
        store.claim_works("w2", 30.0, lambda census: ["a"], True)  # type: ignore[arg-type]
    assert {i.key: i.state for i in store.list_work()}["a/2"] == "pending", "a refused batch claims nothing"


def test_a_project_limit_of_zero_holds_that_project_back(store: Store) -> None:
    store.enqueue("a/1", "a")
    store.enqueue("b/1", "b")
    first = claim(store, project_limits={"a": 0})
    assert first is not None and first.group == "b"
    assert claim(store, project_limits={"a": 0}) is None
    assert claim(store) is not None


def test_fair_selection_prefers_the_project_with_fewest_live_claims_then_the_oldest_item(store: Store) -> None:
    for n in range(3):
        store.enqueue(f"a/{n}", "a")
    store.enqueue("b/0", "b")
    store.enqueue("c/0", "c")
    # No project limit: a has the oldest item, then b and c each have fewer live claims than a.
    order = [c.key for c in (claim(store, f"w{n}") for n in range(5)) if c is not None]
    assert order == ["a/0", "b/0", "c/0", "a/1", "a/2"]


def test_a_small_project_is_served_before_a_large_backlog_drains(store: Store) -> None:
    """A has 50 items, B 2 (enqueued later); global 2, per project 1: B's items go early, not last."""
    for n in range(50):
        store.enqueue(f"a/{n:02d}", "a")
    for n in range(2):
        store.enqueue(f"b/{n}", "b")
    limits = {"global_limit": 2, "default_project_limit": 1}
    order: list[str] = []
    held: list[WorkClaim] = []
    while len(order) < 52:
        got = claim(store, f"w{len(order)}", **limits)
        if got is None:
            store.finish_work(held.pop(0))  # the longest-running claim finishes
            continue
        held.append(got)
        order.append(got.key)
    assert set(order) == {f"a/{n:02d}" for n in range(50)} | {"b/0", "b/1"}
    assert order.index("b/0") <= 2 and order.index("b/1") <= 4, order[:8]


def test_a_single_claimer_takes_turns_between_projects(store: Store) -> None:
    """With one slot, projects with equal live claims are served round-robin, not oldest-backlog-first."""
    for n in range(5):
        store.enqueue(f"a/{n}", "a")
    for n in range(2):
        store.enqueue(f"b/{n}", "b")
    order = []
    while (got := claim(store, global_limit=1)) is not None:
        order.append(got.key)
        store.finish_work(got)
    assert order == ["a/0", "b/0", "a/1", "b/1", "a/2", "a/3", "a/4"]


# --- concurrency ----------------------------------------------------------------------------------------


def _fill(store: Store) -> list[str]:
    keys = []
    for project, count in (("a", 24), ("b", 8), ("c", 8)):
        for n in range(count):
            keys.append(f"{project}/{n}")
            store.enqueue(keys[-1], project)
    return keys


def test_limits_are_never_exceeded_by_concurrent_claimers(store_factory: StoreFactory) -> None:
    store = store_factory()
    keys = _fill(store)
    lock = threading.Lock()
    held: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    claimed: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        mine = store_factory()  # a connection of its own (the same one for the memory store)
        rng = random.Random(n)
        deadline = time.monotonic() + TIMEOUT
        try:
            while time.monotonic() < deadline:
                got = claim(mine, f"w{n}", 30, **LIMITS)
                if got is None:
                    if len(mine.list_work(state="done")) == len(keys):
                        return
                    time.sleep(0.001)
                    continue
                with lock:
                    claimed.append((got.key, got.epoch))
                    held[got.group] += 1
                    held["*"] += 1
                    for name in (got.group, "*"):
                        peak[name] = max(peak[name], held[name])
                time.sleep(0.005 + rng.random() * 0.010)  # long enough for claims to overlap on a slow machine
                with lock:
                    held[got.group] -= 1
                    held["*"] -= 1
                mine.finish_work(got)
        except BaseException as error:  # pragma: no cover - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(TIMEOUT)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    assert sorted(k for k, _ in claimed) == sorted(keys), "every item claimed exactly once"
    assert {epoch for _, epoch in claimed} == {1}
    assert peak["*"] <= 3 and peak["a"] <= 2 and peak["b"] <= 1 and peak["c"] <= 1, peak
    assert peak["*"] >= 2, f"the test should have seen claims overlap: {peak}"


CLAIM_CHILD = r"""
import json, random, sys, time
from jixu.ledger import open_store
from jixu.scheduling.queue import claim
url, name, n_keys, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
limits = json.loads(sys.argv[5])
store = open_store(url)
print("ready", flush=True)
import os
while not os.path.exists(go):
    time.sleep(0.0005)
rng = random.Random(name)
spans = []
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    got = claim(store, name, 30, **limits)
    if got is None:
        if len(store.list_work(state="done")) == n_keys:
            break
        time.sleep(0.001)
        continue
    start = time.monotonic()
    time.sleep(rng.random() * 0.004)
    spans.append([got.key, got.group, got.epoch, start, time.monotonic()])
    store.finish_work(got)
store.close()
print(json.dumps(spans), flush=True)
"""


def test_limits_are_never_exceeded_by_claimers_in_several_processes(shared_factory: StoreFactory,
                                                                     tmp_path: Path) -> None:
    """Three OS processes claim from one queue; the time each held a claim never overlaps beyond the limits.

    Each child records (monotonic, system-wide on Linux) when it held a claim:
    strictly inside the store's own claim, so overlaps seen here are a lower
    bound of the live claims the store allowed.
    """
    store = shared_factory()
    keys = _fill(store)
    go = tmp_path / "go"
    assert shared_factory.url is not None
    children = [spawn_python(CLAIM_CHILD, shared_factory.url, f"p{n}", str(len(keys)), str(go), json.dumps(LIMITS))
                for n in range(3)]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr.read() if child.stderr else ""
        go.touch()
        outputs = [child.communicate(timeout=TIMEOUT) for child in children]
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
    assert all(child.returncode == 0 for child in children), [o[1] for o in outputs]
    spans = [span for out, _ in outputs for span in json.loads(out.strip().splitlines()[-1])]
    assert sorted(s[0] for s in spans) == sorted(keys) and {s[2] for s in spans} == {1}
    points = sorted([(s[3], 1, s[1]) for s in spans] + [(s[4], -1, s[1]) for s in spans],
                    key=lambda p: (p[0], p[1]))
    held: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    for _, delta, project in points:
        held[project] += delta
        held["*"] += delta
        peak[project] = max(peak[project], held[project])
        peak["*"] = max(peak["*"], held["*"])
    assert peak["*"] <= 3 and peak["a"] <= 2 and peak["b"] <= 1 and peak["c"] <= 1, peak
    assert len({s[0] for s in spans}) == len(keys)
