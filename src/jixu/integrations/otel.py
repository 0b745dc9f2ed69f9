"""OpenTelemetry traces of every turn, model call and tool call (the ``otel`` extra: ``opentelemetry-api``).

::

    from jixu.integrations.otel import instrument
    instrument()                      # spans go to the global TracerProvider you configured

Spans follow the OpenTelemetry GenAI semantic conventions:

- ``invoke_agent {agent}`` for each run of a thread's agent loop in this
  process (one segment of a turn; after a crash the next process's segment is
  another span), with ``gen_ai.conversation.id`` (the thread id);
- ``chat {model}`` (kind CLIENT) for each model call, with
  ``gen_ai.operation.name``, ``gen_ai.provider.name`` (and the older
  ``gen_ai.system``), ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.usage.input_tokens`` / ``output_tokens`` and
  ``gen_ai.response.finish_reasons``;
- ``execute_tool {tool}`` for each tool call, with ``gen_ai.tool.name``,
  ``gen_ai.tool.call.id`` and ``gen_ai.tool.type``;

each carrying ``jixu.thread.id``, ``jixu.turn.id``, ``jixu.effect.id``,
``jixu.effect.attempt`` and ``jixu.effect.state`` (the resolver's state after
the receipt: ``completed``, or ``unknown`` when the outcome is in doubt).
What recovery found on reopening a thread (``jixu.recovery``) and each
outcome resolution (``jixu.resolution``) are span events of the span current
then, or spans of their own when none is.

No prompt, message or tool argument is put in a span unless content capture
is on (``capture_content=True``, or the conventions' environment variable
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT=true``).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from typing import Any

from jixu.errors import InvalidInput, MissingExtra
from jixu.kernel import tracing
from jixu.kernel.effects import Outcome

try:
    from opentelemetry import trace
    from opentelemetry.trace import Span, SpanKind, Status, StatusCode
except ImportError as error:  # without the extra: say what to install
    raise MissingExtra.needed("otel", "jixu.integrations.otel (OpenTelemetry)", error) from error

CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
SCOPE = "jixu"


def _provider_and_model(driver: str) -> tuple[str, str]:
    """``openai:gpt-4o`` -> ``("openai", "gpt-4o")``; a name without a provider is its own model."""
    provider, _, model = driver.partition(":")
    return (provider, model) if model else (driver, driver)


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)


class _EffectSpan(tracing.EffectSpan):
    def __init__(self, span: Span, kind: str, capture: bool) -> None:
        self.span, self.kind, self.capture = span, kind, capture

    def finish(self, outcome: Outcome | None, state: Callable[[], str | None]) -> None:
        span = self.span
        try:
            effect_state = state()
            if effect_state is not None:
                span.set_attribute("jixu.effect.state", effect_state)
            if outcome is None:
                span.set_status(Status(StatusCode.ERROR, "ended without a receipt: its outcome is unknown"))
                return
            body = outcome.body
            if outcome.phase == "failed":
                error = body.get("error") or {}
                kind = str(error.get("type") or error.get("kind") or "error") if isinstance(error, dict) else "error"
                span.set_attribute("error.type", kind)
                span.set_attribute("jixu.effect.indeterminate", bool(body.get("indeterminate")))
                message = error.get("message") if isinstance(error, dict) else None
                span.set_status(Status(StatusCode.ERROR, str(message or kind)))
                return
            result = body.get("result")
            if self.kind == "model" and isinstance(result, dict):
                usage = result.get("usage") or {}
                if isinstance(usage, dict):
                    for key, attribute in (("input_tokens", "gen_ai.usage.input_tokens"),
                                           ("output_tokens", "gen_ai.usage.output_tokens")):
                        if isinstance(usage.get(key), int):
                            span.set_attribute(attribute, usage[key])
                if result.get("model"):
                    span.set_attribute("gen_ai.response.model", str(result["model"]))
                if result.get("stop_reason"):
                    span.set_attribute("gen_ai.response.finish_reasons", [str(result["stop_reason"])])
                if self.capture:
                    span.set_attribute("gen_ai.output.messages", _text(
                        {"text": result.get("text"), "tool_calls": result.get("tool_calls")}))
            elif self.kind == "tool" and self.capture:
                span.set_attribute("gen_ai.tool.call.result", _text(result))
        finally:
            span.end()


class OTelTracer(tracing.Tracer):
    """Turns the kernel's observations into OpenTelemetry spans (see the module's text)."""

    enabled = True

    def __init__(self, tracer_provider: trace.TracerProvider | None = None, *, capture_content: bool | None = None
                 ) -> None:
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        if capture_content is None:
            capture_content = os.environ.get(CAPTURE_ENV, "").strip().lower() in ("1", "true", "yes")
        self.capture_content = capture_content

    @contextlib.contextmanager
    def turn(self, *, agent: str, thread_id: str, turn_id: str | None,
             attributes: tracing.Attributes) -> Iterator[None]:
        with self._tracer.start_as_current_span(
                f"invoke_agent {agent}", kind=SpanKind.INTERNAL, record_exception=True, set_status_on_exception=True,
                attributes={"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": agent,
                            "gen_ai.conversation.id": thread_id, "jixu.thread.id": thread_id,
                            **({"jixu.turn.id": turn_id} if turn_id else {}),
                            **{k: v for k, v in attributes.items() if v is not None}}):
            yield

    def effect(self, kind: str, *, effect_id: str, attempt: int, intent: tracing.Attributes,
               attributes: tracing.Attributes) -> tracing.EffectSpan:
        common: dict[str, Any] = {"jixu.effect.id": effect_id, "jixu.effect.kind": kind, "jixu.effect.attempt": attempt,
                                  **{k: v for k, v in attributes.items() if v is not None and k != "jixu.model"}}
        if kind in ("model", "compaction"):
            provider, model = _provider_and_model(str(intent.get("name") or attributes.get("jixu.model") or ""))
            span = self._tracer.start_span(f"chat {model}", kind=SpanKind.CLIENT, attributes={
                "gen_ai.operation.name": "chat", "gen_ai.provider.name": provider, "gen_ai.system": provider,
                "gen_ai.request.model": model, **common})
        elif kind == "tool":
            name = str(intent.get("name"))
            span = self._tracer.start_span(f"execute_tool {name}", kind=SpanKind.INTERNAL, attributes={
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, "gen_ai.tool.call.id": effect_id,
                "gen_ai.tool.type": "function", "jixu.tool.semantics": str(intent.get("semantics")), **common})
            if self.capture_content:
                span.set_attribute("gen_ai.tool.call.arguments", _text(intent.get("args")))
        else:
            span = self._tracer.start_span(f"jixu.{kind}", kind=SpanKind.INTERNAL, attributes=common)
        return _EffectSpan(span, kind, self.capture_content)

    def note(self, name: str, attributes: tracing.Attributes) -> None:
        values = {k: v for k, v in attributes.items() if v is not None}
        current = trace.get_current_span()
        if current.is_recording():
            current.add_event(name, values)
            return
        with self._tracer.start_as_current_span(name, kind=SpanKind.INTERNAL, attributes=values) as span:
            span.add_event(name, values)


def instrument(tracer_provider: trace.TracerProvider | None = None, *,
               capture_content: bool | None = None) -> OTelTracer:
    """Trace every turn, call, recovery and resolution of this process with OpenTelemetry; the tracer installed.

    ``tracer_provider`` defaults to the global one. ``capture_content`` puts
    model output and tool arguments and results into spans (default: the
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` environment variable).
    """
    if capture_content is not None and not isinstance(capture_content, bool):
        raise InvalidInput("capture_content must be True, False or None", field="capture_content")
    if tracer_provider is not None and not callable(getattr(tracer_provider, "get_tracer", None)):
        raise InvalidInput("tracer_provider must be an OpenTelemetry TracerProvider (or None: the global one)",
                           field="tracer_provider")
    installed = OTelTracer(tracer_provider, capture_content=capture_content)
    tracing.set_tracer(installed)
    return installed


def uninstrument() -> None:
    """Stop tracing (the no-op tracer again)."""
    tracing.set_tracer(None)


__all__ = ["CAPTURE_ENV", "OTelTracer", "instrument", "uninstrument"]
