"""``Store.checkpoints_named``: one kind of checkpoint of many streams in one read, on every store."""

from __future__ import annotations

import pytest

from jixu.errors import InvalidId, InvalidInput
from jixu.ledger import Store
from jixu.ledger.store import STREAMS_AT_ONCE, Checkpoint


def _checkpoint(stream: str, name: str, seq: int) -> Checkpoint:
    return Checkpoint(stream=stream, name=name, seq=seq, reducer_version=1, head_hash="0" * 64, state_json="{}",
                      digest="d", created_at="2026-12-07T00:00:00Z")


def test_the_checkpoints_of_one_name_of_many_streams_in_one_read(store: Store) -> None:
    store.write_checkpoints([_checkpoint("s/a", "jixu/verdict", 3), _checkpoint("s/b", "thread", 7),
                             _checkpoint("s/c", "jixu/verdict", 5)])
    found = store.checkpoints_named("jixu/verdict", ["s/a", "s/b", "s/c", "s/missing", "s/a"])
    assert {stream: checkpoint.seq for stream, checkpoint in found.items()} == {"s/a": 3, "s/c": 5}
    assert store.checkpoints_named("jixu/verdict", []) == {}
    many = [f"s/n{i}" for i in range(1200)] + ["s/c"]  # more than one statement's worth of bound values
    assert list(store.checkpoints_named("jixu/verdict", many)) == ["s/c"]


def test_bad_arguments_are_refused_before_anything_is_read(store: Store) -> None:
    with pytest.raises(InvalidInput):
        store.checkpoints_named("jixu/verdict", "s/a")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput):
        store.checkpoints_named("", ["s/a"])
    with pytest.raises(InvalidInput):
        store.checkpoints_named("jixu/verdict", ["s/x"] * (STREAMS_AT_ONCE + 1))
    with pytest.raises(InvalidId):
        store.checkpoints_named("jixu/verdict", ["not a stream!"])
