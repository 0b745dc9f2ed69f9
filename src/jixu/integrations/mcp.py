"""Tools served by MCP servers as jixu tools (the ``mcp`` extra: the official MCP SDK, version 2).

::

    from jixu.integrations import mcp as jixu_mcp

    async with jixu_mcp.connect_stdio(sys.executable, ["shop_server.py"]) as shop:
        agent = jixu.Agent("clerk", model, tools=[*shop.tools()])
        thread = await jixu.Harness(agent, "shop.db").create_thread()
        ...

Connecting (:func:`connect_stdio`, :func:`connect_http` for streamable HTTP, :func:`connect` for any other
transport of the SDK) starts a session, lists the server's tools and makes each a :class:`~jixu.Tool`: its
name, description and input JSON Schema (checked with ``jsonschema`` before every call). Its call goes through
the thread's own path like any tool's: the intent, the dispatch marker durable before the request is sent,
one receipt; the RecoveryResolver judges it. The MCP session itself is not recorded, only the calls.

Semantics come from the tool's annotations: ``readOnlyHint`` -> ``read_only``, else ``idempotentHint`` ->
``idempotent``, else ``unsafe``; ``semantics={"tool": ...}`` overrides them per tool (and
``trust_annotations=False`` ignores the annotations of a server you do not trust: the MCP specification says
they are hints). ``probes=``, ``requires_approval=``, ``timeout=`` are as for ``@jixu.tool``.

The idempotency key (``ToolContext.idempotency_key``: the same on every attempt of one call) reaches the
server two ways: always in the request's ``_meta`` as ``jixu/idempotency_key`` (with ``jixu/effect_id`` and
``jixu/attempt``), and, when the tool's input schema declares a top-level string property named
``idempotency_key`` (``key_argument=``), as that argument: jixu fills it in on every call and hides it from
the model (it is not in the schema the model is shown, nor in the recorded arguments).

A result maps to the tool's result: ``structuredContent`` when the server sends it, else the text of its text
blocks (joined by newlines), else ``{"content": [blocks]}``. ``isError`` of a ``read_only`` or ``idempotent``
tool is a determinate failure (:class:`~jixu.ToolError` code ``mcp_tool_error``), and so is a JSON-RPC error saying
the tool was not run (unknown tool or invalid arguments: codes -32601, -32602). ``isError`` of an ``unsafe`` tool
leaves its outcome unknown (:class:`~jixu.errors.MCPToolOutcomeUnknown`; its probe or an operator settles it): the
official server SDK answers an exception its tool code raised with ``isError`` too, even one raised after the tool
acted, and a model told of a failure calls again, under a new key. Name the unsafe tools whose code reports every
error before acting in ``errors_before_acting=``: their ``isError`` is a determinate failure. Anything else that
stops a call after its request may have been sent
(the server died, the connection broke, a timeout, any other JSON-RPC error) has an unknown outcome: an ``unsafe`` call stays ``unknown`` for a probe or an operator, a retry-safe one is
called again by the resolver's decision. Nothing here re-sends a call: a dead session is replaced (the stdio
server started again) before the next call, and if that fails the call is a determinate failure
(``mcp_unavailable``: nothing was sent).

Durable steps: ``await shop.step(run, "charge", {...})`` runs the MCP tool as one step of a durable run, with
the tool's semantics and probe.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import re
import sys
from collections.abc import AsyncIterator, Callable, Collection, Mapping, Sequence
from types import TracebackType
from typing import Any, Self, TextIO, TypedDict, Unpack

from jixu.errors import (
    InvalidInput,
    MCPConnectionError,
    MCPToolOutcomeUnknown,
    MissingExtra,
    ToolDefinitionError,
)
from jixu.threads.steps import DurableRun
from jixu.threads.tools import ArgumentsSchema, ProbeQuery, Semantics, Tool, ToolContext, ToolError

try:
    import httpx2
    import jsonschema  # type: ignore[import-untyped]
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared.exceptions import MCPError
    from mcp.types import PaginatedRequestParams
except ImportError as error:  # pragma: no cover - exercised in a child process without the SDK
    raise MissingExtra.needed("mcp", "jixu.integrations.mcp (the MCP SDK, mcp>=2)", error) from error

META_IDEMPOTENCY_KEY = "jixu/idempotency_key"
"""The request ``_meta`` key carrying the call's idempotency key."""
META_EFFECT_ID = "jixu/effect_id"
META_ATTEMPT = "jixu/attempt"
KEY_ARGUMENT = "idempotency_key"
"""The input property jixu fills with the idempotency key when a tool's schema declares it."""
NOT_RUN_CODES = frozenset({-32601, -32602})
"""JSON-RPC error codes that say the server did not run the tool (method or tool not found, invalid
arguments); every other error leaves the outcome unknown, but :data:`SESSION_GONE`."""
SESSION_GONE = (-32600, frozenset({"Session not found", "Session terminated"}))
"""The answer (code, messages) to a call on a session the server no longer knows (an HTTP 404 for its
``Mcp-Session-Id``: the server restarted), the server's own or the SDK client's: refused before anything ran.
The client also answers -32600 with other messages for requests the server may have run (a 202 for a request,
an unexpected content type, a redirect not followed): those leave the outcome unknown."""
CLOSE_TIMEOUT = 10.0
CONNECTION_CLOSED = -32000
_CONTEXT = "jixu_context"
_NAME_CHARS = re.compile(r"[^a-zA-Z0-9_-]")
_JIXU_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_-]{0,63}")

Transport = Callable[[], contextlib.AbstractAsyncContextManager[Any]]
"""A function returning a fresh SDK transport (an async context manager yielding the read and write
streams, e.g. ``lambda: stdio_client(params)``); called again to replace a dead session."""


class ConnectOptions(TypedDict, total=False):
    """How the server's tools become jixu tools; every mapping is keyed by the tool's name on the server."""

    semantics: Mapping[str, Semantics]
    """Overrides the semantics the annotations give."""
    probes: Mapping[str, Callable[[ProbeQuery], Any]]
    """A probe per tool (``idempotent`` and ``unsafe`` tools; see ``@jixu.tool``)."""
    requires_approval: Collection[str]
    """Tools whose every call is parked until approved or denied."""
    timeout: float | None
    """Seconds a call may take (each tool's ``timeout``); past it the outcome is unknown."""
    include: Collection[str] | None
    """Only these tools (default: all that the server lists)."""
    prefix: str
    """Put before every jixu tool name (e.g. ``"shop_"``)."""
    names: Mapping[str, str]
    """The jixu name of a tool (default: ``prefix`` + its name, other characters than letters, digits, ``_``
    and ``-`` replaced by ``_``)."""
    trust_annotations: bool
    """Whether the server's annotations give the semantics (default True); False: every tool is ``unsafe``
    unless ``semantics`` says otherwise."""
    key_argument: str | None
    """The input property that receives the idempotency key when a tool declares it (default
    ``idempotency_key``; None: only ``_meta``)."""
    errors_before_acting: Collection[str]
    """``unsafe`` tools whose ``isError`` means they did not act (their code reports every error before it acts):
    a determinate failure. For any other ``unsafe`` tool ``isError`` leaves the outcome unknown."""


# --- pure mappings ------------------------------------------------------------------------------


def semantics_from_annotations(annotations: Mapping[str, Any] | None) -> Semantics:
    """``readOnlyHint`` -> ``read_only``, else ``idempotentHint`` -> ``idempotent``, else ``unsafe`` (wire form)."""
    annotations = annotations or {}
    if annotations.get("readOnlyHint") is True:
        return "read_only"
    if annotations.get("idempotentHint") is True:
        return "idempotent"
    return "unsafe"


def _texts(content: Sequence[Mapping[str, Any]]) -> list[str]:
    return [str(block.get("text", "")) for block in content if block.get("type") == "text"]


def tool_result(result: Mapping[str, Any], *, tool: str) -> Any:
    """The jixu result of an MCP ``CallToolResult`` (wire form), or :class:`~jixu.ToolError` when ``isError``."""
    content = [block for block in result.get("content") or () if isinstance(block, Mapping)]
    structured = result.get("structuredContent")
    if result.get("isError"):
        data: dict[str, Any] = {"content": [dict(block) for block in content]}
        if structured is not None:
            data["structuredContent"] = structured
        message = "\n".join(_texts(content)) or f"the MCP tool {tool!r} reported an error"
        raise ToolError(message, code="mcp_tool_error", data=data)
    if structured is not None:
        return structured
    if not content:
        return None
    if all(block.get("type") == "text" for block in content):
        return "\n".join(_texts(content))
    return {"content": [dict(block) for block in content]}


def _key_property(schema: Mapping[str, Any], key_argument: str | None) -> bool:
    """Whether the input schema declares ``key_argument`` as a top-level property a string fits."""
    if key_argument is None:
        return False
    found = (schema.get("properties") or {}).get(key_argument)
    if not isinstance(found, Mapping):
        return False
    kind = found.get("type")
    return kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)


def _shown_schema(schema: Mapping[str, Any], key_argument: str | None) -> dict[str, Any]:
    """The input schema the model is shown and its arguments are checked against (the key property hidden)."""
    shown = copy.deepcopy(dict(schema))
    if key_argument is not None and _key_property(schema, key_argument):
        shown["properties"] = {k: v for k, v in shown["properties"].items() if k != key_argument}
        if isinstance(shown.get("required"), list):
            shown["required"] = [name for name in shown["required"] if name != key_argument]
    return shown


def _arguments(tool: str, schema: dict[str, Any]) -> ArgumentsSchema:
    """The schema with its ``jsonschema`` validator (the dialect its ``$schema`` names, else 2020-12)."""
    if schema.get("type", "object") != "object":
        raise ToolDefinitionError(f"MCP tool {tool!r}: its input schema must describe an object, got {schema!r}",
                                  function=tool)
    validator_class = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        raise ToolDefinitionError(f"MCP tool {tool!r}: its input schema is not a valid JSON Schema: {exc.message}",
                                  function=tool) from None
    validator = validator_class(schema)

    def problem(args: dict[str, Any]) -> tuple[Sequence[str | int], str] | None:
        found = jsonschema.exceptions.best_match(validator.iter_errors(args))
        return None if found is None else (list(found.absolute_path), str(found.message))

    return ArgumentsSchema(schema, problem)


def _jixu_name(name: str, prefix: str, names: Mapping[str, str]) -> str:
    chosen = names.get(name)
    if chosen is None:
        chosen = prefix + _NAME_CHARS.sub("_", name)
    if not _JIXU_NAME.fullmatch(chosen):
        raise ToolDefinitionError(f"MCP tool {name!r}: {chosen!r} is not a usable jixu tool name (letters, digits, "
                                  f"_ and -, at most 64, not starting with a digit); pass names={{{name!r}: ...}}",
                                  function=name)
    return chosen


# --- one live session, held by its own task ------------------------------------------------------


class _EndWatch:
    """The transport's read stream, setting ``ended`` when it ends (the server closed or died, the connection
    broke): a session is known dead before the next call is sent on it."""

    def __init__(self, stream: Any, ended: asyncio.Event) -> None:
        self._stream = stream
        self._ended = ended

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    async def __aenter__(self) -> Self:
        await self._stream.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> Any:
        self._ended.set()
        return await self._stream.__aexit__(*exc)

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._stream.__anext__()
        except BaseException:
            self._ended.set()
            raise

    async def receive(self) -> Any:
        try:
            return await self._stream.receive()
        except BaseException:
            self._ended.set()
            raise


class _Session:
    """One MCP session. Its transport and ``ClientSession`` are entered and left by a task of its own, so a
    transport that breaks (its task group cancels its host) takes down that task, never the caller's."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        self.ended = asyncio.Event()
        self._closing = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.session: ClientSession | None = None
        self.server_name = ""

    @property
    def alive(self) -> bool:
        return self.session is not None and not self.ended.is_set() and not self._closing.is_set()

    async def open(self) -> list[dict[str, Any]]:
        """Connect, initialize and list every tool (wire form); raises what connecting raised."""
        ready: asyncio.Future[list[dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._task = asyncio.create_task(self._hold(ready), name="jixu-mcp-session")
        return await ready

    async def _hold(self, ready: asyncio.Future[list[dict[str, Any]]]) -> None:
        try:
            async with contextlib.AsyncExitStack() as stack:
                streams = await stack.enter_async_context(self._transport())
                session = await stack.enter_async_context(
                    ClientSession(_EndWatch(streams[0], self.ended), streams[1]))
                initialized = await session.initialize()
                self.server_name = initialized.server_info.name
                listed: list[dict[str, Any]] = []
                cursor: str | None = None
                while True:
                    page = await session.list_tools(params=PaginatedRequestParams(cursor=cursor) if cursor else None)
                    listed.extend(t.model_dump(mode="json", by_alias=True, exclude_none=True) for t in page.tools)
                    cursor = page.next_cursor
                    if not cursor:
                        break
                self.session = session
                ready.set_result(listed)
                await self._closing.wait()
        except BaseException as error:  # the transport broke, or connecting failed: this session is over
            if not ready.done():
                ready.set_exception(error if isinstance(error, Exception) else MCPConnectionError(
                    f"connecting to the MCP server was interrupted ({type(error).__name__})"))
            if not isinstance(error, Exception | asyncio.CancelledError):
                raise  # KeyboardInterrupt, SystemExit: not ours to swallow
        finally:
            self.ended.set()
            if not ready.done():  # pragma: no cover - every path above settles it
                ready.set_exception(MCPConnectionError("the MCP session ended before it was ready"))

    def discard(self) -> None:
        """Stop using this session (it is left by its task)."""
        self._closing.set()

    async def close(self) -> None:
        """Leave the session and its transport (the stdio server is stopped), within ``CLOSE_TIMEOUT``."""
        self._closing.set()
        task = self._task
        if task is None or task.done():
            return
        done, _ = await asyncio.wait({task}, timeout=CLOSE_TIMEOUT)
        if not done:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

    async def call_tool(self, name: str, arguments: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
        """Send ``tools/call`` and wait for the result (wire form), or for the session to end."""
        session = self.session
        assert session is not None
        request_meta: Any = meta  # the SDK's RequestParamsMeta: a dict of JSON values
        call = asyncio.ensure_future(session.call_tool(name, arguments, meta=request_meta))
        ended = asyncio.ensure_future(self.ended.wait())
        try:
            await asyncio.wait({call, ended}, return_when=asyncio.FIRST_COMPLETED)
            if call.done():
                wire: dict[str, Any] = call.result().model_dump(mode="json", by_alias=True, exclude_none=True)
                return wire
            raise MCPConnectionError(f"the MCP session ended while {name!r} was being called")
        finally:
            for waiting in (call, ended):
                if not waiting.done():
                    waiting.cancel()
                    with contextlib.suppress(BaseException):
                        await waiting


# --- the connection ------------------------------------------------------------------------------


class _Listed:
    """One tool as the server lists it, with what jixu makes of it."""

    def __init__(self, wire: dict[str, Any], jixu_name: str, key_argument: str | None) -> None:
        self.wire = wire
        self.name = str(wire["name"])
        self.jixu_name = jixu_name
        schema = wire.get("inputSchema") or {"type": "object"}
        self.key_argument = key_argument if _key_property(schema, key_argument) else None
        self.arguments = _arguments(self.name, _shown_schema(schema, key_argument))


class Connection:
    """A connection to one MCP server whose tools are jixu tools; use it as ``async with``.

    Build it with :func:`connect_stdio`, :func:`connect_http` or :func:`connect`; entering connects and lists
    the tools (raising :class:`~jixu.errors.MCPConnectionError` when it cannot), leaving closes the session
    (and stops a stdio server). Options: :class:`ConnectOptions`.
    """

    def __init__(self, transport: Transport, *, label: str, **options: Unpack[ConnectOptions]) -> None:
        self._transport = transport
        self._label = label
        self._options = options
        self._session: _Session | None = None
        self._state: str = "new"  # "open" once entered, "closed" once left
        self._lock = asyncio.Lock()
        self._last_listing: list[dict[str, Any]] = []
        self._listed: dict[str, _Listed] = {}
        self._tools: dict[str, Tool] = {}
        self.server_name = ""
        """The name the server gave when the session was initialized."""
        unknown = sorted(set(options) - set(ConnectOptions.__annotations__))
        if unknown:
            raise InvalidInput(f"unknown option {', '.join(unknown)}; the options are: "
                               f"{', '.join(ConnectOptions.__annotations__)}", field=unknown[0])
        timeout = options.get("timeout")
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int | float)
                                    or timeout <= 0):
            raise InvalidInput(f"timeout must be a positive number of seconds or None, got {timeout!r}",
                               field="timeout")

    async def __aenter__(self) -> Self:
        if self._state != "new":
            raise InvalidInput(f"the MCP connection to {self._label} was opened before; make a new one")
        session = await self._connect()
        try:
            self._build(self._last_listing)
        except BaseException:
            await session.close()
            raise
        self._session = session
        self._state = "open"
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session (a stdio server is stopped). Calls still in flight end with an unknown outcome."""
        session, self._session = self._session, None
        self._state = "closed"
        if session is not None:
            await session.close()

    async def _connect(self) -> _Session:
        session = _Session(self._transport)
        try:
            self._last_listing = await session.open()
        except Exception as exc:
            await session.close()
            raise MCPConnectionError(f"cannot connect to the MCP server {self._label}: {_describe(exc)}",
                                     server=self._label) from exc
        self.server_name = session.server_name
        return session

    def _build(self, listing: list[dict[str, Any]]) -> None:
        options = self._options
        by_name = {str(item["name"]): item for item in listing}
        keyed: dict[str, Collection[str]] = {
            "semantics": options.get("semantics") or {}, "probes": options.get("probes") or {},
            "requires_approval": options.get("requires_approval") or (), "names": options.get("names") or {},
            "include": options.get("include") or (), "errors_before_acting": options.get("errors_before_acting") or ()}
        for option, given in keyed.items():
            unknown = sorted(set(given) - set(by_name))
            if unknown:
                raise InvalidInput(f"{option}: the MCP server {self._label} lists no tool {', '.join(unknown)}; it "
                                   f"lists: {', '.join(sorted(by_name)) or 'none'}", field=option, tools=unknown)
        include = options.get("include")
        names = options.get("names") or {}
        prefix = options.get("prefix", "")
        key_argument = options.get("key_argument", KEY_ARGUMENT)
        seen: dict[str, str] = {}
        for name, wire in by_name.items():
            if include is not None and name not in include:
                continue
            jixu_name = _jixu_name(name, prefix, names)
            if jixu_name in seen:
                raise ToolDefinitionError(f"MCP tools {seen[jixu_name]!r} and {name!r} would both be called "
                                          f"{jixu_name!r}; pass names={{...}} for one", function=name)
            seen[jixu_name] = name
            listed = _Listed(wire, jixu_name, key_argument)
            self._listed[name] = listed
            self._tools[name] = self._tool(listed)

    def _tool(self, listed: _Listed) -> Tool:
        options = self._options
        semantics = (options.get("semantics") or {}).get(listed.name)
        if semantics is None:
            trusted = options.get("trust_annotations", True)
            semantics = semantics_from_annotations(listed.wire.get("annotations")) if trusted else "unsafe"
        description = listed.wire.get("description") or (listed.wire.get("annotations") or {}).get("title") or ""
        connection = self

        # The server SDK answers an exception its tool code raised after acting with isError too: for an unsafe
        # tool that is no proof that nothing happened, unless the user says its errors come before it acts.
        error_unknown = semantics == "unsafe" and listed.name not in (options.get("errors_before_acting") or ())

        async def call_mcp_tool(jixu_context: ToolContext, **arguments: Any) -> Any:
            return await connection._call(listed, arguments, jixu_context, error_unknown=error_unknown)

        if _CONTEXT in (listed.arguments.schema.get("properties") or {}):
            raise ToolDefinitionError(f"MCP tool {listed.name!r} has an argument named {_CONTEXT!r}, the name jixu "
                                      "passes the call's context by", function=listed.name)
        return Tool(call_mcp_tool, name=listed.jixu_name, description=str(description), semantics=semantics,
                    requires_approval=listed.name in (options.get("requires_approval") or ()),
                    timeout=options.get("timeout"), probe=(options.get("probes") or {}).get(listed.name),
                    parameters=listed.arguments)

    def tools(self) -> list[Tool]:
        """The server's tools as jixu tools (those ``include`` names, in the server's order)."""
        return list(self._tools.values())

    def tool(self, name: str) -> Tool:
        """The jixu tool of the server's tool ``name``."""
        found = self._tools.get(name)
        if found is None:
            raise InvalidInput(f"the MCP server {self._label} has no tool {name!r} here; it has: "
                               f"{', '.join(self._tools) or 'none'}", field="name")
        return found

    async def step(self, run: DurableRun, name: str, args: Mapping[str, Any] | None = None, *,
                   key: str | None = None) -> Any:
        """Call the server's tool ``name`` as one durable step of ``run`` (its semantics, approval and probe);
        the result, or the recorded result when the step ran before. ``args`` are checked against the tool's
        schema before anything is recorded (:class:`~jixu.errors.ToolInputError`)."""
        tool = self.tool(name)
        checked = tool.validate_args(dict(args or {}))

        async def call(ctx: ToolContext) -> Any:
            return await tool.invoke(checked, ctx)

        return await run.effect(tool.name, checked, call=call, semantics=tool.semantics, probe=tool.probe,
                                probe_timeout=tool.probe_timeout if tool.probe is not None else None,
                                requires_approval=tool.requires_approval, timeout=tool.timeout, key=key)

    async def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
        """Call the server's tool ``name`` directly, unrecorded (for a probe's read-only look-up): its result, or
        :class:`~jixu.ToolError`. An agent's or a step's calls go through :meth:`tools` / :meth:`step`."""
        self.tool(name)  # raises, naming the tools there are, when it has none of that name
        listed = self._listed[name]
        wire = await self._send(listed, dict(arguments or {}), {})
        return tool_result(wire, tool=listed.name)

    async def _call(self, listed: _Listed, arguments: dict[str, Any], ctx: ToolContext, *,
                    error_unknown: bool) -> Any:
        """One attempt of a jixu tool call (its marker is durable): the key added, sent once, the result mapped;
        ``error_unknown``: an ``isError`` answer leaves the outcome unknown (:class:`MCPToolOutcomeUnknown`)."""
        if listed.key_argument is not None:
            arguments = {**arguments, listed.key_argument: ctx.idempotency_key}
        meta = {META_IDEMPOTENCY_KEY: ctx.idempotency_key, META_EFFECT_ID: ctx.effect_id, META_ATTEMPT: ctx.attempt}
        try:
            return tool_result(await self._send(listed, arguments, meta), tool=listed.name)
        except ToolError as error:
            if not error_unknown or error.code != "mcp_tool_error":
                raise
            raise MCPToolOutcomeUnknown(
                f"the unsafe MCP tool {listed.name!r} answered isError ({error.message[:500]}); the server SDK "
                "answers an exception raised after the tool acted the same way, so whether it acted is unknown "
                "(declare it in errors_before_acting= if its errors always come before it acts)",
                server=self._label, tool=listed.name, content=error.data) from error

    def _changed(self, listed: _Listed) -> str | None:
        """How the session's latest listing differs from ``listed`` (what the connection's tools were built from,
        when it was opened) in what the calls rest on: the semantics its hints give, its arguments' schema (words
        for people, and the order of ``required``, aside); None when it does not."""
        now = next((item for item in self._last_listing if item.get("name") == listed.name), None)
        if now is None:
            return "no longer listed"
        differ = []
        if semantics_from_annotations(now.get("annotations")) != semantics_from_annotations(
                listed.wire.get("annotations")):
            differ.append("annotations")
        if _schema_shape(now.get("inputSchema") or {}) != _schema_shape(listed.wire.get("inputSchema") or {}):
            differ.append("inputSchema")
        return f"its {' and '.join(differ)} changed" if differ else None

    async def _live(self) -> _Session:
        """The live session, a new one when it ended; :class:`~jixu.ToolError` ``mcp_unavailable`` (nothing was
        sent) when none can be had."""
        async with self._lock:
            session = self._session
            if session is not None and session.alive:
                return session
            if self._state != "open":
                raise ToolError(f"the MCP connection to {self._label} is not open (use it as `async with`); the "
                                "call was not sent", code="mcp_unavailable", data={"server": self._label})
            if session is not None:
                await session.close()
            try:
                self._session = await self._connect()
            except MCPConnectionError as exc:
                self._session = None
                raise ToolError(f"{exc.message}; the call was not sent", code="mcp_unavailable",
                                data={"server": self._label}) from exc
            return self._session

    async def _send(self, listed: _Listed, arguments: dict[str, Any], meta: dict[str, Any]) -> dict[str, Any]:
        session = await self._live()
        name = listed.name
        changed = self._changed(listed)
        if changed is not None:
            raise ToolError(f"the MCP server {self._label} now lists {name!r} otherwise than when this connection "
                            f"was opened ({changed}); the call was not sent: open a new connection (its tools are "
                            "then a new revision of the agent)", code="mcp_tool_changed",
                            data={"server": self._label, "tool": name, "changed": changed})
        try:
            return await session.call_tool(name, arguments, meta)
        except MCPError as exc:
            gone = exc.code == SESSION_GONE[0] and exc.message in SESSION_GONE[1]
            if gone:
                session.discard()  # the server does not know the session (restarted): the next call opens a new one
            if exc.code in NOT_RUN_CODES or gone:
                raise ToolError(f"the MCP server did not run {name!r}: {exc.message}", code="mcp_not_run",
                                data={"code": exc.code, "message": exc.message}) from exc
            if exc.code == CONNECTION_CLOSED or session.ended.is_set():
                session.discard()  # the next call opens a new session
            raise MCPConnectionError(f"the call of {name!r} on the MCP server {self._label} ended without a "
                                     f"result ({exc.code}: {exc.message}); its outcome is unknown",
                                     server=self._label, tool=name, mcp_code=exc.code) from exc
        except MCPConnectionError:
            session.discard()
            raise
        except Exception as exc:
            session.discard()
            raise MCPConnectionError(f"the call of {name!r} on the MCP server {self._label} failed: "
                                     f"{_describe(exc)}; its outcome is unknown", server=self._label,
                                     tool=name) from exc


_FOR_PEOPLE = frozenset({"description", "title", "examples", "$comment"})
"""Keywords of a JSON Schema that say nothing of what a value must be."""
_NAMED = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
"""Keywords whose object maps names (an argument may be called ``title``) to schemas."""


def _schema_shape(value: Any, *, names: bool = False) -> Any:
    """A JSON Schema as it constrains values: without its words for people, ``required`` as a set."""
    if isinstance(value, list):
        return [_schema_shape(item) for item in value]
    if not isinstance(value, dict):
        return value
    if names:
        return {name: _schema_shape(schema) for name, schema in value.items()}
    return {key: (frozenset(map(str, item)) if key == "required" and isinstance(item, list)
                  else _schema_shape(item, names=key in _NAMED))
            for key, item in value.items() if key not in _FOR_PEOPLE}


def _describe(exc: BaseException) -> str:
    """An exception in words, the first leaf of an exception group (what the SDK's task groups raise)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


# --- connecting ---------------------------------------------------------------------------------


def connect(transport: Transport, *, label: str = "server", **options: Unpack[ConnectOptions]) -> Connection:
    """A connection over any SDK transport: ``transport()`` returns a fresh one (called again to replace a dead
    session). ``async with connect(...) as server``; options: :class:`ConnectOptions`."""
    if not callable(transport):
        raise InvalidInput("transport must be a function returning the SDK's transport context manager",
                           field="transport")
    return Connection(transport, label=label, **options)


def connect_stdio(command: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None,
                  cwd: str | None = None, errlog: TextIO | None = None,
                  **options: Unpack[ConnectOptions]) -> Connection:
    """A connection to an MCP server this process starts (``command args``) and talks to over stdin/stdout.

    ``env`` is added to the SDK's default environment; the server's stderr goes to ``errlog`` (default
    ``sys.stderr``). A server that dies is started again before the next call. Options: :class:`ConnectOptions`.
    """
    if not isinstance(command, str) or not command:
        raise InvalidInput("command must be the executable that starts the MCP server", field="command")
    params = StdioServerParameters(command=command, args=[str(arg) for arg in args],
                                   env=dict(env) if env is not None else None, cwd=cwd)

    def transport() -> contextlib.AbstractAsyncContextManager[Any]:
        return stdio_client(params, errlog=errlog if errlog is not None else sys.stderr)

    return Connection(transport, label=" ".join([command, *params.args]), **options)


def connect_http(url: str, *, headers: Mapping[str, str] | None = None, connect_timeout: float = 30.0,
                 **options: Unpack[ConnectOptions]) -> Connection:
    """A connection to an MCP server over streamable HTTP at ``url`` (e.g. ``http://127.0.0.1:8000/mcp``).

    ``headers`` go with every request (e.g. an ``Authorization``). Options: :class:`ConnectOptions`.
    """
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InvalidInput(f"url must be an http(s) URL, got {url!r}", field="url")
    fixed = dict(headers or {})

    @contextlib.asynccontextmanager
    async def transport() -> AsyncIterator[Any]:
        # The SDK's default read timeout (300 s) is for its event stream; a call's own limit is `timeout`.
        timeout = httpx2.Timeout(connect_timeout, read=300.0)
        async with httpx2.AsyncClient(headers=fixed, timeout=timeout) as client, \
                streamable_http_client(url, http_client=client) as streams:
            yield streams

    return Connection(transport, label=url, **options)


__all__ = ["KEY_ARGUMENT", "META_ATTEMPT", "META_EFFECT_ID", "META_IDEMPOTENCY_KEY", "NOT_RUN_CODES", "SESSION_GONE",
           "ConnectOptions", "Connection", "Transport", "connect", "connect_http", "connect_stdio",
           "semantics_from_annotations", "tool_result"]
