"""Durable agent threads: the harness, agents, tools, model drivers and the pure thread projection."""

from __future__ import annotations

from typing import TYPE_CHECKING

from jixu.exports import lazy_exports

if TYPE_CHECKING:
    from jixu.threads.agent import Agent
    from jixu.threads.anthropic import AnthropicModel
    from jixu.threads.fallback import FallbackModel
    from jixu.threads.harness import Harness, ThreadSummary
    from jixu.threads.log import ThreadLog
    from jixu.threads.model import ModelDriver, ModelRequest, ModelResponse, ScriptedModel, ToolCall, Usage
    from jixu.threads.openai import OpenAIModel
    from jixu.threads.projection import ThreadProjection
    from jixu.threads.steps import DurableRun, durable
    from jixu.threads.streaming import Signal
    from jixu.threads.sync import SyncHarness, SyncThread
    from jixu.threads.thread import State, Thread
    from jixu.threads.tools import (
        DontKnow,
        NotOccurred,
        Occurred,
        ProbeQuery,
        Tool,
        ToolContext,
        ToolError,
        tool,
    )

_EXPORTS = {
    "Agent": "jixu.threads.agent",
    "AnthropicModel": "jixu.threads.anthropic",
    "DontKnow": "jixu.threads.tools",
    "DurableRun": "jixu.threads.steps",
    "FallbackModel": "jixu.threads.fallback",
    "Harness": "jixu.threads.harness",
    "ModelDriver": "jixu.threads.model",
    "ModelRequest": "jixu.threads.model",
    "ModelResponse": "jixu.threads.model",
    "NotOccurred": "jixu.threads.tools",
    "Occurred": "jixu.threads.tools",
    "OpenAIModel": "jixu.threads.openai",
    "ProbeQuery": "jixu.threads.tools",
    "ScriptedModel": "jixu.threads.model",
    "Signal": "jixu.threads.streaming",
    "State": "jixu.threads.thread",
    "SyncHarness": "jixu.threads.sync",
    "SyncThread": "jixu.threads.sync",
    "Thread": "jixu.threads.thread",
    "ThreadLog": "jixu.threads.log",
    "ThreadProjection": "jixu.threads.projection",
    "ThreadSummary": "jixu.threads.harness",
    "Tool": "jixu.threads.tools",
    "ToolCall": "jixu.threads.model",
    "ToolContext": "jixu.threads.tools",
    "ToolError": "jixu.threads.tools",
    "Usage": "jixu.threads.model",
    "durable": "jixu.threads.steps",
    "tool": "jixu.threads.tools",
}
"""Each public name and the module it lives in (imported on first use: :mod:`jixu.exports`)."""

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)


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
