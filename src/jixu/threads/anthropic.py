"""A model driver for the Anthropic Messages API.

Uses the official ``anthropic`` SDK (``pip install 'jixu[anthropic]'``),
imported only when a driver is constructed::

    model = AnthropicModel("claude-sonnet-4-20250514")   # ANTHROPIC_API_KEY

The API key comes from ``api_key=`` or ``ANTHROPIC_API_KEY`` and the endpoint
from ``base_url=`` or ``ANTHROPIC_BASE_URL``; the key is never written into an
event, a result or an error message. The SDK's own retries are off: jixu
records every attempt and decides retries itself.

The conversation is mapped so the API always accepts it: the instructions go
into ``system``; each assistant tool call becomes a ``tool_use`` block and its
result a ``tool_result`` block (``is_error`` for failed, denied, interrupted,
``not_occurred``, ``abandoned_unknown`` and ``not_inherited`` calls) in the
next user message; parallel calls are several blocks of one message; roles
alternate (consecutive messages of one role are merged), starting with ``user``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, cast

from jixu.errors import InvalidInput, ModelError
from jixu.ledger.encoding import JSONObject
from jixu.threads.model import ModelRequest, ModelResponse, ToolCall, Usage
from jixu.threads.pricing import PriceTable
from jixu.threads.streaming import (
    INVALID_JSON_KEY,
    Emit,
    ProviderDriver,
    SignalCallback,
    check_number,
    close_quietly,
    is_error_status,
    parse_arguments,
    reasoning_items,
    reasoning_record,
    resolve_setting,
    well_formed,
)

if TYPE_CHECKING:
    from anthropic import AsyncAnthropic

EXTRA_HINT = "pip install 'jixu[anthropic]'"
PLACEHOLDER_KEY = "not-needed"
EMPTY_TEXT = "(empty)"
"""Stands in for an empty text: the API refuses empty text blocks."""
CONTINUED = "(continuing the conversation)"
"""Opens a conversation whose first message is not the user's (the API requires a user message first)."""
REASONING_FORMAT = "anthropic"
"""The format of the reasoning records this driver writes and sends back: Messages API thinking blocks."""
THINKING_BLOCKS = frozenset({"thinking", "redacted_thinking"})
MIN_THINKING_BUDGET = 1024
CACHE_CONTROL: JSONObject = {"type": "ephemeral"}
"""A prompt-cache breakpoint (the default 5-minute cache)."""


def tool_specs(tools: tuple[JSONObject, ...] | list[JSONObject]) -> list[JSONObject]:
    """jixu tool specs (``Tool.spec()``) as Messages API ``tools``."""
    mapped: list[JSONObject] = []
    for spec in tools:
        item: JSONObject = {"name": spec["name"],
                            "input_schema": spec.get("parameters") or {"type": "object", "properties": {}}}
        if spec.get("description"):
            item["description"] = spec["description"]
        mapped.append(item)
    return mapped


def anthropic_messages(messages: tuple[JSONObject, ...] | list[JSONObject]) -> list[JSONObject]:
    """The neutral conversation as Messages API ``messages`` (alternating roles, user first).

    An assistant message's thinking (a reasoning record of format
    ``anthropic``) goes back verbatim, first in its message, as the API
    requires with extended thinking; records of other formats are left out.
    """
    turns: list[JSONObject] = []

    def add(role: str, blocks: list[JSONObject], first: list[JSONObject] | None = None) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
            if first:  # thinking opens its message, even one merged with an earlier one
                turns[-1]["content"][0:0] = first
        else:
            turns.append({"role": role, "content": [*(first or []), *blocks]})

    for message in well_formed(messages):
        role = message["role"]
        if role == "user":
            add("user", [{"type": "text", "text": message["content"] or EMPTY_TEXT}])
        elif role == "assistant":
            blocks: list[JSONObject] = []
            thinking = [dict(item) for item in reasoning_items(message, REASONING_FORMAT)
                        if item.get("type") in THINKING_BLOCKS]
            if message["content"]:
                blocks.append({"type": "text", "text": message["content"]})
            for call in message["tool_calls"]:
                blocks.append({"type": "tool_use", "id": call["id"], "name": call["name"],
                               "input": call["args"]})
            add("assistant", blocks or ([] if thinking else [{"type": "text", "text": EMPTY_TEXT}]), thinking)
        else:
            block: JSONObject = {"type": "tool_result", "tool_use_id": message["tool_call_id"],
                                 "content": message["content"] or EMPTY_TEXT}
            if is_error_status(message["status"]):
                block["is_error"] = True
            add("user", [block])
    if turns and turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": CONTINUED}]})
    return turns


def _thinking_config(value: int | str | Mapping[str, Any] | None, max_tokens: int) -> JSONObject | None:
    """The API's ``thinking`` object for the ``thinking=`` option (raises :class:`InvalidInput`)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise InvalidInput("thinking takes a token budget (e.g. 2048), 'adaptive' or the API's thinking object, "
                           f"not {value!r}", field="thinking")
    if isinstance(value, int):
        if not MIN_THINKING_BUDGET <= value < max_tokens:
            raise InvalidInput(f"a thinking budget must be at least {MIN_THINKING_BUDGET} tokens and below "
                               f"max_tokens ({max_tokens}), got {value}", field="thinking")
        return {"type": "enabled", "budget_tokens": value}
    if value == "adaptive":
        return {"type": "adaptive"}
    if isinstance(value, Mapping) and isinstance(value.get("type"), str):
        return dict(value)
    raise InvalidInput("thinking takes a token budget (e.g. 2048), 'adaptive' or the API's thinking object "
                       f"(a mapping with 'type'), not {value!r}", field="thinking")


def _verbatim(block: object) -> JSONObject:
    """A content block exactly as the API sent it (the fields it sent, none added)."""
    to_dict = getattr(block, "to_dict", None)
    if callable(to_dict):
        value = to_dict(mode="json")
        if isinstance(value, dict):
            return value
    dump = getattr(block, "model_dump", None)
    if callable(dump):
        value = dump(mode="json", exclude_unset=True)
        if isinstance(value, dict):
            return value
    return {"type": str(getattr(block, "type", ""))}


def _input_args(value: object) -> JSONObject:
    if isinstance(value, dict):
        return value
    return {INVALID_JSON_KEY: json.dumps(value, ensure_ascii=False)}


class AnthropicModel(ProviderDriver):
    """A :class:`~jixu.threads.model.ModelDriver` over the Messages API (``anthropic`` SDK).

    ``model`` is the provider's model name. ``api_key``/``base_url`` default to
    ``ANTHROPIC_API_KEY``/``ANTHROPIC_BASE_URL``. ``client`` is an
    ``anthropic.AsyncAnthropic`` to use instead (its retries are turned off).
    ``timeout`` bounds the connection and each read, in seconds.
    ``max_tokens`` (required by the API) defaults to 1024; ``temperature`` is
    sent only when given. ``prices`` (by exact
    model name) win over the genai-prices catalogue (when installed:
    ``jixu[prices]``) and the fallback :data:`~jixu.threads.pricing.DEFAULT_PRICES`;
    a model none knows has ``cost=None``. With ``stream`` (the default) the response is streamed and
    its progress published as :class:`~jixu.threads.streaming.Signal` s; only the
    assembled response is returned. ``name`` defaults to ``anthropic:<model>``.

    ``cache`` (on by default) asks the API to cache the stable prefix of every
    request: breakpoints (``cache_control``) on the last tool definition, the
    system prompt and the last block of the conversation, so the next call of
    a thread reads the tools, instructions and conversation so far from the
    cache (a prompt shorter than the model's minimum is simply not cached).
    Cache reads and writes come back in :class:`~jixu.threads.model.Usage`
    and are priced at their own rates.

    ``thinking`` turns on extended thinking: a budget in tokens (``thinking=2048``:
    ``{"type": "enabled", "budget_tokens": 2048}``, at least 1024 and below
    ``max_tokens``), ``"adaptive"`` (the model decides) or the API's own
    ``thinking`` object. Thinking blocks, their signatures and redacted
    thinking are recorded in the receipt (see :mod:`jixu.threads.model`) and
    sent back verbatim with the tool calls they led to; thinking is streamed
    as ``reasoning_delta`` signals.

    Usage: ``input_tokens`` counts every prompt token (uncached, read from the
    cache and written to it), ``cached_tokens`` those read from the cache,
    ``cache_write_tokens`` those written to it.
    """

    provider = "anthropic"

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 client: AsyncAnthropic | None = None, timeout: float = 60.0, max_tokens: int = 1024,
                 temperature: float | None = None, prices: PriceTable | None = None, stream: bool = True,
                 name: str | None = None, on_signal: SignalCallback | None = None,
                 thinking: int | str | Mapping[str, Any] | None = None, cache: bool = True) -> None:
        try:
            import anthropic
        except ImportError as error:
            raise InvalidInput(f"AnthropicModel needs the anthropic package, which is not installed: "
                               f"{EXTRA_HINT}", extra="anthropic") from error
        check_number(timeout, "timeout", allow_none=False)
        check_number(max_tokens, "max_tokens", integer=True, allow_none=False)
        check_number(temperature, "temperature", minimum=0.0, exclusive=False)
        self.thinking = _thinking_config(thinking, max_tokens)
        if not isinstance(cache, bool):
            raise InvalidInput("cache must be True or False", field="cache")
        self.cache = cache
        key = resolve_setting(api_key, os.environ, "ANTHROPIC_API_KEY")
        url = resolve_setting(base_url, os.environ, "ANTHROPIC_BASE_URL")
        super().__init__(model, api_key=key, prices=prices, stream=stream, name=name, on_signal=on_signal)
        if client is not None:
            if not isinstance(client, anthropic.AsyncAnthropic):
                raise InvalidInput("client must be an anthropic.AsyncAnthropic", field="client")
            self._client = client.with_options(max_retries=0, timeout=timeout)
        else:
            if key is None and url is None:
                raise InvalidInput("AnthropicModel needs an API key: pass api_key=... or set ANTHROPIC_API_KEY",
                                   field="api_key")
            self._client = anthropic.AsyncAnthropic(api_key=key or PLACEHOLDER_KEY, base_url=url,
                                                    timeout=timeout, max_retries=0)
        self.base_url = str(self._client.base_url)
        self.timeout = float(timeout)
        self.max_tokens = max_tokens
        self.temperature = temperature

    async def aclose(self) -> None:
        """Close the HTTP client (its connections)."""
        await self._client.close()

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The Messages API parameters for ``request`` (without ``stream``)."""
        messages = anthropic_messages(request.messages)
        params: dict[str, Any] = {"model": self.model, "max_tokens": self.max_tokens, "messages": messages}
        if request.instructions:
            params["system"] = request.instructions
        if request.tools:
            params["tools"] = tool_specs(request.tools)
        if self.cache:
            # Three of the four breakpoints the API allows: tools, then instructions, then the conversation
            # so far (what the next call of the thread starts with); each caches everything before it.
            if request.tools:
                params["tools"][-1]["cache_control"] = dict(CACHE_CONTROL)
            if request.instructions:
                params["system"] = [{"type": "text", "text": request.instructions,
                                     "cache_control": dict(CACHE_CONTROL)}]
            cacheable = [b for b in messages[-1]["content"] if b.get("type") not in THINKING_BLOCKS] \
                if messages else []
            if cacheable:  # thinking blocks cannot carry a breakpoint
                cacheable[-1]["cache_control"] = dict(CACHE_CONTROL)
        extra: dict[str, Any] = {}  # not typed parameters in every SDK version
        if self.temperature is not None:
            extra["temperature"] = self.temperature
        if self.thinking is not None:
            extra["thinking"] = dict(self.thinking)
        if extra:
            params["extra_body"] = extra
        return params

    async def _whole(self, request: ModelRequest) -> ModelResponse:
        message: Any = await self._client.messages.create(**self.request_body(request))
        if isinstance(message, (str, bytes)) or not hasattr(message, "content"):
            # The SDK hands over a body it could not read as a message (an HTML page, say) as it is.
            raise self._unreadable("the response is not a Messages API message")
        text: list[str] = []
        calls: list[ToolCall] = []
        thinking: list[JSONObject] = []
        for block in message.content or []:
            kind = getattr(block, "type", None)
            if kind == "text":
                text.append(str(block.text or ""))
            elif kind == "tool_use":
                calls.append(ToolCall(name=str(block.name or ""), args=_input_args(block.input),
                                      id=block.id or None))
            elif kind in THINKING_BLOCKS:
                thinking.append(_verbatim(block))
        model = str(message.model or self.model)
        return ModelResponse(text="".join(text) or None, tool_calls=tuple(calls),
                             usage=self._usage_of(message.usage, model), model=model,
                             stop_reason=str(message.stop_reason or ""),
                             reasoning=reasoning_record(REASONING_FORMAT, model, thinking))

    async def _streamed(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        stream: Any = await self._client.messages.create(**self.request_body(request), stream=True)
        text: list[str] = []
        blocks: dict[int, dict[str, Any]] = {}
        usage: dict[str, int] = {}
        model = ""
        stop_reason = ""
        finished = False
        try:
            async for event in stream:
                kind = getattr(event, "type", None)
                if kind == "message_start":
                    message = event.message
                    model = str(getattr(message, "model", "") or "")
                    _merge_usage(usage, getattr(message, "usage", None))
                elif kind == "content_block_start":
                    block = event.content_block
                    block_type = getattr(block, "type", None)
                    if block_type == "text":
                        blocks[event.index] = {"type": "text"}
                        if getattr(block, "text", ""):
                            text.append(block.text)
                            emit("text_delta", {"text": block.text})
                    elif block_type == "thinking":
                        blocks[event.index] = {"type": "thinking", "parts": [str(getattr(block, "thinking", "")
                                                                                 or "")],
                                               "signature": str(getattr(block, "signature", "") or "")}
                    elif block_type == "redacted_thinking":
                        blocks[event.index] = {"type": "redacted_thinking", "block": _verbatim(block)}
                    elif block_type == "tool_use":
                        initial = getattr(block, "input", None)
                        # Signals number tool calls as the response lists them (0, 1, ...), not content blocks.
                        position = sum(1 for b in blocks.values() if b["type"] == "tool_use")
                        blocks[event.index] = {"type": "tool_use", "id": block.id, "name": block.name,
                                               "parts": [], "initial": initial, "position": position}
                        emit("tool_call_delta", {"index": position, "id": block.id, "name": block.name,
                                                 "arguments": ""})
                elif kind == "content_block_delta":
                    delta = event.delta
                    delta_type = getattr(delta, "type", None)
                    if delta_type == "text_delta" and delta.text:
                        text.append(delta.text)
                        emit("text_delta", {"text": delta.text})
                    elif delta_type == "thinking_delta" and blocks.get(event.index, {}).get("type") == "thinking":
                        piece = str(getattr(delta, "thinking", "") or "")
                        blocks[event.index]["parts"].append(piece)
                        if piece:
                            emit("reasoning_delta", {"text": piece})
                    elif delta_type == "signature_delta" and blocks.get(event.index, {}).get("type") == "thinking":
                        blocks[event.index]["signature"] = str(getattr(delta, "signature", "") or "")
                    elif delta_type == "input_json_delta" and event.index in blocks:
                        slot = blocks[event.index]
                        slot["parts"].append(delta.partial_json or "")
                        emit("tool_call_delta", {"index": slot["position"], "id": slot["id"],
                                                 "name": slot["name"], "arguments": delta.partial_json or ""})
                elif kind == "message_delta":
                    stop_reason = str(getattr(event.delta, "stop_reason", None) or stop_reason)
                    _merge_usage(usage, getattr(event, "usage", None))
                elif kind == "message_stop":
                    finished = True
        finally:
            await close_quietly(stream)
        if not finished:
            raise self._incomplete("no message_stop event was received")
        calls = []
        thinking: list[JSONObject] = []
        for _index, slot in sorted(blocks.items()):
            if slot["type"] == "thinking":
                thinking.append({"type": "thinking", "thinking": "".join(slot["parts"]),
                                 "signature": slot["signature"]})
            elif slot["type"] == "redacted_thinking":
                thinking.append(slot["block"])
            if slot["type"] != "tool_use":
                continue
            raw = "".join(slot["parts"])
            args = parse_arguments(raw) if raw.strip() else _input_args(slot["initial"] or {})
            calls.append(ToolCall(name=str(slot["name"] or ""), args=args, id=slot["id"] or None))
        model = model or self.model
        return ModelResponse(text="".join(text) or None, tool_calls=tuple(calls),
                             usage=self._usage_from(usage, model), model=model, stop_reason=stop_reason,
                             reasoning=reasoning_record(REASONING_FORMAT, model, thinking))

    def _usage_of(self, usage: object, model: str) -> Usage:
        counts: dict[str, int] = {}
        _merge_usage(counts, usage)
        return self._usage_from(counts, model)

    def _usage_from(self, counts: Mapping[str, int], model: str) -> Usage:
        if "input_tokens" not in counts and "output_tokens" not in counts:
            return Usage()  # nothing reported: tokens 0, cost unknown
        read = counts.get("cache_read_input_tokens", 0)
        written = counts.get("cache_creation_input_tokens", 0)
        return self._usage(model=model, input_tokens=counts.get("input_tokens", 0) + read + written,
                           output_tokens=counts.get("output_tokens", 0), cached_tokens=read,
                           cache_write_tokens=written)

    def _translate(self, error: Exception) -> ModelError:
        """Any failure of a call as a :class:`ModelError`."""
        import anthropic

        if isinstance(error, ModelError):
            return error
        if isinstance(error, anthropic.APIStatusError):
            headers = cast("Mapping[str, str]", error.response.headers)
            return self._status_error(error.status_code, headers, error.body, error.message,
                                      getattr(error, "request_id", None))
        if isinstance(error, anthropic.APITimeoutError):
            return self._connection_error(error, timeout=True)
        if isinstance(error, anthropic.APIConnectionError):
            return self._connection_error(error, timeout=False)
        if isinstance(error, anthropic.APIResponseValidationError):
            return self._unreadable(f"the response did not match the API's schema: {error.message}")
        if isinstance(error, anthropic.APIError):
            return self._status_error(200, None, error.body, error.message, None)
        return self._unexpected(error)


_USAGE_KEYS = ("input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def _merge_usage(counts: dict[str, int], usage: object) -> None:
    """Fold a usage object into ``counts``; later reports (``message_delta``) are cumulative and win."""
    if usage is None:
        return
    for key in _USAGE_KEYS:
        value = getattr(usage, key, None)
        if isinstance(value, int) and not isinstance(value, bool):
            counts[key] = value


__all__ = ["AnthropicModel", "anthropic_messages", "tool_specs"]
