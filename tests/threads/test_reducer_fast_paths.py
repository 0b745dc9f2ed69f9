"""Small shortcuts of the thread reducer give exactly what the plain code gives."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jixu.threads import projection as thread_projection
from jixu.threads.projection import _phase, _phase_of, tool_content


@pytest.mark.parametrize("content", [None, "text", "", 0, 1.5, True, False, [], {}, {"b": 1, "a": [None, "é"]}])
def test_tool_content_equals_the_encoder(content: Any) -> None:
    expected = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, sort_keys=True)
    assert tool_content(content) == expected


def test_the_remembered_phase_equals_the_parsed_one(monkeypatch: pytest.MonkeyPatch) -> None:
    types = ["tool.requested", "model.completed", "remote.deploy.outcome_resolved", "turn.started", "thread.created",
             "requested", ".requested", "tool.unknown_phase", "a.b.c", "compaction.failed"]
    monkeypatch.setattr(thread_projection, "_PHASE_OF", {})
    for event_type in types * 2:
        assert _phase_of(event_type) == _phase(event_type)
        assert thread_projection._PHASE_OF[event_type] == _phase(event_type)
    for n in range(1100):  # many distinct types: the memo is cleared, never unbounded
        assert _phase_of(f"x{n}.completed") == (f"x{n}", "completed")
    assert len(thread_projection._PHASE_OF) <= 1024


def test_a_subclass_that_changes_apply_gets_its_apply_in_a_fold() -> None:
    """``apply_all`` runs ``apply``'s body inline: a subclass overriding ``apply`` must not be bypassed."""
    from jixu.ledger import MemoryStore, NewEvent
    from jixu.ledger.projection import fold
    from jixu.threads.projection import ThreadProjection, ThreadState

    class Counting(ThreadProjection):
        def __init__(self) -> None:
            self.seen: list[str] = []

        def apply(self, state: ThreadState, event: Any) -> ThreadState:
            self.seen.append(event.type)
            return super().apply(state, event)

    store = MemoryStore()
    events = store.append("thread/t", [NewEvent("operator.noted", {"note": str(n)}) for n in range(3)], 0)
    counting = Counting()
    state = fold(counting, events)
    assert counting.seen == ["operator.noted"] * 3 and state.seq == 3
    assert fold(ThreadProjection(), events).seq == 3
