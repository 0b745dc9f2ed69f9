"""Recovery: the pure RecoveryResolver that classifies every effect from events alone."""

from __future__ import annotations

from jixu.recovery.resolver import (
    CORRUPTION_REASONS,
    DECISION_REASONS,
    PHASES,
    RESOLUTIONS,
    SEMANTICS,
    STATES,
    Analysis,
    EffectDecision,
    RecoveryResolver,
    State,
    analyze,
    decide_effect,
)

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
