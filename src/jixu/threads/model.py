"""Model drivers: the interface a language model sits behind, and the scripted model for tests and demos.

A driver turns a :class:`ModelRequest` (instructions, the conversation in
jixu's neutral message format, tool specs) into a :class:`ModelResponse` (text
and/or tool calls, usage). Drivers do I/O and decide nothing about durability:
the harness records the intent before calling, the dispatch marker right
before, and the receipt after.

Neutral messages are dicts:

- ``{"role": "user", "content": str}``
- ``{"role": "assistant", "content": str | None, "tool_calls": [{"id", "name", "args"}]}``
- ``{"role": "tool", "tool_call_id": str, "name": str, "content": str, "status": str}``
- ``{"role": "user", "content": str, "compacted": True}``: the summary that replaced earlier messages
  after a context compaction (drivers send it as an ordinary user message)

**Reasoning.** A model that thinks before it answers (Anthropic extended
thinking, OpenAI reasoning items, ``reasoning_content`` of compatible servers)
returns its reasoning in :attr:`ModelResponse.reasoning`, a *reasoning
record* ``{"format", "model", "items"}``: ``items`` are the provider's own
blocks, verbatim (signatures, encrypted and redacted content kept opaque),
and ``format`` names the wire format they belong to (``anthropic``,
``openai-responses``, ``openai-chat``). The receipt keeps it with the answer's
first tool call (``tool_calls[0]["reasoning"]``), where the conversation
carries it to the next request, or, for an answer without tool calls, as the
result's ``reasoning``. A driver sends back, verbatim, only records of its own
format (providers require the reasoning that led to a tool call to come back
with it); an assistant message may also carry one as ``"reasoning"``.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeAlias

from jixu.errors import InvalidInput, ModelError
from jixu.ledger.encoding import VALUE_NESTING, JSONObject, canonical_text


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A model's request to call tool ``name`` with ``args``; ``id`` is assigned when omitted."""

    name: str
    args: JSONObject = field(default_factory=dict)
    id: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """``{"id", "name", "args"}``."""
        return {"id": self.id, "name": self.name, "args": self.args}


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens and cost of one model call; ``cost`` stays ``None`` when the price is unknown.

    ``input_tokens`` counts every prompt token: ``cached_tokens`` of them were
    read from the provider's prompt cache and ``cache_write_tokens`` written
    to it. ``output_tokens`` includes ``reasoning_tokens`` (the model's
    thinking, billed as output). ``cost`` counts each at its own price.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    cost: float | None = None
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: every field (``cache_write_tokens`` and ``reasoning_tokens`` when not 0, so
        receipts without them read as they always did)."""
        out: dict[str, Any] = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                               "cached_tokens": self.cached_tokens, "cost": self.cost}
        if self.cache_write_tokens:
            out["cache_write_tokens"] = self.cache_write_tokens
        if self.reasoning_tokens:
            out["reasoning_tokens"] = self.reasoning_tokens
        return out


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """Everything a driver needs for one call, plus the effect identity it runs under."""

    instructions: str
    messages: tuple[JSONObject, ...]
    tools: tuple[JSONObject, ...]
    effect_id: str
    idempotency_key: str
    attempt: int
    thread_id: str
    turn_id: str
    purpose: str = "reply"
    """``reply`` for a turn's model call; ``compaction`` for a summary request (the covered messages plus
    a final user message asking for the summary, which the driver answers with text)."""


FINISHED_STOPS = frozenset({"", "stop", "tool_calls", "function_call", "end_turn", "tool_use", "stop_sequence"})
"""Stop reasons of an answer the model finished, whose tool calls are run: OpenAI Chat Completions and Responses
(as the drivers record them), Anthropic Messages, and ``""`` (a model of the caller's own that gives none)."""

LIMIT_STOPS = frozenset({"length", "max_tokens", "max_output_tokens", "model_length",
                         "model_context_window_exceeded"})
"""Stop reasons of an answer cut off at a token or context limit."""

FILTER_STOPS = frozenset({"content_filter", "refusal"})
"""Stop reasons of an answer the provider stopped (a content filter, Anthropic's streaming refusal)."""


def unfinished_answer(stop_reason: object, calls: int) -> str | None:
    """Why the ``calls`` tool calls of an answer that stopped for ``stop_reason`` must not be run, or None when
    the model finished it (:data:`FINISHED_STOPS`, in any case and without surrounding blanks; a record without a
    stop reason counts as ``""``).

    Any other reason, known or not (a limit, a filter, an interruption such as ``insufficient_system_resource``
    or ``error``, an incomplete Responses answer), may have cut the answer off: a call in it may lack arguments
    or stand beside calls the model never finished writing. Deny by default: a reason jixu does not know is not
    taken for a finished answer.
    """
    reason = stop_reason.strip().lower() if type(stop_reason) is str else None  # "STOP" as Gemini spells it
    if stop_reason is None or reason in FINISHED_STOPS:
        return None
    shown = repr(stop_reason)
    if reason in LIMIT_STOPS:
        return (f"the model's answer was cut off at its limit (stop reason {shown}) with {calls} tool call(s) in "
                "it; none was run, as its arguments may be incomplete. Raise the model's output token limit, or "
                "shorten what it is asked to write")
    if reason in FILTER_STOPS:
        return (f"the provider stopped the model's answer (stop reason {shown}) with {calls} tool call(s) in it; "
                "none was run, as the answer was cut off before its end")
    return (f"the model's answer stopped for {shown}, not a reason that ends a finished answer, with {calls} tool "
            "call(s) in it; none was run, as the answer may have been cut off")


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """What the model answered: final ``text``, or ``tool_calls`` to run first (or both)."""

    text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = field(default_factory=Usage)
    model: str = ""
    stop_reason: str = ""
    reasoning: JSONObject | None = None
    """The model's reasoning record (see the module docs), or None."""
    fallback: JSONObject | None = None
    """Set by :class:`~jixu.threads.fallback.FallbackModel` when a model other than the first answered:
    ``{"answered_by": name, "tried": [{"model": name, "error": {...}}, ...]}``."""

    def to_result(self, effect_id: str) -> JSONObject:
        """The receipt's ``result``: tool calls get stable ids derived from ``effect_id``.

        The reasoning record rides with the first tool call (``tool_calls[0]["reasoning"]``, where the
        conversation keeps it for the next request) or, without tool calls, is the result's ``reasoning``;
        a fallback's record is the result's ``fallback``. Both are absent when None.
        """
        calls = []
        seen: set[str] = set()
        for index, call in enumerate(self.tool_calls):
            call_id = call.id or f"call_{effect_id}_{index}"
            if call_id in seen:  # a repeated id within one answer would make one call's result look like another's
                call_id = f"{call_id}_{index}"
            seen.add(call_id)
            calls.append({"id": call_id, "name": call.name, "args": call.args})
        result: JSONObject = {"text": self.text, "tool_calls": calls, "usage": self.usage.to_dict(),
                              "model": self.model, "stop_reason": self.stop_reason}
        if self.reasoning is not None:
            if calls:
                calls[0]["reasoning"] = self.reasoning
            else:
                result["reasoning"] = self.reasoning
        if self.fallback is not None:
            result["fallback"] = self.fallback
        canonical_text(result, path="model result", max_nesting=VALUE_NESTING)  # refuse non-JSON arguments before recording
        return result


class ModelDriver(Protocol):
    """The interface every model driver implements.

    A driver may also define ``prepare()``, loading what its first call would load; workers call it
    (through :meth:`Agent.prepare <jixu.threads.agent.Agent.prepare>`) before they take turns.
    """

    @property
    def name(self) -> str:
        """A stable name recorded with each call (e.g. ``openai:gpt-4o``)."""
        ...

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Answer ``request``; raise :class:`~jixu.errors.ModelError` on failure."""
        ...


Step: TypeAlias = str | ToolCall | Sequence[ToolCall] | ModelResponse
ScriptFunction: TypeAlias = Callable[[list[JSONObject]], Step | Awaitable[Step]]


class ScriptedModel:
    """A deterministic model for tests and offline demos.

    Given a list, it answers the *n*-th model call of a thread with the *n*-th
    step, where *n* is the number of assistant messages already in the
    conversation, so a reopened or forked thread continues the script exactly
    where its history stands. A step is a ``str`` (final reply), a
    :class:`ToolCall`, a list of them (parallel calls) or a
    :class:`ModelResponse`. Given a function, it calls ``fn(messages)`` for
    each step. Every request is kept in :attr:`calls`.

    A summary request (``purpose == "compaction"``) is answered with
    ``summarize(messages)`` (the covered messages, without the final
    instruction), by default one line per message. A list script counts the
    assistant messages still in the conversation, so after a compaction use a
    function script.

    ``keep_calls=False`` keeps no requests (``calls`` stays empty): for a
    long-running script, such as a benchmark, since each request holds the
    conversation as it was then.
    """

    def __init__(self, script: Sequence[Step] | ScriptFunction, *, name: str = "scripted",
                 summarize: Callable[[list[JSONObject]], str] | None = None, keep_calls: bool = True) -> None:
        if callable(script):
            self._fn: ScriptFunction | None = script
            self._steps: tuple[Step, ...] = ()
        elif isinstance(script, Sequence) and not isinstance(script, str):
            self._fn = None
            self._steps = tuple(script)
            for step in self._steps:
                _check_step(step)
        else:
            raise InvalidInput("ScriptedModel takes a list of steps or a function of the messages")
        if summarize is not None and not callable(summarize):
            raise InvalidInput("summarize must be a function of the messages returning the summary")
        if type(keep_calls) is not bool:
            raise InvalidInput(f"keep_calls must be True or False, got {keep_calls!r}")
        self._name = name
        self._summarize = summarize or _default_summary
        self.calls: list[ModelRequest] = []
        """Every request answered, in order (none with ``keep_calls=False``)."""
        self._keep_calls = keep_calls

    @property
    def name(self) -> str:
        """``scripted`` unless named otherwise."""
        return self._name

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """The next step of the script as a response."""
        if self._keep_calls:
            self.calls.append(request)
        messages = list(request.messages)
        if request.purpose == "compaction":
            return ModelResponse(text=self._summarize(messages[:-1]), model=self._name, stop_reason="end_turn")
        if self._fn is not None:
            step = self._fn(messages)
            if inspect.isawaitable(step):
                step = await step
        else:
            index = sum(1 for m in messages if m.get("role") == "assistant")
            if index >= len(self._steps):
                raise ModelError(
                    f"the script has {len(self._steps)} step(s) and all are used; add more steps",
                    kind="invalid_request",
                    indeterminate=False,
                )
            step = self._steps[index]
        return _as_response(_check_step(step), self._name)


def _default_summary(messages: list[JSONObject]) -> str:
    lines = []
    for message in messages:
        content = message.get("content")
        text = content if isinstance(content, str) else ""
        calls = [str(c.get("name")) for c in message.get("tool_calls") or [] if isinstance(c, dict)]
        if calls:
            text = f"{text} (called {', '.join(calls)})".strip()
        lines.append(f"{message.get('role')}: {text[:200]}")
    return "\n".join(lines)


def _check_step(step: object) -> Step:
    if isinstance(step, str | ToolCall | ModelResponse):
        return step
    if isinstance(step, Sequence) and step and all(isinstance(s, ToolCall) for s in step):
        return list(step)
    raise InvalidInput(f"a script step must be a str, a ToolCall, a list of ToolCalls or a ModelResponse, "
                       f"not {step!r}")


def _as_response(step: Step, model: str) -> ModelResponse:
    if isinstance(step, ModelResponse):
        return step
    if isinstance(step, str):
        return ModelResponse(text=step, model=model, stop_reason="end_turn")
    calls = (step,) if isinstance(step, ToolCall) else tuple(step)
    return ModelResponse(tool_calls=calls, model=model, stop_reason="tool_use")


__all__ = ["ModelDriver", "ModelRequest", "ModelResponse", "ScriptedModel", "ToolCall", "Usage"]
