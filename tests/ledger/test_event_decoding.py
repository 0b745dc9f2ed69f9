"""The fast row -> event path builds exactly what the dataclass constructors build."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jixu.errors import InvalidInput
from jixu.ledger.encoding import canonical_text
from jixu.ledger.event import (
    Event,
    NewEvent,
    PreparedEvent,
    StoredRow,
    check_prepared,
    compute_hash,
    event_from_stream_row,
    events_from_stream_rows,
    keep_parsed,
    parse_json,
    prepare,
    seal,
)


def test_a_kept_parse_is_the_stored_events_data_and_never_outlives_its_text() -> None:
    """A staged receipt's parsed data is shared with the event the store returns (not parsed again), and a
    row or prepared event made from another by ``dataclasses.replace`` parses its own text."""
    prepared = prepare(NewEvent("tool.completed", {"effect_id": "e", "result": {"b": 1, "a": [2]}}))
    data = parse_json(prepared.data_json)
    keep_parsed(prepared, data)
    row = seal(prepared, stream="thread/x", seq=1, prev_hash="0" * 64, recorded_at="2026-01-01T00:00:00.000000Z")
    assert row.to_event().data is data
    assert row == StoredRow(row.id, row.stream, row.seq, row.type, row.data_json, row.meta_json, row.recorded_at,
                            row.prev_hash, row.hash)  # the kept parse is not part of the row's value
    other = dataclasses.replace(row, data_json='{"effect_id":"e","result":null}')
    assert other.to_event().data == {"effect_id": "e", "result": None}
    assert dataclasses.replace(prepared, data_json='{"x":1}')._parsed is None
    unkept = seal(prepare(NewEvent("tool.completed", {"effect_id": "e"})), stream="thread/x", seq=1,
                  prev_hash="0" * 64, recorded_at="2026-01-01T00:00:00.000000Z")
    assert unkept.to_event().data == {"effect_id": "e"}
    assert StoredRow.from_tuple(dataclasses.astuple(row)[:9]).to_event().data is not data
    other_prepared = prepare(NewEvent("tool.completed", {"effect_id": "e"}))
    with pytest.raises(InvalidInput, match="must be the dict"):
        keep_parsed(other_prepared, [1])  # type: ignore[arg-type]
    assert other_prepared._parsed is None


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


def test_prepare_and_seal_build_what_the_plain_constructors_build() -> None:
    new = NewEvent("tool.completed", {"effect_id": "e", "result": {"a": [1, "é"]}}, {"actor": "jixu"})
    prepared = prepare(new)
    data_json, meta_json = canonical_text(new.data), canonical_text(new.meta)
    size = len(data_json.encode()) + len(meta_json.encode())
    assert prepared == PreparedEvent(id=new.id, type=new.type, data_json=data_json, meta_json=meta_json, size=size)
    assert prepared._made_by is not None and check_prepared(prepared, 1000) is prepared  # made by prepare()
    row = seal(prepared, stream="thread/x", seq=3, prev_hash="0" * 64, recorded_at="2026-01-01T00:00:00.000000Z")
    assert row == StoredRow(id=new.id, stream="thread/x", seq=3, type=new.type, data_json=data_json,
                            meta_json=meta_json, recorded_at="2026-01-01T00:00:00.000000Z", prev_hash="0" * 64,
                            hash=compute_hash(id=new.id, stream="thread/x", seq=3, type=new.type, data_json=data_json,
                                              meta_json=meta_json, recorded_at="2026-01-01T00:00:00.000000Z",
                                              prev_hash="0" * 64))


def test_repeated_meta_is_parsed_once_and_shared() -> None:
    rows = [seal(prepare(NewEvent("a.b", {"n": n}, {"actor": "jixu", "thread_id": "t"})), stream="s", seq=n + 1,
                 prev_hash="0" * 64, recorded_at="2026-01-01T00:00:00.000000Z") for n in range(3)]
    events = [row.to_event() for row in rows]
    assert events[0].meta == {"actor": "jixu", "thread_id": "t"}
    assert events[0].meta is events[1].meta is events[2].meta
    assert [e.data for e in events] == [{"n": 0}, {"n": 1}, {"n": 2}]


def test_a_stream_row_decodes_to_the_event_the_stored_row_decodes_to() -> None:
    row = seal(prepare(NewEvent("model.completed", {"effect_id": "e", "result": {"text": "ü\n", "n": 1.5}},
                                {"actor": "jixu", "thread_id": "t"})), stream="thread/x", seq=9,
               prev_hash="0" * 64, recorded_at="2026-01-01T00:00:00.000000Z")
    values = (row.id, row.seq, row.type, row.data_json, row.meta_json, row.recorded_at, row.prev_hash, row.hash)
    event = event_from_stream_row("thread/x", values)
    assert event == row.to_event()
    assert event.computed_hash() == event.hash


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


@given(_JSON, st.booleans())
def test_parse_json_equals_json_loads(value: Any, canonical: bool) -> None:
    text = canonical_text({"v": value}) if canonical else json.dumps({"v": value}, indent=1)
    assert parse_json(text) == json.loads(text)
    assert repr(parse_json(text)) == repr(json.loads(text))  # same types too (1 vs 1.0, -0.0)


@pytest.mark.parametrize("text", ["", " ", "{", '{"a":1} x', '{"a":1}{}', "nul", '"\ud800', "[1,]", "{'a':1}"])
def test_parse_json_raises_what_json_loads_raises_on_bad_text(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        parse_json(text)
    assert (got.value.msg, got.value.pos) == (expected.value.msg, expected.value.pos)


@pytest.mark.parametrize("text", [' {"a": 1} ', "\n[1, 2]\n", "NaN", "1e400", "-0.0"])
def test_parse_json_accepts_what_json_loads_accepts(text: str) -> None:
    assert repr(parse_json(text)) == repr(json.loads(text))


def _row_with_data(text: str) -> tuple[Any, ...]:
    return ("01M8NQ6NFJ3JHM58G231H9REW0", 1, "test.x", text, '{"actor":"a"}', "2026-01-01T00:00:00.000000Z",
            "0" * 64, "1" * 64)


@pytest.mark.parametrize("text", ['{"a":1}', ' {"a": 1} ', "\n[1, 2]\n", "NaN", "1e400", "-0.0", '{"a":1.5e3}'])
def test_a_stream_row_parses_its_data_as_json_loads_does(text: str) -> None:
    """event_from_stream_row inlines parse_json: the same value for any text json.loads accepts."""
    assert repr(event_from_stream_row("s", _row_with_data(text)).data) == repr(json.loads(text))


@pytest.mark.parametrize("text", ["", " ", "{", '{"a":1} x', '{"a":1}{}', "nul", '"\ud800', "[1,]"])
def test_a_stream_row_with_bad_data_raises_what_json_loads_raises(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads(text)
    with pytest.raises(json.JSONDecodeError) as got:
        event_from_stream_row("s", _row_with_data(text))
    assert (got.value.msg, got.value.pos) == (expected.value.msg, expected.value.pos)


def _rows(texts: list[str]) -> list[tuple[Any, ...]]:
    return [(f"01M8NQ6NFJ3JHM58G231H9R{index:03d}", index + 1, "test.x", text, '{"actor":"a"}',
             "2026-01-01T00:00:00.000000Z", "0" * 64, "1" * 64) for index, text in enumerate(texts)]


def _one_by_one(texts: list[str]) -> list[Event]:
    return [event_from_stream_row("s", row) for row in _rows(texts)]


@given(st.lists(st.dictionaries(st.text(max_size=8), _JSON, max_size=4), max_size=12), st.booleans())
def test_a_chunk_of_stream_rows_decodes_to_the_events_its_rows_decode_to(datas: list[Any], canonical: bool) -> None:
    """The data of a chunk parsed as one array: the same events, with the same types, as row by row."""
    texts = [canonical_text(data) if canonical else json.dumps(data) for data in datas]
    events = events_from_stream_rows("s", _rows(texts))
    assert events == _one_by_one(texts)
    assert [repr(event.data) for event in events] == [repr(event.data) for event in _one_by_one(texts)]


@pytest.mark.parametrize("texts", [
    ['{"a":1}', '{"a":1},{"b":2}'],  # one text that is two objects: one element too many
    ['{"a":1}', "[1]"],  # a row whose data is not an object
    ['{"a":1}', "5", '{"b":2}'],
    ['{"a":', '1}'],  # two halves of an object: one element too few
    ['{"a":"x', 'y"}'],  # two halves of a string
    ['{"a":1}', " {\"b\": 2} "],  # parses, but its text does not begin as an object: row by row
])
def test_a_chunk_whose_texts_are_not_one_object_each_goes_row_by_row(texts: list[str]) -> None:
    """Whatever row by row returns or raises, the chunk returns or raises too."""
    try:
        expected: list[Event] | type[BaseException] = _one_by_one(texts)
    except json.JSONDecodeError as error:
        expected = type(error)
    if isinstance(expected, list):
        assert events_from_stream_rows("s", _rows(texts)) == expected
    else:
        with pytest.raises(expected):
            events_from_stream_rows("s", _rows(texts))


def test_the_events_of_a_chunk_share_their_data_keys_and_an_empty_chunk_is_no_events() -> None:
    events = events_from_stream_rows("s", _rows(['{"effect_id":"a"}', '{"effect_id":"b"}']))
    assert [event.data for event in events] == [{"effect_id": "a"}, {"effect_id": "b"}]
    first, second = (next(iter(event.data)) for event in events)
    assert first is second  # one key object for the chunk (the decoder's key memo)
    assert events_from_stream_rows("s", []) == []
