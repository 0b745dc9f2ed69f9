"""AnthropicModel through the real ``anthropic`` SDK against a local server speaking the Messages API format."""

from __future__ import annotations

import json
from typing import Any

import pytest

from jixu import Agent, Harness, MemoryStore, tool
from jixu.errors import InvalidInput, ModelError
from jixu.threads.anthropic import AnthropicModel
from jixu.threads.model import ModelResponse, ToolCall
from jixu.threads.streaming import Signal
from tests.providers.conftest import (
    ADD_SPEC,
    ANTHROPIC_KEY,
    LOOKUP_SPEC,
    STATUSES,
    every_status_conversation,
    make_request,
    run,
)
from tests.providers.fake_servers import Call, Completion, Failure, FakeAnthropic, Hangup, Slow, Thinking
from tests.providers.test_mapping import assert_valid_anthropic

MODEL = "claude-sonnet-4-20250514"


def driver(server: FakeAnthropic, model: str = MODEL, **options: Any) -> AnthropicModel:
    return AnthropicModel(model, base_url=server.url, api_key=ANTHROPIC_KEY, **options)


def complete(model: AnthropicModel, **request: Any) -> ModelResponse:
    return run(model.complete(make_request(**request)))


def fail(model: AnthropicModel, **request: Any) -> ModelError:
    with pytest.raises(ModelError) as caught:
        complete(model, **request)
    return caught.value


# --- answers ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_plain_text(anthropic_server: FakeAnthropic, stream: bool) -> None:
    anthropic_server.script(Completion(text="Hello! How can I help?"))
    response = complete(driver(anthropic_server, stream=stream))
    assert response.text == "Hello! How can I help?"
    assert response.tool_calls == ()
    assert response.model == MODEL
    assert response.stop_reason == "end_turn"
    [sent] = anthropic_server.requests
    assert sent.path == "/v1/messages"
    assert anthropic_server.received_key(sent.headers) == ANTHROPIC_KEY
    assert "anthropic-version" in sent.headers
    assert sent.body["model"] == MODEL and sent.body["max_tokens"] == 1024
    # Prompt caching is on by default: a breakpoint on the system prompt and on the conversation's last block.
    assert sent.body["system"] == [{"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}]
    assert sent.body["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "Hello?", "cache_control": {"type": "ephemeral"}}]}]
    assert "tools" not in sent.body
    assert sent.body.get("stream", False) is stream


def test_prompt_caching_marks_tools_instructions_and_the_conversation_so_far(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Completion(text="ok", cached_tokens=3_000), Completion(text="ok"))
    response = complete(driver(anthropic_server), messages=every_status_conversation(), tools=[ADD_SPEC, LOOKUP_SPEC])
    body = anthropic_server.bodies[0]
    marked = [("tool", t["name"]) for t in body["tools"] if "cache_control" in t]
    marked += [("system", b["text"]) for b in body["system"] if "cache_control" in b]
    marked += [(m["role"], b.get("text") or b.get("tool_use_id")) for m in body["messages"] for b in m["content"]
               if "cache_control" in b]
    assert marked == [("tool", "lookup"), ("system", "You are terse."), ("user", "Thanks. Once more?")]
    assert response.usage.cached_tokens == 3_000
    complete(driver(anthropic_server, cache=False), tools=[ADD_SPEC])
    assert "cache_control" not in json.dumps(anthropic_server.bodies[1])
    assert anthropic_server.bodies[1]["system"] == "You are terse."


def test_no_instructions_means_no_system_and_options_are_sent(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Completion(text="ok"))
    complete(driver(anthropic_server, max_tokens=300, temperature=0.5), instructions="")
    body = anthropic_server.bodies[0]
    assert "system" not in body
    assert body["max_tokens"] == 300 and body["temperature"] == 0.5


@pytest.mark.parametrize("stream", [True, False])
def test_a_tool_call_round_trip(anthropic_server: FakeAnthropic, stream: bool) -> None:
    anthropic_server.script(Completion(text="I'll add them.", calls=[Call("toolu_01A", "add", '{"a": 2, "b": 3}')]))
    response = complete(driver(anthropic_server, stream=stream), tools=[ADD_SPEC])
    assert response.text == "I'll add them."
    assert response.tool_calls == (ToolCall(name="add", args={"a": 2, "b": 3}, id="toolu_01A"),)
    assert response.stop_reason == "tool_use"
    assert anthropic_server.bodies[0]["tools"] == [
        {"name": "add", "description": "Add two integers.", "input_schema": ADD_SPEC["parameters"],
         "cache_control": {"type": "ephemeral"}}]


@pytest.mark.parametrize("stream", [True, False])
def test_parallel_tool_calls(anthropic_server: FakeAnthropic, stream: bool) -> None:
    anthropic_server.script(Completion(calls=[Call("toolu_1", "add", '{"a": 1, "b": 2}'),
                                              Call("toolu_2", "lookup", '{"key": "colour"}'),
                                              Call("toolu_3", "add", "{}")]))
    response = complete(driver(anthropic_server, stream=stream), tools=[ADD_SPEC, LOOKUP_SPEC])
    assert response.text is None
    assert response.tool_calls == (ToolCall("add", {"a": 1, "b": 2}, "toolu_1"),
                                   ToolCall("lookup", {"key": "colour"}, "toolu_2"),
                                   ToolCall("add", {}, "toolu_3"))


def test_streamed_arguments_that_are_not_json_pass_through_marked_invalid(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Completion(calls=[Call("toolu_1", "add", '{"a": 1, "b": ')], stop="max_tokens"))
    response = complete(driver(anthropic_server), tools=[ADD_SPEC])
    assert response.tool_calls[0].args == {"__invalid_json__": '{"a": 1, "b": '}
    assert response.stop_reason == "max_tokens"


def test_a_conversation_with_every_tool_status_is_sent_valid(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Completion(text="ok"))
    complete(driver(anthropic_server), messages=every_status_conversation(), tools=[ADD_SPEC])
    sent = anthropic_server.bodies[0]["messages"]
    assert_valid_anthropic(sent)
    uses = [b["id"] for m in sent for b in m["content"] if b["type"] == "tool_use"]
    results = [b for m in sent for b in m["content"] if b["type"] == "tool_result"]
    assert uses == [r["tool_use_id"] for r in results] == [f"call_{s}" for s in STATUSES]
    errors = {r["tool_use_id"] for r in results if r.get("is_error")}
    assert errors == {f"call_{s}" for s in STATUSES if s not in ("ok", "occurred")}
    # parallel calls: one assistant message with several tool_use blocks, one user message with their results
    assert [b["type"] for b in sent[1]["content"]] == ["text", "tool_use", "tool_use", "tool_use", "tool_use"]
    assert [b["type"] for b in sent[2]["content"]] == ["tool_result"] * 4


# --- streaming -----------------------------------------------------------------------------------------


def test_streaming_assembles_fragments_and_publishes_signals(anthropic_server: FakeAnthropic) -> None:
    raw = ['{"a": 20, "b": 22}', '{"key": "k"}']
    anthropic_server.script(Completion(text="Adding now.", fragment=3, calls=[
        Call("toolu_1", "add", raw[0]), Call("toolu_2", "lookup", raw[1])]))
    observed: list[Signal] = []
    model = driver(anthropic_server, on_signal=observed.append)

    async def scenario() -> tuple[ModelResponse, list[Signal]]:
        queue = model.subscribe()
        response = await model.complete(make_request(tools=[ADD_SPEC, LOOKUP_SPEC], effect_id="01HSTREAM"))
        model.unsubscribe(queue)
        return response, [queue.get_nowait() for _ in range(queue.qsize())]

    response, queued = run(scenario())
    assert queued == observed
    assert response.text == "Adding now."
    assert response.tool_calls == (ToolCall("add", {"a": 20, "b": 22}, "toolu_1"),
                                   ToolCall("lookup", {"key": "k"}, "toolu_2"))
    texts = [s.data["text"] for s in observed if s.kind == "text_delta"]
    assert len(texts) == 4 and "".join(texts) == "Adding now."
    # The text is content block 0 and the calls blocks 1 and 2; signals number the calls 0 and 1, as OpenAI's do.
    for index, call in enumerate(response.tool_calls):
        parts = [s for s in observed if s.kind == "tool_call_delta" and s.data["index"] == index]
        assert "".join(s.data["arguments"] for s in parts) == raw[index]
        assert {(s.data["id"], s.data["name"]) for s in parts} == {(call.id, call.name)}
    assert observed[-1].kind == "done" and observed[-1].data == {"ok": True, "stop_reason": "tool_use"}
    assert {s.effect_id for s in observed} == {"01HSTREAM"}


# --- usage and cost ------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_usage_counts_cache_reads_and_writes_and_prices_them(anthropic_server: FakeAnthropic, stream: bool) -> None:
    anthropic_server.script(Completion(text="hi", input_tokens=1_000, cached_tokens=3_000, cache_write_tokens=500,
                                       output_tokens=200))
    response = complete(driver(anthropic_server, stream=stream))
    # claude-sonnet-4: $3 / M input, $0.30 / M cache read, $3.75 / M cache write, $15 / M output
    expected = (1_000 * 3 + 3_000 * 0.30 + 500 * 3.75 + 200 * 15) / 1_000_000
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.cached_tokens) == (4_500, 200, 3_000)
    assert usage.cache_write_tokens == 500 and usage.to_dict()["cache_write_tokens"] == 500
    assert usage.cost == pytest.approx(expected)


def test_an_unknown_model_has_unknown_cost_unless_priced(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Completion(text="hi", model="claude-next"), Completion(text="hi", model="claude-next"))
    assert complete(driver(anthropic_server, "claude-next")).usage.cost is None
    priced = complete(driver(anthropic_server, "claude-next", prices={"claude-next": {"input": 1, "output": 5}}))
    assert priced.usage.cost == pytest.approx((12 * 1 + 7 * 5) / 1_000_000)


# --- errors --------------------------------------------------------------------------------------------


def _error(error_type: str, message: str) -> dict[str, Any]:
    return {"type": "error", "error": {"type": error_type, "message": message}}


RATE_LIMITED = _error("rate_limit_error", "This request would exceed the rate limit for your organization of "
                                          "50 requests per minute.")
LOW_CREDIT = _error("invalid_request_error", "Your credit balance is too low to access the Anthropic API. "
                                             "Please go to Plans & Billing to upgrade or purchase credits.")
BAD_KEY = _error("authentication_error", "invalid x-api-key: {api_key}")
OVERLOADED = _error("overloaded_error", "Overloaded")
# The monthly spend cap of the organization's tier (https://docs.anthropic.com/en/api/rate-limits): a 429
# rate_limit_error naming it in error.details.error_code, without retry-after; it lifts next month.
SPEND_CAP = {"type": "error", "error": {
    "type": "rate_limit_error",
    "message": "You have reached your API usage limits: your organization has crossed its monthly API usage "
               "threshold, set based on your organization's API tier. You will regain access on 2027-01-01 at "
               "00:00 UTC.",
    "details": {"error_code": "enforced_spend_limit_reached"}}, "request_id": "req_011CSpendCap"}
# A limit the user set in the console answers 400.
USER_LIMIT = _error("invalid_request_error", "You have reached your specified API usage limits. You will regain "
                                             "access on 2027-01-01 at 00:00 UTC.")


@pytest.mark.parametrize("stream", [True, False])
@pytest.mark.parametrize(("reply", "kind", "indeterminate", "retry_after"), [
    (Failure(429, RATE_LIMITED, {"retry-after": "12"}), "rate_limit", False, 12.0),
    (Failure(429, RATE_LIMITED), "rate_limit", False, None),
    (Failure(429, RATE_LIMITED, {"anthropic-ratelimit-requests-limit": "50",
                                 "anthropic-ratelimit-requests-remaining": "0",
                                 "anthropic-ratelimit-requests-reset": "2099-01-01T00:00:30Z"}),
     "rate_limit", False, "future"),
    (Failure(429, SPEND_CAP), "quota", False, None),
    (Failure(400, USER_LIMIT), "quota", False, None),
    (Failure(400, LOW_CREDIT), "quota", False, None),
    (Failure(402, _error("billing_error", "Your account has a billing issue.")), "quota", False, None),
    (Failure(401, BAD_KEY), "authentication", False, None),
    (Failure(403, _error("permission_error", "Your API key does not have permission to use the specified "
                                             "resource.")), "authentication", False, None),
    (Failure(500, _error("api_error", "Internal server error")), "transient", True, None),
    (Failure(529, OVERLOADED), "transient", False, None),  # overloaded: refused before any work, see below
    (Failure(400, _error("invalid_request_error", "messages: roles must alternate")), "invalid_request", False,
     None),
    (Failure(404, _error("not_found_error", "model: claude-9")), "invalid_request", False, None),
    (Hangup(), "transient", True, None),
])
def test_provider_errors_map_to_kinds(anthropic_server: FakeAnthropic, stream: bool, reply: Any, kind: str,
                                      indeterminate: bool, retry_after: float | str | None) -> None:
    anthropic_server.script(reply)
    observed: list[Signal] = []
    error = fail(driver(anthropic_server, stream=stream, on_signal=observed.append))
    if retry_after == "future":  # an RFC 3339 reset time: some seconds from now
        assert error.retry_after is not None and error.retry_after > 86_400
        retry_after = error.retry_after
    assert (error.kind, error.indeterminate, error.retry_after) == (kind, indeterminate, retry_after)
    assert error.message.startswith("anthropic: ")
    assert len(anthropic_server.requests) == 1, "the SDK's own retries are off: jixu decides retries"
    assert observed[-1].data == {"ok": False, "error_kind": kind}
    assert ANTHROPIC_KEY not in json.dumps(error.to_dict()) and ANTHROPIC_KEY not in str(error)


@pytest.mark.parametrize(("reply", "proof"), [
    (Failure(529, OVERLOADED), True),
    (Failure(500, _error("api_error", "Internal server error")), False),
    (Failure(429, RATE_LIMITED), False),
    (Hangup(), False),
])
def test_only_an_overloaded_answer_proves_the_request_was_not_processed(anthropic_server: FakeAnthropic,
                                                                       reply: Any, proof: bool) -> None:
    anthropic_server.script(reply)
    error = fail(driver(anthropic_server))
    assert (error.details.get("not_processed") is True) is proof
    if proof:
        assert error.indeterminate is False


def test_the_api_key_echoed_by_the_provider_is_redacted(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Failure(401, BAD_KEY))
    error = fail(driver(anthropic_server))
    assert "invalid x-api-key: [redacted]" in error.message
    assert error.to_dict()["error_type"] == "authentication_error"


@pytest.mark.parametrize(("reply", "detail"), [
    (Completion(text="This answer breaks off in the middle", calls=[Call("t1", "add", '{"a": 1, "b": 2}')],
                drop_after=5), "lost the connection"),
    (Completion(text="This answer ends early", end_after=4), "ended early"),
    (Completion(text="An error arrives mid-way", error_after=4, error_body=OVERLOADED), "in the stream"),
])
def test_a_stream_that_breaks_mid_way_is_transient_and_indeterminate(anthropic_server: FakeAnthropic,
                                                                    reply: Completion, detail: str) -> None:
    anthropic_server.script(reply)
    observed: list[Signal] = []
    error = fail(driver(anthropic_server, on_signal=observed.append))
    assert (error.kind, error.indeterminate) == ("transient", True)
    assert detail in error.message
    assert any(s.kind == "text_delta" for s in observed), "partial deltas were streamed before the break"
    assert observed[-1].data == {"ok": False, "error_kind": "transient"}


def test_a_timeout_is_transient_and_indeterminate(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Slow(1.0, Completion(text="too late")))
    error = fail(driver(anthropic_server, timeout=0.2))
    assert (error.kind, error.indeterminate) == ("transient", True)


# --- configuration ---------------------------------------------------------------------------------------


def test_configuration_from_the_environment(anthropic_server: FakeAnthropic, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", ANTHROPIC_KEY)
    monkeypatch.setenv("ANTHROPIC_BASE_URL", anthropic_server.url)
    anthropic_server.script(Completion(text="from env"))
    assert complete(AnthropicModel(MODEL)).text == "from env"
    assert anthropic_server.received_key(anthropic_server.requests[0].headers) == ANTHROPIC_KEY


# --- end to end through the harness ------------------------------------------------------------------------


def test_a_thread_runs_to_completion_with_a_real_tool(anthropic_server: FakeAnthropic) -> None:
    @tool(semantics="read_only")
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    anthropic_server.script(
        Completion(text="Let me add.", calls=[Call("toolu_add_1", "add", '{"a": 2, "b": 3}')]),
        Completion(text="2 + 3 = 5", input_tokens=90, output_tokens=9),
    )
    agent = Agent("calc", driver(anthropic_server), instructions="Use the add tool.", tools=[add])
    harness = Harness(agent, MemoryStore())

    async def scenario() -> tuple[Any, list[Any]]:
        thread = await harness.create_thread()
        await thread.send("what is 2 + 3?")
        state = await thread.wait()
        return state, await thread.events()

    state, events = run(scenario())
    assert state.status == "idle" and state.last_reply == "2 + 3 = 5"
    completed = [e.data["result"] for e in events if e.type == "model.completed"]
    assert completed[0]["tool_calls"] == [{"id": "toolu_add_1", "name": "add", "args": {"a": 2, "b": 3}}]
    assert completed[1] == {
        "text": "2 + 3 = 5", "tool_calls": [], "model": MODEL, "stop_reason": "end_turn",
        "usage": {"input_tokens": 90, "output_tokens": 9, "cached_tokens": 0,
                  "cost": pytest.approx((90 * 3 + 9 * 15) / 1_000_000)},
    }
    second = anthropic_server.bodies[1]
    cached = {"type": "ephemeral"}
    assert second["system"] == [{"type": "text", "text": "Use the add tool.", "cache_control": cached}]
    assert second["tools"][-1]["cache_control"] == cached
    assert second["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "what is 2 + 3?"}]},
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me add."},
            {"type": "tool_use", "id": "toolu_add_1", "name": "add", "input": {"a": 2, "b": 3}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_add_1", "content": "5",
                                      "cache_control": cached}]},
    ]
    assert ANTHROPIC_KEY not in json.dumps([e.to_dict() for e in events])


# --- extended thinking ------------------------------------------------------------------------------------


@tool(semantics="read_only")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def test_thinking_options_become_the_apis_thinking_object(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(*[Completion(text="ok")] * 3)
    complete(driver(anthropic_server, max_tokens=4096, thinking=2048))
    complete(driver(anthropic_server, thinking="adaptive"))
    complete(driver(anthropic_server, thinking={"type": "enabled", "budget_tokens": 1024, "display": "omitted"},
                    max_tokens=2000))
    assert [b["thinking"] for b in anthropic_server.bodies] == [
        {"type": "enabled", "budget_tokens": 2048}, {"type": "adaptive"},
        {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}]
    assert "thinking" not in driver(anthropic_server).request_body(make_request()), "off unless asked for"
    for bad in (True, 512, 4096, "lots", {"budget_tokens": 2048}):
        with pytest.raises(InvalidInput):
            driver(anthropic_server, max_tokens=4096, thinking=bad)
    with pytest.raises(InvalidInput):
        driver(anthropic_server, cache="yes")


@pytest.mark.parametrize("stream", [True, False])
def test_thinking_and_redacted_thinking_are_recorded_verbatim(anthropic_server: FakeAnthropic, stream: bool) -> None:
    anthropic_server.script(Completion(thinking=[Thinking("The user wants 2 + 3; the add tool does that."),
                                                 Thinking(redacted=True)],
                                       text="Adding.", calls=[Call("toolu_1", "add", '{"a": 2, "b": 3}')],
                                       fragment=7))
    observed: list[Signal] = []
    model = driver(anthropic_server, stream=stream, max_tokens=4096, thinking=2048, on_signal=observed.append)
    response = complete(model, tools=[ADD_SPEC])
    [signature] = anthropic_server.signatures
    [data] = anthropic_server.redacted
    items = [{"type": "thinking", "thinking": "The user wants 2 + 3; the add tool does that.",
              "signature": signature},
             {"type": "redacted_thinking", "data": data}]
    assert response.reasoning == {"format": "anthropic", "model": MODEL, "items": items}
    assert response.text == "Adding." and response.tool_calls[0].args == {"a": 2, "b": 3}
    result = response.to_result("01HEFFECT0000000000000000000")
    assert result["tool_calls"][0]["reasoning"] == response.reasoning and "reasoning" not in result
    if stream:
        thoughts = [s.data["text"] for s in observed if s.kind == "reasoning_delta"]
        assert len(thoughts) > 1 and "".join(thoughts) == items[0]["thinking"]
        assert {s.data["index"] for s in observed if s.kind == "tool_call_delta"} == {0}


def test_an_answer_without_tool_calls_keeps_its_thinking_in_the_result(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(Completion(thinking=[Thinking("Easy.")], text="5"))
    response = complete(driver(anthropic_server, max_tokens=4096, thinking=2048))
    result = response.to_result("01HEFFECT0000000000000000000")
    assert result["reasoning"]["items"][0]["thinking"] == "Easy." and result["tool_calls"] == []


def _thinking_turn(model: AnthropicModel, anthropic_server: FakeAnthropic) -> tuple[Any, list[Any]]:
    anthropic_server.script(
        Completion(thinking=[Thinking("I should call add."), Thinking(redacted=True)],
                   calls=[Call("toolu_add_1", "add", '{"a": 2, "b": 3}')]),
        Completion(thinking=[Thinking("The tool said 5.")], text="2 + 3 = 5"),
    )
    harness = Harness(Agent("calc", model, instructions="Use the add tool.", tools=[add]), MemoryStore())

    async def scenario() -> tuple[Any, list[Any]]:
        thread = await harness.create_thread()
        await thread.send("what is 2 + 3?")
        state = await thread.wait()
        return state, await thread.events()

    return run(scenario())


@pytest.mark.parametrize("stream", [True, False])
def test_thinking_goes_back_verbatim_with_the_tool_call_it_led_to(anthropic_server: FakeAnthropic,
                                                                 stream: bool) -> None:
    state, events = _thinking_turn(driver(anthropic_server, stream=stream, max_tokens=4096, thinking=2048),
                                   anthropic_server)
    assert state.status == "idle" and state.last_reply == "2 + 3 = 5", state
    completed = [e.data["result"] for e in events if e.type == "model.completed"]
    recorded = completed[0]["tool_calls"][0]["reasoning"]["items"]
    assert [b["type"] for b in recorded] == ["thinking", "redacted_thinking"]
    assert recorded[0]["signature"] in anthropic_server.signatures and recorded[1]["data"] in anthropic_server.redacted
    assert completed[1]["reasoning"]["items"][0]["thinking"] == "The tool said 5."
    second = anthropic_server.bodies[1]
    assert second["messages"][1] == {"role": "assistant", "content": [
        *recorded, {"type": "tool_use", "id": "toolu_add_1", "name": "add", "input": {"a": 2, "b": 3}}]}


def test_thinking_turned_on_by_a_subclass_also_survives_the_tool_call(anthropic_server: FakeAnthropic) -> None:
    # As the issue reported it: thinking on through a subclass; the tool ran, and the next request failed with
    # 400 "Expected thinking or redacted_thinking, but found tool_use".
    class Thoughtful(AnthropicModel):
        def request_body(self, request: Any) -> dict[str, Any]:
            body = super().request_body(request)
            body["extra_body"] = {"thinking": {"type": "enabled", "budget_tokens": 1024}}
            return body

    model = Thoughtful(MODEL, base_url=anthropic_server.url, api_key=ANTHROPIC_KEY, max_tokens=2048)
    state, _events = _thinking_turn(model, anthropic_server)
    assert state.status == "idle" and state.last_reply == "2 + 3 = 5", state


def test_the_fake_refuses_a_tool_loop_without_its_thinking_as_the_api_does(anthropic_server: FakeAnthropic) -> None:
    # The rule the fake enforces (so the tests above can fail): a final assistant message with tool use must
    # start with its thinking, and a thinking block must come back unchanged.
    conversation = [{"role": "user", "content": "what is 2 + 3?"},
                    {"role": "assistant", "content": None, "tool_calls": [{"id": "t1", "name": "add",
                                                                           "args": {"a": 2, "b": 3}}]},
                    {"role": "tool", "tool_call_id": "t1", "name": "add", "content": "5", "status": "ok"}]
    anthropic_server.script(Completion(text="5"))
    error = fail(driver(anthropic_server, max_tokens=4096, thinking=2048), messages=conversation, tools=[ADD_SPEC])
    assert error.kind == "invalid_request" and "Expected `thinking` or `redacted_thinking`" in error.message
    forged = {"format": "anthropic", "model": MODEL,
              "items": [{"type": "thinking", "thinking": "edited", "signature": "EqQBforged"}]}
    conversation[1] = {**conversation[1], "reasoning": forged}
    anthropic_server.script(Completion(text="5"))
    error = fail(driver(anthropic_server, max_tokens=4096, thinking=2048), messages=conversation, tools=[ADD_SPEC])
    assert "Invalid `signature`" in error.message


def test_reasoning_of_another_provider_is_not_sent_to_anthropic(anthropic_server: FakeAnthropic) -> None:
    other = {"format": "openai-responses", "model": "o4-mini", "items": [
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"}]}
    conversation = [{"role": "user", "content": "hi"},
                    {"role": "assistant", "content": None, "tool_calls": [
                        {"id": "t1", "name": "add", "args": {"a": 1, "b": 1}, "reasoning": other}]},
                    {"role": "tool", "tool_call_id": "t1", "name": "add", "content": "2", "status": "ok"}]
    anthropic_server.script(Completion(text="2"))
    assert complete(driver(anthropic_server), messages=conversation, tools=[ADD_SPEC]).text == "2"
    assert anthropic_server.bodies[0]["messages"][1]["content"] == [
        {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1, "b": 1}}]


@pytest.mark.parametrize("content_type", ["text/html", "application/json"])
def test_an_unstreamed_200_answer_that_is_not_json_is_an_invalid_response_in_doubt(anthropic_server: FakeAnthropic,
                                                                                  content_type: str) -> None:
    """A success status with a body that is not the API's object (a proxy's HTML page): never an answer (it was
    taken for an empty one, or raised an untyped error), and in doubt, since the provider may have processed it."""
    anthropic_server.script(Failure(200, "<html>proxy error page</html>", content_type=content_type))
    error = fail(driver(anthropic_server, stream=False))
    assert (error.kind, error.indeterminate) == ("invalid_response", True), error
