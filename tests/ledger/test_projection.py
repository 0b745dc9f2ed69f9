"""Projections and checkpoints: a checkpoint is used only when it provably matches, else ignored and reported."""

from __future__ import annotations

import gc
import sqlite3
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jixu.errors import InvalidInput, NotFound
from jixu.ledger import NewEvent, SQLiteStore, Store, project, save_checkpoint
from jixu.ledger.event import Event
from jixu.ledger.keys import Keyring, sealing_keyring
from jixu.ledger.projection import fold, gc_paused, make_checkpoint, replay
from jixu.ledger.store import Checkpoint


@dataclass
class Tally:
    count: int = 0
    total: int = 0
    types: list[str] = field(default_factory=list)


class TallyProjection:
    """Counts events and sums data["n"]; counts its own apply calls."""

    name = "tally"

    def __init__(self, version: int = 1) -> None:
        self.version = version
        self.applied = 0

    def initial(self) -> Tally:
        return Tally()

    def apply(self, state: Tally, event: Event) -> Tally:
        self.applied += 1
        state.count += 1
        state.total += int(event.data.get("n", 0))
        state.types.append(event.type)
        return state

    def dump(self, state: Tally) -> dict[str, Any]:
        return {"count": state.count, "total": state.total, "types": state.types}

    def load(self, data: dict[str, Any]) -> Tally:
        return Tally(data["count"], data["total"], list(data["types"]))


def fill(store: Store, stream: str, start: int, n: int) -> None:
    store.append(stream, [NewEvent("tally.added", {"n": start + i}) for i in range(n)], start)


def test_projecting_without_a_checkpoint_replays_everything(store: Store) -> None:
    fill(store, "t/1", 0, 10)
    projection = TallyProjection()
    result = project(store, "t/1", projection)
    assert (result.state.count, result.state.total, result.seq) == (10, 45, 10)
    assert result.checkpoint == "none" and result.chain.valid and projection.applied == 10


def test_a_matching_checkpoint_is_used_and_only_the_tail_is_applied(store: Store) -> None:
    fill(store, "t/1", 0, 100)
    save_checkpoint(store, "t/1", TallyProjection(), project(store, "t/1", TallyProjection()))
    fill(store, "t/1", 100, 5)
    projection = TallyProjection()
    result = project(store, "t/1", projection)
    assert result.checkpoint == "used" and result.checkpoint_seq == 100
    assert projection.applied == 5 and result.events_applied == 5
    full = project(store, "t/1", TallyProjection(), use_checkpoint=False)
    assert result.state == full.state and result.head_hash == full.head_hash


def test_a_checkpoint_of_another_reducer_version_is_ignored(store: Store) -> None:
    fill(store, "t/1", 0, 10)
    save_checkpoint(store, "t/1", TallyProjection(1), project(store, "t/1", TallyProjection(1)))
    projection = TallyProjection(2)
    result = project(store, "t/1", projection)
    assert result.checkpoint == "version_mismatch" and projection.applied == 10
    assert result.state.count == 10


def test_a_damaged_checkpoint_is_ignored(store: Store) -> None:
    fill(store, "t/1", 0, 10)
    good = save_checkpoint(store, "t/1", TallyProjection(), project(store, "t/1", TallyProjection()))
    store.write_checkpoint(Checkpoint(good.stream, good.name, good.seq, good.reducer_version, good.head_hash,
                                      good.state_json.replace('"total":45', '"total":9999'), good.digest))
    result = project(store, "t/1", TallyProjection())
    assert result.checkpoint == "digest_mismatch" and result.state.total == 45


def _other_key(tmp_path: Path) -> Keyring:
    """Another deployment's key (a checkpoint it sealed is foreign here)."""
    return sealing_keyring(tmp_path / "other-keys")


def test_a_foreign_checkpoint_is_ignored(store: Store, tmp_path: Path) -> None:
    fill(store, "t/1", 0, 10)
    fill(store, "t/2", 0, 10)
    other = project(store, "t/2", TallyProjection())
    other.state.total = 12345
    store.write_checkpoint(make_checkpoint("t/1", TallyProjection(), other.state, other.seq, other.head_hash,
                                           keys=_other_key(tmp_path)))
    result = project(store, "t/1", TallyProjection())
    assert result.checkpoint == "head_mismatch" and result.state.total == 45 and result.chain.valid


def test_a_checkpoint_beyond_the_head_is_ignored(store: Store, tmp_path: Path) -> None:
    fill(store, "t/1", 0, 3)
    state = project(store, "t/1", TallyProjection()).state
    store.write_checkpoint(make_checkpoint("t/1", TallyProjection(), state, 50, "a" * 64, keys=_other_key(tmp_path)))
    result = project(store, "t/1", TallyProjection())
    assert result.checkpoint == "head_mismatch" and result.chain.valid


def test_an_undecodable_checkpoint_state_is_ignored(store: Store) -> None:
    fill(store, "t/1", 0, 3)
    store.write_checkpoint(make_checkpoint("t/1", _Raw(), {"unexpected": True}, 3,
                                           store.stream_info("t/1").head_hash))  # type: ignore[union-attr]
    result = project(store, "t/1", TallyProjection())
    assert result.checkpoint == "undecodable" and result.state.count == 3


class _Raw:
    name = "tally"
    version = 1

    def dump(self, state: dict[str, Any]) -> dict[str, Any]:
        return state


def test_checkpoints_need_a_valid_non_empty_projection(store: Store) -> None:
    with pytest.raises(NotFound):
        project(store, "t/empty", TallyProjection())
    fill(store, "t/1", 0, 2)
    result = project(store, "t/1", TallyProjection())
    with pytest.raises(InvalidInput):
        save_checkpoint(store, "t/1", TallyProjection(),
                        type(result)(result.state, 0, result.head_hash, "none", None, 0, result.chain))


def test_tampering_after_the_checkpoint_stops_the_projection_at_the_bad_event(tmp_path: Path) -> None:
    path = tmp_path / "t.db"
    with SQLiteStore(path) as store:
        fill(store, "t/1", 0, 10)
        save_checkpoint(store, "t/1", TallyProjection(), project(store, "t/1", TallyProjection()))
        fill(store, "t/1", 10, 10)
    raw = sqlite3.connect(path)
    raw.execute("DROP TRIGGER jixu_events_no_update")
    raw.execute("""UPDATE jixu_events SET data = '{"n":1000}' WHERE stream = 't/1' AND seq = 15""")
    raw.commit()
    raw.close()
    with SQLiteStore(path) as store:
        result = project(store, "t/1", TallyProjection())
    assert result.checkpoint == "used"
    assert not result.chain.valid and result.chain.first_bad_seq == 15
    assert result.seq == 14 and result.state.count == 14 and result.state.total == sum(range(14))


# --- bulk folds: fold, replay, gc_paused --------------------------------------------------


def test_fold_and_replay_apply_exactly_what_the_plain_loop_applies(store: Store) -> None:
    fill(store, "t/1", 0, 12)
    events = store.read("t/1")
    plain = TallyProjection()
    expected = plain.initial()
    for event in events:
        expected = plain.apply(expected, event)
    assert fold(TallyProjection(), events) == expected
    assert replay(store, "t/1", TallyProjection()) == expected
    later = replay(store, "t/1", TallyProjection(), to_seq=5)
    assert replay(store, "t/1", TallyProjection(), from_seq=6, state=later) == expected
    assert replay(store, "t/1", TallyProjection(), from_seq=13) == Tally()


def test_fold_hands_all_the_events_to_apply_all_when_the_projection_has_it(store: Store) -> None:
    """A projection with ``apply_all`` gets every event in one call (the GC paused), not one ``apply`` each."""
    fill(store, "t/1", 0, 12)
    calls: list[tuple[int, bool]] = []

    class Bulk(TallyProjection):
        def apply_all(self, state: Tally, events: Iterable[Event]) -> Tally:
            batch = list(events)
            calls.append((len(batch), gc.isenabled()))
            for event in batch:
                state = self.apply(state, event)
            return state

    expected = fold(TallyProjection(), store.read("t/1"))
    bulk = Bulk()
    assert replay(store, "t/1", bulk) == expected
    assert calls == [(12, False)] and bulk.applied == 12 and gc.isenabled()
    later = replay(store, "t/1", bulk, to_seq=5)
    assert fold(bulk, store.read("t/1", from_seq=6), later) == expected
    assert calls[1:] == [(5, False), (7, False)]


def test_gc_is_paused_during_a_fold_and_enabled_again_after_it() -> None:
    seen: list[bool] = []

    class Watching(TallyProjection):
        def apply(self, state: Tally, event: Event) -> Tally:
            seen.append(gc.isenabled())
            return super().apply(state, event)

    assert gc.isenabled()
    fold(Watching(), [_event(1), _event(2)])
    assert seen == [False, False] and gc.isenabled()


def test_gc_is_enabled_again_when_the_fold_raises() -> None:
    class Failing(TallyProjection):
        def apply(self, state: Tally, event: Event) -> Tally:
            raise ValueError("bad event")

    assert gc.isenabled()
    with pytest.raises(ValueError, match="bad event"):
        fold(Failing(), [_event(1)])
    assert gc.isenabled()


def test_a_gc_that_was_disabled_stays_disabled() -> None:
    gc.disable()
    try:
        fold(TallyProjection(), [_event(1)])
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_nested_and_concurrent_pauses_enable_the_gc_once_the_last_one_ends() -> None:
    assert gc.isenabled()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer fold is still running
        inside, release = threading.Event(), threading.Event()

        def other() -> None:
            with gc_paused():
                inside.set()
                release.wait(5)

        worker = threading.Thread(target=other)
        worker.start()
        assert inside.wait(5)
    assert not gc.isenabled()  # the other thread's fold is still running
    release.set()
    worker.join(5)
    assert gc.isenabled()


def _event(seq: int) -> Event:
    return Event(id=f"01JD00000000000000000000{seq:02d}", stream="t/1", seq=seq, type="tally.added",
                 data={"n": seq}, meta={}, recorded_at="2026-01-01T00:00:00.000000Z", prev_hash="0" * 64,
                 hash="0" * 64)
