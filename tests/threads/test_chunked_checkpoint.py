"""Chunked checkpoints (decision 0013): a thread opened from one equals its full replay, exactly.

Settled decisions and the older messages live in content-addressed chunks the
main checkpoint names; they are read lazily and checked against their digest.
Here the chunk sizes are made tiny so that short generated threads (many
effects of every ending: completed, failed, denied, unknown then resolved,
retried; compactions; forks) have many chunks, and the thread is reopened at
many points from checkpoints written along the way. Whatever the history, the
reopened thread's state, analysis and dump must equal a replay of its events.
A chunk that is missing or damaged must be noticed, reported and rebuilt by
replay, never silently dropped.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import pytest

from jixu.ledger import MemoryStore, NewEvent, SQLiteStore, Store, content_hash, new_id
from jixu.ledger.projection import chunk_name, project, replay
from jixu.ledger.store import Checkpoint
from jixu.threads import projection as thread_projection
from jixu.threads.log import ThreadLog, stream_of
from jixu.threads.projection import ThreadProjection, ThreadState


@pytest.fixture(autouse=True)
def tiny_chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(thread_projection, "SETTLED_CHUNK", 3)
    monkeypatch.setattr(thread_projection, "MESSAGES_CHUNK", 4)
    yield


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Store]:
    made: Store = MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "t.db")
    yield made
    made.close()


class Writer:
    """Appends harness-shaped events to one thread and keeps its projected state current."""

    def __init__(self, store: Store, rng: random.Random) -> None:
        self.store = store
        self.rng = rng
        self.thread_id = new_id()
        self.stream = stream_of(self.thread_id)
        self.projection = ThreadProjection()
        self.state = self.projection.initial()
        self.unknown: list[str] = []
        self.append(("thread.created", {"thread_id": self.thread_id, "agent": {"name": "gen"}, "metadata": {}}))

    def append(self, *specs: tuple[str, dict[str, Any]]) -> None:
        events = self.store.append(self.stream, [NewEvent(t, d, {"actor": "jixu"}) for t, d in specs],
                                   self.state.seq)
        for event in events:
            self.state = self.projection.apply(self.state, event)

    def intent(self, kind: str, name: str, args: dict[str, Any], semantics: str, turn_id: str,
               **extra: Any) -> tuple[str, dict[str, Any]]:
        effect_id = new_id()
        return f"{kind}.requested", {"effect_id": effect_id, "name": name, "args": args,
                                     "args_hash": content_hash(args), "semantics": semantics,
                                     "idempotency_key": f"jixu:{effect_id}", "turn_id": turn_id, **extra}

    def model_call(self, turn_id: str, calls: list[dict[str, Any]], text: str | None) -> None:
        kind, data = self.intent("model", "scripted", {"turn_id": turn_id, "n": self.state.seq}, "read_only",
                                 turn_id, requires_approval=False)
        eid = data["effect_id"]
        attempt = 1
        self.append((kind, data), ("model.dispatched", {"effect_id": eid, "attempt": 1}))
        if self.rng.random() < 0.2:
            self.append(("model.failed", {"effect_id": eid, "attempt": 1, "error": {"kind": "transient"},
                                          "indeterminate": True}),
                        ("model.dispatched", {"effect_id": eid, "attempt": 2}))
            attempt = 2
        result = {"text": text, "tool_calls": calls, "usage": {"input_tokens": 3, "output_tokens": 2,
                                                              "cost": 0.5}}
        self.append(("model.completed", {"effect_id": eid, "attempt": attempt, "result": result}))

    def tool_call(self, turn_id: str, call: dict[str, Any]) -> None:
        ending = self.rng.choice(["completed", "completed", "failed", "denied", "approved", "unknown",
                                  "retried"])
        semantics = "unsafe" if ending == "unknown" else "idempotent"
        kind, data = self.intent("tool", call["name"], call["args"], semantics, turn_id, call_id=call["id"],
                                 requires_approval=ending in ("denied", "approved"))
        eid = data["effect_id"]
        self.append((kind, data))
        if ending in ("denied", "approved"):
            self.append(("tool.parked", {"effect_id": eid, "reason": "approval"}),
                        (f"tool.{ending}", {"effect_id": eid, "actor": "op", "note": "ok"}))
            if ending == "denied":
                return
        self.append(("tool.dispatched", {"effect_id": eid, "attempt": 1}))
        if ending == "unknown":
            self.unknown.append(eid)  # resolved by an operator later (or left for the end of the turn)
        elif ending == "failed":
            self.append(("tool.failed", {"effect_id": eid, "attempt": 1, "error": {"m": "no"},
                                         "indeterminate": False}))
        elif ending == "retried":
            self.append(("tool.failed", {"effect_id": eid, "attempt": 1, "error": {"m": "?"}, "indeterminate": True}),
                        ("tool.dispatched", {"effect_id": eid, "attempt": 2}),
                        ("tool.completed", {"effect_id": eid, "attempt": 2, "result": {"v": "é", "n": 2}}))
        else:
            self.append(("tool.completed", {"effect_id": eid, "attempt": 1, "result": f"r{self.state.seq}"}))

    def resolve_unknown(self) -> None:
        for eid in self.unknown:
            resolution = self.rng.choice(["occurred", "not_occurred", "abandoned_unknown"])
            body: dict[str, Any] = {"effect_id": eid, "resolution": resolution, "resolution_id": new_id(),
                                    "actor": "op", "note": None}
            if resolution == "occurred":
                body["result"] = {"found": True}
            self.append(("tool.outcome_resolved", body))
        self.unknown = []

    def compaction(self, turn_id: str) -> None:
        turn = self.state.turns[-1]
        upto = turn.message_index
        if upto < 2:
            return
        covers = list(self.state.message_events[:upto])
        kind, data = self.intent("compaction", "summary", {"turn_id": turn_id, "upto_message": upto,
                                                            "covers": covers}, "read_only", turn_id,
                                 requires_approval=False)
        eid = data["effect_id"]
        self.append((kind, data), ("compaction.dispatched", {"effect_id": eid, "attempt": 1}),
                    ("compaction.completed", {"effect_id": eid, "attempt": 1,
                                              "result": {"summary": f"summary up to {upto}",
                                                         "usage": {"input_tokens": 1}}}))

    def turn(self) -> None:
        turn_id = new_id()
        self.append(("turn.started", {"turn_id": turn_id, "input": f"go {self.state.seq}"}))
        if self.rng.random() < 0.2:
            self.compaction(turn_id)
        for _step in range(self.rng.randint(0, 3)):
            calls = [{"id": f"call_{new_id()}", "name": "lookup", "args": {"k": self.rng.randint(0, 9)}}
                     for _ in range(self.rng.randint(1, 2))]
            self.model_call(turn_id, calls, None)
            for call in calls:
                self.tool_call(turn_id, call)
            if self.rng.random() < 0.7:
                self.resolve_unknown()
        if self.unknown or self.rng.random() < 0.15:
            self.append(("turn.ended", {"turn_id": turn_id, "outcome": "interrupted", "reason": "test"}))
            self.resolve_unknown()  # resolutions after the turn ended: answered by placeholders already
            return
        self.model_call(turn_id, [], "done")
        self.append(("turn.ended", {"turn_id": turn_id, "outcome": "completed", "reply": "done"}))


def replayed(store: Store, thread_id: str) -> ThreadState:
    return project(store, stream_of(thread_id), ThreadProjection(), use_checkpoint=False).state


def assert_same(log: ThreadLog, state: ThreadState) -> None:
    """``log`` (opened from a checkpoint) answers exactly like ``state`` (a replay)."""
    replay_log = ThreadLog(log.store, state)
    assert log.snapshot() == replay_log.snapshot()
    assert log.analysis() == replay_log.analysis()
    assert log.state == state
    projection = ThreadProjection()
    assert projection.dump(log.state) == projection.dump(state)


@pytest.mark.parametrize("seed", range(6))
def test_opening_from_chunked_checkpoints_equals_replay(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    writer = Writer(store, rng)
    used = 0
    for _turn in range(14):
        writer.turn()
        if rng.random() < 0.6:
            log = ThreadLog.load(store, writer.thread_id)
            used += log.checkpoint_status == "used"
            # Checked before and after the lazily read parts are touched, and after more events.
            assert log.state.seq == writer.state.seq
            assert_same(log, replayed(store, writer.thread_id))
            log.checkpoint()
    ThreadLog.load(store, writer.thread_id).checkpoint()
    main = store.read_checkpoint(writer.stream, "thread")
    assert main is not None and used >= 3
    data = json.loads(main.state_json)
    assert len(data["settled"]["chunks"]) == len(writer.state.settled) // 3 > 0
    assert len(data["conversation"]["chunks"]) == len(writer.state.messages) // 4
    # An open with no events after the checkpoint reads no chunk until asked, then answers like a replay;
    # so does a fork of it.
    log = ThreadLog.load(store, writer.thread_id)
    assert log.checkpoint_status == "used"
    assert log.state.conversation_pending() == bool(data["conversation"]["chunks"])
    assert log.status() == ThreadLog(store, replayed(store, writer.thread_id)).status()
    assert_same(log, replayed(store, writer.thread_id))
    at = store.read(writer.stream, log.state.seq - 3, log.state.seq - 3)[0].id
    child = log.fork(at)
    other = ThreadLog(store, replayed(store, writer.thread_id)).fork(at)
    assert child.snapshot().messages == other.snapshot().messages
    assert child.snapshot().turns == other.snapshot().turns


@pytest.mark.parametrize("seed", range(4))
def test_the_public_replay_equals_the_live_state_and_the_plain_loop(store: Store, seed: int) -> None:
    """``replay()`` (chunked reads, direct decoding, GC paused, the reducer's fast paths) changes no answer."""
    rng = random.Random(100 + seed)
    writer = Writer(store, rng)
    for _turn in range(10):
        writer.turn()
    projection = ThreadProjection()
    plain = projection.initial()
    for event in store.read(writer.stream):
        plain = projection.apply(plain, event)
    fast = replay(store, writer.stream, ThreadProjection())
    assert fast == plain == writer.state
    assert projection.dump(fast) == projection.dump(writer.state)
    assert ThreadLog(store, fast).analysis() == ThreadLog(store, writer.state).analysis()
    middle = writer.state.seq // 2
    head = replay(store, writer.stream, ThreadProjection(), to_seq=middle)
    assert replay(store, writer.stream, ThreadProjection(), from_seq=middle + 1, state=head) == plain


def _chunk_rows(store: Store, writer: Writer) -> list[Checkpoint]:
    data = json.loads(store.read_checkpoint(writer.stream, "thread").state_json)  # type: ignore[union-attr]
    digests = [d for d, _ids in data["settled"]["chunks"]] + [d for d, _n in data["conversation"]["chunks"]]
    found = [store.read_checkpoint(writer.stream, chunk_name("thread", d)) for d in digests]
    assert all(c is not None for c in found)
    return [c for c in found if c is not None]


@pytest.mark.parametrize("damage", ["missing", "changed"])
def test_a_missing_or_damaged_chunk_is_reported_and_rebuilt_by_replay(store: Store, damage: str) -> None:
    writer = Writer(store, random.Random(7))
    for _turn in range(8):
        writer.turn()
    ThreadLog.load(store, writer.thread_id).checkpoint()
    chunks = _chunk_rows(store, writer)
    if damage == "changed":
        for chunk in chunks:
            store.write_checkpoint(Checkpoint(chunk.stream, chunk.name, chunk.seq, chunk.reducer_version,
                                              chunk.head_hash, chunk.state_json.replace('"', "'", 1), chunk.digest,
                                              chunk.created_at))
    elif isinstance(store, MemoryStore):  # the stores have no delete: take the rows out underneath
        for chunk in chunks:
            store._checkpoints.pop((chunk.stream, chunk.name))
    else:
        assert isinstance(store, SQLiteStore)
        store._write(lambda conn: conn.execute(
            "UPDATE jixu_checkpoints SET name = 'gone/' || name WHERE name LIKE 'thread/chunk/%'"))
    log = ThreadLog.load(store, writer.thread_id)
    assert log.checkpoint_status == "used"  # the main checkpoint is fine; chunks are read when needed
    assert_same(log, replayed(store, writer.thread_id))
    assert log.checkpoint_status == ("chunk_missing" if damage == "missing" else "chunk_mismatch")
    # The next checkpoint writes the chunks again, and then a fresh open needs no replay.
    writer.turn()
    log.sync()
    assert log.checkpoint()
    again = ThreadLog.load(store, writer.thread_id)
    assert_same(again, replayed(store, writer.thread_id))
    assert again.checkpoint_status == "used"


def test_chunks_are_written_once(store: Store) -> None:
    writer = Writer(store, random.Random(3))
    for _turn in range(6):
        writer.turn()
    writes: list[str] = []
    original = store.write_checkpoints

    def counting(checkpoints: list[Checkpoint]) -> None:
        writes.extend(checkpoint.name for checkpoint in checkpoints)
        original(checkpoints)

    store.write_checkpoints = counting  # type: ignore[method-assign]
    log = ThreadLog.load(store, writer.thread_id)
    log.checkpoint()
    first = [name for name in writes if "/chunk/" in name]
    assert first and len(first) == len(set(first))
    writes.clear()
    writer.turn()
    log.sync()
    log.checkpoint()
    # Only chunks sealed (or re-cut by a compaction) since are written: a stored chunk is never written again.
    assert not set(first) & {name for name in writes if "/chunk/" in name}
    reopened = ThreadLog.load(store, writer.thread_id)
    reopened.checkpoint()  # nothing moved: nothing written
    assert writes.count("thread") == 1


def test_a_checkpoints_turns_load_equal_to_their_constructor_with_or_without_every_field() -> None:
    turn_class, turn_of = thread_projection.Turn, thread_projection._turn_of
    turn = turn_class(turn_id="t1", input="refund 7", status="completed", reply="done", model_calls=3,
                recoveries=[{"request_id": "r1"}], pause={"reason": "budget"})
    whole = turn_of(asdict(turn))  # every field: built without __init__
    assert whole == turn and type(whole) is turn_class
    whole.recoveries.append({"request_id": "r2"})  # its own lists, as from JSON
    assert turn.recoveries == [{"request_id": "r1"}]
    older = turn_of({"turn_id": "t0", "input": "look up 1"})  # a checkpoint from before some fields existed
    assert older == turn_class(turn_id="t0", input="look up 1") and older.recoveries == [] and older.queued is False


def test_a_checkpoint_with_more_new_chunks_than_one_write_takes_stores_its_main_row_last(store: Store) -> None:
    """One write takes at most 100 rows: 250 new chunks go in three writes, the main row with the last, so it is
    never stored before every chunk it names; chunks already stored are not written again."""
    from jixu.ledger.projection import write_chunked_checkpoint

    def row(name: str, text: str) -> Checkpoint:
        return Checkpoint("thread/1", name, 7, 1, "a" * 64, text, content_hash(text), "2026-01-01T00:00:00.000000Z")

    chunks = {f"{n:064x}": row(f"thread/chunk/{n:064x}", f'"chunk {n}"') for n in range(250)}
    main = row("thread", json.dumps(sorted(chunks)))
    writes: list[list[str]] = []
    original = store.write_checkpoints

    def counting(rows: list[Checkpoint]) -> None:
        if rows[-1].name == "thread":  # the main row: every chunk it names is stored by now
            assert all(store.read_checkpoint("thread/1", c.name) is not None for c in chunks.values()
                       if c not in rows)
        writes.append([r.name for r in rows])
        original(rows)

    store.write_checkpoints = counting  # type: ignore[method-assign]
    stored = {f"{n:064x}" for n in range(40)}  # the first 40 are stored already
    for digest in sorted(stored):
        original([chunks[digest]])
    write_chunked_checkpoint(store, main, chunks, stored)
    assert [len(w) for w in writes] == [100, 100, 11] and writes[-1][-1] == "thread"
    written = [name for w in writes for name in w]
    assert not set(written) & {f"thread/chunk/{n:064x}" for n in range(40)}, "a stored chunk was written again"
    assert len(written) == len(set(written)) == 211
    assert stored == set(chunks)
    assert store.read_checkpoint("thread/1", "thread") == main
