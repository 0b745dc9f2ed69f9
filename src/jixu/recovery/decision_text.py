"""A settled decision as compact JSON text: how long threads keep them and checkpoints store them.

The text is a positional array of :class:`~jixu.recovery.EffectDecision`'s
fields. :func:`ordinary_decision_text` writes the text of an ordinary
lifecycle's decision without building the decision first: a long thread
settles one effect per model or tool call, and replaying it writes one such
text per effect. It takes the decision's fields from the resolver's walk
(``resolver._walk`` with the effect id as owner) and never reads an event
itself: which histories are ordinary, and what they decide, is said once, in
the resolver.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from jixu.ledger.event import Event, parse_json
from jixu.recovery.resolver import _TYPES, EffectDecision, _decision, _walk

_DECISION_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
# Module-level encoder: json.dumps with options builds a new encoder on every call.
_TEXT_ONLY = frozenset((str,))


def encode_decision(decision: EffectDecision) -> str:
    """A settled decision as compact JSON text (a positional array).

    A decision whose texts need no JSON escaping, with integer seqs and no resolution (every ordinary
    settled effect) is written by one format string; anything else by the JSON encoder. Both give
    the same text (a property test in ``tests/threads`` pins it).
    """
    texts = (decision.effect_id, decision.kind, decision.name, decision.state, decision.reason, decision.semantics,
             decision.idempotency_key, decision.args_hash)
    evidence, retry_safe = decision.evidence, decision.retry_safe
    attempts, requested_seq, last_seq = decision.attempts, decision.requested_seq, decision.last_seq
    if (decision.resolution is None and type(attempts) is int and type(requested_seq) is int
            and type(last_seq) is int and type(retry_safe) is bool and type(evidence) is tuple
            and _TEXT_ONLY.issuperset(map(type, texts)) and _TEXT_ONLY.issuperset(map(type, evidence))):
        effect_id, kind, name, state, reason, semantics, key, args_hash = texts
        cited = '"' + '","'.join(evidence) + '"' if evidence else ""
        text = (f'["{effect_id}","{kind}","{name}","{state}","{reason}",[{cited}],'
                f'{"true" if retry_safe else "false"},"{semantics}","{key}","{args_hash}",{attempts},null,'
                f"{requested_seq},{last_seq}]")
        if _needs_no_escaping(text, 16 + 2 * len(evidence)):
            return text
    return _encode_decision_json(decision)


_PRINTABLE_ASCII_BUT_QUOTING = bytes(c for c in range(0x20, 0x7F) if c not in b'"\\')
_QUOTES = [b'"' * count for count in range(32)]


def _needs_no_escaping(text: str, quotes: int) -> bool:
    """Whether ``text``, written with ``quotes`` quotes of its own, is the JSON encoder's text as it is.

    No quote but the ones written, no backslash, no control character (isprintable() is False for
    those, and for some characters the encoder writes as they are: those take the encoder's path too).
    An ASCII text (every settled decision jixu writes) is checked in one pass: deleting every printable
    character but the quote and the backslash must leave exactly its own quotes (``isprintable`` alone
    costs ~0.5 us on a decision's ~300 characters; this is the same answer, pinned by a property test).
    """
    if text.isascii():  # O(1)
        left = text.encode("ascii").translate(None, _PRINTABLE_ASCII_BUT_QUOTING)
        return left == (_QUOTES[quotes] if quotes < len(_QUOTES) else b'"' * quotes)
    return text.count('"') == quotes and "\\" not in text and text.isprintable()


def _encode_decision_json(decision: EffectDecision) -> str:
    """:func:`encode_decision` by the JSON encoder (any decision)."""
    return _DECISION_JSON.encode([decision.effect_id, decision.kind, decision.name, decision.state, decision.reason,
                                  list(decision.evidence), decision.retry_safe, decision.semantics,
                                  decision.idempotency_key, decision.args_hash, decision.attempts,
                                  decision.resolution, decision.requested_seq, decision.last_seq])


def decode_decision(text: str) -> EffectDecision:
    """The decision back from :func:`encode_decision`."""
    (effect_id, kind, name, state, reason, evidence, retry_safe, semantics, key, args_hash, attempts, resolution,
     requested_seq, last_seq) = json.loads(text)
    return EffectDecision(effect_id, kind, name, state, reason, tuple(evidence), retry_safe, semantics, key,
                          args_hash, attempts, resolution, requested_seq, last_seq)


def decode_decisions(texts: Sequence[str]) -> list[EffectDecision]:
    """:func:`decode_decision` of each text (a long thread's first full analysis decodes every settled
    decision): each parsed by the JSON decoder's scanner, the slots filled directly.

    A text that is not a 14-field row is decoded by :func:`decode_decision`, which then raises
    exactly what it raises for it.
    """
    decisions = []
    for text in texts:
        row = parse_json(text)
        if type(row) is not list or len(row) != 14 or type(row[5]) is not list:
            decisions.append(decode_decision(text))
            continue
        decisions.append(_decision(row[0], row[1], row[2], row[3], row[4], tuple(row[5]), row[6], row[7], row[8],
                                   row[9], row[10], row[11], row[12], row[13]))
    return decisions


def ordinary_decision_text(effect_id: str, intent: Event, dispatch: Event, receipt: Event) -> str | None:
    """``encode_decision(decide_effect(effect_id, [intent, dispatch, receipt]))`` when that decision is the
    ordinary lifecycle's (``completed``, reason ``succeeded`` or ``failed``: an intent, its dispatch and that
    attempt's determinate receipt), else None: then ask ``decide_effect``.

    None also when the text would need JSON escaping or a seq is not an integer (the general path
    writes those). ``tests/recovery`` pins the equality over generated lifecycles.
    """
    # The resolver's verdict on these events, when they are effect_id's (an owner of None would be no owner).
    found = _walk((intent, dispatch, receipt), _TYPES, effect_id or "")
    if found is None:
        return None
    kind, name, state, reason, evidence, _retry_safe, semantics, key, args_hash, _attempts, _resolution, \
        requested_seq, last_seq = found
    if state != "completed" or (reason != "succeeded" and reason != "failed"):  # noqa: PLR1714 (faster)
        return None
    # Such a verdict cites the three events, is not retry safe, has one attempt and no resolution, and its texts
    # but the event ids are the well-formed intent's (so str); the ids and the seqs are as recorded.
    first, second, third = evidence
    if type(requested_seq) is not int or type(last_seq) is not int or type(first) is not str \
            or type(second) is not str or type(third) is not str:
        return None
    text = (f'["{effect_id}","{kind}","{name}","completed","{reason}",["{first}","{second}","{third}"],false,'
            f'"{semantics}","{key}","{args_hash}",1,null,{requested_seq},{last_seq}]')
    return text if _needs_no_escaping(text, 22) else None


__all__ = ["decode_decision", "decode_decisions", "encode_decision", "ordinary_decision_text"]
