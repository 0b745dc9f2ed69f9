"""The work-queue part of the Store contract, written once and run against every backend.

Work items are durable rows (not events): ``enqueue`` is idempotent per key,
``claim_work`` picks one ready item fairly across projects within the global
and per-project limits, claims are fenced by owner and epoch, and every expiry
is judged by the store's clock.
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

from jixu.errors import ConcurrencyError, FencingError, InvalidId, InvalidInput
from jixu.ledger import NewEvent, Store
from jixu.ledger.postgres import SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION
from jixu.ledger.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from jixu.ledger.store import WorkClaim
from tests.conftest import StoreFactory
from tests.helpers import spawn_python

TIMEOUT = 60.0
LIMITS: dict[str, Any] = {"global_limit": 3, "project_limits": {"a": 2}, "default_project_limit": 1}


def expire(store: Store, seconds: float) -> None:
    """Let ``seconds`` of store time pass."""
    advance = getattr(store, "advance_clock", None)
    if advance is not None:
        advance(seconds)
    else:
        time.sleep(seconds)


def claim(store: Store, owner: str = "w1", ttl: float = 30.0, **limits: Any) -> WorkClaim | None:
    options = {"global_limit": 100, **limits}
    return store.claim_work(owner, ttl, **options)


def states(store: Store) -> dict[str, str]:
    return {item.key: item.state for item in store.list_work()}


@pytest.fixture(params=["sqlite", "postgres"])
def shared_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    """Stores other processes can open too (a SQLite file, a PostgreSQL schema)."""
    dsn = request.getfixturevalue("postgres_dsn") if request.param == "postgres" else None
    factory = StoreFactory(request.param, tmp_path, dsn)
    yield factory
    factory.close()


# --- enqueue --------------------------------------------------------------------------------------------


def test_enqueue_is_idempotent_per_key(store: Store) -> None:
    first = store.enqueue("thread/1", "alpha")
    assert (first.state, first.project, first.epoch, first.claimed_by, first.rerun) == (
        "pending", "alpha", 0, None, False)
    assert abs(first.ready_at - store.now()) < 5 and first.enqueued_at == first.ready_at
    again = store.enqueue("thread/1", "alpha")
    assert again == first, "re-enqueueing a pending item changes nothing"
    assert [item.key for item in store.list_work()] == ["thread/1"]


def test_append_and_enqueue_is_one_transaction_both_or_neither(store: Store) -> None:
    """A queued turn's event and its queue row commit together: a refused append enqueues nothing."""
    with pytest.raises(ConcurrencyError):
        store.append_and_enqueue("thread/a", [NewEvent("turn.started", {"n": 1})], 3, key="thread/a", project="p")
    assert store.get_work("thread/a") is None and store.stream_info("thread/a") is None
    [event] = store.append_and_enqueue("thread/a", [NewEvent("turn.started", {"n": 1})], 0, key="thread/a",
                                       project="p")
    item = store.get_work("thread/a")
    assert item is not None and (item.state, item.project) == ("pending", "p") and event.seq == 1
    with pytest.raises(InvalidInput):  # a key belongs to one project: the event is not written either
        store.append_and_enqueue("thread/a", [NewEvent("turn.started", {"n": 2})], 1, key="thread/a", project="q")
    assert store.stream_info("thread/a").head_seq == 1  # type: ignore[union-attr]
    again = store.append_and_enqueue("thread/a", [NewEvent("turn.started", {"n": 1}, id=event.id)], 0,
                                     key="thread/a", project="p")
    assert [e.id for e in again] == [event.id], "a repeat is a no-op"
    assert [w.key for w in store.list_work()] == ["thread/a"]


def test_a_done_item_becomes_pending_again_and_keeps_its_epoch(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    held = claim(store)
    assert held is not None and held.epoch == 1
    done = store.finish_work(held)
    assert (done.state, done.epoch, done.claimed_by) == ("done", 1, None)
    assert claim(store) is None, "a done item is not claimed"
    again = store.enqueue("thread/1", "alpha")
    assert (again.state, again.epoch) == ("pending", 1)
    second = claim(store, "w2")
    assert second is not None and (second.owner, second.epoch) == ("w2", 2)


def test_enqueue_while_claimed_runs_the_item_again_after_the_claim(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    held = claim(store)
    assert held is not None
    marked = store.enqueue("thread/1", "alpha")
    assert (marked.state, marked.rerun, marked.claimed_by) == ("claimed", True, "w1")
    assert store.enqueue("thread/1", "alpha") == marked
    after = store.finish_work(held)
    assert (after.state, after.rerun) == ("pending", False), "the wake-up during the claim is not lost"
    again = claim(store)
    assert again is not None and again.epoch == 2
    assert store.finish_work(again).state == "done"


def test_an_item_is_not_claimed_before_its_ready_time_on_the_store_clock(store: Store) -> None:
    store.enqueue("thread/later", "alpha", ready_at=store.now() + 1.0)
    store.enqueue("thread/now", "alpha")
    first = claim(store)
    assert first is not None and first.key == "thread/now"
    assert claim(store) is None
    expire(store, 1.1)
    later = claim(store)
    assert later is not None and later.key == "thread/later"


def test_a_key_belongs_to_one_project(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    with pytest.raises(InvalidInput, match="belongs to project 'alpha'"):
        store.enqueue("thread/1", "beta")
    assert [(i.key, i.project) for i in store.list_work()] == [("thread/1", "alpha")]


# --- claims ---------------------------------------------------------------------------------------------


def test_a_claim_takes_the_oldest_ready_item_and_sets_owner_epoch_and_expiry_by_the_store_clock(
        store: Store) -> None:
    assert claim(store) is None, "an empty queue yields nothing"
    for n in range(3):
        store.enqueue(f"job/{n}", "alpha")
    before = store.now()
    held = store.claim_work("w1", 5.0, global_limit=10)
    after = store.now()
    assert held is not None
    assert (held.key, held.project, held.owner, held.epoch) == ("job/0", "alpha", "w1", 1)
    assert before + 5.0 <= held.expires_at <= after + 5.0
    item = store.get_work("job/0")
    assert item is not None and item.state == "claimed" and item.claimed_by == "w1"
    assert item.heartbeat_at is not None and before <= item.heartbeat_at <= after
    assert [c.key for c in (claim(store), claim(store)) if c] == ["job/1", "job/2"]
    assert claim(store) is None
    assert store.get_work("job/9") is None


def test_limits_bound_live_claims_globally_and_per_project(store: Store) -> None:
    for project in ("a", "b", "c"):
        for n in range(3):
            store.enqueue(f"{project}/{n}", project)
    taken = [claim(store, f"w{n}", **LIMITS) for n in range(4)]
    held = [c for c in taken if c is not None]
    assert len(held) == 3 and taken[3] is None, "the global limit is 3"
    per_project = Counter(c.project for c in held)
    assert per_project["a"] <= 2 and per_project["b"] <= 1 and per_project["c"] <= 1
    # Finishing one frees one slot, for the project with the fewest live claims.
    store.finish_work(held[0])
    assert claim(store, "w9", **LIMITS) is not None
    assert claim(store, "w9", **LIMITS) is None


def test_a_project_limit_of_zero_holds_that_project_back(store: Store) -> None:
    store.enqueue("a/1", "a")
    store.enqueue("b/1", "b")
    first = claim(store, project_limits={"a": 0})
    assert first is not None and first.project == "b"
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


def test_an_expired_claim_is_claimable_again_and_the_stale_holder_is_fenced_out(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    old = store.claim_work("w1", 1.0, global_limit=1)
    assert old is not None
    assert store.claim_work("w2", 5, global_limit=1) is None, "live: the global limit counts it"
    expire(store, 1.1)
    item = store.get_work("thread/1")
    assert item is not None and item.state == "expired"
    assert [i.key for i in store.list_work(state="expired")] == ["thread/1"]
    assert store.list_work(state="claimed") == []
    with pytest.raises(FencingError, match="expired"):
        store.renew_work(old, 5)
    new = store.claim_work("w2", 5, global_limit=1)
    assert new is not None and (new.key, new.owner, new.epoch) == ("thread/1", "w2", 2)
    with pytest.raises(FencingError, match="stale"):
        store.finish_work(old)
    with pytest.raises(FencingError, match="stale"):
        store.renew_work(old, 5)
    renewed = store.renew_work(new, 10)
    assert renewed.epoch == 2 and renewed.expires_at > new.expires_at
    assert store.finish_work(renewed).state == "done"
    with pytest.raises(FencingError, match="stale"):
        store.finish_work(renewed)


def test_an_expired_claim_nobody_took_may_still_finish(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    held = store.claim_work("w1", 0.2, global_limit=1)
    assert held is not None
    expire(store, 0.3)
    assert store.finish_work(held).state == "done"


def test_renewal_extends_the_claim_on_the_store_clock(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    held = store.claim_work("w1", 1.0, global_limit=1)
    assert held is not None
    for _ in range(2):
        expire(store, 0.3)
        held = store.renew_work(held, 1.0)
    item = store.get_work("thread/1")
    assert item is not None and item.state == "claimed" and item.expires_at == held.expires_at
    assert item.heartbeat_at is not None and abs(item.heartbeat_at + 1.0 - held.expires_at) < 1e-6


def test_requeue_keeps_the_items_place_or_delays_it(store: Store) -> None:
    store.enqueue("job/0", "alpha")
    store.enqueue("job/1", "alpha")
    first = claim(store)
    assert first is not None and first.key == "job/0"
    back = store.finish_work(first, requeue=True)
    assert back.state == "pending" and back.epoch == 1
    again = claim(store)
    assert again is not None and again.key == "job/0" and again.epoch == 2, "a requeued item keeps its place"
    store.finish_work(again, requeue=True, delay=1.0)
    nxt = claim(store)
    assert nxt is not None and nxt.key == "job/1"
    assert claim(store) is None
    expire(store, 1.1)
    later = claim(store)
    assert later is not None and later.key == "job/0" and later.epoch == 3


def test_list_work_filters_by_project_and_state(store: Store) -> None:
    store.enqueue("a/1", "a")
    store.enqueue("a/2", "a")
    store.enqueue("b/1", "b")
    held = claim(store)
    assert held is not None and held.key == "a/1"
    other = claim(store)
    assert other is not None
    store.finish_work(other)
    assert [i.key for i in store.list_work()] == ["a/1", "a/2", "b/1"]
    assert [i.key for i in store.list_work(project="a")] == ["a/1", "a/2"]
    assert states(store) == {"a/1": "claimed", other.key: "done",
                             ({"a/2", "b/1"} - {other.key}).pop(): "pending"}
    assert [i.key for i in store.list_work(state="claimed")] == ["a/1"]
    assert [i.key for i in store.list_work(project="b", state="claimed")] == []
    assert json.loads(json.dumps([i.to_dict() for i in store.list_work()]))[0]["key"] == "a/1"


# --- bad input ------------------------------------------------------------------------------------------


def test_bad_input_raises_a_typed_error_and_writes_nothing(store: Store) -> None:
    with pytest.raises(InvalidInput):
        store.enqueue("", "alpha")
    with pytest.raises(InvalidInput):
        store.enqueue("thread/1", "")
    with pytest.raises(InvalidInput):
        store.enqueue("thread/1", "x" * 101)
    with pytest.raises(InvalidInput):
        store.enqueue("thread/1", "alpha", ready_at=float("nan"))
    with pytest.raises(InvalidInput):
        store.enqueue("thread/1", "alpha", ready_at="soon")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.enqueue(7, "alpha")  # type: ignore[arg-type]
    assert store.list_work() == []
    store.enqueue("thread/1", "alpha")
    bad_claims: list[dict[str, Any]] = [
        {"global_limit": 0}, {"global_limit": True}, {"global_limit": "3"},
        {"global_limit": 2, "project_limits": {"alpha": -1}}, {"global_limit": 2, "project_limits": [("a", 1)]},
        {"global_limit": 2, "project_limits": {"": 1}}, {"global_limit": 2, "default_project_limit": -1},
    ]
    for options in bad_claims:
        with pytest.raises(InvalidInput):
            store.claim_work("w1", 5, **options)
    for owner, ttl in (("", 5), ("w1", 0), ("w1", -1), ("w1", float("inf")), ("w\n1", 5)):
        with pytest.raises(InvalidInput):
            store.claim_work(owner, ttl, global_limit=2)
    with pytest.raises(InvalidInput):
        store.finish_work("thread/1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.finish_work(WorkClaim("thread/1", "alpha", "w1", 0, 0.0))
    with pytest.raises(InvalidInput):
        store.renew_work(WorkClaim("thread/1", "alpha", "w1", 1, 0.0), 0)
    with pytest.raises(InvalidInput):
        store.list_work(state="running")
    with pytest.raises(InvalidInput):
        store.list_work(project="")
    with pytest.raises(InvalidInput):
        store.get_work("")
    [item] = store.list_work()
    assert (item.state, item.epoch, item.rerun) == ("pending", 0, False)
    held = claim(store)
    assert held is not None
    with pytest.raises(InvalidInput):
        store.finish_work(held, requeue="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.finish_work(held, delay=-1)
    forged = WorkClaim(held.key, held.project, "someone-else", held.epoch, held.expires_at)
    with pytest.raises(FencingError):
        store.finish_work(forged)
    with pytest.raises(FencingError, match="no work item"):
        store.finish_work(WorkClaim("thread/none", "alpha", "w1", 1, 0.0))
    assert store.get_work("thread/1") == store.list_work(state="claimed")[0]


def test_the_work_queue_is_separate_from_events_and_leases(store: Store) -> None:
    store.append("thread/1", [NewEvent("note.added", {"n": 1})], 0)
    store.enqueue("thread/1", "alpha")
    held = claim(store)
    assert held is not None
    assert store.get_lease("thread/1") is None
    assert len(store.read("thread/1")) == 1 and store.verify("thread/1").valid
    with pytest.raises(InvalidId):
        store.read("")


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
                got = mine.claim_work(f"w{n}", 30, **LIMITS)
                if got is None:
                    if len(mine.list_work(state="done")) == len(keys):
                        return
                    time.sleep(0.001)
                    continue
                with lock:
                    claimed.append((got.key, got.epoch))
                    held[got.project] += 1
                    held["*"] += 1
                    for name in (got.project, "*"):
                        peak[name] = max(peak[name], held[name])
                time.sleep(0.005 + rng.random() * 0.010)  # long enough for claims to overlap on a slow machine
                with lock:
                    held[got.project] -= 1
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
    got = store.claim_work(name, 30, **limits)
    if got is None:
        if len(store.list_work(state="done")) == n_keys:
            break
        time.sleep(0.001)
        continue
    start = time.monotonic()
    time.sleep(rng.random() * 0.004)
    spans.append([got.key, got.project, got.epoch, start, time.monotonic()])
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


def test_a_store_at_schema_1_gains_the_work_queue_on_open(shared_factory: StoreFactory) -> None:
    """Migration 2 adds the queue to a ledger written before it existed; its events stay as they were."""
    store = shared_factory()
    [event] = store.append("thread/1", [NewEvent("note.added", {"n": 1})], 0)
    store.close()
    if shared_factory.kind == "sqlite":
        import sqlite3

        raw = sqlite3.connect(shared_factory.tmp_path / "ledger.db")
        raw.execute("DROP TABLE jixu_work")
        raw.execute("DROP TABLE jixu_work_projects")
        raw.execute("DELETE FROM jixu_schema WHERE version >= 2")
        raw.commit()
        raw.close()
    else:
        import psycopg

        assert shared_factory.url is not None
        with psycopg.connect(shared_factory.url, autocommit=True) as conn:
            conn.execute("DROP TABLE jixu_work")
            conn.execute("DROP TABLE jixu_work_projects")
            conn.execute("DROP FUNCTION jixu_append")  # migrations 3 and 4, which a schema-1 store lacks as well
            conn.execute("DROP FUNCTION jixu_append_v4")
            conn.execute("DELETE FROM jixu_schema WHERE version >= 2")
    reopened = shared_factory()
    assert reopened.schema_version() == (SQLITE_SCHEMA_VERSION if shared_factory.kind == "sqlite"
                                         else POSTGRES_SCHEMA_VERSION)
    assert reopened.read("thread/1") == [event]
    reopened.enqueue("thread/1", "alpha")
    assert [i.key for i in reopened.list_work()] == ["thread/1"]
