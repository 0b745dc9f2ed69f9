"""A fake OpenAI-compatible Chat Completions server for the fleet benchmark: fixed latency, counted calls.

``python bench/fake_openai.py --port 0 --latency 1.0 --steps 5`` prints ``listening <port>`` on stdout and serves
on 127.0.0.1 until SIGTERM. It speaks the public Chat Completions API as far as an agent loop needs it:

- ``POST /v1/chat/completions`` with a JSON body (``model``, ``messages``, ``tools``, ``stream``,
  ``stream_options``): after the latency (``--latency`` seconds, times ``1 ± --jitter`` drawn uniformly) the
  answer is a ``chat.completion`` object, or with ``"stream": true`` a ``text/event-stream`` of
  ``chat.completion.chunk`` objects (``data: {...}`` events, a usage chunk when ``stream_options.include_usage``,
  then ``data: [DONE]``). While the conversation holds fewer than ``--steps - 1`` assistant messages the
  answer calls the first tool of ``tools`` (``finish_reason: "tool_calls"``); then it replies with text
  (``finish_reason: "stop"``). So a turn is ``--steps`` model calls.
- ``GET /stats``: requests served, connections accepted, the first request's arrival and the last answer's
  end (``time.time()``), and per conversation (keyed by the first user message) the gaps between the end of one answer and the
  arrival of the next request: what the client spent between two model calls (tool call and bookkeeping);
  ``first_calls``: when each conversation's first request arrived, in order.
- ``POST /stats/reset``: forget everything counted.

HTTP/1.1 with keep-alive, written on ``asyncio.Protocol`` so the server itself costs little CPU (it shares the
machine with the systems it measures). Not a general HTTP server: bodies need ``Content-Length``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import time
from typing import Any


class Stats:
    """What the server counted since the last reset."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.requests = 0
        self.connections = 0
        self.first_request: float | None = None
        self.last_answer: float | None = None
        self.last_end: dict[str, float] = {}
        self.gaps: list[float] = []
        self.started: dict[str, float] = {}

    def arrived(self, key: str, now: float) -> None:
        self.requests += 1
        if self.first_request is None:
            self.first_request = now
        ended = self.last_end.pop(key, None)
        if ended is not None:
            self.gaps.append(now - ended)
        else:
            self.started.setdefault(key, now)

    def answered(self, key: str, now: float, final: bool) -> None:
        self.last_answer = now if self.last_answer is None else max(self.last_answer, now)
        if not final:
            self.last_end[key] = now

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "connections": self.connections, "first_request": self.first_request,
                "last_answer": self.last_answer, "gaps": self.gaps, "first_calls": sorted(self.started.values())}


class Settings:
    def __init__(self, latency: float, jitter: float, steps: int) -> None:
        self.latency, self.jitter, self.steps = latency, jitter, steps
        self.ids = 0

    def delay(self) -> float:
        return self.latency * (1 + random.uniform(-self.jitter, self.jitter))

    def next_id(self) -> int:
        self.ids += 1
        return self.ids


def conversation_of(messages: list[dict[str, Any]]) -> tuple[str, int]:
    """(the first user message's content as the conversation's key, assistant messages so far)."""
    key = ""
    assistants = 0
    for message in messages:
        role = message.get("role")
        if role == "user" and not key:
            key = str(message.get("content"))
        elif role == "assistant":
            assistants += 1
    return key, assistants


def answer(body: dict[str, Any], settings: Settings, n: int) -> tuple[dict[str, Any], bool]:
    """(the message of the answer, whether it is the turn's final reply)."""
    _key, assistants = conversation_of(body.get("messages") or [])
    tools = body.get("tools") or []
    if tools and assistants < settings.steps - 1:
        name = tools[0].get("function", {}).get("name", "tool")
        return {"role": "assistant", "content": None,
                "tool_calls": [{"id": f"call_{n}", "type": "function",
                                "function": {"name": name, "arguments": "{}"}}]}, False
    return {"role": "assistant", "content": f"done after {assistants + 1} calls"}, True


USAGE = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}


def completion(body: dict[str, Any], message: dict[str, Any], n: int, final: bool) -> bytes:
    return json.dumps({
        "id": f"chatcmpl-{n}", "object": "chat.completion", "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [{"index": 0, "message": message, "logprobs": None,
                     "finish_reason": "stop" if final else "tool_calls"}],
        "usage": USAGE}).encode()


def chunks(body: dict[str, Any], message: dict[str, Any], n: int, final: bool) -> bytes:
    base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": int(time.time()),
            "model": body.get("model", "fake")}
    events: list[dict[str, Any]] = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                          "finish_reason": None}]}]
    if final:
        events.append({**base, "choices": [{"index": 0, "delta": {"content": message["content"]},
                                            "finish_reason": None}]})
    else:
        call = message["tool_calls"][0]
        events.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": call["id"], "type": "function",
             "function": {"name": call["function"]["name"], "arguments": ""}}]}, "finish_reason": None}]})
        events.append({**base, "choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "{}"}}]}, "finish_reason": None}]})
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop" if final else "tool_calls"}]})
    if (body.get("stream_options") or {}).get("include_usage"):
        events.append({**base, "choices": [], "usage": USAGE})
    text = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
    return text.encode()


def response(status: str, content_type: str, payload: bytes) -> bytes:
    return (f"HTTP/1.1 {status}\r\ncontent-type: {content_type}\r\ncontent-length: {len(payload)}\r\n"
            "connection: keep-alive\r\n\r\n").encode() + payload


class Connection(asyncio.Protocol):
    def __init__(self, settings: Settings, stats: Stats) -> None:
        self.settings, self.stats = settings, stats
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.busy = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        self.stats.connections += 1

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        self.next_request()

    def next_request(self) -> None:
        if self.busy or self.transport is None:
            return
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            return
        head = self.buffer[:end].decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
        if len(self.buffer) < end + 4 + length:
            return
        body, self.buffer = self.buffer[end + 4:end + 4 + length], self.buffer[end + 4 + length:]
        method, path, _version = head[0].split(" ", 2)
        self.handle(method, path.split("?")[0], body)

    def send(self, data: bytes) -> None:
        if self.transport is not None:
            self.transport.write(data)
        self.busy = False
        self.next_request()

    def handle(self, method: str, path: str, raw: bytes) -> None:
        self.busy = True
        if method == "GET" and path == "/stats":
            self.send(response("200 OK", "application/json", json.dumps(self.stats.to_dict()).encode()))
            return
        if method == "POST" and path == "/stats/reset":
            self.stats.reset()
            self.send(response("200 OK", "application/json", b"{}"))
            return
        if method != "POST" or not path.endswith("/chat/completions"):
            self.send(response("404 Not Found", "application/json", b'{"error": {"message": "not found"}}'))
            return
        body = json.loads(raw)
        key, _assistants = conversation_of(body.get("messages") or [])
        self.stats.arrived(key, time.time())
        n = self.settings.next_id()
        message, final = answer(body, self.settings, n)

        def reply() -> None:
            if body.get("stream"):
                payload = response("200 OK", "text/event-stream", chunks(body, message, n, final))
            else:
                payload = response("200 OK", "application/json", completion(body, message, n, final))
            self.stats.answered(key, time.time(), final)
            self.send(payload)

        asyncio.get_running_loop().call_later(self.settings.delay(), reply)


async def main(port: int, settings: Settings) -> None:
    stats = Stats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Connection(settings, stats), "127.0.0.1", port, backlog=4096)
    print(f"listening {server.sockets[0].getsockname()[1]}", flush=True)
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    server.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=1.0, help="seconds before each answer")
    parser.add_argument("--jitter", type=float, default=0.02, help="latency varies by up to this fraction")
    parser.add_argument("--steps", type=int, default=5, help="model calls per turn (all but the last call a tool)")
    args = parser.parse_args()
    asyncio.run(main(args.port, Settings(args.latency, args.jitter, args.steps)))
