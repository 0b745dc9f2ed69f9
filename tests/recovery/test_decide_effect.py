"""One walk decides every effect (issue 21), and its entry points agree with it and with the reference rules.

``decide_effect(eid, events)`` must be exactly ``analyze(events, check_links=False).decisions.get(eid)``;
``ordinary_decision_text`` (the settled decision's text, written without building the decision) must be the
text of that decision whenever it answers. Both, and ``analyze`` itself, must follow ``reference.py``: the
rules stated a second time, plainly, as the independent oracle. The walk's first stage (the ordinary
lifecycle, answered at once) must answer as its second stage (every rule) does.

The generated lifecycles are mostly near the ordinary ``requested -> dispatched -> completed`` (or
determinate ``failed``) shape, with every field the first stage looks at perturbed: other kinds, effect
ids, attempts, names, keys, args hashes (right, wrong, unhashable args), semantics, approval flags, receipts
without a result, indeterminate failures, odd data and types.
"""

from __future__ import annotations

import dataclasses
from typing import Any
from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jixu.ledger.encoding import content_hash
from jixu.ledger.event import Event
from jixu.recovery import RecoveryResolver, analyze, resolver
from jixu.recovery.decision_text import encode_decision, ordinary_decision_text
from jixu.recovery.resolver import _args_hash_ok, decide_effect
from tests.helpers import examples
from tests.recovery import reference

EID = "e1"
ODD: tuple[Any, ...] = (None, 0, 1, 2, True, False, "", "x", "e1", "e2", 1.0, {}, [], {"a": 1})
ARGS: tuple[Any, ...] = ({}, {"a": 1}, {"s": "é", "n": None, "b": True}, {"f": 1.5}, {"l": [1, {"x": 2}]},
                         {"bad": "\ud800"}, {"big": 10**5000}, [], "text", None)


def hash_of(args: Any) -> Any:
    try:
        return content_hash(args)
    except Exception:  # unhashable args get some other claimed hash
        return "0" * 64


def maybe(draw: st.DrawFn, good: Any) -> Any:
    """``good`` most of the time, else an odd value or the key left out (``KeyError`` marker)."""
    choice = draw(st.integers(0, 79))
    if choice < 76:
        return good
    if choice == 76:
        return KeyError
    return draw(st.sampled_from(ODD))


def build(data: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in data.items() if v is not KeyError}


@st.composite
def lifecycle(draw: st.DrawFn) -> list[Event]:
    kind = draw(st.sampled_from(["tool", "model", "remote.deploy"]))
    args = draw(st.sampled_from(ARGS[:3] if draw(st.integers(0, 3)) else ARGS))
    good_hash = hash_of(args)
    claimed = draw(st.sampled_from([good_hash] * 8 + ["f" * 64, 7]))
    name, key = "do", "idem"
    intent = build({
        "effect_id": maybe(draw, EID), "name": maybe(draw, name), "args": args, "args_hash": claimed,
        "semantics": maybe(draw, draw(st.sampled_from(["read_only", "idempotent", "unsafe", "other"]))),
        "idempotency_key": maybe(draw, key), "requires_approval": maybe(draw, False)})
    dispatch = build({
        "effect_id": maybe(draw, EID), "attempt": maybe(draw, 1), "name": maybe(draw, name),
        "idempotency_key": maybe(draw, key), "args_hash": maybe(draw, claimed)})
    failed = draw(st.booleans())
    if failed:
        receipt = build({"effect_id": maybe(draw, EID), "attempt": maybe(draw, 1), "error": maybe(draw, {"m": 1}),
                         "indeterminate": maybe(draw, False), "name": draw(st.sampled_from([KeyError, name, "y"]))})
    else:
        receipt = build({"effect_id": maybe(draw, EID), "attempt": maybe(draw, 1), "result": maybe(draw, None),
                         "args_hash": draw(st.sampled_from([KeyError, KeyError, claimed, "x"]))})
    types = [f"{kind}.requested", f"{kind}.dispatched", f"{kind}.{'failed' if failed else 'completed'}"]
    for i in range(3):
        if draw(st.integers(0, 30)) == 0:
            types[i] = draw(st.sampled_from(["tool.requested", "tool.dispatched", "tool.completed", "model.completed",
                                             "tool.approved", "thread.created", "requested", ".requested"]))
    datas: list[Any] = [intent, dispatch, receipt]
    if draw(st.integers(0, 15)) == 0:
        datas[draw(st.integers(0, 2))] = draw(st.sampled_from([None, [], "x"]))
    events = [Event(id=f"ev{i}", stream="thread/p", seq=draw(st.sampled_from([i + 1, i + 1, i + 1, "x", None])),
                    type=types[i], data=datas[i], meta={}, recorded_at="2026-01-01T00:00:00.000000Z",
                    prev_hash="0" * 64, hash=f"{i}" * 64)
              for i in range(3)]
    shape = draw(st.integers(0, 19))
    if shape == 0:
        events = events[:draw(st.integers(1, 2))]
    elif shape == 1:
        events = [*events, events[-1]]
    elif shape == 2:
        events = [events[0], events[2], events[1]]
    return events


def ordinary_is_plain(text: str) -> bool:
    return text.count('"') == 22 and "\\" not in text and text.isprintable()


@settings(max_examples=examples(150), deadline=None)
@given(st.text(min_size=1, max_size=6), st.text(max_size=6), st.text(min_size=1, max_size=6),
       st.sampled_from(["tool", "model", "t\"x", "mé"]))
def test_the_ordinary_text_of_any_names_is_the_decisions_text(effect_id: str, name: str, key: str,
                                                              kind: str) -> None:
    args = {"q": name}
    data = {"effect_id": effect_id, "name": name, "args": args, "args_hash": content_hash(args),
            "semantics": "idempotent", "idempotency_key": key}
    events = [Event("i" + name, "s", 4, f"{kind}.requested", data, {}, "t", "0" * 64, "1" * 64),
              Event("d", "s", 5, f"{kind}.dispatched", {"effect_id": effect_id, "attempt": 1}, {}, "t", "1" * 64,
                    "2" * 64),
              Event("r", "s", 9, f"{kind}.failed", {"effect_id": effect_id, "attempt": 1, "error": {},
                                                   "indeterminate": False}, {}, "t", "2" * 64, "3" * 64)]
    decision = decide_effect(effect_id, events)
    assert decision is not None and decision.reason == "failed"
    text = ordinary_decision_text(effect_id, events[0], events[1], events[2])
    expected = encode_decision(decision)
    assert text == expected if ordinary_is_plain(expected) else text is None


@st.composite
def in_flight(draw: st.DrawFn) -> list[Event]:
    """An intent, alone or with one dispatch: mostly well formed, every field the fast path reads perturbed."""
    args = draw(st.sampled_from(ARGS[:3] if draw(st.integers(0, 3)) else ARGS))
    claimed = draw(st.sampled_from([hash_of(args)] * 6 + ["f" * 64, 7]))
    intent = build({
        "effect_id": EID, "name": draw(st.sampled_from(["do"] * 6 + [KeyError, 3])), "args": args,
        "args_hash": claimed, "semantics": draw(st.sampled_from(["read_only", "idempotent", "unsafe", "other", 1])),
        "idempotency_key": draw(st.sampled_from(["idem"] * 6 + [KeyError, None])),
        "requires_approval": draw(st.sampled_from([False, False, KeyError, True, 0, None]))})
    dispatch = build({
        "effect_id": EID, "attempt": draw(st.sampled_from([1, 1, 1, 2, 0, True, "1", KeyError])),
        "name": draw(st.sampled_from([KeyError, KeyError, "do", "other", 5])),
        "idempotency_key": draw(st.sampled_from([KeyError, KeyError, "idem", "other"])),
        "args_hash": draw(st.sampled_from([KeyError, KeyError, claimed, "x"]))})
    kind = draw(st.sampled_from(["tool", "model"]))
    types = [draw(st.sampled_from([f"{kind}.requested"] * 8 + [f"{kind}.dispatched", "tool.parked"])),
             draw(st.sampled_from([f"{kind}.dispatched"] * 8 + ["model.dispatched", f"{kind}.approved"]))]
    events = [Event(id=f"ev{i}", stream="thread/p", seq=draw(st.sampled_from([i + 1, i + 1, "x"])), type=types[i],
                    data=data, meta={}, recorded_at="2026-01-01T00:00:00.000000Z", prev_hash="0" * 64,
                    hash=f"{i}" * 64)
              for i, data in enumerate([intent, dispatch])]
    return events[:draw(st.integers(1, 2))]


@st.composite
def free_history(draw: st.DrawFn) -> list[Event]:
    """One effect's events in any order and number, each well formed or nearly: retries, approvals, receipts
    and resolutions where they fit and where they do not (every ordering rule, rules 7-11 too)."""
    args = {"q": draw(st.integers(0, 2))}
    intent = {"effect_id": EID, "name": "do", "args": args, "args_hash": content_hash(args),
              "semantics": draw(st.sampled_from(["unsafe", "idempotent", "read_only"])), "idempotency_key": "idem",
              "requires_approval": draw(st.booleans())}
    bodies = {
        "requested": lambda: intent,
        "parked": lambda: {"effect_id": EID, "reason": "approval"},
        "approved": lambda: {"effect_id": EID, "actor": "op"},
        "denied": lambda: {"effect_id": EID, "actor": "op", "note": draw(st.sampled_from([None, "no"] * 4 + [3]))},
        "dispatched": lambda: {"effect_id": EID, "attempt": draw(st.sampled_from([1, 1, 2, 3])),
                               **draw(st.sampled_from([{}] * 5 + [{"idempotency_key": "idem"}, {"name": "x"}]))},
        "completed": lambda: {"effect_id": EID, "attempt": draw(st.sampled_from([1, 1, 2])), "result": None},
        "failed": lambda: {"effect_id": EID, "attempt": draw(st.sampled_from([1, 2, None, KeyError])),
                           "error": {}, "indeterminate": draw(st.booleans())},
        "outcome_resolved": lambda: {"effect_id": EID,
                                     "resolution": draw(st.sampled_from(["occurred", "not_occurred"] * 4 + ["no"])),
                                     "resolution_id": draw(st.sampled_from(["r1", "r2"])), "actor": "op",
                                     **draw(st.sampled_from([{}, {"result": 1, "evidence": {"a": 1}}]))},
    }
    if draw(st.booleans()):
        # Near a history the rules allow, so that rules 8, 10 and 11 (and the states) are reached too.
        phases = list(draw(st.sampled_from(NEAR_VALID)))
    else:
        later = sorted(bodies) if draw(st.integers(0, 5)) == 0 else sorted(set(bodies) - {"requested"})
        phases = ["requested", *draw(st.lists(st.sampled_from(later), max_size=6))]
        if draw(st.integers(0, 4)) == 0:
            phases = draw(st.permutations(phases))
    kinds = [draw(st.sampled_from(["tool"] * 30 + ["model"])) for _ in phases]
    events, attempt = [], 0
    for i, phase in enumerate(phases):
        data = build(bodies[phase]())
        if phase == "dispatched" and draw(st.integers(0, 3)):
            attempt += 1
            data["attempt"] = attempt  # mostly the next attempt
        elif phase in ("completed", "failed") and attempt and draw(st.integers(0, 3)):
            data["attempt"] = attempt  # mostly the latest one
        events.append(Event(f"ev{i}", "thread/p", i + 1, f"{kinds[i]}.{phase}", data, {}, "t", "0" * 64, "1" * 64))
    return events


NEAR_VALID = [
    ("requested", "dispatched", "dispatched"),
    ("requested", "dispatched", "failed", "dispatched", "completed"),
    ("requested", "dispatched", "outcome_resolved"),
    ("requested", "dispatched", "outcome_resolved", "outcome_resolved"),
    ("requested", "dispatched", "outcome_resolved", "dispatched"),
    ("requested", "outcome_resolved"),
    ("requested", "dispatched", "completed", "outcome_resolved"),
    ("requested", "parked", "approved", "dispatched", "completed"),
    ("requested", "parked", "denied", "denied"),
    ("requested", "approved", "dispatched", "failed", "failed"),
    ("requested", "dispatched", "completed", "completed"),
]


groups = st.one_of(lifecycle(), in_flight(), free_history())


@settings(max_examples=examples(300), deadline=None)
@given(groups)
def test_the_resolver_follows_the_reference_rules(events: list[Event]) -> None:
    analysis = analyze(events, check_links=False)
    expected = reference.analyze(events, check_links=False)
    assert analysis.decisions == expected.decisions
    assert analysis.unattributed_events == expected.unattributed_events
    assert dataclasses.replace(analysis) == analysis  # every slot filled (from_decisions fills them directly)


@settings(max_examples=examples(300), deadline=None)
@given(groups)
def test_decide_effect_equals_the_general_resolver(events: list[Event]) -> None:
    expected = analyze(events, check_links=False).decisions.get(EID)
    assert decide_effect(EID, events) == expected
    assert expected == reference.analyze(events, check_links=False).decisions.get(EID)


@settings(max_examples=examples(300), deadline=None)
@given(groups)
def test_the_first_stage_answers_as_the_second_does(events: list[Event]) -> None:
    """Stage 1 of the walk (the ordinary lifecycle) answers at once; stage 2 alone must answer the same."""
    fast = analyze(events, check_links=False)
    with mock.patch.object(resolver, "_walk", lambda group, types, owner=None: resolver._walk_all(group, types,
                                                                                                 owner)):
        walked = analyze(events, check_links=False)
    assert fast == walked


@settings(max_examples=examples(300), deadline=None)
@given(st.one_of(lifecycle(), free_history().filter(lambda events: len(events) == 3)))
def test_the_ordinary_text_is_the_decisions_text(events: list[Event]) -> None:
    if len(events) != 3:
        return
    text = ordinary_decision_text(EID, events[0], events[1], events[2])
    decision = reference.analyze(events, check_links=False).decisions.get(EID)
    ordinary = (decision is not None and decision.state == "completed" and decision.reason in ("succeeded", "failed")
                and type(events[0].seq) is int and type(events[2].seq) is int)
    if text is not None:
        assert ordinary and decision is not None
        assert text == encode_decision(decision)
    elif ordinary:
        # Declined only when the text needs escaping (the caller then writes it with the encoder).
        assert decision is not None and not ordinary_is_plain(encode_decision(decision))
    if ordinary:
        assert decision is not None and (decision.attempts, decision.resolution) == (1, None)
        assert decision.evidence == (events[0].id, events[1].id, events[2].id)


def ordinary_events(kind: str = "tool", receipt: str = "completed") -> list[Event]:
    args = {"q": "x", "n": 3}
    data = {"effect_id": EID, "name": "do", "args": args, "args_hash": content_hash(args), "semantics": "read_only",
            "idempotency_key": "idem", "requires_approval": False}
    receipt_data: dict[str, Any] = ({"effect_id": EID, "attempt": 1, "result": 1} if receipt == "completed" else
                                    {"effect_id": EID, "attempt": 1, "error": {}, "indeterminate": False})
    return [Event("a", "thread/p", 1, f"{kind}.requested", data, {}, "t", "0" * 64, "1" * 64),
            Event("b", "thread/p", 2, f"{kind}.dispatched", {"effect_id": EID, "attempt": 1}, {}, "t", "1" * 64,
                  "2" * 64),
            Event("c", "thread/p", 3, f"{kind}.{receipt}", receipt_data, {}, "t", "2" * 64, "3" * 64)]


@pytest.mark.parametrize("receipt", ["completed", "failed"])
def test_the_first_stage_decides_the_ordinary_lifecycle_and_its_prefixes(receipt: str) -> None:
    events = ordinary_events(receipt=receipt)
    with mock.patch.object(resolver, "_walk_all", None):  # stage 2 must not be needed
        intent_only = analyze(events[:1], check_links=False).decisions[EID]
        in_flight = analyze(events[:2], check_links=False).decisions[EID]
        settled = decide_effect(EID, events)
        text = ordinary_decision_text(EID, *events)
    assert (intent_only.state, intent_only.reason, intent_only.retry_safe) == ("not_dispatched", "intent_only", True)
    assert (in_flight.state, in_flight.reason, in_flight.retry_safe, in_flight.attempts) == (
        "unknown", "dispatched_without_receipt", True, 1)
    assert settled is not None
    assert (settled.state, settled.reason, settled.evidence) == (
        "completed", "succeeded" if receipt == "completed" else "failed", ("a", "b", "c"))
    assert text == encode_decision(settled)


@pytest.mark.parametrize("second, third", [
    ("tool.parked", ("tool.denied", {})),  # completed (denied), but no ordinary lifecycle
    ("tool.approved", ("tool.failed", {"error": {}, "indeterminate": False})),  # rejected before dispatch
    ("tool.dispatched", ("tool.failed", {"attempt": 1, "error": {}, "indeterminate": True})),  # unknown
])
def test_only_the_ordinary_lifecycle_has_an_ordinary_text(second: str, third: tuple[str, dict[str, Any]]) -> None:
    first = ordinary_events()[0]
    first = dataclasses.replace(first, data={**first.data, "requires_approval": second != "tool.dispatched"})
    data = {"effect_id": EID, "reason": "approval"} if second == "tool.parked" else {"effect_id": EID, "attempt": 1}
    events = [first, Event("b", "thread/p", 2, second, data, {}, "t", "1" * 64, "2" * 64),
              Event("c", "thread/p", 3, third[0], {"effect_id": EID, **third[1]}, {}, "t", "2" * 64, "3" * 64)]
    decision = decide_effect(EID, events)
    assert decision is not None and decision.state != "corrupt"
    assert ordinary_decision_text(EID, *events) is None


def test_decide_effect_on_its_own_group_skips_the_grouping_and_ordinary_text_builds_no_decision() -> None:
    events = ordinary_events()
    expected = analyze(events, check_links=False).decisions[EID]
    with mock.patch.object(RecoveryResolver, "analyze", None):
        assert decide_effect(EID, events) == expected
    with mock.patch.object(resolver, "_decision", None), mock.patch.object(resolver, "EffectDecision", None):
        assert ordinary_decision_text(EID, *events) == encode_decision(expected)


@pytest.mark.parametrize("effect_id", ["", "e2", None, 1])
def test_events_of_no_or_another_effect_are_asked_of_analyze(effect_id: Any) -> None:
    events = ordinary_events()
    assert decide_effect(effect_id, events) is None
    assert ordinary_decision_text(effect_id, *events) is None
    mixed = [events[0], dataclasses.replace(events[1], data={"effect_id": "e2", "attempt": 1}), events[2]]
    assert decide_effect(EID, mixed) == analyze(mixed, check_links=False).decisions[EID]
    assert decide_effect(EID, mixed) == reference.analyze(mixed, check_links=False).decisions[EID]
    assert ordinary_decision_text(EID, *mixed) is None
    assert decide_effect(EID, []) is None


def test_the_type_memo_is_bounded_and_a_full_memo_changes_no_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    kept = dict(resolver._TYPES)
    try:
        resolver._TYPES.clear()
        monkeypatch.setattr(resolver, "_TYPES_KEPT", 2)
        events = ordinary_events(kind="fresh")
        first = analyze(events, check_links=False)  # three new types, room for two: the rest in a copy
        assert len(resolver._TYPES) == 2
        assert first.decisions == reference.analyze(events, check_links=False).decisions
        other = ordinary_events(kind="other")
        assert decide_effect(EID, other) == reference.analyze(other, check_links=False).decisions[EID]
        assert ordinary_decision_text(EID, *other) == encode_decision(decide_effect(EID, other))  # type: ignore[arg-type]
        assert len(resolver._TYPES) == 2
    finally:
        resolver._TYPES.clear()
        resolver._TYPES.update(kept)


@settings(max_examples=examples(150), deadline=None)
@given(st.dictionaries(st.text(max_size=4), st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=6),
                                                       st.floats(allow_nan=True)), max_size=4))
def test_the_flat_args_hash_equals_content_hash(args: dict[str, Any]) -> None:
    try:
        claimed = content_hash(args)
    except Exception:  # NaN, a lone surrogate: content_hash refuses, so the args cannot be hashed
        assert _args_hash_ok({"args": args, "args_hash": "0" * 64}) is None
        return
    assert _args_hash_ok({"args": args, "args_hash": claimed}) is True
    assert _args_hash_ok({"args": args, "args_hash": "0" * 64}) is False
