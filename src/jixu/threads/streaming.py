"""Streaming signals, and the machinery the provider drivers share.

**Signals.** While a streaming driver receives a response it publishes
transient :class:`Signal` s: ``text_delta`` (``data={"text": ...}``),
``tool_call_delta`` (``data={"index", "id", "name", "arguments"}``, where
``index`` is the call's position among the response's tool calls, 0 for the
first, with every provider, and ``arguments`` is the new fragment of the
call's JSON arguments), ``reasoning_delta`` (``data={"text": ...}``: the
model's thinking or reasoning summary as it arrives, when the provider shows
it), ``fallback`` (``data={"from", "to", "error_kind"}``: a
:class:`~jixu.threads.fallback.FallbackModel` moved on to its next model) and,
once per call, ``done`` (``data={"ok": True, "stop_reason": ...}`` or
``{"ok": False, "error_kind": ...}``: the deltas of a failed call are void).
Signals are never recorded: only the final assembled response is returned to
the harness, which records it. A call retried after a failure or a crash
streams again under the same ``effect_id``.

Observe them with a callback (``on_signal=`` on the driver; it runs on the
event loop and must not block; its exceptions are swallowed), a queue::

    queue = driver.subscribe()
    ...
    signal = await queue.get()
    driver.unsubscribe(queue)

or an async iterator (stops when you break out of it)::

    async for signal in driver.signals(thread_id=thread.thread_id):
        if signal.kind == "text_delta":
            print(signal.data["text"], end="")

A subscriber that does not keep up loses its oldest signals (queues are
bounded); the model call itself is never slowed down or failed by an observer.

**Shared driver machinery.** Error classification (:func:`classify_status`),
``retry-after`` parsing, secret redaction, tool-argument parsing and the
normalisation of jixu's neutral conversation into one every provider accepts
(:func:`well_formed`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import datetime
import email.utils
import hashlib
import inspect
import json
import logging
import math
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from jixu.errors import InvalidInput, ModelError
from jixu.ledger.encoding import JSONObject
from jixu.threads.model import ModelRequest, ModelResponse, Usage
from jixu.threads.pricing import PriceTable, call_cost, catalogue, checked_prices

_log = logging.getLogger("jixu.threads.streaming")

SignalKind: TypeAlias = Literal["text_delta", "reasoning_delta", "tool_call_delta", "fallback", "done"]


@dataclass(frozen=True, slots=True)
class Signal:
    """One transient piece of progress of a model call (never recorded as an event)."""

    kind: SignalKind
    effect_id: str
    """The model call's effect id (the same across retries of that call)."""
    data: dict[str, Any] = field(default_factory=dict)
    thread_id: str = ""
    turn_id: str = ""
    attempt: int = 0


SignalCallback: TypeAlias = Callable[[Signal], None]
Emit: TypeAlias = Callable[[SignalKind, dict[str, Any]], None]
"""Publishes one signal of the call in progress: ``emit(kind, data)``."""

DEFAULT_QUEUE_SIZE = 1000


class SignalSource:
    """Publishes :class:`Signal` s to a callback and to any number of subscriber queues."""

    def __init__(self, on_signal: SignalCallback | None = None) -> None:
        if on_signal is not None and not callable(on_signal):
            raise InvalidInput("on_signal must be a function taking a Signal", field="on_signal")
        self._on_signal = on_signal
        self._queues: list[asyncio.Queue[Signal]] = []
        self._listeners: list[SignalCallback] = []

    def add_listener(self, listener: SignalCallback) -> None:
        """Call ``listener`` with every signal from now on (like ``on_signal``; e.g. a driver wrapping this one)."""
        if not callable(listener):
            raise InvalidInput("a listener must be a function taking a Signal", field="listener")
        self._listeners.append(listener)

    def remove_listener(self, listener: SignalCallback) -> None:
        """Stop calling ``listener`` (unknown listeners are ignored)."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def subscribe(self, maxsize: int = DEFAULT_QUEUE_SIZE) -> asyncio.Queue[Signal]:
        """A new queue receiving every signal from now on; give it back with :meth:`unsubscribe`."""
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise InvalidInput("maxsize must be an integer >= 1", field="maxsize")
        queue: asyncio.Queue[Signal] = asyncio.Queue(maxsize)
        self._queues.append(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[Signal]) -> None:
        """Stop delivering to ``queue`` (unknown queues are ignored)."""
        with contextlib.suppress(ValueError):
            self._queues.remove(queue)

    async def signals(self, *, thread_id: str | None = None, effect_id: str | None = None,
                      maxsize: int = DEFAULT_QUEUE_SIZE) -> AsyncIterator[Signal]:
        """Every signal from now on (optionally of one thread or one model call), until the caller stops."""
        queue = self.subscribe(maxsize)
        try:
            while True:
                signal = await queue.get()
                if thread_id is not None and signal.thread_id != thread_id:
                    continue
                if effect_id is not None and signal.effect_id != effect_id:
                    continue
                yield signal
        finally:
            self.unsubscribe(queue)

    def publish(self, signal: Signal) -> None:
        """Deliver ``signal``; never raises and never blocks."""
        for callback in (self._on_signal, *self._listeners):
            if callback is None:
                continue
            try:
                callback(signal)
            except Exception:  # an observer must not break the model call
                _log.exception("a signal callback raised; the signal is dropped for it")
        for queue in list(self._queues):
            if queue.full():
                with contextlib.suppress(asyncio.QueueEmpty):
                    queue.get_nowait()  # the oldest goes: a slow reader loses history, not the latest state
            with contextlib.suppress(asyncio.QueueFull):
                queue.put_nowait(signal)

    def _emitter(self, request: ModelRequest) -> Emit:
        def emit(kind: SignalKind, data: dict[str, Any]) -> None:
            self.publish(Signal(kind, request.effect_id, data, thread_id=request.thread_id,
                                turn_id=request.turn_id, attempt=request.attempt))

        return emit


# --- the conversation, made valid for any provider -------------------------------------------------

ERROR_STATUSES = frozenset({"error", "denied", "not_occurred", "abandoned_unknown", "interrupted",
                            "not_inherited", "missing"})
"""Tool-message statuses reported to the model as failed calls (Anthropic ``is_error``).
``ok`` and ``occurred`` are successes; any status not known here counts as an error."""
SUCCESS_STATUSES = frozenset({"ok", "occurred"})
MISSING_RESULT = "No result was recorded for this call; treat its outcome as unknown."
_CALL_ID = re.compile(r"[A-Za-z0-9_-]{1,40}")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(name: object) -> str:
    """``name`` as providers accept it in a recorded call: ``[A-Za-z0-9_-]{1,64}`` (others become ``_``)."""
    return _NOT_NAME.sub("_", str(name or ""))[:64] or "unknown_tool"


def is_error_status(status: object) -> bool:
    """Whether a tool message with ``status`` reports a failed (or not carried out) call."""
    return status not in SUCCESS_STATUSES


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def well_formed(messages: Sequence[JSONObject]) -> list[JSONObject]:
    """jixu's neutral conversation rearranged so every provider accepts it.

    Guarantees: only ``user``, ``assistant`` and ``tool`` messages; each
    assistant message's tool calls have ids that are unique in the
    conversation and match ``[A-Za-z0-9_-]{1,40}`` (ids that do not are
    replaced by a stable derived id, consistently in the call and its result);
    tool names in calls match ``[A-Za-z0-9_-]{1,64}``; an assistant message's
    reasoning record (its own ``reasoning``, or its first call's) is its
    ``reasoning``, absent when there is none (calls keep only id, name, args);
    each assistant message with tool calls is followed immediately by exactly
    one tool message per call, in call order (the first result recorded for
    that id after the call; a call without one gets a ``missing`` result);
    tool messages answering nothing are dropped; other messages between a
    call and the next assistant message move after the results. Contents are
    strings (``None`` becomes ``""``). The input is not changed.
    """
    out: list[JSONObject] = []
    used: set[str] = set()
    index = 0
    while index < len(messages):
        message = messages[index]
        role = message.get("role")
        index += 1
        if role == "user":
            out.append({"role": "user", "content": _text(message.get("content"))})
            continue
        if role != "assistant":
            continue  # a tool message answering no preceding call, or an unknown role
        end = index
        while end < len(messages) and messages[end].get("role") != "assistant":
            end += 1
        window = messages[index:end]
        index = end
        calls: list[JSONObject] = []
        fixed: dict[str, str] = {}
        raw_calls = message.get("tool_calls")
        for position, call in enumerate(raw_calls if isinstance(raw_calls, list) else []):
            if not isinstance(call, dict):
                continue
            original = call.get("id")
            call_id = original if isinstance(original, str) and _CALL_ID.fullmatch(original) else None
            if call_id is None or call_id in used:
                digest = hashlib.sha256(f"{original}|{len(out)}|{position}".encode()).hexdigest()[:24]
                call_id = f"call_{digest}"
            used.add(call_id)
            if isinstance(original, str) and original not in fixed:
                fixed[original] = call_id
            args = call.get("args")
            calls.append({"id": call_id, "original_id": original, "name": tool_name(call.get("name")),
                          "args": args if isinstance(args, dict) else {"__invalid__": args}})
        assistant: JSONObject = {"role": "assistant", "content": _text(message.get("content")) or None,
                                 "tool_calls": [{"id": c["id"], "name": c["name"], "args": c["args"]}
                                                for c in calls]}
        record = reasoning_of(message)
        if record is not None:
            assistant["reasoning"] = record
        out.append(assistant)
        results: dict[str, JSONObject] = {}
        others: list[JSONObject] = []
        for item in window:
            if item.get("role") == "tool":
                answered = item.get("tool_call_id")
                if isinstance(answered, str) and answered in fixed and fixed[answered] not in results:
                    results[fixed[answered]] = item
            elif item.get("role") == "user":
                others.append({"role": "user", "content": _text(item.get("content"))})
        for call in calls:
            found = results.get(call["id"])
            status = str(found.get("status") or "ok") if found is not None else "missing"
            content = _text(found.get("content")) if found is not None else MISSING_RESULT
            out.append({"role": "tool", "tool_call_id": call["id"], "name": call["name"], "content": content,
                        "status": status})
        out.extend(others)
    return out


def reasoning_of(message: JSONObject) -> JSONObject | None:
    """The reasoning record an assistant message carries (its own, or its first tool call's), or None."""
    record = message.get("reasoning")
    if not isinstance(record, dict):
        calls = message.get("tool_calls")
        first = calls[0] if isinstance(calls, list) and calls else None
        record = first.get("reasoning") if isinstance(first, dict) else None
    if isinstance(record, dict) and isinstance(record.get("format"), str) and isinstance(record.get("items"), list):
        return record
    return None


def reasoning_text(record: JSONObject) -> str:
    """What a person can read of a reasoning record: thinking text and summaries as written; redacted and
    encrypted content named, never shown (it is opaque, and sent back only verbatim)."""
    parts: list[str] = []
    for item in record.get("items") or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type")
        if kind == "thinking" and isinstance(item.get("thinking"), str):
            parts.append(item["thinking"])
        elif kind == "redacted_thinking":
            parts.append("[redacted thinking]")
        elif kind == "reasoning":  # the Responses API: readable only through its summary
            summary = [str(s.get("text")) for s in item.get("summary") or [] if isinstance(s, dict) and s.get("text")]
            parts.append(" ".join(summary) if summary else "[encrypted reasoning]")
        elif isinstance(item.get("text"), str):  # compatible servers' reasoning_content
            parts.append(item["text"])
    return " ".join(part.strip() for part in parts if part.strip())


def reasoning_items(message: JSONObject, format_name: str) -> list[JSONObject]:
    """The items of ``message``'s reasoning record when it is of ``format_name`` (else none): what goes back."""
    record = message.get("reasoning")
    if not isinstance(record, dict) or record.get("format") != format_name:
        return []
    return [item for item in record.get("items") or [] if isinstance(item, dict)]


def reasoning_record(format_name: str, model: str, items: Sequence[JSONObject]) -> JSONObject | None:
    """A reasoning record (see :mod:`jixu.threads.model`), or None when there are no items."""
    if not items:
        return None
    return {"format": format_name, "model": model, "items": list(items)}


# --- model output -----------------------------------------------------------------------------------

INVALID_JSON_KEY = "__invalid_json__"


def parse_arguments(raw: str | None) -> JSONObject:
    """A tool call's JSON arguments as an object; anything else becomes ``{"__invalid_json__": raw}``.

    An empty string means no arguments (``{}``). The harness rejects the
    invalid form before dispatch (it matches no tool's schema) and tells the model.
    """
    if raw is None or not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        return {INVALID_JSON_KEY: raw}
    if not isinstance(value, dict):
        return {INVALID_JSON_KEY: raw}
    return value


# --- errors -----------------------------------------------------------------------------------------

_QUOTA_WORDS = ("insufficient_quota", "credit balance", "insufficient credit", "insufficient_credit",
                "billing", "quota", "payment required", "out of credits", "usage limit", "spend limit",
                "enforced_spend_limit_reached")
_QUOTA_429_WORDS = ("insufficient_quota", "credit balance", "insufficient credit", "insufficient_credit",
                    "out of credits", "usage limit", "spend limit", "enforced_spend_limit_reached")
"""A 429 saying this: a spending cap or exhausted credit (Anthropic's monthly spend limit answers 429
``rate_limit_error`` with ``error.details.error_code: enforced_spend_limit_reached``), which waiting a
minute does not lift."""
_SECRET = re.compile(r"\b(sk-[A-Za-z0-9_-]{6})[A-Za-z0-9_-]{4,}")


def retry_after_seconds(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds to wait from ``retry-after-ms`` or ``retry-after`` (seconds or an HTTP date), or None."""
    if not headers:
        return None
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    raw_ms = lowered.get("retry-after-ms")
    if raw_ms is not None:
        with contextlib.suppress(ValueError):
            value = float(raw_ms)
            if math.isfinite(value):
                return max(0.0, value / 1000)
    raw = lowered.get("retry-after")
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        return max(0.0, round(when.timestamp() - (time.time() if now is None else now), 3))
    return max(0.0, value) if math.isfinite(value) else None


_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m(?!s))?(?:(\d+(?:\.\d+)?)s)?"
                       r"(?:(\d+(?:\.\d+)?)ms)?")
_RESET_HEADER = re.compile(r"^(x-ratelimit|anthropic-ratelimit)-(?:reset-([a-z-]+)|([a-z-]+)-reset)$")


def _reset_value(raw: str, now: float) -> float | None:
    """Seconds until a rate limit resets: a duration (``1s``, ``6m0s``, ``20ms``, ``1h2m3.5s``, ``12``) or a
    timestamp (RFC 3339, as Anthropic sends)."""
    text = raw.strip()
    if not text:
        return None
    with contextlib.suppress(ValueError):
        value = float(text)
        return max(0.0, value) if math.isfinite(value) else None
    match = _DURATION.fullmatch(text)
    if match and any(match.groups()):
        hours, minutes, seconds, millis = (float(g) if g else 0.0 for g in match.groups())
        return hours * 3600 + minutes * 60 + seconds + millis / 1000
    with contextlib.suppress(ValueError):
        when = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
        if when.tzinfo is not None:
            return max(0.0, round(when.timestamp() - now, 3))
    return None


def rate_limit_reset_seconds(headers: Mapping[str, str] | None, *, now: float | None = None) -> float | None:
    """Seconds until the exhausted rate limit resets, from ``x-ratelimit-reset-*`` (OpenAI) or
    ``anthropic-ratelimit-*-reset`` headers, or None.

    A limit whose ``remaining`` header says 0 is the one that was hit: the
    latest reset among those; without ``remaining`` headers, the latest reset.
    """
    if not headers:
        return None
    clock = time.time() if now is None else now
    lowered = {str(k).lower(): str(v) for k, v in headers.items()}
    resets: dict[str, float] = {}
    for name, raw in lowered.items():
        match = _RESET_HEADER.match(name)
        if match is None:
            continue
        prefix, limit = match.group(1), match.group(2) or match.group(3)
        value = _reset_value(raw, clock)
        if value is not None:
            resets[f"{prefix}:{limit}"] = value
    if not resets:
        return None
    exhausted = []
    for key, value in resets.items():
        prefix, limit = key.split(":", 1)
        remaining = (lowered.get(f"{prefix}-remaining-{limit}") if prefix == "x-ratelimit"
                     else lowered.get(f"{prefix}-{limit}-remaining"))
        if remaining is not None and remaining.strip() in ("0", "0.0"):
            exhausted.append(value)
    return max(exhausted) if exhausted else max(resets.values())


def error_fields(body: object) -> tuple[str | None, str | None, str | None]:
    """``(type, code, message)`` from a provider error body (the top level or its ``error`` object).

    The code is ``code``, or Anthropic's ``details.error_code``.
    """
    found: dict[str, str | None] = {"type": None, "code": None, "message": None}
    layers = [body]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        layers.insert(0, body["error"])
    for layer in list(layers):
        if isinstance(layer, dict) and isinstance(layer.get("details"), dict):
            layers.append({"code": layer["details"].get("error_code")})
    for layer in layers:
        if not isinstance(layer, dict):
            continue
        for key, known in list(found.items()):
            value = layer.get(key)
            if known is None and isinstance(value, str | int) and not isinstance(value, bool) \
                    and value != "error":
                found[key] = str(value)
    return found["type"], found["code"], found["message"]


_NO_CONNECTION = frozenset({"ConnectError", "ConnectTimeout"})
"""Transport errors (httpx, httpcore) raised while opening a connection, before any request byte is sent."""


def never_connected(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it: the SDKs wrap the transport's error) says no connection was made."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        module = type(current).__module__.split(".")[0]
        if type(current).__name__ in _NO_CONNECTION and module in _TRANSPORT_MODULES:
            return True
        if isinstance(current, ConnectionRefusedError):
            return True
        current = current.__cause__ or current.__context__
    return False


def proves_not_processed(status: int, error_type: str | None, message: str) -> bool:
    """Whether an HTTP error answer proves the provider did not process the request: it was overloaded.

    Anthropic's 529 ``overloaded_error`` and a 503 saying it is overloaded
    refuse the request before any work on it. Other 5xx (500, 502, 504) say
    something failed, not that nothing happened (a gateway's 502 or 504 may
    come while the model is still working), so they prove nothing.
    """
    if status == 529 or error_type == "overloaded_error":
        return True
    return status == 503 and "overloaded" in message.lower()


def classify_status(status: int, error_type: str | None, code: str | None, message: str) -> tuple[str, bool]:
    """``(kind, indeterminate)`` for an HTTP error status from a provider.

    429 -> ``rate_limit`` (or ``quota`` when it says the quota, credit or a
    spending cap is exhausted); a credit/billing/quota/usage-limit refusal
    (400/402/403) -> ``quota``; 401/403 -> ``authentication``; 408, 499 and
    5xx -> ``transient`` and indeterminate; other 4xx -> ``invalid_request``.
    Only the transient ones may have been processed (the drivers make an
    overloaded answer determinate: see :func:`proves_not_processed`).
    """
    words = " ".join(filter(None, (error_type, code, message))).lower()
    if status == 429:
        if any(w in words for w in _QUOTA_429_WORDS):
            return "quota", False
        return "rate_limit", False
    if status == 402 or (status in (400, 403) and (any(w in words for w in _QUOTA_WORDS)
                                                   or error_type == "billing_error")):
        return "quota", False
    if status in (401, 403):
        return "authentication", False
    if status in (408, 499) or status >= 500:
        return "transient", True
    if 400 <= status < 500:
        return "invalid_request", False
    if status < 400:  # an error event inside a 200 stream: its type and code say what its status would have
        return _classify_stream_error(error_type, code, words)
    return "transient", True


_STREAM_ERRORS: dict[str, tuple[str, bool]] = {
    "rate_limit_error": ("rate_limit", False), "rate_limit_exceeded": ("rate_limit", False),
    "authentication_error": ("authentication", False), "permission_error": ("authentication", False),
    "invalid_api_key": ("authentication", False),
    "invalid_request_error": ("invalid_request", False), "invalid_prompt": ("invalid_request", False),
    "context_length_exceeded": ("invalid_request", False), "not_found_error": ("invalid_request", False),
    "request_too_large": ("invalid_request", False),
}
"""An in-stream error's type or code (Anthropic's ``error`` event, OpenAI's ``error`` / ``response.failed``
events and a Chat Completions ``{"error": ...}`` chunk) -> the kind its HTTP status would have given."""


def _classify_stream_error(error_type: str | None, code: str | None, words: str) -> tuple[str, bool]:
    """``(kind, indeterminate)`` of an error event inside a 200 stream: a quota, rate limit, credential or
    invalid request is what it says (not retried as transient); anything else (``api_error``,
    ``server_error``, ``overloaded_error``, an unknown type) may have been processed: transient."""
    if any(w in words for w in _QUOTA_429_WORDS) or error_type == "billing_error":
        return "quota", False
    for name in (code, error_type):
        found = _STREAM_ERRORS.get(name) if isinstance(name, str) else None
        if found is not None:
            return found
    return "transient", True


class ProviderDriver(SignalSource, abc.ABC):
    """What the OpenAI and Anthropic drivers share: name, prices, usage, redaction and error building."""

    provider = "provider"

    def __init__(self, model: str, *, api_key: str | None, prices: PriceTable | None, stream: bool,
                 name: str | None, on_signal: SignalCallback | None) -> None:
        super().__init__(on_signal)
        if not isinstance(model, str) or not model.strip():
            raise InvalidInput(f"{type(self).__name__} needs a model name", field="model")
        if not isinstance(stream, bool):
            raise InvalidInput("stream must be True or False", field="stream")
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InvalidInput("name must be a non-empty string", field="name")
        self.model = model
        self.stream = stream
        self._name = name or f"{self.provider}:{model}"
        self._prices = checked_prices(prices)
        self._secret = api_key or ""

    @property
    def name(self) -> str:
        """A stable name recorded with each call, ``<provider>:<model>`` unless given."""
        return self._name

    def __repr__(self) -> str:
        return f"{type(self).__name__}(model={self.model!r}, name={self._name!r}, stream={self.stream})"

    def prepare(self) -> None:
        """Load the price catalogue (genai-prices and its data) before the first call needs it."""
        prices = catalogue()
        if prices is not None:
            prices.data_snapshot.get_snapshot()

    def cost(self, *, response_model: str | None = None, input_tokens: int, output_tokens: int,
             cached_tokens: int = 0, cache_write_tokens: int = 0) -> float | None:
        """USD for a call of the model the provider reported (or this driver's), or None when unknown.

        See :mod:`jixu.threads.pricing`: ``prices=``, then genai-prices when
        installed, then the fallback table, by exact name.
        """
        return call_cost((response_model, self.model), provider=self.provider,
                         api_url=getattr(self, "base_url", None), overrides=self._prices,
                         input_tokens=input_tokens, output_tokens=output_tokens, cached_tokens=cached_tokens,
                         cache_write_tokens=cache_write_tokens)

    def _usage(self, *, model: str | None, input_tokens: int, output_tokens: int, cached_tokens: int,
               cache_write_tokens: int = 0, reasoning_tokens: int = 0) -> Usage:
        cost = self.cost(response_model=model, input_tokens=input_tokens, output_tokens=output_tokens,
                         cached_tokens=cached_tokens, cache_write_tokens=cache_write_tokens)
        return Usage(input_tokens=input_tokens, output_tokens=output_tokens, cached_tokens=cached_tokens,
                     cost=cost, cache_write_tokens=cache_write_tokens, reasoning_tokens=reasoning_tokens)

    def redact(self, text: str) -> str:
        """``text`` without this driver's API key (or anything shaped like a provider key)."""
        if len(self._secret) >= 6:
            text = text.replace(self._secret, "[redacted]")
        return _SECRET.sub(r"\1...[redacted]", text)

    def _error(self, message: str, *, kind: str, indeterminate: bool, retry_after: float | None = None,
               **details: Any) -> ModelError:
        clean = {key: self.redact(value) if isinstance(value, str) else value for key, value in details.items()
                 if value is not None}
        return ModelError(self.redact(f"{self.provider}: {message}")[:2000], kind=kind,
                          indeterminate=indeterminate, retry_after=retry_after, provider=self.provider,
                          model=self.model, **clean)

    def _unreadable(self, message: str) -> ModelError:
        """An answer with a success status that cannot be read as one (not JSON, not the API's object, a chunk
        cut short): the provider may well have processed the call, so its outcome is in doubt (indeterminate)."""
        return self._error(message, kind="invalid_response", indeterminate=True)

    def _status_error(self, status: int, headers: Mapping[str, str] | None, body: object, fallback: str,
                      request_id: str | None) -> ModelError:
        error_type, code, message = error_fields(body)
        text = (message or fallback or "").strip()
        kind, indeterminate = classify_status(status, error_type, code, text)
        not_processed = None
        if status >= 400 and proves_not_processed(status, error_type, text):
            indeterminate, not_processed = False, True
        retry_after = retry_after_seconds(headers) if kind in ("rate_limit", "transient") else None
        if retry_after is None and kind == "rate_limit":
            retry_after = rate_limit_reset_seconds(headers)
        where = f"HTTP {status}" if status >= 400 else "an error event in the stream"
        return self._error(f"{kind.replace('_', ' ')} ({where}): {text[:500]}", kind=kind,
                           indeterminate=indeterminate, retry_after=retry_after,
                           status=status, error_type=error_type, error_code=code, request_id=request_id,
                           not_processed=not_processed)

    def _incomplete(self, detail: str) -> ModelError:
        return self._error(f"the response stream ended early ({detail}); the call may have been processed",
                           kind="transient", indeterminate=True)

    def _connection_error(self, error: BaseException, *, timeout: bool) -> ModelError:
        if never_connected(error):
            # No connection was made, so not one byte of the request left: the provider never saw it.
            return self._error(f"could not connect: {error}", kind="transient", indeterminate=False,
                               exception=type(error).__name__, not_processed=True)
        what = "timed out" if timeout else "lost the connection"
        return self._error(f"{what}: {error}", kind="transient", indeterminate=True,
                           exception=type(error).__name__)

    def _unexpected(self, error: BaseException) -> ModelError:
        """A failure the SDK did not wrap: a transport error (the connection broke) or anything else."""
        module = type(error).__module__.split(".")[0]
        if module in _TRANSPORT_MODULES or isinstance(error, OSError | EOFError):
            return self._connection_error(error, timeout="timeout" in type(error).__name__.lower())
        if isinstance(error, json.JSONDecodeError):  # the SDK read a success answer's body, announced as JSON
            return self._unreadable(f"the response is not JSON ({error})")
        return self._error(f"unexpected {type(error).__name__}: {error}", kind="transient", indeterminate=True,
                           exception=type(error).__name__)

    # --- the call ---------------------------------------------------------------------------------

    async def complete(self, request: ModelRequest) -> ModelResponse:
        """Call the model and return its assembled response.

        Raises :class:`~jixu.errors.ModelError` with ``kind`` (``rate_limit``,
        ``quota``, ``authentication``, ``transient``, ``invalid_request``,
        ``invalid_response``), ``indeterminate`` (whether the provider may have
        processed the call) and ``retry_after`` (seconds, from the provider).
        ``details["not_processed"]`` is True only when the error proves the
        provider never processed the request (no connection could be made, or
        it answered that it is overloaded): the errors a
        :class:`~jixu.threads.fallback.FallbackModel` fails over on.
        Streams when :attr:`stream` is set; a ``done`` signal ends every call.
        """
        emit = self._emitter(request)
        try:
            if self.stream:
                response = await self._streamed(request, emit)
            else:
                response = await self._whole(request)
        except ModelError as error:
            emit("done", {"ok": False, "error_kind": error.kind})
            raise
        except Exception as error:
            translated = self._translate(error)
            emit("done", {"ok": False, "error_kind": translated.kind})
            raise translated from None
        except BaseException:
            emit("done", {"ok": False, "error_kind": "cancelled"})
            raise
        emit("done", {"ok": True, "stop_reason": response.stop_reason})
        return response

    @abc.abstractmethod
    async def _whole(self, request: ModelRequest) -> ModelResponse:
        """One non-streamed call to the provider."""

    @abc.abstractmethod
    async def _streamed(self, request: ModelRequest, emit: Emit) -> ModelResponse:
        """One streamed call, emitting signals as deltas arrive."""

    @abc.abstractmethod
    def _translate(self, error: Exception) -> ModelError:
        """The provider SDK's exception as a typed :class:`ModelError`."""


_TRANSPORT_MODULES = frozenset({"httpx", "httpcore", "httpx2", "httpcore2", "h11", "anyio", "ssl"})


async def close_quietly(stream: object) -> None:
    """Close an SDK stream (sync or async ``close``), ignoring errors: the call's outcome is decided."""
    close = getattr(stream, "close", None)
    if close is None:
        return
    try:
        result = close()
        if inspect.isawaitable(result):
            await result
    except Exception:
        return


def resolve_setting(value: str | None, env: Mapping[str, str], variable: str) -> str | None:
    """``value`` if given, else the environment variable (empty counts as unset)."""
    if value is not None:
        if not isinstance(value, str):
            raise InvalidInput(f"{variable.lower()} must be a string", field=variable.lower())
        return value or None
    return env.get(variable) or None


def check_number(value: object, field_name: str, *, integer: bool = False, allow_none: bool = True,
                 minimum: float = 0.0, exclusive: bool = True) -> None:
    """Raise :class:`InvalidInput` unless ``value`` is a finite number above ``minimum`` (or None)."""
    if value is None and allow_none:
        return
    number = math.nan
    if isinstance(value, int) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, float) and not integer:
        number = value
    if not math.isfinite(number) or number < minimum or (exclusive and number == minimum):
        sign = ">" if exclusive else ">="
        raise InvalidInput(f"{field_name} must be {'an integer' if integer else 'a number'} {sign} {minimum:g}"
                           f"{' or None' if allow_none else ''}, got {value!r}", field=field_name)


__all__ = [
    "ERROR_STATUSES",
    "Emit",
    "INVALID_JSON_KEY",
    "MISSING_RESULT",
    "ProviderDriver",
    "Signal",
    "SignalCallback",
    "SignalKind",
    "SignalSource",
    "check_number",
    "classify_status",
    "close_quietly",
    "error_fields",
    "never_connected",
    "proves_not_processed",
    "is_error_status",
    "parse_arguments",
    "rate_limit_reset_seconds",
    "reasoning_items",
    "reasoning_of",
    "reasoning_record",
    "resolve_setting",
    "retry_after_seconds",
    "tool_name",
    "well_formed",
]
