"""Durable agent threads: the harness, agents, tools, model drivers and the pure thread projection."""

from __future__ import annotations

from jixu.threads.agent import Agent
from jixu.threads.harness import Harness, ThreadSummary
from jixu.threads.log import ThreadLog
from jixu.threads.model import ModelDriver, ModelRequest, ModelResponse, ScriptedModel, ToolCall, Usage
from jixu.threads.projection import ThreadProjection
from jixu.threads.thread import State, Thread
from jixu.threads.tools import Tool, ToolContext, ToolError, tool

__all__ = [
    "Agent",
    "Harness",
    "ModelDriver",
    "ModelRequest",
    "ModelResponse",
    "ScriptedModel",
    "State",
    "Thread",
    "ThreadLog",
    "ThreadProjection",
    "ThreadSummary",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolError",
    "Usage",
    "tool",
]
