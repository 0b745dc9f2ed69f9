"""Canonical encoding and the hash chain are pinned by golden vectors: they can never drift silently."""

from __future__ import annotations

import json
import re
import sys
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jixu.errors import InvalidId, MalformedEvent, PayloadTooLarge
from jixu.ledger.encoding import MAX_INT_DIGITS, canonical_bytes, canonical_text, content_hash
from jixu.ledger.event import (
    GENESIS_HASH,
    NewEvent,
    compute_hash,
    envelope_text,
    prepare,
    seal,
)
from jixu.ledger.ids import is_valid_id, new_id

GOLDEN_VALUES: list[tuple[Any, str]] = [
    ({"b": 1, "a": [True, False, None], "c": {"z": "é", "y": 1.5}},
     '{"a":[true,false,null],"b":1,"c":{"y":1.5,"z":"é"}}'),
    ({"n": 2**70, "neg": -0.0, "big": 1e16, "small": 1e-7, "uni": "日本\u2028\n\"\\"},
     '{"big":1e+16,"n":1180591620717411303424,"neg":-0.0,"small":1e-07,"uni":"日本\u2028\\n\\"\\\\"}'),
    ({"": [], "A": {}, "a": 0.1, "é": -12}, '{"":[],"A":{},"a":0.1,"é":-12}'),
]

# (id, type, data_json, meta_json) sealed into stream "threads/golden" at 2026-01-02T03:04:0{seq}Z.
GOLDEN_EVENTS = [
    ("01JD0000000000000000000001", "tool.requested",
     '{"args":{"to":"a@example.com"},"effect_id":"e1","name":"send_email"}', '{"actor":"alice"}',
     "ead7164bd0d4d54cf3e433c0c4b8deb383b4cf9fe4035e874ffefa09b6369ced"),
    ("01JD0000000000000000000002", "tool.dispatched", '{"attempt":1,"effect_id":"e1"}', "{}",
     "2945bc2bfe4d28f5ce8810e942180fbbc631fd2ed7442600504fc91514d23707"),
    ("01JD0000000000000000000003", "tool.completed",
     '{"attempt":1,"effect_id":"e1","result":"Sent to 日本"}', "{}",
     "6579b9d1e46d5d9aa17b64f27bb3e4398fc7eb1d444a1952e5d9ea49d32ceea3"),
]


@pytest.mark.parametrize(("value", "expected"), GOLDEN_VALUES)
def test_canonical_encoding_matches_golden_bytes(value: Any, expected: str) -> None:
    assert canonical_text(value) == expected
    assert canonical_bytes(value) == expected.encode("utf-8")


def test_golden_event_chain_hashes_are_fixed() -> None:
    prev = GENESIS_HASH
    for seq, (event_id, event_type, data_json, meta_json, expected) in enumerate(GOLDEN_EVENTS, start=1):
        digest = compute_hash(id=event_id, stream="threads/golden", seq=seq, type=event_type,
                              data_json=data_json, meta_json=meta_json,
                              recorded_at=f"2026-01-02T03:04:0{seq}.000000Z", prev_hash=prev)
        assert digest == expected, f"hash of golden event {seq} drifted"
        prev = digest


def test_sealing_parsed_payloads_reproduces_the_golden_hashes() -> None:
    prev = GENESIS_HASH
    for seq, (event_id, event_type, data_json, meta_json, expected) in enumerate(GOLDEN_EVENTS, start=1):
        prepared = prepare(NewEvent(event_type, json.loads(data_json), json.loads(meta_json), event_id))
        row = seal(prepared, stream="threads/golden", seq=seq, prev_hash=prev,
                   recorded_at=f"2026-01-02T03:04:0{seq}.000000Z")
        assert row.hash == expected
        assert row.to_event().computed_hash() == expected
        prev = row.hash


def test_envelope_fast_path_equals_the_general_canonical_encoder() -> None:
    data = {"z": [1, 2.5, "ü"], "a": None}
    meta = {"actor": "bob", "correlation_id": "c"}
    fast = envelope_text(id="01JD0000000000000000000009", stream="s/1", seq=7, type="x.y",
                         data_json=canonical_text(data), meta_json=canonical_text(meta),
                         recorded_at="2026-01-02T03:04:05.000006Z", prev_hash=GENESIS_HASH)
    general = canonical_text({"id": "01JD0000000000000000000009", "stream": "s/1", "seq": 7, "type": "x.y",
                              "data": data, "meta": meta, "recorded_at": "2026-01-02T03:04:05.000006Z",
                              "prev_hash": GENESIS_HASH})
    assert fast == general


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_canonical_text_round_trips_and_is_a_fixed_point(value: Any) -> None:
    try:
        text = canonical_text(value)
    except MalformedEvent:
        # Only strings with lone surrogates are refused among generated values.
        assert "\\ud" in json.dumps(value) or "\\udc" in json.dumps(value)
        return
    assert canonical_text(json.loads(text)) == text


@given(st.dictionaries(st.text(max_size=5), st.integers(), max_size=6))
def test_key_order_of_the_input_does_not_change_the_bytes(value: dict[str, int]) -> None:
    reordered = dict(reversed(list(value.items())))
    assert canonical_text(reordered) == canonical_text(value)


@pytest.mark.parametrize("bad", [
    {"x": float("nan")}, {"x": float("inf")}, {"x": (1, 2)}, {"x": {1, 2}}, {1: "int key"},
    {"x": b"bytes"}, {"x": "\ud800"}, {"x": object()},
])
def test_non_json_values_are_refused_with_a_typed_error(bad: Any) -> None:
    with pytest.raises(MalformedEvent):
        canonical_text(bad)


def test_integers_of_up_to_4300_digits_are_stored_exactly_and_longer_ones_are_refused() -> None:
    assert MAX_INT_DIGITS == sys.int_info.default_max_str_digits == 4300
    widest = 10**MAX_INT_DIGITS - 1
    assert canonical_text({"x": widest, "y": -widest}) == f'{{"x":{widest},"y":-{widest}}}'
    for value, where in (({"x": 10**5000}, "data.x"), ({"x": [1, {"y": -(10**4300)}]}, "data.x[1].y")):
        with pytest.raises(MalformedEvent, match=rf"^integer at {re.escape(where)} has more than 4300 digits; "
                                                 "store it as a string$") as info:
            canonical_text(value, path="data")
        assert info.value.details == {"path": where}


@pytest.mark.parametrize("limit", [0, 10_000])
def test_an_integer_over_4300_digits_is_refused_even_where_the_interpreter_would_write_it(
    limit: int,
) -> None:
    """Another process, at the default limit, could not read such an event back."""
    before = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        with pytest.raises(MalformedEvent, match=r"integer at \$\.n\[2\] has more than 4300 digits"):
            canonical_text({"n": [1, "9" * 5000, 10**4300]})
        assert canonical_text({"n": "9" * 5000}) == f'{{"n":"{"9" * 5000}"}}'  # digits in a string are a string
    finally:
        sys.set_int_max_str_digits(before)


def test_content_hash_is_sha256_of_canonical_bytes() -> None:
    assert content_hash({"b": 1, "a": 2}) == content_hash({"a": 2, "b": 1})
    assert content_hash({}) == "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"


@pytest.mark.parametrize(("event", "error"), [
    (NewEvent("Tool.Requested"), MalformedEvent),
    (NewEvent("tool"), MalformedEvent),
    (NewEvent("tool.requested", id="not-a-ulid"), InvalidId),
    (NewEvent("tool.requested", data=[1, 2]), MalformedEvent),  # type: ignore[arg-type]
    (NewEvent("tool.requested", meta="x"), MalformedEvent),  # type: ignore[arg-type]
    (NewEvent("tool.requested", {"blob": "x" * 2048}), PayloadTooLarge),
])
def test_prepare_rejects_bad_events(event: NewEvent, error: type[Exception]) -> None:
    with pytest.raises(error):
        prepare(event, max_payload_bytes=1024)


def test_new_ids_are_valid_unique_and_time_ordered() -> None:
    ids = [new_id() for _ in range(5000)]
    assert all(is_valid_id(i) for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


def test_ids_made_within_one_millisecond_count_up_by_one_across_every_carry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Within a millisecond only the last characters are written again; the carry out of them writes the
    whole random part (the clock is held still, and the random part starts just below carries)."""
    import time

    from jixu.ledger import ids

    def decoded(text: str) -> int:
        value = 0
        for char in text:
            value = value * 32 + ids._ALPHABET.index(char)
        return value

    monkeypatch.setattr(time, "time_ns", lambda: 1_767_225_600_000 * 1_000_000)
    for start in (1020, (1 << 20) - 3, (1 << 79) - 2):
        monkeypatch.setattr(ids.os, "urandom", lambda count, start=start: (start << 1).to_bytes(count, "big"))
        monkeypatch.setattr(ids, "_last_ms", -1)
        made = [ids.new_id() for _ in range(8)]
        assert {value[:10] for value in made} == {ids._encode(1_767_225_600_000, 10)}
        assert [decoded(value[10:]) for value in made] == list(range(start, start + 8))
        assert made == sorted(made) and all(is_valid_id(value) for value in made)


def test_an_id_carries_the_millisecond_it_was_made_in() -> None:
    import time

    from jixu.ledger.ids import _ALPHABET

    for _ in range(50):  # across many millisecond boundaries (the time part is kept per millisecond)
        before = time.time_ns() // 1_000_000
        made = new_id()
        after = time.time_ns() // 1_000_000
        stamp = 0
        for char in made[:10]:
            stamp = stamp * 32 + _ALPHABET.index(char)
        assert before <= stamp <= after
        time.sleep(0.0007)


def test_values_nested_too_deeply_or_circular_are_refused_with_a_typed_error() -> None:
    deep: Any = "leaf"
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(MalformedEvent, match="nested too deeply"):
        canonical_text({"deep": deep})
    circular: dict[str, Any] = {}
    circular["self"] = circular
    with pytest.raises(MalformedEvent, match="nested too deeply"):
        canonical_text(circular)
    # The refusal leaves the encoder usable.
    assert canonical_text({"b": [1.5, None], "a": True}) == '{"a":true,"b":[1.5,null]}'


loose_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=3) | st.binary(max_size=2)
    | st.just(object()),
    lambda children: (st.lists(children, max_size=3) | st.tuples(children)
                      | st.dictionaries(st.text(max_size=3) | st.integers(), children, max_size=3)),
    max_leaves=12,
)


@given(loose_values)
def test_the_fast_plain_json_check_accepts_exactly_what_the_path_naming_check_accepts(value: Any) -> None:
    from jixu.ledger.encoding import _check, _plain

    try:
        _check(value, "$")
    except MalformedEvent:
        assert not _plain(value)
    else:
        assert _plain(value)


@given(st.integers(min_value=0, max_value=(1 << 80) - 1), st.sampled_from([10, 16]))
def test_id_groups_are_crockford_base32_most_significant_first(value: int, length: int) -> None:
    from jixu.ledger.ids import _ALPHABET, _encode

    expected = "".join(_ALPHABET[(value >> (5 * (length - 1 - i))) & 31] for i in range(length))
    assert _encode(value, length) == expected


@pytest.mark.parametrize("meta, text", [
    ({"n": 1}, '{"n":1}'), ({"n": True}, '{"n":true}'), ({"n": "1"}, '{"n":"1"}'),
    ({"b": "x", "a": "y"}, '{"a":"y","b":"x"}'), ({"a": "y", "b": "x"}, '{"a":"y","b":"x"}'),
])
def test_remembered_meta_texts_never_mix_up_equal_keys_of_other_types(meta: dict[str, Any], text: str) -> None:
    from jixu.ledger.event import NewEvent, prepare

    for _ in range(2):  # the second time from the memo, when it keeps one
        assert prepare(NewEvent("a.b", {}, meta)).meta_json == text


def test_a_meta_that_cannot_be_stored_is_refused_every_time() -> None:
    from jixu.ledger.event import NewEvent, prepare

    for _ in range(2):
        with pytest.raises(MalformedEvent):
            prepare(NewEvent("a.b", {}, {"actor": "\ud800"}))


@given(st.text())
def test_the_utf8_size_of_a_text_is_the_length_of_its_encoding(text: str) -> None:
    from jixu.ledger.event import utf8_size

    try:
        encoded = text.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: never stored (canonical_text refuses it first)
        return
    assert utf8_size(text) == len(encoded)


@given(json_values)
def test_canonical_text_is_exactly_what_the_public_json_encoder_writes(value: Any) -> None:
    try:
        text = canonical_text(value)
    except MalformedEvent:
        return  # a lone surrogate (see above)
    assert text == json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))
