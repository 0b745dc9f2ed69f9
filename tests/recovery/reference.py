"""A plain second statement of the RecoveryResolver's rules: the independent oracle of the property tests.

``jixu.recovery.resolver`` states each lifecycle rule once, in one walk written for speed (issue 21: there
used to be fast paths beside it, each checked against the walk). This module states the rules again, from
the resolver's module docstring and SPEC section 3, as plainly as possible and slow on purpose: one
function per phase, a small state object, no caches, no inlined checks, no shared code with the resolver
but the public constants. The tests compare the two over generated histories; a rule changed in one place
and not the other fails them.

It follows the resolver where the spec leaves room (which event ids a corrupt decision cites, which seq
is reported for a break at an event without an integer seq, what a corrupt decision still names), because
the tests compare whole decisions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from jixu.ledger.encoding import content_hash
from jixu.ledger.event import Event
from jixu.recovery import CORRUPTION_REASONS, PHASES, RESOLUTIONS, SEMANTICS, EffectDecision

RANK = {code: rank for rank, code in enumerate(CORRUPTION_REASONS)}

WITHOUT_INTENT = {
    "dispatched": "dispatch_without_intent",
    "completed": "receipt_without_intent",
    "failed": "receipt_without_intent",
    "denied": "receipt_without_intent",
    "parked": "event_without_intent",
    "approved": "event_without_intent",
    "outcome_resolved": "event_without_intent",
}


def kind_and_phase(event_type: Any) -> tuple[str, str] | None:
    """``<kind>.<phase>`` with a non-empty kind and a lifecycle phase, else None."""
    if type(event_type) is not str or "." not in event_type:
        return None
    kind, phase = event_type.rsplit(".", 1)
    if kind == "" or phase not in PHASES:
        return None
    return kind, phase


def is_text(value: Any) -> bool:
    return type(value) is str


def is_attempt(value: Any) -> bool:
    return type(value) is int and value > 0  # True is a bool, not attempt 1


def absent_or_text(data: dict[str, Any], name: str) -> bool:
    return data.get(name) is None or is_text(data.get(name))


def well_formed(phase: str, data: dict[str, Any]) -> bool:
    """Rule 2: every field the phase needs, with the right type."""
    if phase == "requested":
        return (is_text(data.get("name")) and type(data.get("args")) is dict and is_text(data.get("args_hash"))
                and is_text(data.get("semantics")) and data.get("semantics") in SEMANTICS
                and is_text(data.get("idempotency_key"))
                and type(data.get("requires_approval", False)) is bool)
    if phase == "dispatched":
        return (is_attempt(data.get("attempt")) and absent_or_text(data, "name")
                and absent_or_text(data, "idempotency_key") and absent_or_text(data, "args_hash"))
    if phase == "completed":
        has_result = "result" in data or isinstance(data.get("result_artifact"), dict)
        return is_attempt(data.get("attempt")) and has_result
    if phase == "failed":
        return ((data.get("attempt") is None or is_attempt(data.get("attempt")))
                and type(data.get("error")) is dict and type(data.get("indeterminate")) is bool)
    if phase == "parked":
        return is_text(data.get("reason"))
    if phase == "outcome_resolved":
        return (is_text(data.get("resolution")) and data.get("resolution") in RESOLUTIONS
                and is_text(data.get("resolution_id")) and data.get("resolution_id") != ""
                and absent_or_text(data, "actor") and absent_or_text(data, "note"))
    return absent_or_text(data, "actor") and absent_or_text(data, "note")  # approved, denied


def hash_of_args(args: Any) -> str | None:
    try:
        return content_hash(args)
    except Exception:  # args that cannot be encoded: the intent is malformed
        return None


def resolution_record(event: Event) -> dict[str, Any]:
    data = event.data
    record = {"resolution": data.get("resolution"), "resolution_id": data.get("resolution_id"),
              "actor": data.get("actor"), "note": data.get("note"), "event_id": event.id}
    for optional in ("evidence", "result"):
        if optional in data:
            record[optional] = data[optional]
    return record


@dataclass
class Effect:
    """One effect's history so far, as the rules see it."""

    findings: list[tuple[str, tuple[str, ...]]] = field(default_factory=list)
    intent: Event | None = None
    intent_ok: bool = False  # the intent was well formed (else it only orders what follows)
    kind: str = ""
    parked: Event | None = None
    approved: Event | None = None
    decision_seen: bool = False  # an approval or a denial
    terminal: Event | None = None
    terminal_reason: str = ""
    dispatches: list[Event] = field(default_factory=list)
    attempt: int = 0  # the latest dispatched attempt
    outcome_open: bool = False  # the latest attempt has no receipt, or only an indeterminate one
    indeterminate: Event | None = None  # the latest attempt's indeterminate failure
    receipts: dict[int, Event] = field(default_factory=dict)
    resolution: Event | None = None

    def find(self, code: str, *culprits: Event) -> None:
        self.findings.append((code, tuple(event.id for event in culprits)))

    def intent_field(self, name: str) -> Any:
        return self.intent.data.get(name) if self.intent is not None and self.intent_ok else None

    def needs_approval(self) -> bool:
        return self.intent_field("requires_approval") is True or self.parked is not None


def apply(effect: Effect, group: list[Event], kind: str, phase: str, event: Event) -> None:
    """One event's rules, in priority order within the event."""
    data = event.data
    if not well_formed(phase, data):
        effect.find("malformed_lifecycle_event", event)
        if phase == "requested" and effect.intent is None:
            effect.intent, effect.kind = event, kind
        return
    if phase == "requested":
        if effect.intent is not None:
            effect.find("duplicate_intent", effect.intent, event)
            return
        effect.intent, effect.intent_ok, effect.kind = event, True, kind
        args_hash = hash_of_args(data["args"])
        if args_hash is None:
            effect.find("malformed_lifecycle_event", event)
        elif args_hash != data["args_hash"]:
            effect.find("args_hash_mismatch", event)
        return
    intent = effect.intent
    if intent is None:
        effect.find(WITHOUT_INTENT[phase], event)
        return
    names = [("name", "name"), ("idempotency_key", "idempotency_key")]
    if kind != effect.kind or any(data.get(own) is not None and data.get(own) != effect.intent_field(theirs)
                                  for own, theirs in names):
        effect.find("identity_mismatch", intent, event)
    if data.get("args_hash") is not None and data.get("args_hash") != effect.intent_field("args_hash"):
        effect.find("args_hash_mismatch", intent, event)
    in_order = {"dispatched": dispatched, "completed": receipt, "failed": receipt, "outcome_resolved": resolved,
                "parked": parked, "approved": decided, "denied": decided}[phase](effect, group, phase, event)
    if effect.resolution is not None and phase != "outcome_resolved" and event is not effect.resolution:
        in_order = False  # only a (conflicting) second resolution may follow a resolution
    if not in_order:
        effect.find("out_of_order", event)


def dispatched(effect: Effect, group: list[Event], phase: str, event: Event) -> bool:
    attempt = event.data["attempt"]
    effect.dispatches.append(event)
    if effect.intent_field("semantics") == "unsafe" and len(effect.dispatches) > 1:
        # Every dispatch marker of the group so far (well formed or not) up to the first place this one is.
        upto = group[:next(i for i, other in enumerate(group) if other is event) + 1]
        effect.find("unsafe_redispatch", *(e for e in upto if (kind_and_phase(e.type) or ("", ""))[1] == phase))
    in_order = (effect.terminal is None and not (effect.needs_approval() and effect.approved is None)
                and attempt == effect.attempt + 1 and (effect.attempt == 0 or effect.outcome_open))
    effect.attempt, effect.outcome_open, effect.indeterminate = attempt, True, None
    return in_order


def receipt(effect: Effect, group: list[Event], phase: str, event: Event) -> bool:
    attempt = event.data.get("attempt")
    indeterminate = phase == "failed" and event.data["indeterminate"]
    if effect.terminal is not None:
        effect.find("duplicate_receipt", effect.terminal, event)
    elif attempt in effect.receipts:
        effect.find("duplicate_receipt", effect.receipts[attempt], event)
    if attempt is not None and attempt not in effect.receipts:
        effect.receipts[attempt] = event
    if effect.attempt == 0:
        in_order = phase == "failed" and not indeterminate and attempt is None  # a rejection
    else:
        in_order = attempt == effect.attempt
    effect.outcome_open = indeterminate
    if indeterminate:
        effect.indeterminate = event
    elif effect.terminal is None:
        effect.terminal = event
        if phase == "completed":
            effect.terminal_reason = "succeeded"
        elif effect.attempt:
            effect.terminal_reason = "failed"
        else:
            effect.terminal_reason = "rejected_before_dispatch"
    return in_order


def resolved(effect: Effect, group: list[Event], phase: str, event: Event) -> bool:
    if effect.resolution is not None:
        effect.find("conflicting_resolutions", effect.resolution, event)
        return True
    if effect.terminal is not None or not effect.outcome_open:
        effect.find("resolution_of_non_unknown", event)
    effect.resolution = event
    return True


def parked(effect: Effect, group: list[Event], phase: str, event: Event) -> bool:
    in_order = (effect.terminal is None and not effect.dispatches and effect.parked is None
                and not effect.decision_seen)
    if effect.parked is None:
        effect.parked = event
    return in_order


def decided(effect: Effect, group: list[Event], phase: str, event: Event) -> bool:
    in_order = True
    if phase == "denied" and effect.terminal is not None:
        effect.find("duplicate_receipt", effect.terminal, event)  # a denial is a terminal receipt
    elif (effect.terminal is not None or effect.dispatches or effect.decision_seen
          or (effect.parked is None and effect.intent_field("requires_approval") is not True)):
        in_order = False
    effect.decision_seen = True
    if phase == "approved" and effect.approved is None:
        effect.approved = event
    if phase == "denied" and effect.terminal is None:
        effect.terminal, effect.terminal_reason = event, "denied"
    return in_order


def seq_or(value: Any, default: Any) -> Any:
    return value if type(value) is int else default


def corrupt(effect_id: str, group: list[Event], code: str, culprits: tuple[str, ...]) -> EffectDecision:
    """What a corrupt decision still names: the first intent's claims, for operators."""
    typed = [(event, kind_and_phase(event.type) or ("", "")) for event in group]
    intents = [event for event, (_kind, phase) in typed if phase == "requested"]
    first = intents[0] if intents else None
    kind = (kind_and_phase(first.type) or ("", ""))[0] if first is not None else typed[0][1][0]
    data = first.data if first is not None else {}
    resolutions = [event for event, (_kind, phase) in typed
                   if phase == "outcome_resolved" and well_formed(phase, event.data)]

    def text(name: str) -> str | None:
        return data.get(name) if is_text(data.get(name)) else None

    return EffectDecision(
        effect_id=effect_id, kind=kind, name=text("name"), state="corrupt", reason=code, evidence=culprits,
        retry_safe=False, semantics=text("semantics"), idempotency_key=text("idempotency_key"),
        args_hash=text("args_hash"), attempts=sum(1 for _event, (_k, phase) in typed if phase == "dispatched"),
        resolution=resolution_record(resolutions[0]) if resolutions else None,
        requested_seq=seq_or(first.seq, None) if first is not None else None, last_seq=seq_or(group[-1].seq, -1))


def decide(effect_id: str, group: list[Event], broken: tuple[str, ...] = ()) -> EffectDecision:
    if broken:
        return corrupt(effect_id, group, "broken_chain", broken)
    effect = Effect()
    for event in group:
        kind, phase = kind_and_phase(event.type) or ("", "")
        apply(effect, group, kind, phase, event)
    if effect.findings:
        code, culprits = min(effect.findings, key=lambda finding: RANK[finding[0]])  # the first of the lowest
        return corrupt(effect_id, group, code, culprits)
    intent = effect.intent
    assert intent is not None and effect.intent_ok
    semantics = intent.data["semantics"]
    resolution = None
    retry_safe = False
    if effect.terminal is not None:
        state, reason = "completed", effect.terminal_reason
        before = effect.parked if reason == "denied" else (effect.dispatches[-1] if effect.dispatches else None)
        evidence = [intent, *([before] if before is not None else []), effect.terminal]
    elif effect.dispatches:
        state = "unknown"
        evidence = [intent, effect.dispatches[-1], *([effect.indeterminate] if effect.indeterminate else [])]
        if effect.resolution is not None:
            reason, resolution = "resolved_by_operator", resolution_record(effect.resolution)
            evidence.append(effect.resolution)
        else:
            reason = "indeterminate_failure" if effect.indeterminate else "dispatched_without_receipt"
            retry_safe = semantics in ("read_only", "idempotent")
    elif effect.approved is None and effect.needs_approval():
        state, reason = "parked", "parked" if effect.parked is not None else "awaiting_approval"
        evidence = [intent, *([effect.parked] if effect.parked else [])]
    else:
        state, retry_safe = "not_dispatched", True
        if effect.approved is not None:
            reason = "approved_not_dispatched"
            evidence = [intent, *([effect.parked] if effect.parked else []), effect.approved]
        else:
            reason, evidence = "intent_only", [intent]
    return EffectDecision(
        effect_id=effect_id, kind=effect.kind, name=intent.data["name"], state=state, reason=reason,
        evidence=tuple(event.id for event in evidence), retry_safe=retry_safe, semantics=semantics,
        idempotency_key=intent.data["idempotency_key"], args_hash=intent.data["args_hash"],
        attempts=len(effect.dispatches), resolution=resolution, requested_seq=intent.seq,
        last_seq=seq_or(group[-1].seq, -1))


def first_bad_link(events: Sequence[Event], anchor_hash: str | None) -> tuple[int, int | None]:
    """Index and seq of the first event that does not follow the one before it (or the anchor)."""
    for index, event in enumerate(events):
        previous = events[index - 1] if index else None
        if type(event.seq) is not int:
            return index, (previous.seq + 1 if previous is not None else None) or 1
        if previous is not None and event.seq != previous.seq + 1:
            return index, event.seq
        if (previous.hash if previous is not None else anchor_hash) not in (None, event.prev_hash):
            return index, event.seq
    return -1, None


@dataclass
class Reference:
    decisions: dict[str, EffectDecision]
    chain_break_seq: int | None
    unattributed_events: tuple[str, ...]


def analyze(events: Sequence[Event], *, anchor_hash: str | None = None, chain_break_seq: int | None = None,
            check_links: bool = True) -> Reference:
    """The rules over one stream: what ``RecoveryResolver.analyze`` must answer."""
    groups: dict[str, list[Event]] = {}
    unattributed: list[str] = []
    for event in events:
        if kind_and_phase(event.type) is None:
            continue  # not a lifecycle event
        effect_id = event.data.get("effect_id") if type(event.data) is dict else None
        if not is_text(effect_id) or effect_id == "":
            unattributed.append(event.id)
        else:
            groups.setdefault(effect_id, []).append(event)
    index, seq = first_bad_link(events, anchor_hash) if check_links else (-1, None)
    known = [s for s in (seq, chain_break_seq) if s is not None]
    break_seq = min(known) if known else None
    after_break = {id(event) for event in events[index:]} if index >= 0 else set()

    def broken(group: list[Event]) -> tuple[str, ...]:
        return tuple(event.id for event in group if id(event) in after_break
                     or (break_seq is not None and type(event.seq) is int and event.seq >= break_seq))

    decisions = {effect_id: decide(effect_id, group, broken(group)) for effect_id, group in groups.items()}
    return Reference(decisions, break_seq, tuple(unattributed))
