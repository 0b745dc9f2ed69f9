"""Tools an agent can call, declared from type hints with ``@tool``.

A tool is a plain function (sync or async). Its parameters and return value
are described by a JSON Schema built from the annotations, deterministically,
so the same function always yields the same :meth:`Tool.contract`. Arguments
are validated against that schema before a call and stay plain JSON (they are
recorded in the ledger); the function receives Python values (``Enum``
members, dataclass instances, tuples, pydantic model instances) converted from
them. The return value must be plain JSON matching the return annotation, or
what the annotation declares (a model, a dataclass, an ``Enum`` member, a
tuple), which is turned into JSON.

Supported annotations: ``str``, ``int``, ``float``, ``bool``, ``None``,
``Any``, ``list[T]``, ``tuple[T, ...]``, ``dict[str, T]``, unions (``X | Y``,
``Optional[X]``), ``Literal[...]``, ``enum.Enum`` subclasses with ``str`` or
``int`` values, ``Annotated[T, "description"]``, ``NewType`` over a supported
type, dataclasses, ``TypedDict``, and pydantic models (``BaseModel``) and
pydantic dataclasses. A parameter annotated :class:`ToolContext` is injected by
the runtime and is not part of the schema.

Everything but the pydantic types is compiled here (``_build``), and its schema
is part of recorded contracts: it must not change (decision 0037). A pydantic
type is left to pydantic: its schema (``$ref`` into one ``$defs`` at the root of
the parameters, or of the result, schema), its validation (of the JSON, under
the model's own config) and its dump (``mode="json"``), which is what is
recorded and what a probe is asked with.

A tool whose arguments come with a JSON Schema of their own (an MCP server's
tool) is built with ``parameters=ArgumentsSchema(schema, problem)``: the
function takes them as ``**kwargs``.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import copy
import dataclasses
import enum
import inspect
import json
import math
import re
import sys
import threading
import types
import typing
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, Literal, TypeAlias, TypeVar, overload

from jixu.errors import InvalidInput, MalformedEvent, ToolDefinitionError, ToolInputError, ToolOutputError
from jixu.kernel.effects import mark_not_started
from jixu.kernel.shutdown import CallerTask
from jixu.ledger.encoding import VALUE_NESTING, canonical_text
from jixu.ledger.event import utf8_size

Semantics: TypeAlias = Literal["read_only", "idempotent", "unsafe"]
"""How safe it is to call a tool again: see SPEC section 3."""

_SEMANTICS: tuple[str, ...] = typing.get_args(Semantics)
_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_-]{0,63}")
_NONE_TYPE = type(None)


@dataclasses.dataclass(frozen=True, slots=True)
class ToolContext:
    """The identity of one tool call, injected into a parameter annotated ``ToolContext``."""

    effect_id: str
    idempotency_key: str
    attempt: int
    thread_id: str
    turn_id: str


class ToolError(Exception):
    """Raised by a tool to report a determinate failure (the outcome of the call is known).

    ``data`` must be plain JSON; it is recorded with the failure.
    """

    def __init__(self, message: str, *, code: str = "tool_error", data: Any = None) -> None:
        if type(code) is not str or not code:
            raise InvalidInput(f"ToolError code must be a non-empty string, got {code!r}", code_value=repr(code))
        if data is not None:
            canonical_text(data, path="data", max_nesting=VALUE_NESTING)
        super().__init__(message)
        self.message = str(message)
        self.code = code
        self.data = data

    def to_dict(self) -> dict[str, Any]:
        """``{"type": "tool_error", "code", "message", "data"}``, ready for JSON."""
        return {"type": "tool_error", "code": self.code, "message": self.message, "data": copy.deepcopy(self.data)}

    @classmethod
    def recorded(cls, error: object) -> ToolError:
        """The error a recorded determinate failure holds (:meth:`to_dict`'s output; anything else as its text),
        e.g. to tell a rerun's framework what the first run's did."""
        if not isinstance(error, dict):
            return cls(str(error))
        code = error.get("code")
        return cls(str(error.get("message")), code=code if isinstance(code, str) and code else "tool_error",
                   data=error.get("data"))


# --- probes ---------------------------------------------------------------------------

DEFAULT_PROBE_TIMEOUT = 30.0
"""Seconds a probe may take before its answer counts as "don't know"."""
MAX_PROBE_ANSWER_BYTES = 64 * 1024
"""A probe's found result, and its evidence, must each encode to at most this many bytes (they are recorded
in events); anything larger is answered "don't know"."""
MAX_PROBE_REASON_CHARS = 2000


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeQuery:
    """What a probe is asked about: one call of its tool whose outcome is unknown."""

    effect_id: str
    """The call's effect id (the tool saw it as ``ToolContext.effect_id``)."""
    idempotency_key: str
    """The key the call was made with (``ToolContext.idempotency_key``): what to search the outside system by."""
    args: dict[str, Any]
    """The call's validated arguments, as recorded (plain JSON)."""
    tool: str
    """The tool's name."""
    attempt: int
    """The attempt whose outcome is unknown (1 for an unsafe call)."""
    thread_id: str
    turn_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class Occurred:
    """The probe found the call's effect in the outside system.

    ``result`` stands for what the tool would have returned (it must match the
    tool's return annotation): the model is given it. ``evidence`` is what was
    found (plain JSON), recorded with the resolution.
    """

    result: Any = None
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class NotOccurred:
    """The probe searched the outside system and the call's effect is not there; ``evidence``: what it searched."""

    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class DontKnow:
    """The probe cannot tell (the outside system is unreachable, or its answer is ambiguous)."""

    reason: str
    evidence: dict[str, Any] = dataclasses.field(default_factory=dict)


ProbeAnswer: TypeAlias = Occurred | NotOccurred | DontKnow
"""What a probe returns."""
DEFINITE_ANSWERS: tuple[str, ...] = ("occurred", "not_occurred")
"""The recorded answers that settle a call (``dont_know`` leaves it to an operator)."""


def _json_problem(value: object, what: str) -> str | None:
    """Why ``value`` cannot be recorded as a probe's ``what`` (not plain JSON, or too large), or None."""
    try:
        text = canonical_text(value, path=what, max_nesting=VALUE_NESTING)
    except MalformedEvent as exc:
        return f"its {what} is not plain JSON: {exc.message}"
    if utf8_size(text) > MAX_PROBE_ANSWER_BYTES:
        return f"its {what} is over {MAX_PROBE_ANSWER_BYTES} bytes"
    return None


async def call_user_function(fn: Callable[[Any], Any], arg: Any, *, effect_id: str | None = None) -> Any:
    """``fn(arg)`` as user code is called: a coroutine function on the loop, a plain function in a worker
    thread (the loop's executor, so a blocking call stalls nothing else); an awaitable it returns is awaited.
    With ``effect_id``, a thread running ``fn`` counts as that call in flight (:func:`run_call_in_thread`)."""
    if inspect.iscoroutinefunction(fn):
        value = await fn(arg)
    else:
        value = await run_call_in_thread(effect_id, fn, arg)
    while inspect.isawaitable(value):
        value = await value
    return value


_R = TypeVar("_R")


class _ThreadedCall:
    """One call of an effect in a worker thread: it either starts, and ``ended`` is set when it returns, or is
    abandoned before it started (its waiter was cancelled first), and never runs."""

    __slots__ = ("abandoned", "ended", "lock", "started")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.started = self.abandoned = False
        self.ended = threading.Event()


_CALLS_IN_THREADS: dict[str, list[_ThreadedCall]] = {}
"""Effect id -> its calls running (or queued) in worker threads of this process."""
_CALLS_LOCK = threading.Lock()

CALL_IN_FLIGHT: ContextVar[str | None] = ContextVar("jixu_call_in_flight", default=None)
"""The effect id of the call whose code runs in this context (:meth:`Tool.invoke` sets it): work a
:class:`CallTrackingExecutor` is handed meanwhile counts as that call in flight."""


def _register(effect_id: str, started: bool = False) -> _ThreadedCall:
    call = _ThreadedCall()
    call.started = started
    with _CALLS_LOCK:
        _CALLS_IN_THREADS.setdefault(effect_id, []).append(call)
    return call


async def run_call_in_thread(effect_id: str | None, fn: Callable[..., _R], /, *args: Any, **kwargs: Any) -> _R:
    """``fn(*args, **kwargs)`` in a worker thread (``asyncio.to_thread``), as the call of ``effect_id``.

    A thread cannot be stopped: a timeout or a cancellation ends the waiting, while the call goes on and may still
    act. Until it returns, :func:`call_ended` waits: no probe of this process asks about the call, and no attempt
    of it starts again, while it can still act (a probe asked then answers ``not_occurred`` of a charge that lands
    a moment later)."""
    if effect_id is None:
        return await asyncio.to_thread(fn, *args, **kwargs)
    call = _register(effect_id)

    def run() -> _R:
        with call.lock:
            if call.abandoned:
                raise asyncio.CancelledError  # its waiter is gone and said it never ran
            call.started = True
        try:
            return fn(*args, **kwargs)
        finally:
            _end(effect_id, call)

    try:
        return await asyncio.to_thread(run)
    except BaseException as error:
        with call.lock:
            if not call.started:
                call.abandoned = True
        if call.abandoned:
            _end(effect_id, call)
            if isinstance(error, asyncio.CancelledError):  # it will never run: its receipt may say so
                mark_not_started(effect_id)
        raise


class CallTask(CallerTask):
    """An ``unsafe`` coroutine call run as a task of its own (:func:`run_call_past_its_timeout`), counted as the
    call of :attr:`effect_id` in flight until it ends.

    While its caller waits for it (``in_flight``), a loop's shutdown leaves it running, as it leaves its caller
    (the receipt is recorded first, decision 0036), and it is cancelled once the caller stopped waiting
    (``stop_requested``); after that, nothing keeps it from a cancellation."""

    def __init__(self, coroutine: Coroutine[Any, Any, Any], *, effect_id: str, thread_id: str, owner: object) -> None:
        super().__init__(coroutine, name=f"jixu-call {effect_id}")
        self.effect_id = effect_id
        self.thread_id = thread_id
        self.owner = owner
        """Who made the call (:data:`CALL_OWNER`): only its own stop stops it (:func:`stop_calls`)."""
        self.in_flight = 1

    def detach(self) -> None:
        """Its caller stopped waiting for it: a loop's shutdown may cancel it from now on."""
        self.in_flight = 0

    def stop(self) -> None:
        """Cancel it: what made the call stops (its caller no longer waits for it either)."""
        self.detach()
        self.cancel()


_CALL_TASKS: set[CallTask] = set()
"""The coroutine calls of this process that went on past their timeout, or still run within it."""
CALL_OWNER: ContextVar[object] = ContextVar("jixu_call_owner", default=None)
"""Who makes the calls of this context (a harness sets itself): what :func:`stop_calls` is asked to stop."""


async def run_call_past_its_timeout(effect_id: str, call: Coroutine[Any, Any, _R], timeout: float, *,
                                    thread_id: str = "") -> _R:
    """Await the coroutine ``call`` of ``effect_id`` for at most ``timeout`` seconds, run as a :class:`CallTask`.

    Past the timeout, :class:`TimeoutError`, and the call goes on, as a call in a thread does
    (:func:`run_call_in_thread`): cancelling it would not stop what it already sent (a payment system goes on with
    a request its caller gave up on), only what jixu could learn, and a probe asked at once would answer
    ``not_occurred`` of a charge that lands a moment later (only a tool with a probe runs so: without one, nothing
    would ask, and :meth:`Tool.invoke` cancels it at its timeout). Until it ends, :func:`call_ended` waits: no probe
    of this process asks about the call, no attempt of it starts again, no operator resolves it here
    (:func:`call_running`). Whatever stops the turn or run it belongs to stops it too: a cancelled waiter (here or
    in :func:`call_ended`: an interrupt, a drain, a cancelled block, a sibling's failure), :func:`stop_calls` of
    its owner (an interrupt, a drain, a durable run giving itself back, a harness's shutdown), a loop's
    shutdown."""
    record = _register(effect_id, started=True)
    task = CallTask(call, effect_id=effect_id, thread_id=thread_id, owner=CALL_OWNER.get())
    _CALL_TASKS.add(task)

    def ended(done: asyncio.Task[Any]) -> None:
        _CALL_TASKS.discard(task)
        _end(effect_id, record)
        if not done.cancelled():
            done.exception()  # retrieved: a call that failed after its waiter gave up is the probe's to find

    task.add_done_callback(ended)
    try:
        finished, _pending = await asyncio.wait({task}, timeout=timeout)
    except asyncio.CancelledError:
        task.stop()
        raise
    task.detach()
    if not finished:
        if task.stop_requested:  # the loop is shutting down: the receipt (unknown) is the caller's to record now
            task.cancel()
        raise TimeoutError(f"no answer within {timeout}s; the call goes on")
    result: _R = task.result()
    return result


async def stop_calls(owner: object, *, thread_id: str | None = None, effect_ids: Iterable[str] | None = None) -> None:
    """Cancel this loop's coroutine calls gone on past their timeout that ``owner`` made (of ``thread_id`` or of
    ``effect_ids`` only, when given), and wait until they ended: what made them stops (a turn, a run, a harness).
    Another harness's calls, of the same thread too, are not touched."""
    wanted = None if effect_ids is None else set(effect_ids)
    loop = asyncio.get_running_loop()
    tasks = [task for task in list(_CALL_TASKS) if task.get_loop() is loop and task.owner is owner
             and (thread_id is None or task.thread_id == thread_id)
             and (wanted is None or task.effect_id in wanted)]
    for task in tasks:
        task.stop()
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)


def call_running(effect_id: str) -> bool:
    """Whether a call of ``effect_id`` still runs in this process (in a worker thread, or a coroutine gone on past
    its timeout): an operator's resolution of it now could be contradicted by what it still does."""
    with _CALLS_LOCK:
        return any(not call.ended.is_set() for call in _CALLS_IN_THREADS.get(effect_id, ()))


@contextlib.contextmanager
def running_in_this_thread(effect_id: str) -> Iterator[None]:
    """Count the code in this block, run in a thread jixu did not start (a framework's own worker thread), as the
    call of ``effect_id`` in flight, as :func:`run_call_in_thread` counts its own threads."""
    call = _register(effect_id, started=True)
    try:
        yield
    finally:
        _end(effect_id, call)


class CallTrackingExecutor(ThreadPoolExecutor):
    """A thread pool whose work, handed to it while a call's code runs (:data:`CALL_IN_FLIGHT`), counts as that
    call in flight until it returns (or is cancelled before it started): a framework's own ``asyncio.to_thread``
    of a sync tool (openai-agents, pydantic-ai) is seen as the tool's call. :meth:`Tool.invoke` makes one the
    default executor of a loop that has none yet."""

    def submit(self, fn: Callable[..., _R], /, *args: Any, **kwargs: Any) -> Future[_R]:
        effect_id = CALL_IN_FLIGHT.get()
        if effect_id is None:
            return super().submit(fn, *args, **kwargs)
        call = _register(effect_id, started=True)

        def tracked() -> _R:
            try:
                return fn(*args, **kwargs)
            finally:
                _end(effect_id, call)

        future = super().submit(tracked)
        future.add_done_callback(lambda done: _end(effect_id, call) if done.cancelled() else None)
        return future


def track_calls_on(loop: asyncio.AbstractEventLoop) -> None:
    """Make a :class:`CallTrackingExecutor` the default executor of ``loop`` when it has none yet (an executor
    already set, such as a worker's, is kept)."""
    if getattr(loop, "_default_executor", False) is None:  # CPython's loops keep it there until first used
        loop.set_default_executor(CallTrackingExecutor(thread_name_prefix="jixu-call"))


def _end(effect_id: str, call: _ThreadedCall) -> None:
    with _CALLS_LOCK:
        calls = _CALLS_IN_THREADS.get(effect_id)
        if calls is not None and call in calls:
            calls.remove(call)
            if not calls:
                del _CALLS_IN_THREADS[effect_id]
        due = [key for key, (effects, _give_back) in _CLAIMS_HELD.items()
               if _CALLS_IN_THREADS.keys().isdisjoint(effects)]
        releases = [_CLAIMS_HELD.pop(key)[1] for key in due]
    call.ended.set()
    for give_back in releases:  # here, in the thread (or task) whose call ended: whatever the event loop does
        give_back()


_CLAIMS_HELD: dict[str, tuple[frozenset[str], Callable[[], None]]] = {}
"""Lease key -> (the effect ids of calls still running here, what gives the claim back once they ended)."""


def hold_claim_while_calls_run(key: str, effect_ids: Iterable[str], give_back: Callable[[], None]) -> bool:
    """Keep the claim ``key`` held while a call of ``effect_ids`` runs in this process, then run ``give_back``
    (where the last of them ends: no event loop is needed then); False, nothing kept, when none runs now.

    A call in a thread cannot be stopped (decision 0058): a claim given back meanwhile is nobody's, and an
    operator's ``not_occurred`` accepted then is contradicted when the call acts (decision 0065)."""
    with _CALLS_LOCK:
        running = frozenset(effect_id for effect_id in effect_ids if effect_id in _CALLS_IN_THREADS)
        if not running:
            return False
        _CLAIMS_HELD[key] = (running, give_back)
    return True


def claim_taken_again(key: str) -> None:
    """The claim ``key`` was taken again in this process: a give-back waiting for earlier calls must not take it
    from the loop that holds it now (its own end gives it back, under the same rule)."""
    with _CALLS_LOCK:
        _CLAIMS_HELD.pop(key, None)


def give_back_held_claims() -> int:
    """Give back every claim held for calls still running: the process ends now, and its calls with it. How
    many."""
    with _CALLS_LOCK:
        releases = [give_back for _effects, give_back in _CLAIMS_HELD.values()]
        _CLAIMS_HELD.clear()
    for give_back in releases:
        give_back()
    return len(releases)


CALL_ENDED_POLL_S = 0.02
"""How often :func:`call_ended` looks whether a call's thread returned."""


async def call_ended(effect_id: str) -> None:
    """Return once no call of ``effect_id`` runs in this process: in a worker thread (:func:`run_call_in_thread`)
    or as a coroutine gone on past its timeout (:func:`run_call_past_its_timeout`). Cancelled (the turn or run
    stops), it cancels such a coroutine of ``effect_id`` (a thread cannot be stopped)."""
    try:
        while True:
            with _CALLS_LOCK:
                calls = list(_CALLS_IN_THREADS.get(effect_id, ()))
            if all(call.ended.is_set() for call in calls):
                return
            await asyncio.sleep(CALL_ENDED_POLL_S)
    except asyncio.CancelledError:
        for task in list(_CALL_TASKS):
            if task.effect_id == effect_id:
                task.stop()
        raise


def _dont_know(reason: str, evidence: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"answer": "dont_know", "reason": reason[:MAX_PROBE_REASON_CHARS], "evidence": evidence or {}}


# --- compiled annotations -------------------------------------------------------------


class _Mismatch(Exception):
    """A value does not match a schema; ``path`` names where."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


class _Unsupported(Exception):
    """An annotation or default cannot be turned into a schema."""


class _NotJSON(Exception):
    """A Python value has no JSON form under an annotation."""


class _NoDefault:
    """Marks a field without a JSON default."""

    def __repr__(self) -> str:
        return "<no default>"


_NO_DEFAULT: Any = _NoDefault()


def _kind(value: object) -> str:
    """The JSON type name of ``value`` (or its Python type name when it is not JSON)."""
    kind = type(value)
    names: dict[type, str] = {
        _NONE_TYPE: "null", bool: "boolean", int: "integer", float: "number",
        str: "string", list: "array", dict: "object",
    }
    return names.get(kind, kind.__name__)


def _got(value: object) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{_kind(value)} {text}"


def _child(path: str, key: object) -> str:
    if isinstance(key, str) and key.isidentifier():
        return f"{path}.{key}"
    text = json.dumps(key, ensure_ascii=False) if isinstance(key, str) else repr(key)
    return f"{path}[{text}]"


def _copy_json(value: Any) -> Any:
    if type(value) is dict:
        return {key: _copy_json(item) for key, item in value.items()}
    if type(value) is list:
        return [_copy_json(item) for item in value]
    return value


def _json_literal(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


class _Node(abc.ABC):
    """A compiled annotation: its JSON Schema, a validator and converters."""

    converts = False
    """Whether :meth:`to_python` changes anything (Enum members, dataclasses, tuples, models)."""
    normalizes = False
    """Whether :meth:`check` may return a value that differs from the one checked (a model's dump)."""

    def parts(self) -> tuple[_Node, ...]:
        """The nodes this one is made of (to find the models of a schema document)."""
        return ()

    @abc.abstractmethod
    def schema(self) -> dict[str, Any]:
        """The JSON Schema of what this node accepts."""

    @abc.abstractmethod
    def describe(self) -> str:
        """What this node accepts, in words (for error messages)."""

    @abc.abstractmethod
    def same_kind(self, value: object) -> bool:
        """Whether ``value`` has the right outer JSON type (used to pick the error to report)."""

    @abc.abstractmethod
    def check(self, value: object, path: str) -> Any:
        """Return a plain-JSON copy of ``value`` or raise :class:`_Mismatch`."""

    def to_python(self, value: Any) -> Any:
        """Convert a checked JSON value into what the function receives."""
        return value

    def to_json(self, value: object) -> Any:
        """Convert a Python value (a default) into its JSON form, or raise :class:`_NotJSON`."""
        return value

    def _fail(self, value: object, path: str) -> _Mismatch:
        return _Mismatch(path, f"{path}: expected {self.describe()}, got {_got(value)}")


class _AnyNode(_Node):
    def schema(self) -> dict[str, Any]:
        return {}

    def describe(self) -> str:
        return "any JSON value"

    def same_kind(self, value: object) -> bool:
        return True

    def check(self, value: object, path: str) -> Any:
        try:
            canonical_text(value, path=path, max_nesting=VALUE_NESTING)
        except MalformedEvent as exc:
            raise _Mismatch(str(exc.details.get("path", path)), exc.message) from None
        return _copy_json(value)


class _ScalarNode(_Node):
    _TYPES: typing.ClassVar[dict[str, type]] = {
        "string": str, "integer": int, "boolean": bool, "null": _NONE_TYPE,
    }

    def __init__(self, json_type: str) -> None:
        self.json_type = json_type

    def schema(self) -> dict[str, Any]:
        return {"type": self.json_type}

    def describe(self) -> str:
        return self.json_type

    def same_kind(self, value: object) -> bool:
        if self.json_type == "number":
            return type(value) in (int, float)
        return type(value) is self._TYPES[self.json_type]

    def check(self, value: object, path: str) -> Any:
        if not self.same_kind(value):
            raise self._fail(value, path)
        if type(value) is float and not math.isfinite(value):
            raise _Mismatch(path, f"{path}: expected a finite number, got {value!r} (NaN and Infinity are not JSON)")
        return value


def _enum_type(values: list[Any]) -> str | None:
    kinds = {_kind(value) for value in values}
    return kinds.pop() if len(kinds) == 1 else None


class _LiteralNode(_Node):
    def __init__(self, values: list[Any]) -> None:
        self.values = values

    def schema(self) -> dict[str, Any]:
        result: dict[str, Any] = {"enum": list(self.values)}
        json_type = _enum_type(self.values)
        if json_type is not None:
            result["type"] = json_type
        return result

    def describe(self) -> str:
        return "one of " + ", ".join(_json_literal(value) for value in self.values)

    def same_kind(self, value: object) -> bool:
        return any(type(value) is type(option) for option in self.values)

    def check(self, value: object, path: str) -> Any:
        if any(type(value) is type(option) and value == option for option in self.values):
            return value
        raise self._fail(value, path)


class _EnumNode(_Node):
    converts = True

    def __init__(self, cls: type[enum.Enum]) -> None:
        self.cls = cls
        self.values = [member.value for member in cls]
        self.value_type = type(self.values[0])

    def schema(self) -> dict[str, Any]:
        return {"type": _kind(self.values[0]), "enum": list(self.values)}

    def describe(self) -> str:
        return f"{self.cls.__name__} (one of {', '.join(_json_literal(value) for value in self.values)})"

    def same_kind(self, value: object) -> bool:
        return type(value) is self.value_type or isinstance(value, self.cls)

    def check(self, value: object, path: str) -> Any:
        if isinstance(value, self.cls):
            return value.value
        if type(value) is self.value_type and value in self.values:
            return value
        raise self._fail(value, path)

    def to_python(self, value: Any) -> Any:
        return self.cls(value)

    def to_json(self, value: object) -> Any:
        return value.value if isinstance(value, self.cls) else value


class _ArrayNode(_Node):
    def __init__(self, item: _Node, *, as_tuple: bool) -> None:
        self.item = item
        self.as_tuple = as_tuple
        self.converts = as_tuple or item.converts
        self.normalizes = item.normalizes

    def parts(self) -> tuple[_Node, ...]:
        return (self.item,)

    def schema(self) -> dict[str, Any]:
        return {"type": "array", "items": self.item.schema()}

    def describe(self) -> str:
        return "array"

    def same_kind(self, value: object) -> bool:
        return type(value) is list

    def check(self, value: object, path: str) -> Any:
        if type(value) is not list:
            raise self._fail(value, path)
        return [self.item.check(item, f"{path}[{index}]") for index, item in enumerate(value)]

    def to_python(self, value: Any) -> Any:
        items = [self.item.to_python(item) for item in value] if self.item.converts else list(value)
        return tuple(items) if self.as_tuple else items

    def to_json(self, value: object) -> Any:
        if type(value) is list or (self.as_tuple and type(value) is tuple):
            return [self.item.to_json(item) for item in typing.cast("list[Any]", value)]
        raise _NotJSON


class _MapNode(_Node):
    def __init__(self, item: _Node) -> None:
        self.item = item
        self.converts = item.converts
        self.normalizes = item.normalizes

    def parts(self) -> tuple[_Node, ...]:
        return (self.item,)

    def schema(self) -> dict[str, Any]:
        return {"type": "object", "additionalProperties": self.item.schema()}

    def describe(self) -> str:
        return "object"

    def same_kind(self, value: object) -> bool:
        return type(value) is dict

    def check(self, value: object, path: str) -> Any:
        if type(value) is not dict:
            raise self._fail(value, path)
        result: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _Mismatch(path, f"{path}: object keys must be strings, got {_got(key)}")
            result[key] = self.item.check(item, _child(path, key))
        return result

    def to_python(self, value: Any) -> Any:
        if not self.item.converts:
            return dict(value)
        return {key: self.item.to_python(item) for key, item in value.items()}

    def to_json(self, value: object) -> Any:
        if type(value) is not dict:
            raise _NotJSON
        return {key: self.item.to_json(item) for key, item in value.items()}


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    """One property of an object schema (a parameter, dataclass field or TypedDict key)."""

    name: str
    node: _Node
    required: bool
    default: Any = _NO_DEFAULT

    def schema(self) -> dict[str, Any]:
        result = self.node.schema()
        if self.default is not _NO_DEFAULT:
            result["default"] = _copy_json(self.default)
        return result


class _ObjectNode(_Node):
    """A closed object: tool parameters, a dataclass or a TypedDict."""

    def __init__(self, label: str, fields: list[_Field], factory: type | None = None) -> None:
        self.label = label
        self.fields = {field.name: field for field in fields}
        self.factory = factory
        self.converts = factory is not None or any(field.node.converts for field in fields)
        self.normalizes = any(field.node.normalizes for field in fields)

    def parts(self) -> tuple[_Node, ...]:
        return tuple(field.node for field in self.fields.values())

    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "properties": {name: field.schema() for name, field in self.fields.items()},
            "required": [name for name, field in self.fields.items() if field.required],
            "additionalProperties": False,
        }

    def describe(self) -> str:
        return f"{self.label} object"

    def same_kind(self, value: object) -> bool:
        return type(value) is dict

    def check(self, value: object, path: str) -> Any:
        if type(value) is not dict:
            raise self._fail(value, path)
        for key in value:
            if type(key) is not str:
                raise _Mismatch(path, f"{path}: object keys must be strings, got {_got(key)}")
            if key not in self.fields:
                known = ", ".join(self.fields) or "nothing"
                raise _Mismatch(_child(path, key), f"{_child(path, key)}: unexpected key {key!r}; "
                                                   f"{self.label} accepts: {known}")
        result: dict[str, Any] = {}
        for name, field in self.fields.items():
            where = _child(path, name)
            if name in value:
                result[name] = field.node.check(value[name], where)
            elif field.required:
                raise _Mismatch(where, f"{where}: missing required key {name!r} of {self.label}")
            elif field.default is not _NO_DEFAULT:
                result[name] = _copy_json(field.default)
        return result

    def to_python(self, value: Any) -> Any:
        converted = {name: self.fields[name].node.to_python(item) for name, item in value.items()}
        return self.factory(**converted) if self.factory is not None else converted

    def to_json(self, value: object) -> Any:
        if self.factory is not None and isinstance(value, self.factory):
            return {name: field.node.to_json(getattr(value, name)) for name, field in self.fields.items()}
        if type(value) is dict:
            return {key: self.fields[key].node.to_json(item) if key in self.fields else item
                    for key, item in value.items()}
        raise _NotJSON


class _UnionNode(_Node):
    def __init__(self, options: list[_Node]) -> None:
        self.options = options
        self.converts = any(option.converts for option in options)
        self.normalizes = any(option.normalizes for option in options)

    def parts(self) -> tuple[_Node, ...]:
        return tuple(self.options)

    def schema(self) -> dict[str, Any]:
        return {"anyOf": [option.schema() for option in self.options]}

    def describe(self) -> str:
        return " or ".join(option.describe() for option in self.options)

    def same_kind(self, value: object) -> bool:
        return any(option.same_kind(value) for option in self.options)

    def check(self, value: object, path: str) -> Any:
        for option in self.options:
            try:
                return option.check(value, path)
            except _Mismatch:
                continue
        candidates = [option for option in self.options if option.same_kind(value)]
        if len(candidates) == 1:
            candidates[0].check(value, path)  # raises the more precise, nested mismatch
        raise self._fail(value, path)

    def to_python(self, value: Any) -> Any:
        for option in self.options:
            try:
                option.check(value, "$")
            except _Mismatch:
                continue
            return option.to_python(value)
        return value  # unreachable for checked values

    def to_json(self, value: object) -> Any:
        for option in self.options:
            try:
                converted = option.to_json(value)
                option.check(converted, "$")
            except (_NotJSON, _Mismatch):
                continue
            return converted
        raise _NotJSON


class _DescribedNode(_Node):
    """``Annotated[T, "text"]``: T's schema plus a ``description``."""

    def __init__(self, inner: _Node, text: str) -> None:
        self.inner = inner
        self.text = text
        self.converts = inner.converts
        self.normalizes = inner.normalizes

    def parts(self) -> tuple[_Node, ...]:
        return (self.inner,)

    def schema(self) -> dict[str, Any]:
        return {**self.inner.schema(), "description": self.text}

    def describe(self) -> str:
        return self.inner.describe()

    def same_kind(self, value: object) -> bool:
        return self.inner.same_kind(value)

    def check(self, value: object, path: str) -> Any:
        return self.inner.check(value, path)

    def to_python(self, value: Any) -> Any:
        return self.inner.to_python(value)

    def to_json(self, value: object) -> Any:
        return self.inner.to_json(value)


@dataclasses.dataclass(frozen=True, slots=True)
class ArgumentsSchema:
    """A tool's arguments described by a JSON Schema given as it is, not built from type hints (an MCP tool's
    input schema): ``schema`` is what the model is shown and the contract records; ``problem(args)`` checks
    plain-JSON ``args`` and returns what is wrong (a path below ``args``, e.g. ``("items", 2)``, and a
    message), or None when they are valid. Defaults are not filled in."""

    schema: dict[str, Any]
    problem: Callable[[dict[str, Any]], tuple[Sequence[str | int], str] | None]


class _SchemaNode(_Node):
    """Arguments checked by an :class:`ArgumentsSchema`; ``reserved`` is the name the ToolContext is passed as."""

    def __init__(self, arguments: ArgumentsSchema, reserved: str | None) -> None:
        self.arguments = arguments
        self.reserved = reserved
        self._schema = _copy_json(arguments.schema)

    def schema(self) -> dict[str, Any]:
        return typing.cast("dict[str, Any]", _copy_json(self._schema))

    def describe(self) -> str:
        return "an object matching the tool's JSON Schema"

    def same_kind(self, value: object) -> bool:
        return type(value) is dict

    def check(self, value: object, path: str) -> Any:
        if type(value) is not dict:
            raise self._fail(value, path)
        checked = _AnyNode().check(value, path)
        if self.reserved is not None and self.reserved in checked:
            where = _child(path, self.reserved)
            raise _Mismatch(where, f"{where}: {self.reserved!r} is reserved for the call's ToolContext")
        found = self.arguments.problem(checked)
        if found is None:
            return checked
        where = path
        for key in found[0]:
            where = f"{where}[{key}]" if type(key) is int else _child(where, key)
        raise _Mismatch(where, f"{where}: {found[1]}")


class _ModelNode(_Node):
    """A pydantic model (``BaseModel``) or pydantic dataclass: pydantic builds its schema, validates and dumps it.

    A value is validated as the JSON it is (``validate_json``, under the model's own config: strict or lax,
    extra keys ignored or forbidden) and kept as the model's JSON dump (``mode="json"``: defaults filled in,
    values normalized), which is what the ledger records; the function receives the model instance.
    """

    converts = True
    normalizes = True

    def __init__(self, cls: type) -> None:
        from pydantic import TypeAdapter

        self.cls = cls
        try:
            self.adapter: TypeAdapter[Any] = TypeAdapter(cls)
            self.adapter.json_schema()  # fails here, naming the parameter, if pydantic has no schema for a field
            dumped = self.adapter.json_schema(mode="serialization")
        except Exception as exc:
            raise _Unsupported(f"pydantic cannot build a JSON Schema for {cls.__qualname__}: "
                               f"{_pydantic_message(exc)}") from None
        self.computed = _has_read_only(dumped)
        """Whether a dump carries computed fields (read-only in the serialization schema), which a model that
        forbids extra keys refuses: then a dump is validated again before it is kept (see :meth:`check`)."""
        self.in_document: dict[str, Any] | None = None
        """This model's schema inside the document being built (a ``$ref`` into its ``$defs``): see
        :func:`_document`, the only place that sets it."""

    def schema(self) -> dict[str, Any]:
        if self.in_document is None:
            raise RuntimeError(f"the schema of {self.cls.__qualname__} is only known inside a document")
        return copy.deepcopy(self.in_document)

    def describe(self) -> str:
        return f"{self.cls.__qualname__} object"

    def same_kind(self, value: object) -> bool:
        from pydantic import RootModel

        return issubclass(self.cls, RootModel) or type(value) is dict

    def check(self, value: object, path: str) -> Any:
        from pydantic import ValidationError

        try:
            text = canonical_text(value, path=path, max_nesting=VALUE_NESTING)
        except MalformedEvent as exc:
            raise _Mismatch(str(exc.details.get("path", path)), exc.message) from None
        try:
            instance = self.adapter.validate_json(text)
        except ValidationError as exc:
            raise _validation_mismatch(exc, value, path) from None
        try:
            dumped = self._dump(instance)
        except _NotJSON as exc:
            raise _Mismatch(path, f"{path}: {exc}") from None
        if self.computed:
            # Canonical arguments are validated again (by invoke, a probe, a revision check): a dump that does
            # not validate must be refused here, before dispatch, not later as a call whose outcome is unknown.
            try:
                self.adapter.validate_json(canonical_text(dumped))
            except ValidationError as exc:
                raise _Mismatch(path, f"{path}: the JSON dump of this {self.cls.__qualname__} does not validate "
                                      f"as one again (a computed field where extra keys are forbidden?): "
                                      f"{_validation_mismatch(exc, dumped, path).message}") from None
        return dumped

    def to_python(self, value: Any) -> Any:
        return self.adapter.validate_json(canonical_text(value))

    def to_json(self, value: object) -> Any:
        return self._dump(value) if isinstance(value, self.cls) else value

    def _dump(self, instance: object) -> Any:
        """The JSON dump of an instance, or :class:`_NotJSON` saying why it has none."""
        from pydantic_core import PydanticSerializationError

        try:
            dumped = self.adapter.dump_python(instance, mode="json")
            canonical_text(dumped, path="dump", max_nesting=VALUE_NESTING)
        except (PydanticSerializationError, MalformedEvent) as exc:
            raise _NotJSON(f"the JSON dump of this {self.cls.__qualname__} is not plain JSON: {exc}") from None
        return dumped


_MAX_PROBLEMS = 5
"""A failed model validation names at most this many problems (and how many more there are)."""


def _pydantic_message(exc: Exception) -> str:
    """``exc``'s message without the link pydantic appends to it."""
    return str(exc).split("\n\nFor further information visit", 1)[0].strip()


def _validation_mismatch(error: Any, value: object, path: str) -> _Mismatch:
    """A pydantic ``ValidationError`` of ``value`` as a mismatch: its first problems, each with its path."""
    problems = error.errors(include_url=False)
    located = [_problem(problem, value, path) for problem in problems[:_MAX_PROBLEMS]]
    message = "; ".join(text for _, text in located)
    if len(problems) > _MAX_PROBLEMS:
        message += f"; and {len(problems) - _MAX_PROBLEMS} more"
    return _Mismatch(located[0][0] if located else path, message or f"{path}: {error}")


def _problem(problem: Any, value: object, path: str) -> tuple[str, str]:
    """``(path, message)`` of one pydantic error. Its ``loc`` is followed through ``value`` as far as the value
    goes: the rest are pydantic's names for union branches and validators, not keys of the arguments."""
    loc: tuple[int | str, ...] = problem["loc"]
    kind: str = problem["type"]
    where, current = path, value
    for index, key in enumerate(loc):
        if type(current) is dict and isinstance(key, str) and key in current:
            where, current = _child(where, key), current[key]
        elif type(current) is list and type(key) is int and 0 <= key < len(current):
            where, current = f"{where}[{key}]", current[key]
        elif kind == "missing" and index == len(loc) - 1 and isinstance(key, str):
            return _child(where, key), f"{_child(where, key)}: missing required key {key!r}"
        else:
            break
    if kind == "extra_forbidden" and loc:
        return where, f"{where}: unexpected key {loc[-1]!r}"
    return where, f"{where}: {problem['msg']}, got {_got(problem['input'])}"


def _has_read_only(schema: object) -> bool:
    if isinstance(schema, dict):
        return schema.get("readOnly") is True or any(_has_read_only(value) for value in schema.values())
    return isinstance(schema, list) and any(_has_read_only(value) for value in schema)


def _is_pydantic_type(tp: object) -> bool:
    """Whether ``tp`` is a pydantic model or pydantic dataclass. pydantic is only imported when something else
    imported it already: no class can be a model before, and a tool module without models pays nothing."""
    if "pydantic" not in sys.modules or not isinstance(tp, type):
        return False
    from pydantic import BaseModel
    from pydantic.dataclasses import is_pydantic_dataclass

    return issubclass(tp, BaseModel) or is_pydantic_dataclass(tp)


def _walk(node: _Node) -> typing.Iterator[_Node]:
    yield node
    for part in node.parts():
        yield from _walk(part)


def _document(node: _Node, mode: Literal["validation", "serialization"]) -> dict[str, Any]:
    """``node``'s JSON Schema as a document of its own: the same as :meth:`_Node.schema` without models (the
    schema of a plain annotation is never touched), else with one ``$defs`` at its root that every model in it
    refers to, generated by pydantic in one pass (so two models of the same name are told apart)."""
    models = [part for part in _walk(node) if isinstance(part, _ModelNode)]
    if not models:
        return node.schema()
    from pydantic import TypeAdapter

    try:
        refs, definitions = TypeAdapter.json_schemas([(index, mode, model.adapter) for index, model in
                                                      enumerate(models)], ref_template="#/$defs/{model}")
    except Exception as exc:
        raise _Unsupported(f"pydantic cannot build the JSON Schema: {_pydantic_message(exc)}") from None
    for index, model in enumerate(models):
        model.in_document = dict(refs[(index, mode)])
    schema = node.schema()
    if definitions.get("$defs"):
        schema["$defs"] = definitions["$defs"]
    try:
        canonical_text(schema, path="schema", max_nesting=VALUE_NESTING)
    except MalformedEvent as exc:
        raise _Unsupported(f"the JSON Schema pydantic built is not plain JSON: {exc.message}") from None
    return schema


_SUPPORTED = ("str, int, float, bool, None, Any, list[T], tuple[T, ...], dict[str, T], unions, Literal[...], "
              "Enum (str or int values), Annotated[T, 'description'], NewType, dataclasses, TypedDict, "
              "pydantic models and pydantic dataclasses")


def _type_name(tp: object) -> str:
    if isinstance(tp, type):
        return tp.__qualname__
    return repr(tp).replace("typing.", "")


def _hints(owner: object) -> dict[str, Any]:
    try:
        return typing.get_type_hints(owner, include_extras=True)
    except Exception as exc:
        raise _Unsupported(f"cannot resolve the type hints of {_type_name(owner)}: {exc!r}") from exc


def _json_default(node: _Node, value: object) -> Any:
    """The JSON form of a default, or ``_NO_DEFAULT`` when it has none; raise if it contradicts the type."""
    try:
        converted = node.to_json(value)
        canonical_text(converted)
    except (_NotJSON, MalformedEvent):
        return _NO_DEFAULT
    try:
        return node.check(converted, "default")
    except _Mismatch as exc:
        raise _Unsupported(f"the default {value!r} does not match the annotation ({exc.message})") from None


def _build(tp: Any, seen: tuple[type, ...] = ()) -> _Node:
    """Compile an annotation into a node, or raise :class:`_Unsupported`."""
    if tp is Any:
        return _AnyNode()
    if tp is None or tp is _NONE_TYPE:
        return _ScalarNode("null")
    scalars: dict[Any, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if tp in scalars:
        return _ScalarNode(scalars[tp])
    if tp is ToolContext:
        raise _Unsupported("ToolContext can only annotate a whole parameter (the runtime injects it)")
    if isinstance(tp, typing.NewType):
        return _build(tp.__supertype__, seen)
    if tp is list:
        return _ArrayNode(_AnyNode(), as_tuple=False)
    if tp is dict:
        return _MapNode(_AnyNode())
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Annotated:
        texts = tp.__metadata__
        if not all(isinstance(text, str) for text in texts):
            raise _Unsupported(f"Annotated metadata must be description strings, got {_type_name(tp)}")
        return _DescribedNode(_build(args[0], seen), " ".join(texts))
    if origin is typing.Union or origin is types.UnionType:
        return _UnionNode([_build(arg, seen) for arg in args])
    if origin is Literal:
        for value in args:
            if type(value) not in (str, int, bool, _NONE_TYPE):
                raise _Unsupported(f"Literal values must be str, int, bool or None, got {value!r}")
        return _LiteralNode(list(args))
    if origin is list:
        return _ArrayNode(_build(args[0], seen), as_tuple=False)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return _ArrayNode(_build(args[0], seen), as_tuple=True)
        raise _Unsupported(f"{_type_name(tp)} is not supported; use tuple[T, ...] or list[T]")
    if origin is dict:
        if args[0] is not str:
            raise _Unsupported(f"{_type_name(tp)} is not supported; JSON object keys are strings: use dict[str, T]")
        return _MapNode(_build(args[1], seen))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return _enum_node(tp)
    if _is_pydantic_type(tp):
        return _ModelNode(tp)
    if typing.is_typeddict(tp):
        return _typeddict_node(tp, seen)
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        return _dataclass_node(tp, seen)
    raise _Unsupported(f"{_type_name(tp)} is not supported; supported annotations: {_SUPPORTED}")


def _enum_node(cls: type[enum.Enum]) -> _Node:
    values = [member.value for member in cls]
    if not values:
        raise _Unsupported(f"enum {cls.__qualname__} has no members")
    kinds = {type(value) for value in values}
    if len(kinds) != 1 or kinds.pop() not in (str, int):
        raise _Unsupported(f"enum {cls.__qualname__} must have values that are all str or all int")
    return _EnumNode(cls)


def _enter(cls: type, seen: tuple[type, ...]) -> tuple[type, ...]:
    if cls in seen:
        raise _Unsupported(f"{cls.__qualname__} refers to itself; recursive types are not supported")
    return (*seen, cls)


def _typeddict_node(cls: type, seen: tuple[type, ...]) -> _Node:
    inner = _enter(cls, seen)
    required_keys: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
    fields: list[_Field] = []
    for name, declared in _hints(cls).items():
        # The wrappers win over __required_keys__, which misses them in string annotations (PEP 563).
        hint, required = declared, name in required_keys
        while typing.get_origin(hint) in (typing.Required, typing.NotRequired):
            required = typing.get_origin(hint) is typing.Required
            hint = typing.get_args(hint)[0]
        try:
            node = _build(hint, inner)
        except _Unsupported as exc:
            raise _Unsupported(f"{cls.__qualname__}.{name}: {exc}") from None
        fields.append(_Field(name, node, required))
    return _ObjectNode(cls.__qualname__, fields)


def _dataclass_node(cls: type, seen: tuple[type, ...]) -> _Node:
    inner = _enter(cls, seen)
    hints = _hints(cls)
    fields: list[_Field] = []
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        try:
            node = _build(hints[field.name], inner)
            default = _NO_DEFAULT
            if field.default is not dataclasses.MISSING:
                default = _json_default(node, field.default)
        except _Unsupported as exc:
            raise _Unsupported(f"{cls.__qualname__}.{field.name}: {exc}") from None
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        fields.append(_Field(field.name, node, required, default))
    return _ObjectNode(cls.__qualname__, fields, factory=cls)


def _is_context(hint: Any) -> bool:
    if hint is ToolContext:
        return True
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        return set(typing.get_args(hint)) == {ToolContext, _NONE_TYPE}
    return False


# --- tools ----------------------------------------------------------------------------


class Tool:
    """A function an agent can call, with its JSON Schemas and declared semantics.

    Build one with :func:`tool`. Calling the object calls the function directly.
    """

    __slots__ = (
        "_ctx_name", "_description", "_fn", "_is_async", "_name", "_parameters", "_params", "_probe",
        "_probe_timeout", "_requires_approval", "_returns", "_returns_schema", "_semantics", "_timeout",
    )
    _ctx_name: str | None
    _description: str
    _fn: Callable[..., Any]
    _is_async: bool
    _name: str
    _parameters: dict[str, Any]
    _params: _ObjectNode | _SchemaNode
    _probe: Callable[[ProbeQuery], Any] | None
    _probe_timeout: float
    _requires_approval: bool
    _returns: _Node
    _returns_schema: dict[str, Any]
    _semantics: Semantics
    _timeout: float | None

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        semantics: Semantics = "unsafe",
        requires_approval: bool = False,
        timeout: float | None = None,
        probe: Callable[[ProbeQuery], Any] | None = None,
        probe_timeout: float | None = None,
        parameters: ArgumentsSchema | None = None,
    ) -> None:
        """Compile ``fn`` into a tool; raises :class:`ToolDefinitionError` when it cannot be one.

        With ``parameters``, the arguments are described and checked by it, and ``fn`` takes them as
        ``**kwargs`` (and may take a ToolContext parameter).
        """
        if isinstance(fn, Tool):
            raise ToolDefinitionError(f"{fn.name!r} is already a tool; apply @tool once", function=fn.name)
        if not (inspect.isfunction(fn) or inspect.ismethod(fn)):
            raise ToolDefinitionError(f"@tool needs a function (def or async def), got {fn!r}",
                                      function=repr(fn))
        qualname: str = fn.__qualname__

        def fail(problem: str, parameter: str | None = None) -> ToolDefinitionError:
            where = f"@tool {qualname}" + (f", parameter {parameter!r}" if parameter is not None else "")
            return ToolDefinitionError(f"{where}: {problem}", function=qualname, parameter=parameter)

        if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
            raise fail("generator functions cannot be tools; return a value instead")
        tool_name = fn.__name__ if name is None else name
        if type(tool_name) is not str or not _NAME.fullmatch(tool_name):
            raise fail(f"tool name {tool_name!r} must match {_NAME.pattern} (pass name=... to choose one)")
        if type(semantics) is not str or semantics not in _SEMANTICS:
            raise fail(f"semantics must be one of {', '.join(_SEMANTICS)}, got {semantics!r}")
        if type(requires_approval) is not bool:
            raise fail(f"requires_approval must be True or False, got {requires_approval!r}")
        if timeout is not None and (type(timeout) not in (int, float) or not math.isfinite(timeout)
                                    or timeout <= 0):
            raise fail(f"timeout must be a positive number of seconds or None, got {timeout!r}")
        if probe is not None:
            problem = _probe_problem(probe, semantics)
            if problem is not None:
                raise fail(problem)
        if probe_timeout is not None:
            if probe is None:
                raise fail("probe_timeout needs a probe=")
            if type(probe_timeout) not in (int, float) or not math.isfinite(probe_timeout) or probe_timeout <= 0:
                raise fail(f"probe_timeout must be a positive number of seconds, got {probe_timeout!r}")
        if description is None:
            description = inspect.cleandoc(fn.__doc__) if fn.__doc__ else ""
        elif type(description) is not str:
            raise fail(f"description must be a string, got {description!r}")

        try:
            hints = _hints(fn)
        except _Unsupported as exc:
            raise fail(str(exc)) from exc
        ctx_name: str | None = None
        fields: list[_Field] = []
        for pname, param in inspect.signature(fn).parameters.items():
            if param.kind is inspect.Parameter.POSITIONAL_ONLY:
                raise fail("positional-only parameters are not supported (arguments are passed by name)", pname)
            if param.kind is inspect.Parameter.VAR_KEYWORD and parameters is not None:
                continue
            if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
                raise fail("*args and **kwargs are not supported; declare each parameter with a type", pname)
            if pname not in hints:
                raise fail("has no type annotation; every parameter needs one", pname)
            hint = hints[pname]
            if _is_context(hint):
                if ctx_name is not None:
                    raise fail(f"only one ToolContext parameter is allowed (already {ctx_name!r})", pname)
                ctx_name = pname
                continue
            try:
                node = _build(hint)
                required = param.default is inspect.Parameter.empty
                default = _NO_DEFAULT if required else _json_default(node, param.default)
            except _Unsupported as exc:
                raise fail(str(exc), pname) from None
            fields.append(_Field(pname, node, required, default))
        try:
            returns = _build(hints["return"]) if "return" in hints else _AnyNode()
        except _Unsupported as exc:
            raise fail(f"return annotation: {exc}") from None

        params: _ObjectNode | _SchemaNode = _ObjectNode(f"tool {tool_name!r}", fields)
        if parameters is not None:
            if not isinstance(parameters, ArgumentsSchema):
                raise fail(f"parameters must be an ArgumentsSchema, got {parameters!r}")
            takes_kwargs = any(param.kind is inspect.Parameter.VAR_KEYWORD
                               for param in inspect.signature(fn).parameters.values())
            if fields or not takes_kwargs:
                raise fail("with parameters=, the function takes the arguments as **kwargs only",
                           fields[0].name if fields else None)
            params = _SchemaNode(parameters, ctx_name)
        try:
            params_schema = _document(params, "validation")
        except _Unsupported as exc:
            raise fail(f"parameters: {exc}") from None
        try:
            returns_schema = _document(returns, "serialization")
        except _Unsupported as exc:
            raise fail(f"return annotation: {exc}") from None
        object.__setattr__(self, "_fn", fn)
        object.__setattr__(self, "_name", tool_name)
        object.__setattr__(self, "_description", description)
        object.__setattr__(self, "_semantics", semantics)
        object.__setattr__(self, "_requires_approval", requires_approval)
        object.__setattr__(self, "_timeout", None if timeout is None else float(timeout))
        object.__setattr__(self, "_probe", probe)
        object.__setattr__(self, "_probe_timeout", DEFAULT_PROBE_TIMEOUT if probe_timeout is None
                           else float(probe_timeout))
        object.__setattr__(self, "_is_async", inspect.iscoroutinefunction(fn))
        object.__setattr__(self, "_ctx_name", ctx_name)
        object.__setattr__(self, "_params", params)
        object.__setattr__(self, "_parameters", params_schema)
        object.__setattr__(self, "_returns", returns)
        object.__setattr__(self, "_returns_schema", returns_schema)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"Tool is immutable; cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"Tool is immutable; cannot delete {name!r}")

    def __repr__(self) -> str:
        probe = " probe" if self._probe is not None else ""
        return f"<Tool {self._name} semantics={self._semantics} requires_approval={self._requires_approval}{probe}>"

    @property
    def name(self) -> str:
        """The name the model calls the tool by."""
        return self._name

    @property
    def description(self) -> str:
        """The cleaned docstring, or the ``description=`` given."""
        return self._description

    @property
    def semantics(self) -> Semantics:
        """``read_only``, ``idempotent`` or ``unsafe``."""
        return self._semantics

    @property
    def requires_approval(self) -> bool:
        """Whether every call is parked until approved or denied."""
        return self._requires_approval

    @property
    def timeout(self) -> float | None:
        """Seconds the caller allows a call to take (enforced by the caller), or None."""
        return self._timeout

    @property
    def probe(self) -> Callable[[ProbeQuery], Any] | None:
        """The read-only function that asks the outside system what happened to a call, or None."""
        return self._probe

    @property
    def probe_timeout(self) -> float:
        """Seconds the probe may take before its answer counts as "don't know"."""
        return self._probe_timeout

    @property
    def is_async(self) -> bool:
        """Whether the function is ``async def``."""
        return self._is_async

    @property
    def fn(self) -> Callable[..., Any]:
        """The decorated function."""
        return self._fn

    @property
    def parameters(self) -> dict[str, Any]:
        """The JSON Schema of the arguments (a fresh copy)."""
        return copy.deepcopy(self._parameters)

    @property
    def returns(self) -> dict[str, Any]:
        """The JSON Schema of the result as recorded (``{}`` when unannotated or ``Any``; a model's dump)."""
        return copy.deepcopy(self._returns_schema)

    def spec(self) -> dict[str, Any]:
        """``{"name", "description", "parameters"}``: what a model provider needs."""
        return {"name": self.name, "description": self.description, "parameters": self.parameters}

    def contract(self) -> dict[str, Any]:
        """The part that must not change under a running thread (hashed into the agent digest).

        ``probe`` is there only for a tool that has one (so the contracts of tools without stay as recorded):
        a thread whose calls were recorded as probed is not continued by an agent that cannot probe them.
        """
        contract: dict[str, Any] = {
            "name": self.name,
            "parameters": self.parameters,
            "returns": self.returns,
            "semantics": self.semantics,
            "requires_approval": self.requires_approval,
        }
        if self._probe is not None:
            contract["probe"] = True
        return contract

    def validate_args(self, args: object) -> dict[str, Any]:
        """Check ``args`` against :attr:`parameters`; return a new plain-JSON dict with defaults filled in (a
        model's argument as its JSON dump): the canonical arguments the function and a probe are given.

        Raises :class:`ToolInputError` naming the offending path, e.g. ``args.items[2]``.
        """
        try:
            return typing.cast("dict[str, Any]", self._params.check(args, "args"))
        except _Mismatch as exc:
            raise ToolInputError(f"tool {self.name!r}: {exc.message}", tool=self.name, path=exc.path) from None

    async def invoke(self, args: dict[str, Any], ctx: ToolContext, *, timeout: float | None = None) -> Any:
        """Validate ``args``, call the function (sync ones in a worker thread) and return its result as JSON.

        The function receives Python values (models, dataclasses, Enum members); a model or dataclass it
        returns is dumped to JSON. Exceptions raised by the function, :class:`ToolError` included, propagate
        unchanged; a result that has no plain-JSON form or does not match :attr:`returns` raises
        :class:`ToolOutputError`. Past ``timeout`` seconds, :class:`TimeoutError`: a call in a thread goes on
        (it cannot be stopped), and so does an ``unsafe`` coroutine (:func:`run_call_past_its_timeout`); a
        retry-safe coroutine is cancelled.
        """
        if not isinstance(ctx, ToolContext):
            raise InvalidInput(f"tool {self.name!r}: ctx must be a ToolContext, got {type(ctx).__name__}",
                               tool=self.name)
        checked = self.validate_args(args)
        kwargs: dict[str, Any] = self._params.to_python(checked)
        if self._ctx_name is not None:
            kwargs[self._ctx_name] = ctx
        await call_ended(ctx.effect_id)  # an earlier attempt still running in a thread here: never two at once
        track_calls_on(asyncio.get_running_loop())
        token = CALL_IN_FLIGHT.set(ctx.effect_id)
        try:
            if self.is_async and timeout is not None and self._semantics == "unsafe" and self._probe is not None:
                result = await run_call_past_its_timeout(ctx.effect_id, self.fn(**kwargs), timeout,
                                                         thread_id=ctx.thread_id)
            elif timeout is not None:
                async with asyncio.timeout(timeout):
                    result = await (self.fn(**kwargs) if self.is_async
                                    else run_call_in_thread(ctx.effect_id, self.fn, **kwargs))
            elif self.is_async:
                result = await self.fn(**kwargs)
            else:
                result = await run_call_in_thread(ctx.effect_id, self.fn, **kwargs)
        finally:
            CALL_IN_FLIGHT.reset(token)
        return self._checked_result(result)

    def _checked_result(self, result: object) -> Any:
        try:
            return _result_json(self._returns, result)
        except MalformedEvent as exc:
            hint = ""
            if self._returns_schema == {} and (dataclasses.is_dataclass(result) or _is_pydantic_type(type(result))):
                hint = " (annotate the return type with its class to have it dumped to JSON)"
            raise ToolOutputError(f"tool {self.name!r} returned a value that is not plain JSON: {exc.message}{hint}",
                                  tool=self.name, path=exc.details.get("path", "result")) from exc
        except _Mismatch as exc:
            raise ToolOutputError(f"tool {self.name!r} returned a value that does not match its return "
                                  f"annotation: {exc.message}", tool=self.name, path=exc.path) from None

    async def ask_probe(self, query: ProbeQuery) -> dict[str, Any]:
        """Run the probe on ``query`` (a sync one in a worker thread) within :attr:`probe_timeout` seconds.

        Returns the answer as it is recorded: ``{"answer": "occurred", "result", "evidence"}``,
        ``{"answer": "not_occurred", "evidence"}`` or ``{"answer": "dont_know", "reason", "evidence"}``;
        a value that is not a usable answer is a ``dont_know`` naming why. What the probe raises, and
        :class:`TimeoutError`, propagate (the caller records them as "don't know").
        """
        probe = self._probe
        if probe is None:
            return _dont_know(f"tool {self.name!r} declares no probe")
        await call_ended(query.effect_id)  # the call can still act while its thread runs here: ask once it cannot
        return self.probe_answer(await asyncio.wait_for(call_user_function(probe, query), self._probe_timeout))

    def probe_answer(self, value: object) -> dict[str, Any]:
        """The recorded form of what a probe returned (pure): a bad value is a ``dont_know`` with the reason."""
        if isinstance(value, Occurred | NotOccurred | DontKnow):
            evidence = value.evidence
            if not isinstance(evidence, dict):
                return _dont_know(f"the probe's evidence must be a dict, got {type(evidence).__name__}")
            problem = _json_problem(evidence, "evidence")
            if problem is not None:
                return _dont_know(f"the probe answered {type(value).__name__}, but {problem}")
            evidence = _copy_json(evidence)
            if isinstance(value, DontKnow):
                reason = value.reason if isinstance(value.reason, str) and value.reason.strip() else repr(value.reason)
                return _dont_know(reason, evidence)
            if isinstance(value, NotOccurred):
                return {"answer": "not_occurred", "evidence": evidence}
            try:
                result = _copy_json(_result_json(self._returns, value.result))
                problem = _json_problem(result, "result")
            except MalformedEvent as exc:
                problem = f"its result is not plain JSON: {exc.message}"
            except _Mismatch as exc:
                problem = f"its result does not match the tool's return annotation: {exc.message}"
            if problem is not None:
                return _dont_know(f"the probe answered Occurred, but {problem}", evidence)
            return {"answer": "occurred", "result": result, "evidence": evidence}
        return _dont_know(f"the probe returned {_got(value)}, not Occurred, NotOccurred or DontKnow")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the underlying function directly (no validation, no context injection)."""
        return self.fn(*args, **kwargs)


def _result_json(returns: _Node, value: object) -> Any:
    """What a tool (or its probe) returned, as plain JSON checked against the return annotation: models,
    dataclasses, Enum members and tuples it declares are turned into JSON, a plain-JSON value is kept as it is
    (a model's is normalized to its dump). Raises :class:`MalformedEvent` (no plain-JSON form) or
    :class:`_Mismatch` (does not match)."""
    try:
        canonical_text(value, path="result", max_nesting=VALUE_NESTING)
    except MalformedEvent as not_json:
        try:
            converted = returns.to_json(value)
        except _NotJSON as exc:
            if str(exc):  # a model whose dump is not JSON says why
                raise _Mismatch("result", f"result: {exc}") from None
            raise not_json from None
        if converted is value:
            raise
        canonical_text(converted, path="result", max_nesting=VALUE_NESTING)
        value = converted
    checked = returns.check(value, "result")
    return checked if returns.normalizes else value


def _probe_problem(probe: object, semantics: str) -> str | None:
    """Why ``probe`` cannot be the probe of a tool with ``semantics``, or None."""
    if semantics == "read_only":
        return ("a read_only tool changes nothing outside, so there is nothing to probe; remove probe= "
                "(an unknown read_only call is simply retried)")
    if isinstance(probe, Tool) or not callable(probe):
        return f"probe must be a function taking one ProbeQuery, got {probe!r}"
    if inspect.isgeneratorfunction(probe) or inspect.isasyncgenfunction(probe):
        return "probe must return an answer (Occurred, NotOccurred or DontKnow), not be a generator"
    try:
        inspect.signature(probe).bind(None)
    except TypeError:
        return "probe must take exactly one positional argument, the ProbeQuery"
    except ValueError:
        return None  # a builtin without a signature: it is called and its answer checked
    return None


def check_declaration(name: str, jixu_name: str, *, semantics: Semantics, probe: Callable[[ProbeQuery], Any] | None,
                      probe_timeout: float | None, timeout: float | None = None) -> None:
    """Check another framework's declaration of its tool ``name`` (called ``jixu_name`` as a step) by the rules of
    a jixu :class:`Tool`, before anything runs: :class:`~jixu.errors.ToolDefinitionError` names the tool."""

    def declared(ctx: ToolContext) -> Any:  # pragma: no cover - never called: only the declaration is checked
        return None

    declared.__name__ = declared.__qualname__ = name  # what an error names: the tool, not this stand-in
    Tool(declared, name=jixu_name, semantics=semantics, probe=probe, probe_timeout=probe_timeout, timeout=timeout)


@overload
def tool(
    fn: Callable[..., Any],
    *,
    name: str | None = None,
    description: str | None = None,
    semantics: Semantics = "unsafe",
    requires_approval: bool = False,
    timeout: float | None = None,
    probe: Callable[[ProbeQuery], Any] | None = None,
    probe_timeout: float | None = None,
) -> Tool: ...


@overload
def tool(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    semantics: Semantics = "unsafe",
    requires_approval: bool = False,
    timeout: float | None = None,
    probe: Callable[[ProbeQuery], Any] | None = None,
    probe_timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    semantics: Semantics = "unsafe",
    requires_approval: bool = False,
    timeout: float | None = None,
    probe: Callable[[ProbeQuery], Any] | None = None,
    probe_timeout: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Declare a tool from a function's type hints: ``@tool`` or ``@tool(semantics=..., ...)``.

    ``probe`` (``idempotent`` and ``unsafe`` tools only): a read-only function
    ``probe(query: ProbeQuery) -> Occurred | NotOccurred | DontKnow`` (sync or
    async) that recovery asks, before an operator, what happened to a call
    whose outcome is unknown; ``probe_timeout`` seconds (default
    :data:`DEFAULT_PROBE_TIMEOUT`) bound it. Invalid options or annotations
    raise :class:`ToolDefinitionError` at decoration time.
    """

    def decorate(function: Callable[..., Any]) -> Tool:
        return Tool(function, name=name, description=description, semantics=semantics,
                    requires_approval=requires_approval, timeout=timeout, probe=probe, probe_timeout=probe_timeout)

    if fn is None:
        return decorate
    return decorate(fn)


__all__ = ["DEFAULT_PROBE_TIMEOUT", "DEFINITE_ANSWERS", "ArgumentsSchema", "DontKnow", "NotOccurred", "Occurred",
           "ProbeAnswer", "ProbeQuery", "Semantics", "Tool", "ToolContext", "ToolError", "tool"]
