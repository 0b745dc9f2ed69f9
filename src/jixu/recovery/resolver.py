"""The RecoveryResolver: classify every effect in a stream from its events alone.

This is the single authority on effect status. The harness, runs, HTTP API,
CLI and Studio consume its :class:`Analysis`; none of them derives effect state
on its own. It is a pure function of its input: no I/O, no clock, no
randomness, and it never mutates the events it is given.

Lifecycle events are typed ``<kind>.<phase>``: ``kind`` is any dotted prefix
(``tool``, ``model``, ``remote.deploy``) and ``phase`` the last segment, one of
:data:`PHASES`. Every other event type is ignored here, though it still takes
part in the chain-link check.

Each effect gets exactly one state from :data:`STATES`:

* ``completed``: a terminal receipt: ``completed``, a determinate ``failed``
  (after a dispatch, or before any: a rejection) or a ``denied`` before
  dispatch. Never re-run.
* ``not_dispatched``: the intent (approved, when approval is required) and no
  dispatch marker. Safe to dispatch.
* ``unknown``: the latest dispatch has no receipt, or an indeterminate
  failure. Retry-safe only for ``read_only``/``idempotent`` effects without an
  operator resolution; a resolution keeps the effect ``unknown`` (it is an
  operator fact, not a receipt) and is reported in ``resolution``.
* ``parked``: parked, or requiring approval, with no decision yet.
* ``corrupt``: the events contradict each other.

A corrupt effect's reason is the first code of :data:`CORRUPTION_REASONS`
whose rule its events break, in this fixed priority order:

1. ``broken_chain``: one of its events is at or after the first chain break;
2. ``malformed_lifecycle_event``: a required field is missing or ill-typed;
3. ``dispatch_without_intent``, ``receipt_without_intent``,
   ``event_without_intent``: an event with no *earlier* intent;
4. ``duplicate_intent``;
5. ``identity_mismatch``: kind, name or idempotency key differ from the intent's;
6. ``args_hash_mismatch``: in the intent itself, or in a dispatch;
7. ``duplicate_receipt``: two receipts for an attempt, or two terminal receipts;
8. ``unsafe_redispatch``: a second dispatch of an ``unsafe`` effect;
9. ``out_of_order``: any other event the history so far does not allow;
10. ``resolution_of_non_unknown``;
11. ``conflicting_resolutions``.

Where rules 9-11 meet:

* a lifecycle event (other than another resolution) after an
  ``outcome_resolved`` is ``out_of_order``;
* a second ``outcome_resolved`` is ``conflicting_resolutions``, whatever its
  body (an idempotent re-submission is the writer's job: it must not append);
* the first ``outcome_resolved`` when the effect was not ``unknown`` at that
  point is ``resolution_of_non_unknown``;
* ``parked`` / ``approved`` / ``denied`` belong before the first dispatch; any
  of them after a dispatch is ``out_of_order``, as is a second park or decision.

Lifecycle events without a usable ``effect_id`` belong to no effect; they are
listed in :attr:`Analysis.unattributed_events` and make the stream corrupt.

How it is computed: one walk
----------------------------

Every effect, whoever asks (:meth:`RecoveryResolver.analyze`,
:func:`decide_effect`, ``decision_text.ordinary_decision_text``), is decided
by :func:`_walk`, after rule 1 (``_decide``). The walk answers a *verdict*:
the decision's fields as a plain tuple (:data:`_Verdict`), or the first broken
rule (:data:`_Finding`); the callers build an :class:`EffectDecision` from it,
or, for a settled ordinary effect, its text (without building it).

The rules about an event's fields are each stated once, in a helper that both
stages of the walk call: :func:`_intent_claims` (rule 2 for an intent),
:func:`_args_hash_ok` (rule 6 for the intent's own args), :func:`_later_claims`
(rule 2 for every other phase, including whether a failure is indeterminate)
and :func:`_mismatch` (rules 5 and 6 for a later event). The walk has two
stages:

1. the ordinary lifecycle: an intent needing no approval, alone, with its
   dispatch of attempt 1, with that attempt's determinate receipt. Most
   effects (every effect in flight at an agent step, nearly every settled one)
   are this, and stage 1 answers them at once, without the state of stage 2;
2. :func:`_walk_all`, every rule over every event: at the first event that
   does not continue the ordinary lifecycle, stage 1 hands the group to it,
   which walks it from its first event.

What stage 1 states itself is only that order (intent, dispatch of attempt 1,
receipt of attempt 1, nothing before), which stage 2's rules allow; the tests
pin stage 1 to stage 2, and both to ``tests/recovery/reference.py``, a second,
plain statement of all the rules. ``tests/test_code_quality.py`` checks that
the fields these rules read are read only in the rule helpers.

Given an ``owner`` (the effect id asked about), the walk also checks that the
events are all that effect's lifecycle events, so :func:`decide_effect` and
the ordinary decision text skip the grouping and the chain-link check of
``analyze``; anything else they ask ``analyze``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final, Literal, TypeAlias, overload

from jixu.errors import JixuError
from jixu.ledger.encoding import content_hash, encode_plain
from jixu.ledger.event import Event

State: TypeAlias = Literal["completed", "not_dispatched", "unknown", "parked", "corrupt"]

STATES: Final[tuple[State, ...]] = ("completed", "not_dispatched", "unknown", "parked", "corrupt")
"""The five states; every effect is in exactly one."""

PHASES: Final[tuple[str, ...]] = (
    "requested",
    "parked",
    "approved",
    "denied",
    "dispatched",
    "completed",
    "failed",
    "outcome_resolved",
)
"""The last type segment of lifecycle events (``tool.requested`` …)."""

SEMANTICS: Final[tuple[str, ...]] = ("read_only", "idempotent", "unsafe")
"""Declared effect semantics; only ``read_only`` and ``idempotent`` may be retried."""

RESOLUTIONS: Final[tuple[str, ...]] = ("occurred", "not_occurred", "abandoned_unknown")
"""The operator's possible decisions about an unknown effect."""

CORRUPTION_REASONS: Final[dict[str, str]] = {
    "broken_chain": "an event of the effect is at or after the first break of the hash chain",
    "malformed_lifecycle_event": "a lifecycle event lacks a required field or has one of the wrong type/value",
    "dispatch_without_intent": "a dispatch marker with no earlier intent (requested event)",
    "receipt_without_intent": "a completed/failed/denied event with no earlier intent",
    "event_without_intent": "a parked/approved/outcome_resolved event with no earlier intent",
    "duplicate_intent": "more than one requested event for the same effect id",
    "identity_mismatch": "a later event's kind, name or idempotency key differs from the intent's",
    "args_hash_mismatch": "the intent's args_hash is not the hash of its args, or a dispatch names other args",
    "duplicate_receipt": "two receipts for one attempt, or two terminal receipts",
    "unsafe_redispatch": "an unsafe effect was dispatched more than once",
    "out_of_order": "a lifecycle event where the effect's history does not allow it",
    "resolution_of_non_unknown": "an outcome resolution for an effect that was not unknown at that point",
    "conflicting_resolutions": "more than one outcome resolution for the same effect",
}
"""Corruption reason codes in priority order: the first rule an effect breaks names it."""

DECISION_REASONS: Final[dict[str, State]] = {
    "succeeded": "completed",
    "failed": "completed",
    "rejected_before_dispatch": "completed",
    "denied": "completed",
    "intent_only": "not_dispatched",
    "approved_not_dispatched": "not_dispatched",
    "dispatched_without_receipt": "unknown",
    "indeterminate_failure": "unknown",
    "resolved_by_operator": "unknown",
    "parked": "parked",
    "awaiting_approval": "parked",
    **dict.fromkeys(CORRUPTION_REASONS, "corrupt"),
}
"""Every reason code a decision can carry, with the state it belongs to."""

# Rank of each corruption rule = its index in CORRUPTION_REASONS; lower wins.
_CODES: Final[tuple[str, ...]] = tuple(CORRUPTION_REASONS)
_BROKEN_CHAIN = _CODES.index("broken_chain")
_MALFORMED = _CODES.index("malformed_lifecycle_event")
_DISPATCH_WITHOUT_INTENT = _CODES.index("dispatch_without_intent")
_RECEIPT_WITHOUT_INTENT = _CODES.index("receipt_without_intent")
_EVENT_WITHOUT_INTENT = _CODES.index("event_without_intent")
_DUPLICATE_INTENT = _CODES.index("duplicate_intent")
_IDENTITY_MISMATCH = _CODES.index("identity_mismatch")
_ARGS_HASH_MISMATCH = _CODES.index("args_hash_mismatch")
_DUPLICATE_RECEIPT = _CODES.index("duplicate_receipt")
_UNSAFE_REDISPATCH = _CODES.index("unsafe_redispatch")
_OUT_OF_ORDER = _CODES.index("out_of_order")
_RESOLUTION_OF_NON_UNKNOWN = _CODES.index("resolution_of_non_unknown")
_CONFLICTING_RESOLUTIONS = _CODES.index("conflicting_resolutions")

_PHASE_SET: Final[frozenset[str]] = frozenset(PHASES)
_SEMANTICS_SET: Final[frozenset[str]] = frozenset(SEMANTICS)
_RETRYABLE: Final[frozenset[str]] = frozenset(("read_only", "idempotent"))
_RESOLUTION_SET: Final[frozenset[str]] = frozenset(RESOLUTIONS)
_WITHOUT_INTENT_RANK: Final[dict[str, int]] = {
    "dispatched": _DISPATCH_WITHOUT_INTENT,
    "completed": _RECEIPT_WITHOUT_INTENT,
    "failed": _RECEIPT_WITHOUT_INTENT,
    "denied": _RECEIPT_WITHOUT_INTENT,
    "parked": _EVENT_WITHOUT_INTENT,
    "approved": _EVENT_WITHOUT_INTENT,
    "outcome_resolved": _EVENT_WITHOUT_INTENT,
}

# Marks an event type not parsed yet.
_UNSEEN: Final[tuple[str, str]] = ("", "")

_TYPES: Final[dict[str, tuple[str, str] | None]] = {}
"""Each event type seen so far with its ``(kind, phase)``, or None when it is no lifecycle type: a memo of
:func:`_parse_type` (a pure function of the text) shared by every call, so no call splits a type it has seen.
It stops growing at :data:`_TYPES_KEPT` types; a call meeting more takes a copy of its own (see ``analyze``)."""
_TYPES_KEPT: Final[int] = 1024



@dataclass(frozen=True, slots=True)
class EffectDecision:
    """The resolver's verdict on one effect."""

    effect_id: str
    kind: str
    name: str | None
    state: State
    reason: str
    evidence: tuple[str, ...]
    """Ids of the events the decision rests on (for ``corrupt``: the contradicting ones)."""
    retry_safe: bool
    semantics: str | None
    idempotency_key: str | None
    args_hash: str | None
    attempts: int
    """Number of dispatch markers."""
    resolution: dict[str, Any] | None
    requested_seq: int | None
    last_seq: int

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict of every field."""
        return {
            "effect_id": self.effect_id,
            "kind": self.kind,
            "name": self.name,
            "state": self.state,
            "reason": self.reason,
            "evidence": list(self.evidence),
            "retry_safe": self.retry_safe,
            "semantics": self.semantics,
            "idempotency_key": self.idempotency_key,
            "args_hash": self.args_hash,
            "attempts": self.attempts,
            "resolution": None if self.resolution is None else dict(self.resolution),
            "requested_seq": self.requested_seq,
            "last_seq": self.last_seq,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EffectDecision:
        """The decision back from :meth:`to_dict` (e.g. out of a checkpoint)."""
        return cls(
            effect_id=data["effect_id"],
            kind=data["kind"],
            name=data["name"],
            state=data["state"],
            reason=data["reason"],
            evidence=tuple(data["evidence"]),
            retry_safe=data["retry_safe"],
            semantics=data["semantics"],
            idempotency_key=data["idempotency_key"],
            args_hash=data["args_hash"],
            attempts=data["attempts"],
            resolution=None if data["resolution"] is None else dict(data["resolution"]),
            requested_seq=data["requested_seq"],
            last_seq=data["last_seq"],
        )


@dataclass(frozen=True, slots=True)
class Analysis:
    """Every effect's decision plus the stream-level flags derived from them.

    Build it with :meth:`from_decisions` so the flags agree with the decisions.
    """

    decisions: dict[str, EffectDecision]
    """Keyed by effect id, in the order effects first appear."""
    chain_break_seq: int | None
    unattributed_events: tuple[str, ...]
    """Ids of lifecycle events without a usable ``effect_id`` (they make the stream corrupt)."""
    has_corruption: bool
    requires_resolution: tuple[str, ...]
    waiting_on_parked: tuple[str, ...]
    retry_safe_unknown: tuple[str, ...]
    not_dispatched: tuple[str, ...]
    corrupt: tuple[str, ...]
    safe_to_continue: bool

    @classmethod
    def from_decisions(
        cls,
        decisions: dict[str, EffectDecision],
        *,
        chain_break_seq: int | None = None,
        unattributed_events: tuple[str, ...] = (),
    ) -> Analysis:
        """Derive the stream flags from ``decisions``."""
        requires_resolution: list[str] = []
        waiting: list[str] = []
        retry_safe_unknown: list[str] = []
        not_dispatched: list[str] = []
        corrupt: list[str] = []
        for effect_id, decision in decisions.items():
            state = decision.state
            if state == "unknown":
                if decision.retry_safe:
                    retry_safe_unknown.append(effect_id)
                elif decision.semantics == "unsafe" and decision.resolution is None:
                    requires_resolution.append(effect_id)
            elif state == "parked":
                waiting.append(effect_id)
            elif state == "not_dispatched":
                not_dispatched.append(effect_id)
            elif state == "corrupt":
                corrupt.append(effect_id)
        has_corruption = bool(corrupt) or chain_break_seq is not None or bool(unattributed_events)
        # The slots filled directly, as _decision does (an analysis is built at every agent step).
        analysis: Analysis = _new(cls)
        _set_decisions(analysis, decisions)
        _set_chain_break_seq(analysis, chain_break_seq)
        _set_unattributed_events(analysis, unattributed_events)
        _set_has_corruption(analysis, has_corruption)
        _set_requires_resolution(analysis, tuple(requires_resolution))
        _set_waiting_on_parked(analysis, tuple(waiting))
        _set_retry_safe_unknown(analysis, tuple(retry_safe_unknown))
        _set_not_dispatched(analysis, tuple(not_dispatched))
        _set_corrupt(analysis, tuple(corrupt))
        _set_safe_to_continue(analysis, not has_corruption and not requires_resolution and not waiting)
        return analysis

    def by_state(self, state: State) -> list[EffectDecision]:
        """The decisions in ``state``, in order of first appearance."""
        return [d for d in self.decisions.values() if d.state == state]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the flags and every decision (keyed by effect id)."""
        return {
            "decisions": {eid: d.to_dict() for eid, d in self.decisions.items()},
            "chain_break_seq": self.chain_break_seq,
            "unattributed_events": list(self.unattributed_events),
            "has_corruption": self.has_corruption,
            "requires_resolution": list(self.requires_resolution),
            "waiting_on_parked": list(self.waiting_on_parked),
            "retry_safe_unknown": list(self.retry_safe_unknown),
            "not_dispatched": list(self.not_dispatched),
            "corrupt": list(self.corrupt),
            "safe_to_continue": self.safe_to_continue,
        }


def _str_or_absent(data: dict[str, Any], key: str) -> bool:
    value = data.get(key)
    return value is None or type(value) is str


def _well_formed(phase: str, data: dict[str, Any]) -> bool:
    """Rule 2 for ``parked``, ``approved``, ``denied`` and ``outcome_resolved``: ``data`` has every field
    ``phase`` requires, with the right types (:func:`_later_claims` asks it; the other phases are its own
    and :func:`_intent_claims`'s)."""
    if phase == "parked":
        return type(data.get("reason")) is str
    if phase == "outcome_resolved":
        resolution = data.get("resolution")
        resolution_id = data.get("resolution_id")
        return (
            type(resolution) is str
            and resolution in _RESOLUTION_SET
            and type(resolution_id) is str
            and resolution_id != ""
            and _str_or_absent(data, "actor")
            and _str_or_absent(data, "note")
        )
    # approved / denied: only effect_id is required; actor and note are optional text.
    return _str_or_absent(data, "actor") and _str_or_absent(data, "note")


def _args_hash_ok(data: dict[str, Any]) -> bool | None:
    """True/False: does args_hash match the args? None: the args cannot be hashed."""
    args = data["args"]
    if type(args) is dict and not args:
        return bool(data["args_hash"] == _EMPTY_ARGS_HASH)
    if type(args) is dict and _FLAT_TYPES.issuperset(map(type, args.values())) \
            and _KEY_TYPES.issuperset(map(type, args)):
        # A flat object of text, integers, booleans and nulls (tool and model arguments, usually):
        # canonical_text's type walk cannot fail on it, so encode it with the same encoder directly.
        try:
            text = encode_plain(args).encode("utf-8")
        except ValueError:  # a lone surrogate or an integer too long to print: content_hash fails too
            return None
        return bool(hashlib.sha256(text).hexdigest() == data["args_hash"])
    try:
        return bool(content_hash(args) == data["args_hash"])
    except (JixuError, TypeError, ValueError, RecursionError):
        return None


_EMPTY_ARGS_HASH: Final[str] = content_hash({})
_FLAT_TYPES: Final[frozenset[type]] = frozenset((str, int, bool, type(None)))
_KEY_TYPES: Final[frozenset[type]] = frozenset((str,))


def _resolution_of(event: Event) -> dict[str, Any]:
    data = event.data
    return {
        "resolution": data.get("resolution"),
        "resolution_id": data.get("resolution_id"),
        "actor": data.get("actor"),
        "note": data.get("note"),
        "event_id": event.id,
        # Optional facts the operator attached (e.g. for "occurred"), only when recorded.
        **{key: data[key] for key in ("evidence", "result") if key in data},
    }


def _text(data: dict[str, Any], key: str) -> str | None:
    value = data.get(key)
    return value if type(value) is str else None


_Verdict: TypeAlias = tuple[str, str | None, State, str, tuple[str, ...], bool, str | None, str | None, str | None,
                            int, dict[str, Any] | None, int | None, int]
"""What the walk decides about an effect whose events do not contradict each other: the fields of its
:class:`EffectDecision` after ``effect_id``, in their order (``kind`` … ``requested_seq``, ``last_seq``), with
``last_seq`` the last event's seq as recorded (``_decide`` writes -1 for one that is not an integer)."""

_Finding: TypeAlias = tuple[int, tuple[str, ...]]
"""A broken rule: its rank (index in :data:`CORRUPTION_REASONS`) and the culprit event ids."""


def _decide(
    effect_id: str,
    group: Sequence[Event],
    types: dict[str, tuple[str, str] | None],
    covered: frozenset[int],
    break_seq: int | None,
) -> EffectDecision:
    """Classify one effect from its lifecycle events (in input order)."""
    # Rule 1 first and on its own: nothing at or after a chain break can be trusted.
    if covered or break_seq is not None:
        broken = tuple(
            event.id
            for event in group
            if id(event) in covered
            or (break_seq is not None and type(event.seq) is int and event.seq >= break_seq)
        )
        if broken:
            return _corrupt(effect_id, group, types, _BROKEN_CHAIN, broken, _last_seq(group))

    verdict = _walk(group, types)
    if len(verdict) == 2:
        return _corrupt(effect_id, group, types, verdict[0], verdict[1], _last_seq(group))
    kind, name, state, reason, evidence, retry_safe, semantics, key, args_hash, attempts, resolution, \
        requested_seq, last_seq = verdict
    return _decision(effect_id, kind, name, state, reason, evidence, retry_safe, semantics, key, args_hash, attempts,
                     resolution, requested_seq, last_seq if type(last_seq) is int else -1)


def _last_seq(group: Sequence[Event]) -> int:
    last_seq = group[-1].seq
    return last_seq if type(last_seq) is int else -1


def _intent_claims(data: dict[str, Any]) -> tuple[str, str, str, str, bool] | None:
    """Rule 2 for an intent: its ``(name, idempotency_key, args_hash, semantics, requires_approval)`` when
    ``data`` has them all with the right types (and ``args`` an object), else None."""
    name = data.get("name")
    key = data.get("idempotency_key")
    claimed_hash = data.get("args_hash")
    semantics = data.get("semantics")
    approval = data.get("requires_approval", False)
    if (
        type(name) is str
        and type(data.get("args")) is dict
        and type(claimed_hash) is str
        and type(semantics) is str
        and semantics in _SEMANTICS_SET
        and type(key) is str
        and type(approval) is bool
    ):
        return name, key, claimed_hash, semantics, approval
    return None


def _later_claims(phase: str, data: dict[str, Any]) -> tuple[Any, Any, Any, Any, bool] | None:
    """Rule 2 for every other phase: the event's ``(attempt, name, idempotency_key, args_hash,
    indeterminate)`` when it has every field its phase requires with the right types, else None.

    An attempt is a positive int (bool is an int subclass: an attempt of True is malformed, not attempt 1);
    the identity fields a later event may repeat are absent (None) or text; ``indeterminate`` is True only
    for a failure that says so.
    """
    attempt = data.get("attempt")
    if "name" in data or "idempotency_key" in data or "args_hash" in data:  # most later events repeat none
        name = data.get("name")
        key = data.get("idempotency_key")
        claimed_hash = data.get("args_hash")
    else:
        name = key = claimed_hash = None
    if phase == "dispatched":
        if (
            type(attempt) is int
            and attempt >= 1
            and (name is None or type(name) is str)
            and (key is None or type(key) is str)
            and (claimed_hash is None or type(claimed_hash) is str)
        ):
            return attempt, name, key, claimed_hash, False
    elif phase == "completed":
        # The result inline, or a reference to an artifact holding it.
        if type(attempt) is int and attempt >= 1 and ("result" in data or isinstance(data.get("result_artifact"), dict)):
            return attempt, name, key, claimed_hash, False
    elif phase == "failed":
        indeterminate = data.get("indeterminate")
        if (
            (attempt is None or (type(attempt) is int and attempt >= 1))
            and type(data.get("error")) is dict
            and type(indeterminate) is bool
        ):
            return attempt, name, key, claimed_hash, indeterminate
    elif _well_formed(phase, data):
        return attempt, name, key, claimed_hash, False
    return None


def _mismatch(kind: str, name: str | None, key: str | None, claimed_hash: str | None, event_kind: str,
              other_name: Any, other_key: Any, other_hash: Any) -> int:
    """Rules 5 and 6 for a later event: 0 when it names the intent's kind and, of the intent's name, key and
    args hash, repeats only the very ones; else ``_NAMES_OTHER`` and/or ``_HASHES_OTHER``."""
    found = 0
    if event_kind != kind or (other_name is not None and other_name != name) or (
        other_key is not None and other_key != key
    ):
        found = _NAMES_OTHER
    if other_hash is not None and other_hash != claimed_hash:
        found |= _HASHES_OTHER
    return found


_NAMES_OTHER: Final[int] = 1
_HASHES_OTHER: Final[int] = 2
_RECEIPT_PHASES: Final[frozenset[str]] = frozenset(("completed", "failed"))


@overload
def _walk(group: Sequence[Event], types: dict[str, tuple[str, str] | None]) -> _Verdict | _Finding: ...
@overload
def _walk(group: Sequence[Event], types: dict[str, tuple[str, str] | None], owner: object) -> _Verdict | None: ...
def _walk(group: Sequence[Event], types: dict[str, tuple[str, str] | None],
          owner: object = None) -> _Verdict | _Finding | None:
    """The one walk: the verdict on one effect from its lifecycle events (in input order), or the corruption
    rule they break first (lowest rank; on a tie, the first found). Every rule but the chain-break rule.

    Stage 1 takes the ordinary lifecycle (an intent needing no approval, alone, with its first dispatch,
    with that attempt's determinate receipt) event by event and answers it at once; at the first event
    that does not continue it, stage 2 (:func:`_walk_all`, every rule) walks the group from its start. Both
    stages ask the same rule helpers about an event's fields (:func:`_intent_claims`, :func:`_args_hash_ok`,
    :func:`_later_claims`, :func:`_mismatch`); stage 1 states only the ordinary order (intent, dispatch of
    attempt 1, receipt of attempt 1), which stage 2's ordering rules (3 and 9) allow.

    With an ``owner`` (an effect id; for :func:`decide_effect` and ``ordinary_decision_text``) the walk also
    checks as it goes that ``group`` is ``analyze``'s group of that effect (each event a lifecycle event
    with ``owner`` as its effect id; its type is parsed into ``types`` if it was not yet), and answers the
    verdict of such a group whose events do not contradict each other, None for anything else.
    """
    if owner == "" or not group:
        return None  # events without an effect id belong to no effect (and analyze makes no empty group)
    try:
        # Stage 1: the ordinary lifecycle. Grouped events are lifecycle events, so the cache holds a
        # (kind, phase) for them. With an owner, an event of a type not parsed yet raises KeyError here, one
        # of another type TypeError (see below).
        count = len(group)
        intent = group[0]
        kind, phase = types[intent.type]  # type: ignore[misc]
        data = intent.data
        if owner is not None and (
            type(data) is not dict or (own := data.get("effect_id")) != owner or type(own) is not str
        ):
            return None
        if count <= 3 and phase == "requested":
            claims = _intent_claims(data)
            if claims is not None and not claims[4] and _args_hash_ok(data):
                name, key, claimed_hash, semantics, _approval = claims
                if count == 1:
                    return (kind, name, "not_dispatched", "intent_only", (intent.id,), True, semantics, key,
                            claimed_hash, 0, None, intent.seq, intent.seq)
                dispatch = group[1]
                event_kind, phase = types[dispatch.type]  # type: ignore[misc]
                data = dispatch.data
                if owner is not None and (
                    type(data) is not dict or (own := data.get("effect_id")) != owner or type(own) is not str
                ):
                    return None
                later = _later_claims(phase, data) if phase == "dispatched" else None
                if later is not None and later[0] == 1 and not _mismatch(
                        kind, name, key, claimed_hash, event_kind, later[1], later[2], later[3]):
                    if count == 2:
                        return (kind, name, "unknown", "dispatched_without_receipt", (intent.id, dispatch.id),
                                semantics in _RETRYABLE, semantics, key, claimed_hash, 1, None, intent.seq,
                                dispatch.seq)
                    receipt = group[2]
                    event_kind, phase = types[receipt.type]  # type: ignore[misc]
                    data = receipt.data
                    if owner is not None and (
                        type(data) is not dict or (own := data.get("effect_id")) != owner or type(own) is not str
                    ):
                        return None
                    later = _later_claims(phase, data) if phase in _RECEIPT_PHASES else None
                    if later is not None and later[0] == 1 and not later[4] and not _mismatch(
                            kind, name, key, claimed_hash, event_kind, later[1], later[2], later[3]):
                        return (kind, name, "completed", "succeeded" if phase == "completed" else "failed",
                                (intent.id, dispatch.id, receipt.id), False, semantics, key, claimed_hash, 1, None,
                                intent.seq, receipt.seq)
        # Stage 2: every rule, from the first event.
        return _walk_all(group, types, owner)
    except KeyError:
        if owner is None:
            raise
        # A type not parsed yet: walk again once the group's types are known.
        learned = _learn_types(group, types)
        return _walk(group, learned, owner) if learned is not None else None
    except TypeError:
        if owner is None:
            raise
        return None  # an event of no lifecycle type (None in the cache), or of a type that is no str


def _walk_all(group: Sequence[Event], types: dict[str, tuple[str, str] | None],
              owner: object) -> _Verdict | _Finding | None:
    """Stage 2 of :func:`_walk`: every rule over every event (the caller handles KeyError / TypeError)."""
    findings: list[_Finding] = []  # (rank, culprit event ids) of every rule broken

    intent: Event | None = None
    kind = ""
    name: str | None = None
    key: str | None = None
    claimed_hash: str | None = None
    semantics: str | None = None
    requires_approval = False

    # The walk's view of the effect so far.
    parked_event: Event | None = None
    approved_event: Event | None = None
    decided = False  # approved or denied was recorded
    terminal_event: Event | None = None
    terminal_reason = ""
    dispatch_count = 0
    last_dispatch: Event | None = None
    last_attempt = 0
    attempt_unknown = False  # the latest dispatch has no receipt, or an indeterminate one
    indeterminate_event: Event | None = None
    receipts: dict[int, Event] | None = None  # attempt -> first receipt; made on first use
    resolution_event: Event | None = None
    attempt: Any  # an int once the event is known to be well formed, else anything

    for event in group:
        event_kind, phase = types[event.type]  # type: ignore[misc]
        data = event.data
        if owner is not None and (
            type(data) is not dict or (own := data.get("effect_id")) != owner or type(own) is not str
        ):
            return None

        if phase == "requested":
            # Rule 2 for an intent; then rule 4, and rule 6 for the intent's own args hash.
            claims = _intent_claims(data)
            if claims is None:
                findings.append((_MALFORMED, (event.id,)))
                if intent is None:
                    # Still the intent for ordering, so later events are not also "without intent".
                    intent, kind = event, event_kind
            elif intent is not None:
                findings.append((_DUPLICATE_INTENT, (intent.id, event.id)))
            else:
                intent, kind = event, event_kind
                name, key, claimed_hash, semantics, requires_approval = claims
                hash_ok = _args_hash_ok(data)  # the one re-hash of the args, once per intent
                if hash_ok is None:
                    findings.append((_MALFORMED, (event.id,)))
                elif not hash_ok:
                    findings.append((_ARGS_HASH_MISMATCH, (event.id,)))
            continue

        later = _later_claims(phase, data)  # rule 2
        if later is None:
            findings.append((_MALFORMED, (event.id,)))
            continue
        if intent is None:  # rule 3
            findings.append((_WITHOUT_INTENT_RANK[phase], (event.id,)))
            continue
        attempt, other_name, other_key, other_hash, indeterminate = later
        mismatch = _mismatch(kind, name, key, claimed_hash, event_kind, other_name, other_key, other_hash)
        if mismatch:  # rules 5 and 6
            if mismatch & _NAMES_OTHER:
                findings.append((_IDENTITY_MISMATCH, (intent.id, event.id)))
            if mismatch & _HASHES_OTHER:
                findings.append((_ARGS_HASH_MISMATCH, (intent.id, event.id)))

        # Rules 7-11 (which finding an event adds first does not matter: the lowest rank wins, and on a
        # tie the earliest event). Nothing but a (conflicting) second resolution may follow a resolution.
        if resolution_event is not None and phase != "outcome_resolved":
            findings.append((_OUT_OF_ORDER, (event.id,)))

        if phase == "dispatched":
            dispatch_count += 1
            if dispatch_count > 1 and semantics == "unsafe":
                findings.append((_UNSAFE_REDISPATCH, _ids_of_phase(group, types, "dispatched", event)))
            # A dispatch comes after the approval when one is needed, before any terminal receipt, names the
            # next attempt, and follows an attempt only while that attempt's outcome is unknown.
            if (
                terminal_event is not None
                or ((requires_approval or parked_event is not None) and approved_event is None)
                or attempt != last_attempt + 1
                or (last_attempt > 0 and not attempt_unknown)
            ):
                findings.append((_OUT_OF_ORDER, (event.id,)))
            last_dispatch = event
            last_attempt = attempt
            attempt_unknown = True
            indeterminate_event = None
        elif phase == "completed" or phase == "failed":  # noqa: PLR1714 (faster than a tuple test)
            # One receipt per attempt, and one terminal receipt.
            if terminal_event is not None:
                findings.append((_DUPLICATE_RECEIPT, (terminal_event.id, event.id)))
            elif attempt is not None and receipts is not None and attempt in receipts:
                findings.append((_DUPLICATE_RECEIPT, (receipts[attempt].id, event.id)))
            if attempt is not None:
                if receipts is None:
                    receipts = {attempt: event}
                elif attempt not in receipts:
                    receipts[attempt] = event
            # A receipt is of the latest attempt; before any dispatch, only a determinate failure without an
            # attempt (a rejection) fits.
            if (attempt != last_attempt) if last_attempt else (
                    phase == "completed" or indeterminate or attempt is not None):
                findings.append((_OUT_OF_ORDER, (event.id,)))
            attempt_unknown = indeterminate
            if indeterminate:
                indeterminate_event = event
            elif terminal_event is None:
                terminal_event = event
                if phase == "completed":
                    terminal_reason = "succeeded"
                else:
                    terminal_reason = "failed" if last_attempt else "rejected_before_dispatch"
        elif phase == "outcome_resolved":
            if resolution_event is not None:
                findings.append((_CONFLICTING_RESOLUTIONS, (resolution_event.id, event.id)))
            else:
                if terminal_event is not None or not attempt_unknown:
                    findings.append((_RESOLUTION_OF_NON_UNKNOWN, (event.id,)))
                resolution_event = event
        elif phase == "parked":
            # Parking belongs before the first dispatch, once, before any decision.
            if terminal_event is not None or dispatch_count or parked_event is not None or decided:
                findings.append((_OUT_OF_ORDER, (event.id,)))
            if parked_event is None:
                parked_event = event
        else:  # approved / denied
            if terminal_event is not None and phase == "denied":
                # A denial is a terminal receipt, so this is a second terminal receipt.
                findings.append((_DUPLICATE_RECEIPT, (terminal_event.id, event.id)))
            elif (
                terminal_event is not None
                or dispatch_count
                or decided
                or (parked_event is None and not requires_approval)
            ):
                findings.append((_OUT_OF_ORDER, (event.id,)))
            decided = True
            if phase == "approved":
                if approved_event is None:
                    approved_event = event
            elif terminal_event is None:
                terminal_event = event
                terminal_reason = "denied"

    if findings:
        return min(findings, key=_rank_of) if owner is None else None
    # Without findings there is exactly one well-formed intent, and it came first.
    assert intent is not None
    last_seq = group[-1].seq
    if terminal_event is not None:
        if parked_event is not None and terminal_reason == "denied":
            evidence: tuple[str, ...] = (intent.id, parked_event.id, terminal_event.id)
        elif last_dispatch is not None:
            evidence = (intent.id, last_dispatch.id, terminal_event.id)
        else:
            evidence = (intent.id, terminal_event.id)
        return (kind, name, "completed", terminal_reason, evidence, False, semantics, key, claimed_hash,
                dispatch_count, None, intent.seq, last_seq)
    if last_dispatch is not None:
        if resolution_event is not None:
            # An operator fact, not a receipt: the effect stays unknown but needs no more waiting.
            return (kind, name, "unknown", "resolved_by_operator",
                    (intent.id, last_dispatch.id, *_ids(indeterminate_event), resolution_event.id), False,
                    semantics, key, claimed_hash, dispatch_count, _resolution_of(resolution_event), intent.seq,
                    last_seq)
        if indeterminate_event is None:
            return (kind, name, "unknown", "dispatched_without_receipt", (intent.id, last_dispatch.id),
                    semantics in _RETRYABLE, semantics, key, claimed_hash, dispatch_count, None, intent.seq, last_seq)
        return (kind, name, "unknown", "indeterminate_failure", (intent.id, last_dispatch.id, indeterminate_event.id),
                semantics in _RETRYABLE, semantics, key, claimed_hash, dispatch_count, None, intent.seq, last_seq)
    if approved_event is not None:
        return (kind, name, "not_dispatched", "approved_not_dispatched",
                (intent.id, *_ids(parked_event), approved_event.id), True, semantics, key, claimed_hash, 0, None,
                intent.seq, last_seq)
    if parked_event is not None:
        return (kind, name, "parked", "parked", (intent.id, parked_event.id), False, semantics, key, claimed_hash,
                0, None, intent.seq, last_seq)
    if requires_approval:
        # A required approval with no parked record yet (crash in between) is still parked.
        return (kind, name, "parked", "awaiting_approval", (intent.id,), False, semantics, key, claimed_hash, 0,
                None, intent.seq, last_seq)
    return (kind, name, "not_dispatched", "intent_only", (intent.id,), True, semantics, key, claimed_hash, 0, None,
            intent.seq, last_seq)


def _rank_of(finding: tuple[int, tuple[str, ...]]) -> int:
    return finding[0]


def _ids(event: Event | None) -> tuple[str, ...]:
    return () if event is None else (event.id,)


def _ids_of_phase(
    group: Sequence[Event], types: dict[str, tuple[str, str] | None], phase: str, upto: Event
) -> tuple[str, ...]:
    """Ids of ``group``'s events of ``phase`` up to and including ``upto``."""
    found: list[str] = []
    for event in group:
        parsed = types[event.type]
        if parsed is not None and parsed[1] == phase:
            found.append(event.id)
        if event is upto:
            break
    return tuple(found)


def _corrupt(
    effect_id: str,
    group: Sequence[Event],
    types: dict[str, tuple[str, str] | None],
    rank: int,
    culprits: tuple[str, ...],
    last_seq: int,
) -> EffectDecision:
    """A corrupt decision that still names what the first intent claimed, for operators."""
    intent: Event | None = None
    kind = ""
    attempts = 0
    resolution_event: Event | None = None
    for event in group:
        event_kind, phase = types[event.type] or ("", "")
        if not kind:
            kind = event_kind
        if phase == "requested" and intent is None:
            intent, kind = event, event_kind
        elif phase == "dispatched":
            attempts += 1
        elif phase == "outcome_resolved" and resolution_event is None and _well_formed(phase, event.data):
            resolution_event = event
    data = intent.data if intent is not None else {}
    return EffectDecision(
        effect_id=effect_id,
        kind=kind,
        name=_text(data, "name"),
        state="corrupt",
        reason=_CODES[rank],
        evidence=culprits,
        retry_safe=False,
        semantics=_text(data, "semantics"),
        idempotency_key=_text(data, "idempotency_key"),
        args_hash=_text(data, "args_hash"),
        attempts=attempts,
        resolution=None if resolution_event is None else _resolution_of(resolution_event),
        requested_seq=intent.seq if intent is not None and type(intent.seq) is int else None,
        last_seq=last_seq,
    )


class RecoveryResolver:
    """The single authority on effect state; see :meth:`analyze`."""

    @staticmethod
    def analyze(
        events: Sequence[Event],
        *,
        anchor_hash: str | None = None,
        chain_break_seq: int | None = None,
        check_links: bool = True,
    ) -> Analysis:
        """Classify every effect in ``events`` (one stream, in seq order, possibly a tail).

        ``check_links=False`` is for callers that pass a selection of events
        from a chain they verified themselves (e.g. only the events of effects
        still open at a checkpoint): the link check is skipped and only
        ``chain_break_seq`` marks a break.

        The chain-link check is cheap (no rehashing): seq must grow by exactly
        one and each ``prev_hash`` must equal the previous event's ``hash``;
        the first event is checked against ``anchor_hash`` when given. A caller
        that ran full verification passes the first bad seq it found as
        ``chain_break_seq``; the earlier of the two breaks is reported. An
        effect is ``broken_chain`` when one of its events comes at or after the
        first bad link in the given order, or has a seq at or above the
        reported break.

        Never raises on odd input: what cannot be understood is corrupt.
        """
        # Per-effect lists of events only: no per-event tuples, which (with the
        # cyclic GC they provoke) were the largest cost on long streams.
        groups: dict[str, list[Event]] = {}
        unattributed: list[str] = []
        types = _TYPES  # no split per event; the walk reads each event's (kind, phase) from it again

        break_index, detected_seq = _first_break(events, anchor_hash) if check_links else (-1, None)

        for event in events:
            event_type = event.type
            parsed = types.get(event_type, _UNSEEN) if type(event_type) is str else None
            if parsed is _UNSEEN:
                parsed = _parse_type(event_type)
                if len(types) >= _TYPES_KEPT and types is _TYPES:
                    types = dict(_TYPES)  # full: this call remembers the rest in a copy of its own
                types[event_type] = parsed
            if parsed is None:
                continue
            data = event.data
            effect_id = data.get("effect_id") if type(data) is dict else None
            if type(effect_id) is not str or not effect_id:
                unattributed.append(event.id)
                continue
            group = groups.get(effect_id)
            if group is None:
                groups[effect_id] = [event]
            else:
                group.append(event)

        if detected_seq is None:
            break_seq = chain_break_seq
        elif chain_break_seq is None:
            break_seq = detected_seq
        else:
            break_seq = min(detected_seq, chain_break_seq)
        # Identity of the events after the first bad link (they may carry any seq at all).
        covered = (
            frozenset(id(event) for event in islice(events, break_index, None))
            if break_index >= 0
            else frozenset()
        )

        decisions = {
            effect_id: _decide(effect_id, group, types, covered, break_seq)
            for effect_id, group in groups.items()
        }
        return Analysis.from_decisions(
            decisions, chain_break_seq=break_seq, unattributed_events=tuple(unattributed)
        )


def decide_effect(effect_id: str, events: Sequence[Event]) -> EffectDecision | None:
    """The decision ``analyze(events, check_links=False).decisions.get(effect_id)`` returns.

    For a caller that keeps one effect's lifecycle events (from a chain it
    verified) and asks about that effect alone, e.g. when a receipt arrives.
    The walk checks as it goes that the events are all lifecycle events of
    ``effect_id``: then they are the very group ``analyze`` would make, and
    when they do not contradict each other nothing else is done (no grouping,
    no chain-link check). Anything else is asked of ``analyze`` itself.
    """
    verdict = _walk(events, _TYPES, effect_id or "")  # (an owner of None would be no owner)
    if verdict is None:
        return RecoveryResolver.analyze(events, check_links=False).decisions.get(effect_id)
    kind, name, state, reason, evidence, retry_safe, semantics, key, args_hash, attempts, resolution, \
        requested_seq, last_seq = verdict
    return _decision(effect_id, kind, name, state, reason, evidence, retry_safe, semantics, key, args_hash, attempts,
                     resolution, requested_seq, last_seq if type(last_seq) is int else -1)


def _learn_types(events: Sequence[Event],
                 types: dict[str, tuple[str, str] | None]) -> dict[str, tuple[str, str] | None] | None:
    """``types`` with every event's type parsed into it (into a copy, when it is :data:`_TYPES` and full), or
    None when it held them all already or one is no str."""
    learned = None
    for event in events:
        event_type = event.type
        if type(event_type) is not str:
            return None
        if event_type not in types:
            if types is _TYPES and len(types) >= _TYPES_KEPT:
                types = dict(types)  # full: this call remembers the rest in a copy of its own
            types[event_type] = _parse_type(event_type)
            learned = types
    return learned


def _decision(effect_id: str, kind: str, name: str | None, state: State, reason: str, evidence: tuple[str, ...],
              retry_safe: bool, semantics: str | None, key: str | None, args_hash: str | None, attempts: int,
              resolution: dict[str, Any] | None, requested_seq: int | None, last_seq: int) -> EffectDecision:
    """``EffectDecision(...)`` with the slots filled directly: about twice as fast as the frozen dataclass's
    ``__init__`` (which calls ``object.__setattr__`` per field), for the paths that decide at every step."""
    decision: EffectDecision = _new(EffectDecision)
    _set_effect_id(decision, effect_id)
    _set_kind(decision, kind)
    _set_name(decision, name)
    _set_state(decision, state)
    _set_reason(decision, reason)
    _set_evidence(decision, evidence)
    _set_retry_safe(decision, retry_safe)
    _set_semantics(decision, semantics)
    _set_idempotency_key(decision, key)
    _set_args_hash(decision, args_hash)
    _set_attempts(decision, attempts)
    _set_resolution(decision, resolution)
    _set_requested_seq(decision, requested_seq)
    _set_last_seq(decision, last_seq)
    return decision


_new = object.__new__
(_set_decisions, _set_chain_break_seq, _set_unattributed_events, _set_has_corruption, _set_requires_resolution,
 _set_waiting_on_parked, _set_retry_safe_unknown, _set_not_dispatched, _set_corrupt, _set_safe_to_continue) = (
    Analysis.__dict__[name].__set__ for name in (
        "decisions", "chain_break_seq", "unattributed_events", "has_corruption", "requires_resolution",
        "waiting_on_parked", "retry_safe_unknown", "not_dispatched", "corrupt", "safe_to_continue"))
(_set_effect_id, _set_kind, _set_name, _set_state, _set_reason, _set_evidence, _set_retry_safe, _set_semantics,
 _set_idempotency_key, _set_args_hash, _set_attempts, _set_resolution, _set_requested_seq, _set_last_seq) = (
    EffectDecision.__dict__[name].__set__ for name in (
        "effect_id", "kind", "name", "state", "reason", "evidence", "retry_safe", "semantics", "idempotency_key",
        "args_hash", "attempts", "resolution", "requested_seq", "last_seq"))


def _first_break(events: Sequence[Event], anchor_hash: str | None) -> tuple[int, int | None]:
    """Position and seq of the first event that does not link to the one before it, or (-1, None)."""
    expected_seq: int | None = None
    expected_prev = anchor_hash
    for index, event in enumerate(events):
        seq = event.seq
        if type(seq) is not int:
            return index, expected_seq or 1
        if expected_seq is not None and seq != expected_seq:
            return index, seq
        if expected_prev is not None and event.prev_hash != expected_prev:
            return index, seq
        expected_seq = seq + 1
        expected_prev = event.hash
    return -1, None


def _parse_type(event_type: str) -> tuple[str, str] | None:
    """``(kind, phase)`` for a lifecycle event type, else None."""
    kind, _dot, phase = event_type.rpartition(".")
    if not kind or phase not in _PHASE_SET:
        return None
    return kind, phase


def analyze(
    events: Sequence[Event],
    *,
    anchor_hash: str | None = None,
    chain_break_seq: int | None = None,
    check_links: bool = True,
) -> Analysis:
    """Alias of :meth:`RecoveryResolver.analyze`."""
    return RecoveryResolver.analyze(events, anchor_hash=anchor_hash, chain_break_seq=chain_break_seq,
                                    check_links=check_links)


__all__ = [
    "CORRUPTION_REASONS",
    "DECISION_REASONS",
    "PHASES",
    "RESOLUTIONS",
    "SEMANTICS",
    "STATES",
    "Analysis",
    "EffectDecision",
    "RecoveryResolver",
    "State",
    "analyze",
    "decide_effect",
]
