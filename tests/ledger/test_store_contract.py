"""The Store contract, written once and run against every backend (see conftest.STORE_KINDS)."""

from __future__ import annotations

import re
import threading
import time

import pytest

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    IdempotencyConflict,
    InvalidId,
    InvalidInput,
    LeaseHeld,
    MalformedEvent,
    PayloadTooLarge,
)
from jixu.ledger import Checkpoint, Fence, NewEvent, Store
from jixu.ledger.event import GENESIS_HASH, PreparedEvent, prepare
from jixu.ledger.ids import new_id
from jixu.ledger.store import AppendRequest
from tests.conftest import StoreFactory
from tests.helpers import spawn_python

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def events(n: int, kind: str = "order.noted") -> list[NewEvent]:
    return [NewEvent(kind, {"n": i, "text": "ü" * i}) for i in range(n)]


def expire(store: Store, seconds: float) -> None:
    """Let ``seconds`` of store time pass."""
    advance = getattr(store, "advance_clock", None)
    if advance is not None:
        advance(seconds)
    else:
        time.sleep(seconds)


# --- append and read ----------------------------------------------------------------------


def test_append_assigns_contiguous_seqs_and_links_the_chain(store: Store) -> None:
    stored = store.append("orders/1", events(3), 0)
    assert [e.seq for e in stored] == [1, 2, 3]
    assert stored[0].prev_hash == GENESIS_HASH
    assert stored[1].prev_hash == stored[0].hash and stored[2].prev_hash == stored[1].hash
    assert all(e.computed_hash() == e.hash for e in stored)
    assert all(TIMESTAMP.match(e.recorded_at) for e in stored)
    more = store.append("orders/1", events(2), 3)
    assert [e.seq for e in more] == [4, 5] and more[0].prev_hash == stored[2].hash


def test_read_returns_exactly_what_append_returned(store: Store) -> None:
    stored = store.append("orders/1", events(5), 0)
    assert store.read("orders/1") == stored
    assert store.read("orders/1", 2, 3) == stored[1:3]
    assert store.read("orders/1", 6) == []
    assert store.read("no/such/stream") == []


def test_iter_events_yields_what_read_returns_across_chunks(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import jixu.ledger.postgres as postgres_module
    import jixu.ledger.sqlite as sqlite_module

    monkeypatch.setattr(sqlite_module, "_CHUNK", 3)  # several keyset chunks, a partial one last
    monkeypatch.setattr(sqlite_module, "_EVENT_CHUNK", 3)
    monkeypatch.setattr(postgres_module, "_CHUNK", 3)
    stored = store.append("orders/1", events(8), 0)
    assert list(store.iter_events("orders/1")) == store.read("orders/1") == stored
    assert list(store.iter_events("orders/1", 2, 7)) == stored[1:7]
    assert list(store.iter_events("orders/1", 9)) == []
    assert list(store.iter_events("no/such/stream")) == []
    with pytest.raises(InvalidInput):
        store.iter_events("orders/1", 0)  # checked when called, not when first iterated


def test_stream_info_tracks_the_head(store: Store) -> None:
    assert store.stream_info("orders/1") is None
    stored = store.append("orders/1", events(2), 0)
    info = store.stream_info("orders/1")
    assert info is not None
    assert (info.head_seq, info.head_hash, info.genesis_hash) == (2, stored[-1].hash, GENESIS_HASH)


def test_get_event_finds_by_id(store: Store) -> None:
    stored = store.append("orders/1", events(2), 0)
    assert store.get_event(stored[1].id) == stored[1]
    assert store.get_event(new_id()) is None
    with pytest.raises(InvalidId):
        store.get_event("nope")


def test_streams_are_independent(store: Store) -> None:
    store.append("a/1", events(2), 0)
    store.append("b/1", events(1), 0)
    assert [e.seq for e in store.read("b/1")] == [1]
    assert store.read("a/1")[0].stream == "a/1"


def test_list_streams_filters_by_prefix_and_pages(store: Store) -> None:
    for name in ["runs/2", "threads/b", "threads/a", "threads/c"]:
        store.append(name, events(1), 0)
    assert [i.stream for i in store.list_streams("threads/")] == ["threads/a", "threads/b", "threads/c"]
    assert [i.stream for i in store.list_streams("threads/", limit=2)] == ["threads/a", "threads/b"]
    assert [i.stream for i in store.list_streams("threads/", after="threads/b")] == ["threads/c"]
    assert [i.stream for i in store.list_streams("runs_")] == []  # "_" is not a wildcard


# --- the append contract --------------------------------------------------------------------


def test_wrong_expected_seq_raises_concurrency_error_and_writes_nothing(store: Store) -> None:
    store.append("orders/1", events(2), 0)
    for wrong in (0, 1, 3):
        with pytest.raises(ConcurrencyError) as info:
            store.append("orders/1", events(1), wrong)
        assert info.value.details["actual_seq"] == 2
    with pytest.raises(ConcurrencyError):
        store.append("fresh/1", events(1), 1)
    assert len(store.read("orders/1")) == 2 and store.stream_info("fresh/1") is None


def test_reappending_the_same_batch_is_a_no_op(store: Store) -> None:
    batch = events(3)
    first = store.append("orders/1", batch, 0)
    again = store.append("orders/1", batch, 0)
    assert again == first
    assert store.stream_info("orders/1").head_seq == 3  # type: ignore[union-attr]


def test_same_id_with_different_content_is_rejected(store: Store) -> None:
    [event] = store.append("orders/1", events(1), 0)
    with pytest.raises(IdempotencyConflict):
        store.append("orders/1", [NewEvent("order.noted", {"n": 99}, id=event.id)], 1)
    with pytest.raises(IdempotencyConflict):
        store.append("other/1", [NewEvent("order.noted", {"n": 0, "text": ""}, id=event.id)], 0)
    assert len(store.read("orders/1")) == 1 and store.stream_info("other/1") is None


def test_a_batch_partly_stored_already_is_rejected(store: Store) -> None:
    batch = events(2)
    store.append("orders/1", batch[:1], 0)
    with pytest.raises(IdempotencyConflict):
        store.append("orders/1", batch, 1)
    assert len(store.read("orders/1")) == 1


@pytest.mark.parametrize(("stream", "batch", "expected_seq", "error"), [
    ("bad stream name", events(1), 0, InvalidId),
    ("", events(1), 0, InvalidId),
    ("/leading-slash", events(1), 0, InvalidId),
    ("orders/1", [], 0, InvalidInput),
    ("orders/1", events(1), -1, InvalidInput),
    ("orders/1", events(1), True, InvalidInput),
    ("orders/1", [NewEvent("BadType")], 0, MalformedEvent),
    ("orders/1", [NewEvent("ok.type"), NewEvent("ok.type", {"x": float("nan")})], 0, MalformedEvent),
    ("orders/1", ["not an event"], 0, MalformedEvent),
    ("orders/1", prepare(NewEvent("ok.type")), 0, InvalidInput),  # one event, not a list of them
    # Built by hand, not by prepare(): its texts were never checked (here: not even JSON).
    ("orders/1", [PreparedEvent(new_id(), "ok.type", "{not json", "{}", 9)], 0, InvalidInput),
])
def test_bad_input_raises_a_typed_error_and_writes_nothing(
    store: Store, stream: str, batch: list[NewEvent], expected_seq: int, error: type[Exception]
) -> None:
    with pytest.raises(error):
        store.append(stream, batch, expected_seq)
    assert store.list_streams() == []


def test_duplicate_ids_within_one_batch_are_rejected(store: Store) -> None:
    event = NewEvent("order.noted")
    with pytest.raises(InvalidInput):
        store.append("orders/1", [event, event], 0)
    assert store.list_streams() == []


def test_oversized_payload_is_rejected_and_writes_nothing(store: Store) -> None:
    with pytest.raises(PayloadTooLarge):
        store.append("orders/1", [NewEvent("order.noted", {"blob": "x" * (store.max_payload_bytes + 1)})], 0)
    assert store.stream_info("orders/1") is None


def test_an_event_prepared_beforehand_is_stored_exactly_as_the_new_event_would_be(store: Store) -> None:
    new = NewEvent("order.noted", {"items": [1, 2.5, "é"], "note": None}, {"actor": "ops"})
    mixed = store.append("orders/1", [prepare(new), NewEvent("order.noted", {"n": 2})], 0)
    plain = store.append("orders/2", [NewEvent(new.type, new.data, new.meta)], 0)
    assert next(store.read_rows("orders/1")).data_json == next(store.read_rows("orders/2")).data_json
    assert (mixed[0].data, mixed[0].meta) == (plain[0].data, plain[0].meta) == (new.data, new.meta)
    assert store.read("orders/1") == mixed and store.verify("orders/1").valid
    assert store.append("orders/1", [prepare(new), NewEvent("order.noted", {"n": 2}, id=mixed[1].id)], 0) == mixed


def test_an_event_prepared_under_a_larger_limit_is_still_refused_and_writes_nothing(store: Store) -> None:
    blob = NewEvent("order.noted", {"blob": "x" * (store.max_payload_bytes + 1)})
    prepared = prepare(blob, store.max_payload_bytes * 2)
    with pytest.raises(PayloadTooLarge):
        store.append("orders/1", [NewEvent("order.noted"), prepared], 0)
    assert store.stream_info("orders/1") is None


def test_forked_stream_starts_from_the_given_genesis(store: Store) -> None:
    parent = store.append("threads/p", events(3), 0)
    child = store.append("threads/c", events(1), 0, genesis_hash=parent[1].hash)
    assert child[0].prev_hash == parent[1].hash
    assert store.stream_info("threads/c").genesis_hash == parent[1].hash  # type: ignore[union-attr]
    assert store.verify("threads/c").valid
    with pytest.raises(InvalidInput):
        store.append("threads/c", events(1), 1, genesis_hash=parent[0].hash)
    with pytest.raises(InvalidId):
        store.append("threads/d", events(1), 0, genesis_hash="xyz")


# --- leases and fences ----------------------------------------------------------------------


def test_a_fenced_append_succeeds_for_the_current_holder(store: Store) -> None:
    fence = store.acquire_lease("threads/1", "worker-a", 30)
    assert fence == Fence("threads/1", "worker-a", 1)
    assert store.append("threads/1", events(1), 0, fence)[0].seq == 1


def test_a_stale_fence_is_rejected_in_the_same_transaction(store: Store) -> None:
    old = store.acquire_lease("threads/1", "worker-a", 0.2)
    store.append("threads/1", events(1), 0, old)
    expire(store, 0.3)
    new = store.acquire_lease("threads/1", "worker-b", 30)
    assert new.epoch == old.epoch + 1
    with pytest.raises(FencingError):
        store.append("threads/1", events(1), 1, old)
    assert store.stream_info("threads/1").head_seq == 1  # type: ignore[union-attr]
    assert store.append("threads/1", events(1), 1, new)[0].seq == 2


def test_an_expired_fence_cannot_append_even_before_takeover(store: Store) -> None:
    fence = store.acquire_lease("threads/1", "worker-a", 0.2)
    expire(store, 0.3)
    with pytest.raises(FencingError):
        store.append("threads/1", events(1), 0, fence)
    with pytest.raises(FencingError):
        store.renew_lease(fence, 30)
    assert store.stream_info("threads/1") is None


def test_released_and_missing_leases_fence_nothing(store: Store) -> None:
    fence = store.acquire_lease("threads/1", "worker-a", 30)
    store.release_lease(fence)
    with pytest.raises(FencingError):
        store.append("threads/1", events(1), 0, fence)
    with pytest.raises(FencingError):
        store.append("threads/2", events(1), 0, Fence("threads/2", "worker-a", 1))
    assert store.list_streams() == []


def test_a_held_lease_cannot_be_taken_and_the_holder_renews(store: Store) -> None:
    fence = store.acquire_lease("k", "a", 30)
    with pytest.raises(LeaseHeld):
        store.acquire_lease("k", "b", 30)
    assert store.acquire_lease("k", "a", 30) == fence
    lease = store.renew_lease(fence, 60)
    assert lease.epoch == 1 and lease.expires_at > store.now() + 50
    store.release_lease(fence)
    assert store.acquire_lease("k", "b", 30).epoch == 2


@pytest.mark.parametrize(("key", "owner", "ttl"), [("", "a", 1), ("k", "", 1), ("k", "a", 0), ("k", "a", -1),
                                                    ("k", "a", float("nan")), ("k\n", "a", 1)])
def test_bad_lease_requests_are_rejected(store: Store, key: str, owner: str, ttl: float) -> None:
    with pytest.raises(InvalidInput):
        store.acquire_lease(key, owner, ttl)
    with pytest.raises(InvalidInput):
        store.append("threads/1", events(1), 0, Fence("k", "a", 0))
    assert store.get_lease("k") is None


def test_the_store_clock_is_close_to_real_time(store: Store) -> None:
    assert abs(store.now() - time.time()) < 5


# --- checkpoints ---------------------------------------------------------------------------


def test_checkpoints_are_stored_and_replaced(store: Store) -> None:
    first = Checkpoint("threads/1", "state", 1, 1, "a" * 64, '{"n":1}', "d" * 64, "2026-01-01T00:00:00.000000Z")
    store.write_checkpoint(first)
    assert store.read_checkpoint("threads/1", "state") == first
    second = Checkpoint("threads/1", "state", 5, 1, "b" * 64, '{"n":5}', "e" * 64, "2026-01-01T00:00:01.000000Z")
    store.write_checkpoint(second)
    assert store.read_checkpoint("threads/1", "state") == second
    assert store.read_checkpoint("threads/1", "other") is None


# --- verification -------------------------------------------------------------------------


def test_verify_reports_a_valid_chain(store: Store) -> None:
    stored = store.append("orders/1", events(10), 0)
    report = store.verify("orders/1")
    assert (report.valid, report.count, report.head_hash) == (True, 10, stored[-1].hash)
    assert store.verify("empty/1").count == 0


# --- concurrency ------------------------------------------------------------------------------

_RACER = """
import sys, time
from jixu.ledger import open_store, NewEvent
from jixu.errors import ConcurrencyError
store = open_store(sys.argv[1]); start = float(sys.argv[2]); stream = sys.argv[3]
while time.time() < start: pass
try:
    store.append(stream, [NewEvent("race.won", {"pid": sys.argv[4]})], 0)
    print("won")
except ConcurrencyError as e:
    print(e.code)
"""


def test_two_writers_racing_for_one_seq_exactly_one_wins(store_factory: StoreFactory) -> None:
    """Two OS processes (or threads, for the in-memory store) append at the same expected seq."""
    store = store_factory()
    for round_ in range(5):
        stream = f"race/{round_}"
        if store_factory.url:
            start = time.time() + 0.5
            procs = [spawn_python(_RACER, store_factory.url, str(start), stream, str(i)) for i in range(2)]
            outcomes = [p.communicate(timeout=30)[0].strip() for p in procs]
        else:
            barrier = threading.Barrier(2)
            outcomes = []

            def race(i: int, barrier: threading.Barrier = barrier, stream: str = stream,
                     outcomes: list[str] = outcomes) -> None:
                barrier.wait()
                try:
                    store.append(stream, [NewEvent("race.won", {"pid": str(i)})], 0)
                    outcomes.append("won")
                except ConcurrencyError as error:
                    outcomes.append(error.code)

            threads = [threading.Thread(target=race, args=(i,)) for i in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert sorted(outcomes) == ["concurrency_conflict", "won"], outcomes
        assert len(store.read(stream)) == 1


def test_take_over_needs_the_observed_epoch_and_an_expired_lease(store: Store) -> None:
    old = store.acquire_lease("turn/1", "worker-a", 0.3)
    with pytest.raises(LeaseHeld):
        store.take_over_lease("turn/1", "recovery", 30, expected_epoch=1)
    expire(store, 0.4)
    with pytest.raises(FencingError):
        store.take_over_lease("turn/1", "recovery", 30, expected_epoch=2)
    new = store.take_over_lease("turn/1", "recovery", 30, expected_epoch=1)
    assert (new.owner, new.epoch) == ("recovery", 2)
    with pytest.raises(FencingError):
        store.append("turn/1", events(1), 0, old)
    with pytest.raises(FencingError):  # the same observation cannot be used twice
        store.take_over_lease("turn/1", "other", 30, expected_epoch=1, require_expired=False)


def test_take_over_without_expiry_is_an_explicit_assertion(store: Store) -> None:
    store.acquire_lease("turn/1", "worker-a", 30)
    fence = store.take_over_lease("turn/1", "worker-a", 30, expected_epoch=1, require_expired=False)
    assert fence.epoch == 2
    legacy = store.take_over_lease("turn/never-leased", "recovery", 30, expected_epoch=0)
    assert legacy.epoch == 1
    with pytest.raises(InvalidInput):
        store.take_over_lease("turn/1", "x", 30, expected_epoch=-1)


def test_append_many_answers_each_append_on_its_own(store: Store) -> None:
    first = store.append("g/one", [NewEvent("test.made", {"n": 1})], 0)
    answers = store.append_many([
        AppendRequest("g/one", [NewEvent("test.made", {"n": 2})], 1),
        AppendRequest("g/one", [NewEvent("test.made", {"n": 3})], 1),  # the head moved: refused alone
        AppendRequest("g/two", [NewEvent("test.made", {"n": 4})], 0),
        AppendRequest("g/bad name!", [NewEvent("test.made", {"n": 5})], 0),  # invalid: refused alone
    ])
    assert [type(a).__name__ if not isinstance(a, list) else len(a) for a in answers] == [
        1, "ConcurrencyError", 1, "InvalidId"]
    assert [e.data["n"] for e in store.read("g/one")] == [1, 2] and first[0].seq == 1
    assert [e.data["n"] for e in store.read("g/two")] == [4]
