"""Run an unchanged OpenAI Agents SDK agent durably on a jixu thread (the ``openai-agents`` extra; decision 0033).

::

    from agents import Agent, function_tool
    from jixu.integrations.openai_agents import DurableRunner, durable_tool

    @durable_tool(semantics="unsafe", probe=find_charge)   # optional: the default is unsafe, no probe
    @function_tool
    def charge(order: int) -> str: ...

    runner = DurableRunner("sqlite:///agents.db")
    result = await runner.run(agent, "Charge order 7", thread_id=thread_id)   # or runner.run_sync(...)

A run is one durable run of the thread (decision 0032): ``Runner.run`` of the
SDK, unchanged, with the agent's model and function tools wrapped so that

- every model call is a retry-safe step (``model``, ``read_only``): its
  response is recorded as plain JSON and, when the code runs again after a
  crash, rebuilt and returned without calling the model, so the SDK's loop
  replays deterministically up to where it died. The step's arguments are the
  model's name and a hash of the whole request (instructions, input items,
  tools, handoffs, output schema, settings): a rerun that would ask something
  else raises :class:`~jixu.errors.StepMismatch`;
- every function-tool call is a step named after the tool and keyed by the
  model's call id, with the tool's semantics (:func:`durable_tool` or the
  runner's ``tools`` mapping; default ``unsafe``), its probe (decision 0027),
  and the effect's identity for the tool (:func:`current_effect`); the SDK's
  ``needs_approval`` becomes a parked call (``jixu threads approve`` /
  ``deny``), a denial the SDK's own rejection message; its ``timeout_seconds``
  is the step's timeout: past it the call's outcome is unknown (an unsafe call
  stops the run for its probe or an operator, a retry-safe one is called again),
  never told to the model as a timeout it would retry;
- every handoff is an ``idempotent`` step ``handoff`` recording the agents
  from and to;
- an agent used as a tool (``Agent.as_tool``) is an ``idempotent`` step whose
  call is the SDK's invoker running the agent's durable clone: its model
  calls, tool calls and handoffs are steps of their own, keyed under the tool
  call's key (``billing:call_7#1/model#1``), so running it again replays them;
  its output is the step's result (decision 0059).

All of them go through the thread's own path through the effect kernel
(intent, dispatch marker, receipt) and are judged by the resolver alone: an
unsafe tool cut off after its marker is ``unknown`` and never repeated.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import hashlib
import importlib
import inspect
import json
import math
import os
import types
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any, get_args

from jixu.errors import InvalidInput, JixuError, MissingExtra, StepFailed, StepMismatch
from jixu.ledger import Store, content_hash
from jixu.ledger.encoding import JSONObject
from jixu.threads.harness import Harness
from jixu.threads.projection import RESOLUTION_MESSAGES
from jixu.threads.steps import (
    DEFAULT_APPROVAL_POLL,
    OCCURRED_WITHOUT_RESULT,
    STEP_KEY_CHARS,
    DurableRun,
    Semantics,
    durable,
    run_failure,
)
from jixu.threads.tools import ProbeQuery, ToolContext, ToolError, check_declaration

try:
    from agents import (
        Agent,
        FunctionTool,
        Handoff,
        Model,
        ModelProvider,
        ModelResponse,
        RunConfig,
        Runner,
        RunResult,
        Usage,
        handoff,
    )
    from agents import tool as sdk_tools
    from agents.exceptions import (
        InputGuardrailTripwireTriggered,
        MaxTurnsExceeded,
        ModelBehaviorError,
        OutputGuardrailTripwireTriggered,
    )
    from agents.tool import (
        DEFAULT_APPROVAL_REJECTION_MESSAGE,
        ToolOutputFileContent,
        ToolOutputImage,
        ToolOutputText,
        maybe_invoke_function_tool_failure_error_function,
    )
    from pydantic import BaseModel, TypeAdapter, ValidationError
except ImportError as error:  # without the extra: say what to install
    raise MissingExtra.needed("openai-agents", "jixu.integrations.openai_agents (the OpenAI Agents SDK, tested with "
                              "0.24)", error) from error


_HARNESS_OPTIONS: frozenset[str] = frozenset(
    name for name, parameter in inspect.signature(Harness.__init__).parameters.items()
    if parameter.kind is inspect.Parameter.KEYWORD_ONLY)
"""What ``DurableRunner(store, **harness)`` may pass on to its :class:`~jixu.Harness`."""

_REFUSED_INPUT = "Invalid JSON input for tool"
"""How the SDK's function tools begin the error for arguments they refuse before running (not JSON, not an object,
not their parameters' schema)."""

MODEL_STEP = "model"
HANDOFF_STEP = "handoff"
RUN_NAME_CHARS = 200
_SEMANTICS: tuple[str, ...] = get_args(Semantics)
_LOCAL_TOOLS: tuple[type, ...] = tuple(
    getattr(sdk_tools, name) for name in ("ComputerTool", "CustomTool", "ShellTool", "ApplyPatchTool", "LocalShellTool")
    if isinstance(getattr(sdk_tools, name, None), type))
"""Tools the SDK carries out on this machine outside a function tool: nothing would record them."""
_REBUILDABLE = ("openai.", "agents.")
"""Modules whose pydantic classes a recorded model response may name (nothing else is imported from a record)."""
_USAGE: TypeAdapter[Usage] = TypeAdapter(Usage)
_STRUCTURED: TypeAdapter[ToolOutputText | ToolOutputImage | ToolOutputFileContent] = TypeAdapter(
    ToolOutputText | ToolOutputImage | ToolOutputFileContent)
_CURRENT: contextvars.ContextVar[ToolContext | None] = contextvars.ContextVar("jixu_openai_agents_effect",
                                                                             default=None)


# --- what a tool is -------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ToolPolicy:
    """How jixu treats one SDK function tool: its semantics, and a probe that settles an unknown call.

    ``probe(query)`` (sync or async) gets a :class:`~jixu.ProbeQuery` (the call's ``idempotency_key`` and
    parsed arguments) and returns ``Occurred(result=...)`` (the result becomes the tool's output),
    ``NotOccurred()`` (the call is made again, once) or ``DontKnow(...)``.
    """

    semantics: Semantics = "unsafe"
    probe: Callable[[ProbeQuery], Any] | None = None
    probe_timeout: float | None = None

    def __post_init__(self) -> None:
        if self.semantics not in _SEMANTICS:
            raise InvalidInput(f"semantics must be one of {', '.join(_SEMANTICS)}, not {self.semantics!r}",
                               field="semantics")
        if self.probe is not None and not callable(self.probe):
            raise InvalidInput("probe must be a function taking a ProbeQuery", field="probe")

    def checked(self, name: str) -> ToolPolicy:
        """This policy, checked by the rules of a jixu tool for the SDK tool ``name``
        (:class:`~jixu.errors.ToolDefinitionError` names what is wrong), before anything runs."""
        check_declaration(name, _step_name(name), semantics=self.semantics, probe=self.probe,
                          probe_timeout=self.probe_timeout)
        return self


_POLICY_ATTRIBUTE = "_jixu_tool_policy"


def durable_tool(*, semantics: Semantics = "unsafe", probe: Callable[[ProbeQuery], Any] | None = None,
                 probe_timeout: float | None = None) -> Callable[[FunctionTool], FunctionTool]:
    """Declare an SDK function tool's semantics (and probe) for :class:`DurableRunner`; put it above
    ``@function_tool``. The tool itself is unchanged (the declaration is kept on the object)."""
    policy = ToolPolicy(semantics, probe, probe_timeout)

    def declare(tool: FunctionTool) -> FunctionTool:
        if not isinstance(tool, FunctionTool):
            raise InvalidInput("@durable_tool(...) goes above @function_tool: it declares a FunctionTool",
                               field="tool")
        setattr(tool, _POLICY_ATTRIBUTE, policy.checked(tool.name))
        return tool

    return declare


def current_effect() -> ToolContext:
    """The jixu identity of the tool call running now (``effect_id``, ``idempotency_key``, ``attempt``,
    ``thread_id``, ``turn_id``): call it inside an SDK function tool run by :class:`DurableRunner` and send
    ``idempotency_key`` to the outside system."""
    found = _CURRENT.get()
    if found is None:
        raise InvalidInput("current_effect() is only known inside a function tool run by DurableRunner")
    return found


# --- plain JSON -----------------------------------------------------------------------------


def _plain(value: Any, path: str, *, strict: bool = True) -> Any:
    """``value`` as plain JSON (pydantic models dumped, dataclasses and tuples converted). Not strict: what
    is not JSON is named by its type (for hashing a request), instead of :class:`InvalidInput`."""
    if value is None or isinstance(value, bool | str | int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
    elif isinstance(value, BaseModel):
        return _plain(value.model_dump(mode="json", exclude_unset=True, by_alias=True), path, strict=strict)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain({f.name: getattr(value, f.name) for f in dataclasses.fields(value)}, path, strict=strict)
    elif isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: _plain(v, f"{path}.{k}", strict=strict) for k, v in value.items()}
    elif isinstance(value, list | tuple):
        return [_plain(v, f"{path}[{i}]", strict=strict) for i, v in enumerate(value)]
    if not strict:
        return f"<{type(value).__qualname__}>"
    raise InvalidInput(f"{path} is not plain JSON ({type(value).__name__})", field=path)


def dump_model_response(response: ModelResponse) -> JSONObject:
    """A model response as plain JSON: each output item with its class and its fields as set (so
    :func:`load_model_response` rebuilds exactly the same objects), the usage, and the other fields."""
    output: list[JSONObject] = []
    for index, item in enumerate(response.output):
        if isinstance(item, BaseModel):
            cls = type(item)
            output.append({"class": f"{cls.__module__}:{cls.__qualname__}",
                           "data": item.model_dump(mode="json", exclude_unset=True, by_alias=True)})
        else:
            output.append({"data": _plain(item, f"output[{index}]")})
    data: JSONObject = {"output": output, "usage": _USAGE.dump_python(response.usage, mode="json")}
    for field in dataclasses.fields(response):
        if field.name not in ("output", "usage"):
            data[field.name] = _plain(getattr(response, field.name), field.name)
    return data


def load_model_response(data: Mapping[str, Any]) -> ModelResponse:
    """The :class:`agents.ModelResponse` that :func:`dump_model_response` recorded (anything else:
    :class:`~jixu.errors.InvalidInput`)."""
    try:
        return _load_model_response(data)
    except (KeyError, TypeError, AttributeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
        raise InvalidInput(f"not a recorded model response: {type(error).__name__}: {error}"[:500],
                           field="response") from error


def _load_model_response(data: Mapping[str, Any]) -> ModelResponse:
    output: list[Any] = []
    for item in data["output"]:
        name = item.get("class")
        if name is None:
            output.append(item["data"])
            continue
        module, _, qualname = str(name).partition(":")
        if not module.startswith(_REBUILDABLE):
            raise InvalidInput(f"a recorded model response names class {name!r}, outside {_REBUILDABLE}",
                               field="output")
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        if not (isinstance(cls, type) and issubclass(cls, BaseModel)):
            raise InvalidInput(f"a recorded model response names {name!r}, not a pydantic model", field="output")
        output.append(cls.model_validate(item["data"]))
    fields = {f.name for f in dataclasses.fields(ModelResponse)}
    extra = {k: v for k, v in data.items() if k in fields and k not in ("output", "usage")}
    return ModelResponse(output=output, usage=_USAGE.validate_python(data["usage"]), **extra)


def _structured(value: Any) -> ToolOutputText | ToolOutputImage | ToolOutputFileContent | None:
    """``value`` as one of the SDK's structured tool outputs (a model, or its dict form), or None."""
    if isinstance(value, ToolOutputText | ToolOutputImage | ToolOutputFileContent):
        return value
    if isinstance(value, dict) and "type" in value:
        try:
            return _STRUCTURED.validate_python(value)
        except ValidationError:
            return None
    return None


def _tool_output(value: Any) -> Any:
    """What a tool returned, as recorded and given to the SDK (now and on every rerun): what the model is
    sent for it. Strings, numbers, booleans and None stay; the SDK's structured outputs (``ToolOutputText``
    ..., or a list of them) become the dicts it accepts for them; anything else becomes ``str(value)``, which
    is what the SDK sends the model (a recorded dict would come back with its keys sorted)."""
    if value is None or isinstance(value, str | bool | int) or (isinstance(value, float) and math.isfinite(value)):
        return value
    one = _structured(value)
    if one is not None:
        return one.model_dump(mode="json", exclude_none=True)
    if isinstance(value, list | tuple) and value:
        many = [_structured(v) for v in value]
        if all(m is not None for m in many):
            return [m.model_dump(mode="json", exclude_none=True) for m in many if m is not None]
    return str(value)


def _request_hash(system_instructions: str | None, input: Any, model_settings: Any, tools: list[Any],
                  output_schema: Any, handoffs: list[Any], previous_response_id: str | None,
                  conversation_id: str | None, prompt: Any) -> str:
    """A digest of everything the model is asked (what a rerun must ask again to get the recorded answer)."""
    described_tools = []
    for tool in tools:
        if isinstance(tool, FunctionTool):
            described_tools.append({"function": tool.name, "description": tool.description,
                                    "parameters": tool.params_json_schema, "strict": tool.strict_json_schema})
        else:
            described_tools.append({"tool": type(tool).__name__, "name": getattr(tool, "name", None)})
    schema = None
    if output_schema is not None:
        schema = "text" if output_schema.is_plain_text() else output_schema.json_schema()
    settings = model_settings.to_json_dict() if hasattr(model_settings, "to_json_dict") else model_settings
    request = {"instructions": system_instructions, "input": input, "settings": settings,
               "tools": described_tools, "output_schema": schema,
               "handoffs": [{"tool": h.tool_name, "description": h.tool_description,
                             "parameters": h.input_json_schema} for h in handoffs],
               "previous_response_id": previous_response_id, "conversation_id": conversation_id,
               "prompt": prompt}
    return content_hash(_plain(request, "request", strict=False))


def _short_key(prefix: str, text: str) -> str:
    """``prefix:text``, with ``text`` replaced by its digest when the key would be too long."""
    key = f"{prefix}:{text}"
    if len(key) <= STEP_KEY_CHARS - 8:
        return key
    return f"{prefix}:{hashlib.sha256(text.encode()).hexdigest()[:32]}"


# --- one run's wrappers ---------------------------------------------------------------------


class _DurableModel(Model):
    """The SDK model ``model`` whose every ``get_response`` is a durable step of the run."""

    def __init__(self, model: Model, steps: _RunSteps) -> None:
        self.model = model
        self._steps = steps

    @property
    def model_name(self) -> str:
        name = getattr(self.model, "model", None)
        return name if isinstance(name, str) else type(self.model).__name__

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any,
                           tools: list[Any], output_schema: Any, handoffs: list[Any], tracing: Any, *,
                           previous_response_id: str | None, conversation_id: str | None,
                           prompt: Any) -> ModelResponse:
        steps = self._steps
        scope = steps.scope()
        number = scope.model_calls + 1  # counted when answered: the SDK's own retry asks for the same call again
        args = {"model": self.model_name,
                "request": _request_hash(system_instructions, input, model_settings, tools, output_schema,
                                         handoffs, previous_response_id, conversation_id, prompt)}
        raised: list[Exception] = []

        async def call(ctx: ToolContext) -> JSONObject:
            try:
                response = await self.model.get_response(
                    system_instructions, input, model_settings, tools, output_schema, handoffs, tracing,
                    previous_response_id=previous_response_id, conversation_id=conversation_id, prompt=prompt)
            except Exception as error:
                # No answer to replay, and nothing happened outside: a determinate failure of this call.
                raised.append(error)
                raise ToolError(f"{type(error).__name__}: {error}"[:2000], code="model_error",
                                data={"exception": type(error).__name__}) from error
            return dump_model_response(response)

        while True:
            generation = scope.model_generation.get(number, 1)
            key = scope.key(f"{MODEL_STEP}#{number}" + (f".{generation}" if generation > 1 else ""))
            try:
                recorded = await steps.run.effect(MODEL_STEP, args, call=call, semantics="read_only", key=key)
            except StepFailed as failed:
                if failed.details.get("reason") != "failed":
                    raise
                scope.model_generation[number] = generation + 1
                if raised:  # the SDK sees the model's own error, as without jixu
                    steps.model_errors.append(raised[0])
                    raise raised[0] from raised[0].__cause__
                continue  # a call that failed in an earlier process: ask the model again
            if not isinstance(recorded, dict):
                # Settled by an operator (``occurred``) without the response: there is nothing to replay.
                scope.model_generation[number] = generation + 1
                continue
            scope.model_calls = number
            # The SDK gets the response rebuilt from its record, now as on every rerun: both see the same.
            return load_model_response(recorded)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidInput("DurableRunner records whole model responses; streaming (Runner.run_streamed) is not "
                           "durable: use DurableRunner.run")

    async def close(self) -> None:
        await self.model.close()

    def get_retry_advice(self, request: Any) -> Any:
        return self.model.get_retry_advice(request)


class _DurableProvider(ModelProvider):
    """The run's model provider: the models it hands out are durable."""

    def __init__(self, provider: ModelProvider, steps: _RunSteps) -> None:
        self._provider = provider
        self._steps = steps

    def get_model(self, model_name: str | None) -> Model:
        return self._steps.model(self._provider.get_model(model_name))

    async def aclose(self) -> None:
        await self._provider.aclose()


@dataclasses.dataclass(eq=False)
class _Scope:
    """The step counters of one agent loop of a :class:`DurableRunner` run: the run's own (``prefix`` empty) or
    the loop of an agent used as a tool (``prefix``: that tool call's step key). Each loop counts its own model
    calls, tool calls and handoffs, so the steps of agent tools running at once keep their keys on every rerun,
    whatever order the calls of the loops interleave in."""

    steps: _RunSteps
    prefix: str = ""
    model_calls: int = 0
    model_generation: dict[int, int] = dataclasses.field(default_factory=dict)
    """Per model call, the next step key's generation (``model#3.2`` after ``model#3`` failed)."""
    handoffs: int = 0
    tool_calls: Counter[tuple[str, str]] = dataclasses.field(default_factory=Counter)

    def tool_key(self, name: str, call_id: str) -> str:
        """The step key of this loop's next call of tool ``name`` with ``call_id`` (counted: a model may reuse a
        call id in a later response)."""
        self.tool_calls[(name, call_id)] += 1
        return self.key(_short_key(name, f"{call_id}#{self.tool_calls[(name, call_id)]}"))

    def key(self, local: str) -> str:
        """The run's step key for this loop's ``local`` key (``<prefix>/<local>``; a digest when too long)."""
        if not self.prefix:
            return local
        key = f"{self.prefix}/{local}"
        return key if len(key) <= STEP_KEY_CHARS else f"~{hashlib.sha256(key.encode()).hexdigest()[:40]}"


_SCOPE: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("jixu_openai_agents_scope", default=None)


class _RunSteps:
    """What one :meth:`DurableRunner.run` wraps: its durable run, its step counters, its wrapped agents."""

    def __init__(self, run: DurableRun, policies: Mapping[str, ToolPolicy]) -> None:
        self.run = run
        self._policies = policies
        self.root = _Scope(self)
        self._agents: dict[int, Agent[Any]] = {}
        self.model_errors: list[Exception] = []
        """What the model raised in this process (re-raised to the SDK): a rerun asks the model again, so none of
        them ends the run for good, whatever its type (a ``ModelBehaviorError`` of a model wrapper included)."""

    def raised_by_model(self, error: BaseException) -> bool:
        """True when ``error``, or what it wraps, is one the model raised here (:attr:`model_errors`)."""
        seen: set[int] = set()
        current: BaseException | None = error
        while current is not None and id(current) not in seen:
            if any(current is raised for raised in self.model_errors):
                return True
            seen.add(id(current))
            current = current.__cause__ or current.__context__
        return False

    def scope(self) -> _Scope:
        """The agent loop running now: an agent tool's (set while it runs), else the run's own."""
        found = _SCOPE.get()
        return found if found is not None and found.steps is self else self.root

    def model(self, model: Model) -> Model:
        return model if isinstance(model, _DurableModel) else _DurableModel(model, self)

    def policy(self, tool: FunctionTool) -> ToolPolicy:
        found = self._policies.get(tool.name)
        if found is not None:
            return found
        declared = getattr(tool, _POLICY_ATTRIBUTE, None)
        return declared if isinstance(declared, ToolPolicy) else ToolPolicy()

    def agent(self, agent: Agent[Any]) -> Agent[Any]:
        """A clone of ``agent`` whose model, function tools and handoffs are durable (one per agent per run;
        handoffs are wrapped when taken, so agents that hand off to each other are fine)."""
        found = self._agents.get(id(agent))
        if found is not None:
            return found
        refuse_local_tools(agent)
        changes: dict[str, Any] = {
            "tools": [self._tool(t) if isinstance(t, FunctionTool) else t for t in agent.tools],
            "handoffs": [self._handoff(h if isinstance(h, Handoff) else handoff(h), agent) for h in agent.handoffs],
        }
        if isinstance(agent.model, Model):
            changes["model"] = self.model(agent.model)
        clone = agent.clone(**changes)
        self._agents[id(agent)] = clone
        self._agents[id(clone)] = clone
        return clone

    def _tool(self, tool: FunctionTool) -> FunctionTool:
        if getattr(tool, "_is_agent_tool", False):
            return self._agent_tool(tool)
        policy = self.policy(tool)
        original = handled = tool.on_invoke_tool
        # A tool made by the SDK's function_tool reads its arguments as a JSON object before any code of its own
        # runs: arguments that are not one cannot have done anything outside, so they are no step (see ``invoke``).
        parses_first = getattr(handled, "_invoke_tool_impl", None) is not None
        if policy.semantics == "unsafe":
            # The SDK's invoker turns an exception into text for the model ("An error occurred ..."): recorded so,
            # an unsafe call that raised after its side effect would look succeeded, and the model's retry would
            # repeat it. Inside the step the tool runs without that handling, so its exception leaves the call's
            # outcome unknown (its probe, or an operator, settles it), as for every jixu tool.
            original = getattr(original, "_invoke_tool_impl", original)
        needs_approval = tool.needs_approval
        name = tool.name
        timeout = tool.timeout_seconds

        async def invoke(ctx: Any, input_json: str) -> Any:
            try:
                parsed = json.loads(input_json) if input_json else {}
            except ValueError:
                parsed = None
            if parses_first and not isinstance(parsed, dict):
                # Refused before it would run: the SDK tells the model (or raises) as without jixu. As a step, an
                # unsafe call's refusal was an outcome in doubt, stopping the run until an operator came.
                return await handled(ctx, input_json)
            args: JSONObject = parsed if isinstance(parsed, dict) else {"arguments": input_json}
            call_id = str(getattr(ctx, "tool_call_id", "") or "")
            if callable(needs_approval):
                # The SDK asks a policy about raw parsed arguments, and requires approval when they do not parse.
                approval = parsed is None or bool(await needs_approval(ctx, args, call_id))
            else:
                approval = bool(needs_approval)
            key = self.scope().tool_key(name, call_id)

            async def call(effect: ToolContext) -> Any:
                token = _CURRENT.set(effect)
                try:
                    return _tool_output(await original(ctx, input_json))
                except ModelBehaviorError as error:
                    if not (parses_first and str(error).startswith(f"{_REFUSED_INPUT} {name}")):
                        raise
                    # Arguments that break the tool's parameters, refused before any code of it ran: the call
                    # is over with what the SDK tells the model (an unsafe call's refusal was an unknown outcome).
                    return _tool_output(await handled(ctx, input_json))
                finally:
                    _CURRENT.reset(token)

            try:
                result = await self.run.effect(_step_name(name), _plain(args, "arguments"), call=call,
                                               semantics=policy.semantics, probe=policy.probe,
                                               probe_timeout=policy.probe_timeout, requires_approval=approval,
                                               timeout=timeout, key=key)
                if result is None and self.run.settled_without_result(key):
                    return OCCURRED_WITHOUT_RESULT  # the model told ``None`` might make the call again
                return result
            except StepFailed as failed:
                reason = failed.details.get("reason")
                if reason == "denied":
                    return DEFAULT_APPROVAL_REJECTION_MESSAGE  # what the SDK tells the model of a rejection
                if reason == "abandoned_unknown":
                    return RESOLUTION_MESSAGES["abandoned_unknown"]  # what a jixu agent's model is told
                if reason == "failed":
                    # A determinate failure (the tool raised jixu.ToolError: it did no harm), recorded: told to the
                    # model as the SDK tells it a tool's error (the tool's failure formatter; with none, the SDK
                    # raises, and so does this), from the record, so a rerun tells it the same.
                    told = await maybe_invoke_function_tool_failure_error_function(
                        function_tool=tool, context=ctx, error=ToolError.recorded(failed.details.get("error")))
                    if told is not None:
                        return told
                raise

        # The SDK never interrupts for approval here: a call needing one is parked by jixu and waits for it. Its
        # timeout is the step's: the SDK's would tell the model "timed out" about a call whose outcome is unknown
        # (the model would call again, under a new key) and a rerun could not replay what the model was told.
        return dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=False, timeout_seconds=None)

    def _agent_tool(self, tool: FunctionTool) -> FunctionTool:
        """An agent used as a tool (``Agent.as_tool``): an ``idempotent`` step whose call is the SDK's own invoker
        (its input parsing, output extraction, failure handling) running the durable clone of the agent, with
        this run's model provider. The agent's model calls, tool calls and handoffs are steps of their own, keyed
        under this call's key, so calling it again (after a crash) replays them; its output, a failure the SDK
        told the model included, is the step's result."""
        sdk_invoker, run_agent, sub_agent = _agent_tool_parts(tool)
        name = tool.name
        config = _cell(run_agent, "run_config")
        timeout = tool.timeout_seconds  # the step's, as for any function tool (see _tool)

        async def run_durably(ctx: Any, input_json: str) -> Any:
            # The agent is wrapped when called (as handoffs are), so agents that are each other's tools are fine.
            cells: dict[str, Any] = {"self": self.agent(sub_agent)}
            if config is not None:  # the tool's own run config replaces the run's for the agent's loop
                cells["run_config"] = self.config(RunConfig(**config) if isinstance(config, dict) else config)
            try:
                return await _with_cells(run_agent, cells)(ctx, input_json)
            except Exception as error:
                found = _jixu_error(error)
                if found is None:
                    raise  # the SDK's failure handling tells the model, as without jixu
                raise _StepStop(found) from error  # past that handling: the run stops, as for any step's error

        invoker: list[Any] = []

        async def invoke(ctx: Any, input_json: str) -> Any:
            call_id = str(getattr(ctx, "tool_call_id", "") or "")
            key = self.scope().tool_key(name, call_id)
            try:
                parsed = json.loads(input_json) if input_json else {}
            except ValueError:
                parsed = None
            args: JSONObject = parsed if isinstance(parsed, dict) else {"arguments": input_json}

            async def call(effect: ToolContext) -> Any:
                token = _SCOPE.set(_Scope(self, key))
                try:
                    return _tool_output(await invoker[0](ctx, input_json))
                finally:
                    _SCOPE.reset(token)

            try:
                result = await self.run.effect(_step_name(name), _plain(args, "arguments", strict=False), call=call,
                                               semantics="idempotent", timeout=timeout, key=key)
                if result is None and self.run.settled_without_result(key):
                    return OCCURRED_WITHOUT_RESULT  # as for a function tool: the model told None may call again
                return result
            except _StepStop as stop:
                raise stop.error from stop.__cause__

        durable_tool = dataclasses.replace(tool, on_invoke_tool=invoke, needs_approval=False, timeout_seconds=None)
        invoker.append(type(sdk_invoker)(run_durably, sdk_invoker._on_handled_error).__agents_bind_function_tool__(
            durable_tool))
        return durable_tool

    def config(self, config: RunConfig) -> RunConfig:
        """``config`` with its model provider (and model) durable in this run."""
        changes: dict[str, Any] = {"model_provider": _DurableProvider(config.model_provider, self)}
        if isinstance(config.model, Model):
            changes["model"] = self.model(config.model)
        return dataclasses.replace(config, **changes)

    def _handoff(self, given: Handoff[Any, Any], source: Agent[Any]) -> Handoff[Any, Any]:
        original = given.on_invoke_handoff

        async def invoke(ctx: Any, input_json: str) -> Agent[Any]:
            scope = self.scope()
            scope.handoffs += 1
            key = scope.key(f"{HANDOFF_STEP}#{scope.handoffs}")
            taken: list[Any] = []

            async def call(effect: ToolContext) -> JSONObject:
                target = await original(ctx, input_json)
                taken.append(target)
                return {"agent": target.name}

            try:
                parsed = json.loads(input_json) if input_json else None
            except ValueError:
                parsed = input_json
            args = {"from": source.name, "to": given.agent_name, "tool": given.tool_name,
                    "input": _plain(parsed, "input", strict=False)}
            recorded = await self.run.effect(HANDOFF_STEP, args, call=call, semantics="idempotent", key=key)
            if not taken:  # replayed: the target is the handoff's own agent (its on_handoff ran before)
                ref = getattr(given, "_agent_ref", None)
                known = ref() if ref is not None else None
                # A Handoff of your own with no agent to refer to is asked again (its callback runs again).
                taken.append(known if known is not None else await original(ctx, input_json))
            target = taken[0]
            went = recorded.get("agent") if isinstance(recorded, dict) else None
            if went is None and self.run.settled_without_result(key):
                went = target.name  # an operator said it happened, without naming where to: the handoff's own agent
            if target.name != went:
                raise StepMismatch(f"{key} of durable run {self.run.turn_id} went to agent {went!r}; it now goes "
                                   f"to {target.name!r}", thread_id=self.run.thread_id, step=key)
            return self.agent(target)

        return dataclasses.replace(given, on_invoke_handoff=invoke)


class _StepStop(BaseException):
    """A step's jixu error carried past the SDK's handling of an agent tool's exceptions (which would tell the
    model): the run stops as for any step's error."""

    def __init__(self, error: JixuError) -> None:
        super().__init__(error.message)
        self.error = error


def _agent_tool_parts(tool: FunctionTool) -> tuple[Any, Callable[..., Any], Agent[Any]]:
    """An agent tool's SDK invoker, the function it calls (which runs the agent) and the agent; InvalidInput
    when the tool is not what ``Agent.as_tool`` of the SDK versions jixu knows makes, or uses what a run cannot
    record (a session, streaming, the SDK's approval)."""
    invoker = tool.on_invoke_tool
    run_agent: Any = getattr(invoker, "_invoke_tool_impl", None)
    agent = getattr(tool, "_agent_instance", None)
    code = getattr(run_agent, "__code__", None)
    if (not isinstance(agent, Agent) or code is None or not hasattr(invoker, "_on_handled_error")
            or not hasattr(invoker, "__agents_bind_function_tool__")
            or not {"self", "run_config", "session", "on_stream"} <= set(code.co_freevars)
            or _cell(run_agent, "self") is not agent):
        raise InvalidInput(f"tool {tool.name!r} is an agent used as a tool, made in a way DurableRunner does not "
                           "know (it knows Agent.as_tool of openai-agents 0.24): it cannot be made durable",
                           field="tools")
    refusal = None
    if _cell(run_agent, "session") is not None:
        refusal = "a session (it changes the input a rerun sees)"
    elif _cell(run_agent, "on_stream") is not None:
        refusal = "on_stream (a streamed run is not durable)"
    elif tool.needs_approval is not False:
        refusal = "needs_approval (the calls of its agent are the steps: require approval on its tools)"
    if refusal is not None:
        raise InvalidInput(f"agent tool {tool.name!r} (agent {agent.name!r}) has {refusal}: DurableRunner cannot "
                           "record it", field="tools")
    return invoker, run_agent, agent


def _cell(function: Any, name: str) -> Any:
    """The value ``function``'s closure holds for the free variable ``name`` (None if it has none)."""
    names = getattr(getattr(function, "__code__", None), "co_freevars", ())
    if name not in names:
        return None
    return function.__closure__[names.index(name)].cell_contents


def _with_cells(function: Any, values: Mapping[str, Any]) -> Callable[..., Any]:
    """A copy of ``function`` whose closure holds ``values`` for those free variables (``function`` unchanged)."""
    names = function.__code__.co_freevars
    closure = tuple(types.CellType(values[n]) if n in values else cell
                    for n, cell in zip(names, function.__closure__, strict=True))
    copy = types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                              closure)
    copy.__kwdefaults__ = function.__kwdefaults__
    return copy


def _step_name(tool_name: str) -> str:
    """A jixu tool name for an SDK tool name (jixu names are ``[a-zA-Z_][a-zA-Z0-9_-]{0,63}``)."""
    cleaned = "".join(c if c.isascii() and (c.isalnum() or c in "_-") else "_" for c in tool_name)[:64]
    return cleaned if cleaned and (cleaned[0].isalpha() or cleaned[0] == "_") else f"_{cleaned}"[:64]


def refuse_local_tools(agent: Agent[Any]) -> None:
    """Refuse what the SDK would run on this machine without a function tool (nothing would record it)."""
    for tool in agent.tools:
        if isinstance(tool, _LOCAL_TOOLS):
            raise InvalidInput(f"agent {agent.name!r} has a {type(tool).__name__}, which the SDK runs on this machine "
                               "outside a function tool: DurableRunner cannot record it; wrap it in a function tool",
                               field="tools")
    if getattr(agent, "mcp_servers", None):
        raise InvalidInput(f"agent {agent.name!r} uses MCP servers, whose tools the SDK lists at run time: "
                           "DurableRunner cannot record them yet; wrap the calls in function tools",
                           field="mcp_servers")


def _reachable(agent: Agent[Any]) -> list[Agent[Any]]:
    """The agent and every agent its handoffs (known in advance) lead to or it uses as a tool."""
    seen: dict[int, Agent[Any]] = {}
    todo = [agent]
    while todo:
        current = todo.pop()
        if id(current) in seen:
            continue
        seen[id(current)] = current
        todo.extend(_agent_tool_parts(t)[2] for t in current.tools
                    if isinstance(t, FunctionTool) and getattr(t, "_is_agent_tool", False))
        for item in current.handoffs:
            if isinstance(item, Agent):
                todo.append(item)
            else:
                ref = getattr(item, "_agent_ref", None)
                target = ref() if ref is not None else None
                if isinstance(target, Agent):
                    todo.append(target)
    return list(seen.values())


def _jixu_error(error: BaseException) -> JixuError | None:
    """The jixu error (a step's) that ``error`` is, or that the SDK wrapped into it, if any."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, JixuError):
            return current
        seen.add(id(current))
        current = current.__cause__
    return None


FINAL_ERRORS = (MaxTurnsExceeded, InputGuardrailTripwireTriggered, OutputGuardrailTripwireTriggered, StepFailed,
                ModelBehaviorError)
"""Errors a rerun would meet again (it replays every recorded step; the SDK's ``ModelBehaviorError`` about a
recorded model response, such as one naming no tool of the agent, but not one the model call itself raised: a
rerun asks the model again, see :meth:`_RunSteps.raised_by_model`): the run ends ``failed`` instead of staying
unfinished and locking its thread; the next call starts the thread's next run. Unless an unsafe step of the run has
an unknown outcome: the run then stays unfinished (:class:`~jixu.errors.StepOutcomeUnknown`), so that a next run
cannot make that call again; the next call continues it."""


def _final_failure(error: Exception) -> JSONObject | None:
    """The error a run ends with for good (:data:`FINAL_ERRORS`), or None when it must stay unfinished."""
    if not isinstance(error, FINAL_ERRORS):
        return None
    return run_failure(error)


def _run_name(input: Any) -> str:
    """The durable run's default name: the input's first line (so a rerun with other input is refused)."""
    if isinstance(input, str):
        first = input.strip().splitlines()[0].strip() if input.strip() else ""
        if first:
            return first[:RUN_NAME_CHARS]
    return "run"


# --- the runner -----------------------------------------------------------------------------


class DurableRunner:
    """``Runner.run`` / ``Runner.run_sync`` of the OpenAI Agents SDK, durable on a jixu thread.

    ``target`` is a store (a :class:`~jixu.ledger.Store`, a URL or a path; each run opens a harness on it
    whose threads are recorded under the starting agent's name) or a :class:`~jixu.Harness` of yours.
    ``tools`` maps tool names to a :class:`ToolPolicy` or a semantics (it wins over :func:`durable_tool`);
    ``harness`` goes to :class:`~jixu.Harness` (``owner``, ``lease_ttl``, ``max_attempts``, ...).
    """

    def __init__(self, target: Store | Harness | str | os.PathLike[str], *,
                 tools: Mapping[str, ToolPolicy | Semantics] | None = None,
                 approval_poll: float = DEFAULT_APPROVAL_POLL, **harness: Any) -> None:
        if isinstance(target, Harness) and harness:
            raise InvalidInput(f"harness options ({', '.join(sorted(harness))}) go to your Harness itself",
                               field="harness")
        unknown = sorted(set(harness) - _HARNESS_OPTIONS)
        if unknown:
            raise InvalidInput(f"unknown harness option(s) {', '.join(unknown)} (a Harness takes "
                               f"{', '.join(sorted(_HARNESS_OPTIONS))})", field="harness")
        if tools is not None and (not isinstance(tools, Mapping) or not all(isinstance(k, str) for k in tools)):
            raise InvalidInput("tools must map tool names to a ToolPolicy or a semantics", field="tools")
        self._target = target
        self._harness_options = harness
        self._approval_poll = approval_poll
        policies: dict[str, ToolPolicy] = {}
        for name, given in (tools or {}).items():
            policies[name] = (given if isinstance(given, ToolPolicy) else ToolPolicy(given)).checked(name)
        self._policies = policies

    def _durable(self, agent: Agent[Any], thread_id: str | None, name: str, run_key: str | None) -> DurableRun:
        if isinstance(self._target, Harness):
            return self._target.durable(thread_id, name=name, approval_poll=self._approval_poll, run_key=run_key)
        return durable(self._target, thread_id, name=name, agent=agent.name, approval_poll=self._approval_poll,
                       run_key=run_key, **self._harness_options)

    def _check(self, agent: Agent[Any], input: Any, kwargs: Mapping[str, Any]) -> None:
        if not isinstance(agent, Agent):
            raise InvalidInput("DurableRunner runs an agents.Agent", field="starting_agent")
        if not isinstance(input, str | list):
            raise InvalidInput("the input is a string or a list of input items (a RunState is not resumed: the "
                               "thread is the run's state; run again with its thread_id)", field="input")
        if kwargs.get("session") is not None:
            raise InvalidInput("an SDK session changes the input a rerun sees; the jixu thread records the run",
                               field="session")
        agents = _reachable(agent)
        tool_names: set[str] = set()
        agent_tools: set[str] = set()
        for each in agents:
            refuse_local_tools(each)
            for tool in each.tools:
                if not isinstance(tool, FunctionTool):
                    continue
                if not getattr(tool, "_is_agent_tool", False):
                    tool_names.add(tool.name)
                    continue
                agent_tools.add(tool.name)
                if getattr(tool, _POLICY_ATTRIBUTE, None) is not None:
                    raise InvalidInput(f"tool {tool.name!r} is an agent used as a tool: its semantics are its "
                                       "agent's steps'; declare the semantics of its tools", field="tools")
        only_agents = sorted((set(self._policies) & agent_tools) - tool_names)
        if only_agents:  # a name an ordinary tool also has is that tool's policy
            raise InvalidInput(f"tools= names {', '.join(only_agents)}, an agent used as a tool: its semantics are "
                               "its agent's steps'; declare the semantics of its tools", field="tools")
        unknown = sorted(set(self._policies) - tool_names)
        if unknown:
            raise InvalidInput(f"tools= names no function tool of agent {agent.name!r} or the agents it hands off "
                               f"to: {', '.join(unknown)}", field="tools")

    async def run(self, starting_agent: Agent[Any], input: str | list[Any], *, thread_id: str | None = None,
                  name: str | None = None, started: Callable[[str], Any] | None = None,
                  run_config: RunConfig | None = None, run_key: str | None = None, **kwargs: Any) -> RunResult:
        """Run ``starting_agent`` as ``Runner.run`` does, durably; ``kwargs`` go to ``Runner.run``.

        ``thread_id`` None starts a new thread (``started(thread_id)`` is called once the run is recorded, before
        anything runs: keep it to run again after a crash). Run the same call again with the thread id to
        continue an unfinished run: completed steps return what they recorded, an unsafe tool cut off is never
        repeated (its probe or an operator settles it: :class:`~jixu.errors.StepOutcomeUnknown` until then).
        ``name`` names the run (default: the input's first line); a rerun must give the same. ``run_key`` names
        the run for good: once it has ended, the same call replays its record (the same result, no model or tool
        call) instead of starting the thread's next run (decision 0051).
        """
        self._check(starting_agent, input, kwargs)
        async with self._durable(starting_agent, thread_id, name or _run_name(input), run_key) as run:
            if started is not None:
                started(run.thread_id)
            steps = _RunSteps(run, self._policies)
            config = steps.config(run_config if run_config is not None else RunConfig())
            try:
                result = await Runner.run(steps.agent(starting_agent), input, run_config=config, **kwargs)
            except Exception as error:
                found = _jixu_error(error)
                shown: Exception = found if isinstance(found, Exception) else error
                # The model's own error is met again by no rerun (the request is asked again): never final.
                failure = None if steps.raised_by_model(error) else _final_failure(shown)
                if failure is None:  # unfinished: running again with the thread id continues it
                    if shown is error:
                        raise
                    raise shown from shown.__cause__  # the SDK wraps a tool's exception in UserError: show ours
                run.error = failure  # the block ends normally: the run is recorded failed
                final: Exception | None = shown
            else:
                run.reply = str(result.final_output)
                final = None
        if final is not None:
            raise final
        return result

    def run_sync(self, starting_agent: Agent[Any], input: str | list[Any], **kwargs: Any) -> RunResult:
        """:meth:`run` for code without an event loop (as ``Runner.run_sync``)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self.run(starting_agent, input, **kwargs))
        raise InvalidInput("run_sync cannot run inside an event loop: await DurableRunner.run(...)")


__all__ = ["DurableRunner", "ToolPolicy", "current_effect", "dump_model_response", "durable_tool",
           "load_model_response"]
