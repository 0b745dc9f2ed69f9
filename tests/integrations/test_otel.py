"""OpenTelemetry traces (issue 26): the span tree and attributes of one turn with a tool call, of a crash and
its recovery in another process, content capture off by default, and a failing observer that changes nothing.

Spans are read back from the OpenTelemetry SDK's in-memory exporter.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from jixu.kernel import tracing
from jixu.kernel.effects import Outcome
from jixu.ledger import SQLiteStore
from jixu.threads import Agent, Harness, ModelResponse, ScriptedModel, ToolCall, tool
from jixu.threads.model import Usage
from tests.helpers import python_env

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    from jixu.integrations.otel import instrument, uninstrument

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrument(provider, capture_content=False)
    try:
        yield memory
    finally:
        uninstrument()
        provider.shutdown()


@tool(semantics="unsafe")
def charge(order: int, cents: int) -> str:
    """Charge an order."""
    return f"charged {cents} for order {order}"


def _agent() -> Agent:
    return Agent("biller", ScriptedModel([
        ModelResponse(tool_calls=(ToolCall("charge", {"order": 7, "cents": 1250}),),
                      usage=Usage(input_tokens=120, output_tokens=15), model="gpt-4o-2024-08-06",
                      stop_reason="tool_calls"),
        ModelResponse(text="Charged.", usage=Usage(input_tokens=160, output_tokens=4), model="gpt-4o-2024-08-06",
                      stop_reason="stop"),
    ], name="openai:gpt-4o"), tools=[charge])


def _by_name(spans: tuple[ReadableSpan, ...] | list[ReadableSpan], prefix: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name.startswith(prefix)]


def test_one_turn_with_a_tool_call_is_a_tree_of_genai_spans(tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    async def scenario() -> str:
        with SQLiteStore(tmp_path / "t.db") as store:
            thread = await Harness(_agent(), store).create_thread()
            await thread.send("charge order 7")
            state = await thread.wait()
            assert state.status == "idle" and state.last_reply == "Charged."
            return thread.thread_id

    thread_id = asyncio.run(scenario())
    spans = exporter.get_finished_spans()
    [turn] = _by_name(spans, "invoke_agent ")
    chats = _by_name(spans, "chat ")
    [call] = _by_name(spans, "execute_tool ")
    assert turn.name == "invoke_agent biller" and len(chats) == 2
    assert turn.attributes is not None and turn.attributes["gen_ai.conversation.id"] == thread_id
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    for child in (*chats, call):
        assert child.parent is not None and child.parent.span_id == turn.context.span_id, child.name
        assert child.context.trace_id == turn.context.trace_id
        assert child.attributes is not None and child.attributes["jixu.thread.id"] == thread_id
        assert child.attributes["jixu.effect.state"] == "completed" and child.attributes["jixu.effect.attempt"] == 1
        assert child.status.status_code is not StatusCode.ERROR
    first = chats[0].attributes
    assert first is not None and chats[0].kind is SpanKind.CLIENT and chats[0].name == "chat gpt-4o"
    assert first["gen_ai.operation.name"] == "chat" and first["gen_ai.provider.name"] == "openai"
    assert first["gen_ai.request.model"] == "gpt-4o" and first["gen_ai.response.model"] == "gpt-4o-2024-08-06"
    assert first["gen_ai.usage.input_tokens"] == 120 and first["gen_ai.usage.output_tokens"] == 15
    assert tuple(first["gen_ai.response.finish_reasons"]) == ("tool_calls",)  # type: ignore[arg-type]
    tool_attributes = call.attributes
    assert tool_attributes is not None and call.name == "execute_tool charge"
    assert tool_attributes["gen_ai.tool.name"] == "charge" and tool_attributes["gen_ai.tool.call.id"]
    assert tool_attributes["jixu.tool.semantics"] == "unsafe"
    # the model's answer comes before the tool call, the tool call before the second model call
    assert chats[0].end_time <= call.start_time and call.end_time <= chats[1].start_time  # type: ignore[operator]
    # no content unless asked for
    for span in spans:
        assert not any(key in (span.attributes or {}) for key in
                       ("gen_ai.tool.call.arguments", "gen_ai.tool.call.result", "gen_ai.output.messages"))


def test_content_is_captured_only_when_asked_for(tmp_path: Path) -> None:
    from jixu.integrations.otel import instrument, uninstrument

    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    instrument(provider, capture_content=True)
    try:
        async def scenario() -> None:
            with SQLiteStore(tmp_path / "t.db") as store:
                thread = await Harness(_agent(), store).create_thread()
                await thread.send("charge order 7")
                await thread.wait()

        asyncio.run(scenario())
    finally:
        uninstrument()
        provider.shutdown()
    [call] = _by_name(memory.get_finished_spans(), "execute_tool ")
    assert call.attributes is not None
    assert '"cents": 1250' in str(call.attributes["gen_ai.tool.call.arguments"])
    assert "charged 1250" in str(call.attributes["gen_ai.tool.call.result"])


CRASHING = r"""
import asyncio, sys
from jixu import Agent, Harness, ScriptedModel, ToolCall, tool

@tool(semantics="unsafe")
async def charge(order: int, cents: int) -> str:
    '''Charge an order (the process dies while it runs).'''
    print("RUNNING", flush=True)
    await asyncio.sleep(3600)
    return "charged"

async def main() -> None:
    harness = Harness(Agent("biller", ScriptedModel([ToolCall("charge", {"order": 7, "cents": 1250}), "Charged."],
                                                    name="openai:gpt-4o"), tools=[charge]), sys.argv[1])
    thread = await harness.create_thread()
    print("THREAD", thread.thread_id, flush=True)
    await thread.send("charge order 7")
    await thread.wait()

asyncio.run(main())
"""


def test_a_crash_and_its_recovery_are_traced_in_the_recovering_process(
        tmp_path: Path, exporter: InMemorySpanExporter) -> None:
    path = tmp_path / "t.db"
    child = subprocess.Popen([sys.executable, "-c", CRASHING, f"sqlite:///{path}"], env=python_env(), text=True,
                             stdout=subprocess.PIPE, cwd=ROOT)
    assert child.stdout is not None
    thread_id = ""
    try:
        for line in child.stdout:
            if line.startswith("THREAD "):
                thread_id = line.split()[1]
            if line.startswith("RUNNING"):
                break
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    assert thread_id

    async def recover() -> Any:
        with SQLiteStore(path) as store:
            thread = await Harness(_agent(), store).open_thread(thread_id)
            [waiting] = thread.state().waiting_on
            await thread.resolve_tool_outcome(waiting["effect_id"], "occurred", result="charged 1250",
                                              note="found in the payment provider")
            state = await thread.wait()
            return waiting["effect_id"], state

    effect_id, state = asyncio.run(recover())
    assert state.status == "idle", state.reason
    spans = exporter.get_finished_spans()
    [recovery] = _by_name(spans, "jixu.recovery")
    [found] = recovery.events
    assert found.attributes is not None and f"{effect_id}:unknown" in tuple(found.attributes["jixu.effects"])  # type: ignore[arg-type]
    [resolution] = _by_name(spans, "jixu.resolution")
    [resolved] = resolution.events
    assert resolved.attributes is not None and resolved.attributes["jixu.effect.id"] == effect_id
    assert resolved.attributes["jixu.resolution"] == "occurred"
    [turn] = _by_name(spans, "invoke_agent ")
    assert not _by_name(spans, "execute_tool "), "the unsafe call was not run again, so it has no span here"
    [chat] = _by_name(spans, "chat ")
    assert chat.parent is not None and chat.parent.span_id == turn.context.span_id


class _Broken(tracing.Tracer):
    """An observer that fails everywhere it can."""

    enabled = True

    def effect(self, kind: str, *, effect_id: str, attempt: int, intent: tracing.Attributes,
               attributes: tracing.Attributes) -> tracing.EffectSpan:
        class Span(tracing.EffectSpan):
            def finish(self, outcome: Outcome | None, state: Any) -> None:
                raise RuntimeError("observer bug at finish")

        if kind == "model":
            raise RuntimeError("observer bug at start")
        return Span()

    def note(self, name: str, attributes: tracing.Attributes) -> None:
        raise RuntimeError("observer bug in a note")


def test_a_failing_observer_changes_nothing(tmp_path: Path) -> None:
    old = tracing.set_tracer(_Broken())
    try:
        async def scenario() -> list[str]:
            with SQLiteStore(tmp_path / "t.db") as store:
                thread = await Harness(_agent(), store).create_thread()
                await thread.send("charge order 7")
                state = await thread.wait()
                assert state.status == "idle" and state.last_reply == "Charged."
                return [event.type for event in await thread.events()]

        types = asyncio.run(scenario())
    finally:
        tracing.set_tracer(old)
    assert types.count("tool.dispatched") == 1 and types.count("tool.completed") == 1
    assert types.count("model.completed") == 2


def test_nothing_is_traced_when_not_instrumented(tmp_path: Path) -> None:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    assert not tracing.tracer().enabled

    async def scenario() -> None:
        with SQLiteStore(tmp_path / "t.db") as store:
            thread = await Harness(_agent(), store).create_thread()
            await thread.send("charge order 7")
            await thread.wait()

    asyncio.run(scenario())
    assert memory.get_finished_spans() == ()


def test_instrument_refuses_a_capture_flag_that_is_not_a_bool() -> None:
    from jixu.errors import InvalidInput
    from jixu.integrations.otel import instrument

    with pytest.raises(InvalidInput, match="capture_content"):
        instrument(capture_content="yes")  # type: ignore[arg-type]
    with pytest.raises(InvalidInput, match="tracer_provider"):
        instrument("x")  # type: ignore[arg-type]
    assert not tracing.tracer().enabled
