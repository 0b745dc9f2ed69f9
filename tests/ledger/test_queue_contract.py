"""The work-queue part of the Store contract, written once and run against every backend.

Work items are durable rows (not events), each in a group: ``enqueue`` is
idempotent per key, ``claim_work`` takes a census of the queue in its own
transaction, asks the order it is given which groups to try and claims the
oldest claimable item of the first that has one; claims are fenced by owner and
epoch, and every expiry is judged by the store's clock. The order itself (the
projects' limits and fairness) is the scheduling layer's:
``tests/scheduling/test_queue_policy.py`` runs it against every backend.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from jixu.errors import ConcurrencyError, FencingError, InvalidId, InvalidInput
from jixu.ledger import NewEvent, Store
from jixu.ledger.postgres import SCHEMA_VERSION as POSTGRES_SCHEMA_VERSION
from jixu.ledger.sqlite import SCHEMA_VERSION as SQLITE_SCHEMA_VERSION
from jixu.ledger.store import ClaimOrder, QueueCensus, WorkClaim
from tests.conftest import StoreFactory


def expire(store: Store, seconds: float) -> None:
    """Let ``seconds`` of store time pass."""
    advance = getattr(store, "advance_clock", None)
    if advance is not None:
        advance(seconds)
    else:
        time.sleep(seconds)


def oldest_first(census: QueueCensus) -> list[str]:
    """Every group with a claimable item, the one whose oldest item waited longest first (no limits at all)."""
    return sorted(census.oldest, key=lambda group: census.oldest[group])


def at_most(total: int) -> ClaimOrder:
    """:func:`oldest_first` while fewer than ``total`` claims are live, else nothing."""
    return lambda census: [] if sum(census.live.values()) >= total else oldest_first(census)


def claim(store: Store, owner: str = "w1", ttl: float = 30.0, order: ClaimOrder = oldest_first) -> WorkClaim | None:
    return store.claim_work(owner, ttl, order)


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
    assert (first.state, first.group, first.epoch, first.claimed_by, first.rerun) == (
        "pending", "alpha", 0, None, False)
    assert abs(first.ready_at - store.now()) < 5 and first.enqueued_at == first.ready_at
    again = store.enqueue("thread/1", "alpha")
    assert again == first, "re-enqueueing a pending item changes nothing"
    assert [item.key for item in store.list_work()] == ["thread/1"]


def test_append_and_enqueue_is_one_transaction_both_or_neither(store: Store) -> None:
    """A queued turn's event and its queue row commit together: a refused append enqueues nothing."""
    with pytest.raises(ConcurrencyError):
        store.append_and_enqueue("thread/a", [NewEvent("turn.started", {"n": 1})], 3, key="thread/a", group="p")
    assert store.get_work("thread/a") is None and store.stream_info("thread/a") is None
    [event] = store.append_and_enqueue("thread/a", [NewEvent("turn.started", {"n": 1})], 0, key="thread/a",
                                       group="p")
    item = store.get_work("thread/a")
    assert item is not None and (item.state, item.group) == ("pending", "p") and event.seq == 1
    with pytest.raises(InvalidInput):  # a key belongs to one group: the event is not written either
        store.append_and_enqueue("thread/a", [NewEvent("turn.started", {"n": 2})], 1, key="thread/a", group="q")
    assert store.stream_info("thread/a").head_seq == 1  # type: ignore[union-attr]
    again = store.append_and_enqueue("thread/a", [NewEvent("turn.started", {"n": 1}, id=event.id)], 0,
                                     key="thread/a", group="p")
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


def test_a_key_belongs_to_one_group(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    with pytest.raises(InvalidInput, match="belongs to group 'alpha'"):
        store.enqueue("thread/1", "beta")
    assert [(i.key, i.group) for i in store.list_work()] == [("thread/1", "alpha")]


# --- claims ---------------------------------------------------------------------------------------------


def test_a_claim_takes_the_oldest_ready_item_and_sets_owner_epoch_and_expiry_by_the_store_clock(
        store: Store) -> None:
    assert claim(store) is None, "an empty queue yields nothing"
    for n in range(3):
        store.enqueue(f"job/{n}", "alpha")
    before = store.now()
    held = store.claim_work("w1", 5.0, oldest_first)
    after = store.now()
    assert held is not None
    assert (held.key, held.group, held.owner, held.epoch) == ("job/0", "alpha", "w1", 1)
    assert before + 5.0 <= held.expires_at <= after + 5.0
    item = store.get_work("job/0")
    assert item is not None and item.state == "claimed" and item.claimed_by == "w1"
    assert item.heartbeat_at is not None and before <= item.heartbeat_at <= after
    assert [c.key for c in (claim(store), claim(store)) if c] == ["job/1", "job/2"]
    assert claim(store) is None
    assert store.get_work("job/9") is None


def test_an_expired_claim_is_claimable_again_and_the_stale_holder_is_fenced_out(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    old = claim(store, "w1", 1.0)
    assert old is not None
    assert claim(store, "w2", 5, at_most(1)) is None, "live: the census counts it"
    expire(store, 1.1)
    item = store.get_work("thread/1")
    assert item is not None and item.state == "expired"
    assert [i.key for i in store.list_work(state="expired")] == ["thread/1"]
    assert store.list_work(state="claimed") == []
    with pytest.raises(FencingError, match="expired"):
        store.renew_work(old, 5)
    new = claim(store, "w2", 5, at_most(1))
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
    held = claim(store, "w1", 0.2)
    assert held is not None
    expire(store, 0.3)
    assert store.finish_work(held).state == "done"


def test_renewal_extends_the_claim_on_the_store_clock(store: Store) -> None:
    store.enqueue("thread/1", "alpha")
    held = claim(store, "w1", 1.0)
    assert held is not None
    for _ in range(2):
        expire(store, 0.3)
        held = store.renew_work(held, 1.0)
    item = store.get_work("thread/1")
    assert item is not None and item.state == "claimed" and item.expires_at == held.expires_at
    assert item.heartbeat_at is not None and abs(item.heartbeat_at + 1.0 - held.expires_at) < 1e-6


def test_claims_renewed_together_each_get_their_answer_and_keep_their_number(store: Store) -> None:
    for key in ("thread/1", "thread/2", "thread/3"):
        store.enqueue(key, "alpha")
    first, second, third = (claim(store, "w1", 1.0) for _ in range(3))
    assert first is not None and second is not None and third is not None
    store.finish_work(second)  # finished: its claim can no longer be renewed
    expire(store, 0.3)
    answers = store.renew_work_claims([third, second, first], 5.0)
    assert [type(a).__name__ for a in answers] == ["WorkClaim", "FencingError", "WorkClaim"]
    renewed = [a for a in answers if not isinstance(a, FencingError)]
    assert [(a.key, a.number) for a in renewed] == [(third.key, third.number), (first.key, first.number)]
    for each in renewed:
        item = store.get_work(each.key)
        assert item is not None and item.state == "claimed" and item.expires_at == each.expires_at
        assert each.expires_at > store.now() + 4
    assert store.get_work(second.key).state == "done"  # type: ignore[union-attr]
    assert store.renew_work_claims([], 5.0) == []


def test_claims_are_numbered_in_commit_order_across_connections_and_renewal_keeps_the_number(
        shared_factory: StoreFactory) -> None:
    first, second = shared_factory(), shared_factory()
    for n, group in enumerate(("alpha", "beta", "alpha")):
        first.enqueue(f"thread/{n}", group)
    held = [claim(first, "w1"), claim(second, "w2"), claim(first, "w1")]
    assert [(c.key, c.number) for c in held if c is not None] == [("thread/0", 1), ("thread/1", 2), ("thread/2", 3)]
    assert held[1] is not None and held[1].to_dict()["number"] == 2
    assert second.renew_work(held[1], 30.0).number == 2
    first.finish_work(held[0])  # type: ignore[arg-type]
    first.enqueue("thread/0", "alpha")
    again = claim(second, "w2")
    assert again is not None and (again.key, again.epoch, again.number) == ("thread/0", 2, 4)
    with pytest.raises(InvalidInput):
        second.renew_work(WorkClaim(again.key, again.group, again.owner, again.epoch, again.expires_at, -1), 30.0)


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


def test_list_work_filters_by_group_and_state(store: Store) -> None:
    store.enqueue("a/1", "a")
    store.enqueue("a/2", "a")
    store.enqueue("b/1", "b")
    held = claim(store)
    assert held is not None and held.key == "a/1"
    other = claim(store)
    assert other is not None
    store.finish_work(other)
    assert [i.key for i in store.list_work()] == ["a/1", "a/2", "b/1"]
    assert [i.key for i in store.list_work(group="a")] == ["a/1", "a/2"]
    assert states(store) == {"a/1": "claimed", other.key: "done",
                             ({"a/2", "b/1"} - {other.key}).pop(): "pending"}
    assert [i.key for i in store.list_work(state="claimed")] == ["a/1"]
    assert [i.key for i in store.list_work(group="b", state="claimed")] == []
    assert json.loads(json.dumps([i.to_dict() for i in store.list_work()]))[0]["key"] == "a/1"


def test_a_claim_asks_its_order_with_the_census_its_transaction_took(store: Store) -> None:
    store.enqueue("a/0", "a")
    store.enqueue("a/1", "a")
    store.enqueue("b/0", "b")
    store.enqueue("c/0", "c", ready_at=store.now() + 60)
    first = claim(store)
    assert first is not None and first.key == "a/0"
    seen: list[QueueCensus] = []

    def only_b(census: QueueCensus) -> list[str]:
        seen.append(census)
        return ["b"]

    second = store.claim_work("w2", 30, only_b)
    assert second is not None and (second.key, second.group, second.epoch) == ("b/0", "b", 1)
    [census] = seen
    a1 = store.get_work("a/1")
    assert a1 is not None
    assert dict(census.live) == {"a": 1}, "a/0's live claim, counted per group"
    assert set(census.oldest) == {"a", "b"}, "c's only item is not ready yet: c has nothing claimable"
    assert census.oldest["a"][0] == a1.ready_at and census.oldest["a"][1] > 0, "a's oldest claimable: a/1"
    assert dict(census.last_claimed) == {"a": 1}, "claims are numbered per store; b was never served"
    seen.clear()
    third = store.claim_work("w3", 30, lambda census: seen.append(census) or ["c", "a", "b"])
    assert third is not None and third.key == "a/1", "c has nothing claimable, so the next group named"
    assert dict(seen[0].last_claimed) == {"a": 1, "b": 2} and dict(seen[0].live) == {"a": 1, "b": 1}


@pytest.mark.parametrize("count", [1, 5, 40])
def test_claims_made_together_see_the_census_the_queue_gives_before_each(store: Store, count: int) -> None:
    # The census is read once per transaction and kept true as each claim changes it: before every claim of
    # a batch it must be what the queue's rows say at that point (each group's live claims and oldest
    # claimable item, the latest claim numbers), and each claim takes its group's oldest item.
    for i in range(12):
        for group in ("a", "b", "c"):
            store.enqueue(f"{group}/{i}", group)
    store.enqueue("d/late", "d", ready_at=store.now() + 600)
    first = claim(store, order=lambda census: ["b"])  # one live claim, and b's oldest moves on
    assert first is not None
    rows = {item.key: item for item in store.list_work()}

    def fair(census: QueueCensus) -> list[str]:
        # The group with the fewest live claims first, then the one served longest ago.
        return sorted(census.oldest, key=lambda g: (census.live.get(g, 0), census.last_claimed.get(g, 0), g))

    seen: list[QueueCensus] = []
    batch = store.claim_works("w2", 30, lambda census: seen.append(census) or fair(census), count)
    assert len(batch) == min(count, 35) and len(seen) == len(batch) + (count > 35)
    # The census each claim should have seen, worked out from the rows listed before the batch.
    # (list_work gives the rows in claim order: ready time, then enqueue position.)
    waiting = {g: [r for r in rows.values() if r.group == g and r.key != first.key] for g in ("a", "b", "c")}
    live = {"b": 1}
    last = {"b": first.number}
    positions: dict[str, int] = {}
    for census, made in zip(seen, batch, strict=False):
        oldest = {g: items[0].ready_at for g, items in waiting.items() if items}
        assert (dict(census.live), {g: r for g, (r, _) in census.oldest.items()}, dict(census.last_claimed)) == (
            live, oldest, last)
        for group, (_ready, position) in census.oldest.items():
            assert position >= positions.get(group, 0), "a group's oldest item only moves on"
            positions[group] = position
        assert made.group == fair(census)[0] and made.key == waiting[made.group][0].key
        assert made.number == max(last.values()) + 1
        waiting[made.group].pop(0)
        live[made.group] = live.get(made.group, 0) + 1
        last[made.group] = made.number
    # What the batch committed: the next transaction's census starts from each group's latest claim number.
    after: list[QueueCensus] = []
    store.claim_works("w3", 30, lambda census: after.append(census) or [], 1)
    assert dict(after[0].last_claimed) == last and dict(after[0].live) == live


def test_a_claim_takes_only_the_groups_its_order_names(store: Store) -> None:
    store.enqueue("a/0", "a")
    store.enqueue("b/0", "b")
    assert store.claim_work("w1", 30, lambda census: []) is None, "an empty answer claims nothing"
    got = store.claim_work("w1", 30, lambda census: ["nobody", "b"])
    assert got is not None and got.key == "b/0", "a group without items is passed over"
    assert store.claim_work("w1", 30, lambda census: ["b"]) is None, "a is never named, so never claimed"
    assert states(store) == {"a/0": "pending", "b/0": "claimed"}


def test_an_order_that_fails_claims_nothing(store: Store) -> None:
    store.enqueue("a/0", "a")

    def broken(census: QueueCensus) -> list[str]:
        raise RuntimeError("a bug in the policy")

    with pytest.raises(RuntimeError, match="a bug in the policy"):
        store.claim_work("w1", 30, broken)
    with pytest.raises(InvalidInput):
        store.claim_work("w1", 30, lambda census: ["a", 7])  # type: ignore[list-item]
    item = store.get_work("a/0")
    assert item is not None and (item.state, item.epoch) == ("pending", 0)
    seen: list[QueueCensus] = []
    got = store.claim_work("w1", 30, lambda census: seen.append(census) or ["a"])
    assert got is not None and got.epoch == 1 and dict(seen[0].last_claimed) == {}, "nothing was consumed"


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
    bad_orders: list[object] = [None, "a", ["a"], lambda census: "a", lambda census: [1], lambda census: None]
    for order in bad_orders:
        with pytest.raises(InvalidInput):
            store.claim_work("w1", 5, order)  # type: ignore[arg-type]
    for owner, ttl in (("", 5), ("w1", 0), ("w1", -1), ("w1", float("inf")), ("w\n1", 5)):
        with pytest.raises(InvalidInput):
            store.claim_work(owner, ttl, oldest_first)
    with pytest.raises(InvalidInput):
        store.finish_work("thread/1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.finish_work(WorkClaim("thread/1", "alpha", "w1", 0, 0.0))
    with pytest.raises(InvalidInput):
        store.renew_work(WorkClaim("thread/1", "alpha", "w1", 1, 0.0), 0)
    with pytest.raises(InvalidInput):
        store.list_work(state="running")
    with pytest.raises(InvalidInput):
        store.list_work(group="")
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
    forged = WorkClaim(held.key, held.group, "someone-else", held.epoch, held.expires_at)
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
        # what migration 3 adds, which a schema-1 store lacks as well
        raw.execute("DROP TABLE jixu_sessions")
        raw.execute("DROP TABLE jixu_last_used")
        raw.execute("DROP INDEX jixu_streams_project")
        raw.execute("ALTER TABLE jixu_streams DROP COLUMN project")
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
            conn.execute("DROP TRIGGER jixu_streams_project ON jixu_streams")  # and migration 5's
            conn.execute("DROP FUNCTION jixu_streams_project()")
            conn.execute("DROP FUNCTION jixu_project_of(text)")
            conn.execute("DROP TABLE jixu_sessions")
            conn.execute("DROP TABLE jixu_last_used")
            conn.execute("ALTER TABLE jixu_streams DROP COLUMN project")
            conn.execute("DROP FUNCTION jixu_append_many_v6")  # and migration 6's
            conn.execute("DELETE FROM jixu_schema WHERE version >= 2")
    reopened = shared_factory()
    assert reopened.schema_version() == (SQLITE_SCHEMA_VERSION if shared_factory.kind == "sqlite"
                                         else POSTGRES_SCHEMA_VERSION)
    assert reopened.read("thread/1") == [event]
    reopened.enqueue("thread/1", "alpha")
    assert [i.key for i in reopened.list_work()] == ["thread/1"]


def test_append_and_enqueue_may_make_the_item_ready_later_on_the_store_clock(store: Store) -> None:
    for bad in (-1, float("nan"), True, "1", 10**8):
        with pytest.raises(InvalidInput):
            store.append_and_enqueue("thread/a", [NewEvent("turn.started", {})], 0, key="thread/a", group="p",
                                     delay=bad)  # type: ignore[arg-type]
    assert store.stream_info("thread/a") is None and store.list_work() == []
    store.append_and_enqueue("thread/a", [NewEvent("turn.started", {})], 0, key="thread/a", group="p", delay=0.3)
    item = store.get_work("thread/a")
    assert item is not None and item.ready_at == pytest.approx(item.enqueued_at + 0.3, abs=1e-6)
    assert claim(store) is None, "not before its time"
    expire(store, 0.35)
    held = claim(store)
    assert held is not None and held.key == "thread/a"
