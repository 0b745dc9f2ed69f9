"""The pure parts of the provider drivers: conversation mapping, arguments, errors, prices, signals, imports."""

from __future__ import annotations

import asyncio
import email.utils
import itertools
import subprocess
import sys
from typing import Any

import pytest

from jixu.errors import InvalidInput
from jixu.threads.anthropic import anthropic_messages
from jixu.threads.anthropic import tool_specs as anthropic_tools
from jixu.threads.openai import chat_messages
from jixu.threads.openai import tool_specs as openai_tools
from jixu.threads.pricing import DEFAULT_PRICES, Price, find_price, price_table
from jixu.threads.streaming import (
    MISSING_RESULT,
    Signal,
    SignalSource,
    classify_status,
    error_fields,
    parse_arguments,
    retry_after_seconds,
    well_formed,
)
from tests.helpers import python_env
from tests.providers.conftest import (
    ADD_SPEC,
    LOOKUP_SPEC,
    STATUSES,
    every_status_conversation,
    make_request,
    run,
)

# --- validity checks shared by the tests ---------------------------------------------------------------


def assert_valid_openai(messages: list[dict[str, Any]]) -> None:
    """Chat Completions rules: each assistant tool call is answered by one tool message right after it."""
    index = 0
    seen: set[str] = set()
    while index < len(messages):
        message = messages[index]
        assert message["role"] in ("system", "user", "assistant", "tool")
        assert message["role"] != "tool", f"tool message {index} answers no call right before it"
        index += 1
        if message["role"] != "assistant":
            assert isinstance(message["content"], str)
            continue
        ids = [c["id"] for c in message.get("tool_calls", [])]
        assert not seen & set(ids) and len(ids) == len(set(ids)), "tool call ids are unique"
        seen |= set(ids)
        for call in message.get("tool_calls", []):
            assert call["type"] == "function" and isinstance(call["function"]["arguments"], str)
        answers = []
        while index < len(messages) and messages[index]["role"] == "tool":
            answers.append(messages[index]["tool_call_id"])
            assert isinstance(messages[index]["content"], str)
            index += 1
        assert answers == ids, f"calls {ids} answered by {answers}"


def assert_valid_anthropic(messages: list[dict[str, Any]]) -> None:
    """Messages API rules: user first, roles alternate, every tool_use answered once in the next message."""
    assert messages and messages[0]["role"] == "user"
    for first, second in itertools.pairwise(messages):
        assert first["role"] != second["role"], "roles alternate"
    for number, message in enumerate(messages):
        blocks = message["content"]
        assert blocks, "no empty content"
        for block in blocks:
            if block["type"] == "text":
                assert block["text"], "no empty text blocks"
        if message["role"] == "assistant":
            ids = [b["id"] for b in blocks if b["type"] == "tool_use"]
            results = [b for b in messages[number + 1]["content"] if b["type"] == "tool_result"] \
                if ids else []
            assert [r["tool_use_id"] for r in results] == ids, "every tool_use answered exactly once"
            # tool_result blocks come first in the next user message
            kinds = [b["type"] for b in messages[number + 1]["content"]] if ids else []
            assert kinds[:len(ids)] == ["tool_result"] * len(ids)
        else:
            assert all(b["type"] in ("text", "tool_result") for b in blocks)
            results = [b for b in blocks if b["type"] == "tool_result"]
            if results:
                previous = messages[number - 1]
                assert previous["role"] == "assistant"
                assert {r["tool_use_id"] for r in results} <= {b["id"] for b in previous["content"]
                                                               if b["type"] == "tool_use"}


# --- the neutral conversation, made well formed ------------------------------------------------------


def test_every_call_is_answered_once_missing_results_are_filled_and_orphans_dropped() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "tool", "tool_call_id": "ghost", "name": "add", "content": "orphan", "status": "ok"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "name": "add", "args": {"a": 1, "b": 2}},
            {"id": "b", "name": "add", "args": {"a": 3, "b": 4}},
        ]},
        {"role": "user", "content": "an interjection recorded before the results"},
        {"role": "tool", "tool_call_id": "b", "name": "add", "content": "7", "status": "ok"},
        {"role": "tool", "tool_call_id": "b", "name": "add", "content": "duplicate", "status": "ok"},
        {"role": "assistant", "content": "done", "tool_calls": []},
    ]
    out = well_formed(messages)
    assert out == [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "a", "name": "add", "args": {"a": 1, "b": 2}},
            {"id": "b", "name": "add", "args": {"a": 3, "b": 4}},
        ]},
        {"role": "tool", "tool_call_id": "a", "name": "add", "content": MISSING_RESULT, "status": "missing"},
        {"role": "tool", "tool_call_id": "b", "name": "add", "content": "7", "status": "ok"},
        {"role": "user", "content": "an interjection recorded before the results"},
        {"role": "assistant", "content": "done", "tool_calls": []},
    ]
    assert messages[1]["content"] == "orphan", "the input is not changed"


def test_unusable_and_repeated_call_ids_are_replaced_consistently_and_deterministically() -> None:
    long_id = "x" * 80
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "name": "add", "args": {}},
                                                              {"id": "bad id!", "name": "tools.add", "args": {}},
                                                              {"id": long_id, "name": "add", "args": {}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "first", "status": "ok"},
        {"role": "tool", "tool_call_id": "bad id!", "name": "add", "content": "second", "status": "ok"},
        {"role": "tool", "tool_call_id": long_id, "name": "add", "content": "third", "status": "ok"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "name": "add", "args": {}}]},
        {"role": "tool", "tool_call_id": "call_0", "name": "add", "content": "again", "status": "error"},
    ]
    out = well_formed(messages)
    assert out == well_formed(messages), "deterministic: the same conversation maps the same way every call"
    first_ids = [c["id"] for c in out[1]["tool_calls"]]
    assert first_ids[0] == "call_0"
    assert first_ids[1] != "bad id!" and first_ids[2] != long_id
    assert out[1]["tool_calls"][1]["name"] == "tools_add"
    assert [m["tool_call_id"] for m in out[2:5]] == first_ids
    assert [m["content"] for m in out[2:5]] == ["first", "second", "third"]
    second_id = out[5]["tool_calls"][0]["id"]
    assert second_id != "call_0", "a repeated id gets a fresh one"
    assert out[6] == {"role": "tool", "tool_call_id": second_id, "name": "add", "content": "again",
                      "status": "error"}
    assert_valid_openai(chat_messages("", messages))
    assert_valid_anthropic(anthropic_messages(messages))


def test_the_every_status_conversation_is_valid_for_openai() -> None:
    out = chat_messages("Be careful.", every_status_conversation())
    assert out[0] == {"role": "system", "content": "Be careful."}
    assert_valid_openai(out)
    tool_messages = [m for m in out if m["role"] == "tool"]
    assert [m["tool_call_id"] for m in tool_messages] == [f"call_{s}" for s in STATUSES]
    assert all(set(m) == {"role", "tool_call_id", "content"} for m in tool_messages)
    parallel = out[2]
    assert parallel["content"] == "Working on it." and len(parallel["tool_calls"]) == len(STATUSES) // 2
    assert parallel["tool_calls"][0] == {"id": "call_ok", "type": "function",
                                         "function": {"name": "add", "arguments": '{"a":0,"b":1}'}}


def test_the_every_status_conversation_is_valid_for_anthropic_with_errors_flagged() -> None:
    out = anthropic_messages(every_status_conversation())
    assert_valid_anthropic(out)
    results = [b for m in out if m["role"] == "user" for b in m["content"] if b["type"] == "tool_result"]
    assert [r["tool_use_id"] for r in results] == [f"call_{s}" for s in STATUSES]
    flagged = {r["tool_use_id"].removeprefix("call_"): r.get("is_error", False) for r in results}
    assert flagged == {"ok": False, "occurred": False, "error": True, "denied": True, "not_occurred": True,
                       "abandoned_unknown": True, "interrupted": True, "not_inherited": True}
    # Parallel calls: several tool_use blocks, then one user message with all their results.
    parallel = out[1]
    assert parallel["role"] == "assistant"
    assert [b["type"] for b in parallel["content"]] == ["text"] + ["tool_use"] * (len(STATUSES) // 2)
    assert [b["type"] for b in out[2]["content"]] == ["tool_result"] * (len(STATUSES) // 2)
    # The last tool results and the user's next message merge into one user message, results first.
    assert out[-1]["role"] == "user"
    assert [b["type"] for b in out[-3]["content"]] == ["tool_result"]
    assert out[-1]["content"] == [{"type": "text", "text": "Thanks. Once more?"}]


def test_anthropic_gets_a_user_message_first_and_no_empty_content() -> None:
    out = anthropic_messages([
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "user", "content": "first"},
        {"role": "user", "content": "second"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "name": "lookup", "args": {}}]},
        {"role": "tool", "tool_call_id": "t1", "name": "lookup", "content": "", "status": "ok"},
    ])
    assert_valid_anthropic(out)
    assert out[0] == {"role": "user", "content": [{"type": "text", "text": "(continuing the conversation)"}]}
    assert out[2]["content"] == [{"type": "text", "text": "first"}, {"type": "text", "text": "second"}]
    assert out[-1]["content"] == [{"type": "tool_result", "tool_use_id": "t1", "content": "(empty)"}]


def test_tool_specs_map_to_each_providers_format() -> None:
    assert openai_tools([ADD_SPEC, LOOKUP_SPEC]) == [
        {"type": "function", "function": {"name": "add", "description": "Add two integers.",
                                          "parameters": ADD_SPEC["parameters"]}},
        {"type": "function", "function": {"name": "lookup", "parameters": LOOKUP_SPEC["parameters"]}},
    ]
    assert anthropic_tools([ADD_SPEC, LOOKUP_SPEC]) == [
        {"name": "add", "description": "Add two integers.", "input_schema": ADD_SPEC["parameters"]},
        {"name": "lookup", "input_schema": LOOKUP_SPEC["parameters"]},
    ]


def test_tool_specs_from_the_tool_decorator_map_too() -> None:
    from jixu import tool

    @tool
    def greet(name: str, times: int = 1) -> str:
        """Greet someone."""
        return name * times

    spec = greet.spec()
    assert openai_tools([spec])[0]["function"]["parameters"] == greet.parameters
    assert anthropic_tools([spec])[0]["input_schema"]["type"] == "object"


# --- model output ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("raw", "expected"), [
    ('{"a": 1}', {"a": 1}),
    ("", {}),
    ("  ", {}),
    (None, {}),
    ('{"a": 1', {"__invalid_json__": '{"a": 1'}),
    ("[1, 2]", {"__invalid_json__": "[1, 2]"}),
    ('"text"', {"__invalid_json__": '"text"'}),
])
def test_tool_arguments_that_are_not_a_json_object_pass_through_marked_invalid(raw: str | None,
                                                                              expected: dict[str, Any]) -> None:
    assert parse_arguments(raw) == expected


def test_invalid_arguments_are_rejected_by_the_tool_before_dispatch() -> None:
    from jixu import tool
    from jixu.errors import ToolInputError

    @tool
    def add(a: int, b: int) -> int:
        """Add."""
        return a + b

    with pytest.raises(ToolInputError, match="__invalid_json__"):
        add.validate_args(parse_arguments('{"a": 1,'))


# --- errors ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("status", "error_type", "code", "message", "expected"), [
    (429, "requests", "rate_limit_exceeded", "Rate limit reached", ("rate_limit", False)),
    (429, "rate_limit_error", None, "Number of request tokens has exceeded your per-minute rate limit",
     ("rate_limit", False)),
    (429, "insufficient_quota", "insufficient_quota", "You exceeded your current quota", ("quota", False)),
    (429, "rate_limit_error", "enforced_spend_limit_reached", "You have reached your API usage limits",
     ("quota", False)),
    (429, "rate_limit_error", None, "This request would exceed your account's monthly spend limit.",
     ("quota", False)),
    (400, "invalid_request_error", None, "You have reached your specified API usage limits.", ("quota", False)),
    (400, "invalid_request_error", None, "Your credit balance is too low to access the Anthropic API.",
     ("quota", False)),
    (402, None, None, "Insufficient credits", ("quota", False)),
    (403, "billing_error", None, "Billing issue", ("quota", False)),
    (401, "authentication_error", None, "invalid x-api-key", ("authentication", False)),
    (403, "permission_error", None, "Your API key does not have permission", ("authentication", False)),
    (500, "api_error", None, "Internal server error", ("transient", True)),
    (503, None, None, "unavailable", ("transient", True)),
    (529, "overloaded_error", None, "Overloaded", ("transient", True)),
    (408, None, None, "request timeout", ("transient", True)),
    (400, "invalid_request_error", None, "messages: roles must alternate", ("invalid_request", False)),
    (404, "not_found_error", None, "model: claude-9", ("invalid_request", False)),
    (413, "request_too_large", None, "Request exceeds the maximum size", ("invalid_request", False)),
    (200, "overloaded_error", None, "Overloaded (inside a stream)", ("transient", True)),
    (200, "api_error", None, "Internal server error (inside a stream)", ("transient", True)),
    (200, "server_error", None, "The server had an error (inside a stream)", ("transient", True)),
    (200, None, None, "an event with no type", ("transient", True)),
    (200, "insufficient_quota", "insufficient_quota", "You exceeded your current quota", ("quota", False)),
    (200, None, "rate_limit_exceeded", "Rate limit reached", ("rate_limit", False)),
    (200, "rate_limit_error", None, "rate limited", ("rate_limit", False)),
    (200, "rate_limit_error", "enforced_spend_limit_reached", "You have reached your API usage limits",
     ("quota", False)),
    (200, None, "invalid_prompt", "Invalid prompt", ("invalid_request", False)),
    (200, "invalid_request_error", None, "prompt is too long: 210000 tokens > 200000 maximum",
     ("invalid_request", False)),
    (200, "authentication_error", None, "invalid x-api-key", ("authentication", False)),
])
def test_http_statuses_map_to_kinds(status: int, error_type: str | None, code: str | None, message: str,
                                   expected: tuple[str, bool]) -> None:
    assert classify_status(status, error_type, code, message) == expected


@pytest.mark.parametrize(("headers", "expected"), [
    ({}, None),
    ({"x-ratelimit-reset-requests": "1s"}, 1.0),
    ({"x-ratelimit-reset-requests": "20ms", "x-ratelimit-reset-tokens": "6m0s"}, 360.0),
    ({"X-RateLimit-Remaining-Requests": "0", "X-RateLimit-Reset-Requests": "2h3m4.5s",
      "x-ratelimit-remaining-tokens": "5", "x-ratelimit-reset-tokens": "9h"}, 7384.5),
    ({"anthropic-ratelimit-tokens-remaining": "0", "anthropic-ratelimit-tokens-reset": "2026-12-01T22:01:00Z",
      "anthropic-ratelimit-requests-remaining": "7", "anthropic-ratelimit-requests-reset": "2026-12-01T23:00:00Z"},
     60.0),
    ({"x-ratelimit-reset-requests": "soon"}, None),
])
def test_rate_limit_resets_come_from_the_providers_headers(headers: dict[str, str], expected: float | None) -> None:
    from jixu.threads.streaming import rate_limit_reset_seconds

    now = email.utils.parsedate_to_datetime("Tue, 01 Dec 2026 22:00:00 GMT").timestamp()
    assert rate_limit_reset_seconds(headers, now=now) == expected


def test_error_fields_read_both_providers_bodies() -> None:
    openai_body = {"error": {"message": "quota", "type": "insufficient_quota", "param": None,
                             "code": "insufficient_quota"}}
    anthropic_body = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert error_fields(openai_body) == ("insufficient_quota", "insufficient_quota", "quota")
    assert error_fields(anthropic_body) == ("rate_limit_error", None, "slow down")
    spend_cap = {"type": "error", "error": {"type": "rate_limit_error", "message": "usage limits",
                                            "details": {"error_code": "enforced_spend_limit_reached"}}}
    assert error_fields(spend_cap) == ("rate_limit_error", "enforced_spend_limit_reached", "usage limits")
    assert error_fields("plain text") == (None, None, None)


def test_retry_after_comes_from_the_headers() -> None:
    assert retry_after_seconds({"retry-after": "7"}) == 7.0
    assert retry_after_seconds({"Retry-After": "2.5"}) == 2.5
    assert retry_after_seconds({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_seconds({"retry-after": "-3"}) == 0.0
    assert retry_after_seconds({"retry-after": "soon"}) is None
    assert retry_after_seconds({}) is None
    assert retry_after_seconds(None) is None
    now = 1_800_000_000.0
    date = email.utils.formatdate(now + 30, usegmt=True)
    assert retry_after_seconds({"retry-after": date}, now=now) == 30.0


# --- prices ----------------------------------------------------------------------------------------


def test_the_fallback_table_prices_exact_names_only_never_a_snapshot_by_its_base() -> None:
    table = price_table()
    assert find_price(table, "gpt-4o-mini") == DEFAULT_PRICES["gpt-4o-mini"]
    assert find_price(table, "gpt-4o-mini-2024-07-18") == DEFAULT_PRICES["gpt-4o-mini"], "a listed snapshot"
    assert find_price(table, "gpt-4o-2024-05-13") == Price(input=5.00, output=15.00), "not gpt-4o's 2.50/10.00"
    assert find_price(table, "gpt-4o-2099-01-01") is None, "an unlisted snapshot is not priced as its base model"
    assert find_price(table, "claude-sonnet-4-5-20990101") is None
    assert find_price(table, "claude-sonnet-4-20250514") == DEFAULT_PRICES["claude-sonnet-4-0"]
    assert find_price(table, "gpt-4o-audio-preview") is None
    assert find_price(table, "llama3.1:8b") is None
    assert find_price(table, "unknown", "gpt-4o") == DEFAULT_PRICES["gpt-4o"], "falls back to the next name"
    for model in ("gpt-5", "gpt-5-mini", "o3", "o3-2025-04-16", "claude-sonnet-4-5", "claude-haiku-4-5-20251001",
                  "claude-opus-4-5"):
        assert find_price(table, model) is not None, model


def test_a_long_prompt_bills_the_whole_call_at_the_long_context_price() -> None:
    price = DEFAULT_PRICES["claude-sonnet-4-5"]
    assert price.cost(input_tokens=200_000, output_tokens=1_000) == pytest.approx(200_000 * 3e-6 + 1_000 * 15e-6)
    assert price.cost(input_tokens=300_000, output_tokens=1_000, cached_tokens=100_000) == pytest.approx(
        200_000 * 6e-6 + 100_000 * 0.6e-6 + 1_000 * 22.5e-6)


@pytest.fixture
def no_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    """As if genai-prices were not installed."""
    from jixu.threads import pricing

    monkeypatch.setattr(pricing, "_CATALOGUE", False)


def _cost(*models: str | None, provider: str = "openai", **counts: int) -> float | None:
    from jixu.threads.pricing import call_cost

    usage = {"input_tokens": 1_000_000, "output_tokens": 1_000_000, **counts}
    return call_cost(models, provider=provider, **usage)


def test_without_genai_prices_the_fallback_table_prices_what_it_lists(no_catalogue: None) -> None:
    from jixu.threads.pricing import catalogue

    assert catalogue() is None
    assert _cost("gpt-4o-2024-05-13") == pytest.approx(20.0)
    assert _cost("gpt-4o-2024-08-06") == pytest.approx(12.5)
    assert _cost("gpt-4o-2099-01-01") is None
    assert _cost("gpt-5.4-mini") is None, "not in the small table"
    assert _cost("claude-sonnet-4-5-20250929", provider="anthropic", input_tokens=400_000) == pytest.approx(
        400_000 * 6e-6 + 1_000_000 * 22.5e-6)


def test_genai_prices_is_used_when_installed_and_the_users_prices_win() -> None:
    import genai_prices  # noqa: F401  (installed by the test extra: missing, the test fails)

    from jixu.threads.pricing import call_cost, catalogue
    assert catalogue() is not None
    assert _cost("gpt-5.4-mini") == pytest.approx(0.75 + 4.5), "a model only the catalogue knows"
    assert _cost("gpt-4o-2024-05-13") == pytest.approx(20.0)
    assert _cost("gpt-4o-2099-01-01") is None, "the catalogue does not guess a snapshot either"
    assert _cost("llama3.1:8b") is None
    mine = call_cost(("gpt-5.4-mini",), provider="openai", overrides={"gpt-5.4-mini": Price(input=1, output=1)},
                     input_tokens=1_000_000, output_tokens=1_000_000)
    assert mine == pytest.approx(2.0)


def test_a_model_the_catalogue_does_not_know_is_looked_for_once_per_catalogue_snapshot(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import dataclasses

    import genai_prices  # (installed by the test extra: missing, the test fails)
    from genai_prices import data_snapshot

    from jixu.threads import pricing

    walks: list[str] = []
    bundled = data_snapshot.get_snapshot()

    def counted(snapshot: data_snapshot.DataSnapshot) -> data_snapshot.DataSnapshot:
        original = snapshot.find_provider_model

        def find(model_ref: str, *args: object) -> object:
            walks.append(model_ref)
            return original(model_ref, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(snapshot, "find_provider_model", find)
        return snapshot

    monkeypatch.setattr(data_snapshot, "_custom_snapshot", counted(dataclasses.replace(bundled)))
    for _ in range(3):
        assert _cost("my-finetune-v1") is None
    assert walks == ["my-finetune-v1"], "a miss is remembered: the catalogue is not walked again on each call"
    # New catalogue data (as an update installs it) that knows the model: the remembered miss no longer holds.
    openai = next(p for p in bundled.providers if p.id == "openai")
    known = next(m for m in openai.models if m.id == "gpt-4o")
    taught = dataclasses.replace(openai, models=[*openai.models, dataclasses.replace(
        known, id="my-finetune-v1", match=genai_prices.types.ClauseEquals(equals="my-finetune-v1"))])
    monkeypatch.setattr(data_snapshot, "_custom_snapshot", counted(dataclasses.replace(
        bundled, providers=[taught if p is openai else p for p in bundled.providers])))
    walks.clear()
    assert _cost("my-finetune-v1") == _cost("gpt-4o") is not None
    assert walks, "the new snapshot was asked"
    assert pricing.catalogue() is genai_prices


@pytest.mark.parametrize("model", sorted(DEFAULT_PRICES))
def test_the_fallback_table_agrees_with_genai_prices(model: str) -> None:
    # Both are copies of the providers' published prices: a disagreement is a typo here or a price change there.
    import genai_prices  # noqa: F401  (installed by the test extra: missing, the test fails)

    from jixu.threads.pricing import catalogue_cost
    provider = "anthropic" if model.startswith("claude") else "openai"
    writes = 100_000 if provider == "anthropic" else 0
    for prompt in (150_000, 250_000):  # below and above the 200K long-context threshold
        counts = {"input_tokens": prompt, "output_tokens": 20_000, "cached_tokens": 50_000,
                  "cache_write_tokens": writes}
        listed = DEFAULT_PRICES[model].cost(**counts)
        known = catalogue_cost((model,), provider=provider, api_url=None, **counts)
        assert known == pytest.approx(listed), (model, prompt)


def test_cost_counts_cached_and_cache_write_tokens_at_their_own_price() -> None:
    price = Price(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75)
    cost = price.cost(input_tokens=1_000_000, output_tokens=100_000, cached_tokens=400_000,
                      cache_write_tokens=100_000)
    assert cost == pytest.approx(500_000 * 3e-6 + 400_000 * 0.3e-6 + 100_000 * 3.75e-6 + 100_000 * 15e-6)
    assert Price(input=1.0, output=2.0).cost(input_tokens=10, output_tokens=10, cached_tokens=5) == \
        pytest.approx(30e-6), "no cached price: cached tokens cost as input"
    assert Price(input=0.0, output=0.0).cost(input_tokens=10, output_tokens=10) == 0.0


def test_prices_can_be_overridden_and_are_validated() -> None:
    table = price_table({"llama3.1": {"input": 0, "output": 0}, "gpt-4o": Price(input=1, output=2)})
    assert table["llama3.1"] == Price(input=0.0, output=0.0)
    assert table["gpt-4o"] == Price(input=1, output=2)
    assert "gpt-4o" in DEFAULT_PRICES and DEFAULT_PRICES["gpt-4o"].input == 2.5, "defaults stay untouched"
    for bad in ({"m": {"input": 1}}, {"m": {"input": -1, "output": 1}}, {"m": {"input": 1, "output": "2"}},
                {"m": {"input": 1, "output": 2, "surcharge": 1}}, {"m": 3}, {"": {"input": 1, "output": 1}}):
        with pytest.raises(InvalidInput):
            price_table(bad)  # type: ignore[arg-type]


# --- signals ---------------------------------------------------------------------------------------


def test_signals_reach_callbacks_queues_and_iterators_and_slow_readers_lose_the_oldest() -> None:
    seen: list[Signal] = []

    def broken(signal: Signal) -> None:
        seen.append(signal)
        raise RuntimeError("observer bug")

    async def scenario() -> None:
        source = SignalSource(on_signal=broken)
        small = source.subscribe(maxsize=2)
        collected: list[Signal] = []

        async def iterate() -> None:
            async for signal in source.signals(thread_id="t1"):
                collected.append(signal)
                if signal.kind == "done":
                    break

        reader = asyncio.create_task(iterate())
        await asyncio.sleep(0)
        for kind, thread in (("text_delta", "t1"), ("text_delta", "t2"), ("tool_call_delta", "t1"),
                             ("done", "t1")):
            source.publish(Signal(kind, "e1", {"n": len(seen)}, thread_id=thread))  # type: ignore[arg-type]
        await asyncio.wait_for(reader, 2)
        assert [s.kind for s in collected] == ["text_delta", "tool_call_delta", "done"]
        assert small.qsize() == 2 and [small.get_nowait().kind for _ in range(2)] == ["tool_call_delta", "done"]
        source.unsubscribe(small)
        source.unsubscribe(small)  # twice is harmless
        assert len(source._queues) == 0, "the finished iterator unsubscribed itself"

    run(scenario())
    assert len(seen) == 4, "a raising callback still got every signal and broke nothing"


def test_subscribe_validates_its_size() -> None:
    with pytest.raises(InvalidInput):
        SignalSource().subscribe(maxsize=0)
    with pytest.raises(InvalidInput):
        SignalSource(on_signal="print")  # type: ignore[arg-type]


# --- imports without the extras --------------------------------------------------------------------


def test_importing_jixu_does_not_import_the_sdks() -> None:
    code = ("import sys, jixu; from jixu import OpenAIModel, AnthropicModel; "
            "from jixu.threads import OpenAIModel as A, AnthropicModel as B, Signal; "
            "assert OpenAIModel is A and AnthropicModel is B; "
            "assert 'openai' not in sys.modules and 'anthropic' not in sys.modules, sorted(sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], env=python_env(), capture_output=True, text=True,
                            check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("name", "module", "extra"), [("OpenAIModel", "openai", "openai"),
                                                       ("AnthropicModel", "anthropic", "anthropic")])
def test_constructing_a_driver_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch, name: str,
                                                                 module: str, extra: str) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # as if the SDK were not installed
    import jixu

    driver_class = getattr(jixu, name)
    with pytest.raises(InvalidInput, match=rf"pip install 'jixu\[{extra}\]'") as caught:
        driver_class("some-model", api_key="sk-whatever")
    assert caught.value.details["extra"] == extra


def test_unknown_attributes_still_raise_attribute_error() -> None:
    import jixu
    import jixu.threads

    with pytest.raises(AttributeError):
        jixu.NoSuchThing  # noqa: B018
    with pytest.raises(AttributeError):
        jixu.threads.NoSuchThing  # noqa: B018


def test_drivers_validate_their_options(monkeypatch: pytest.MonkeyPatch) -> None:
    from jixu import AnthropicModel, OpenAIModel

    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    for bad in ({"timeout": 0}, {"timeout": "5"}, {"max_tokens": 0}, {"max_tokens": 1.5}, {"temperature": -1},
                {"stream": "yes"}, {"name": ""}, {"prices": {"m": {"input": 1}}}):
        with pytest.raises(InvalidInput):
            OpenAIModel("gpt-4o", api_key="sk-x", **bad)
    with pytest.raises(InvalidInput):
        OpenAIModel("", api_key="sk-x")
    with pytest.raises(InvalidInput, match="OPENAI_API_KEY"):
        OpenAIModel("gpt-4o")
    with pytest.raises(InvalidInput, match="ANTHROPIC_API_KEY"):
        AnthropicModel("claude-sonnet-4")
    with pytest.raises(InvalidInput):
        AnthropicModel("claude-sonnet-4", api_key="sk-x", max_tokens=None)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="client"):
        OpenAIModel("gpt-4o", client=object())  # type: ignore[arg-type]
    for url in ("not a url", "ftp://example.com/v1", "http://", "localhost:8000/v1"):
        with pytest.raises(InvalidInput, match="base_url"):
            OpenAIModel("gpt-4o", api_key="sk-x", base_url=url)
    assert OpenAIModel("m", base_url="http://127.0.0.1:8000/v1").base_url == "http://127.0.0.1:8000/v1/"
    assert OpenAIModel("m", api_key="sk-x").base_url == "https://api.openai.com/v1/"
    model = OpenAIModel("gpt-4o", api_key="sk-proj-abcdefghijklmnop")
    assert model.name == "openai:gpt-4o" and "sk-proj" not in repr(model)
    assert AnthropicModel("claude-x", api_key="k", name="claude").name == "claude"


def test_request_helper_builds_what_the_harness_builds() -> None:
    request = make_request()
    assert request.messages[0]["role"] == "user" and request.attempt == 1


def test_redaction_removes_the_drivers_key_and_anything_shaped_like_a_provider_key() -> None:
    from jixu import OpenAIModel

    model = OpenAIModel("gpt-4o", api_key="my-private-token-123")
    text = model.redact("got my-private-token-123 and sk-proj-abcdefghijklmnopqrstuvwxyz0123 and task-list")
    assert "my-private-token-123" not in text and "abcdefghijklmnopqrstuvwxyz" not in text
    assert "sk-proj-a...[redacted]" in text and "task-list" in text


@pytest.mark.parametrize("asked", [float("inf"), float("nan"), -0.5, True, "10", None])
def test_a_model_error_keeps_only_a_retry_after_a_wait_can_be_made_of(asked: Any) -> None:
    """An infinite or NaN retry-after (from a custom driver) could not be recorded in the failure's receipt."""
    from jixu.errors import ModelError

    error = ModelError("429", kind="rate_limit", indeterminate=False, retry_after=asked)
    assert error.retry_after is None and error.to_dict()["retry_after"] is None
    assert ModelError("429", kind="rate_limit", retry_after=2).retry_after == 2.0
