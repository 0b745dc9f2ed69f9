"""The RecoveryResolver's rules, one test per rule: every state, every reason, every flag."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

import pytest

from jixu.ledger.encoding import content_hash
from jixu.ledger.event import GENESIS_HASH, Event, NewEvent, prepare, seal
from jixu.recovery import (
    CORRUPTION_REASONS,
    DECISION_REASONS,
    RESOLUTIONS,
    STATES,
    Analysis,
    EffectDecision,
    RecoveryResolver,
    analyze,
)

Spec = tuple[str, dict[str, Any]]


# --- building histories -------------------------------------------------------------


def chain(specs: Iterable[Spec], *, start: int = 1, prev: str = GENESIS_HASH) -> list[Event]:
    """Properly hash-chained events from ``(type, data)`` pairs."""
    events: list[Event] = []
    for seq, (event_type, data) in enumerate(specs, start=start):
        row = seal(prepare(NewEvent(event_type, data)), stream="thread/t1", seq=seq, prev_hash=prev,
                   recorded_at="2026-01-01T00:00:00.000000Z")
        events.append(row.to_event())
        prev = row.hash
    return events


def requested(eid: str, *, kind: str = "tool", name: str = "refund", semantics: str = "unsafe",
              args: dict[str, Any] | None = None, requires_approval: bool | None = None,
              **extra: Any) -> Spec:
    args = {"order": 42} if args is None else args
    data: dict[str, Any] = {"effect_id": eid, "name": name, "args": args, "args_hash": content_hash(args),
                            "semantics": semantics, "idempotency_key": f"key-{eid}"}
    if requires_approval is not None:
        data["requires_approval"] = requires_approval
    data.update(extra)
    return f"{kind}.requested", data


def parked(eid: str, kind: str = "tool") -> Spec:
    return f"{kind}.parked", {"effect_id": eid, "reason": "needs approval"}


def approved(eid: str, kind: str = "tool") -> Spec:
    return f"{kind}.approved", {"effect_id": eid, "actor": "ops@example.com"}


def denied(eid: str, kind: str = "tool") -> Spec:
    return f"{kind}.denied", {"effect_id": eid, "actor": "ops@example.com", "note": "no"}


def dispatched(eid: str, attempt: int = 1, kind: str = "tool", **extra: Any) -> Spec:
    return f"{kind}.dispatched", {"effect_id": eid, "attempt": attempt, **extra}


def completed(eid: str, attempt: int = 1, kind: str = "tool") -> Spec:
    return f"{kind}.completed", {"effect_id": eid, "attempt": attempt, "result": {"ok": True}}


def failed(eid: str, attempt: int | None = 1, *, indeterminate: bool = False, kind: str = "tool") -> Spec:
    data: dict[str, Any] = {"effect_id": eid, "error": {"message": "boom"}, "indeterminate": indeterminate}
    if attempt is not None:
        data["attempt"] = attempt
    return f"{kind}.failed", data


def resolved(eid: str, resolution: str = "not_occurred", rid: str = "r1", kind: str = "tool") -> Spec:
    return f"{kind}.outcome_resolved", {"effect_id": eid, "resolution": resolution, "resolution_id": rid,
                                        "actor": "ops@example.com", "note": "checked the bank"}


def other(text: str = "hi") -> Spec:
    return "message.appended", {"text": text}


def decide(*specs: Spec, eid: str = "e1") -> EffectDecision:
    return analyze(chain(specs)).decisions[eid]


def assert_corrupt(decision: EffectDecision, reason: str) -> None:
    assert (decision.state, decision.reason) == ("corrupt", reason)
    assert decision.retry_safe is False


# --- completed ----------------------------------------------------------------------


def test_completed_receipt_makes_effect_completed() -> None:
    events = chain([requested("e1"), dispatched("e1"), completed("e1")])
    decision = analyze(events).decisions["e1"]
    assert (decision.state, decision.reason, decision.retry_safe) == ("completed", "succeeded", False)
    assert decision.evidence == (events[0].id, events[1].id, events[2].id)
    assert decision.attempts == 1
    assert (decision.requested_seq, decision.last_seq) == (1, 3)


def test_determinate_failure_after_dispatch_is_completed() -> None:
    decision = decide(requested("e1"), dispatched("e1"), failed("e1"))
    assert (decision.state, decision.reason, decision.retry_safe) == ("completed", "failed", False)


def test_rejection_before_dispatch_is_completed() -> None:
    decision = decide(requested("e1"), failed("e1", attempt=None))
    assert (decision.state, decision.reason) == ("completed", "rejected_before_dispatch")
    assert decision.attempts == 0


def test_rejection_while_parked_is_completed() -> None:
    decision = decide(requested("e1", requires_approval=True), parked("e1"), failed("e1", attempt=None))
    assert (decision.state, decision.reason) == ("completed", "rejected_before_dispatch")


def test_denial_before_dispatch_is_completed() -> None:
    events = chain([requested("e1", requires_approval=True), parked("e1"), denied("e1")])
    decision = analyze(events).decisions["e1"]
    assert (decision.state, decision.reason, decision.retry_safe) == ("completed", "denied", False)
    assert decision.evidence == (events[0].id, events[1].id, events[2].id)


def test_denial_of_required_approval_without_parked_record_is_completed() -> None:
    decision = decide(requested("e1", requires_approval=True), denied("e1"))
    assert (decision.state, decision.reason) == ("completed", "denied")


def test_idempotent_retry_that_completes_is_completed_with_two_attempts() -> None:
    decision = decide(requested("e1", semantics="idempotent"), dispatched("e1", 1),
                      failed("e1", 1, indeterminate=True), dispatched("e1", 2), completed("e1", 2))
    assert (decision.state, decision.attempts) == ("completed", 2)


def test_read_only_redispatch_without_receipt_then_completion_is_completed() -> None:
    decision = decide(requested("e1", semantics="read_only"), dispatched("e1", 1), dispatched("e1", 2),
                      completed("e1", 2))
    assert (decision.state, decision.attempts) == ("completed", 2)


# --- not_dispatched -----------------------------------------------------------------


def test_intent_alone_is_not_dispatched_and_retry_safe() -> None:
    events = chain([requested("e1")])
    decision = analyze(events).decisions["e1"]
    assert (decision.state, decision.reason, decision.retry_safe) == ("not_dispatched", "intent_only", True)
    assert decision.evidence == (events[0].id,)
    assert decision.attempts == 0


def test_explicit_requires_approval_false_is_not_parked() -> None:
    assert decide(requested("e1", requires_approval=False)).state == "not_dispatched"


def test_approved_intent_is_not_dispatched() -> None:
    decision = decide(requested("e1", requires_approval=True), parked("e1"), approved("e1"))
    assert (decision.state, decision.reason, decision.retry_safe) == (
        "not_dispatched", "approved_not_dispatched", True)


def test_approval_without_parked_record_when_required_is_not_dispatched() -> None:
    assert decide(requested("e1", requires_approval=True), approved("e1")).state == "not_dispatched"


def test_parked_then_approved_without_requirement_is_not_dispatched() -> None:
    assert decide(requested("e1"), parked("e1"), approved("e1")).state == "not_dispatched"


# --- unknown ------------------------------------------------------------------------


@pytest.mark.parametrize(("semantics", "retry_safe"),
                         [("read_only", True), ("idempotent", True), ("unsafe", False)])
def test_dispatch_without_receipt_is_unknown_and_retry_safe_follows_semantics(
        semantics: str, retry_safe: bool) -> None:
    events = chain([requested("e1", semantics=semantics), dispatched("e1")])
    decision = analyze(events).decisions["e1"]
    assert (decision.state, decision.reason) == ("unknown", "dispatched_without_receipt")
    assert decision.retry_safe is retry_safe
    assert decision.semantics == semantics
    assert decision.evidence == (events[0].id, events[1].id)


@pytest.mark.parametrize(("semantics", "retry_safe"),
                         [("read_only", True), ("idempotent", True), ("unsafe", False)])
def test_indeterminate_failure_is_unknown(semantics: str, retry_safe: bool) -> None:
    decision = decide(requested("e1", semantics=semantics), dispatched("e1"), failed("e1", indeterminate=True))
    assert (decision.state, decision.reason, decision.retry_safe) == (
        "unknown", "indeterminate_failure", retry_safe)


def test_redispatch_after_indeterminate_failure_without_receipt_is_unknown_again() -> None:
    decision = decide(requested("e1", semantics="idempotent"), dispatched("e1", 1),
                      failed("e1", 1, indeterminate=True), dispatched("e1", 2))
    assert (decision.state, decision.reason, decision.attempts) == ("unknown", "dispatched_without_receipt", 2)


@pytest.mark.parametrize("resolution", RESOLUTIONS)
def test_operator_resolution_keeps_effect_unknown_and_records_it(resolution: str) -> None:
    events = chain([requested("e1"), dispatched("e1"), resolved("e1", resolution, rid="res-7")])
    decision = analyze(events).decisions["e1"]
    assert (decision.state, decision.reason, decision.retry_safe) == ("unknown", "resolved_by_operator", False)
    assert decision.resolution == {"resolution": resolution, "resolution_id": "res-7",
                                   "actor": "ops@example.com", "note": "checked the bank",
                                   "event_id": events[2].id}
    assert events[2].id in decision.evidence


def test_resolution_reports_recorded_evidence_and_result() -> None:
    spec = resolved("e1", "occurred")
    spec[1].update(evidence={"bank_ref": "TX-9"}, result={"refunded": True})
    decision = decide(requested("e1"), dispatched("e1"), spec)
    assert decision.resolution is not None
    assert decision.resolution["evidence"] == {"bank_ref": "TX-9"}
    assert decision.resolution["result"] == {"refunded": True}


def test_resolution_of_idempotent_unknown_makes_it_not_retry_safe() -> None:
    decision = decide(requested("e1", semantics="idempotent"), dispatched("e1"),
                      failed("e1", indeterminate=True), resolved("e1", "occurred"))
    assert (decision.state, decision.retry_safe) == ("unknown", False)
    assert decision.resolution is not None


# --- parked -------------------------------------------------------------------------


def test_parked_event_without_decision_is_parked() -> None:
    events = chain([requested("e1"), parked("e1")])
    decision = analyze(events).decisions["e1"]
    assert (decision.state, decision.reason, decision.retry_safe) == ("parked", "parked", False)
    assert decision.evidence == (events[0].id, events[1].id)


def test_required_approval_without_parked_record_is_parked() -> None:
    decision = decide(requested("e1", requires_approval=True))
    assert (decision.state, decision.reason, decision.retry_safe) == ("parked", "awaiting_approval", False)


# --- identity fields, kinds and non-lifecycle events --------------------------------


def test_decision_carries_the_intent_identity() -> None:
    args = {"order": 7, "amount": "12.50"}
    decision = decide(requested("e1", kind="remote.deploy", name="deploy", args=args,
                                semantics="idempotent"), dispatched("e1", kind="remote.deploy"))
    assert decision.kind == "remote.deploy"
    assert decision.name == "deploy"
    assert decision.idempotency_key == "key-e1"
    assert decision.args_hash == content_hash(args)


def test_every_effect_kind_is_classified_independently() -> None:
    analysis = analyze(chain([requested("m1", kind="model", semantics="read_only"), dispatched("m1", kind="model"),
                              requested("c1", kind="compaction"), requested("t1", kind="task"),
                              dispatched("t1", kind="task"), completed("t1", kind="task")]))
    assert {eid: d.state for eid, d in analysis.decisions.items()} == {
        "m1": "unknown", "c1": "not_dispatched", "t1": "completed"}


def test_non_lifecycle_events_are_ignored() -> None:
    analysis = analyze(chain([other(), requested("e1"), ("tool.progress", {"effect_id": "e1"}), other(),
                              dispatched("e1"), ("thread.completed_turn", {"n": 1}), completed("e1")]))
    assert list(analysis.decisions) == ["e1"]
    assert analysis.decisions["e1"].state == "completed"


def test_decisions_are_in_order_of_first_appearance() -> None:
    analysis = analyze(chain([requested("b"), requested("a"), dispatched("b"), requested("c")]))
    assert list(analysis.decisions) == ["b", "a", "c"]


def test_tail_slice_is_analyzed_without_a_genesis() -> None:
    full = chain([requested("e1"), dispatched("e1"), requested("e2"), completed("e1")])
    analysis = analyze(full[2:], anchor_hash=full[1].hash)
    assert analysis.chain_break_seq is None
    assert analysis.decisions["e2"].state == "not_dispatched"
    # A receipt whose intent lies before the slice has no intent in view.
    assert_corrupt(analysis.decisions["e1"], "receipt_without_intent")


# --- stream flags -------------------------------------------------------------------


def test_empty_stream_is_safe_to_continue() -> None:
    analysis = analyze([])
    assert analysis.decisions == {}
    assert analysis.safe_to_continue is True
    assert analysis.has_corruption is False


def test_stream_flags_list_effects_by_what_they_wait_on() -> None:
    analysis = analyze(chain([
        requested("done"), dispatched("done"), completed("done"),
        requested("fresh"),
        requested("lookup", semantics="read_only"), dispatched("lookup"),
        requested("charge", semantics="unsafe"), dispatched("charge"),
        requested("settled", semantics="unsafe"), dispatched("settled"), resolved("settled"),
        requested("ask", requires_approval=True),
    ]))
    assert analysis.requires_resolution == ("charge",)
    assert analysis.retry_safe_unknown == ("lookup",)
    assert analysis.not_dispatched == ("fresh",)
    assert analysis.waiting_on_parked == ("ask",)
    assert analysis.corrupt == ()
    assert analysis.has_corruption is False
    assert analysis.safe_to_continue is False
    assert [d.effect_id for d in analysis.by_state("unknown")] == ["lookup", "charge", "settled"]


def test_retry_safe_unknown_and_not_dispatched_are_safe_to_continue() -> None:
    analysis = analyze(chain([requested("a"), requested("b", semantics="idempotent"), dispatched("b"),
                              requested("c"), dispatched("c"), resolved("c")]))
    assert analysis.safe_to_continue is True


def test_unsafe_unknown_blocks_continuing() -> None:
    analysis = analyze(chain([requested("e1"), dispatched("e1")]))
    assert analysis.requires_resolution == ("e1",)
    assert analysis.safe_to_continue is False


def test_parked_effect_blocks_continuing() -> None:
    analysis = analyze(chain([requested("e1"), parked("e1")]))
    assert analysis.waiting_on_parked == ("e1",)
    assert analysis.safe_to_continue is False


def test_corrupt_effect_marks_stream_corrupt() -> None:
    analysis = analyze(chain([dispatched("e1"), requested("e2")]))
    assert analysis.corrupt == ("e1",)
    assert analysis.has_corruption is True
    assert analysis.safe_to_continue is False


def test_lifecycle_event_without_effect_id_marks_stream_corrupt() -> None:
    events = chain([requested("e1"), ("tool.dispatched", {"attempt": 1}), ("tool.completed", {"effect_id": 5})])
    analysis = analyze(events)
    assert analysis.unattributed_events == (events[1].id, events[2].id)
    assert analysis.has_corruption is True
    assert analysis.safe_to_continue is False
    assert analysis.decisions["e1"].state == "not_dispatched"


def test_analysis_to_dict_is_json_ready() -> None:
    analysis = analyze(chain([requested("e1"), dispatched("e1"), resolved("e1"), requested("e2"),
                              dispatched("e3")]))
    payload = analysis.to_dict()
    assert json.loads(json.dumps(payload)) == payload
    assert list(payload["decisions"]) == ["e1", "e2", "e3"]
    assert payload["decisions"]["e1"]["resolution"]["resolution"] == "not_occurred"
    assert payload["corrupt"] == ["e3"]
    assert payload["safe_to_continue"] is False


def test_analysis_from_decisions_derives_the_same_flags() -> None:
    analysis = analyze(chain([requested("e1"), dispatched("e1"), requested("e2", requires_approval=True)]))
    rebuilt = Analysis.from_decisions(dict(analysis.decisions), chain_break_seq=None)
    assert rebuilt == analysis


def test_class_method_and_module_function_agree() -> None:
    events = chain([requested("e1"), dispatched("e1")])
    assert RecoveryResolver.analyze(events) == analyze(events)


def test_constants_describe_states_and_reasons() -> None:
    assert STATES == ("completed", "not_dispatched", "unknown", "parked", "corrupt")
    assert list(CORRUPTION_REASONS) == [
        "broken_chain", "malformed_lifecycle_event", "dispatch_without_intent", "receipt_without_intent",
        "event_without_intent", "duplicate_intent", "identity_mismatch", "args_hash_mismatch",
        "duplicate_receipt", "unsafe_redispatch", "out_of_order", "resolution_of_non_unknown",
        "conflicting_resolutions"]
    assert RESOLUTIONS == ("occurred", "not_occurred", "abandoned_unknown")
    assert set(DECISION_REASONS.values()) == set(STATES)
    assert all(DECISION_REASONS[code] == "corrupt" for code in CORRUPTION_REASONS)


# --- corruption: one test per rule, in priority order ----------------------------------


def test_event_after_tampered_link_is_broken_chain() -> None:
    events = chain([requested("before"), requested("e1"), dispatched("e1"), requested("after")])
    events[2] = dataclasses.replace(events[2], prev_hash="f" * 64)
    analysis = analyze(events)
    assert analysis.chain_break_seq == 3
    assert_corrupt(analysis.decisions["e1"], "broken_chain")
    assert analysis.decisions["e1"].evidence == (events[2].id,)
    assert_corrupt(analysis.decisions["after"], "broken_chain")
    assert analysis.decisions["before"].state == "not_dispatched"
    assert analysis.has_corruption is True


def test_seq_gap_is_broken_chain() -> None:
    events = chain([requested("e1"), other(), dispatched("e1")])
    del events[1]
    analysis = analyze(events)
    assert analysis.chain_break_seq == 3
    assert_corrupt(analysis.decisions["e1"], "broken_chain")


def test_wrong_anchor_hash_breaks_chain_at_first_event() -> None:
    full = chain([other(), requested("e1")])
    analysis = analyze(full[1:], anchor_hash="a" * 64)
    assert analysis.chain_break_seq == 2
    assert_corrupt(analysis.decisions["e1"], "broken_chain")


def test_chain_break_reported_by_verify_marks_effects_from_that_seq() -> None:
    events = chain([requested("e1"), dispatched("e1"), requested("e2"), dispatched("e2")])
    analysis = analyze(events, chain_break_seq=4)
    assert analysis.chain_break_seq == 4
    assert analysis.decisions["e1"].state == "unknown"
    assert_corrupt(analysis.decisions["e2"], "broken_chain")
    assert analysis.has_corruption is True


def test_effective_chain_break_is_the_earlier_of_detected_and_reported() -> None:
    events = chain([requested("e1"), requested("e2"), requested("e3"), requested("e4")])
    events[3] = dataclasses.replace(events[3], prev_hash="0" * 64)
    assert analyze(events, chain_break_seq=2).chain_break_seq == 2
    assert analyze(events, chain_break_seq=4).chain_break_seq == 4
    late = analyze(events, chain_break_seq=9)
    assert late.chain_break_seq == 4
    assert [d.effect_id for d in late.by_state("corrupt")] == ["e4"]


@pytest.mark.parametrize("spec", [
    requested("e1", name=None),  # type: ignore[arg-type]
    requested("e1", semantics="dangerous"),
    requested("e1", requires_approval="yes"),  # type: ignore[arg-type]
    ("tool.requested", {"effect_id": "e1", "name": "x", "args": [1], "args_hash": content_hash([1]),
                        "semantics": "unsafe", "idempotency_key": "k"}),
])
def test_malformed_intent_is_malformed_lifecycle_event(spec: Spec) -> None:
    assert_corrupt(decide(spec), "malformed_lifecycle_event")


@pytest.mark.parametrize("spec", [
    dispatched("e1", attempt=0),
    ("tool.dispatched", {"effect_id": "e1", "attempt": True}),
    ("tool.dispatched", {"effect_id": "e1"}),
    ("tool.dispatched", {"effect_id": "e1", "attempt": 1, "idempotency_key": 9}),
    ("tool.completed", {"effect_id": "e1", "attempt": 1}),
    ("tool.failed", {"effect_id": "e1", "attempt": 1, "error": {}}),
    ("tool.failed", {"effect_id": "e1", "attempt": 1, "error": "text", "indeterminate": False}),
    ("tool.parked", {"effect_id": "e1"}),
    ("tool.approved", {"effect_id": "e1", "actor": 3}),
    resolved("e1", resolution="maybe"),
    ("tool.outcome_resolved", {"effect_id": "e1", "resolution": "occurred"}),
])
def test_malformed_later_event_is_malformed_lifecycle_event(spec: Spec) -> None:
    decision = decide(requested("e1", semantics="idempotent"), dispatched("e1"), spec)
    assert_corrupt(decision, "malformed_lifecycle_event")


def test_args_that_cannot_be_encoded_are_malformed_lifecycle_event() -> None:
    # Only reachable with a hand-built Event: stored events always hold plain JSON.
    good = chain([requested("e1")])[0]
    bad = dataclasses.replace(good, data={**good.data, "args": {"when": (1, 2)}})
    assert_corrupt(analyze([bad]).decisions["e1"], "malformed_lifecycle_event")


def test_dispatch_without_intent_is_corrupt() -> None:
    assert_corrupt(decide(dispatched("e1")), "dispatch_without_intent")


@pytest.mark.parametrize("spec", [completed("e1"), failed("e1"), failed("e1", None), denied("e1")])
def test_receipt_without_intent_is_corrupt(spec: Spec) -> None:
    assert_corrupt(decide(spec), "receipt_without_intent")


@pytest.mark.parametrize("spec", [parked("e1"), approved("e1"), resolved("e1")])
def test_event_without_intent_is_corrupt(spec: Spec) -> None:
    assert_corrupt(decide(spec), "event_without_intent")


def test_intent_recorded_after_its_dispatch_is_dispatch_without_intent() -> None:
    events = chain([dispatched("e1"), requested("e1")])
    decision = analyze(events).decisions["e1"]
    assert_corrupt(decision, "dispatch_without_intent")
    assert decision.evidence == (events[0].id,)
    assert decision.requested_seq == 2


def test_duplicate_intent_is_corrupt() -> None:
    events = chain([requested("e1"), requested("e1")])
    decision = analyze(events).decisions["e1"]
    assert_corrupt(decision, "duplicate_intent")
    assert decision.evidence == (events[0].id, events[1].id)


def test_receipt_of_another_kind_is_identity_mismatch() -> None:
    assert_corrupt(decide(requested("e1"), dispatched("e1"), completed("e1", kind="model")), "identity_mismatch")


def test_dispatch_naming_another_tool_is_identity_mismatch() -> None:
    assert_corrupt(decide(requested("e1"), dispatched("e1", name="transfer")), "identity_mismatch")


def test_dispatch_with_another_idempotency_key_is_identity_mismatch() -> None:
    assert_corrupt(decide(requested("e1", semantics="idempotent"), dispatched("e1", idempotency_key="other")),
                   "identity_mismatch")


def test_dispatch_repeating_the_intent_identity_is_consistent() -> None:
    intent = requested("e1")
    decision = decide(intent, dispatched("e1", name="refund", idempotency_key="key-e1",
                                         args_hash=intent[1]["args_hash"]))
    assert decision.state == "unknown"


def test_intent_hash_not_matching_its_args_is_args_hash_mismatch() -> None:
    assert_corrupt(decide(requested("e1", args_hash="0" * 64)), "args_hash_mismatch")


def test_dispatch_with_other_args_hash_is_args_hash_mismatch() -> None:
    assert_corrupt(decide(requested("e1"), dispatched("e1", args_hash=content_hash({"order": 43}))),
                   "args_hash_mismatch")


def test_two_receipts_for_one_attempt_is_duplicate_receipt() -> None:
    events = chain([requested("e1"), dispatched("e1"), completed("e1"), completed("e1")])
    decision = analyze(events).decisions["e1"]
    assert_corrupt(decision, "duplicate_receipt")
    assert decision.evidence == (events[2].id, events[3].id)


def test_result_after_indeterminate_failure_of_same_attempt_is_duplicate_receipt() -> None:
    assert_corrupt(decide(requested("e1"), dispatched("e1"), failed("e1", indeterminate=True), completed("e1")),
                   "duplicate_receipt")


def test_two_terminal_receipts_is_duplicate_receipt() -> None:
    assert_corrupt(decide(requested("e1"), failed("e1", None), failed("e1", None)), "duplicate_receipt")


def test_two_denials_is_duplicate_receipt() -> None:
    assert_corrupt(decide(requested("e1", requires_approval=True), denied("e1"), denied("e1")),
                   "duplicate_receipt")


def test_second_dispatch_of_unsafe_effect_is_unsafe_redispatch() -> None:
    events = chain([requested("e1", semantics="unsafe"), dispatched("e1", 1),
                    failed("e1", 1, indeterminate=True), dispatched("e1", 2)])
    decision = analyze(events).decisions["e1"]
    assert_corrupt(decision, "unsafe_redispatch")
    assert decision.evidence == (events[1].id, events[3].id)
    assert decision.attempts == 2


@pytest.mark.parametrize("specs", [
    pytest.param([requested("e1", requires_approval=True), dispatched("e1")], id="dispatch-before-approval"),
    pytest.param([requested("e1"), parked("e1"), dispatched("e1")], id="dispatch-while-parked"),
    pytest.param([requested("e1", semantics="idempotent"), dispatched("e1"), completed("e1"),
                  dispatched("e1", 2)], id="dispatch-after-receipt"),
    pytest.param([requested("e1", requires_approval=True), denied("e1"), dispatched("e1")],
                 id="dispatch-after-denial"),
    pytest.param([requested("e1"), completed("e1")], id="completion-without-dispatch"),
    pytest.param([requested("e1"), failed("e1", 1)], id="attempt-receipt-without-dispatch"),
    pytest.param([requested("e1"), failed("e1", None, indeterminate=True)],
                 id="indeterminate-failure-without-dispatch"),
    pytest.param([requested("e1"), dispatched("e1", 2)], id="first-attempt-not-1"),
    pytest.param([requested("e1", semantics="read_only"), dispatched("e1", 1), dispatched("e1", 3)],
                 id="attempt-skipped"),
    pytest.param([requested("e1", semantics="read_only"), dispatched("e1", 1), dispatched("e1", 2),
                  completed("e1", 1)], id="receipt-for-older-attempt"),
    pytest.param([requested("e1"), dispatched("e1"), failed("e1", None)], id="receipt-without-attempt"),
    pytest.param([requested("e1"), approved("e1")], id="approval-without-park-or-requirement"),
    pytest.param([requested("e1"), denied("e1")], id="denial-without-park-or-requirement"),
    pytest.param([requested("e1", requires_approval=True), parked("e1"), approved("e1"), approved("e1")],
                 id="second-approval"),
    pytest.param([requested("e1", requires_approval=True), approved("e1"), denied("e1")],
                 id="denial-after-approval"),
    pytest.param([requested("e1"), parked("e1"), parked("e1")], id="parked-twice"),
    pytest.param([requested("e1"), dispatched("e1"), parked("e1")], id="parked-after-dispatch"),
    pytest.param([requested("e1", requires_approval=True), approved("e1"), dispatched("e1"), approved("e1")],
                 id="approval-after-dispatch"),
    pytest.param([requested("e1"), dispatched("e1"), resolved("e1"), completed("e1")],
                 id="receipt-after-resolution"),
    pytest.param([requested("e1", semantics="idempotent"), dispatched("e1"), resolved("e1"),
                  dispatched("e1", 2)], id="retry-after-resolution"),
])
def test_event_in_wrong_order_is_out_of_order(specs: list[Spec]) -> None:
    assert_corrupt(decide(*specs), "out_of_order")


@pytest.mark.parametrize("specs", [
    pytest.param([requested("e1")], id="not-dispatched"),
    pytest.param([requested("e1"), parked("e1")], id="parked"),
    pytest.param([requested("e1"), dispatched("e1"), completed("e1")], id="completed"),
    pytest.param([requested("e1"), dispatched("e1"), failed("e1")], id="failed"),
])
def test_resolving_an_effect_that_is_not_unknown_is_resolution_of_non_unknown(specs: list[Spec]) -> None:
    events = chain([*specs, resolved("e1")])
    decision = analyze(events).decisions["e1"]
    assert_corrupt(decision, "resolution_of_non_unknown")
    assert decision.evidence == (events[-1].id,)
    assert decision.resolution is not None  # still shown to operators


@pytest.mark.parametrize("second", [
    pytest.param(resolved("e1", "not_occurred", rid="r1"), id="same-body"),
    pytest.param(resolved("e1", "occurred", rid="r2"), id="different-body"),
])
def test_second_resolution_is_conflicting_resolutions(second: Spec) -> None:
    events = chain([requested("e1"), dispatched("e1"), resolved("e1", "not_occurred", rid="r1"), second])
    decision = analyze(events).decisions["e1"]
    assert_corrupt(decision, "conflicting_resolutions")
    assert decision.evidence == (events[2].id, events[3].id)


# --- priority order -----------------------------------------------------------------


@pytest.mark.parametrize(("specs", "winner"), [
    pytest.param([requested("e1"), dispatched("e1", attempt=0), requested("e1")],
                 "malformed_lifecycle_event", id="malformed-beats-duplicate-intent"),
    pytest.param([completed("e1", attempt=-1), dispatched("e1")],
                 "malformed_lifecycle_event", id="malformed-beats-without-intent"),
    pytest.param([completed("e1"), dispatched("e1"), parked("e1")],
                 "dispatch_without_intent", id="dispatch-beats-receipt-without-intent"),
    pytest.param([resolved("e1"), completed("e1")],
                 "receipt_without_intent", id="receipt-beats-event-without-intent"),
    pytest.param([dispatched("e1"), requested("e1"), requested("e1")],
                 "dispatch_without_intent", id="without-intent-beats-duplicate-intent"),
    pytest.param([requested("e1"), dispatched("e1", kind="model"), requested("e1")],
                 "duplicate_intent", id="duplicate-intent-beats-identity"),
    pytest.param([requested("e1", args_hash="0" * 64), dispatched("e1", name="other")],
                 "identity_mismatch", id="identity-beats-args-hash"),
    pytest.param([requested("e1"), dispatched("e1", args_hash="1" * 64), completed("e1"), completed("e1")],
                 "args_hash_mismatch", id="args-hash-beats-duplicate-receipt"),
    pytest.param([requested("e1"), dispatched("e1"), failed("e1", indeterminate=True), failed("e1"),
                  dispatched("e1", 2)],
                 "duplicate_receipt", id="duplicate-receipt-beats-unsafe-redispatch"),
    pytest.param([requested("e1"), dispatched("e1", 1), dispatched("e1", 5)],
                 "unsafe_redispatch", id="unsafe-redispatch-beats-out-of-order"),
    pytest.param([requested("e1"), resolved("e1"), dispatched("e1")],
                 "out_of_order", id="out-of-order-beats-resolution-of-non-unknown"),
    pytest.param([requested("e1"), resolved("e1"), resolved("e1", "occurred", rid="r2")],
                 "resolution_of_non_unknown", id="non-unknown-beats-conflicting"),
])
def test_first_rule_in_priority_order_names_the_corruption(specs: list[Spec], winner: str) -> None:
    assert_corrupt(decide(*specs), winner)


def test_broken_chain_beats_every_other_rule() -> None:
    events = chain([requested("e1"), completed("e1"), completed("e1")])
    events[1] = dataclasses.replace(events[1], prev_hash="e" * 64)
    assert_corrupt(analyze(events).decisions["e1"], "broken_chain")


def test_corruption_of_one_effect_leaves_others_classified() -> None:
    analysis = analyze(chain([requested("ok"), dispatched("bad"), dispatched("ok"), completed("ok")]))
    assert analysis.decisions["ok"].state == "completed"
    assert_corrupt(analysis.decisions["bad"], "dispatch_without_intent")


# --- odd input never raises ---------------------------------------------------------


def test_hand_built_odd_events_never_raise() -> None:
    base = chain([requested("e1")])[0]
    odd = [
        base,
        dataclasses.replace(base, id="x1", seq=2, type="tool.dispatched", data=[1, 2]),  # type: ignore[arg-type]
        dataclasses.replace(base, id="x2", seq=3, type=["tool"], data={}),  # type: ignore[arg-type]
        dataclasses.replace(base, id="x3", seq="4", type="tool.completed",  # type: ignore[arg-type]
                            data={"effect_id": "e1", "attempt": 1, "result": None}),
        dataclasses.replace(base, id="x4", seq=5, type="dispatched", data={"effect_id": "e2"}),
        dataclasses.replace(base, id="x5", seq=6, type="tool.dispatched", data={"effect_id": ["e1"]}),
    ]
    analysis = analyze(odd)
    assert set(analysis.decisions) == {"e1"}
    assert analysis.has_corruption is True
    assert analysis.unattributed_events == ("x1", "x5")
    assert analysis.chain_break_seq is not None


def test_check_links_false_accepts_a_selection_of_verified_events() -> None:
    from tests.helpers import chain as build

    args = {"q": 1}
    history = build([
        ("tool.requested", {"effect_id": "a", "name": "t", "args": args, "args_hash": content_hash(args),
                            "semantics": "unsafe", "idempotency_key": "ka"}),
        ("note.added", {}),
        ("tool.dispatched", {"effect_id": "a", "attempt": 1}),
    ])
    selection = [history[0], history[2]]
    assert RecoveryResolver.analyze(selection).decisions["a"].state == "corrupt"
    relaxed = RecoveryResolver.analyze(selection, check_links=False)
    assert relaxed.decisions["a"].state == "unknown" and not relaxed.has_corruption


def test_a_decision_round_trips_through_its_dict() -> None:
    from tests.helpers import chain as build

    args = {"q": 1}
    history = build([("tool.requested", {"effect_id": "a", "name": "t", "args": args,
                                         "args_hash": content_hash(args), "semantics": "idempotent",
                                         "idempotency_key": "ka"})])
    decision = RecoveryResolver.analyze(history).decisions["a"]
    assert EffectDecision.from_dict(decision.to_dict()) == decision
