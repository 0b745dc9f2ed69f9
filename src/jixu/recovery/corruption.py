"""The one corruption verdict of a stream: is it corrupt, since which seq, and why (decision 0025).

Threads, runs and execution requests each ask :func:`corruption` with what
they know (the chain report of the ledger's verdict, the RecoveryResolver's
analysis, the projection's own contradictions); every surface (the harness,
runs, the HTTP API, the CLI, the Studio) shows and refuses by its answer and
derives nothing itself. A stream is corrupt when its history does not verify
(a chain reason: ``payload_changed``, ``reordered``, ``gap``, ``bad_link``,
``head_mismatch``, ``rewritten``) or contradicts itself
(``contradictory_effects``: the resolver found corrupt effects or lifecycle
events without an effect; ``contradictory_record``: the stream's own record
does not add up). The earliest bad seq wins.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from jixu.ledger.chain import REASONS, VerifyReport
from jixu.recovery.resolver import Analysis

CONTRADICTION_REASONS = {
    "contradictory_effects": "effect events contradict each other (the RecoveryResolver found them corrupt)",
    "contradictory_record": "the stream's events contradict its own record",
}
_PROBLEM_SEQ = re.compile(r"^seq (\d+)\b")


@dataclass(frozen=True, slots=True)
class Corruption:
    """Why a stream is corrupt: the first bad seq (when known), the reason code, and what was found."""

    stream_name: str
    """The stream that is corrupt."""
    first_bad_seq: int | None
    reason: str
    detail: str
    effects: tuple[str, ...] = ()
    """The corrupt effects, when the resolver found some."""
    vouched_before: int | None = None
    """When set: the first seq vouched for by nothing, even before ``first_bad_seq`` (see
    :attr:`VerifyReport.vouched_before <jixu.ledger.chain.VerifyReport.vouched_before>`)."""

    @property
    def sound_before(self) -> int:
        """The first seq this verdict does not vouch for: events before it verify and agree (a fork may start
        there). A rewrite found by a sealed checkpoint vouches for nothing before it, nor does an unplaced
        contradiction, nor a break at or before a sealed checkpoint."""
        if self.reason == "rewritten" or self.first_bad_seq is None:
            return 1
        if self.vouched_before is not None:
            return min(self.vouched_before, self.first_bad_seq)
        return self.first_bad_seq

    @property
    def explanation(self) -> str:
        """The reason code in words."""
        return REASONS.get(self.reason) or CONTRADICTION_REASONS.get(self.reason, self.reason)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``explanation`` included)."""
        return {"stream": self.stream_name, "first_bad_seq": self.first_bad_seq, "reason": self.reason,
                "explanation": self.explanation, "detail": self.detail, "effects": list(self.effects),
                "sound_before": self.sound_before}

    def summary(self) -> str:
        """One line: ``first bad event #7 (payload_changed): …``."""
        where = f"first bad event #{self.first_bad_seq}" if self.first_bad_seq is not None else "the history"
        return f"{where} ({self.reason}): {self.detail or self.explanation}"


def corruption(stream: str, *, chain: VerifyReport | None, analysis: Analysis | None,
               chain_break_seq: int | None = None, problems: Sequence[str] = (), contradiction: bool = False,
               seq_of: Callable[[str], int | None] | None = None) -> Corruption | None:
    """The stream's corruption, or ``None`` when it is sound as far as these say.

    ``chain``: the ledger's report (its verdict, or an opening's); ``chain_break_seq``: a break seen since
    (when ``chain`` does not name it, its reason is ``bad_link``); ``analysis``: the resolver's answer;
    ``problems``: the projection's contradictions (``"seq N (type): …"``); ``contradiction``: the projection
    flags one without details; ``seq_of``: the seq of an event id (to place the resolver's findings).
    """
    found: list[Corruption] = []
    if chain is not None and not chain.valid:
        found.append(Corruption(stream, chain.first_bad_seq, chain.reason or "bad_link", chain.detail or "",
                                vouched_before=chain.vouched_before))
    if chain_break_seq is not None and not any(c.first_bad_seq == chain_break_seq for c in found):
        found.append(Corruption(stream, chain_break_seq, "bad_link",
                                f"seq {chain_break_seq} does not link to the event before it, or does not hash to "
                                "its recorded hash"))
    if analysis is not None and analysis.has_corruption and (analysis.corrupt or analysis.unattributed_events):
        evidence = [event_id for effect_id in analysis.corrupt for event_id in analysis.decisions[effect_id].evidence]
        evidence += list(analysis.unattributed_events)
        seqs = [s for s in (seq_of(e) for e in evidence) if s is not None] if seq_of is not None else []
        reasons = sorted({analysis.decisions[e].reason for e in analysis.corrupt})
        what = (f"effects {', '.join(analysis.corrupt)} are corrupt ({', '.join(reasons)})" if analysis.corrupt
                else f"lifecycle events without an effect id: {', '.join(analysis.unattributed_events)}")
        found.append(Corruption(stream, min(seqs) if seqs else None, "contradictory_effects", what,
                                tuple(analysis.corrupt)))
    if problems or contradiction:
        seqs = [int(m.group(1)) for m in (_PROBLEM_SEQ.match(p) for p in problems) if m]
        found.append(Corruption(stream, min(seqs) if seqs else None, "contradictory_record",
                                "; ".join(problems[:3]) or "the projection found contradictory events"))
    if not found:
        return None
    first = min(found, key=lambda c: (c.first_bad_seq is None, c.first_bad_seq or 0))
    vouched = min(c.sound_before for c in found)  # a later finding may vouch for less than the first one's seq
    return first if vouched >= first.sound_before else replace(first, vouched_before=vouched)


__all__ = ["CONTRADICTION_REASONS", "Corruption", "corruption"]
