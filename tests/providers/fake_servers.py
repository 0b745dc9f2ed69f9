"""Local HTTP servers that speak the OpenAI Chat Completions and Anthropic Messages wire formats.

Each server runs on 127.0.0.1 (a random port) in a thread of the test
process, using only the standard library. A test scripts it with a queue of
replies, in order, one per request:

- :class:`Completion`: a successful answer (text and/or tool calls, usage),
  rendered as one JSON body, or as Server-Sent Events when the request asks
  for ``stream: true``, exactly as the provider sends them. Streaming options
  break the connection mid-body (``drop_after``), end the body cleanly but
  early (``end_after``) or send the provider's in-stream error event
  (``error_after``).
- :class:`Failure`: an HTTP error status with the provider's error body and
  headers (``{api_key}`` in the body is replaced by the key the client sent,
  to prove drivers redact it).
- :class:`Hangup`: close the connection without answering.
- :class:`Slow`: wait, then send another reply (for client timeouts).

Every request is recorded (:attr:`FakeServer.requests`: path, headers, JSON
body) so tests assert exactly what the SDK sent.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self, TypeAlias


@dataclass(frozen=True)
class Call:
    """A tool call as the model emits it: ``arguments`` is the raw JSON text (it may be invalid)."""

    id: str | None
    name: str
    arguments: str


@dataclass(frozen=True)
class Thinking:
    """A block of the model's reasoning: Anthropic thinking (signed; ``redacted``: encrypted, no text), an
    OpenAI Responses reasoning item (its summary ``text``, encrypted content)."""

    text: str = ""
    redacted: bool = False


@dataclass(frozen=True)
class Completion:
    """A successful answer.

    ``input_tokens`` is what the provider reports as input: for OpenAI the
    whole prompt (``cached_tokens`` of it from the cache), for Anthropic the
    uncached part (``cached_tokens`` read and ``cache_write_tokens`` written
    come on top). ``fragment`` is how many characters each streamed text or
    argument delta carries; ``event_delay`` the seconds between streamed events.
    """

    text: str | None = None
    calls: Sequence[Call] = ()
    thinking: Sequence[Thinking] = ()
    """Reasoning the model emits before its text and calls (Anthropic, OpenAI Responses)."""
    reasoning_content: str | None = None
    """Chat Completions: ``reasoning_content`` as DeepSeek, vLLM, Qwen or Kimi servers send it."""
    model: str | None = None
    input_tokens: int = 12
    output_tokens: int = 7
    cached_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    """Of ``output_tokens``, those the model spent reasoning."""
    usage: bool = True
    stop: str | None = None
    fragment: int = 4
    drop_after: int | None = None
    end_after: int | None = None
    error_after: int | None = None
    error_body: Any = None
    event_delay: float = 0.0
    linger_after: float | None = None
    """Hold the body open this many seconds after the last event, then cut the connection without ending
    it (a server that sends its terminating event but not the end of the body)."""
    refusal: str | None = None
    """Chat Completions: the model refuses; the message's ``refusal`` (streamed as ``delta.refusal``), no content."""
    ascii_json: bool = True
    """Chat Completions: JSON with non-ASCII characters escaped (``json.dumps``'s default); False: sent as
    UTF-8, unescaped, as OpenAI's API sends them (U+2028 and U+0085 included: not line breaks in SSE)."""
    repeat_tool_name: bool = False
    """Chat Completions: send the call's whole ``name`` (and ``id``) again in every argument chunk, as some
    compatible servers do (MiniMax through NVIDIA NIM, some vLLM builds); OpenAI sends them once."""


@dataclass(frozen=True)
class Failure:
    """An HTTP error answer."""

    status: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"


@dataclass(frozen=True)
class Hangup:
    """Close the connection without sending a response."""


@dataclass(frozen=True)
class Slow:
    """Wait ``seconds``, then send ``then``."""

    seconds: float
    then: Reply


Reply: TypeAlias = Completion | Failure | Hangup | Slow


@dataclass(frozen=True)
class Recorded:
    """One request the server received."""

    method: str
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    client_port: int = 0
    """The client's port: requests of one kept-alive connection share it."""


REASONING_MODEL = re.compile(r"^(o\d|gpt-5)")
"""OpenAI's reasoning models (o1, o3, o4-mini, gpt-5, ...)."""


def _count_cache_control(request: dict[str, Any]) -> int:
    """How many blocks of an Anthropic request carry ``cache_control`` (tools, system, message contents)."""
    count = 0
    system = request.get("system")
    for group in (request.get("tools") or [], system if isinstance(system, list) else [],
                  *[m.get("content") or [] for m in request.get("messages") or []]):
        for block in group if isinstance(group, list) else []:
            if isinstance(block, dict) and "cache_control" in block:
                count += 1
    return count


def _pieces(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)] or [""]


class _Listening(ThreadingHTTPServer):
    """A provider's listen backlog: many clients connect at once (socketserver's default queue is 5, and a
    loaded machine then resets the connections beyond it)."""

    request_queue_size = 256


class FakeServer:
    """The scripted server; subclasses render :class:`Completion` in one provider's format."""

    endpoint = "/"
    default_model = "model"

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Recorded] = []
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                try:
                    server._handle(self)
                except (BrokenPipeError, ConnectionResetError):  # the client went away (e.g. cancelled)
                    self.close_connection = True

        self._httpd = _Listening(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02},
                                        name="fake-provider", daemon=True)

    # --- control ------------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        """The base URL to give the SDK."""
        raise NotImplementedError

    def start(self) -> Self:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def script(self, *replies: Reply) -> None:
        """Queue replies, answered in order."""
        with self._lock:
            self.replies.extend(replies)

    @property
    def bodies(self) -> list[dict[str, Any]]:
        """The JSON body of every request, in order."""
        return [r.body for r in self.requests]

    # --- serving ------------------------------------------------------------------------------

    def _handle(self, handler: BaseHTTPRequestHandler) -> None:
        length = int(handler.headers.get("Content-Length") or 0)
        raw = handler.rfile.read(length) if length else b""
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {"__unparsed__": raw.decode("utf-8", "replace")}
        headers = {k.lower(): v for k, v in handler.headers.items()}
        with self._lock:
            self.requests.append(Recorded("POST", handler.path, headers, body, handler.client_address[1]))
            reply: Reply | None = self.replies.popleft() if self.replies else None
        if handler.path.split("?")[0] != self.endpoint:
            self._send_json(handler, 404, {"error": {"message": f"no route {handler.path}", "type": "not_found"}})
            return
        if reply is None:
            self._send_json(handler, 500, self.error_body("api_error", "fake server: the script is exhausted"))
            return
        while isinstance(reply, Slow):
            time.sleep(reply.seconds)
            reply = reply.then
        refusal = self.validate(body) if isinstance(reply, Completion) else None
        if refusal is not None:  # the request breaks a rule the provider enforces: its 400, as it words it
            reply = refusal
        if isinstance(reply, Hangup):
            self._hang_up(handler)
        elif isinstance(reply, Failure):
            text = json.dumps(reply.body) if not isinstance(reply.body, str) else reply.body
            text = text.replace("{api_key}", self.received_key(headers))
            self._send(handler, reply.status, text.encode(), reply.content_type, reply.headers)
        elif body.get("stream"):
            self._send_events(handler, reply, body)
        else:
            self._send_json(handler, 200, self.render_json(reply, body))

    def received_key(self, headers: dict[str, str]) -> str:
        """The API key the client sent (``x-api-key``, or a bearer token)."""
        value = headers.get("x-api-key") or headers.get("authorization", "")
        return value.removeprefix("Bearer ")

    def _send_json(self, handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
        self._send(handler, status, json.dumps(body).encode(), "application/json", {})

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, payload: bytes, content_type: str,
              headers: dict[str, str]) -> None:
        handler.send_response(status)
        handler.send_header("Content-Type", content_type)
        handler.send_header("Content-Length", str(len(payload)))
        for name, value in headers.items():
            handler.send_header(name, value)
        handler.end_headers()
        handler.wfile.write(payload)
        handler.wfile.flush()

    @staticmethod
    def _hang_up(handler: BaseHTTPRequestHandler) -> None:
        handler.close_connection = True
        try:
            handler.wfile.flush()
            handler.connection.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _send_events(self, handler: BaseHTTPRequestHandler, reply: Completion, request: dict[str, Any]) -> None:
        events = list(self.render_events(reply, request))
        if reply.error_after is not None:
            events = [*events[:reply.error_after], self.render_error_event(reply.error_body)]
        handler.send_response(200)
        handler.send_header("Content-Type", "text/event-stream")
        handler.send_header("Cache-Control", "no-cache")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for number, event in enumerate(events):
            if reply.drop_after is not None and number == reply.drop_after:
                # Announce a chunk, send half of it, and cut the connection: a broken stream.
                data = event.encode()
                handler.wfile.write(f"{len(data):x}\r\n".encode() + data[: len(data) // 2])
                self._hang_up(handler)
                return
            if reply.end_after is not None and number == reply.end_after:
                break  # end the body properly, but before the provider's terminating event
            data = event.encode()
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()
            if reply.event_delay:
                time.sleep(reply.event_delay)
        if reply.linger_after is not None:
            time.sleep(reply.linger_after)
            self._hang_up(handler)
            return
        handler.wfile.write(b"0\r\n\r\n")
        handler.wfile.flush()

    # --- the provider's format (subclasses) ---------------------------------------------------

    def validate(self, request: dict[str, Any]) -> Failure | None:
        """The provider's refusal of a request that breaks one of its rules, or None."""
        return None

    def render_json(self, reply: Completion, request: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def render_events(self, reply: Completion, request: dict[str, Any]) -> Iterator[str]:
        raise NotImplementedError

    def render_error_event(self, body: Any) -> str:
        raise NotImplementedError

    def error_body(self, error_type: str, message: str) -> dict[str, Any]:
        raise NotImplementedError


class FakeOpenAI(FakeServer):
    """``POST /v1/chat/completions`` as OpenAI (and compatible servers) answer it."""

    endpoint = "/v1/chat/completions"
    default_model = "gpt-4o-mini-2024-07-18"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    reasoning_field = "reasoning_content"
    """Where a compatible server puts the model's reasoning (``reasoning`` on newer vLLM and OpenRouter)."""
    require_reasoning_back = False
    """Refuse a tool loop whose last assistant message lost its reasoning, as DeepSeek's thinking mode
    documents (https://api-docs.deepseek.com/guides/thinking_mode, tool calls): the reasoning that led to a
    call must be sent back with it."""

    def validate(self, request: dict[str, Any]) -> Failure | None:
        model = str(request.get("model") or "")
        messages = request.get("messages") or []
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if self.require_reasoning_back and last is not None and messages[last].get("tool_calls") \
                and not messages[last].get(self.reasoning_field):
            return Failure(400, {"error": {
                "message": f"Missing `{self.reasoning_field}` field in the assistant message at message index "
                           f"{last}. In thinking mode, the reasoning of a tool-calling turn must be passed back.",
                "type": "invalid_request_error", "param": None, "code": "invalid_request_error"}})
        if REASONING_MODEL.match(model) and "max_tokens" in request:
            # Reasoning models refuse max_tokens (https://platform.openai.com/docs/guides/reasoning).
            return Failure(400, {"error": {
                "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                           "Use 'max_completion_tokens' instead.",
                "type": "invalid_request_error", "param": "max_tokens", "code": "unsupported_parameter"}})
        return None

    def _usage(self, reply: Completion) -> dict[str, Any]:
        return {"prompt_tokens": reply.input_tokens, "completion_tokens": reply.output_tokens,
                "total_tokens": reply.input_tokens + reply.output_tokens,
                "prompt_tokens_details": {"cached_tokens": reply.cached_tokens, "audio_tokens": 0},
                "completion_tokens_details": {"reasoning_tokens": reply.reasoning_tokens, "audio_tokens": 0}}

    def _finish(self, reply: Completion) -> str:
        return reply.stop or ("tool_calls" if reply.calls else "stop")

    def render_json(self, reply: Completion, request: dict[str, Any]) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": reply.text, "refusal": reply.refusal}
        if reply.reasoning_content is not None:
            message[self.reasoning_field] = reply.reasoning_content
        if reply.calls:
            message["tool_calls"] = [{"id": c.id, "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in reply.calls]
        body: dict[str, Any] = {
            "id": "chatcmpl-fake", "object": "chat.completion", "created": 1_700_000_000,
            "model": reply.model or self.default_model, "system_fingerprint": "fp_fake",
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": self._finish(reply)}],
        }
        if reply.usage:
            body["usage"] = self._usage(reply)
        return body

    def render_events(self, reply: Completion, request: dict[str, Any]) -> Iterator[str]:
        include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
        model = reply.model or self.default_model

        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            data: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                                    "created": 1_700_000_000, "model": model, "system_fingerprint": "fp_fake",
                                    "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                                 "finish_reason": finish}]}
            if include_usage:
                data["usage"] = None
            return f"data: {json.dumps(data, ensure_ascii=reply.ascii_json)}\n\n"

        yield chunk({"role": "assistant", "content": "", "refusal": None})
        if reply.reasoning_content:
            for piece in _pieces(reply.reasoning_content, reply.fragment):
                yield chunk({"content": None, self.reasoning_field: piece})
        if reply.refusal:
            for piece in _pieces(reply.refusal, reply.fragment):
                yield chunk({"refusal": piece})
        if reply.text:
            for piece in _pieces(reply.text, reply.fragment):
                yield chunk({"content": piece})
        for index, call in enumerate(reply.calls):
            yield chunk({"tool_calls": [{"index": index, "id": call.id, "type": "function",
                                         "function": {"name": call.name, "arguments": ""}}]})
            for piece in _pieces(call.arguments, reply.fragment):
                if piece:
                    part: dict[str, Any] = {"index": index, "function": {"arguments": piece}}
                    if reply.repeat_tool_name:
                        part = {"index": index, "id": call.id, "type": "function",
                                "function": {"name": call.name, "arguments": piece}}
                    yield chunk({"tool_calls": [part]})
        yield chunk({}, self._finish(reply))
        if include_usage and reply.usage:
            data = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 1_700_000_000,
                    "model": model, "system_fingerprint": "fp_fake", "choices": [], "usage": self._usage(reply)}
            yield f"data: {json.dumps(data)}\n\n"
        yield "data: [DONE]\n\n"

    def render_error_event(self, body: Any) -> str:
        return f"data: {json.dumps({'error': body})}\n\n"

    def error_body(self, error_type: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": error_type, "param": None, "code": None}}


class FakeResponses(FakeServer):
    """``POST /v1/responses``: the OpenAI Responses API as its reference and the SDK's generated types
    (``openai.types.responses``) describe it.

    Output items: a ``reasoning`` item per :class:`Thinking` (its text as the
    summary when the request asks for one; ``encrypted_content`` issued by the
    server when the request includes ``reasoning.encrypted_content``), then a
    ``message`` with the text (or a refusal), then one ``function_call`` per
    call. Streamed as the API's semantic events, each with its
    ``sequence_number``, ending with ``response.completed`` (no ``[DONE]``).
    Requests are checked as the API checks them: Responses parameters only
    (flat function tools, ``max_output_tokens``); with ``store: false`` a
    reasoning item sent back must carry the encrypted content the server
    issued (nothing is kept on the server); a function call sent back with its
    item id must come with the reasoning item that preceded it.
    """

    endpoint = "/v1/responses"
    default_model = "o4-mini-2025-04-16"

    def __init__(self) -> None:
        super().__init__()
        self.encrypted: dict[str, str] = {}
        """Encrypted content issued -> the reasoning item id it belongs to."""
        self.preceded_by: dict[str, str] = {}
        """Function call item id -> the id of the reasoning item before it in its response."""
        self._count = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _next(self, prefix: str) -> str:
        with self._lock:
            self._count += 1
            return f"{prefix}_{self._count:04d}{'f' * 36}"

    def validate(self, request: dict[str, Any]) -> Failure | None:
        def refuse(message: str, param: str | None = None) -> Failure:
            return Failure(400, {"error": {"message": message, "type": "invalid_request_error", "param": param,
                                           "code": None}})

        for name in ("messages", "max_tokens", "max_completion_tokens", "stream_options"):
            if name in request:
                return refuse(f"Unsupported parameter: '{name}'.", name)
        for i, item in enumerate(request.get("tools") or []):
            if "function" in item or "name" not in item:
                return refuse(f"Missing required parameter: 'tools[{i}].name'.", f"tools[{i}].name")
        seen_reasoning: set[str] = set()
        for item in request.get("input") or []:
            if not isinstance(item, dict):
                continue
            if item.get("type") == "reasoning":
                if request.get("store") is False and self.encrypted.get(str(item.get("encrypted_content"))) \
                        != item.get("id"):
                    return refuse(f"Item with id '{item.get('id')}' not found. Items are not persisted when "
                                  "`store` is set to false. Try again with `store` set to true, or remove this "
                                  "item from your input.", "input")
                seen_reasoning.add(str(item.get("id")))
            if item.get("type") == "function_call" and item.get("id") in self.preceded_by \
                    and self.preceded_by[item["id"]] not in seen_reasoning:
                return refuse(f"Item '{item['id']}' of type 'function_call' was provided without its required "
                              f"'reasoning' item: '{self.preceded_by[item['id']]}'.", "input")
        return None

    def _output(self, reply: Completion, request: dict[str, Any]) -> list[dict[str, Any]]:
        summary = bool((request.get("reasoning") or {}).get("summary"))
        encrypted = "reasoning.encrypted_content" in (request.get("include") or [])
        output: list[dict[str, Any]] = []
        last_reasoning = None
        for thought in reply.thinking:
            item: dict[str, Any] = {"id": self._next("rs"), "type": "reasoning", "status": "completed",
                                    "summary": [{"type": "summary_text", "text": thought.text}]
                                    if summary and thought.text else []}
            if encrypted:
                token = "gAAAAAB" + hashlib.sha256(f"{item['id']}|{thought.text}".encode()).hexdigest()
                with self._lock:
                    self.encrypted[token] = item["id"]
                item["encrypted_content"] = token
            last_reasoning = item["id"]
            output.append(item)
        if reply.text or reply.refusal:
            part = ({"type": "refusal", "refusal": reply.refusal} if reply.refusal
                    else {"type": "output_text", "text": reply.text, "annotations": [], "logprobs": []})
            output.append({"id": self._next("msg"), "type": "message", "status": "completed", "role": "assistant",
                           "content": [part]})
        for call in reply.calls:
            item = {"id": self._next("fc"), "type": "function_call", "status": "completed", "call_id": call.id,
                    "name": call.name, "arguments": call.arguments}
            if last_reasoning is not None:
                with self._lock:
                    self.preceded_by[item["id"]] = last_reasoning
            output.append(item)
        return output

    def _response(self, reply: Completion, request: dict[str, Any], output: list[dict[str, Any]],
                  status: str) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": "resp_fake", "object": "response", "created_at": 1_700_000_000, "status": status,
            "error": None, "incomplete_details": None, "instructions": request.get("instructions"),
            "max_output_tokens": request.get("max_output_tokens"), "model": reply.model or self.default_model,
            "output": output, "parallel_tool_calls": True, "previous_response_id": None,
            "reasoning": {"effort": (request.get("reasoning") or {}).get("effort"), "summary": None},
            "store": bool(request.get("store", True)), "temperature": 1.0, "text": {"format": {"type": "text"}},
            "tool_choice": "auto", "tools": request.get("tools") or [], "top_p": 1.0, "truncation": "disabled",
            "usage": None, "metadata": {}}
        if status == "completed" and reply.stop in ("max_output_tokens", "incomplete"):
            # ``incomplete``: an incomplete response whose ``incomplete_details`` is null (the field is nullable)
            body["status"] = "incomplete"
            body["incomplete_details"] = {"reason": reply.stop} if reply.stop == "max_output_tokens" else None
        if status == "completed" and reply.usage:
            body["usage"] = {"input_tokens": reply.input_tokens,
                             "input_tokens_details": {"cached_tokens": reply.cached_tokens},
                             "output_tokens": reply.output_tokens,
                             "output_tokens_details": {"reasoning_tokens": reply.reasoning_tokens},
                             "total_tokens": reply.input_tokens + reply.output_tokens}
        return body

    def render_json(self, reply: Completion, request: dict[str, Any]) -> dict[str, Any]:
        return self._response(reply, request, self._output(reply, request), "completed")

    def render_events(self, reply: Completion, request: dict[str, Any]) -> Iterator[str]:
        number = 0

        def event(name: str, data: dict[str, Any]) -> str:
            nonlocal number
            number += 1
            return f"event: {name}\ndata: {json.dumps({'type': name, 'sequence_number': number - 1, **data})}\n\n"

        output = self._output(reply, request)
        yield event("response.created", {"response": self._response(reply, request, [], "in_progress")})
        yield event("response.in_progress", {"response": self._response(reply, request, [], "in_progress")})
        for index, item in enumerate(output):
            at = {"item_id": item["id"], "output_index": index}
            if item["type"] == "reasoning":
                yield event("response.output_item.added", {"output_index": index, "item": {
                    "id": item["id"], "type": "reasoning", "summary": [], "status": "in_progress"}})
                for s_index, part in enumerate(item["summary"]):
                    yield event("response.reasoning_summary_part.added", {
                        **at, "summary_index": s_index, "part": {"type": "summary_text", "text": ""}})
                    for piece in _pieces(part["text"], reply.fragment):
                        yield event("response.reasoning_summary_text.delta", {**at, "summary_index": s_index,
                                                                                "delta": piece})
                    yield event("response.reasoning_summary_text.done", {**at, "summary_index": s_index,
                                                                           "text": part["text"]})
                    yield event("response.reasoning_summary_part.done", {**at, "summary_index": s_index,
                                                                           "part": part})
            elif item["type"] == "message":
                yield event("response.output_item.added", {"output_index": index, "item": {
                    **item, "status": "in_progress", "content": []}})
                part = item["content"][0]
                empty = {"type": part["type"], "text": "", "annotations": []} if part["type"] == "output_text" \
                    else {"type": "refusal", "refusal": ""}
                yield event("response.content_part.added", {**at, "content_index": 0, "part": empty})
                whole = part.get("text") if part["type"] == "output_text" else part["refusal"]
                kind = "response.output_text" if part["type"] == "output_text" else "response.refusal"
                for piece in _pieces(whole, reply.fragment):
                    extra = {"logprobs": []} if part["type"] == "output_text" else {}
                    yield event(f"{kind}.delta", {**at, "content_index": 0, "delta": piece, **extra})
                yield event(f"{kind}.done", {**at, "content_index": 0,
                                             ("text" if part["type"] == "output_text" else "refusal"): whole})
                yield event("response.content_part.done", {**at, "content_index": 0, "part": part})
            else:
                yield event("response.output_item.added", {"output_index": index, "item": {
                    **item, "status": "in_progress", "arguments": ""}})
                for piece in _pieces(item["arguments"], reply.fragment):
                    if piece:
                        yield event("response.function_call_arguments.delta", {**at, "delta": piece})
                yield event("response.function_call_arguments.done", {**at, "arguments": item["arguments"],
                                                                       "name": item["name"]})
            yield event("response.output_item.done", {"output_index": index, "item": item})
        final = self._response(reply, request, output, "completed")
        yield event(f"response.{final['status']}", {"response": final})

    def render_error_event(self, body: Any) -> str:
        if isinstance(body, dict) and body.get("event") == "response.failed":
            response = {"id": "resp_fake", "object": "response", "status": "failed", "output": [],
                        "error": {"code": body.get("code"), "message": body.get("message")}}
            data = {"type": "response.failed", "sequence_number": 99, "response": response}
            return f"event: response.failed\ndata: {json.dumps(data)}\n\n"
        data = {"type": "error", "sequence_number": 99, **(body or {})}
        return f"event: error\ndata: {json.dumps(data)}\n\n"

    def error_body(self, error_type: str, message: str) -> dict[str, Any]:
        return {"error": {"message": message, "type": error_type, "param": None, "code": None}}


class FakeAnthropic(FakeServer):
    """``POST /v1/messages`` as Anthropic answers it.

    Thinking blocks carry a signature the server issued (redacted ones opaque
    ``data``), and requests are checked as the API checks them
    (https://docs.anthropic.com/en/docs/build-with-claude/extended-thinking,
    .../prompt-caching): a thinking block sent back must be unchanged, with its
    signature; with thinking on, a final assistant message holding tool use
    must start with a thinking block; at most 4 ``cache_control`` breakpoints;
    a thinking budget below ``max_tokens``.
    """

    endpoint = "/v1/messages"
    default_model = "claude-sonnet-4-20250514"

    def __init__(self) -> None:
        super().__init__()
        self.signatures: dict[str, str] = {}
        """Signature -> the thinking text it was issued for."""
        self.redacted: set[str] = set()

    def _thinking_blocks(self, reply: Completion) -> list[dict[str, Any]]:
        blocks = []
        for number, thought in enumerate(reply.thinking):
            digest = hashlib.sha256(f"{len(self.signatures)}|{number}|{thought.text}".encode()).hexdigest()
            if thought.redacted:
                data = f"EmwKAhgBEgy{digest}"
                with self._lock:
                    self.redacted.add(data)
                blocks.append({"type": "redacted_thinking", "data": data})
            else:
                signature = f"EqQBCkgIARABGAIiQL{digest}"
                with self._lock:
                    self.signatures[signature] = thought.text
                blocks.append({"type": "thinking", "thinking": thought.text, "signature": signature})
        return blocks

    def validate(self, request: dict[str, Any]) -> Failure | None:
        def refuse(message: str) -> Failure:
            return Failure(400, self.error_body("invalid_request_error", message))

        messages = request.get("messages") or []
        for i, message in enumerate(messages):
            for j, block in enumerate(message.get("content") or []):
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "thinking" and self.signatures.get(str(block.get("signature"))) \
                        != block.get("thinking"):
                    return refuse(f"messages.{i}.content.{j}: Invalid `signature` in `thinking` block")
                if block.get("type") == "redacted_thinking" and block.get("data") not in self.redacted:
                    return refuse(f"messages.{i}.content.{j}: Invalid `data` in `redacted_thinking` block")
        breakpoints = _count_cache_control(request)
        if breakpoints > 4:
            return refuse(f"A maximum of 4 blocks with cache_control may be provided. Found {breakpoints}.")
        thinking = request.get("thinking")
        if not isinstance(thinking, dict) or thinking.get("type") not in ("enabled", "adaptive"):
            return None
        budget = thinking.get("budget_tokens")
        if isinstance(budget, int) and budget >= int(request.get("max_tokens") or 0):
            return refuse("`max_tokens` must be greater than `thinking.budget_tokens`. Please consult our "
                          "documentation at https://docs.claude.com/en/docs/build-with-claude/extended-thinking")
        last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
        if last is None:
            return None
        content = [b for b in messages[last].get("content") or [] if isinstance(b, dict)]
        if any(b.get("type") == "tool_use" for b in content) and content[0].get("type") not in (
                "thinking", "redacted_thinking"):
            return refuse(f"messages.{last}.content.0.type: Expected `thinking` or `redacted_thinking`, but found "
                          f"`{content[0].get('type')}`. When `thinking` is enabled, a final `assistant` message "
                          "must start with a thinking block (preceeding the lastmost set of `tool_use` and "
                          "`tool_result` blocks). We recommend you include thinking blocks from previous turns. "
                          "To avoid this requirement, disable `thinking`. Please consult our documentation at "
                          "https://docs.claude.com/en/docs/build-with-claude/extended-thinking")
        return None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _usage(self, reply: Completion, output: int) -> dict[str, Any]:
        return {"input_tokens": reply.input_tokens, "output_tokens": output,
                "cache_read_input_tokens": reply.cached_tokens,
                "cache_creation_input_tokens": reply.cache_write_tokens, "service_tier": "standard"}

    def _stop(self, reply: Completion) -> str:
        return reply.stop or ("tool_use" if reply.calls else "end_turn")

    def render_json(self, reply: Completion, request: dict[str, Any]) -> dict[str, Any]:
        content: list[dict[str, Any]] = self._thinking_blocks(reply)
        if reply.text:
            content.append({"type": "text", "text": reply.text})
        for call in reply.calls:
            content.append({"type": "tool_use", "id": call.id, "name": call.name,
                            "input": json.loads(call.arguments)})
        body: dict[str, Any] = {"id": "msg_fake", "type": "message", "role": "assistant",
                                "model": reply.model or self.default_model, "content": content,
                                "stop_reason": self._stop(reply), "stop_sequence": None}
        body["usage"] = self._usage(reply, reply.output_tokens) if reply.usage else {"input_tokens": 0,
                                                                                      "output_tokens": 0}
        return body

    def render_events(self, reply: Completion, request: dict[str, Any]) -> Iterator[str]:
        def event(name: str, data: dict[str, Any]) -> str:
            return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n"

        start_usage = self._usage(reply, 1) if reply.usage else {"input_tokens": 0, "output_tokens": 0}
        yield event("message_start", {"message": {
            "id": "msg_fake", "type": "message", "role": "assistant", "model": reply.model or self.default_model,
            "content": [], "stop_reason": None, "stop_sequence": None, "usage": start_usage}})
        index = 0
        for block in self._thinking_blocks(reply):
            if block["type"] == "redacted_thinking":
                yield event("content_block_start", {"index": index, "content_block": block})
            else:
                yield event("content_block_start", {"index": index, "content_block": {
                    "type": "thinking", "thinking": "", "signature": ""}})
                for piece in _pieces(block["thinking"], reply.fragment):
                    yield event("content_block_delta", {"index": index, "delta": {"type": "thinking_delta",
                                                                                  "thinking": piece}})
                yield event("content_block_delta", {"index": index, "delta": {"type": "signature_delta",
                                                                              "signature": block["signature"]}})
            yield event("content_block_stop", {"index": index})
            index += 1
        if reply.text:
            yield event("content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}})
            yield event("ping", {})
            for piece in _pieces(reply.text, reply.fragment):
                yield event("content_block_delta", {"index": index,
                                                    "delta": {"type": "text_delta", "text": piece}})
            yield event("content_block_stop", {"index": index})
            index += 1
        for call in reply.calls:
            yield event("content_block_start", {"index": index, "content_block": {
                "type": "tool_use", "id": call.id, "name": call.name, "input": {}}})
            for piece in _pieces(call.arguments, reply.fragment):
                yield event("content_block_delta", {"index": index, "delta": {"type": "input_json_delta",
                                                                              "partial_json": piece}})
            yield event("content_block_stop", {"index": index})
            index += 1
        yield event("message_delta", {"delta": {"stop_reason": self._stop(reply), "stop_sequence": None},
                                      "usage": {"output_tokens": reply.output_tokens if reply.usage else 0}})
        yield event("message_stop", {})

    def render_error_event(self, body: Any) -> str:
        return f"event: error\ndata: {json.dumps(body)}\n\n"

    def error_body(self, error_type: str, message: str) -> dict[str, Any]:
        return {"type": "error", "error": {"type": error_type, "message": message}}


__all__ = ["Call", "Completion", "Failure", "FakeAnthropic", "FakeOpenAI", "FakeResponses", "FakeServer", "Hangup",
           "Recorded", "Reply", "Slow", "Thinking"]
