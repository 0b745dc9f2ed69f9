"""FallbackModel: the next model answers only when the previous one provably never processed the request."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jixu import Agent, FallbackModel, Harness, MemoryStore, ScriptedModel, tool
from jixu.errors import InvalidInput, ModelError
from jixu.threads.anthropic import AnthropicModel
from jixu.threads.openai import OpenAIModel
from jixu.threads.streaming import Signal
from tests.providers.conftest import ANTHROPIC_KEY, OPENAI_KEY, make_request, run
from tests.providers.fake_servers import Call, Completion, Failure, FakeAnthropic, FakeOpenAI, Hangup, Slow
from tests.providers.test_anthropic import OVERLOADED
from tests.providers.test_anthropic import RATE_LIMITED as ANTHROPIC_RATE_LIMITED
from tests.providers.test_openai import BAD_KEY, NO_QUOTA, SERVER_ERROR


def _openai(server: FakeOpenAI | None, **options: Any) -> OpenAIModel:
    url = server.url if server is not None else _refused_url()
    return OpenAIModel("gpt-4o-mini", base_url=url, api_key=OPENAI_KEY, timeout=0.5, **options)


def _anthropic(server: FakeAnthropic, **options: Any) -> AnthropicModel:
    return AnthropicModel("claude-sonnet-4-20250514", base_url=server.url, api_key=ANTHROPIC_KEY, timeout=0.5,
                          **options)


def _refused_url() -> str:
    """The URL of a server that has stopped: connecting to it is refused."""
    server = FakeOpenAI().start()
    url = server.url
    server.stop()
    return url


@tool(semantics="read_only")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# --- which errors fail over ------------------------------------------------------------------------------


def test_a_refused_connection_fails_over_and_the_switch_is_recorded(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Completion(text="From Claude."))
    observed: list[Signal] = []
    model = FallbackModel([_openai(None), _anthropic(anthropic_server)], on_signal=observed.append)
    response = run(model.complete(make_request(effect_id="01HFALLBACK")))
    assert response.text == "From Claude." and response.model == "claude-sonnet-4-20250514"
    assert response.fallback is not None
    [tried] = response.fallback["tried"]
    assert response.fallback["answered_by"] == "anthropic:claude-sonnet-4-20250514"
    assert tried["model"] == "openai:gpt-4o-mini"
    assert tried["error"]["kind"] == "transient" and tried["error"]["not_processed"] is True
    result = response.to_result("01HFALLBACK")
    assert result["fallback"] == response.fallback and result["model"] == "claude-sonnet-4-20250514"
    switches = [s for s in observed if s.kind == "fallback"]
    assert [s.data for s in switches] == [{"from": "openai:gpt-4o-mini", "to": "anthropic:claude-sonnet-4-20250514",
                                           "error_kind": "transient"}]
    assert [s.data for s in observed if s.kind == "done"] == [{"ok": True, "stop_reason": "end_turn"}], \
        "one call, one done: the failed-over attempt's done is replaced by the fallback signal"
    assert any(s.kind == "text_delta" for s in observed), "the answering model's deltas come through"


def test_an_overloaded_provider_fails_over(anthropic_server: FakeAnthropic, openai_server: FakeOpenAI) -> None:
    anthropic_server.script(Failure(529, OVERLOADED))
    openai_server.script(Completion(text="From OpenAI."))
    response = run(FallbackModel([_anthropic(anthropic_server), _openai(openai_server)]).complete(make_request()))
    assert response.text == "From OpenAI."
    assert response.fallback is not None and response.fallback["tried"][0]["error"]["status"] == 529


@pytest.mark.parametrize("reply", [
    Failure(500, SERVER_ERROR),                   # something failed: not proof that nothing happened
    Failure(502, "<html>502 Bad Gateway</html>"),
    Hangup(),                                     # the request was sent; the answer was lost
    Slow(2.0, Completion(text="too late")),       # a timeout: it may still be running
    Completion(text="cut off mid-way", drop_after=3),
    Failure(429, NO_QUOTA),                       # quota and authentication pause for an operator
    Failure(401, BAD_KEY),
], ids=["500", "502", "hangup", "timeout", "dropped-stream", "quota", "authentication"])
def test_an_unknown_outcome_or_a_refusal_never_fails_over(openai_server: FakeOpenAI, anthropic_server: FakeAnthropic,
                                                          reply: Any) -> None:
    openai_server.script(reply)
    with pytest.raises(ModelError) as caught:
        run(FallbackModel([_openai(openai_server), _anthropic(anthropic_server)]).complete(make_request()))
    assert anthropic_server.requests == [], "the second model was never asked"
    assert "fallback" not in caught.value.details


def test_a_rate_limit_pauses_and_retries_the_same_model(anthropic_server: FakeAnthropic,
                                                        openai_server: FakeOpenAI) -> None:
    anthropic_server.script(Failure(429, ANTHROPIC_RATE_LIMITED, {"retry-after": "3"}))
    with pytest.raises(ModelError) as caught:
        run(FallbackModel([_anthropic(anthropic_server), _openai(openai_server)]).complete(make_request()))
    assert (caught.value.kind, caught.value.retry_after) == ("rate_limit", 3.0)
    assert openai_server.requests == []


def test_when_every_model_fails_over_the_last_error_carries_the_record(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Failure(529, OVERLOADED))
    observed: list[Signal] = []
    model = FallbackModel([_openai(None), _anthropic(anthropic_server)], on_signal=observed.append)
    with pytest.raises(ModelError) as caught:
        run(model.complete(make_request()))
    record = caught.value.details["fallback"]
    assert record["failed"] == "anthropic:claude-sonnet-4-20250514"
    assert [t["model"] for t in record["tried"]] == ["openai:gpt-4o-mini"]
    assert caught.value.to_dict()["fallback"] == record, "and so does the receipt of the failed call"
    assert [s.data for s in observed if s.kind == "done"] == [{"ok": False, "error_kind": "transient"}]


# --- through a thread --------------------------------------------------------------------------------------


def test_a_thread_records_which_model_answered_each_call(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Completion(calls=[Call("toolu_1", "add", '{"a": 2, "b": 3}')]),
                            Completion(text="2 + 3 = 5"))
    model = FallbackModel([_openai(None), _anthropic(anthropic_server)])
    harness = Harness(Agent("calc", model, tools=[add]), MemoryStore())

    async def scenario() -> tuple[Any, list[Any]]:
        thread = await harness.create_thread()
        signals = thread.signals()
        await thread.send("2 + 3?")
        state = await thread.wait()
        await signals.aclose()
        return state, await thread.events()

    state, events = run(scenario())
    assert state.status == "idle" and state.last_reply == "2 + 3 = 5"
    completed = [e.data["result"] for e in events if e.type == "model.completed"]
    assert [c["fallback"]["answered_by"] for c in completed] == ["anthropic:claude-sonnet-4-20250514"] * 2
    assert completed[0]["fallback"]["tried"][0]["error"]["not_processed"] is True
    assert not any(e.type == "model.failed" for e in events), "a failed-over attempt is not a failed call"
    started = [e for e in events if e.type == "thread.created"]
    assert "fallback(openai:gpt-4o-mini, anthropic:claude-sonnet-4-20250514)" in json.dumps(started[0].data)


def test_fallback_models_are_validated() -> None:
    for bad in ([], "gpt-4o", [object()]):
        with pytest.raises(InvalidInput):
            FallbackModel(bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="distinct names"):
        FallbackModel([ScriptedModel(["a"]), ScriptedModel(["b"])])
    named = FallbackModel([ScriptedModel(["a"], name="one"), ScriptedModel(["b"], name="two")], name="pair")
    assert named.name == "pair" and [m.name for m in named.models] == ["one", "two"]


def test_an_inner_driver_used_on_its_own_publishes_nothing_through_the_fallback(openai_server: FakeOpenAI,
                                                                                anthropic_server: FakeAnthropic) -> None:
    openai_server.script(Failure(500, SERVER_ERROR))
    inner = _openai(openai_server)
    observed: list[Signal] = []
    FallbackModel([inner, _anthropic(anthropic_server)], on_signal=observed.append)
    with pytest.raises(ModelError):
        run(inner.complete(make_request()))
    assert observed == []
