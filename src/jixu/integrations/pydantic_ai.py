"""Durable pydantic-ai agents: an unchanged ``pydantic_ai.Agent`` run on a jixu thread (the ``pydantic-ai`` extra).

::

    from jixu.integrations.pydantic_ai import JixuAgent, effect

    @agent.tool_plain
    @effect(semantics="unsafe", probe=find_charge)        # or JixuAgent(..., tool_semantics={"charge": "unsafe"})
    def charge(order: int) -> str:
        return bank.charge(order, idempotency_key=current_effect().idempotency_key)

    durable = JixuAgent(agent, "sqlite:///jixu.db")
    thread_id = durable.new_thread_sync()
    result = durable.run_sync("charge order 7", thread_id=thread_id)   # after a crash: the same call again

Built like pydantic-ai's own durable-execution wrappers (a wrapper agent, a wrapped model, wrapped toolsets), on
jixu's durable steps (decision 0032): one :meth:`JixuAgent.run` is one durable run of the thread, and

- every model request is a retry-safe step (``model_request``) whose result is the response serialized with
  pydantic-ai's own ``ModelMessagesTypeAdapter``; the response handed to the agent is always the one rebuilt from
  the record, so a rerun after a crash gets exactly what the first run got, without asking the model again;
- every tool call is a step named after the tool, with the tool's semantics (``unsafe`` unless declared), its
  probe (decision 0027) and its validated arguments; :func:`current_effect` gives the tool its effect id and
  idempotency key. pydantic-ai's control flow raised by a tool (``ModelRetry``, ``ToolFailed``,
  ``ApprovalRequired``, ``CallDeferred``, argument ``ValidationError``) is recorded as the call's result and
  raised again from the record; any other exception, or a result pydantic-ai cannot serialize, is no receipt of
  what the call did: its outcome is unknown, as for every jixu tool;
- a tool that needs approval (``requires_approval=True``, or one that raises ``ApprovalRequired``) is a parked
  step: the run waits until ``jixu threads approve`` (the tool runs) or ``jixu threads deny`` (the model is told
  the call was denied, as pydantic-ai's ``ToolDenied`` tells it).

Each step goes through the thread's path through the effect kernel (intent, dispatch marker, one receipt) and
its state is the RecoveryResolver's alone: a completed step returns its record, an unsafe call cut off after
dispatch is ``unknown`` and is never run again (its probe or an operator settles it; until then the run raises
:class:`~jixu.errors.StepOutcomeUnknown`), and a rerun whose request or call differs from the record raises
:class:`~jixu.errors.StepMismatch`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import math
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias, TypeVar, cast, get_args

from jixu.errors import InvalidInput, JixuError, MissingExtra, ModelError, StepFailed
from jixu.ledger import Store, content_hash
from jixu.ledger.encoding import JSONObject
from jixu.threads.harness import Harness
from jixu.threads.model import unfinished_answer
from jixu.threads.projection import RESOLUTION_MESSAGES
from jixu.threads.steps import OCCURRED_WITHOUT_RESULT, DurableRun, run_failure, steps_agent
from jixu.threads.tools import (
    CallTrackingExecutor,
    Occurred,
    ProbeQuery,
    ToolContext,
    ToolError,
    call_user_function,
    check_declaration,
    running_in_this_thread,
)

try:
    from pydantic_ai import (
        Agent,
        ModelMessagesTypeAdapter,
        NativeOutput,
        PromptedOutput,
        TextOutput,
        ToolOutput,
    )
    from pydantic_ai import _utils as _pydantic_utils
    from pydantic_ai.durable_exec import JSON_CODEC, CallToolResult
    from pydantic_ai.durable_exec._toolset import unwrap_tool_call_result, wrap_tool_call_result
    from pydantic_ai.exceptions import ApprovalRequired, ModelHTTPError, ToolFailed
    from pydantic_ai.messages import ModelMessage, ModelResponse
    from pydantic_ai.models import CompletedStreamedResponse, Model, ModelRequestParameters, StreamedResponse
    from pydantic_ai.models import infer_model as _infer_model
    from pydantic_ai.models.wrapper import WrapperModel
    from pydantic_ai.run import AgentRunResult
    from pydantic_ai.settings import ModelSettings
    from pydantic_ai.tools import RunContext, ToolDenied
    from pydantic_ai.toolsets import AbstractToolset, FunctionToolset, ToolsetTool, WrapperToolset
    from pydantic_core import PydanticSerializationError, to_jsonable_python
except ImportError as error:  # without the extra: say what to install
    raise MissingExtra.needed("pydantic-ai", "jixu.integrations.pydantic_ai", error) from error

Semantics: TypeAlias = Literal["read_only", "idempotent", "unsafe"]
MODEL_STEP = "model_request"
"""The step name of every model request."""
RECORD_KEY = "pydantic_ai"
"""A tool step's recorded result is ``{"pydantic_ai": <pydantic-ai's CallToolResult as JSON>}``; a result given by
a probe or an operator (``jixu threads resolve ... --result``) is the tool's plain return value."""
VOLATILE_FIELDS = frozenset({"timestamp", "run_id", "conversation_id"})
"""Message fields left out of a model request's digest: they differ between a run and its rerun, and the model is
not asked anything different because of them."""
_EFFECT_ATTRIBUTE = "__jixu_effect__"
_current: ContextVar[ToolContext | None] = ContextVar("jixu_pydantic_ai_effect", default=None)
F = TypeVar("F", bound=Callable[..., Any])


# --- declaring tools -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EffectSpec:
    """How jixu treats the calls of one tool (see :func:`effect`)."""

    semantics: Semantics = "unsafe"
    probe: Callable[[ProbeQuery], Any] | None = None
    probe_timeout: float | None = None
    timeout: float | None = None

    def checked(self, name: str) -> EffectSpec:
        """This declaration, checked by the rules of a jixu tool (``ToolDefinitionError`` names what is wrong)."""
        if self.semantics not in get_args(Semantics):
            raise InvalidInput(f"tool {name!r}: semantics must be one of {get_args(Semantics)}, got "
                               f"{self.semantics!r}", field="semantics", tool=name)
        check_declaration(name, _step_name(name), semantics=self.semantics, probe=self.probe,
                          probe_timeout=self.probe_timeout, timeout=self.timeout)
        return self


def effect(*, semantics: Semantics = "unsafe", probe: Callable[[ProbeQuery], Any] | None = None,
           probe_timeout: float | None = None, timeout: float | None = None) -> Callable[[F], F]:
    """Declare how jixu treats calls of a pydantic-ai tool function; put it under pydantic-ai's decorator::

        @agent.tool_plain
        @effect(semantics="idempotent")
        def reserve(order: int) -> str: ...

    ``semantics``: ``read_only`` / ``idempotent`` (retried after a crash, under the same idempotency key) /
    ``unsafe`` (never run twice; the default). ``probe(query)`` (a :class:`~jixu.ProbeQuery`, returning
    ``Occurred(result=<what the tool would have returned>)`` / ``NotOccurred`` / ``DontKnow``) settles an unsafe call
    whose outcome a crash left unknown. ``timeout``: seconds a call may take (then its outcome is unknown).
    """
    spec = EffectSpec(semantics, probe, probe_timeout, timeout)

    def mark(function: F) -> F:
        spec.checked(getattr(function, "__name__", "tool"))
        marked = function if inspect.iscoroutinefunction(function) else _tracked(function)
        setattr(marked, _EFFECT_ATTRIBUTE, spec)
        return marked

    return mark


def _tracked(function: F) -> F:
    """``function`` (sync: pydantic-ai runs it in a worker thread of its own) counted as its jixu call in flight
    while it runs (:func:`~jixu.threads.tools.running_in_this_thread`): past its timeout, or after a cancellation,
    it goes on, and its probe is asked, or the call started again, only once it returned."""

    @functools.wraps(function)
    def tracked(*args: Any, **kwargs: Any) -> Any:
        current = _current.get()
        if current is None:
            return function(*args, **kwargs)
        with running_in_this_thread(current.effect_id):
            return function(*args, **kwargs)

    return cast(F, tracked)


_EXECUTOR_LOCK = threading.Lock()
_EXECUTOR: list[CallTrackingExecutor] = []


@contextlib.contextmanager
def _calls_seen() -> Iterator[None]:
    """pydantic-ai's sync tools run on a :class:`~jixu.threads.tools.CallTrackingExecutor` (its
    ``Agent.using_thread_executor``), so each counts as its jixu call in flight until it returns, however the tool
    was declared (decision 0058). An executor the application chose is kept (and then only ``@effect`` functions
    are seen)."""
    chosen = getattr(_pydantic_utils, "_thread_executor", None)
    if chosen is not None and chosen.get() is not None:
        yield
        return
    with _EXECUTOR_LOCK:
        if not _EXECUTOR:
            _EXECUTOR.append(CallTrackingExecutor(thread_name_prefix="jixu-pydantic-ai"))
    with Agent.using_thread_executor(_EXECUTOR[0]):
        yield


def current_effect() -> ToolContext:
    """The jixu identity of the tool call running now: ``effect_id``, ``idempotency_key`` (send it to the outside
    system), ``attempt``, ``thread_id``, ``turn_id``. Only inside a tool called by a :class:`JixuAgent` run."""
    found = _current.get()
    if found is None:
        raise InvalidInput("current_effect() is only known inside a tool called by a JixuAgent run")
    return found


def _step_name(tool_name: str) -> str:
    """The step name of a tool: its own name when jixu accepts it, else a readable name with a short digest."""
    if tool_name and len(tool_name) <= 64 and tool_name[0].isalpha() and all(
            c.isalnum() or c in "_-" for c in tool_name) and tool_name.isascii():
        return tool_name
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in tool_name)[:48]
    return f"t_{cleaned}_{hashlib.sha256(tool_name.encode()).hexdigest()[:8]}"


def _step_key(*parts: str) -> str:
    """A step key of at most 200 characters (long ids are shortened to a digest)."""
    key = ":".join(parts)
    return key if len(key) <= 200 else f"{key[:150]}~{hashlib.sha256(key.encode()).hexdigest()[:16]}"


# --- model requests ---------------------------------------------------------------------------


def dump_response(response: ModelResponse) -> JSONObject:
    """A model response as plain JSON, by pydantic-ai's own message serialization."""
    return cast(JSONObject, ModelMessagesTypeAdapter.dump_python([response], mode="json")[0])


def load_response(payload: JSONObject) -> ModelResponse:
    """The model response :func:`dump_response` recorded, rebuilt (anything else: :class:`~jixu.errors.InvalidInput`)."""
    try:
        [message] = ModelMessagesTypeAdapter.validate_python([payload])
    except ValueError as error:  # pydantic's ValidationError
        raise InvalidInput(f"not a recorded model response: {error}"[:500], field="response") from error
    if not isinstance(message, ModelResponse):
        raise InvalidInput(f"the recorded model response is a {type(message).__name__}", field="response")
    return message


def _without_volatile(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_volatile(v) for k, v in value.items() if k not in VOLATILE_FIELDS}
    if isinstance(value, list):
        return [_without_volatile(v) for v in value]
    return value


def request_args(model: Model, messages: Sequence[ModelMessage],
                 parameters: ModelRequestParameters | None = None) -> JSONObject:
    """What a model request step records as its arguments: the model, how many messages, a digest of the
    messages without their timestamps and run ids, and one of the tools offered (their names and parameters):
    a rerun that would ask something else, or offer other tools, is a mismatch. A tool renamed or removed between
    a crash and the rerun otherwise went unnoticed: pydantic-ai told the model the recorded call's tool was unknown,
    and the model called the renamed one, running an unsafe call a second time."""
    dumped = ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")
    args: JSONObject = {"model": model.model_name, "messages": len(messages),
                        "digest": content_hash({"messages": _without_volatile(dumped)})}
    if parameters is not None:
        args["tools"] = content_hash([{"name": tool.name, "parameters": to_jsonable_python(
            tool.parameters_json_schema)} for tool in parameters.function_tools])
    return args


def _model_failure(error: Exception) -> ToolError:
    """A model request that raised, as the determinate failure of its step: no answer to replay and nothing
    happened outside, so the run's next execution asks again (a new step generation) instead of leaving a
    transient provider error (a 503, a rate limit) to an operator."""
    data: JSONObject = {"exception": type(error).__name__}
    if isinstance(error, ModelHTTPError):
        data.update(status_code=error.status_code, model_name=error.model_name)
    return ToolError(f"{type(error).__name__}: {error}"[:2000], code="model_error", data=data)


_FINISH_REASONS: dict[str | None, str] = {None: "", "tool_call": "tool_calls"}
"""pydantic-ai's normalized finish reasons as the stop reasons jixu's drivers record (the others keep their name)."""


def refuse_unfinished(response: ModelResponse) -> None:
    """Raise :class:`~jixu.errors.ModelError` (``output_truncated``, determinate) when ``response`` asks for tool
    calls but the model did not finish it (:func:`~jixu.threads.model.unfinished_answer`: a token limit, a content
    filter, an error): a call in it may lack arguments, so none is run, as in a jixu agent. The response stays
    recorded; a rerun meets the same refusal."""
    calls = len(response.tool_calls)
    reason = response.finish_reason
    why = unfinished_answer(_FINISH_REASONS.get(reason, reason), calls) if calls else None
    if why is not None:
        raise ModelError(why, kind="output_truncated", indeterminate=False, stop_reason=reason)


class JixuModel(WrapperModel):
    """A model whose every request is a durable jixu step of ``run`` (its record returned on a rerun).

    Requests are numbered by the answers the run got: the ``n``-th request is step ``model_request#n``. One that
    failed (the provider's error, recorded) or whose outcome an operator settled without its response is asked
    again on the run's next execution under ``model_request#n.2``, ``.3``, … (as ``DurableRunner`` does)."""

    def __init__(self, wrapped: Model, run: DurableRun) -> None:
        super().__init__(wrapped)
        self._run = run
        self._answered = 0
        self._generation: dict[int, int] = {}
        self.model_error: Exception | None = None
        """The provider's error this run's last request raised (recorded as that request's failure)."""

    async def _step(self, messages: list[ModelMessage], parameters: ModelRequestParameters,
                    ask: Callable[[], Any]) -> ModelResponse:
        raised: list[Exception] = []

        async def call(ctx: ToolContext) -> JSONObject:
            try:
                response = await ask()
            except Exception as error:
                raised.append(error)
                raise _model_failure(error) from error
            return {"response": dump_response(response)}

        number = self._answered + 1
        while True:
            generation = self._generation.get(number, 1)
            key = f"{MODEL_STEP}#{number}" + (f".{generation}" if generation > 1 else "")
            try:
                args = request_args(self.wrapped, messages, parameters)
                earlier = self._run.recorded_args(key)
                if earlier is not None and "tools" not in earlier:
                    args.pop("tools", None)  # recorded before the tools were part of a request's record
                recorded = await self._run.effect(MODEL_STEP, args, call=call, semantics="idempotent", key=key)
            except StepFailed as failed:
                if failed.details.get("reason") != "failed":
                    raise
                self._generation[number] = generation + 1
                if raised:  # this process asked: the caller gets pydantic-ai's own error (the record keeps it too)
                    self.model_error = raised[-1]
                    raise raised[-1] from None
                continue  # it failed in an earlier execution: ask again
            if not isinstance(recorded, dict) or not isinstance(recorded.get("response"), dict):
                # Settled by an operator (``occurred``) without the response: there is nothing to replay.
                self._generation[number] = generation + 1
                continue
            self._answered = number
            response = load_response(recorded["response"])
            refuse_unfinished(response)
            return response

    async def request(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                      model_request_parameters: ModelRequestParameters) -> ModelResponse:
        """The wrapped model's response, asked once and recorded; a rerun returns the record."""
        return await self._step(messages, model_request_parameters,
                                lambda: self.wrapped.request(messages, model_settings, model_request_parameters))

    @asynccontextmanager
    async def request_stream(self, messages: list[ModelMessage], model_settings: ModelSettings | None,
                             model_request_parameters: ModelRequestParameters,
                             run_context: RunContext[Any] | None = None) -> AsyncIterator[StreamedResponse]:
        """The wrapped model's stream, drained inside the step; its recorded response is replayed as events."""

        async def drained() -> ModelResponse:
            async with self.wrapped.request_stream(messages, model_settings, model_request_parameters,
                                                   run_context) as streamed:
                async for _ in streamed:
                    pass
            return streamed.get()

        response = await self._step(messages, model_request_parameters, drained)
        yield CompletedStreamedResponse(response, model_request_parameters=model_request_parameters,
                                        replay_events=True)


# --- tool calls -------------------------------------------------------------------------------


def _record(payload: Any) -> JSONObject:
    return {RECORD_KEY: JSON_CODEC.dump(CallToolResult, payload)}


def _recorded_result(recorded: Any) -> Any:
    """A tool step's result as the tool gave it (or raised it), from the record."""
    if isinstance(recorded, dict) and set(recorded) == {RECORD_KEY}:
        return unwrap_tool_call_result(JSON_CODEC.load(CallToolResult, recorded[RECORD_KEY]))
    if recorded is None:  # `occurred` without a result (an operator's `jixu threads resolve` gives none)
        return OCCURRED_WITHOUT_RESULT
    return recorded  # a probe's or an operator's result: the tool's plain return value


def _probe_of(spec: EffectSpec) -> Callable[[ProbeQuery], Any] | None:
    """The tool's probe, its ``Occurred`` result standing for the tool's plain return value (made plain JSON)."""
    probe = spec.probe
    if probe is None:
        return None

    async def ask(query: ProbeQuery) -> Any:
        answer = await call_user_function(probe, query)
        if isinstance(answer, Occurred):
            return Occurred(result=to_jsonable_python(answer.result), evidence=answer.evidence)
        return answer

    return ask


@dataclass(frozen=True)
class _Policy:
    """How every tool of one agent is treated: declared by :func:`effect`, ``tool_semantics`` or ``probes``."""

    specs: Mapping[str, EffectSpec]

    def of(self, name: str) -> EffectSpec:
        return self.specs.get(name) or EffectSpec()


@dataclass
class JixuToolset(WrapperToolset[Any]):
    """A toolset whose every call is a durable jixu step of ``run``; tools needing approval become parked steps."""

    run: DurableRun | None = None
    policy: _Policy = _Policy({})
    needs_approval: set[str] | None = None

    def _durable(self) -> DurableRun:
        if self.run is None:  # pragma: no cover - JixuAgent always binds a run
            raise InvalidInput("a JixuToolset is used only inside a JixuAgent run")
        return self.run

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        """The wrapped tools; one that pydantic-ai would defer for approval is offered as a plain tool whose calls
        park in jixu instead."""
        tools = await super().get_tools(ctx)
        offered: dict[str, ToolsetTool[Any]] = {}
        for name, tool in tools.items():
            offered[name] = tool
            if tool.tool_def.kind == "unapproved":
                if self.needs_approval is not None:
                    self.needs_approval.add(name)
                offered[name] = replace(tool, tool_def=replace(tool.tool_def, kind="function"))
        return offered

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any],
                        tool: ToolsetTool[Any]) -> Any:
        """The call as a durable step (its record on a rerun); a denial is pydantic-ai's ``ToolDenied``."""
        key = _step_key(name, str(ctx.run_step), str(ctx.tool_call_id))
        approval = name in (self.needs_approval or ()) and not ctx.tool_call_approved
        try:
            return _recorded_result(await self._step(name, tool_args, ctx, tool, key, approval))
        except ApprovalRequired:
            if ctx.tool_call_approved:
                raise
            # The tool asked for approval itself: the call needs it, as a parked step of its own.
            return _recorded_result(await self._step(name, tool_args, ctx, tool, f"{key}:approval", True))

    async def _step(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any],
                    key: str, approval: bool) -> Any:
        spec = self.policy.of(name)
        called = replace(ctx, tool_call_approved=True) if approval else ctx
        timeout = spec.timeout
        # pydantic-ai's own tool timeout (the tool's, else its function toolset's) would tell the model "timed out,
        # retry" about a call that may have acted, and the model would call again under a new key: it is the
        # step's timeout instead (past it the outcome is unknown), and pydantic-ai is given none.
        declared = tool.tool_def.timeout if tool.tool_def.timeout is not None else _toolset_timeout(tool.toolset)
        if isinstance(declared, int | float) and not isinstance(declared, bool):
            timeout = float(declared) if timeout is None else min(timeout, float(declared))
            tool = replace(tool, tool_def=replace(tool.tool_def, timeout=math.inf))

        async def call(jctx: ToolContext) -> JSONObject:
            token = _current.set(jctx)
            try:
                returned = await wrap_tool_call_result(self.wrapped.call_tool(name, tool_args, called, tool))
            finally:
                _current.reset(token)
            try:
                return _record(returned)
            except PydanticSerializationError as error:
                # The call returned, so its effect happened, but its result cannot be recorded: say so (an audit
                # saw only "unknown outcome"); an unsafe call stays unknown for an operator, who can give it.
                raise InvalidInput(f"tool {name!r} returned a value that cannot be recorded as JSON ({error}); "
                                   "return plain JSON-able values (str, numbers, lists, dicts, pydantic models)",
                                   field="result") from error

        try:
            return await self._durable().effect(
                _step_name(name), cast(JSONObject, to_jsonable_python(tool_args)), call=call,
                semantics=spec.semantics, probe=_probe_of(spec), probe_timeout=spec.probe_timeout,
                requires_approval=approval, timeout=timeout, key=key)
        except StepFailed as failed:
            reason = failed.details.get("reason")
            if reason == "denied":
                note = failed.details.get("error")  # the operator's note: the model is told, as pydantic-ai tells it
                return ToolDenied(f"The tool call was denied: {note}" if note else "The tool call was denied.")
            if reason == "abandoned_unknown":
                # An operator accepted the unknown outcome: the model is told so (as a jixu agent's model is) and the
                # run goes on. Failing the run instead would make running the code again start a new run, which
                # would call every tool, unsafe ones included, once more.
                return RESOLUTION_MESSAGES["abandoned_unknown"]
            if reason == "failed":
                # A determinate failure (the tool raised jixu.ToolError: it did no harm), recorded: told to the model
                # as pydantic-ai's ToolFailed tells it, from the record, so a rerun tells it the same.
                raise ToolFailed(ToolError.recorded(failed.details.get("error")).message) from None
            raise


def _toolset_timeout(toolset: Any) -> Any:
    """The ``timeout`` of the function toolset under ``toolset``'s wrappers (prefixed, renamed, filtered, ...:
    each keeps the one it wraps as ``wrapped``), or None."""
    for _depth in range(32):
        timeout = getattr(toolset, "timeout", None)
        if timeout is not None:
            return timeout
        toolset = getattr(toolset, "wrapped", None)
        if toolset is None:
            break
    return None


def _declared(agent: Agent[Any, Any], tool_semantics: Mapping[str, Semantics] | None,
              probes: Mapping[str, Callable[[ProbeQuery], Any]] | None, *,
              run_toolsets: Sequence[AbstractToolset[Any]] | None = None) -> _Policy:
    """Each tool's declaration: ``@effect`` on its function, overridden by ``tool_semantics`` and ``probes``.

    With ``run_toolsets`` (a run's: the agent's toolsets and its own are then all it offers), a name in
    ``tool_semantics`` or ``probes`` that none of them has is refused when they are all plain function toolsets.
    """
    specs: dict[str, EffectSpec] = {}
    names: set[str] = set()

    def collect(toolset: AbstractToolset[Any]) -> None:
        if isinstance(toolset, FunctionToolset):
            names.update(toolset.tools)
            for name, declared in toolset.tools.items():
                found = getattr(declared.function, _EFFECT_ATTRIBUTE, None)
                if isinstance(found, EffectSpec):
                    specs[name] = found

    toolsets = [*agent.toolsets, *(run_toolsets or ())]
    for toolset in toolsets:
        toolset.apply(collect)
    # Only plain function toolsets name their tools before a run lists them (not an MCP server's, nor a prefixing
    # wrapper's); and only a run knows them all (a run's own toolsets, a tool added to the agent after this).
    static = run_toolsets is not None and all(isinstance(toolset, FunctionToolset) for toolset in toolsets)
    for field, given in (("tool_semantics", tool_semantics), ("probes", probes)):
        if given is not None and (not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given)):
            raise InvalidInput(f"{field} must map tool names to declarations", field=field)
        unknown = sorted(set(given or {}) - names)
        if unknown and static:
            # A misspelt name would leave the real tool without its declaration (unsafe, no probe) unnoticed.
            raise InvalidInput(f"{field} names no tool of the run: {', '.join(map(repr, unknown))} (its tools: "
                               f"{', '.join(map(repr, sorted(names))) or 'none'}); nothing was run", field=field)
    for name in {*(tool_semantics or {}), *(probes or {})}:
        base = specs.get(name) or EffectSpec()
        specs[name] = replace(base, semantics=(tool_semantics or {}).get(name, base.semantics),
                              probe=(probes or {}).get(name, base.probe))
    return _Policy({name: spec.checked(name) for name, spec in specs.items()})


# --- the agent --------------------------------------------------------------------------------


def _output_functions(spec: Any) -> list[str]:
    """The functions an output spec has pydantic-ai call (an output function, ``ToolOutput(f)``, ``TextOutput(f)``,
    ``NativeOutput([f])``, ...), by name: pydantic-ai calls them outside the agent's toolsets, so no step records
    them, and a rerun that replays the model's answer would call them again."""
    if inspect.isroutine(spec) or isinstance(spec, functools.partial):
        return [getattr(spec, "__name__", None) or repr(spec)]
    if isinstance(spec, list | tuple):
        return [name for each in spec for name in _output_functions(each)]
    if isinstance(spec, ToolOutput):
        return _output_functions(spec.output)
    if isinstance(spec, TextOutput):
        return _output_functions(spec.output_function)
    if isinstance(spec, NativeOutput | PromptedOutput):
        return _output_functions(spec.outputs)
    return []


def _refuse_output_functions(spec: Any, field: str) -> None:
    found = _output_functions(spec)
    if found:
        raise InvalidInput(f"{field} has pydantic-ai call {', '.join(map(repr, found))} with the model's output: "
                           "nothing would record that call, so a rerun after a crash would make it again; make it a "
                           "tool (a step with its semantics) and output its result's type instead", field=field)


def _failure(error: BaseException) -> JSONObject | None:
    """The error a run ends with for good, or None when it must stay unfinished for a rerun.

    A rerun replays every recorded step, so an error of pydantic-ai or of the code meets the rerun again: the run
    ends ``failed``. An unknown outcome, a mismatch, an ownership or store problem (any other jixu error) and a
    cancellation leave the run unfinished: it continues when the code runs again with the thread id.
    """
    if not isinstance(error, Exception) or (isinstance(error, JixuError) and not isinstance(error, StepFailed)):
        return None
    return run_failure(error)


def _reply(output: Any) -> str:
    return output if isinstance(output, str) else str(to_jsonable_python(output, fallback=repr))


class JixuAgent:
    """A pydantic-ai agent made durable on jixu threads (see the module docstring).

    ``store``: a :class:`~jixu.Harness` to run on, or a store (a URL, a path, a :class:`~jixu.ledger.Store`) for a
    harness of its own (``harness_options`` go to it: ``owner``, ``lease_ttl``, ``max_attempts``, ...).
    ``tool_semantics`` and ``probes`` declare tools by name (over :func:`effect`); a tool declared nowhere is
    ``unsafe`` (a name no tool of a run has is refused when that run starts). ``name``: the durable run's name
    (default: the agent's name).
    """

    def __init__(self, agent: Agent[Any, Any], store: Harness | Store | str | Any, *,
                 tool_semantics: Mapping[str, Semantics] | None = None,
                 probes: Mapping[str, Callable[[ProbeQuery], Any]] | None = None, name: str | None = None,
                 approval_poll: float = 0.5, **harness_options: Any) -> None:
        if not isinstance(agent, Agent):
            raise InvalidInput(f"JixuAgent wraps a pydantic_ai.Agent, got {type(agent).__name__}", field="agent")
        self.agent = agent
        self.name = name or agent.name or "pydantic-ai"
        self._tool_semantics, self._probes = tool_semantics, probes
        _refuse_output_functions(agent.output_type, "output_type")
        # Checked now: a bad semantics or probe fails here. A name no tool of the agent has may be a tool a run
        # brings (run(toolsets=...)): each run refuses, before anything runs, one that names no tool of it.
        _declared(agent, tool_semantics, probes)
        self._approval_poll = approval_poll
        if isinstance(store, Harness):
            if harness_options:
                raise InvalidInput("harness options go to the Harness you pass, not to JixuAgent",
                                   field=next(iter(harness_options)))
            self.harness = store
            self._owns_harness = False
        else:
            self.harness = Harness(steps_agent(_step_name(self.name)), store, **harness_options)
            self._owns_harness = True

    async def new_thread(self, *, metadata: dict[str, Any] | None = None) -> str:
        """A new thread for this agent; pass its id to :meth:`run` (and again after a crash)."""
        return (await self.harness.create_thread(metadata=metadata)).thread_id

    def new_thread_sync(self, *, metadata: dict[str, Any] | None = None) -> str:
        """:meth:`new_thread`, for code without an event loop."""
        return _run_sync(self.new_thread(metadata=metadata))

    async def run(self, user_prompt: Any = None, *, thread_id: str, model: Model | str | None = None,
                  toolsets: Sequence[AbstractToolset[Any]] | None = None, run_key: str | None = None,
                  **run_options: Any) -> AgentRunResult[Any]:
        """``agent.run(user_prompt, ...)`` as one durable run of thread ``thread_id``.

        ``run_options`` go to pydantic-ai's ``Agent.run`` (``deps``, ``message_history``, ``output_type``,
        ``usage_limits``, ``event_stream_handler``, ...). Its ``run_id`` is the jixu run's turn id and its
        ``conversation_id`` the thread id unless given (or taken from ``message_history``). Running again with the
        thread id continues the thread's unfinished run: recorded steps return their records, an unknown unsafe
        call is asked about by its probe or raises :class:`~jixu.errors.StepOutcomeUnknown`. A run that ended
        (with a result, or failed with an error a rerun would meet again) is not run again: the next call starts
        the thread's next run, unless it gives the ended run's ``run_key``: then it replays that run's record (the
        same result, no model or tool call; decision 0051). A run that would fail while an unsafe call of it has an
        unknown outcome stays unfinished instead (:class:`~jixu.errors.StepOutcomeUnknown`, the failure as its
        context): the next call continues it, so that call is settled, never made again.
        """
        if not isinstance(thread_id, str):
            # None ran on a new thread whose id the caller never learnt: after a crash it could not be continued.
            raise InvalidInput("thread_id must be a thread id: make a thread with new_thread() first and keep its id "
                               "to run again after a crash", field="thread_id")
        chosen = model if model is not None else self.agent.model
        if chosen is None:
            raise InvalidInput("the agent has no model: give one to the Agent or to run(model=...)", field="model")
        # Tools added since, and the run's own, are declared too; a declaration naming no tool of the run is refused.
        policy = _declared(self.agent, self._tool_semantics, self._probes, run_toolsets=toolsets or ())
        _refuse_output_functions(run_options.get("output_type"), "output_type")
        async with DurableRun(self.harness, thread_id, name=self.name, approval_poll=self._approval_poll,
                              run_key=run_key) as run:
            durable_model = JixuModel(_infer_model(chosen), run)
            needs_approval: set[str] = set()
            wrapped = [JixuToolset(toolset, run=run, policy=policy, needs_approval=needs_approval)
                       for toolset in [*self.agent.toolsets, *(toolsets or ())]]
            options = dict(run_options)
            options.setdefault("run_id", run.turn_id)
            if "conversation_id" not in options and not options.get("message_history"):
                options["conversation_id"] = run.thread_id
            try:
                with self.agent.override(model=durable_model, toolsets=wrapped, tools=[]), _calls_seen():
                    result = await self.agent.run(user_prompt, **options)
            except BaseException as error:
                failure = None if error is durable_model.model_error else _failure(error)
                if failure is None:
                    # Unfinished: running again with the thread id continues it (a provider's error: the request
                    # is asked again then; the steps before it return their records, nothing is done twice).
                    raise
                run.error = failure  # the block ends normally: the run is recorded failed
                final: BaseException | None = error
            else:
                run.reply = _reply(result.output)
                final = None
        if final is not None:
            raise final
        return result

    def run_sync(self, user_prompt: Any = None, *, thread_id: str, **run_options: Any) -> AgentRunResult[Any]:
        """:meth:`run`, for code without an event loop."""
        return _run_sync(self.run(user_prompt, thread_id=thread_id, **run_options))

    def close(self) -> None:
        """Close the store if this agent's harness opened it."""
        if self._owns_harness:
            self.harness.close()

    async def __aenter__(self) -> JixuAgent:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def __enter__(self) -> JixuAgent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


T = TypeVar("T")


def _run_sync(coroutine: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coroutine)
    coroutine.close()
    raise InvalidInput("the *_sync methods cannot run inside an event loop: await the async method instead")


__all__ = ["MODEL_STEP", "EffectSpec", "JixuAgent", "JixuModel", "JixuToolset", "Semantics", "current_effect",
           "dump_response", "effect", "load_response", "request_args"]
