"""A model driver for the OpenAI Chat Completions and Responses APIs and the servers that speak them.

Covers OpenAI itself and compatible servers (vLLM, Ollama, LM Studio,
OpenRouter, ...) through the official ``openai`` SDK (``pip install
'jixu[openai]'``), imported only when a driver is constructed::

    model = OpenAIModel("gpt-4o-mini")                                   # OPENAI_API_KEY
    local = OpenAIModel("llama3.1", base_url="http://localhost:11434/v1")  # Ollama, no key needed
    gpt5 = OpenAIModel("gpt-5", api="responses", reasoning_effort="low")  # the Responses API, stateless

The API key comes from ``api_key=`` or ``OPENAI_API_KEY`` and the endpoint
from ``base_url=`` or ``OPENAI_BASE_URL``; the key is never written into an
event, a result or an error message. The SDK's own retries are off: jixu
records every attempt and decides retries itself (see
:class:`~jixu.errors.ModelError` ``kind`` and ``indeterminate``).

Chat Completions calls go out over jixu's own ``httpx`` client as the wire
format defines them (a JSON body; an answer object, or an SSE stream of
chunk objects): the SDK's request transformation and its typed object per
streamed chunk cost ~2 ms of CPU per call, which bounds how many model-bound
turns one worker process holds (``bench/fleet.py``). A ``client=`` of your own
(Azure, a proxy, custom headers) is used as given, through the SDK, and its
objects are read as the same wire dicts; the Responses API always goes
through the SDK.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import os
import re
from collections.abc import AsyncGenerator, Mapping
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, cast

import httpx

from jixu.errors import InvalidInput, ModelError
from jixu.ledger.encoding import JSONObject
from jixu.threads.http import ModelClient, model_client, server_sent_data
from jixu.threads.model import ModelRequest, ModelResponse, ToolCall, Usage
from jixu.threads.pricing import PriceTable
from jixu.threads.responses import (
    ENCRYPTED_REASONING,
    parse_output,
    plain,
    response_input,
    response_tools,
    stop_reason,
)
from jixu.threads.streaming import (
    Emit,
    ProviderDriver,
    SignalCallback,
    check_number,
    close_quietly,
    parse_arguments,
    reasoning_items,
    reasoning_record,
    resolve_setting,
    well_formed,
)

if TYPE_CHECKING:
    from openai import AsyncOpenAI

EXTRA_HINT = "pip install 'jixu[openai]'"
REASONING_MODEL = re.compile(r"^(?:[\w.-]+/)?(?:o\d|gpt-5(?![.\d]*-chat)|codex)", re.IGNORECASE)
"""OpenAI's reasoning models (o1, o3, o4-mini, gpt-5, codex-..., also behind a ``vendor/`` prefix; not the
gpt-5 chat models)."""
OFFICIAL_HOST = "api.openai.com"
REASONING_FORMAT = "openai-chat"
"""The format of this driver's reasoning records: ``[{"field", "text"}]``, a compatible server's reasoning text
(``reasoning_content`` from DeepSeek, vLLM, Qwen, Kimi; ``reasoning`` from newer vLLM, OpenRouter)."""
REASONING_FIELDS = ("reasoning_content", "reasoning")
APIS = ("chat", "responses")
TOKEN_PARAMETERS = ("max_tokens", "max_completion_tokens")
DEFAULT_BASE_URL = "https://api.openai.com/v1"
DRAIN_SECONDS = 0.1
"""How long the rest of a streamed body may take once ``[DONE]`` arrived (read so its connection is reused)."""
PLACEHOLDER_KEY = "not-needed"
"""Sent as the key to a custom ``base_url`` when no key is configured (local servers ignore it)."""


def tool_specs(tools: tuple[JSONObject, ...] | list[JSONObject]) -> list[JSONObject]:
    """jixu tool specs (``Tool.spec()``) as Chat Completions ``tools``."""
    mapped: list[JSONObject] = []
    for spec in tools:
        function: JSONObject = {"name": spec["name"],
                                "parameters": spec.get("parameters") or {"type": "object", "properties": {}}}
        if spec.get("description"):
            function["description"] = spec["description"]
        mapped.append({"type": "function", "function": function})
    return mapped


def chat_messages(instructions: str, messages: tuple[JSONObject, ...] | list[JSONObject]) -> list[JSONObject]:
    """The system instructions and the neutral conversation as Chat Completions ``messages``.

    Every assistant tool call is answered by exactly one ``tool`` message right
    after it (see :func:`~jixu.threads.streaming.well_formed`); a tool result's
    status travels in its content, which jixu already words for the model.
    """
    out: list[JSONObject] = []
    if instructions:
        out.append({"role": "system", "content": instructions})
    for message in well_formed(messages):
        role = message["role"]
        if role == "user":
            out.append({"role": "user", "content": message["content"]})
        elif role == "assistant":
            item: JSONObject = {"role": "assistant", "content": message["content"]}
            if message["tool_calls"]:
                item["tool_calls"] = [
                    {"id": call["id"], "type": "function",
                     "function": {"name": call["name"], "arguments": _dumps(call["args"])}}
                    for call in message["tool_calls"]]
                # A compatible server's reasoning goes back, in the field it came in, with the calls it led to
                # (DeepSeek, Kimi and others require it during a tool loop).
                for reasoning in reasoning_items(message, REASONING_FORMAT):
                    field_name, text = reasoning.get("field"), reasoning.get("text")
                    if field_name in REASONING_FIELDS and isinstance(text, str):
                        item[str(field_name)] = text
            elif item["content"] is None:
                item["content"] = ""
            out.append(item)
        else:
            out.append({"role": "tool", "tool_call_id": message["tool_call_id"], "content": message["content"]})
    return out


def merge_name(known: str, piece: str) -> str:
    """A streamed tool call's name after one more chunk carrying ``piece``.

    OpenAI sends the name once, in the call's first chunk. Some compatible
    servers repeat the whole name in every chunk, or send it cumulatively, and
    a few send it in fragments: a repeated or cumulative name replaces what is
    known, anything else continues it.
    """
    if not known or piece.startswith(known):
        return piece
    return known + piece


def _reasoning(model: str, thoughts: Mapping[str, str]) -> JSONObject | None:
    return reasoning_record(REASONING_FORMAT, model,
                            [{"field": name, "text": text} for name, text in thoughts.items() if text])


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def endpoint(base_url: str | None) -> str:
    """The API's base URL (``base_url``, else OpenAI's) ending in ``/``, as the SDK keeps it; an
    :class:`InvalidInput` unless it is an absolute ``http``/``https`` URL."""
    text = base_url or DEFAULT_BASE_URL
    try:
        url = httpx.URL(text)
    except (httpx.InvalidURL, TypeError) as error:
        raise InvalidInput(f"base_url {text!r} is not a URL: {error}", field="base_url") from None
    if url.scheme not in ("http", "https") or not url.host:
        raise InvalidInput(f"base_url must be an http:// or https:// URL, got {text!r}", field="base_url")
    text = str(url)
    return text if text.endswith("/") else text + "/"


def _headers(key: str, env: Mapping[str, str]) -> dict[str, str]:
    """What every request of jixu's own client carries: the key, and the organization and project the
    SDK would send (``OPENAI_ORG_ID``, ``OPENAI_PROJECT_ID``)."""
    from jixu import __version__

    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json",
               "User-Agent": f"jixu/{__version__}"}
    if env.get("OPENAI_ORG_ID"):
        headers["OpenAI-Organization"] = env["OPENAI_ORG_ID"]
    if env.get("OPENAI_PROJECT_ID"):
        headers["OpenAI-Project"] = env["OPENAI_PROJECT_ID"]
    return headers


def _wire(value: object) -> object:
    """An SDK object as the wire dict it was read from (a plain value as it is)."""
    to_dict = getattr(value, "to_dict", None)
    return to_dict() if callable(to_dict) else value


def _object(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text_or_none(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _count(value: object) -> int:
    """A token count from the wire (absent, null or not a number: 0)."""
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value):
        return int(value)
    return 0


class OpenAIModel(ProviderDriver):
    """A :class:`~jixu.threads.model.ModelDriver` over the Chat Completions or Responses API (``openai`` SDK).

    ``api`` is ``"chat"`` (Chat Completions, the default: what compatible
    servers speak) or ``"responses"`` (the Responses API, stateless:
    ``store=False`` unless ``store=True``, the whole conversation sent each
    time; a reasoning model's reasoning items, with their encrypted content,
    are recorded in the receipt and sent back verbatim before the calls they
    led to, see :mod:`jixu.threads.responses`). ``reasoning_summary``
    (``"auto"``, ``"concise"``, ``"detailed"``) asks the Responses API for a
    readable summary of the reasoning, streamed as ``reasoning_delta``
    signals (OpenAI shows it to verified organizations only).

    ``model`` is the provider's model name. ``api_key``/``base_url`` default to
    ``OPENAI_API_KEY``/``OPENAI_BASE_URL``; a custom ``base_url`` without a key
    sends a placeholder (local servers need none). ``client`` is an
    ``openai.AsyncOpenAI`` to use instead (its retries are turned off).
    ``timeout`` bounds the connection and each read, in seconds.
    ``max_tokens`` and ``temperature`` are sent only when given. The token
    limit goes out as ``max_completion_tokens`` to OpenAI's own API and to
    reasoning models (o1, o3, o4-mini, gpt-5, which refuse ``max_tokens``) and
    as ``max_tokens`` to other compatible servers; ``max_tokens_parameter``
    chooses it explicitly. ``reasoning_effort`` (``"minimal"``, ``"low"``,
    ``"medium"``, ``"high"``, ...) is sent to reasoning models when given. ``prices``
    (USD per million tokens, by exact model name) win over the genai-prices
    catalogue (when installed: ``jixu[prices]``) and the fallback
    :data:`~jixu.threads.pricing.DEFAULT_PRICES`; a model none knows has
    ``cost=None``. With ``stream`` (the
    default) the response is streamed and its progress published as
    :class:`~jixu.threads.streaming.Signal` s (``on_signal``, :meth:`subscribe`,
    :meth:`signals`); only the assembled response is returned. ``name`` is what
    threads record (default ``openai:<model>``).
    """

    provider = "openai"

    def __init__(self, model: str, *, api_key: str | None = None, base_url: str | None = None,
                 client: AsyncOpenAI | None = None, timeout: float = 60.0, max_tokens: int | None = None,
                 temperature: float | None = None, prices: PriceTable | None = None, stream: bool = True,
                 name: str | None = None, on_signal: SignalCallback | None = None,
                 max_tokens_parameter: str | None = None, reasoning_effort: str | None = None,
                 api: str = "chat", store: bool = False, reasoning_summary: str | None = None) -> None:
        # jixu's own chat calls never use the SDK: it is only looked for (importing it costs ~0.5 s of a
        # worker's start); a given client and the Responses API need it imported.
        if importlib.util.find_spec("openai") is None:
            raise InvalidInput(f"OpenAIModel needs the openai package, which is not installed: {EXTRA_HINT}",
                               extra="openai")
        check_number(timeout, "timeout", allow_none=False)
        check_number(max_tokens, "max_tokens", integer=True)
        check_number(temperature, "temperature", minimum=0.0, exclusive=False)
        if max_tokens_parameter is not None and max_tokens_parameter not in TOKEN_PARAMETERS:
            raise InvalidInput(f"max_tokens_parameter must be one of {list(TOKEN_PARAMETERS)} or None, got "
                               f"{max_tokens_parameter!r}", field="max_tokens_parameter")
        if reasoning_effort is not None and (not isinstance(reasoning_effort, str) or not reasoning_effort):
            raise InvalidInput("reasoning_effort must be a non-empty string such as 'low' or 'high', or None",
                               field="reasoning_effort")
        if api not in APIS:
            raise InvalidInput(f"api must be one of {list(APIS)}, got {api!r}", field="api")
        if not isinstance(store, bool):
            raise InvalidInput("store must be True or False", field="store")
        if reasoning_summary is not None and (not isinstance(reasoning_summary, str) or not reasoning_summary):
            raise InvalidInput("reasoning_summary must be 'auto', 'concise', 'detailed' or None",
                               field="reasoning_summary")
        key = resolve_setting(api_key, os.environ, "OPENAI_API_KEY")
        url = resolve_setting(base_url, os.environ, "OPENAI_BASE_URL")
        super().__init__(model, api_key=key, prices=prices, stream=stream, name=name, on_signal=on_signal)
        self._http: ModelClient | None = None
        """jixu's own client for Chat Completions (None when a ``client`` was given, or for the Responses API)."""
        self._client: AsyncOpenAI | None = None
        """The SDK's client: the caller's own, or made for the Responses API (None for jixu's own chat calls)."""
        if client is not None:
            import openai

            if not isinstance(client, openai.AsyncOpenAI):
                raise InvalidInput("client must be an openai.AsyncOpenAI", field="client")
            self._client = client.with_options(max_retries=0, timeout=timeout)
            self.base_url = str(self._client.base_url)
        else:
            if key is None and url is None:
                raise InvalidInput("OpenAIModel needs an API key: pass api_key=... or set OPENAI_API_KEY "
                                   "(or point base_url at a server that needs none)", field="api_key")
            self.base_url = endpoint(url)
            if api == "chat":
                self._http = model_client(timeout, _headers(key or PLACEHOLDER_KEY, os.environ))
            else:
                import openai

                self._client = openai.AsyncOpenAI(api_key=key or PLACEHOLDER_KEY, base_url=self.base_url,
                                                  timeout=timeout, max_retries=0)
        if api == "responses" and not hasattr(self._sdk, "responses"):
            raise InvalidInput("api='responses' needs openai>=1.66 (the Responses API); upgrade the openai "
                               "package", field="api")
        self.api = api
        self.store = store
        self.reasoning_summary = reasoning_summary
        self.timeout = float(timeout)
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.reasoning_effort = reasoning_effort
        official = OFFICIAL_HOST in self.base_url
        self.max_tokens_parameter = max_tokens_parameter or (
            "max_completion_tokens" if official or REASONING_MODEL.match(model) else "max_tokens")

    async def aclose(self) -> None:
        """Close the HTTP clients (their connections)."""
        if self._http is not None:
            await self._http.aclose()
        if self._client is not None:
            await self._client.close()

    @property
    def _sdk(self) -> AsyncOpenAI:
        """The SDK's client (the Responses API, or a caller's own ``client``)."""
        if self._client is None:  # pragma: no cover - only reached by jixu's own chat calls, which never ask
            raise AssertionError("no SDK client: chat calls without client= go over jixu's own HTTP client")
        return self._client

    def request_body(self, request: ModelRequest) -> dict[str, Any]:
        """The Chat Completions (or Responses) parameters for ``request`` (without ``stream``)."""
        if self.api == "responses":
            return self._responses_body(request)
        params: dict[str, Any] = {"model": self.model,
                                  "messages": chat_messages(request.instructions, request.messages)}
        if request.tools:
            params["tools"] = tool_specs(request.tools)
        if self.max_tokens is not None:
            params[self.max_tokens_parameter] = self.max_tokens
        if self.temperature is not None:
            params["temperature"] = self.temperature
        if self.reasoning_effort is not None:
            params["reasoning_effort"] = self.reasoning_effort
        return params

    def _responses_body(self, request: ModelRequest) -> dict[str, Any]:
        params: dict[str, Any] = {"model": self.model, "input": response_input(request.messages),
                                  "store": self.store}
        if request.instructions:
            params["instructions"] = request.instructions
        if request.tools:
            params["tools"] = response_tools(request.tools)
        if self.max_tokens is not None:
            params["max_output_tokens"] = self.max_tokens
        if self.temperature is not None:
            params["temperature"] = self.temperature
        reasoning: dict[str, Any] = {}
        if self.reasoning_effort is not None:
            reasoning["effort"] = self.reasoning_effort
        if self.reasoning_summary is not None:
            reasoning["summary"] = self.reasoning_summary
        if reasoning:
            params["reasoning"] = reasoning
        if not self.store and (reasoning or REASONING_MODEL.match(self.model)):
            # Nothing is kept on the server: the reasoning must come back encrypted to be sent again.
            params["include"] = [ENCRYPTED_REASONING]
        return params

    async def _whole(self, request: ModelRequest) -> ModelResponse:
        if self.api == "responses":
            answer: object = await self._sdk.responses.create(**self.request_body(request))
            if isinstance(answer, (str, bytes)) or not isinstance(getattr(answer, "output", None), list):
                # The SDK hands over a body it could not read as a response (an HTML page, say) as it is.
                raise self._unreadable("the response is not a Responses API object")
            return self._from_response(answer)
        params = self.request_body(request)
        if self._http is None:  # the caller's own client
            completion: object = _wire(await self._sdk.chat.completions.create(**params))
        else:
            response = await self._http.post(self.base_url + "chat/completions", _dumps(params).encode())
            if response.status_code >= 400:
                raise self._http_error(response) from None
            try:
                completion = response.json()
            except ValueError:
                completion = None
        if not isinstance(completion, dict):
            raise self._unreadable("the response is not a JSON object")
        choices = completion.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise self._unreadable("the response has no choices")
        choice = choices[0]
        message = _object(choice.get("message"))
        calls: list[ToolCall] = []
        for call in message.get("tool_calls") or []:
            function = call.get("function") if isinstance(call, dict) else None
            if not isinstance(function, dict):
                continue
            calls.append(ToolCall(name=str(function.get("name") or ""),
                                  args=parse_arguments(_text_or_none(function.get("arguments"))),
                                  id=_text_or_none(call.get("id")) or None))
        content = message.get("content")
        text = content if content is not None else message.get("refusal")
        reported = _text_or_none(completion.get("model"))
        model = reported or self.model
        thoughts = {name: value for name in REASONING_FIELDS
                    if isinstance(value := message.get(name), str) and value}
        return ModelResponse(text=text if isinstance(text, str) and text else None, tool_calls=tuple(calls),
                             usage=self._usage_of(completion.get("usage"), reported),
                             model=model, stop_reason=str(choice.get("finish_reason") or ""),
                             reasoning=_reasoning(model, thoughts))

    def _from_response(self, response: Any, done_items: dict[int, Any] | None = None) -> ModelResponse:
        """The assembled answer of a Responses API ``Response`` (its output, or the items streamed whole)."""
        status = getattr(response, "status", None)
        if status == "failed":
            raise self._failed(getattr(response, "error", None))
        output = [plain(item) for item in getattr(response, "output", None) or []]
        if not output and done_items:
            output = [plain(item) for _index, item in sorted(done_items.items())]
        model = str(getattr(response, "model", None) or self.model)
        text, calls, reasoning = parse_output([item for item in output if isinstance(item, dict)], model)
        incomplete = plain(getattr(response, "incomplete_details", None))
        return ModelResponse(text=text, tool_calls=tuple(calls), usage=self._response_usage(response, model),
                             model=model, stop_reason=stop_reason(status, incomplete, calls), reasoning=reasoning)

    def _failed(self, error: object) -> ModelError:
        """A failure reported inside a 200 answer (``response.failed``, an ``error`` event)."""
        body = plain(error)
        if not isinstance(body, dict):
            body = {"message": str(body or "the response failed")}
        return self._status_error(200, None, {"error": body}, str(body.get("message") or ""), None)

    def _response_usage(self, response: Any, model: str) -> Usage:
        usage = getattr(response, "usage", None)
        if usage is None:
            return Usage()
        cached = getattr(getattr(usage, "input_tokens_details", None), "cached_tokens", None) or 0
        written = getattr(getattr(usage, "input_tokens_details", None), "cache_write_tokens", None) or 0
        reasoning = getattr(getattr(usage, "output_tokens_details", None), "reasoning_tokens", None) or 0
        return self._usage(model=model, input_tokens=int(usage.input_tokens or 0),
                           output_tokens=int(usage.output_tokens or 0), cached_tokens=int(cached),
                           cache_write_tokens=int(written), reasoning_tokens=int(reasoning))

    async def _responses_streamed(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        stream: Any = await self._sdk.responses.create(**self.request_body(request), stream=True)
        calls: dict[int, dict[str, Any]] = {}
        done_items: dict[int, Any] = {}
        final: Any = None
        try:
            async for event in stream:
                kind = getattr(event, "type", None)
                if kind == "response.output_item.added":
                    item = event.item
                    if getattr(item, "type", None) == "function_call":
                        slot = {"position": len(calls), "id": getattr(item, "call_id", None),
                                "name": str(getattr(item, "name", "") or "")}
                        calls[event.output_index] = slot
                        emit("tool_call_delta", {"index": slot["position"], "id": slot["id"], "name": slot["name"],
                                                 "arguments": ""})
                elif kind == "response.function_call_arguments.delta" and event.output_index in calls:
                    slot = calls[event.output_index]
                    emit("tool_call_delta", {"index": slot["position"], "id": slot["id"], "name": slot["name"],
                                             "arguments": event.delta or ""})
                elif kind in ("response.output_text.delta", "response.refusal.delta") and event.delta:
                    emit("text_delta", {"text": event.delta})
                elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta") \
                        and event.delta:
                    emit("reasoning_delta", {"text": event.delta})
                elif kind == "response.output_item.done":
                    done_items[event.output_index] = event.item  # whole, encrypted reasoning included
                elif kind in ("response.completed", "response.incomplete"):
                    final = event.response
                elif kind == "response.failed":
                    raise self._failed(getattr(event.response, "error", None))
                elif kind == "error":
                    raise self._failed({"code": getattr(event, "code", None),
                                        "message": getattr(event, "message", None)})
        finally:
            await close_quietly(stream)
        if final is None:
            raise self._incomplete("no response.completed event was received")
        return self._from_response(final, done_items)

    async def _streamed(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        if self.api == "responses":
            return await self._responses_streamed(request, emit)
        params = self.request_body(request)
        params["stream_options"] = {"include_usage": True}
        text: list[str] = []
        thoughts: dict[str, list[str]] = {}
        calls: dict[int, dict[str, Any]] = {}
        finish: str | None = None
        usage: object = None
        model = ""
        async with aclosing(self._chunks(params)) as chunks:  # closed (its connection too) on any exit
            async for chunk in chunks:
                model = _text_or_none(chunk.get("model")) or model
                if chunk.get("usage") is not None:
                    usage = chunk["usage"]
                choices = chunk.get("choices")
                if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
                    continue
                choice = choices[0]
                delta = _object(choice.get("delta"))
                for field_name in REASONING_FIELDS:
                    thought = delta.get(field_name)
                    if isinstance(thought, str) and thought:
                        thoughts.setdefault(field_name, []).append(thought)
                        emit("reasoning_delta", {"text": thought})
                content = delta.get("content")
                if isinstance(content, str) and content:
                    text.append(content)
                    emit("text_delta", {"text": content})
                refusal = delta.get("refusal")
                if isinstance(refusal, str) and refusal:
                    # A refusal is the model's reply, as in the unstreamed message (content or refusal).
                    text.append(refusal)
                    emit("text_delta", {"text": refusal})
                for part in delta.get("tool_calls") or []:
                    if not isinstance(part, dict):
                        continue
                    position = part.get("index")
                    index = position if type(position) is int else len(calls)
                    slot = calls.setdefault(index, {"id": None, "name": "", "arguments": []})
                    function = _object(part.get("function"))
                    name = _text_or_none(function.get("name")) or ""
                    fragment = _text_or_none(function.get("arguments")) or ""
                    call_id = _text_or_none(part.get("id"))
                    if call_id:
                        slot["id"] = call_id
                    if name:
                        slot["name"] = merge_name(slot["name"], name)
                    if fragment:
                        slot["arguments"].append(fragment)
                    emit("tool_call_delta", {"index": index, "id": slot["id"], "name": slot["name"],
                                             "arguments": fragment})
                if choice.get("finish_reason"):
                    finish = str(choice["finish_reason"])
        if finish is None:
            raise self._incomplete("no finish_reason was received")
        tool_calls = tuple(ToolCall(name=slot["name"], args=parse_arguments("".join(slot["arguments"])),
                                    id=slot["id"]) for _index, slot in sorted(calls.items()))
        model = model or self.model
        return ModelResponse(text="".join(text) or None, tool_calls=tool_calls,
                             usage=self._usage_of(usage, model), model=model, stop_reason=finish,
                             reasoning=_reasoning(model, {k: "".join(v) for k, v in thoughts.items()}))

    async def _chunks(self, params: JSONObject) -> AsyncGenerator[JSONObject, None]:
        """The chunk objects of one streamed Chat Completions call, as wire dicts (an error event raises)."""
        if self._http is None:  # the caller's own client: its stream of typed chunks
            stream = await self._sdk.chat.completions.create(**params, stream=True)
            try:
                async for chunk in stream:
                    wire = _wire(chunk)
                    if isinstance(wire, dict):
                        yield wire
            finally:
                await close_quietly(stream)
            return
        params["stream"] = True
        async with self._http.stream(self.base_url + "chat/completions", _dumps(params).encode()) as response:
            if response.status_code >= 400:
                await response.aread()
                raise self._http_error(response) from None
            if response.headers.get("content-type", "").lower().startswith("application/json"):
                await response.aread()  # a server that ignores "stream": its whole answer, not an event stream
                raise self._unreadable("a streamed call was answered with a JSON body, not an event stream "
                                       "(Content-Type application/json): this server does not stream; use "
                                       "stream=False") from None
            done = False
            try:
                async with asyncio.timeout(None) as drain, \
                        aclosing(server_sent_data(response.aiter_bytes())) as events:
                    async for data in events:
                        if done:
                            continue  # read on to the end of the body: its connection then goes back to the pool
                        if data.startswith("[DONE]"):
                            done = True  # the answer is whole; what follows only gets a moment (as the SDK's)
                            drain.reschedule(asyncio.get_running_loop().time() + DRAIN_SECONDS)
                            continue
                        try:
                            chunk = json.loads(data)
                        except ValueError:
                            raise self._unreadable("a streamed chunk is not JSON") from None
                        if not isinstance(chunk, dict):
                            continue
                        if chunk.get("error"):  # an error object inside a 200 stream, as the SDK reads it
                            error = chunk["error"]
                            message = error.get("message") if isinstance(error, dict) else None
                            text = str(message or "An error occurred during streaming")
                            raise self._status_error(200, None, {"error": error}, text, None) from None
                        yield chunk
            except (TimeoutError, httpx.HTTPError, httpx.StreamError):
                if not done:
                    raise
                # The rest of the body did not come, or broke: the answer was whole; only this connection is
                # not reused (closing the response drops it).

    def _http_error(self, response: httpx.Response) -> ModelError:
        """An HTTP error answer of jixu's own client as a :class:`ModelError` (what the SDK's
        ``APIStatusError`` would give: the body's ``error`` object, else the body, else the text)."""
        try:
            body: object = response.json()
        except ValueError:
            body = None
        if isinstance(body, dict) and "error" not in body:
            body = {"error": body}
        fallback = response.text if body is None else f"Error code: {response.status_code}"
        return self._status_error(response.status_code, response.headers, body, fallback,
                                  response.headers.get("x-request-id"))

    def _usage_of(self, usage: object, model: str | None) -> Usage:
        if not isinstance(usage, dict):
            return Usage()  # the server reported nothing: tokens 0, cost unknown
        cached = _object(usage.get("prompt_tokens_details")).get("cached_tokens")
        reasoning = _object(usage.get("completion_tokens_details")).get("reasoning_tokens")
        return self._usage(model=model, input_tokens=_count(usage.get("prompt_tokens")),
                           output_tokens=_count(usage.get("completion_tokens")), cached_tokens=_count(cached),
                           reasoning_tokens=_count(reasoning))

    def _translate(self, error: Exception) -> ModelError:
        """Any failure of a call as a :class:`ModelError` (see the module's error table)."""
        if isinstance(error, ModelError):
            return error
        if self._client is None:  # jixu's own client: no SDK exception can arise (nor is the SDK imported)
            return self._unexpected(error)
        import openai

        if isinstance(error, openai.APIStatusError):
            headers = cast("Mapping[str, str]", error.response.headers)
            body: object = error.body
            if isinstance(body, dict) and "error" not in body:
                body = {"error": body}
            return self._status_error(error.status_code, headers, body, error.message,
                                      getattr(error, "request_id", None))
        if isinstance(error, openai.APITimeoutError):
            return self._connection_error(error, timeout=True)
        if isinstance(error, openai.APIConnectionError):
            return self._connection_error(error, timeout=False)
        if isinstance(error, openai.APIResponseValidationError):
            return self._unreadable(f"the response did not match the API's schema: {error.message}")
        if isinstance(error, openai.APIError):  # an error object inside a 200 stream
            return self._status_error(200, None, {"error": error.body} if error.body is not None else None,
                                      error.message, None)
        return self._unexpected(error)


__all__ = ["OpenAIModel", "chat_messages", "merge_name", "tool_specs"]
