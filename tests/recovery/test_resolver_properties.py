"""Properties of the RecoveryResolver over generated histories.

Valid histories are built per effect from the lifecycle grammar, cut at a
random point and interleaved; a tiny independent state machine (the reference
model below) says what each effect's state must be. Mutated histories (events
dropped, duplicated, swapped, fields changed, links broken) must never raise,
never invent a completion, and always yield one decision per effect id seen;
and every history, valid or not, must be decided exactly as the plain second
statement of the rules in ``reference.py`` decides it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from jixu.ledger.encoding import content_hash
from jixu.ledger.event import GENESIS_HASH, Event, NewEvent, prepare, seal
from jixu.recovery import (
    DECISION_REASONS,
    PHASES,
    RESOLUTIONS,
    SEMANTICS,
    STATES,
    Analysis,
    analyze,
    decide_effect,
)
from tests.helpers import examples
from tests.recovery import reference as rules

Spec = tuple[str, dict[str, Any]]

KINDS = ("tool", "model", "remote.deploy")
FIELD_VALUES: tuple[Any, ...] = (None, 0, 1, 2, -1, True, False, "", "e0", "x", {}, [], {"a": 1})


def chain(specs: Iterable[Spec]) -> list[Event]:
    """Properly hash-chained events from ``(type, data)`` pairs."""
    events: list[Event] = []
    prev = GENESIS_HASH
    for seq, (event_type, data) in enumerate(specs, start=1):
        row = seal(prepare(NewEvent(event_type, data)), stream="thread/p", seq=seq, prev_hash=prev,
                   recorded_at="2026-01-01T00:00:00.000000Z")
        events.append(row.to_event())
        prev = row.hash
    return events


def phase_of(event_type: str) -> str:
    return event_type.rpartition(".")[2]


# --- generating valid histories -------------------------------------------------------


@st.composite
def effect_history(draw: st.DrawFn, eid: str) -> list[Spec]:
    """One effect's valid lifecycle, cut at a random point."""
    kind = draw(st.sampled_from(KINDS))
    semantics = draw(st.sampled_from(SEMANTICS))
    requires_approval = draw(st.booleans())
    args = {"n": draw(st.integers(0, 3)), "eid": eid}

    def event(phase: str, **data: Any) -> Spec:
        return f"{kind}.{phase}", {"effect_id": eid, **data}

    specs = [event("requested", name=f"do_{kind}", args=args, args_hash=content_hash(args),
                   semantics=semantics, idempotency_key=f"idem-{eid}", requires_approval=requires_approval)]
    park = draw(st.booleans()) if requires_approval else draw(st.integers(0, 3)) == 0
    if park:
        specs.append(event("parked", reason="approval"))
    if requires_approval or park:
        decision = draw(st.sampled_from(["approve", "approve", "deny", "reject"]))
        if decision == "deny":
            specs.append(event("denied", actor="op"))
        elif decision == "reject":
            specs.append(event("failed", error={"m": "invalid"}, indeterminate=False))
        else:
            specs.append(event("approved", actor="op"))
    elif draw(st.integers(0, 5)) == 0:
        specs.append(event("failed", error={"m": "invalid"}, indeterminate=False))
    if phase_of(specs[-1][0]) not in ("denied", "failed"):
        for attempt in range(1, 5):
            specs.append(event("dispatched", attempt=attempt, idempotency_key=f"idem-{eid}"))
            outcome = draw(st.sampled_from(["completed", "failed", "indeterminate", "silent"]))
            if outcome == "completed":
                specs.append(event("completed", attempt=attempt, result={"v": attempt}))
                break
            if outcome == "failed":
                specs.append(event("failed", attempt=attempt, error={"m": "no"}, indeterminate=False))
                break
            if outcome == "indeterminate":
                specs.append(event("failed", attempt=attempt, error={"m": "timeout"}, indeterminate=True))
            # The effect is unknown now: retry (only when safe) or have an operator resolve it.
            retry = semantics != "unsafe" and draw(st.booleans())
            if not retry:
                if draw(st.booleans()):
                    specs.append(event("outcome_resolved", resolution=draw(st.sampled_from(RESOLUTIONS)),
                                       resolution_id=f"res-{eid}", actor="op", note="checked"))
                break
    # Half the time the whole history, so late phases (retries, resolutions) are common too.
    cut = len(specs) if draw(st.booleans()) else draw(st.integers(1, len(specs)))
    return specs[:cut]


@st.composite
def valid_history(draw: st.DrawFn) -> list[Spec]:
    """Several effects' valid histories, interleaved, with unrelated events between them."""
    count = draw(st.integers(1, 5))
    queues = [draw(effect_history(f"e{i}")) for i in range(count)]
    merged: list[Spec] = []
    while any(queues):
        live = [queue for queue in queues if queue]
        queue = live[draw(st.integers(0, len(live) - 1))]
        merged.append(queue.pop(0))
        if draw(st.integers(0, 6)) == 0:
            merged.append(("message.appended", {"text": "thinking"}))
    return merged


@st.composite
def mutated_history(draw: st.DrawFn) -> list[Event]:
    """A valid history with random damage, to its content (re-chained) or to the chain itself."""
    specs = [(event_type, dict(data)) for event_type, data in draw(valid_history())]
    for _ in range(draw(st.integers(0, 4))):
        if not specs:
            break
        index = draw(st.integers(0, len(specs) - 1))
        mutation = draw(st.sampled_from(["drop", "duplicate", "swap", "field", "phase"]))
        if mutation == "drop":
            del specs[index]
        elif mutation == "duplicate":
            specs.insert(draw(st.integers(index, len(specs))), specs[index])
        elif mutation == "swap":
            other = draw(st.integers(0, len(specs) - 1))
            specs[index], specs[other] = specs[other], specs[index]
        elif mutation == "field":
            event_type, data = specs[index]
            field = draw(st.sampled_from([*sorted(data), "attempt", "effect_id"]))
            specs[index] = (event_type, {**data, field: draw(st.sampled_from(FIELD_VALUES))})
        else:
            event_type, data = specs[index]
            kind = event_type.rpartition(".")[0]
            specs[index] = (f"{kind}.{draw(st.sampled_from(PHASES))}", data)
    events = chain(specs)
    if events and draw(st.integers(0, 3)) == 0:
        # Damage the chain as well: a gap, a swap or a bad link, without re-sealing.
        index = draw(st.integers(0, len(events) - 1))
        damage = draw(st.sampled_from(["gap", "swap", "link"]))
        if damage == "gap":
            del events[index]
        elif damage == "swap":
            other = draw(st.integers(0, len(events) - 1))
            events[index], events[other] = events[other], events[index]
        else:
            events[index] = dataclasses.replace(events[index], prev_hash="f" * 64)
    return events


any_history = st.one_of(valid_history().map(chain), mutated_history())


# --- the reference model --------------------------------------------------------------


@dataclasses.dataclass
class Model:
    semantics: str
    state: str
    reason: str
    attempts: int = 0
    resolved: bool = False


def reference(specs: list[Spec]) -> dict[str, Model]:
    """What each effect of a valid history must be: a direct per-effect state machine."""
    models: dict[str, Model] = {}
    for event_type, data in specs:
        phase = phase_of(event_type)
        if phase not in PHASES:
            continue
        eid = data["effect_id"]
        if phase == "requested":
            if data.get("requires_approval"):
                models[eid] = Model(data["semantics"], "parked", "awaiting_approval")
            else:
                models[eid] = Model(data["semantics"], "not_dispatched", "intent_only")
            continue
        model = models[eid]
        if phase == "parked":
            model.state, model.reason = "parked", "parked"
        elif phase == "approved":
            model.state, model.reason = "not_dispatched", "approved_not_dispatched"
        elif phase == "denied":
            model.state, model.reason = "completed", "denied"
        elif phase == "dispatched":
            model.state, model.reason = "unknown", "dispatched_without_receipt"
            model.attempts += 1
        elif phase == "completed":
            model.state, model.reason = "completed", "succeeded"
        elif phase == "failed" and data["indeterminate"]:
            model.state, model.reason = "unknown", "indeterminate_failure"
        elif phase == "failed":
            model.state = "completed"
            model.reason = "failed" if model.attempts else "rejected_before_dispatch"
        elif phase == "outcome_resolved":
            model.resolved, model.reason = True, "resolved_by_operator"
    return models


def retry_safe(model: Model) -> bool:
    if model.state == "not_dispatched":
        return True
    return model.state == "unknown" and model.semantics != "unsafe" and not model.resolved


def effect_ids_seen(events: list[Event]) -> set[str]:
    return {
        event.data["effect_id"]
        for event in events
        if phase_of(event.type) in PHASES
        and event.type.rpartition(".")[0]
        and isinstance(event.data.get("effect_id"), str)
        and event.data["effect_id"]
    }


def assert_consistent(analysis: Analysis) -> None:
    for eid, decision in analysis.decisions.items():
        assert decision.effect_id == eid
        assert decision.state in STATES
        assert DECISION_REASONS[decision.reason] == decision.state
        if decision.state == "corrupt":
            assert analysis.has_corruption
            assert not decision.retry_safe
    if analysis.safe_to_continue:
        assert not analysis.by_state("corrupt") and not analysis.by_state("parked")


# --- properties -----------------------------------------------------------------------


@settings(max_examples=examples(100), deadline=None)
@given(valid_history())
def test_valid_histories_match_the_reference_model(specs: list[Spec]) -> None:
    analysis = analyze(chain(specs))
    expected = reference(specs)
    assert list(analysis.decisions) == list(expected)
    for eid, model in expected.items():
        decision = analysis.decisions[eid]
        assert (decision.state, decision.reason) == (model.state, model.reason), eid
        assert decision.retry_safe is retry_safe(model)
        assert decision.attempts == model.attempts
        assert (decision.resolution is not None) is model.resolved
    assert analysis.has_corruption is False
    assert analysis.chain_break_seq is None
    assert analysis.requires_resolution == tuple(
        eid for eid, m in expected.items() if m.state == "unknown" and m.semantics == "unsafe" and not m.resolved)
    assert analysis.waiting_on_parked == tuple(eid for eid, m in expected.items() if m.state == "parked")
    assert analysis.retry_safe_unknown == tuple(
        eid for eid, m in expected.items() if m.state == "unknown" and retry_safe(m))
    assert analysis.not_dispatched == tuple(eid for eid, m in expected.items() if m.state == "not_dispatched")
    assert analysis.safe_to_continue is (not analysis.requires_resolution and not analysis.waiting_on_parked)
    assert_consistent(analysis)


@settings(max_examples=examples(100), deadline=None)
@given(any_history)
def test_no_prefix_claims_completion_without_a_terminal_receipt(events: list[Event]) -> None:
    for cut in range(len(events) + 1):
        prefix = events[:cut]
        analysis = analyze(prefix)
        for eid, decision in analysis.decisions.items():
            if decision.state != "completed":
                continue
            assert any(
                event.data.get("effect_id") == eid
                and (
                    phase_of(event.type) in ("completed", "denied")
                    or (phase_of(event.type) == "failed" and event.data.get("indeterminate") is False)
                )
                for event in prefix
            ), f"{eid} completed without a receipt in the first {cut} events"


@settings(max_examples=examples(100), deadline=None)
@given(any_history)
def test_analysis_is_pure(events: list[Event]) -> None:
    snapshot = copy.deepcopy(events)
    ids = [id(event) for event in events]
    first = analyze(events)
    second = analyze(events)
    assert first == second
    assert first.to_dict() == second.to_dict()
    assert events == snapshot
    assert [id(event) for event in events] == ids
    assert analyze(copy.deepcopy(events)) == first
    assert analyze(tuple(events)) == first


@settings(max_examples=examples(100), deadline=None)
@given(mutated_history())
def test_mutated_histories_never_raise_and_decide_every_effect(events: list[Event]) -> None:
    analysis = analyze(events)
    assert set(analysis.decisions) == effect_ids_seen(events)
    assert_consistent(analysis)
    if analysis.chain_break_seq is not None:
        assert analysis.has_corruption and not analysis.safe_to_continue


@settings(max_examples=examples(150), deadline=None)
@given(any_history, st.one_of(st.none(), st.integers(1, 30)), st.booleans(), st.sampled_from([None, GENESIS_HASH]))
def test_every_history_is_decided_as_the_reference_rules_decide_it(
        events: list[Event], chain_break_seq: int | None, check_links: bool, anchor_hash: str | None) -> None:
    analysis = analyze(events, chain_break_seq=chain_break_seq, check_links=check_links, anchor_hash=anchor_hash)
    expected = rules.analyze(events, chain_break_seq=chain_break_seq, check_links=check_links,
                                 anchor_hash=anchor_hash)
    assert analysis.decisions == expected.decisions
    assert analysis.chain_break_seq == expected.chain_break_seq
    assert analysis.unattributed_events == expected.unattributed_events
    # One effect's events alone (as a thread keeps them) are decided as in the whole stream without links.
    unlinked = rules.analyze(events, check_links=False).decisions
    for eid in analysis.decisions:
        group = [event for event in events if isinstance(event.data.get("effect_id"), str)
                 and event.data["effect_id"] == eid and rules.kind_and_phase(event.type) is not None]
        assert decide_effect(eid, group) == unlinked[eid]
