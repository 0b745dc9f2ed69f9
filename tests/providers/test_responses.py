"""OpenAIModel(api="responses") through the real ``openai`` SDK against a local server speaking the Responses API."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jixu import Agent, Harness, MemoryStore, tool
from jixu.errors import InvalidInput, ModelError
from jixu.threads.model import ModelResponse, ToolCall
from jixu.threads.openai import OpenAIModel
from jixu.threads.streaming import Signal
from tests.providers.conftest import (
    ADD_SPEC,
    LOOKUP_SPEC,
    OPENAI_KEY,
    every_status_conversation,
    make_request,
    run,
)
from tests.providers.fake_servers import Call, Completion, Failure, FakeResponses, Thinking


def driver(server: FakeResponses, model: str = "gpt-4o-mini", **options: Any) -> OpenAIModel:
    return OpenAIModel(model, base_url=server.url, api_key=OPENAI_KEY, api="responses", **options)


def complete(model: OpenAIModel, **request: Any) -> ModelResponse:
    return run(model.complete(make_request(**request)))


def fail(model: OpenAIModel, **request: Any) -> ModelError:
    with pytest.raises(ModelError) as caught:
        complete(model, **request)
    return caught.value


@tool(semantics="read_only")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


# --- answers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_plain_text_is_a_stateless_request(responses_server: FakeResponses, stream: bool) -> None:
    responses_server.script(Completion(text="Hello! How can I help?", model="gpt-4o-mini-2024-07-18",
                                       input_tokens=2_000, cached_tokens=1_000, output_tokens=500))
    response = complete(driver(responses_server, stream=stream, max_tokens=300))
    assert response.text == "Hello! How can I help?" and response.tool_calls == ()
    assert response.stop_reason == "stop" and response.model == "gpt-4o-mini-2024-07-18"
    assert response.reasoning is None
    usage = response.usage
    assert (usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (2_000, 1_000, 500)
    assert usage.cost == pytest.approx((1_000 * 0.15 + 1_000 * 0.075 + 500 * 0.60) / 1_000_000)
    [sent] = responses_server.requests
    assert sent.path == "/v1/responses"
    assert sent.body["store"] is False, "stateless: nothing is kept on OpenAI's side"
    assert sent.body["instructions"] == "You are terse."
    assert sent.body["input"] == [{"role": "user", "content": "Hello?"}]
    assert sent.body["max_output_tokens"] == 300
    assert "include" not in sent.body, "no encrypted reasoning asked of a model that does not reason"
    assert sent.body.get("stream", False) is stream


@pytest.mark.parametrize("stream", [True, False])
def test_parallel_tool_calls_with_text(responses_server: FakeResponses, stream: bool) -> None:
    responses_server.script(Completion(text="Checking both.", fragment=3, calls=[
        Call("call_1", "add", '{"a": 1, "b": 2}'), Call("call_2", "lookup", '{"key": "colour"}')]))
    observed: list[Signal] = []
    response = complete(driver(responses_server, stream=stream, on_signal=observed.append),
                        tools=[ADD_SPEC, LOOKUP_SPEC])
    assert response.text == "Checking both."
    assert response.tool_calls == (ToolCall("add", {"a": 1, "b": 2}, "call_1"),
                                   ToolCall("lookup", {"key": "colour"}, "call_2"))
    assert response.stop_reason == "tool_calls"
    assert responses_server.bodies[0]["tools"] == [
        {"type": "function", "name": "add", "description": "Add two integers.",
         "parameters": ADD_SPEC["parameters"], "strict": False},
        {"type": "function", "name": "lookup", "parameters": LOOKUP_SPEC["parameters"], "strict": False}]
    if stream:
        assert "".join(s.data["text"] for s in observed if s.kind == "text_delta") == "Checking both."
        for index, call in enumerate(response.tool_calls):
            parts = [s for s in observed if s.kind == "tool_call_delta" and s.data["index"] == index]
            assert {(s.data["id"], s.data["name"]) for s in parts} == {(call.id, call.name)}
            assert json.loads("".join(s.data["arguments"] for s in parts)) == call.args
        assert observed[-1].data == {"ok": True, "stop_reason": "tool_calls"}


@pytest.mark.parametrize("stream", [True, False])
def test_a_refusal_and_an_incomplete_answer(responses_server: FakeResponses, stream: bool) -> None:
    responses_server.script(Completion(refusal="I can't help with that."),
                            Completion(text="The answer is", stop="max_output_tokens"))
    assert complete(driver(responses_server, stream=stream)).text == "I can't help with that."
    cut = complete(driver(responses_server, stream=stream))
    assert (cut.text, cut.stop_reason) == ("The answer is", "max_output_tokens")


def test_a_conversation_with_every_tool_status_maps_to_input_items(responses_server: FakeResponses) -> None:
    responses_server.script(Completion(text="ok"))
    complete(driver(responses_server), messages=every_status_conversation(), tools=[ADD_SPEC])
    items = responses_server.bodies[0]["input"]
    calls = [i["call_id"] for i in items if i.get("type") == "function_call"]
    outputs = [i["call_id"] for i in items if i.get("type") == "function_call_output"]
    assert calls == outputs and len(calls) == len(set(calls)) == 8
    assert items[0] == {"role": "user", "content": "Do all the things."}
    assert items[1] == {"role": "assistant", "content": "Working on it."}
    assert items[-1] == {"role": "user", "content": "Thanks. Once more?"}


# --- reasoning ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_reasoning_items_are_recorded_whole_with_their_encrypted_content(responses_server: FakeResponses,
                                                                        stream: bool) -> None:
    responses_server.script(Completion(thinking=[Thinking("The user wants a sum; call add.")], fragment=5,
                                       calls=[Call("call_1", "add", '{"a": 2, "b": 3}')], output_tokens=300,
                                       reasoning_tokens=256))
    observed: list[Signal] = []
    model = driver(responses_server, "o4-mini", stream=stream, reasoning_effort="low", reasoning_summary="auto",
                   on_signal=observed.append)
    response = complete(model, tools=[ADD_SPEC])
    body = responses_server.bodies[0]
    assert body["include"] == ["reasoning.encrypted_content"] and body["store"] is False
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert response.reasoning is not None and response.reasoning["format"] == "openai-responses"
    [reasoning, call] = response.reasoning["items"]
    [token] = responses_server.encrypted
    assert reasoning == {"id": responses_server.encrypted[token], "type": "reasoning", "status": "completed",
                         "summary": [{"type": "summary_text", "text": "The user wants a sum; call add."}],
                         "encrypted_content": token}
    assert call == {"type": "function_call", "id": call["id"], "call_id": "call_1"}
    assert response.usage.reasoning_tokens == 256
    result = response.to_result("01HEFFECT")
    assert result["tool_calls"][0]["reasoning"] == response.reasoning
    if stream:
        thoughts = [s.data["text"] for s in observed if s.kind == "reasoning_delta"]
        assert len(thoughts) > 1 and "".join(thoughts) == "The user wants a sum; call add."


def _reasoning_turn(model: OpenAIModel, server: FakeResponses) -> tuple[Any, list[Any]]:
    server.script(
        Completion(thinking=[Thinking("call add"), Thinking("twice? no, once")], text="Let me add.",
                   calls=[Call("call_add_1", "add", '{"a": 2, "b": 3}')]),
        Completion(thinking=[Thinking("it said 5")], text="2 + 3 = 5"),
    )
    harness = Harness(Agent("calc", model, instructions="Use the add tool.", tools=[add]), MemoryStore())

    async def scenario() -> tuple[Any, list[Any]]:
        thread = await harness.create_thread()
        await thread.send("what is 2 + 3?")
        state = await thread.wait()
        return state, await thread.events()

    return run(scenario())


@pytest.mark.parametrize("stream", [True, False])
def test_reasoning_goes_back_verbatim_before_the_call_it_led_to(responses_server: FakeResponses,
                                                               stream: bool) -> None:
    state, events = _reasoning_turn(driver(responses_server, "o4-mini", stream=stream), responses_server)
    assert state.status == "idle" and state.last_reply == "2 + 3 = 5", state
    completed = [e.data["result"] for e in events if e.type == "model.completed"]
    items = completed[0]["tool_calls"][0]["reasoning"]["items"]
    assert [i["type"] for i in items] == ["reasoning", "reasoning", "message", "function_call"]
    second = responses_server.bodies[1]["input"]
    assert second == [
        {"role": "user", "content": "what is 2 + 3?"},
        items[0], items[1],
        {"type": "message", "role": "assistant", "id": items[2]["id"], "status": "completed",
         "content": [{"type": "output_text", "text": "Let me add.", "annotations": []}]},
        {"type": "function_call", "call_id": "call_add_1", "name": "add", "arguments": '{"a":2,"b":3}',
         "id": items[3]["id"]},
        {"type": "function_call_output", "call_id": "call_add_1", "output": "5"},
    ]
    assert completed[1]["reasoning"]["items"][0]["type"] == "reasoning", "a final answer keeps its reasoning too"


def test_the_fake_refuses_reasoning_it_cannot_decrypt_and_calls_without_their_reasoning(
        responses_server: FakeResponses) -> None:
    # The API's rules the fake enforces, so that the test above can fail.
    responses_server.script(Completion(thinking=[Thinking("x")], calls=[Call("c1", "add", '{"a": 1, "b": 1}')]))
    first = complete(driver(responses_server, "o4-mini"), tools=[ADD_SPEC])
    assert first.reasoning is not None
    reasoning, _message_or_call = first.reasoning["items"][0], first.reasoning["items"][-1]
    conversation = [{"role": "user", "content": "1 + 1?"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "c1", "name": "add", "args": {"a": 1, "b": 1}, "reasoning": first.reasoning}]},
                    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "2", "status": "ok"}]
    stripped = {**first.reasoning, "items": [{**reasoning, "encrypted_content": None}, *first.reasoning["items"][1:]]}
    conversation[1]["tool_calls"][0]["reasoning"] = stripped
    responses_server.script(Completion(text="2"))
    error = fail(driver(responses_server, "o4-mini"), messages=conversation, tools=[ADD_SPEC])
    assert "Items are not persisted when `store` is set to false" in error.message
    without = {**first.reasoning, "items": first.reasoning["items"][1:]}
    conversation[1]["tool_calls"][0]["reasoning"] = without
    responses_server.script(Completion(text="2"))
    error = fail(driver(responses_server, "o4-mini"), messages=conversation, tools=[ADD_SPEC])
    assert "without its required 'reasoning' item" in error.message


def test_stored_responses_ask_for_no_encrypted_reasoning(responses_server: FakeResponses) -> None:
    responses_server.script(Completion(text="ok"))
    complete(driver(responses_server, "gpt-5", store=True))
    body = responses_server.bodies[0]
    assert body["store"] is True and "include" not in body
    assert "include" not in driver(responses_server, "gpt-5-chat-latest").request_body(make_request()), \
        "gpt-5's chat model does not reason"


# --- errors ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_http_errors_map_to_kinds_as_for_chat_completions(responses_server: FakeResponses, stream: bool) -> None:
    limited = {"error": {"message": "Rate limit reached for o4-mini on tokens per min (TPM)", "type": "tokens",
                         "param": None, "code": "rate_limit_exceeded"}}
    responses_server.script(Failure(429, limited, {"x-ratelimit-remaining-tokens": "0",
                                                   "x-ratelimit-reset-tokens": "2.5s"}))
    error = fail(driver(responses_server, stream=stream))
    assert (error.kind, error.indeterminate, error.retry_after) == ("rate_limit", False, 2.5)
    assert len(responses_server.requests) == 1


@pytest.mark.parametrize(("reply", "detail"), [
    (Completion(text="An error arrives mid-way", error_after=6,
                error_body={"code": "server_error", "message": "The server had an error", "param": None}),
     "The server had an error"),
    (Completion(text="The response fails mid-way", error_after=6,
                error_body={"event": "response.failed", "code": "server_error", "message": "Response failed"}),
     "Response failed"),
    (Completion(text="This answer ends early", end_after=6), "ended early"),
    (Completion(text="This answer breaks off", drop_after=6), "lost the connection"),
])
def test_a_stream_that_breaks_mid_way_is_transient_and_indeterminate(responses_server: FakeResponses,
                                                                    reply: Completion, detail: str) -> None:
    responses_server.script(reply)
    observed: list[Signal] = []
    error = fail(driver(responses_server, on_signal=observed.append))
    assert (error.kind, error.indeterminate) == ("transient", True)
    assert detail in error.message
    assert any(s.kind == "text_delta" for s in observed)
    assert observed[-1].data == {"ok": False, "error_kind": "transient"}


def test_the_api_option_is_validated(responses_server: FakeResponses) -> None:
    with pytest.raises(InvalidInput):
        OpenAIModel("gpt-5", api_key=OPENAI_KEY, api="assistants")
    with pytest.raises(InvalidInput):
        OpenAIModel("gpt-5", api_key=OPENAI_KEY, api="responses", store="no")  # type: ignore[arg-type]


@pytest.mark.parametrize("content_type", ["text/html", "application/json"])
def test_an_unstreamed_200_answer_that_is_not_json_is_an_invalid_response_in_doubt(responses_server: FakeResponses,
                                                                                  content_type: str) -> None:
    """A success status with a body that is not the API's object (a proxy's HTML page): never an answer (it was
    taken for an empty one, or raised an untyped error), and in doubt, since the provider may have processed it."""
    responses_server.script(Failure(200, "<html>proxy error page</html>", content_type=content_type))
    error = fail(driver(responses_server, stream=False))
    assert (error.kind, error.indeterminate) == ("invalid_response", True), error
