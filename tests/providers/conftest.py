"""Fixtures for the provider-driver suites: scripted fake provider servers and ready-made requests."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterator, Sequence
from typing import Any, TypeVar

import pytest

from jixu.threads.model import ModelRequest
from tests.providers.fake_servers import FakeAnthropic, FakeOpenAI, FakeResponses

T = TypeVar("T")

OPENAI_KEY = "sk-test-SECRET0123456789abcdefOPENAI"
ANTHROPIC_KEY = "sk-ant-api03-SECRET0123456789abcdefANTHROPIC"

STATUSES = ("ok", "error", "denied", "not_occurred", "abandoned_unknown", "occurred", "interrupted",
            "not_inherited")
"""Every status a tool message can carry in jixu's conversation."""

ADD_SPEC: dict[str, Any] = {
    "name": "add",
    "description": "Add two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False},
}
LOOKUP_SPEC: dict[str, Any] = {
    "name": "lookup",
    "description": "",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"],
                   "additionalProperties": False},
}


@pytest.fixture
def openai_server() -> Iterator[FakeOpenAI]:
    """A fresh fake Chat Completions server on 127.0.0.1 (stopped after the test)."""
    server = FakeOpenAI().start()
    yield server
    server.stop()


@pytest.fixture
def responses_server() -> Iterator[FakeResponses]:
    """A fresh fake Responses API server on 127.0.0.1 (stopped after the test)."""
    server = FakeResponses().start()
    yield server
    server.stop()


@pytest.fixture
def anthropic_server() -> Iterator[FakeAnthropic]:
    """A fresh fake Messages API server on 127.0.0.1 (stopped after the test)."""
    server = FakeAnthropic().start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _no_provider_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The developer's own provider settings must not leak into a test."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL",
                 "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_PROFILE", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)


def run(coro: Awaitable[T]) -> T:
    """Run ``coro`` in a fresh event loop (no pytest-asyncio)."""

    async def main() -> T:
        return await coro

    return asyncio.run(main())


def make_request(messages: Sequence[dict[str, Any]] | None = None, *, tools: Sequence[dict[str, Any]] = (),
                 instructions: str = "You are terse.", effect_id: str = "01HEFFECT0000000000000000000",
                 attempt: int = 1) -> ModelRequest:
    """A ModelRequest as the harness builds it."""
    return ModelRequest(
        instructions=instructions,
        messages=tuple(messages if messages is not None else [{"role": "user", "content": "Hello?"}]),
        tools=tuple(tools),
        effect_id=effect_id,
        idempotency_key=f"jixu:{effect_id}",
        attempt=attempt,
        thread_id="01HTHREAD0000000000000000000",
        turn_id="01HTURN00000000000000000000",
    )


def every_status_conversation() -> list[dict[str, Any]]:
    """A conversation whose tool messages carry every status, with parallel calls, as jixu projects it."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Do all the things."}]
    calls = [{"id": f"call_{status}", "name": "add", "args": {"a": n, "b": 1}} for n, status in enumerate(STATUSES)]
    # Parallel calls in one assistant message for the first half, one call per message for the rest.
    half = len(calls) // 2
    messages.append({"role": "assistant", "content": "Working on it.", "tool_calls": calls[:half]})
    for call, status in zip(calls[:half], STATUSES[:half], strict=True):
        messages.append({"role": "tool", "tool_call_id": call["id"], "name": "add",
                         "content": f"result with status {status}", "status": status})
    for call, status in zip(calls[half:], STATUSES[half:], strict=True):
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "name": "add",
                         "content": f"result with status {status}", "status": status})
    messages.append({"role": "assistant", "content": "All done.", "tool_calls": []})
    messages.append({"role": "user", "content": "Thanks. Once more?"})
    return messages


__all__ = ["ADD_SPEC", "ANTHROPIC_KEY", "LOOKUP_SPEC", "OPENAI_KEY", "STATUSES", "every_status_conversation",
           "make_request", "run"]
