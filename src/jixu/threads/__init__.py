"""Durable agent threads: the harness, agents, tools, model drivers and the pure thread projection."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from jixu.threads.agent import Agent
from jixu.threads.harness import Harness, ThreadSummary
from jixu.threads.log import ThreadLog
from jixu.threads.model import ModelDriver, ModelRequest, ModelResponse, ScriptedModel, ToolCall, Usage
from jixu.threads.projection import ThreadProjection
from jixu.threads.steps import DurableRun, durable
from jixu.threads.sync import SyncHarness, SyncThread
from jixu.threads.thread import State, Thread
from jixu.threads.tools import DontKnow, NotOccurred, Occurred, ProbeQuery, Tool, ToolContext, ToolError, tool

if TYPE_CHECKING:
    from jixu.threads.anthropic import AnthropicModel
    from jixu.threads.fallback import FallbackModel
    from jixu.threads.openai import OpenAIModel
    from jixu.threads.streaming import Signal

_LAZY = {
    "AnthropicModel": "jixu.threads.anthropic",
    "FallbackModel": "jixu.threads.fallback",
    "OpenAIModel": "jixu.threads.openai",
    "Signal": "jixu.threads.streaming",
}


def __getattr__(name: str) -> Any:
    """Import the provider drivers only when first used (their SDKs are optional extras)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "Agent",
    "AnthropicModel",
    "DontKnow",
    "DurableRun",
    "FallbackModel",
    "Harness",
    "ModelDriver",
    "ModelRequest",
    "ModelResponse",
    "NotOccurred",
    "Occurred",
    "OpenAIModel",
    "ProbeQuery",
    "ScriptedModel",
    "Signal",
    "State",
    "SyncHarness",
    "SyncThread",
    "Thread",
    "ThreadLog",
    "ThreadProjection",
    "ThreadSummary",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "Usage",
    "durable",
    "tool",
]
