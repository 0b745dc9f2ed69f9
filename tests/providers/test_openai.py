"""OpenAIModel through the real ``openai`` SDK against a local server speaking the Chat Completions format."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jixu import Agent, Harness, MemoryStore, tool
from jixu.errors import InvalidInput, ModelError
from jixu.threads.model import ModelResponse, ToolCall, Usage
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
from tests.providers.fake_servers import Call, Completion, Failure, FakeOpenAI, Hangup, Slow
from tests.providers.test_mapping import assert_valid_openai


def driver(server: FakeOpenAI, model: str = "gpt-4o-mini", **options: Any) -> OpenAIModel:
    return OpenAIModel(model, base_url=server.url, api_key=OPENAI_KEY, **options)


def complete(model: OpenAIModel, **request: Any) -> ModelResponse:
    return run(model.complete(make_request(**request)))


def fail(model: OpenAIModel, **request: Any) -> ModelError:
    with pytest.raises(ModelError) as caught:
        complete(model, **request)
    return caught.value


# --- answers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_plain_text(openai_server: FakeOpenAI, stream: bool) -> None:
    openai_server.script(Completion(text="Hello! How can I help?"))
    response = complete(driver(openai_server, stream=stream))
    assert response.text == "Hello! How can I help?"
    assert response.tool_calls == ()
    assert response.model == "gpt-4o-mini-2024-07-18"
    assert response.stop_reason == "stop"
    [sent] = openai_server.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert sent.body["model"] == "gpt-4o-mini"
    assert sent.body["messages"] == [{"role": "system", "content": "You are terse."},
                                     {"role": "user", "content": "Hello?"}]
    assert "tools" not in sent.body
    assert sent.body.get("stream", False) is stream
    if stream:
        assert sent.body["stream_options"] == {"include_usage": True}


def test_no_instructions_means_no_system_message_and_options_are_sent_when_given(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="ok"))
    complete(driver(openai_server, max_tokens=256, temperature=0.2), instructions="")
    body = openai_server.bodies[0]
    assert body["messages"] == [{"role": "user", "content": "Hello?"}]
    assert body["max_tokens"] == 256 and body["temperature"] == 0.2


@pytest.mark.parametrize("model", ["o4-mini", "o3", "gpt-5-mini"])
def test_reasoning_models_get_max_completion_tokens(openai_server: FakeOpenAI, model: str) -> None:
    openai_server.script(Completion(text="ok", model=model))
    response = complete(driver(openai_server, model, max_tokens=256, reasoning_effort="low"))
    assert response.text == "ok"
    body = openai_server.bodies[0]
    assert body["max_completion_tokens"] == 256 and "max_tokens" not in body
    assert body["reasoning_effort"] == "low"


def test_the_token_limit_parameter_can_be_chosen(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="ok"), Completion(text="ok"))
    complete(driver(openai_server, "my-local-model", max_tokens=64, max_tokens_parameter="max_completion_tokens"))
    complete(OpenAIModel("gpt-4o", api_key=OPENAI_KEY, base_url=openai_server.url, max_tokens=64))
    assert openai_server.bodies[0]["max_completion_tokens"] == 64 and "max_tokens" not in openai_server.bodies[0]
    assert openai_server.bodies[1]["max_tokens"] == 64, "compatible servers keep the parameter they all know"
    official = OpenAIModel("gpt-4o", api_key=OPENAI_KEY, max_tokens=64)
    assert official.request_body(make_request())["max_completion_tokens"] == 64, "OpenAI's own API: the current one"
    with pytest.raises(InvalidInput):
        OpenAIModel("gpt-4o", api_key=OPENAI_KEY, max_tokens_parameter="max_length")


@pytest.mark.parametrize("stream", [True, False])
def test_a_tool_call_round_trip(openai_server: FakeOpenAI, stream: bool) -> None:
    openai_server.script(Completion(calls=[Call("call_abc123", "add", '{"a": 2, "b": 3}')]))
    response = complete(driver(openai_server, stream=stream), tools=[ADD_SPEC])
    assert response.tool_calls == (ToolCall(name="add", args={"a": 2, "b": 3}, id="call_abc123"),)
    assert response.text is None
    assert response.stop_reason == "tool_calls"
    assert openai_server.bodies[0]["tools"] == [{"type": "function", "function": {
        "name": "add", "description": "Add two integers.", "parameters": ADD_SPEC["parameters"]}}]


@pytest.mark.parametrize("stream", [True, False])
def test_parallel_tool_calls_with_text(openai_server: FakeOpenAI, stream: bool) -> None:
    openai_server.script(Completion(text="Let me check both.", calls=[
        Call("call_1", "add", '{"a": 1, "b": 2}'),
        Call("call_2", "lookup", '{"key": "colour"}'),
        Call("call_3", "add", "{}"),
    ]))
    response = complete(driver(openai_server, stream=stream), tools=[ADD_SPEC, LOOKUP_SPEC])
    assert response.text == "Let me check both."
    assert response.tool_calls == (ToolCall("add", {"a": 1, "b": 2}, "call_1"),
                                   ToolCall("lookup", {"key": "colour"}, "call_2"),
                                   ToolCall("add", {}, "call_3"))
    result = response.to_result("01HEFFECT0000000000000000000")
    assert [c["id"] for c in result["tool_calls"]] == ["call_1", "call_2", "call_3"]


@pytest.mark.parametrize("stream", [True, False])
def test_a_refusal_is_the_reply_streamed_or_not(openai_server: FakeOpenAI, stream: bool) -> None:
    openai_server.script(Completion(refusal="I'm sorry, I can't help with that.", fragment=6))
    observed: list[Signal] = []
    response = complete(driver(openai_server, stream=stream, on_signal=observed.append))
    assert response.text == "I'm sorry, I can't help with that."
    assert response.stop_reason == "stop"
    if stream:
        assert "".join(s.data["text"] for s in observed if s.kind == "text_delta") == response.text


@pytest.mark.parametrize("stream", [True, False])
def test_arguments_that_are_not_json_pass_through_marked_invalid(openai_server: FakeOpenAI, stream: bool) -> None:
    openai_server.script(Completion(calls=[Call("call_1", "add", '{"a": 1, "b": '),
                                           Call("call_2", "add", "[1, 2]")]))
    response = complete(driver(openai_server, stream=stream), tools=[ADD_SPEC])
    assert [c.args for c in response.tool_calls] == [{"__invalid_json__": '{"a": 1, "b": '},
                                                    {"__invalid_json__": "[1, 2]"}]


def test_a_conversation_with_every_tool_status_is_sent_valid(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="ok"))
    complete(driver(openai_server), messages=every_status_conversation(), tools=[ADD_SPEC])
    sent = openai_server.bodies[0]["messages"]
    assert_valid_openai(sent)
    calls = [c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    answers = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert sorted(calls) == sorted(answers) and len(answers) == len(set(answers)), "each call answered once"
    assert sent[-1] == {"role": "user", "content": "Thanks. Once more?"}


# --- streaming -----------------------------------------------------------------------------------------


def test_streaming_assembles_fragments_and_publishes_signals(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="The sum is coming.", fragment=3, calls=[
        Call("call_1", "add", '{"a": 20, "b": 22}'), Call("call_2", "lookup", '{"key": "k"}')]))
    observed: list[Signal] = []
    model = driver(openai_server, on_signal=observed.append)

    async def scenario() -> tuple[ModelResponse, list[Signal]]:
        queue = model.subscribe()
        response = await model.complete(make_request(tools=[ADD_SPEC, LOOKUP_SPEC], effect_id="01HSTREAM"))
        model.unsubscribe(queue)
        return response, [queue.get_nowait() for _ in range(queue.qsize())]

    response, queued = run(scenario())
    assert queued == observed
    assert response.text == "The sum is coming."
    assert response.tool_calls == (ToolCall("add", {"a": 20, "b": 22}, "call_1"),
                                   ToolCall("lookup", {"key": "k"}, "call_2"))
    texts = [s.data["text"] for s in observed if s.kind == "text_delta"]
    assert len(texts) > 3 and "".join(texts) == response.text
    raw = ['{"a": 20, "b": 22}', '{"key": "k"}']
    for index, call in enumerate(response.tool_calls):
        parts = [s for s in observed if s.kind == "tool_call_delta" and s.data["index"] == index]
        assert len(parts) > 2 and "".join(s.data["arguments"] for s in parts) == raw[index]
        assert parts[-1].data["id"] == call.id and parts[-1].data["name"] == call.name
    assert observed[-1].kind == "done" and observed[-1].data == {"ok": True, "stop_reason": "tool_calls"}
    assert {s.effect_id for s in observed} == {"01HSTREAM"}
    assert {s.thread_id for s in observed} == {"01HTHREAD0000000000000000000"}


def test_a_tool_name_repeated_in_every_chunk_is_the_name_once(openai_server: FakeOpenAI) -> None:
    # Some compatible servers (MiniMax through NVIDIA NIM, some vLLM builds) repeat the whole name in every chunk.
    openai_server.script(Completion(calls=[Call("call_1", "charge_card", '{"amount": 1250, "currency": "EUR"}'),
                                           Call("call_2", "add", '{"a": 1, "b": 2}')],
                                    fragment=5, repeat_tool_name=True))
    observed: list[Signal] = []
    response = complete(driver(openai_server, on_signal=observed.append), tools=[ADD_SPEC])
    assert [c.name for c in response.tool_calls] == ["charge_card", "add"]
    assert response.tool_calls[0].args == {"amount": 1250, "currency": "EUR"}
    names = {s.data["name"] for s in observed if s.kind == "tool_call_delta"}
    assert names == {"charge_card", "add"}


@pytest.mark.parametrize(("pieces", "expected"), [
    (["charge_card", "charge_card", "charge_card"], "charge_card"),  # repeated whole
    (["charge", "charge_card"], "charge_card"),                       # sent cumulatively
    (["charge_", "card"], "charge_card"),                              # sent in fragments
])
def test_streamed_tool_names_are_assembled_whatever_the_server_sends(pieces: list[str], expected: str) -> None:
    from jixu.threads.openai import merge_name

    name = ""
    for piece in pieces:
        name = merge_name(name, piece)
    assert name == expected


def test_without_streaming_only_the_done_signal_is_published(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="whole"))
    observed: list[Signal] = []
    complete(driver(openai_server, stream=False, on_signal=observed.append))
    assert [s.kind for s in observed] == ["done"]


def test_the_signals_iterator_follows_one_call(openai_server: FakeOpenAI) -> None:
    import asyncio

    openai_server.script(Completion(text="abcdefghij", fragment=2))
    model = driver(openai_server)

    async def scenario() -> list[str]:
        texts: list[str] = []

        async def follow() -> None:
            async for signal in model.signals(effect_id="01HFOLLOW"):
                if signal.kind == "done":
                    return
                texts.append(signal.data["text"])

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0)
        await model.complete(make_request(effect_id="01HFOLLOW"))
        await asyncio.wait_for(follower, 5)
        return texts

    assert run(scenario()) == ["ab", "cd", "ef", "gh", "ij"]


# --- usage and cost ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_usage_and_cost_of_a_known_model(openai_server: FakeOpenAI, stream: bool) -> None:
    openai_server.script(Completion(text="hi", input_tokens=2_000, cached_tokens=1_000, output_tokens=500))
    response = complete(driver(openai_server, "gpt-4o-mini", stream=stream))
    # gpt-4o-mini: $0.15 / M input, $0.075 / M cached input, $0.60 / M output
    expected = (1_000 * 0.15 + 1_000 * 0.075 + 500 * 0.60) / 1_000_000
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (2_000, 500, 1_000)
    assert usage.cost == pytest.approx(expected)


@pytest.mark.parametrize("catalogue", [True, False])
def test_a_dated_model_is_priced_as_itself_not_as_its_base_model(openai_server: FakeOpenAI, catalogue: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from jixu.threads import pricing

    if catalogue:
        import genai_prices  # noqa: F401  (installed by the test extra: missing, the test fails)
    else:
        monkeypatch.setattr(pricing, "_CATALOGUE", False)
    openai_server.script(Completion(text="hi", model="gpt-4o-2024-05-13", input_tokens=1_000, output_tokens=100),
                         Completion(text="hi", model="gpt-4o-2099-01-01", input_tokens=1_000, output_tokens=100))
    old = complete(driver(openai_server, "gpt-4o-2024-05-13"))
    assert old.usage.cost == pytest.approx((1_000 * 5.00 + 100 * 15.00) / 1_000_000), "not gpt-4o's 2.50/10.00"
    unknown = complete(driver(openai_server, "gpt-4o-2099-01-01"))
    assert unknown.usage.cost is None


def test_reasoning_tokens_are_reported(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="42", model="o4-mini-2025-04-16", output_tokens=900, reasoning_tokens=800))
    usage = complete(driver(openai_server, "o4-mini")).usage
    assert (usage.output_tokens, usage.reasoning_tokens) == (900, 800)
    assert usage.to_dict()["reasoning_tokens"] == 800


def test_an_unknown_model_has_unknown_cost_unless_priced(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="hi", model="llama3.1:8b"), Completion(text="hi", model="llama3.1:8b"))
    unknown = complete(driver(openai_server, "llama3.1:8b"))
    assert unknown.usage == Usage(input_tokens=12, output_tokens=7, cached_tokens=0, cost=None)
    priced = complete(driver(openai_server, "llama3.1:8b", prices={"llama3.1:8b": {"input": 1, "output": 2}}))
    assert priced.usage.cost == pytest.approx((12 * 1 + 7 * 2) / 1_000_000)


def test_a_response_without_usage_has_unknown_cost(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="hi", usage=False))
    response = complete(driver(openai_server, "gpt-4o"))
    assert response.usage == Usage() and response.usage.cost is None


# --- errors --------------------------------------------------------------------------------------------


def _error(message: str, error_type: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": error_type, "param": None, "code": code}}


RATE_LIMITED = _error("Rate limit reached for gpt-4o-mini in organization org-x on requests per min (RPM): "
                      "Limit 3, Used 3, Requested 1.", "requests", "rate_limit_exceeded")
TOKENS_LIMITED = _error("Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): "
                        "Limit 40000, Used 40000, Requested 512.", "tokens", "rate_limit_exceeded")
NO_QUOTA = _error("You exceeded your current quota, please check your plan and billing details.",
                  "insufficient_quota", "insufficient_quota")
BAD_KEY = _error("Incorrect API key provided: {api_key}. You can find your API key at "
                 "https://platform.openai.com/account/api-keys.", "invalid_request_error", "invalid_api_key")
SERVER_ERROR = _error("The server had an error while processing your request. Sorry about that!",
                      "server_error", None)


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("reply", "kind", "indeterminate", "retry_after"), [
    (Failure(429, RATE_LIMITED, {"retry-after": "7"}), "rate_limit", False, 7.0),
    (Failure(429, RATE_LIMITED, {"retry-after-ms": "1500", "retry-after": "2"}), "rate_limit", False, 1.5),
    (Failure(429, RATE_LIMITED), "rate_limit", False, None),
    # Without retry-after, the reset of the limit that was hit (remaining 0), in OpenAI's duration format.
    (Failure(429, RATE_LIMITED, {"x-ratelimit-limit-requests": "3", "x-ratelimit-remaining-requests": "0",
                                 "x-ratelimit-reset-requests": "17.5s", "x-ratelimit-limit-tokens": "40000",
                                 "x-ratelimit-remaining-tokens": "39000", "x-ratelimit-reset-tokens": "6m0s"}),
     "rate_limit", False, 17.5),
    (Failure(429, TOKENS_LIMITED, {"x-ratelimit-remaining-requests": "2", "x-ratelimit-reset-requests": "120ms",
                                   "x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "1m30.5s"}),
     "rate_limit", False, 90.5),
    (Failure(429, RATE_LIMITED, {"retry-after": "2", "x-ratelimit-remaining-tokens": "0",
                                 "x-ratelimit-reset-tokens": "1m"}), "rate_limit", False, 2.0),
    (Failure(429, NO_QUOTA), "quota", False, None),
    (Failure(402, _error("Insufficient credits. Add more using https://openrouter.ai/credits", "", None)),
     "quota", False, None),
    (Failure(401, BAD_KEY), "authentication", False, None),
    (Failure(403, _error("You are not allowed to sample from this model", "invalid_request_error", None)),
     "authentication", False, None),
    (Failure(500, SERVER_ERROR), "transient", True, None),
    (Failure(503, SERVER_ERROR, {"retry-after": "3"}), "transient", True, 3.0),
    (Failure(400, _error("Invalid 'messages[1].content'", "invalid_request_error", None)),
     "invalid_request", False, None),
    (Failure(404, _error("The model `gpt-9` does not exist", "invalid_request_error", "model_not_found")),
     "invalid_request", False, None),
    (Hangup(), "transient", True, None),
])
def test_provider_errors_map_to_kinds(openai_server: FakeOpenAI, stream: bool, reply: Any, kind: str,
                                      indeterminate: bool, retry_after: float | None) -> None:
    openai_server.script(reply)
    observed: list[Signal] = []
    error = fail(driver(openai_server, stream=stream, on_signal=observed.append))
    assert (error.kind, error.indeterminate, error.retry_after) == (kind, indeterminate, retry_after)
    assert error.to_dict()["kind"] == kind and error.to_dict()["indeterminate"] is indeterminate
    assert error.message.startswith("openai: ")
    assert len(openai_server.requests) == 1, "the SDK's own retries are off: jixu decides retries"
    assert observed[-1].kind == "done" and observed[-1].data == {"ok": False, "error_kind": kind}
    assert OPENAI_KEY not in json.dumps(error.to_dict()) and OPENAI_KEY not in str(error)


def test_the_api_key_echoed_by_the_provider_is_redacted(openai_server: FakeOpenAI) -> None:
    openai_server.script(Failure(401, BAD_KEY))
    error = fail(driver(openai_server))
    assert "[redacted]" in error.message and "Incorrect API key provided" in error.message
    assert OPENAI_KEY not in json.dumps(error.to_dict())
    assert error.__cause__ is None and error.__suppress_context__, "the SDK exception (with its request) is not chained"


@pytest.mark.parametrize(("reply", "detail"), [
    (Completion(text="This answer breaks off in the middle", calls=[Call("c1", "add", '{"a": 1, "b": 2}')],
                drop_after=4), "lost the connection"),
    (Completion(text="This answer ends early", end_after=3), "ended early"),
    (Completion(text="An error arrives mid-way", error_after=3,
                error_body={"message": "The server had an error", "type": "server_error", "code": None}),
     "stream"),
])
def test_a_stream_that_breaks_mid_way_is_transient_and_indeterminate(openai_server: FakeOpenAI, reply: Completion,
                                                                    detail: str) -> None:
    openai_server.script(reply)
    observed: list[Signal] = []
    error = fail(driver(openai_server, on_signal=observed.append))
    assert (error.kind, error.indeterminate) == ("transient", True)
    assert detail in error.message
    assert any(s.kind == "text_delta" for s in observed), "partial deltas were streamed before the break"
    assert observed[-1].data == {"ok": False, "error_kind": "transient"}, "and declared void"


def test_a_timeout_is_transient_and_indeterminate(openai_server: FakeOpenAI) -> None:
    openai_server.script(Slow(1.0, Completion(text="too late")))
    error = fail(driver(openai_server, timeout=0.2))
    assert (error.kind, error.indeterminate) == ("transient", True)
    assert "timed out" in error.message


@pytest.mark.parametrize("stream", [True, False])
def test_a_refused_connection_proves_the_request_was_not_processed(stream: bool) -> None:
    server = FakeOpenAI().start()
    url = server.url
    server.stop()  # nothing listens on the port any more: the connection is refused
    error = fail(OpenAIModel("gpt-4o", base_url=url, api_key=OPENAI_KEY, stream=stream))
    assert (error.kind, error.indeterminate) == ("transient", False)
    assert error.details["not_processed"] is True and "could not connect" in error.message


@pytest.mark.parametrize(("reply", "proof"), [
    (Failure(503, _error("The engine is currently overloaded, please try again later", "server_error", None)),
     True),
    (Failure(503, SERVER_ERROR), False),
    (Failure(500, SERVER_ERROR), False),
    (Failure(502, "<html>502 Bad Gateway</html>"), False),
    (Failure(504, "<html>504 Gateway Time-out</html>"), False),
    (Hangup(), False),
    (Slow(1.0, Completion(text="too late")), False),
])
def test_only_errors_that_prove_it_mark_a_request_not_processed(openai_server: FakeOpenAI, reply: Any,
                                                                proof: bool) -> None:
    openai_server.script(reply)
    error = fail(driver(openai_server, timeout=0.3))
    assert (error.details.get("not_processed") is True) is proof
    assert error.indeterminate is not proof


# --- configuration ---------------------------------------------------------------------------------------


def test_configuration_from_the_environment(openai_server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", OPENAI_KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    openai_server.script(Completion(text="from env"))
    model = OpenAIModel("gpt-4o-mini")
    assert complete(model).text == "from env"
    assert openai_server.requests[0].headers["authorization"] == f"Bearer {OPENAI_KEY}"


def test_a_local_server_needs_no_key(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="local"))
    model = OpenAIModel("llama3.1", base_url=openai_server.url)
    assert complete(model).text == "local"


def test_a_given_client_is_used_with_retries_off(openai_server: FakeOpenAI) -> None:
    import openai

    openai_server.script(Failure(500, SERVER_ERROR))
    client = openai.AsyncOpenAI(api_key=OPENAI_KEY, base_url=openai_server.url, max_retries=5)
    error = fail(OpenAIModel("gpt-4o", client=client))
    assert error.kind == "transient" and len(openai_server.requests) == 1


ANSWERS = [
    Completion(text="plain text"),
    Completion(text="Let me add.", calls=[Call("c1", "add", '{"a": 1, "b": 2}'), Call("c2", "lookup", "{}")]),
    Completion(text="ok", reasoning_content="think first", cached_tokens=4, reasoning_tokens=3),
    Completion(calls=[Call("c1", "add", '{"a": 1,')]),  # arguments that are not JSON
]


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("answer", ANSWERS, ids=["text", "calls", "reasoning", "bad-arguments"])
def test_jixus_own_client_and_a_given_sdk_client_read_every_answer_the_same(openai_server: FakeOpenAI,
                                                                           stream: bool, answer: Completion) -> None:
    import openai

    openai_server.script(answer, answer)
    own = complete(driver(openai_server, stream=stream))
    client = openai.AsyncOpenAI(api_key=OPENAI_KEY, base_url=openai_server.url)
    given = complete(OpenAIModel("gpt-4o-mini", client=client, stream=stream))
    assert own == given
    first, second = openai_server.bodies
    assert first == second, "both send the same request body"
    if stream:
        assert first["stream"] is True and first["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize("stream", [True, False])
def test_jixus_own_client_sends_the_key_organization_and_project(openai_server: FakeOpenAI, stream: bool,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_ORG_ID", "org-fleet")
    monkeypatch.setenv("OPENAI_PROJECT_ID", "proj_fleet")
    openai_server.script(Completion(text="hi"))
    assert complete(driver(openai_server, stream=stream)).text == "hi"
    headers = openai_server.requests[0].headers
    assert headers["authorization"] == f"Bearer {OPENAI_KEY}"
    assert (headers["openai-organization"], headers["openai-project"]) == ("org-fleet", "proj_fleet")
    assert headers["content-type"] == "application/json"
    assert openai_server.requests[0].path.endswith("/chat/completions")


def test_jixus_own_client_sends_concurrent_calls_over_its_connection_stack(openai_server: FakeOpenAI) -> None:
    import asyncio

    from jixu.threads.http import StackTransport

    calls = 12
    openai_server.script(*[Completion(text=f"answer {i}", event_delay=0.02) for i in range(calls)])
    model = driver(openai_server)
    assert model._http is not None
    transport = model._http.transport
    assert isinstance(transport, StackTransport)

    async def scenario() -> list[ModelResponse]:
        try:
            answers = list(await asyncio.gather(*(model.complete(make_request()) for _ in range(calls))))
            assert (transport.stack.connections, transport.stack.idle) == (calls, calls), "all kept for reuse"
            return answers
        finally:
            await model.aclose()

    answers = run(scenario())
    assert sorted(a.text or "" for a in answers) == sorted(f"answer {i}" for i in range(calls))
    assert len({request.client_port for request in openai_server.requests}) == calls


@pytest.mark.parametrize("stream", [True, False])
def test_connections_are_kept_alive_and_reused(openai_server: FakeOpenAI, stream: bool) -> None:
    calls = 12
    openai_server.script(*[Completion(text=f"answer {i}") for i in range(calls)])
    model = driver(openai_server, stream=stream)

    async def scenario() -> None:
        try:
            for _ in range(calls):
                await model.complete(make_request())
        finally:
            await model.aclose()

    run(scenario())
    ports = {request.client_port for request in openai_server.requests}
    # One connection, reused: a stream left unread to its end would close its connection instead.
    assert len(openai_server.requests) == calls and len(ports) == 1


def test_a_model_used_by_one_asyncio_run_after_another_answers_each_at_once(openai_server: FakeOpenAI) -> None:
    # A script that runs each call in its own asyncio.run: a connection made in a closed loop is never handed
    # to the next loop (its transport can no longer read: the call waited for its timeout, then failed
    # after the request had been sent), and the closed loops' connections are dropped.
    import time

    from jixu.threads.http import StackTransport

    openai_server.script(*[Completion(text=f"answer {i}") for i in range(4)])
    model = driver(openai_server, timeout=10)
    for i in range(4):
        started = time.monotonic()
        assert complete(model).text == f"answer {i}"
        assert time.monotonic() - started < 3, f"call {i} waited"
    assert model._http is not None
    transport = model._http.transport
    assert isinstance(transport, StackTransport) and transport.stack.connections == 1
    assert len(openai_server.requests) == 4


def test_a_body_left_open_after_done_does_not_hold_or_fail_the_answer(openai_server: FakeOpenAI) -> None:
    import time

    from jixu.threads.openai import DRAIN_SECONDS

    # The server sends its last event and data: [DONE], then neither ends the body nor closes for 3 s.
    openai_server.script(Completion(text="whole answer", linger_after=3.0), Completion(text="next"))
    model = driver(openai_server, timeout=30)
    started = time.monotonic()
    assert complete(model).text == "whole answer"
    assert time.monotonic() - started < DRAIN_SECONDS + 1.0, "waited only a moment for the rest of the body"
    assert complete(model).text == "next", "the next call goes over another connection"


def test_a_streamed_answer_keeps_unicode_line_separators(openai_server: FakeOpenAI) -> None:
    text = "one\u2028two\u2029three\u0085four \u4f60\u597d"
    openai_server.script(Completion(text=text, ascii_json=False, fragment=3))
    assert complete(driver(openai_server, stream=True)).text == text


@pytest.mark.parametrize("content_type", ["text/html", "application/json"])
def test_a_200_answer_that_is_not_json_is_an_invalid_response_in_doubt(openai_server: FakeOpenAI,
                                                                       content_type: str) -> None:
    """A success status says the provider may have processed the call, whatever its body: in doubt, as a
    streamed chunk that is not JSON is (it was determinate here, so the same fault failed the turn unstreamed
    and was retried streamed)."""
    openai_server.script(Failure(200, "<html>a captive portal</html>", content_type=content_type))
    error = fail(driver(openai_server, stream=False))
    assert (error.kind, error.indeterminate) == ("invalid_response", True)


# --- end to end through the harness ------------------------------------------------------------------------


def test_a_thread_runs_to_completion_with_a_real_tool(openai_server: FakeOpenAI) -> None:
    @tool(semantics="read_only")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    openai_server.script(
        Completion(calls=[Call("call_add_1", "add", '{"a": 2, "b": 3}')], input_tokens=50, output_tokens=10),
        Completion(text="2 + 3 = 5", input_tokens=80, output_tokens=8),
    )
    agent = Agent("calc", driver(openai_server), instructions="Use the add tool.", tools=[add])
    harness = Harness(agent, MemoryStore())

    async def scenario() -> tuple[Any, list[Any]]:
        thread = await harness.create_thread()
        await thread.send("what is 2 + 3?")
        state = await thread.wait()
        return state, await thread.events()

    state, events = run(scenario())
    assert state.status == "idle" and state.last_reply == "2 + 3 = 5"
    completed = [e.data["result"] for e in events if e.type == "model.completed"]
    assert completed[0]["tool_calls"] == [{"id": "call_add_1", "name": "add", "args": {"a": 2, "b": 3}}]
    assert completed[1] == {
        "text": "2 + 3 = 5", "tool_calls": [], "model": "gpt-4o-mini-2024-07-18", "stop_reason": "stop",
        "usage": {"input_tokens": 80, "output_tokens": 8, "cached_tokens": 0,
                  "cost": pytest.approx((80 * 0.15 + 8 * 0.60) / 1_000_000)},
    }
    second = openai_server.bodies[1]["messages"]
    assert second == [
        {"role": "system", "content": "Use the add tool."},
        {"role": "user", "content": "what is 2 + 3?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_add_1", "type": "function", "function": {"name": "add", "arguments": '{"a":2,"b":3}'}}]},
        {"role": "tool", "tool_call_id": "call_add_1", "content": "5"},
    ]
    assert OPENAI_KEY not in json.dumps([e.to_dict() for e in events])


def test_invalid_arguments_are_refused_before_dispatch_and_the_model_is_told(openai_server: FakeOpenAI) -> None:
    calls: list[int] = []

    @tool(semantics="read_only")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append(a + b)
        return a + b

    openai_server.script(Completion(calls=[Call("call_bad", "add", '{"a": 1,')]), Completion(text="Sorry."))
    harness = Harness(Agent("calc", driver(openai_server), tools=[add]), MemoryStore())

    async def scenario() -> Any:
        thread = await harness.create_thread()
        await thread.send("add")
        return await thread.wait()

    state = run(scenario())
    assert state.status == "idle" and state.last_reply == "Sorry." and calls == []
    second = openai_server.bodies[1]["messages"]
    assert_valid_openai(second)
    assert second[-2]["tool_calls"][0]["function"]["arguments"] == '{"__invalid_json__":"{\\"a\\": 1,"}'
    assert second[-1]["tool_call_id"] == "call_bad" and "__invalid_json__" in second[-1]["content"]


def test_a_cancelled_call_closes_its_stream_and_says_so(openai_server: FakeOpenAI) -> None:
    import asyncio

    openai_server.script(Completion(text="slow " * 50, fragment=1, event_delay=0.01))
    observed: list[Signal] = []
    model = driver(openai_server, on_signal=observed.append)

    async def scenario() -> None:
        task = asyncio.create_task(model.complete(make_request()))
        while not any(s.kind == "text_delta" for s in observed):
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await model.aclose()

    run(scenario())
    assert observed[-1].data == {"ok": False, "error_kind": "cancelled"}


# --- reasoning of compatible servers -----------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning_content_is_recorded_and_goes_back_with_its_tool_call(openai_server: FakeOpenAI, stream: bool,
                                                                       field: str) -> None:
    @tool(semantics="read_only")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    openai_server.reasoning_field = field
    openai_server.require_reasoning_back = True
    openai_server.script(
        Completion(reasoning_content="The user wants a sum; call add.", fragment=6, model="deepseek-reasoner",
                   calls=[Call("call_1", "add", '{"a": 2, "b": 3}')]),
        Completion(reasoning_content="It returned 5.", text="5", model="deepseek-reasoner"),
    )
    observed: list[Signal] = []
    model = driver(openai_server, "deepseek-reasoner", stream=stream, on_signal=observed.append)
    harness = Harness(Agent("calc", model, tools=[add]), MemoryStore())

    async def scenario() -> tuple[Any, list[Any]]:
        thread = await harness.create_thread()
        await thread.send("2 + 3?")
        state = await thread.wait()
        return state, await thread.events()

    state, events = run(scenario())
    assert state.status == "idle" and state.last_reply == "5", state
    completed = [e.data["result"] for e in events if e.type == "model.completed"]
    assert completed[0]["tool_calls"][0]["reasoning"] == {
        "format": "openai-chat", "model": "deepseek-reasoner",
        "items": [{"field": field, "text": "The user wants a sum; call add."}]}
    assert completed[1]["reasoning"]["items"] == [{"field": field, "text": "It returned 5."}]
    assistant = openai_server.bodies[1]["messages"][-2]
    assert assistant[field] == "The user wants a sum; call add." and assistant["tool_calls"][0]["id"] == "call_1"
    if stream:
        assert "".join(s.data["text"] for s in observed if s.kind == "reasoning_delta") == (
            "The user wants a sum; call add.It returned 5.")


def test_no_reasoning_means_no_reasoning_field_is_sent(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="ok"))
    conversation = [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "name": "add", "args": {}}]},
                    {"role": "tool", "tool_call_id": "c1", "name": "add", "content": "1", "status": "ok"}]
    complete(driver(openai_server), messages=conversation, tools=[ADD_SPEC])
    assert set(openai_server.bodies[0]["messages"][2]) == {"role", "content", "tool_calls"}


def test_jixus_own_chat_client_does_not_import_the_sdk_but_requires_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Importing the SDK is ~0.5 s of a worker's start, for chat calls that never use it; it must still be
    # installed (the Responses API and given clients use it), and its absence is a typed error.
    import subprocess
    import sys

    probe = ("import sys; from jixu.threads.openai import OpenAIModel; OpenAIModel('m', api_key='k'); "
             "print('openai' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True).stdout.strip() == "False"
    monkeypatch.setitem(sys.modules, "openai", None)  # as if it were not installed
    with pytest.raises(InvalidInput) as refused:
        OpenAIModel("m", api_key="k")
    assert "openai package" in str(refused.value)


def test_a_streamed_call_answered_with_a_whole_json_body_says_the_server_does_not_stream(
        openai_server: FakeOpenAI) -> None:
    """A server that ignores ``"stream": true`` answers with a whole ``chat.completion``: the error says so
    (it said the stream ended early, which hid the cause), and the call is in doubt (a success status)."""
    whole = {"id": "chatcmpl-1", "object": "chat.completion", "model": "gpt-4o-mini", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}
    openai_server.script(Failure(200, whole))
    error = fail(driver(openai_server, stream=True))
    assert (error.kind, error.indeterminate) == ("invalid_response", True), error
    assert "does not stream" in error.message and "stream=False" in error.message, error.message
