"""Reducer version 4: settled decisions kept as compact text, the checkpoint digest v2, the cheap status.

A long thread's state holds one settled decision per model or tool call; it is
kept as compact JSON text and decoded on access. These tests pin that the
compact form changes nothing anyone can observe: decisions round-trip exactly,
and a thread reopened from its checkpoint equals its full replay.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jixu.recovery.decision_text as decision_text_module
import jixu.threads.projection as projection_module
from jixu.ledger import MemoryStore, NewEvent, SQLiteStore, content_hash
from jixu.ledger.projection import checkpoint_digest
from jixu.recovery import EffectDecision, decide_effect
from jixu.recovery.decision_text import _encode_decision_json, decode_decisions
from jixu.threads import Agent, Harness, ScriptedModel, ToolCall, tool
from jixu.threads.log import ThreadLog, stream_of
from jixu.threads.projection import (
    REDUCER_VERSION,
    SettledDecisions,
    ThreadProjection,
    decode_decision,
    encode_decision,
)
from tests.helpers import examples


@tool(semantics="unsafe")
def charge(amount: int) -> dict[str, Any]:
    """Charge a card (the test's unsafe tool)."""
    return {"charged": amount, "note": "ünïcode ✓"}


def _agent() -> Agent:
    script = [ToolCall("charge", {"amount": 1}), ToolCall("charge", {"amount": 2}), "done",
              ToolCall("charge", {"amount": 3}), "done again"]
    return Agent("compact", ScriptedModel(script), tools=[charge], max_steps=8)


def test_a_decision_round_trips_through_its_compact_text() -> None:
    decision = EffectDecision("e1", "tool", "charge", "unknown", "resolved", ("a", "b"), False, "unsafe", "k-1",
                              "0" * 64, 2, {"resolution": "occurred", "note": "ünï", "evidence": {"x": 1.5}}, 3, 9)
    text = encode_decision(decision)
    assert decode_decision(text) == decision
    settled = SettledDecisions()
    settled["e1"] = decision
    assert "e1" in settled and len(settled) == 1 and settled["e1"] == decision
    assert settled.encoded() == {"e1": text}
    # A fork record or checkpoint written by reducer 3 held decision dicts: still readable.
    assert SettledDecisions.from_dump({"e1": decision.to_dict()}) == settled
    assert SettledDecisions.from_dump({"e1": text}) == settled


_PLAIN = st.sampled_from(["", "tool", "noop", "completed", "succeeded", "read_only", "jixu:01ABC", "0" * 64,
                          "\x7f", "ü✓", "\ud800", "\u2028"])
_AWKWARD = st.sampled_from(['a"b', "a\\b", "tab\there", "\x00", "\x1f", "\n"]) | st.text()


def _mostly(usual: st.SearchStrategy[Any], rare: st.SearchStrategy[Any], odds: int = 20) -> st.SearchStrategy[Any]:
    """``usual`` about ``odds`` times as often as ``rare``."""
    return st.integers(0, odds).flatmap(lambda i: rare if i == 0 else usual)


_TEXTS = _mostly(_PLAIN, _AWKWARD)  # mostly text that needs no escaping: the formatted path
_OPTIONAL_TEXT = _mostly(_TEXTS, st.none())
_SEQ = _mostly(st.integers(min_value=-3, max_value=10**20), st.sampled_from([None, True]))


@settings(max_examples=examples(300), deadline=None)
@given(_TEXTS, _TEXTS, _OPTIONAL_TEXT, _TEXTS, _TEXTS, st.lists(_TEXTS, max_size=4).map(tuple) | st.just(()),
       st.booleans(), _OPTIONAL_TEXT, _OPTIONAL_TEXT, _OPTIONAL_TEXT, _mostly(st.integers(0, 5), st.just(False)),
       _mostly(st.none(), st.just({"resolution": "occurred", "note": "n"}), 5), _SEQ, _SEQ.filter(lambda v: v is not None))
def test_the_formatted_compact_text_equals_the_json_encoders(
        effect_id: str, kind: str, name: str | None, state: Any, reason: str, evidence: tuple[str, ...],
        retry_safe: bool, semantics: str | None, key: str | None, args_hash: str | None, attempts: int,
        resolution: dict[str, Any] | None, requested_seq: int | None, last_seq: int) -> None:
    decision = EffectDecision(effect_id, kind, name, state, reason, evidence, retry_safe, semantics, key, args_hash,
                              attempts, resolution, requested_seq, last_seq)
    text = encode_decision(decision)
    assert text == _encode_decision_json(decision)
    assert json.loads(text)[0] == effect_id
    assert decode_decisions([text, text]) == [decode_decision(text)] * 2 == [decision] * 2


@settings(max_examples=examples(400), deadline=None)
@given(st.lists(st.sampled_from(['"', "\\", "a", "0", " ", "~", "\x00", "\x1f", "\x7f", "\n", "ü", "\u2028"])
                | st.characters(), max_size=40).map("".join), st.integers(0, 40))
def test_the_escaping_check_answers_as_isprintable_does(text: str, quotes: int) -> None:
    """The one-pass check of an ASCII text gives the answer of the plain checks it replaced."""
    expected = text.count('"') == quotes and "\\" not in text and text.isprintable()
    assert decision_text_module._needs_no_escaping(text, quotes) is expected
    padded = '"' * 40 + text  # past the precomputed quote strings too
    assert decision_text_module._needs_no_escaping(padded, quotes + 40) is (
        padded.count('"') == quotes + 40 and "\\" not in padded and padded.isprintable())


@pytest.mark.parametrize("text", ['["e1"]', "[1, 2", '{"a": 1}', "", '["e","k","n","s","r","ev",false,null,null,null,1,'
                                  'null,1,2]'])
def test_decoding_many_decisions_answers_an_odd_text_as_decoding_one_does(text: str) -> None:
    good = encode_decision(EffectDecision("e1", "tool", "t", "completed", "succeeded", ("a",), False, "unsafe", "k",
                                          "0" * 64, 1, None, 1, 3))
    try:
        expected: Any = decode_decision(text)
    except Exception as error:  # whatever decoding one raises, decoding many raises too
        with pytest.raises(type(error)):
            decode_decisions([good, text])
    else:
        assert decode_decisions([good, text]) == [decode_decision(good), expected]


def test_an_ordinary_decision_takes_the_formatted_path(monkeypatch: pytest.MonkeyPatch) -> None:
    decision = EffectDecision("01M8NQ6NFJ3JHM58G231H9REW0", "tool", "noop", "completed", "succeeded",
                              ("a", "b", "c"), False, "read_only", "jixu:01M8", "4" * 64, 1, None, 5, 7)
    expected = _encode_decision_json(decision)
    monkeypatch.setattr(decision_text_module, "_encode_decision_json", None)  # the encoder must not be called
    text = encode_decision(decision)
    assert text == expected
    assert decode_decision(text) == decision


def test_the_reducer_writes_an_ordinary_decision_without_building_it(monkeypatch: pytest.MonkeyPatch) -> None:
    args = {"amount": 1}
    intent = {"effect_id": "e1", "name": "charge", "args": args, "args_hash": content_hash(args),
              "semantics": "unsafe", "idempotency_key": "k", "call_id": "c1"}
    new = [("tool.requested", intent), ("tool.dispatched", {"effect_id": "e1", "attempt": 1}),
           ("tool.completed", {"effect_id": "e1", "attempt": 1, "result": {"ok": True}})]
    store = MemoryStore()
    events = store.append("thread/t", [NewEvent(kind, data) for kind, data in new], 0)
    decision = decide_effect("e1", events)
    assert decision is not None
    monkeypatch.setattr(projection_module, "decide_effect", None)  # the general path must not be taken
    fast = ThreadProjection().initial()
    for event in events:
        fast = ThreadProjection().apply(fast, event)
    assert fast.settled.encoded() == {"e1": encode_decision(decision)}
    assert fast.settled["e1"] == decision and not fast.open_events
    assert [m["content"] for m in fast.messages] == ['{"ok": true}']


def test_reopen_from_the_checkpoint_equals_replay(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SQLiteStore(tmp_path / "t.db")
        harness = Harness(_agent(), store)
        thread = await harness.create_thread()
        await thread.send("go")
        online = await thread.wait()
        await thread.send("again")
        online = await thread.wait()
        assert online.status == "idle" and online.last_reply == "done again"
        checkpoint = store.read_checkpoint(stream_of(thread.thread_id), "thread")
        assert checkpoint is not None and checkpoint.reducer_version == REDUCER_VERSION == 11
        assert checkpoint.digest == checkpoint_digest(checkpoint.stream, checkpoint.name, checkpoint.seq,
                                                      checkpoint.reducer_version, checkpoint.head_hash,
                                                      checkpoint.state_json)
        stored = json.loads(checkpoint.state_json)["settled"]  # chunked (decision 0013); too few to seal one
        assert stored["chunks"] == []
        assert len(stored["tail"]) == 8 and all(isinstance(text, str) for text in stored["tail"].values())

        reopened = await Harness(_agent(), store).open_thread(thread.thread_id)
        assert reopened.checkpoint_status == "used"
        replayed = await reopened.replay()
        for state in (reopened.state(), replayed):
            assert state.effects == online.effects
            assert state.messages == online.messages and state.turns == online.turns
            assert state.status == online.status and state.seq == online.seq
        projection = ThreadProjection()
        fresh = projection.initial()
        for event in store.read(stream_of(thread.thread_id)):
            fresh = projection.apply(fresh, event)
        assert fresh.settled == reopened.log.state.settled
        assert projection.dump(fresh) == projection.dump(reopened.log.state)
        log = ThreadLog.load(store, thread.thread_id)
        assert log.status() == log.snapshot().status == "idle"
        store.close()

    asyncio.run(scenario())


def test_the_cheap_status_matches_the_snapshot_while_waiting(tmp_path: Path) -> None:
    async def scenario() -> None:
        store = SQLiteStore(tmp_path / "t.db")
        harness = Harness(_agent(), store)
        thread = await harness.create_thread()
        await thread.send("go")
        await thread.wait()
        # Leave an unsafe call dispatched without a receipt, as after a crash: the thread must wait.
        log = ThreadLog.load(store, thread.thread_id)
        turn_id, _fence = log.start_turn("more")
        args = {"amount": 9}
        log.append([
            NewEvent("tool.requested", {"effect_id": "eff-x", "name": "charge", "args": args,
                                        "args_hash": content_hash(args), "semantics": "unsafe",
                                        "idempotency_key": "k-x", "requires_approval": False,
                                        "turn_id": turn_id, "call_id": "c-x"}),
            NewEvent("tool.dispatched", {"effect_id": "eff-x", "attempt": 1, "idempotency_key": "k-x",
                                         "args_hash": content_hash(args)}),
        ])
        reopened = ThreadLog.load(store, thread.thread_id)
        assert reopened.status() == reopened.snapshot().status == "waiting"
        reopened.resolve("eff-x", "not_occurred")
        assert reopened.status() == reopened.snapshot().status
        store.close()

    asyncio.run(scenario())
