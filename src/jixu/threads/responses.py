"""The OpenAI Responses API's wire format: jixu's conversation as ``input`` items, and output items back.

Pure functions used by :class:`~jixu.threads.openai.OpenAIModel` with
``api="responses"`` (no SDK import here). The driver is stateless: it sends
``store: false`` and the whole conversation every time, so a reasoning
model's reasoning items (with their ``encrypted_content``) come back from the
recorded receipt, verbatim, in front of the output items they preceded (the
API refuses a function call whose reasoning is missing).

A reasoning record of format ``openai-responses`` keeps the response's
output items in order: reasoning items whole, the others as stubs
(``{"type": "message", "id", "phase"?}``, ``{"type": "function_call", "id",
"call_id"}``) whose text and arguments are the answer's own text and tool
calls (so a long text stored as an artifact is not stored twice).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from jixu.ledger.encoding import JSONObject
from jixu.threads.model import ToolCall
from jixu.threads.streaming import parse_arguments, reasoning_items, reasoning_record, well_formed

REASONING_FORMAT = "openai-responses"
"""The format of the reasoning records the Responses API driver writes and sends back."""
ENCRYPTED_REASONING = "reasoning.encrypted_content"
"""What ``include`` asks for so that reasoning can be sent back without the server keeping it."""


def response_tools(tools: Sequence[JSONObject]) -> list[JSONObject]:
    """jixu tool specs as Responses API function tools (``strict`` off: jixu validates arguments itself)."""
    mapped: list[JSONObject] = []
    for spec in tools:
        item: JSONObject = {"type": "function", "name": spec["name"],
                            "parameters": spec.get("parameters") or {"type": "object", "properties": {}},
                            "strict": False}
        if spec.get("description"):
            item["description"] = spec["description"]
        mapped.append(item)
    return mapped


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _function_call(call: JSONObject, item_id: object = None) -> JSONObject:
    item: JSONObject = {"type": "function_call", "call_id": call["id"], "name": call["name"],
                        "arguments": _dumps(call["args"])}
    if isinstance(item_id, str) and item_id:
        item["id"] = item_id
    return item


def _assistant_text(text: str, stub: JSONObject | None = None) -> JSONObject:
    if stub is None or not isinstance(stub.get("id"), str):
        return {"role": "assistant", "content": text}
    item: JSONObject = {"type": "message", "role": "assistant", "id": stub["id"], "status": "completed",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]}
    if isinstance(stub.get("phase"), str):
        item["phase"] = stub["phase"]
    return item


def response_input(messages: Sequence[JSONObject]) -> list[JSONObject]:
    """The neutral conversation as Responses API ``input`` items.

    User messages are ``{"role": "user", "content"}``; an assistant message
    becomes its recorded output items in their order (reasoning verbatim,
    its text as an output message, its calls as ``function_call`` items), or
    its text and calls when it has no record of this format; a tool result
    is a ``function_call_output``.
    """
    out: list[JSONObject] = []
    for message in well_formed(messages):
        role = message["role"]
        if role == "user":
            out.append({"role": "user", "content": message["content"]})
        elif role == "assistant":
            out.extend(_assistant_items(message))
        else:
            out.append({"type": "function_call_output", "call_id": message["tool_call_id"],
                        "output": message["content"]})
    return out


def _assistant_items(message: JSONObject) -> Iterable[JSONObject]:
    text = message["content"]
    calls = iter(message["tool_calls"])
    text_sent = not text
    for item in reasoning_items(message, REASONING_FORMAT):
        kind = item.get("type")
        if kind == "reasoning":
            yield dict(item)
        elif kind == "message" and not text_sent:
            yield _assistant_text(str(text), item)
            text_sent = True
        elif kind == "function_call":
            call = next(calls, None)  # the k-th recorded call is the message's k-th call (ids may be rewritten)
            if call is not None:
                yield _function_call(call, item.get("id"))
    if not text_sent:
        yield _assistant_text(str(text))
    for call in calls:
        yield _function_call(call)


def parse_output(output: Sequence[JSONObject], model: str) -> tuple[str | None, list[ToolCall], JSONObject | None]:
    """A response's output items as ``(text, tool calls, reasoning record)``.

    The text joins every output text and refusal of the assistant's
    messages; the record is None when the response holds no reasoning item.
    """
    text: list[str] = []
    calls: list[ToolCall] = []
    items: list[JSONObject] = []
    for item in output:
        kind = item.get("type")
        if kind == "reasoning":
            items.append(dict(item))
        elif kind == "message":
            for part in item.get("content") or []:
                if not isinstance(part, dict):
                    continue
                if part.get("type") == "output_text" and isinstance(part.get("text"), str):
                    text.append(part["text"])
                elif part.get("type") == "refusal" and isinstance(part.get("refusal"), str):
                    text.append(part["refusal"])
            stub: JSONObject = {"type": "message", "id": item.get("id")}
            if isinstance(item.get("phase"), str):
                stub["phase"] = item["phase"]
            items.append(stub)
        elif kind == "function_call":
            call_id = item.get("call_id") or item.get("id")
            calls.append(ToolCall(name=str(item.get("name") or ""), args=parse_arguments(item.get("arguments")),
                                  id=str(call_id) if call_id else None))
            items.append({"type": "function_call", "id": item.get("id"), "call_id": call_id})
    has_reasoning = any(i.get("type") == "reasoning" for i in items)
    return "".join(text) or None, calls, reasoning_record(REASONING_FORMAT, model, items) if has_reasoning else None


def stop_reason(status: object, incomplete: object, calls: Sequence[ToolCall]) -> str:
    """The neutral stop reason: why an incomplete response stopped, ``tool_calls`` or ``stop``."""
    if status == "incomplete":
        reason = incomplete.get("reason") if isinstance(incomplete, dict) else None
        return str(reason or "incomplete")
    return "tool_calls" if calls else "stop"


def plain(value: Any) -> Any:
    """An SDK object as the JSON the server sent (the fields it sent), or the value itself."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict(mode="json")
    return value


__all__ = ["ENCRYPTED_REASONING", "REASONING_FORMAT", "parse_output", "plain", "response_input", "response_tools",
           "stop_reason"]
