"""The fast row -> event path builds exactly what the dataclass constructors build."""

from __future__ import annotations

import json

from jixu.ledger.event import Event, NewEvent, StoredRow, prepare, seal


def test_from_tuple_and_to_event_equal_the_plain_constructors() -> None:
    row = seal(prepare(NewEvent("tool.completed", {"effect_id": "e", "result": {"a": [1, "é"]}},
                                {"actor": "jixu"})), stream="thread/x", seq=3, prev_hash="0" * 64,
               recorded_at="2026-01-01T00:00:00.000000Z")
    values = (row.id, row.stream, row.seq, row.type, row.data_json, row.meta_json, row.recorded_at, row.prev_hash,
              row.hash)
    assert StoredRow.from_tuple(values) == StoredRow(*values) == row
    event = row.to_event()
    assert event == Event(id=row.id, stream=row.stream, seq=row.seq, type=row.type, data=json.loads(row.data_json),
                          meta=json.loads(row.meta_json), recorded_at=row.recorded_at, prev_hash=row.prev_hash,
                          hash=row.hash)
    assert event.computed_hash() == event.hash


def test_repeated_meta_is_parsed_once_and_shared() -> None:
    rows = [seal(prepare(NewEvent("a.b", {"n": n}, {"actor": "jixu", "thread_id": "t"})), stream="s", seq=n + 1,
                 prev_hash="0" * 64, recorded_at="2026-01-01T00:00:00.000000Z") for n in range(3)]
    events = [row.to_event() for row in rows]
    assert events[0].meta == {"actor": "jixu", "thread_id": "t"}
    assert events[0].meta is events[1].meta is events[2].meta
    assert [e.data for e in events] == [{"n": 0}, {"n": 1}, {"n": 2}]
