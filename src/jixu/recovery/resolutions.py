"""Admitting an operator's outcome resolution: the rules every stream shares (SPEC 4.4).

An outcome resolution is an operator fact about an effect whose outcome is
``unknown``: ``occurred``, ``not_occurred`` or ``abandoned_unknown``. It is
idempotent by resolution id (the same id and body is a no-op; a changed body,
or the id reused for another effect, is a conflict) and it can never change.
These checks read the resolver's :class:`~jixu.recovery.Analysis` only, so a
thread and a run apply exactly the same rules.
"""

from __future__ import annotations

from typing import Any

from jixu.errors import EffectNotUnknown, InvalidInput, NotFound, ResolutionConflict
from jixu.ledger.encoding import canonical_text
from jixu.recovery.resolver import RESOLUTIONS, Analysis, EffectDecision

MAX_NOTE_CHARS = 10_000
_COMPARED = ("resolution_id", "resolution", "note", "evidence", "result")


def resolution_body(effect_id: object, resolution: object, resolution_id: object, *, actor: object,
                    note: object = None, evidence: object = None, result: object = None) -> dict[str, Any]:
    """The ``<kind>.outcome_resolved`` data for these arguments; :class:`InvalidInput` naming the bad field."""
    for name, value, limit, required in (("effect_id", effect_id, 100, True),
                                         ("resolution_id", resolution_id, 100, True),
                                         ("actor", actor, 200, True), ("note", note, MAX_NOTE_CHARS, False)):
        if value is None and not required:
            continue
        if not isinstance(value, str) or not value.strip() or len(value) > limit:
            raise InvalidInput(f"{name} must be a non-empty string of at most {limit} characters", field=name)
    if resolution not in RESOLUTIONS:
        raise InvalidInput(f"resolution {resolution!r} must be one of {list(RESOLUTIONS)}", field="resolution")
    if evidence is not None and not isinstance(evidence, dict):
        raise InvalidInput("evidence must be a JSON object", field="evidence")
    if result is not None and resolution != "occurred":
        raise InvalidInput("a result can only accompany resolution 'occurred'", field="result")
    body: dict[str, Any] = {"effect_id": effect_id, "resolution": resolution, "resolution_id": resolution_id,
                            "actor": actor, "note": note}
    if evidence is not None:
        body["evidence"] = evidence
    if result is not None:
        body["result"] = result
    canonical_text(body, path="resolution")  # non-JSON evidence or results are refused before anything is read
    return body


def admit_resolution(analysis: Analysis, body: dict[str, Any], *, where: str) -> EffectDecision | None:
    """The decision being resolved, or ``None`` when ``body`` repeats the recorded resolution exactly.

    Raises :class:`~jixu.errors.NotFound` (no such effect in ``where``),
    :class:`~jixu.errors.ResolutionConflict` (already resolved differently, or
    the resolution id was used for another effect) or
    :class:`~jixu.errors.EffectNotUnknown` (only an unknown outcome can be
    resolved). Nothing is written here: the caller appends
    ``<decision.kind>.outcome_resolved`` with ``body``.
    """
    effect_id, resolution_id = body["effect_id"], body["resolution_id"]
    decision = analysis.decisions.get(effect_id)
    if decision is None:
        raise NotFound(f"{where} has no effect {effect_id!r}", effect_id=effect_id)
    if decision.resolution is not None:
        recorded = decision.resolution
        if all(recorded.get(key) == body.get(key) for key in _COMPARED):
            return None
        raise ResolutionConflict(
            f"effect {effect_id} was already resolved as {recorded.get('resolution')!r} (resolution id "
            f"{recorded.get('resolution_id')}); a resolution cannot be changed", effect_id=effect_id)
    for other in analysis.decisions.values():
        if other.resolution and other.resolution.get("resolution_id") == resolution_id:
            raise ResolutionConflict(f"resolution id {resolution_id} was already used for effect {other.effect_id}",
                                     effect_id=effect_id)
    if decision.state != "unknown":
        raise EffectNotUnknown(f"effect {effect_id} is {decision.state} ({decision.reason}), not unknown: only an "
                               "unknown outcome can be resolved", effect_id=effect_id, state=decision.state)
    return decision


__all__ = ["MAX_NOTE_CHARS", "admit_resolution", "resolution_body"]
