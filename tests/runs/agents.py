"""Agent factories the worker-process tests start workers with (``--agent tests.runs.agents:NAME``).

Configured through the environment, since a factory takes no arguments:

- ``JIXU_TEST_OUTSIDE``: the "outside system": every tool call appends one
  line ``<thread_id> <effect_id> <idempotency_key> <pid> <time>`` to it
  (``O_APPEND``, one ``write``: lines from several processes never interleave);
- ``JIXU_TEST_TOOL_SLEEP``: seconds the tool then takes (default 0);
- ``JIXU_TEST_TOOL_RELEASE``: a path; with it the tool's sleep ends as soon as that file exists (a test
  releases the call once it has looked, instead of waiting out a sleep long enough for a loaded machine);
- ``JIXU_TEST_BLOCK_SLEEP``: seconds the blocking ``def`` tool of ``blocking_agent`` sleeps (``time.sleep``);
- ``JIXU_TEST_CLOCK_SKEW``: seconds added to this process's ``time.time``
  (a worker whose local clock is wrong; the store's clock must not care);
- ``JIXU_TEST_BOOT_ID``: the boot id this process records in its claims (a worker on another machine, whose
  process nothing here can look at);
- ``JIXU_TEST_MODEL_SLEEP``: seconds the first model call of each process and input of ``slow_model_agent``
  takes (it appends ``<input> <pid>`` to ``JIXU_TEST_OUTSIDE`` as it starts);
- ``JIXU_TEST_LATE``: a path the subprocess of ``spawning_agent``'s tools appends ``acted`` to once it slept
  ``JIXU_TEST_CHILD_SLEEP`` seconds (default 3): whether it acted after its worker was gone.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time

from jixu import Agent, ScriptedModel, ToolCall, ToolContext, tool
from jixu.ledger.encoding import JSONObject
from jixu.threads.model import Step


def _skew_clock() -> None:
    skew = float(os.environ.get("JIXU_TEST_CLOCK_SKEW") or 0)
    if skew and not getattr(time.time, "skewed", False):
        real = time.time

        def skewed() -> float:
            return real() + skew

        skewed.skewed = True  # type: ignore[attr-defined]
        time.time = skewed


async def _outside(ctx: ToolContext) -> str:
    line = f"{ctx.thread_id} {ctx.effect_id} {ctx.idempotency_key} {os.getpid()} {time.monotonic():.6f}\n"
    fd = os.open(os.environ["JIXU_TEST_OUTSIDE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    delay = float(os.environ.get("JIXU_TEST_TOOL_SLEEP") or 0)
    release = os.environ.get("JIXU_TEST_TOOL_RELEASE")
    deadline = time.monotonic() + delay
    while time.monotonic() < deadline and not (release and os.path.exists(release)):
        await asyncio.sleep(min(0.05, max(0.0, deadline - time.monotonic())))
    return f"recorded for {ctx.thread_id}"


@tool(semantics="unsafe")
async def charge(ctx: ToolContext) -> str:
    """Charge once in the outside system (unsafe: a retry could charge twice)."""
    return await _outside(ctx)


@tool(semantics="idempotent")
async def book(ctx: ToolContext) -> str:
    """Book in the outside system, deduplicated there by the idempotency key."""
    return await _outside(ctx)


def _one_call(name: str) -> ScriptedModel:
    def script(messages: list[JSONObject]) -> Step:
        return "done" if messages and messages[-1].get("role") == "tool" else ToolCall(name)

    return ScriptedModel(script)


def _elsewhere() -> None:
    boot_id = os.environ.get("JIXU_TEST_BOOT_ID")
    if boot_id:
        from jixu.kernel import ownership

        ownership._IDENTITY = (os.getpid(), {**ownership.process_identity(), "boot_id": boot_id})


def counter_agent() -> Agent:
    """One unsafe tool call per turn, then the reply ``done``."""
    _skew_clock()
    _elsewhere()
    return Agent("counter", _one_call("charge"), tools=[charge])


class _PreparedModel(ScriptedModel):
    """Replies whether :meth:`prepare` ran before its first call (what a worker must do before taking turns)."""

    def __init__(self) -> None:
        self.prepared_at_first_call: bool | None = None
        self._prepared = False
        super().__init__(self._reply)

    def prepare(self) -> None:
        self._prepared = True

    def _reply(self, messages: list[JSONObject]) -> Step:
        if self.prepared_at_first_call is None:
            self.prepared_at_first_call = self._prepared
        return "prepared first" if self.prepared_at_first_call else "called unprepared"


def prepared_agent() -> Agent:
    """Replies ``prepared first`` when its model's ``prepare()`` ran before the first call of this process."""
    return Agent("prepared", _PreparedModel())


class _UnpreparableModel(ScriptedModel):
    def prepare(self) -> None:
        raise RuntimeError("the price table is unreadable")


def unpreparable_agent() -> Agent:
    """An agent whose model's ``prepare()`` fails."""
    return Agent("unpreparable", _UnpreparableModel(["never called"]))


def booking_agent() -> Agent:
    """One idempotent tool call per turn, then the reply ``done``."""
    _skew_clock()
    return Agent("booker", _one_call("book"), tools=[book])


def _by_input(tools: dict[str, str]) -> ScriptedModel:
    """One call per turn of the tool the user's input names (a word of it), then ``done``."""

    def script(messages: list[JSONObject]) -> Step:
        if messages and messages[-1].get("role") == "tool":
            return "done"
        said = next((str(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), "")
        return ToolCall(next((tool for word, tool in tools.items() if word in said.split()), "charge"))

    return ScriptedModel(script, keep_calls=False)


def mixed_agent() -> Agent:
    """Per turn one call of ``charge`` (unsafe; input with the word "charge") or ``book`` (idempotent; "book")."""
    return Agent("mixed", _by_input({"charge": "charge", "book": "book"}), tools=[charge, book])


@tool(semantics="unsafe")
def block(ctx: ToolContext) -> str:
    """A plain ``def`` tool that blocks its thread (``time.sleep``) after reaching the outside system."""
    line = f"{ctx.thread_id} {ctx.effect_id} {ctx.idempotency_key} {os.getpid()} {time.monotonic():.6f}\n"
    fd = os.open(os.environ["JIXU_TEST_OUTSIDE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
    time.sleep(float(os.environ.get("JIXU_TEST_BLOCK_SLEEP") or 0))
    late = os.environ.get("JIXU_TEST_BLOCK_LATE")
    if late:  # what the call does after its sleep: whether it still acted once its worker stopped
        with open(late, "a") as after:
            after.write(f"{ctx.effect_id}\n")
    return f"blocked for {ctx.thread_id}"


def blocking_agent() -> Agent:
    """Per turn one call of ``block`` (a blocking ``def``; input with the word "block") or ``charge`` (async)."""
    return Agent("blocking", _by_input({"block": "block", "charge": "charge"}), tools=[block, charge])


_LATE_ACT = "import sys, time; time.sleep(float(sys.argv[2])); open(sys.argv[1], 'a').write('acted\\n')"


def _child_argv() -> list[str]:
    return [sys.executable, "-c", _LATE_ACT, os.environ["JIXU_TEST_LATE"],
            os.environ.get("JIXU_TEST_CHILD_SLEEP") or "3"]


def _record_spawn(ctx: ToolContext, child: int) -> None:
    fd = os.open(os.environ["JIXU_TEST_OUTSIDE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{ctx.thread_id} {ctx.effect_id} {os.getpid()} {child}\n".encode())
    finally:
        os.close(fd)


def _spawn_and_wait(ctx: ToolContext) -> str:
    child = subprocess.Popen(_child_argv())
    _record_spawn(ctx, child.pid)
    child.wait()
    return "spawned"


@tool(semantics="unsafe")
def spawn(ctx: ToolContext) -> str:
    """A plain ``def`` tool whose work is a subprocess it waits for (it acts after ``JIXU_TEST_CHILD_SLEEP``)."""
    return _spawn_and_wait(ctx)


@tool(semantics="unsafe")
async def aspawn(ctx: ToolContext) -> str:
    """The same as ``spawn`` from an ``async`` tool (an asyncio subprocess)."""
    child = await asyncio.create_subprocess_exec(*_child_argv())
    _record_spawn(ctx, child.pid)
    await child.wait()
    return "spawned"


@tool(semantics="unsafe")
async def apoll(ctx: ToolContext) -> str:
    """The same as ``spawn`` from an ``async`` tool that polls a plain ``Popen`` (nothing kills it on a cancel)."""
    child = subprocess.Popen(_child_argv())
    _record_spawn(ctx, child.pid)
    while child.poll() is None:
        await asyncio.sleep(0.05)
    return "spawned"


@tool(semantics="idempotent")
def respawn(ctx: ToolContext) -> str:
    """The same as ``spawn``, idempotent: a worker taking over a dead one's call runs it again."""
    return _spawn_and_wait(ctx)


def spawning_agent() -> Agent:
    """Per turn one call of ``spawn`` (unsafe ``def``; input with the word "spawn"), ``aspawn`` (unsafe
    ``async``), ``apoll`` (unsafe ``async`` polling a ``Popen``) or ``respawn`` (idempotent ``def``)."""
    return Agent("spawning", _by_input({"spawn": "spawn", "aspawn": "aspawn", "apoll": "apoll", "respawn": "respawn"}),
                 tools=[spawn, aspawn, apoll, respawn])


def slow_model_agent() -> Agent:
    """No tools: the reply ``answered <input>``, the model's first call for each input in this process slow."""
    asked: set[str] = set()

    async def answer(messages: list[JSONObject]) -> Step:
        said = str(messages[-1].get("content"))
        if said not in asked:
            asked.add(said)
            fd = os.open(os.environ["JIXU_TEST_OUTSIDE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{said.replace(' ', '_')} {os.getpid()}\n".encode())
            finally:
                os.close(fd)
            await asyncio.sleep(float(os.environ.get("JIXU_TEST_MODEL_SLEEP") or 0))
        return f"answered {said}"

    return Agent("slow-model", ScriptedModel(answer, keep_calls=False))


def not_an_agent() -> str:
    """A factory that returns the wrong thing (the worker must refuse it)."""
    return "nope"


def slow_start_agent() -> Agent:
    """:func:`counter_agent`, made slowly: it touches ``JIXU_TEST_STARTING`` and then takes
    ``JIXU_TEST_START_SLEEP`` seconds (a heavy import), so a test can signal the worker while it starts."""
    starting = os.environ.get("JIXU_TEST_STARTING")
    if starting:
        with open(starting, "a") as out:
            out.write(f"{os.getpid()}\n")
    time.sleep(float(os.environ.get("JIXU_TEST_START_SLEEP") or 0))
    return counter_agent()


@tool(semantics="unsafe")
async def charge_noisily(ctx: ToolContext) -> str:
    """Charge once, while a library underneath logs a warning (as psycopg's pool does of a closed connection)."""
    import logging

    logging.getLogger("psycopg.pool").warning("discarding closed connection: <test connection [BAD]>")
    return await _outside(ctx)


def noisy_agent() -> Agent:
    """One unsafe tool call per turn whose library logs a warning, then ``done``."""
    return Agent("noisy", _one_call("charge_noisily"), tools=[charge_noisily])
