"""Context compaction: the size estimate, what may be compacted, and the summary request (all pure).

When an agent has a ``context_budget`` and the conversation's estimated size
exceeds it before a model call, the thread records a ``compaction`` effect:
the model is asked for a summary of the messages before the active turn's
user message, citing the ids of the events those messages came from. Its
receipt (``compaction.completed``) carries the summary; the projection then
replaces the covered messages with one summary message. Replay reads the
recorded summary and never calls the model. A failed compaction leaves the
conversation as it was, and the turn does not try again.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from jixu.ledger.encoding import JSONObject

CHARS_PER_TOKEN = 4
"""The estimate's ratio: one token per four characters (deterministic, no tokenizer)."""
MIN_COMPACTED_MESSAGES = 2
"""Fewer messages than this before the active turn are not worth a summary."""
MAX_SUMMARY_CHARS = 100_000
"""A longer summary is refused (recorded as a failed compaction): it would not save anything."""
SUMMARY_HEADER = "Summary of the earlier conversation (events {ids}):\n"
COMPACTION_INSTRUCTION = (
    "Summarize the conversation above faithfully, for your own use when it continues: keep every fact, "
    "decision, tool result, commitment and open question that may matter later, and say plainly what is "
    "uncertain. It consists of the events {ids}. Cite, in square brackets, the ids of the events each part "
    "of your summary comes from. Do not call any tool. Answer with the summary only."
)


def _text_length(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, str):
        return len(value)
    return len(json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")))


def estimate_tokens(messages: Sequence[JSONObject]) -> int:
    """The conversation's size in tokens, estimated as characters / 4 (rounded up).

    Counts every message's content and every tool call's arguments (as
    compact JSON) and name; instructions and tool schemas are not counted, so
    leave them headroom in the budget.
    """
    chars = 0
    for message in messages:
        artifact = message.get("artifact")
        if isinstance(artifact, dict) and isinstance(artifact.get("size"), int):
            chars += artifact["size"]  # the model sees the stored text, not the short reference
        else:
            chars += _text_length(message.get("content"))
        calls = message.get("tool_calls")
        for call in calls if isinstance(calls, list) else []:
            if isinstance(call, dict):
                chars += _text_length(call.get("name")) + _text_length(call.get("args"))
    return -(-chars // CHARS_PER_TOKEN)


def over_budget(messages: Sequence[JSONObject], budget: int | None) -> bool:
    """Whether ``messages`` exceed ``budget`` tokens (never, without a budget)."""
    return budget is not None and estimate_tokens(messages) > budget


def compaction_prompt(covers: Sequence[str]) -> JSONObject:
    """The final user message of a summary request, naming the event ids it covers."""
    return {"role": "user", "content": COMPACTION_INSTRUCTION.format(ids=", ".join(covers))}


def summary_message(summary: str, covers: Sequence[str]) -> JSONObject:
    """The one message that replaces the covered ones in the conversation."""
    return {"role": "user", "content": SUMMARY_HEADER.format(ids=", ".join(covers)) + summary, "compacted": True}


def summary_problem(text: str | None, tool_calls: Sequence[Any]) -> str | None:
    """Why a model's answer to a summary request is not a usable summary, or ``None`` if it is."""
    if tool_calls:
        return "the model answered the summary request with tool calls instead of a summary"
    if not isinstance(text, str) or not text.strip():
        return "the model answered the summary request with no text"
    if len(text) > MAX_SUMMARY_CHARS:
        return f"the summary has {len(text)} characters; the limit is {MAX_SUMMARY_CHARS}"
    return None


__all__ = ["CHARS_PER_TOKEN", "COMPACTION_INSTRUCTION", "MAX_SUMMARY_CHARS", "MIN_COMPACTED_MESSAGES",
           "SUMMARY_HEADER", "compaction_prompt", "estimate_tokens", "over_budget", "summary_message",
           "summary_problem"]
