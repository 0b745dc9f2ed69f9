"""Issue-5 scenarios end to end: a Harness thread, the real SDK, a local server speaking the provider's wire
format. Rate limits, quota, authentication, server errors, a dropped stream, streaming to callers, and a
SIGKILL in the middle of a streamed model call."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jixu import Agent, Harness, MemoryStore, RecoveryResolver, State, tool
from jixu.kernel.loop import MAX_RETRY_AFTER
from jixu.ledger import Event, open_store
from jixu.threads.anthropic import AnthropicModel
from jixu.threads.openai import OpenAIModel
from jixu.threads.streaming import Signal
from tests.conftest import PostgresSchema
from tests.helpers import ROOT, python_env
from tests.providers.conftest import ANTHROPIC_KEY, OPENAI_KEY, run
from tests.providers.fake_servers import Call, Completion, Failure, FakeAnthropic, FakeOpenAI, FakeResponses
from tests.providers.stream_crash_child import QUESTION, stream_agent
from tests.providers.stream_crash_child import driver as child_driver
from tests.providers.test_mapping import assert_valid_openai
from tests.providers.test_openai import BAD_KEY as OPENAI_BAD_KEY
from tests.providers.test_openai import NO_QUOTA, RATE_LIMITED, SERVER_ERROR

RETRY_AFTER_MS = {"retry-after-ms": "50"}
ANTHROPIC_RATE_LIMITED = {"type": "error", "error": {
    "type": "rate_limit_error", "message": "This request would exceed the rate limit for your organization of "
                                          "50 requests per minute."}}


@tool(semantics="read_only")
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def openai_harness(server: FakeOpenAI, *, stream: bool = True) -> Harness:
    model = OpenAIModel("gpt-4o-mini", base_url=server.url, api_key=OPENAI_KEY, stream=stream)
    return Harness(Agent("scenario", model, tools=[add]), MemoryStore(), retry_backoff=0.01)


def anthropic_harness(server: FakeAnthropic) -> Harness:
    model = AnthropicModel("claude-sonnet-4-20250514", base_url=server.url, api_key=ANTHROPIC_KEY)
    return Harness(Agent("scenario", model, tools=[add]), MemoryStore(), retry_backoff=0.01)


async def ask(harness: Harness, text: str = "hello") -> tuple[Any, State, list[Event]]:
    thread = await harness.create_thread()
    await thread.send(text)
    state = await asyncio.wait_for(thread.wait(), 20)
    return thread, state, await thread.events()


def of_type(events: list[Event], event_type: str) -> list[Event]:
    return [e for e in events if e.type == event_type]


def pauses(events: list[Event]) -> list[tuple[str, bool, float | None]]:
    return [(p.data["reason"], p.data["automatic"], p.data["delay"]) for p in of_type(events, "turn.paused")]


# --- rate limits -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
def test_openai_three_rate_limits_then_success_are_exactly_three_recorded_automatic_retries(
        openai_server: FakeOpenAI, stream: bool) -> None:
    openai_server.script(*[Failure(429, RATE_LIMITED, RETRY_AFTER_MS)] * 3, Completion(text="At last."))
    _thread, state, events = run(ask(openai_harness(openai_server, stream=stream)))
    assert state.status == "idle" and state.last_reply == "At last."
    assert pauses(events) == [("rate_limit", True, 0.05)] * 3
    assert [p.data["retry_after"] for p in of_type(events, "turn.paused")] == [0.05] * 3
    assert [p.data["automatic_retries_used"] for p in of_type(events, "turn.paused")] == [0, 1, 2]
    assert [r.data["reason"] for r in of_type(events, "turn.resumed")] == ["automatic"] * 3
    # A refused call is determinate: each retry is a new model effect, and each was one request.
    assert len(of_type(events, "model.requested")) == 4 and len(openai_server.requests) == 4
    assert [f.data["error"]["kind"] for f in of_type(events, "model.failed")] == ["rate_limit"] * 3
    assert all(f.data["indeterminate"] is False for f in of_type(events, "model.failed"))
    for paused in of_type(events, "turn.paused"):
        assert paused.data["resume_at"] is not None


def test_openai_a_fourth_rate_limit_pauses_instead_of_retrying(openai_server: FakeOpenAI) -> None:
    openai_server.script(*[Failure(429, RATE_LIMITED, RETRY_AFTER_MS)] * 4)
    harness = openai_harness(openai_server)

    async def scenario() -> None:
        thread, state, events = await ask(harness)
        assert state.status == "paused" and "rate_limit" in state.reason
        assert pauses(events) == [("rate_limit", True, 0.05)] * 3 + [("rate_limit", False, None)]
        assert of_type(events, "turn.paused")[3].data["retry_after"] == 0.05, "the provider's hint is kept"
        assert len(of_type(events, "turn.resumed")) == 3
        assert len(openai_server.requests) == 4
        # Waiting calls nothing more; an explicit resume continues the turn.
        assert (await thread.wait()).status == "paused" and len(openai_server.requests) == 4
        openai_server.script(Completion(text="Resumed."))
        await thread.resume(actor="ops", note="limit raised")
        state = await asyncio.wait_for(thread.wait(), 20)
        assert state.status == "idle" and state.last_reply == "Resumed." and len(openai_server.requests) == 5

    run(scenario())


def test_a_retry_after_beyond_an_hour_pauses_for_an_operator(openai_server: FakeOpenAI) -> None:
    openai_server.script(Failure(429, RATE_LIMITED, {"retry-after": str(int(MAX_RETRY_AFTER) + 1)}))
    harness = openai_harness(openai_server)

    async def scenario() -> None:
        thread, state, events = await ask(harness)  # within ask's 20 s: the hour and a second is not waited out
        assert state.status == "paused" and "rate_limit" in state.reason
        assert pauses(events) == [("rate_limit", False, None)]
        assert "the provider asked to wait 3601 s" in state.reason, state.reason
        paused = of_type(events, "turn.paused")[0].data
        assert paused["retry_after"] == MAX_RETRY_AFTER + 1 and paused["resume_at"] is None
        assert not of_type(events, "turn.resumed") and len(openai_server.requests) == 1
        openai_server.script(Completion(text="Resumed."))
        await thread.resume(actor="ops")
        state = await asyncio.wait_for(thread.wait(), 20)
        assert state.status == "idle" and state.last_reply == "Resumed." and len(openai_server.requests) == 2

    run(scenario())


def test_anthropic_three_rate_limits_then_success(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(*[Failure(429, ANTHROPIC_RATE_LIMITED, RETRY_AFTER_MS)] * 3, Completion(text="Done."))
    _thread, state, events = run(ask(anthropic_harness(anthropic_server)))
    assert state.status == "idle" and state.last_reply == "Done."
    assert pauses(events) == [("rate_limit", True, 0.05)] * 3
    assert len(of_type(events, "model.requested")) == 4 and len(anthropic_server.requests) == 4


def test_anthropic_a_fourth_rate_limit_pauses(anthropic_server: FakeAnthropic) -> None:
    anthropic_server.script(*[Failure(429, ANTHROPIC_RATE_LIMITED, RETRY_AFTER_MS)] * 4)
    _thread, state, events = run(ask(anthropic_harness(anthropic_server)))
    assert state.status == "paused"
    assert [p[1] for p in pauses(events)] == [True, True, True, False]
    assert len(anthropic_server.requests) == 4


# --- quota, authentication, server errors -----------------------------------------------------------------


@pytest.mark.parametrize(("reply", "reason"), [
    (Failure(429, NO_QUOTA), "quota"),
    (Failure(401, OPENAI_BAD_KEY), "authentication"),
])
def test_quota_and_authentication_pause_without_an_automatic_retry(openai_server: FakeOpenAI, reply: Failure,
                                                                 reason: str) -> None:
    openai_server.script(reply)
    harness = openai_harness(openai_server)

    async def scenario() -> None:
        thread, state, events = await ask(harness)
        assert state.status == "paused" and reason in state.reason
        assert pauses(events) == [(reason, False, None)]
        assert of_type(events, "turn.resumed") == [] and len(openai_server.requests) == 1
        [failed] = of_type(events, "model.failed")
        assert failed.data["error"]["kind"] == reason and failed.data["indeterminate"] is False
        assert OPENAI_KEY not in json.dumps([e.to_dict() for e in events])
        openai_server.script(Completion(text="Fixed."))
        await thread.resume(actor="ops", note=f"{reason} fixed")
        state = await asyncio.wait_for(thread.wait(), 20)
        assert state.status == "idle" and state.last_reply == "Fixed."

    run(scenario())


def test_anthropic_spend_cap_pauses_for_quota_and_is_not_retried(anthropic_server: FakeAnthropic) -> None:
    from tests.providers.test_anthropic import SPEND_CAP, USER_LIMIT

    anthropic_server.script(Failure(429, SPEND_CAP), Failure(400, USER_LIMIT))
    for _ in range(2):
        _thread, state, events = run(ask(anthropic_harness(anthropic_server)))
        assert state.status == "paused" and "quota" in state.reason
        assert pauses(events) == [("quota", False, None)] and of_type(events, "turn.resumed") == []
        assert of_type(events, "model.failed")[0].data["error"]["kind"] == "quota"
    assert len(anthropic_server.requests) == 2, "a spending cap is not retried as a rate limit"


def test_server_errors_are_retried_under_the_same_effect_id(openai_server: FakeOpenAI) -> None:
    openai_server.script(*[Failure(500, SERVER_ERROR)] * 3, Completion(text="Recovered."))
    _thread, state, events = run(ask(openai_harness(openai_server)))
    assert state.status == "idle" and state.last_reply == "Recovered."
    [requested] = of_type(events, "model.requested")
    effect_id = requested.data["effect_id"]
    lifecycle = [(e.type, e.data.get("attempt")) for e in events if e.data.get("effect_id") == effect_id]
    assert lifecycle == [("model.requested", None),
                         ("model.dispatched", 1), ("model.failed", 1),
                         ("model.dispatched", 2), ("model.failed", 2),
                         ("model.dispatched", 3), ("model.failed", 3),
                         ("model.dispatched", 4), ("model.completed", 4)]
    assert all(f.data["indeterminate"] is True for f in of_type(events, "model.failed"))
    assert [p[:2] for p in pauses(events)] == [("transient", True)] * 3
    assert all(p.data["model_effect_id"] == effect_id for p in of_type(events, "turn.paused"))
    # The same call each time: the same prompt, sent four times.
    bodies = openai_server.bodies
    assert len(bodies) == 4 and all(body == bodies[0] for body in bodies)


def test_a_dropped_stream_is_retried_and_its_partial_text_never_recorded(openai_server: FakeOpenAI) -> None:
    openai_server.script(Completion(text="PARTIAL-ATTEMPT never to be seen again", drop_after=4),
                         Completion(text="The whole answer."))
    _thread, state, events = run(ask(openai_harness(openai_server)))
    assert state.status == "idle" and state.last_reply == "The whole answer."
    [completed] = of_type(events, "model.completed")
    assert completed.data["attempt"] == 2 and completed.data["result"]["text"] == "The whole answer."
    assert "PARTIAL" not in json.dumps([e.to_dict() for e in events])
    assert len(of_type(events, "model.requested")) == 1


# --- streaming to callers ---------------------------------------------------------------------------------


def test_thread_signals_stream_text_deltas_that_are_never_recorded(openai_server: FakeOpenAI) -> None:
    answer = "Streaming, one small piece at a time."
    openai_server.script(Completion(text="Another thread's answer.", fragment=3), Completion(text=answer, fragment=3))
    harness = openai_harness(openai_server)

    async def scenario() -> tuple[Any, list[Signal], list[Event]]:
        other = await harness.create_thread()
        thread = await harness.create_thread()
        seen: list[Signal] = []

        async def follow() -> None:
            async for item in thread.signals():
                seen.append(item)
                if item.kind == "done":
                    return

        follower = asyncio.create_task(follow())
        await asyncio.sleep(0)  # the follower subscribes
        await other.send("first")  # another thread's signals are not this thread's
        assert (await other.wait()).status == "idle"
        await thread.send("second")
        state = await thread.wait()
        await asyncio.wait_for(follower, 5)
        return state, seen, await thread.events()

    state, seen, events = run(scenario())
    assert state.last_reply == answer
    deltas = [s for s in seen if s.kind == "text_delta"]
    assert len(deltas) > 5 and "".join(s.data["text"] for s in deltas) == answer
    assert {s.thread_id for s in seen} == {state.thread_id}
    [completed] = of_type(events, "model.completed")
    assert {s.effect_id for s in seen} == {completed.data["effect_id"]}
    assert seen[-1].kind == "done" and seen[-1].data == {"ok": True, "stop_reason": "stop"}
    # Only the final response is recorded: no event per delta, no partial text anywhere.
    assert completed.data["result"]["text"] == answer
    assert [e.type for e in events] == ["thread.created", "turn.started", "model.requested", "model.dispatched",
                                        "model.completed", "turn.ended"]


# --- a SIGKILL in the middle of a streamed model call -------------------------------------------------------

OWNER = "stream-crash-worker"
PARTIAL = "PARTIAL-ATTEMPT " * 12
FINAL = "2 + 3 = 5"


@pytest.fixture(params=["sqlite", "postgres"])
def crash_store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A ledger URL the child and this process share: a SQLite file or a fresh PostgreSQL schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'jixu.db'}"
        return
    schema = PostgresSchema(request.getfixturevalue("postgres_dsn"))
    try:
        yield schema.url
    finally:
        schema.drop()


@pytest.mark.crash
def test_sigkill_during_a_streamed_model_call(openai_server: FakeOpenAI, crash_store_url: str) -> None:
    openai_server.script(
        Completion(calls=[Call("call_add_1", "add", '{"a": 2, "b": 3}')]),
        Completion(text=PARTIAL, fragment=4, event_delay=0.05),  # cut after three deltas
        Completion(text=FINAL, fragment=2),
    )
    command = [sys.executable, "-m", "tests.providers.stream_crash_child", crash_store_url, openai_server.url,
               OWNER, "3"]
    proc = subprocess.run(command, env=python_env(), cwd=ROOT, capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == -signal.SIGKILL, f"child exited {proc.returncode}: {proc.stderr[-3000:]}"
    lines = [line.split(" ", 3) for line in proc.stdout.splitlines()]
    [thread_id] = [fields[1] for fields in lines if fields[0] == "T"]
    deltas = [fields for fields in lines if fields[0] == "D"]
    assert len(deltas) == 3 and "".join(json.loads(d[3]) for d in deltas) == PARTIAL[:12]
    [cut_effect] = {d[1] for d in deltas}
    assert {d[2] for d in deltas} == {"1"}
    assert len(openai_server.requests) == 2, "the child died inside the second call"

    async def recover() -> tuple[State, list[Event]]:
        harness = Harness(stream_agent(child_driver(openai_server.url)), store=crash_store_url, owner=OWNER)
        try:
            thread = await harness.open_thread(thread_id)  # a restarted worker reclaims its own turn at once
            state = await asyncio.wait_for(thread.wait(), 20)
            return state, await thread.events()
        finally:
            harness.close()

    state, events = run(recover())
    assert state.status == "idle" and state.last_reply == FINAL
    [claimed] = of_type(events, "turn.claimed")
    assert (claimed.data["reason"], claimed.data["previous_owner"]) == ("reclaimed_by_same_owner", OWNER)
    # Retried under the same effect id (attempt 2); the partial stream was never recorded.
    lifecycle = [(e.type, e.data.get("attempt")) for e in events if e.data.get("effect_id") == cut_effect]
    assert lifecycle == [("model.requested", None), ("model.dispatched", 1), ("model.dispatched", 2),
                         ("model.completed", 2)]
    completed = of_type(events, "model.completed")
    assert len(completed) == 2 and completed[1].data["result"]["text"] == FINAL
    assert completed[1].data["effect_id"] == cut_effect
    assert "PARTIAL" not in json.dumps([e.to_dict() for e in events])
    analysis = RecoveryResolver.analyze(events)
    assert {d.state for d in analysis.decisions.values()} == {"completed"}
    store = open_store(crash_store_url)
    try:
        assert store.verify(f"thread/{thread_id}").valid
    finally:
        store.close()
    # The conversation the provider got is valid, every tool call answered exactly once, and the retry sent
    # exactly the prompt of the interrupted attempt.
    bodies = openai_server.bodies
    assert len(bodies) == 3 and bodies[2] == bodies[1]
    sent = bodies[2]["messages"]
    assert_valid_openai(sent)
    calls = [c["id"] for m in sent if m["role"] == "assistant" for c in m.get("tool_calls", [])]
    answers = [m["tool_call_id"] for m in sent if m["role"] == "tool"]
    assert calls == answers == ["call_add_1"]
    assert sent[1] == {"role": "user", "content": QUESTION}
    assert sent[-1] == {"role": "tool", "tool_call_id": "call_add_1", "content": "5"}


# --- compaction through the real SDKs -----------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_compaction_request_is_valid_for_the_provider_and_the_next_call_sees_the_summary(
        openai_server: FakeOpenAI, anthropic_server: FakeAnthropic, provider: str) -> None:
    from tests.providers.test_mapping import assert_valid_anthropic

    server: FakeOpenAI | FakeAnthropic = openai_server if provider == "openai" else anthropic_server
    model = (OpenAIModel("gpt-4o-mini", base_url=openai_server.url, api_key=OPENAI_KEY) if provider == "openai"
             else AnthropicModel("claude-sonnet-4-20250514", base_url=anthropic_server.url, api_key=ANTHROPIC_KEY))
    harness = Harness(Agent("scenario", model, instructions="Use the add tool.", tools=[add], context_budget=100),
                      MemoryStore())
    server.script(Completion(calls=[Call("call_add_1", "add", '{"a": 2, "b": 3}')]),
                  Completion(text="It is 5. " + "Let me explain at length. " * 25),
                  Completion(text="The user asked for 2 + 3; add returned 5."),
                  Completion(text="Still 5."))

    async def scenario() -> tuple[State, list[Event]]:
        thread = await harness.create_thread()
        await thread.send("What is 2 + 3?")
        assert (await thread.wait()).status == "idle"
        await thread.send("Are you sure?")
        return await thread.wait(), await thread.events()

    state, events = run(scenario())
    assert state.status == "idle" and state.last_reply == "Still 5."
    [requested] = of_type(events, "compaction.requested")
    covers = requested.data["args"]["covers"]
    assert len(covers) == 4
    [completed] = of_type(events, "compaction.completed")
    assert completed.data["result"]["summary"] == "The user asked for 2 + 3; add returned 5."
    assert completed.data["result"]["usage"]["input_tokens"] == 12
    bodies = server.bodies
    assert len(bodies) == 4
    summary_body, next_body = bodies[2], bodies[3]
    # The covered history holds a tool call, so the tools are defined (the Messages API refuses tool_use
    # blocks without them); the last message asks for the summary and names exactly the covered events.
    assert summary_body["tools"] == bodies[1]["tools"]
    if provider == "openai":
        assert_valid_openai(summary_body["messages"])
        # system, the question, the call, its result (as sent before), the reply, then the request
        assert summary_body["messages"][:4] == bodies[1]["messages"]
        assert summary_body["messages"][4]["content"].startswith("It is 5.") and len(summary_body["messages"]) == 6
        instruction = summary_body["messages"][-1]["content"]
        first_user = next_body["messages"][1]["content"]
        assert next_body["messages"][2] == {"role": "user", "content": "Are you sure?"}
    else:
        assert_valid_anthropic(summary_body["messages"])
        assert_valid_anthropic(next_body["messages"])
        instruction = summary_body["messages"][-1]["content"][-1]["text"]
        first_user = next_body["messages"][0]["content"][0]["text"]
        assert len(next_body["messages"]) == 1, "the summary and the new input merge into one user message"
    assert "Summarize the conversation above" in instruction
    assert [c for c in covers if c in instruction] == covers
    assert first_user.startswith("Summary of the earlier conversation (events " + ", ".join(covers))
    assert first_user.endswith("The user asked for 2 + 3; add returned 5.")
    assert "call_add_1" not in json.dumps(next_body["messages"]), "the old tool call is summarized away"


# --- an answer cut off at its limit -----------------------------------------------------------------------

PURGED: list[str] = []


@tool(semantics="unsafe")
def purge(scope: str = "everything") -> str:
    """Delete the records in ``scope`` (unsafe; its default is the widest scope)."""
    PURGED.append(scope)
    return f"purged {scope}"


@pytest.mark.parametrize("provider", ["openai", "responses", "anthropic"])
@pytest.mark.parametrize("why", ["limit", "other"])
def test_tool_calls_of_an_answer_cut_off_at_its_token_limit_are_never_run(
        provider: str, why: str, openai_server: FakeOpenAI, responses_server: FakeResponses,
        anthropic_server: FakeAnthropic) -> None:
    """A provider stops writing at the output token limit (``length``, ``max_output_tokens``, ``max_tokens``),
    or for another reason than a finished answer (``other``: DeepSeek's ``insufficient_system_resource``, an
    incomplete Responses answer whose ``incomplete_details`` is null, Anthropic's streaming ``refusal``): a tool
    call in that answer may have lost its arguments (the tool's defaults would then be used) or stand beside
    calls the model never finished. None of them is run; the turn fails saying why, the answer and its usage
    are recorded, and the conversation stays valid for the next input. (``other`` once ran the calls: only the
    limits were known as cut-offs.)"""
    server: FakeOpenAI | FakeResponses | FakeAnthropic
    if provider == "openai":
        server, stop = openai_server, {"limit": "length", "other": "insufficient_system_resource"}[why]
        model: Any = OpenAIModel("gpt-4o-mini", base_url=openai_server.url, api_key=OPENAI_KEY)
    elif provider == "responses":
        server, stop = responses_server, {"limit": "max_output_tokens", "other": "incomplete"}[why]
        model = OpenAIModel("gpt-4o-mini", base_url=responses_server.url, api_key=OPENAI_KEY, api="responses")
    else:
        server, stop = anthropic_server, {"limit": "max_tokens", "other": "refusal"}[why]
        model = AnthropicModel("claude-sonnet-4-20250514", base_url=anthropic_server.url, api_key=ANTHROPIC_KEY)
    cut = Completion(calls=[Call("call_1", "purge", '{"scope": "old"}'), Call("call_2", "purge", "")], stop=stop)
    server.script(cut, Completion(text="Nothing was purged."))
    PURGED.clear()
    harness = Harness(Agent("cut", model, tools=[purge]), MemoryStore(), retry_backoff=0.01)

    async def scenario() -> None:
        thread, state, events = await ask(harness, "tidy up")
        assert PURGED == [] and of_type(events, "tool.requested") == []
        assert state.status == "failed" and "none was run" in state.reason, state.reason
        assert ("output token limit" in state.reason) == (why == "limit"), state.reason
        [completed] = of_type(events, "model.completed")
        assert completed.data["result"]["stop_reason"] == stop and completed.data["result"]["usage"]["output_tokens"]
        [ended] = of_type(events, "turn.ended")
        assert ended.data["outcome"] == "failed" and ended.data["error"]["type"] == "output_truncated"
        await thread.send("what happened?")
        state = await asyncio.wait_for(thread.wait(), 20)
        assert state.status == "idle" and state.last_reply == "Nothing was purged." and PURGED == []

    run(scenario())


# --- an error event inside a 200 stream -------------------------------------------------------------------


@pytest.mark.parametrize(("provider", "body", "outcome"), [
    ("openai", {"message": "You exceeded your current quota", "type": "insufficient_quota",
                "code": "insufficient_quota"}, ("paused", "quota", 1)),
    ("responses", {"event": "response.failed", "code": "invalid_prompt", "message": "Invalid prompt"},
     ("failed", "invalid_request", 1)),
    ("anthropic", {"type": "error", "error": {"type": "invalid_request_error",
                                               "message": "prompt is too long: 210000 tokens > 200000 maximum"}},
     ("failed", "invalid_request", 1)),
    ("anthropic", {"type": "error", "error": {"type": "rate_limit_error", "message": "rate limited"}},
     ("paused", "rate_limit", 4)),
    ("openai", {"message": "The server had an error", "type": "server_error", "code": None}, ("paused", "transient", 4)),
])
def test_an_error_event_inside_a_stream_is_classified_by_its_type_as_its_http_status_would_be(
        provider: str, body: Any, outcome: tuple[str, str, int], openai_server: FakeOpenAI,
        responses_server: FakeResponses, anthropic_server: FakeAnthropic) -> None:
    """A provider may answer 200 and send its error as an event (Anthropic's ``error``, OpenAI's ``error`` and
    ``response.failed``): a quota error pauses for an operator, an invalid request fails the turn and a rate
    limit waits, as the same error sent as an HTTP status does; only a server error is retried as transient."""
    status, kind, requests = outcome
    server: FakeOpenAI | FakeResponses | FakeAnthropic
    if provider == "openai":
        server, model = openai_server, OpenAIModel("gpt-4o-mini", base_url=openai_server.url, api_key=OPENAI_KEY)
    elif provider == "responses":
        server, model = responses_server, OpenAIModel("gpt-4o-mini", base_url=responses_server.url,
                                                      api_key=OPENAI_KEY, api="responses")
    else:
        server, model = anthropic_server, AnthropicModel("claude-sonnet-4-20250514", base_url=anthropic_server.url,
                                                         api_key=ANTHROPIC_KEY)
    server.script(*[Completion(text="An error arrives mid-way", error_after=2, error_body=body)] * 4)
    harness = Harness(Agent("stream-error", model, tools=[add]), MemoryStore(), retry_backoff=0.01)
    _thread, state, events = run(ask(harness))
    assert state.status == status and kind in state.reason, state.reason
    assert [f.data["error"]["kind"] for f in of_type(events, "model.failed")] == [kind] * requests
    assert len(server.requests) == requests
