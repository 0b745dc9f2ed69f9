"""The Store contract, written once and run against every backend (see conftest.STORE_KINDS)."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    IdempotencyConflict,
    InvalidId,
    InvalidInput,
    JixuError,
    LeaseHeld,
    MalformedEvent,
    PayloadTooLarge,
    StoreError,
)
from jixu.ledger import (
    Checkpoint,
    Event,
    Fence,
    Lease,
    LeaseTake,
    MemoryStore,
    NewEvent,
    PostgresStore,
    SQLiteStore,
    Store,
)
from jixu.ledger import postgres as postgres_module
from jixu.ledger.event import GENESIS_HASH, PreparedEvent, prepare
from jixu.ledger.ids import new_id
from jixu.ledger.sqlite import _QueuedAppend
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


def _nested(depth: int, container: str) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value] if container == "list" else {"k": value}
    return value


UNENCODABLE = [
    pytest.param({"x": 10**5000}, id="huge-int"),
    pytest.param({"x": [1, {"y": -(10**4300)}]}, id="huge-negative-int-inside"),
    pytest.param({"x": _nested(100_000, "list")}, id="deep-list"),
    pytest.param({"x": _nested(100_000, "dict")}, id="deep-dict"),
    pytest.param({1: "one"}, id="int-key"),
    pytest.param({"x": {None: 1}}, id="none-key-inside"),
    pytest.param({"x": [float("nan")]}, id="nan"),
    pytest.param({"x": float("-inf")}, id="infinity"),
    pytest.param({"x": "a\udc80b"}, id="lone-surrogate"),
    pytest.param({"\ud800": 1}, id="lone-surrogate-key"),
]


@pytest.mark.parametrize("where", ["data", "meta"])
@pytest.mark.parametrize("value", UNENCODABLE)
def test_a_value_the_encoding_cannot_hold_is_a_malformed_event_and_writes_nothing(
    store: Store, value: dict[Any, Any], where: str
) -> None:
    bad = NewEvent("order.noted", value) if where == "data" else NewEvent("order.noted", {}, value)
    with pytest.raises(MalformedEvent) as info:
        store.append("orders/1", [NewEvent("order.noted"), bad], 0)
    assert isinstance(info.value, InvalidInput) and where in str(info.value)
    refused, accepted = store.append_many([AppendRequest("orders/1", [bad], 0),
                                           AppendRequest("orders/2", [NewEvent("order.noted")], 0)])
    assert isinstance(refused, MalformedEvent) and isinstance(accepted, list)
    assert [info.stream for info in store.list_streams()] == ["orders/2"]


def test_integers_of_up_to_4300_digits_are_stored_and_read_back_exactly(store: Store) -> None:
    widest = 10**4300 - 1
    [event] = store.append("orders/1", [NewEvent("order.noted", {"big": widest, "small": -widest})], 0)
    assert store.read("orders/1") == [event] and event.data == {"big": widest, "small": -widest}
    assert store.verify("orders/1").valid


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


# --- the append contract, on every path that decides an append -------------------------------------

APPEND_PATHS = ["memory", "sqlite", "sqlite-batched", "postgres", "postgres-batched", "postgres-v3", "postgres-slow"]
"""Every implementation of the append contract: the Python paths (memory, SQLite alone and batched, PostgreSQL's
several-statement transaction) all decide with ``decide_append``; PostgreSQL's fast path is the PL/pgSQL
function ``jixu_append_v4`` (``jixu_append`` for workers of schema 3; ``jixu_append_many_v6`` calls it for a
group commit), held here to the same verdicts."""
_FUNCTION_PATHS = ("postgres", "postgres-batched", "postgres-v3")
_APPEND_SQL_V3 = postgres_module._APPEND_SQL.replace("jixu_append_v4(", "jixu_append(")


class AppendPath:
    """One store's way of deciding an append: :meth:`append` goes through it and notes what decided.

    ``memory``; ``sqlite`` (an append alone: ``_append_in``); ``sqlite-batched`` (the append shares its
    group commit with a second one, so ``_append_batched`` decides it); ``postgres`` (``jixu_append_v4``,
    handing over to ``_append_slowly`` when an id is stored); ``postgres-batched`` (the append shares its group
    commit with a second one: ``jixu_append_many_v6``, then the same hand-over); ``postgres-v3`` (the same with
    migration 3's
    ``jixu_append``); ``postgres-slow`` (``_append_slowly`` alone, as on a database that does not store
    UTF-8). Each append checks that its path ran.
    """

    def __init__(self, kind: str, store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
        self.kind = kind
        self.store = store
        self.trail: list[str] = []
        if kind.startswith("postgres"):
            assert isinstance(store, PostgresStore) and store._fast_append, "the test server should take the fast path"
            if kind == "postgres-slow":
                store._fast_append = False
            self._spy(monkeypatch, "_append_once", "function")
            self._spy(monkeypatch, "_append_slowly", "slow")
            self._spy(monkeypatch, "_append_together", "together")
        if kind == "sqlite-batched":
            self._spy(monkeypatch, "_append_batched", "batched")
            self._spy(monkeypatch, "_append_each", "savepoints")  # the fallback: must not be what decided

    def _spy(self, monkeypatch: pytest.MonkeyPatch, name: str, label: str) -> None:
        original = getattr(self.store, name)

        def spy(*args: Any, **kwargs: Any) -> Any:
            if _PAD_STREAM in args:  # the second append of a batched path's group: not the one under test
                return original(*args, **kwargs)
            self.trail.append(label)  # before the call: it may raise the verdict
            result = original(*args, **kwargs)
            if result is False:  # _append_batched handed the group to the savepoint path
                self.trail[-1] = f"{label} declined"
            return result

        monkeypatch.setattr(self.store, name, spy)

    @property
    def refusals_by(self) -> str:
        """What decides a fence or head refusal and an insert on this path: the PL/pgSQL function or Python."""
        return "plpgsql" if self.kind in _FUNCTION_PATHS else "python"

    def decided_by(self) -> str:
        """``plpgsql`` when the database function alone decided the last append, else ``python``."""
        return "plpgsql" if self.trail in (["function"], ["together"]) else "python"

    def append(self, stream: str, batch: list[NewEvent], expected_seq: int, fence: Fence | None = None, *,
               genesis_hash: str | None = None) -> list[Event]:
        """``store.append`` through this path (raises what it raises)."""
        self.trail = []
        try:
            if self.kind == "sqlite-batched":
                return self._append_batched(stream, batch, expected_seq, fence, genesis_hash)
            if self.kind == "postgres-batched":
                return self._append_together(stream, batch, expected_seq, fence, genesis_hash)
            return self.store.append(stream, batch, expected_seq, fence, genesis_hash=genesis_hash)
        finally:
            expected = {"postgres-slow": [["slow"]], "sqlite-batched": [["batched"]],
                        "postgres-batched": [["together"], ["together", "function", "slow"]]}.get(
                self.kind, [["function"], ["function", "slow"]] if self.kind in _FUNCTION_PATHS else [[]])
            assert self.trail in expected, f"{self.kind} took {self.trail}"

    def _append_batched(self, stream: str, batch: list[NewEvent], expected_seq: int, fence: Fence | None,
                        genesis_hash: str | None) -> list[Event]:
        store = self.store
        assert isinstance(store, SQLiteStore)
        prepared = store._prepare_append(stream, batch, expected_seq, fence, genesis_hash)
        mine = _QueuedAppend(stream, prepared, expected_seq, fence, genesis_hash or GENESIS_HASH)
        # A second append in the same group, refused by its head: the group is decided together and this one
        # writes nothing.
        other = _QueuedAppend(_PAD_STREAM, [prepare(NewEvent("pad.refused"))], 1, None, GENESIS_HASH)
        store._commit_queued([mine, other])
        assert isinstance(other.error, ConcurrencyError) and store.stream_info(_PAD_STREAM) is None
        if mine.error is not None:
            raise mine.error
        assert mine.rows is not None
        return [row.to_event() for row in mine.rows]

    def _append_together(self, stream: str, batch: list[NewEvent], expected_seq: int, fence: Fence | None,
                         genesis_hash: str | None) -> list[Event]:
        # As in _append_batched: a second append in the same statement, refused by its head.
        mine, other = self.store.append_many([AppendRequest(stream, batch, expected_seq, fence, genesis_hash),
                                              AppendRequest(_PAD_STREAM, [NewEvent("pad.refused")], 1)])
        assert isinstance(other, ConcurrencyError) and self.store.stream_info(_PAD_STREAM) is None
        if isinstance(mine, JixuError):
            raise mine
        return mine


_PAD_STREAM = "pad/refused"


@pytest.fixture(params=APPEND_PATHS)
def path(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[AppendPath]:
    """Each path that decides an append, on a fresh store."""
    kind: str = request.param
    backend = kind.partition("-")[0]
    factory = StoreFactory(backend, tmp_path, request.getfixturevalue("postgres_dsn") if backend == "postgres" else None)
    try:
        if kind == "postgres-v3":
            monkeypatch.setattr(postgres_module, "_APPEND_SQL", _APPEND_SQL_V3)
        yield AppendPath(kind, factory(), monkeypatch)
    finally:
        factory.close()


def test_append_after_appends_at_the_head_after_what_others_appended_and_hands_them_over(store: Store) -> None:
    """``append_after`` reads the rows appended after ``expected_seq`` and appends what ``build`` makes of them at
    the head, in one write transaction: however far the head moved, it never meets a ConcurrencyError."""
    first = store.append("a/1", events(2), 0)
    store.append("a/1", events(3, "other.noted"), 2)  # another writer's events, after what the caller saw
    seen: list[list[int]] = []

    def build(rows: list[Any]) -> list[NewEvent]:
        seen.append([row.seq for row in rows])
        return [NewEvent("receipt.completed", {"after": [row.type for row in rows]})]

    rows, appended = store.append_after("a/1", first[-1].seq, None, build)
    assert seen == [[3, 4, 5]] and [row.seq for row in rows] == [3, 4, 5]
    assert [(e.seq, e.type) for e in appended] == [(6, "receipt.completed")]
    assert appended[0].data == {"after": ["other.noted"] * 3} and appended[0].prev_hash == rows[-1].hash
    assert store.read("a/1")[-1] == appended[0] and store.verify("a/1").valid
    nothing_new, none = store.append_after("a/1", 6, None, lambda rows: [])  # nothing to append: nothing written
    assert (nothing_new, none) == ([], []) and store.stream_info("a/1").head_seq == 6  # type: ignore[union-attr]


def test_append_after_writes_nothing_when_build_raises_or_the_fence_is_stale(store: Store) -> None:
    store.append("a/1", events(1), 0)

    def refuse(rows: list[Any]) -> list[NewEvent]:
        raise RuntimeError("not these")

    with pytest.raises(RuntimeError, match="not these"):
        store.append_after("a/1", 1, None, refuse)
    old = store.acquire_lease("k/1", "w1", 0.2)
    expire(store, 0.3)
    store.acquire_lease("k/1", "w2", 30)
    with pytest.raises(FencingError, match="is stale"):
        store.append_after("a/1", 1, old, lambda rows: events(1))
    with pytest.raises(InvalidInput):
        store.append_after("a/1", 0, None, lambda rows: events(1))
    with pytest.raises(InvalidInput):
        store.append_after("a/1", 1, None, lambda rows: [NewEvent("Bad Type", {})])
    with pytest.raises(JixuError):  # NotFound: no such stream
        store.append_after("a/2", 1, None, lambda rows: events(1))
    assert [e.seq for e in store.read("a/1")] == [1] and store.read("a/2") == []


def test_a_new_stream_starts_at_the_genesis_and_each_append_moves_the_head(path: AppendPath) -> None:
    store = path.store
    first = path.append("orders/1", events(3), 0)
    assert path.decided_by() == path.refusals_by
    assert [e.seq for e in first] == [1, 2, 3] and first[0].prev_hash == GENESIS_HASH
    assert [e.prev_hash for e in first[1:]] == [e.hash for e in first[:2]]
    assert all(e.computed_hash() == e.hash and TIMESTAMP.match(e.recorded_at) for e in first)
    more = path.append("orders/1", events(2), 3)
    assert [e.seq for e in more] == [4, 5] and more[0].prev_hash == first[-1].hash
    info = store.stream_info("orders/1")
    assert info is not None and (info.head_seq, info.head_hash, info.genesis_hash) == (5, more[-1].hash, GENESIS_HASH)
    assert info.created_at == first[0].recorded_at
    assert store.read("orders/1") == first + more and store.verify("orders/1").valid


def test_a_forked_stream_starts_at_the_genesis_it_is_given(path: AppendPath) -> None:
    parent = path.append("threads/p", events(3), 0)
    child = path.append("threads/c", events(2), 0, genesis_hash=parent[1].hash)
    assert child[0].prev_hash == parent[1].hash and child[1].prev_hash == child[0].hash
    info = path.store.stream_info("threads/c")
    assert info is not None and info.genesis_hash == parent[1].hash and path.store.verify("threads/c").valid
    assert path.append("threads/c", events(1), 2)[0].prev_hash == child[1].hash


def test_a_stored_batch_appended_again_is_a_no_op_whatever_moved_since(path: AppendPath) -> None:
    store = path.store
    fence = store.acquire_lease("k/1", "w1", 30)
    batch = events(3)
    first = path.append("orders/1", batch, 0, fence)
    assert path.append("orders/1", batch, 0, fence) == first
    assert path.decided_by() == "python"
    more = path.append("orders/1", events(1), 3, fence)
    assert path.append("orders/1", batch, 0) == first  # the head moved: the ids decide first
    store.release_lease(fence)
    assert path.append("orders/1", batch, 0, fence) == first  # so does a fence that no longer holds
    assert path.append("orders/1", batch, 7, Fence("k/none", "w9", 3)) == first
    info = store.stream_info("orders/1")
    assert info is not None and (info.head_seq, info.head_hash) == (4, more[0].hash)
    assert store.read("orders/1") == first + more


def test_a_batch_only_partly_stored_is_an_idempotency_conflict_and_writes_nothing(path: AppendPath) -> None:
    stored, new = events(1), events(1)
    path.append("orders/1", stored, 0)
    for batch, expected_seq in ((stored + new, 1), (new + stored, 1), (stored + new, 0), (new + stored, 5)):
        with pytest.raises(IdempotencyConflict, match="a retried append must repeat the same batch") as info:
            path.append("orders/1", batch, expected_seq)
        assert info.value.details == {"event_id": new[0].id}
        assert path.decided_by() == "python"
    assert len(path.store.read("orders/1")) == 1 and path.store.get_event(new[0].id) is None


def test_a_stored_id_with_other_content_is_an_idempotency_conflict_and_writes_nothing(path: AppendPath) -> None:
    [event] = path.append("orders/1", [NewEvent("order.noted", {"n": 1}, {"actor": "a"})], 0)
    for changed in (NewEvent("order.noted", {"n": 2}, {"actor": "a"}, id=event.id),
                    NewEvent("order.changed", {"n": 1}, {"actor": "a"}, id=event.id),
                    NewEvent("order.noted", {"n": 1}, {"actor": "b"}, id=event.id)):
        for expected_seq in (1, 0):
            with pytest.raises(IdempotencyConflict, match=f"event id {event.id} is already stored in stream "
                                                          "'orders/1' with different content"):
                path.append("orders/1", [changed], expected_seq)
            assert path.decided_by() == "python"
    assert path.store.read("orders/1") == [event]


def test_an_id_stored_in_another_stream_is_an_idempotency_conflict_even_with_the_same_content(
    path: AppendPath,
) -> None:
    batch = [NewEvent("order.noted", {"n": 1})]
    first = path.append("a/1", batch, 0)
    with pytest.raises(IdempotencyConflict, match="already stored in stream 'a/1' with different content"):
        path.append("b/1", batch, 0)
    assert path.decided_by() == "python"
    assert path.store.stream_info("b/1") is None and path.store.read("a/1") == first


def test_a_fence_must_be_the_live_holder_of_its_lease_and_a_refused_one_writes_nothing(path: AppendPath) -> None:
    store = path.store
    with pytest.raises(FencingError, match=r"^no lease exists for key 'k/none'$"):
        path.append("f/1", events(1), 0, Fence("k/none", "w1", 1))
    assert path.decided_by() == path.refusals_by
    old = store.acquire_lease("k/1", "w1", 0.2)
    assert [e.seq for e in path.append("f/1", events(1), 0, old)] == [1]
    assert path.decided_by() == path.refusals_by
    expire(store, 0.3)
    with pytest.raises(FencingError, match=r"^lease 'k/1' \(owner 'w1', epoch 1\) expired \d+\.\d{3}s ago by the "
                                           "store's clock$"):
        path.append("f/1", events(1), 1, old)  # expired, before anyone took it over
    assert path.decided_by() == path.refusals_by
    new = store.acquire_lease("k/1", "w2", 30)
    with pytest.raises(FencingError, match=r"^fence \('w1', epoch 1\) on 'k/1' is stale: the lease is now held by "
                                           r"'w2' at epoch 2$") as info:
        path.append("f/1", events(1), 1, old)
    assert info.value.details == {"key": "k/1", "epoch": 2}
    with pytest.raises(FencingError, match="is stale"):
        path.append("f/1", events(1), 1, Fence("k/1", "w2", 1))  # the right owner at an old epoch
    assert [e.seq for e in path.append("f/1", events(1), 1, new)] == [2]
    store.release_lease(new)
    with pytest.raises(FencingError, match=r"^lease 'k/1' was released by its owner$"):
        path.append("f/1", events(1), 2, new)
    assert path.decided_by() == path.refusals_by
    assert [e.seq for e in store.read("f/1")] == [1, 2] and store.stream_info("f/none") is None


def test_an_append_at_a_head_that_moved_is_a_concurrency_error_and_writes_nothing(path: AppendPath) -> None:
    store = path.store
    stored = path.append("orders/1", events(2), 0)
    for wrong in (0, 1, 3):
        with pytest.raises(ConcurrencyError, match=f"^stream 'orders/1' is at seq 2, not the expected {wrong}; "
                                                   "read the new events and decide again$") as info:
            path.append("orders/1", events(1), wrong)
        assert info.value.details == {"stream": "orders/1", "expected_seq": wrong, "actual_seq": 2}
        assert path.decided_by() == path.refusals_by
    with pytest.raises(ConcurrencyError) as info:
        path.append("fresh/1", events(1), 1)  # a stream that does not exist is at seq 0
    assert info.value.details["actual_seq"] == 0
    fence = store.acquire_lease("k/1", "w1", 30)
    with pytest.raises(ConcurrencyError):
        path.append("orders/1", events(1), 1, fence)  # a good fence does not excuse a moved head
    assert store.read("orders/1") == stored and store.stream_info("fresh/1") is None


def test_the_checks_run_in_the_contracts_order(path: AppendPath) -> None:
    """(1) ids already stored, (2) the fence, (3) the head: the first that refuses is the error."""
    store = path.store
    fence = store.acquire_lease("k/1", "w1", 30)
    [event] = path.append("o/1", events(1), 0, fence)
    store.release_lease(fence)
    changed = NewEvent("order.noted", {"n": 99}, id=event.id)
    with pytest.raises(IdempotencyConflict):  # ids first: before a released fence and a moved head
        path.append("o/1", [changed], 0, fence)
    with pytest.raises(FencingError):  # the fence before the head
        path.append("o/1", events(1), 0, fence)
    assert path.decided_by() == path.refusals_by
    with pytest.raises(FencingError):
        path.append("o/1", events(1), 0, Fence("k/none", "w1", 1))
    assert store.read("o/1") == [event]


# --- leases and fences ----------------------------------------------------------------------


def test_a_held_lease_cannot_be_taken_and_the_holder_renews(store: Store) -> None:
    fence = store.acquire_lease("k", "a", 30)
    with pytest.raises(LeaseHeld):
        store.acquire_lease("k", "b", 30)
    assert store.acquire_lease("k", "a", 30) == fence
    lease = store.renew_lease(fence, 60)
    assert lease.epoch == 1 and lease.expires_at > store.now() + 50
    store.release_lease(fence)
    assert store.acquire_lease("k", "b", 30).epoch == 2


def test_leases_renewed_together_each_get_their_answer_and_a_lost_one_stops_none(store: Store) -> None:
    held = [store.acquire_lease(f"k{i}", "a", 30) for i in range(3)]
    taken = store.acquire_lease("gone", "a", 30)
    store.release_lease(taken)
    store.acquire_lease("gone", "b", 30)  # taken by b: a's fence on it is lost
    before = store.now()
    answers = store.renew_leases([held[2], taken, held[0], held[1]], 60)
    assert [type(a).__name__ for a in answers] == ["Lease", "FencingError", "Lease", "Lease"]
    assert [a.key for a in answers if isinstance(a, Lease)] == ["k2", "k0", "k1"], "in the order asked"
    for fence in held:
        lease = store.get_lease(fence.key)
        assert lease is not None and lease.epoch == fence.epoch and lease.expires_at > before + 50
    stolen = store.get_lease("gone")
    assert stolen is not None and stolen.owner == "b", "a lost lease is left as it is"
    assert store.renew_leases([], 60) == []
    with pytest.raises(InvalidInput):
        store.renew_leases(held[0], 60)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.renew_leases(held, 0)


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


def test_checkpoints_are_written_together_all_or_none(store: Store) -> None:
    """A chunked checkpoint's new chunks and its main row go in one call: one transaction, all or none."""
    rows = [Checkpoint("threads/1", name, 3, 1, "a" * 64, f'{{"n":"{name}"}}', "d" * 64,
                       "2026-01-01T00:00:00.000000Z") for name in ("thread/chunk/1", "thread/chunk/2", "thread")]
    store.write_checkpoints(rows)
    assert store.read_checkpoints("threads/1", [r.name for r in rows]) == {r.name: r for r in rows}
    moved = [replace(r, seq=9, state_json='{"n":9}') for r in rows]
    for bad in (moved[0], [*moved, moved[0]], [moved[0], "x"], [moved[0], replace(moved[1], stream="")],
                [moved[0]] * 101):
        with pytest.raises(InvalidInput):
            store.write_checkpoints(bad)  # type: ignore[arg-type]
        assert store.read_checkpoints("threads/1", [r.name for r in rows]) == {r.name: r for r in rows}
    store.write_checkpoints([])  # nothing to write: nothing changes
    if not isinstance(store, MemoryStore):
        # The database refuses the last row (its state may not be null): the rows before it are not kept.
        with pytest.raises(StoreError):
            store.write_checkpoints([moved[0], moved[1], replace(moved[2], state_json=None)])  # type: ignore[arg-type]
        assert store.read_checkpoints("threads/1", [r.name for r in rows]) == {r.name: r for r in rows}
    store.write_checkpoints(moved)
    assert store.read_checkpoints("threads/1", [r.name for r in rows]) == {r.name: r for r in moved}


def test_checkpoints_of_several_names_are_read_at_once_and_only_those_that_exist(store: Store) -> None:
    made = {name: Checkpoint("threads/1", name, n, 1, "a" * 64, f'{{"n":{n}}}', "d" * 64,
                             "2026-01-01T00:00:00.000000Z") for n, name in enumerate(["state", "jixu/verdict"], 1)}
    for checkpoint in made.values():
        store.write_checkpoint(checkpoint)
    store.write_checkpoint(replace(made["state"], stream="threads/2"))  # another stream's: not read
    assert store.read_checkpoints("threads/1", ["state", "jixu/verdict", "missing", "state"]) == made
    assert store.read_checkpoints("threads/1", ["missing"]) == {} == store.read_checkpoints("threads/1", [])
    assert store.read_checkpoints("threads/3", ["state"]) == {}
    for bad in ("state", ["state", 1], ["n"] * 101):
        with pytest.raises(InvalidInput):
            store.read_checkpoints("threads/1", bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.read_checkpoints("", ["state"])


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


def test_take_overs_together_each_get_their_answer_and_a_refused_one_stops_none(store: Store) -> None:
    store.acquire_lease("held", "worker-a", 30)  # live: a take-over needing expiry is refused
    store.acquire_lease("moved", "worker-a", 30)  # at epoch 1: a take expecting 0 is refused
    answers = store.take_over_leases([
        LeaseTake("new", "worker-b", 30, 0),
        LeaseTake("held", "worker-b", 30, 1),
        LeaseTake("moved", "worker-b", 30, 0, require_expired=False),
        LeaseTake("dead", "worker-b", 30, 0),
        LeaseTake("new", "worker-c", 30, 1, require_expired=False),  # sees the first take of "new"
    ])
    assert [type(a).__name__ for a in answers] == ["Fence", "LeaseHeld", "FencingError", "Fence", "Fence"]
    assert answers[0] == Fence("new", "worker-b", 1) and answers[3] == Fence("dead", "worker-b", 1)
    assert answers[4] == Fence("new", "worker-c", 2)
    for key, owner, epoch in [("held", "worker-a", 1), ("moved", "worker-a", 1), ("new", "worker-c", 2)]:
        lease = store.get_lease(key)
        assert lease is not None and (lease.owner, lease.epoch) == (owner, epoch), "a refused take changes nothing"
    with pytest.raises(FencingError):
        store.append("new/stream", events(1), 0, answers[0])  # worker-b's take was taken over in the same call
    assert store.take_over_leases([]) == []
    for bad in (LeaseTake("k", "a", 30, -1), LeaseTake("", "a", 30, 0), LeaseTake("k", "a", 0, 0), "k"):
        with pytest.raises(InvalidInput):
            store.take_over_leases([LeaseTake("k", "a", 30, 0), bad])  # type: ignore[list-item]
    with pytest.raises(InvalidInput):
        store.take_over_leases(LeaseTake("k", "a", 30, 0))  # type: ignore[arg-type]
    assert store.get_lease("k") is None, "a bad request takes nothing"


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
