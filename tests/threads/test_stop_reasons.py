"""Which stop reasons let an answer's tool calls run (:func:`jixu.threads.model.unfinished_answer`, decision 0054)."""

from __future__ import annotations

import pytest

from jixu.threads.model import unfinished_answer


@pytest.mark.parametrize("stop", [None, "", "stop", "tool_calls", "function_call", "end_turn", "tool_use",
                                  "stop_sequence", "STOP", " tool_calls ", "TOOL_USE"])
def test_a_finished_answer_runs_its_calls_in_any_case_and_without_blanks(stop: object) -> None:
    """A model passing its provider's reason through as it is spelled ("STOP", as Gemini writes it) is not
    refused: the reasons are compared without case and surrounding blanks."""
    assert unfinished_answer(stop, 2) is None


@pytest.mark.parametrize(("stop", "says"), [
    ("length", "output token limit"), ("MAX_TOKENS", "output token limit"), ("refusal", "provider stopped"),
    ("content_filter", "provider stopped"), ("insufficient_system_resource", "not a reason that ends"),
    ("eos", "not a reason that ends"), (5, "stopped for 5,")])
def test_any_other_reason_runs_none_and_says_why_once(stop: object, says: str) -> None:
    why = unfinished_answer(stop, 2)
    assert why is not None and says in why and "none was run" in why, why
    assert "\"'" not in why and "'\"" not in why, f"the reason is quoted twice: {why}"
