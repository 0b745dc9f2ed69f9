"""A model-based check of the effect kernel: random agents, random interleavings, and the rules after each step.

One *scenario* (drawn from a seed, see :func:`draw`) is a few threads on one
event loop; each runs one turn whose model asks, step after step, for one to
three tool calls of every semantics at once (``look`` read-only, ``note``
idempotent, ``pay`` unsafe, ``ask`` unsafe and parked for approval), each call
taking a few turns of the event loop and returning, failing for sure or
breaking without an answer. Meanwhile another connection writes to the same
streams at random moments: approvals, denials, resolutions, interruptions,
new turns and events this version does not act on. Whenever a thread stops
waiting for an operator, the driver (as an operator) approves, denies or
resolves what it waits on, and lets it go on. Optionally the process
"crashes" after a random append: from then on its store refuses everything
(nothing the dead process would not have written gets written), and the
threads are reopened by a new Harness on a new connection under the same
owner name, as a restarted worker would.

After every step (an operator's write, a ``wait()`` returning) :func:`check`
holds the rules of issue 21:

1. an ``unsafe`` effect is dispatched at most once and its tool ran at most
   once (a call an operator resolved ``not_occurred`` may be made again, but
   under a new effect id);
2. every receipt the process produced is kept: each call that ended (with a
   result, a failure, a break) has its receipt in the stream, unless the
   receipt travelled in an error the loop raised (``unrecorded_receipts``)
   or the process crashed before its commit;
3. ``wait()`` never raises a raw ``ConcurrencyError``;
4. the stream verifies, no effect is corrupt, and the resolver's answer
   online, after a reopen and after a replay are one and the same.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import random
import signal
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jixu.errors import (
    ConcurrencyError,
    EffectNotParked,
    EffectNotUnknown,
    OwnershipLost,
    ReceiptConflict,
    ResolutionConflict,
    StreamBusy,
    ThreadBusy,
)
from jixu.kernel import unrecorded_receipts
from jixu.ledger import NewEvent, Store
from jixu.recovery import RecoveryResolver
from jixu.threads import Agent, Harness, ScriptedModel, Thread, ToolCall, ToolContext, ToolError, tool
from jixu.threads.log import ThreadLog, stream_of

TOOLS = {"look": "read_only", "note": "idempotent", "pay": "unsafe", "ask": "unsafe"}
"""Tool name -> semantics (``ask`` also requires approval)."""
ACTS = ("ok", "ok", "ok", "fail", "break")
OPERATOR_ACTIONS = ("approve", "deny", "occurred", "not_occurred", "abandoned_unknown", "noise", "interrupt",
                    "send")
RESOLUTIONS = ("occurred", "not_occurred", "abandoned_unknown")


class InvariantBroken(AssertionError):
    """A rule of the kernel did not hold (the message says which, on which effect)."""


@dataclass(frozen=True)
class Call:
    """One tool call the model asks for: which tool, how it ends, how many loop turns it takes."""

    tool: str
    act: str
    turns: int


@dataclass(frozen=True)
class Scenario:
    """Everything random about one run, drawn from a seed (so a failure is rerun exactly by its seed)."""

    seed: int
    threads: int
    steps: tuple[tuple[Call, ...], ...]
    operator: tuple[tuple[int, str], ...]
    """(loop turns to wait first, action) of the other connection, in order."""
    crash_after: int | None
    """Crash after this many appends of the process (``None``: no crash)."""
    settle: tuple[str, ...]
    """The driver's decisions when a thread waits, used in turn: approve/deny, then a resolution."""


def draw(seed: int, *, threads: int | None = None, crash: bool | None = None) -> Scenario:
    """The scenario of ``seed``; ``threads`` 1 (a thread alone: its receipts ride with the next step) or 3
    (sharing commits), ``crash`` whether the process crashes mid-way (both drawn when not given)."""
    rng = random.Random(seed)
    count = threads if threads is not None else rng.choice((1, 3))
    steps = tuple(tuple(Call(rng.choice(tuple(TOOLS)), rng.choice(ACTS), rng.randint(0, 3))
                        for _ in range(rng.randint(1, 3))) for _ in range(rng.randint(1, 4)))
    operator = tuple((rng.randint(0, 12), rng.choice(OPERATOR_ACTIONS)) for _ in range(rng.randint(0, 8)))
    crashes = crash if crash is not None else rng.random() < 0.25
    settle = tuple(rng.choice(("approve", "deny", *RESOLUTIONS)) for _ in range(16))
    # After the threads exist (one append each): a crash may hit anything from the turns' start on.
    return Scenario(seed, count, steps, operator, rng.randint(count + 1, 40) if crashes else None, settle)


class Crashed(BaseException):
    """The simulated death of the process: raised by its store from the crash point on (not an Exception, so
    no handler of jixu's records anything on its way out)."""


class World:
    """What the outside world and the driver saw: tool invocations, receipts produced, errors raised."""

    def __init__(self) -> None:
        self.invoked: Counter[str] = Counter()
        self.semantics: dict[str, str] = {}
        self.ended: list[tuple[str, int]] = []
        """(effect id, attempt) of every call that ended in the process (its receipt was produced)."""
        self.unrecorded: set[tuple[str, int]] = set()
        self.crashed = False
        self.resolved_not_occurred: set[str] = set()
        self.steps = 0
        self.on_invoke: Callable[[str, str], None] | None = None
        """Told of each invocation before the call does anything (a killed child reports them this way)."""


def make_agent(scenario: Scenario, world: World) -> Agent:
    """The scenario's agent: its model asks for the drawn calls step by step, its tools obey the calls."""
    plan = scenario.steps
    counter = iter(range(10**9))

    def script(messages: list[dict[str, Any]]) -> Any:
        asked = sum(1 for m in messages if m["role"] == "assistant" and m.get("tool_calls"))
        if asked >= len(plan):
            return "done"
        return [ToolCall(call.tool, {"n": next(counter), "act": call.act, "turns": call.turns})
                for call in plan[asked]]

    def body(name: str) -> Callable[..., Any]:
        async def run(n: int, act: str, turns: int, ctx: ToolContext) -> str:
            world.invoked[ctx.effect_id] += 1
            world.semantics[ctx.effect_id] = TOOLS[name]
            if world.on_invoke is not None:
                world.on_invoke(ctx.effect_id, TOOLS[name])
            for _ in range(turns):
                await asyncio.sleep(0)
            world.ended.append((ctx.effect_id, ctx.attempt))
            if act == "fail":
                raise ToolError(f"{name} {n} refused")
            if act == "break":
                raise RuntimeError(f"{name} {n}: connection reset")
            return f"{name} {n} done"

        run.__name__ = name
        run.__doc__ = f"The scenario's {TOOLS[name]} tool {name}."
        return run

    tools = [tool(body(name), name=name, semantics=semantics,  # type: ignore[arg-type]
                  requires_approval=name == "ask") for name, semantics in TOOLS.items()]
    return Agent("model-based", ScriptedModel(script), tools=tools, max_steps=len(plan) + 4)


_GUARDED = ("append", "append_many", "release_lease", "renew_lease", "write_checkpoint", "write_checkpoints",
            "take_over_lease", "take_over_leases", "renew_leases", "acquire_lease", "enqueue", "finish_work")


def crash_after(store: Store, appends: int | None, world: World, *, kill: bool = False) -> Store:
    """``store``, changed so that after ``appends`` appends every write raises :class:`Crashed` (the process
    died right after that commit: nothing it would still have written gets written); with ``kill``, the
    process SIGKILLs itself right after that commit instead."""
    left = [appends]

    def guard(name: str) -> Callable[..., Any]:
        method = getattr(store, name)

        def guarded(*args: Any, **kwargs: Any) -> Any:
            if world.crashed:
                raise Crashed
            result = method(*args, **kwargs)
            if name in ("append", "append_many") and left[0] is not None:
                left[0] -= 1
                if left[0] <= 0:
                    if kill:
                        os.kill(os.getpid(), signal.SIGKILL)
                    world.crashed = True  # the commit is durable; the process dies right after it
                    raise Crashed
            return result

        return guarded

    for name in _GUARDED:
        setattr(store, name, guard(name))
    return store


def check(store: Store, thread_ids: list[str], world: World) -> None:
    """The rules after a step (see the module docstring), on what the store holds."""
    for thread_id in thread_ids:
        events = store.read(stream_of(thread_id))
        report = store.verify(stream_of(thread_id))
        if not report.valid:
            raise InvariantBroken(f"thread {thread_id} does not verify: {report}")
        analysis = RecoveryResolver.analyze(events)
        if analysis.has_corruption:
            raise InvariantBroken(f"thread {thread_id} has corrupt effects: {analysis.corrupt}")
        dispatches: Counter[str] = Counter(e.data["effect_id"] for e in events if e.type == "tool.dispatched")
        for effect_id, decision in analysis.decisions.items():
            if decision.kind == "tool" and decision.semantics == "unsafe" and dispatches[effect_id] > 1:
                raise InvariantBroken(f"unsafe effect {effect_id} was dispatched {dispatches[effect_id]} times")
    for effect_id, count in world.invoked.items():
        if world.semantics.get(effect_id) == "unsafe" and count > 1:
            raise InvariantBroken(f"unsafe tool call {effect_id} ran {count} times")


def check_receipts(store: Store, thread_ids: list[str], world: World) -> None:
    """Rule 2: every call that ended has its receipt (unless it travelled in an error, or the process died)."""
    receipts = set()
    for thread_id in thread_ids:
        for event in store.read(stream_of(thread_id)):
            if event.type in ("tool.completed", "tool.failed") and "attempt" in event.data:
                receipts.add((event.data["effect_id"], event.data["attempt"]))
    missing = [ended for ended in world.ended if ended not in receipts and ended not in world.unrecorded]
    if missing and not world.crashed:
        raise InvariantBroken(f"receipts produced but not recorded: {missing}")


def _first(state_waiting: tuple[dict[str, Any], ...], kind: str) -> dict[str, Any] | None:
    return next((w for w in state_waiting if w["state"] == kind), None)


async def _operator(scenario: Scenario, other: Store, thread_ids: list[str], world: World,
                    running: Callable[[], bool]) -> None:
    """The other connection: its drawn actions at its drawn moments, on a random thread, while any runs."""
    rng = random.Random(scenario.seed + 1)
    for delay, action in scenario.operator:
        for _ in range(delay):
            await asyncio.sleep(0)
        if not running():
            return
        thread_id = rng.choice(thread_ids)
        try:
            log = ThreadLog.load(other, thread_id, actor="other-operator")
            waiting = log.snapshot().waiting_on
            if action in ("approve", "deny"):
                parked = _first(waiting, "parked")
                if parked is not None:
                    log.decide_parked(parked["effect_id"], "approved" if action == "approve" else "denied",
                                      actor="other-operator")
            elif action in RESOLUTIONS:
                unknown = _first(waiting, "unknown")
                if unknown is not None:
                    log.resolve(unknown["effect_id"], action, actor="other-operator")
                    if action == "not_occurred":
                        world.resolved_not_occurred.add(unknown["effect_id"])
            elif action == "noise":
                log.append([NewEvent("thread.noted", {"note": "another writer was here"}, log.meta())])
            elif action == "interrupt":
                log.end_running_turn("interrupted by another operator")
            elif action == "send" and log.state.active_turn() is None and log.snapshot().status == "idle":
                log.start_turn("and once more")
        except (ConcurrencyError, ThreadBusy, EffectNotParked, EffectNotUnknown, ResolutionConflict):
            pass  # the other writer raced the thread (or nothing was there to act on): its own problem
        check(other, thread_ids, world)


async def _settle(thread: Thread, world: World, decisions: list[str]) -> bool:
    """As the thread's operator: approve, deny or resolve what it waits on; False when nothing is left."""
    state = thread.state()
    if not state.waiting_on:
        return False
    for waiting in state.waiting_on:
        choice = decisions.pop(0) if decisions else "approve"
        try:
            if waiting["state"] == "parked":
                if choice == "deny":
                    await thread.deny(waiting["effect_id"])
                else:
                    await thread.approve(waiting["effect_id"])
            elif waiting["state"] == "unknown":
                resolution = choice if choice in RESOLUTIONS else "abandoned_unknown"
                await thread.resolve_tool_outcome(waiting["effect_id"], resolution)
                if resolution == "not_occurred":
                    world.resolved_not_occurred.add(waiting["effect_id"])
        except (EffectNotParked, EffectNotUnknown, ResolutionConflict, ThreadBusy, StreamBusy):
            pass  # another writer decided first
    return True


async def _drive(thread: Thread, store: Store, thread_ids: list[str], world: World, decisions: list[str]) -> None:
    """Run one thread's turn to its end, settling what it waits on, checking the rules after each stop."""
    for _ in range(24):
        try:
            state = await thread.wait()
        except ConcurrencyError as error:
            if world.crashed:
                raise Crashed from error
            raise InvariantBroken(f"wait() raised a raw ConcurrencyError: {error}") from error
        except (OwnershipLost, ReceiptConflict) as error:
            world.unrecorded.update(_receipt_keys(error))
            if world.crashed:
                raise Crashed from error
            return
        except Exception as error:
            if world.crashed:
                raise Crashed from error  # whatever the dead process's last calls raised on their way out
            raise
        check(store, thread_ids, world)
        world.steps += 1
        if state.status == "waiting":
            if not await _settle(thread, world, decisions):
                return
            continue
        if state.status in ("idle", "failed", "corrupt", "paused"):
            return
    raise InvariantBroken(f"thread {thread.thread_id} did not settle")


def _receipt_keys(error: BaseException) -> set[tuple[str, int]]:
    """(effect id, attempt) of the receipts an error says it could not record."""
    keys = set()
    for receipt in unrecorded_receipts(error):
        data = json.loads(receipt.data_json)
        if "attempt" in data:
            keys.add((data["effect_id"], data["attempt"]))
    return keys


@dataclass
class Outcome:
    """What a run of a scenario did (for the soak's counts)."""

    steps: int = 0
    crashed: bool = False
    calls: int = 0
    unsafe_calls: int = 0
    waits: int = 0
    counts: dict[str, int] = field(default_factory=dict)


async def run_scenario(scenario: Scenario, open_store: Callable[[], Store], *, owner: str = "model-worker",
                       kill: bool = False, world: World | None = None,
                       on_threads: Callable[[list[str]], None] | None = None) -> Outcome:
    """Run ``scenario`` on a ledger (``open_store`` opens it on a new connection each time) and check it.

    With ``kill`` the process SIGKILLs itself at the crash point (see tests/kernel/model_child.py);
    ``on_threads`` is told the thread ids once they exist.
    """
    world = world if world is not None else World()
    # From the start: a task the crash ended may be dropped (and reported) before the crash is noticed here.
    _ignore_the_dead(asyncio.get_running_loop())
    opened: list[Store] = []

    def fresh() -> Store:
        made = open_store()
        opened.append(made)
        return made

    store, other = fresh(), fresh()  # a reader, and the other writer's connection
    if store is other:
        # One object for every connection (a MemoryStore): it would not outlive the process, so no crash.
        scenario = dataclasses.replace(scenario, crash_after=None)
    agent = make_agent(scenario, world)
    harness = Harness(agent, crash_after(fresh(), scenario.crash_after, world, kill=kill), owner=owner,
                      lease_ttl=5.0)
    decisions = list(scenario.settle)
    try:
        threads = [await harness.create_thread() for _ in range(scenario.threads)]
        thread_ids = [t.thread_id for t in threads]
        if on_threads is not None:
            on_threads(thread_ids)
        try:
            await asyncio.gather(*(t.send("go") for t in threads))
            running = [True]
            drivers = asyncio.gather(*(_drive(t, store, thread_ids, world, decisions) for t in threads))
            operator = asyncio.ensure_future(_operator(scenario, other, thread_ids, world, lambda: running[0]))
            try:
                await drivers
            finally:
                running[0] = False
                await operator
        except BaseException:
            if not world.crashed:  # anything a crash makes the dead process's last calls raise goes with it
                raise
        if world.crashed:
            # The process died: every task of it goes with it. A new process (same owner name) takes over.
            for thread in threads:
                if thread._task is not None:
                    thread._task.cancel()
            await asyncio.sleep(0)
            return await recover_scenario(scenario, open_store, thread_ids, world, owner=owner)
        check(store, thread_ids, world)
        check_receipts(store, thread_ids, world)
        await _same_answer(threads, agent, fresh())
        return _outcome(world)
    finally:
        for made in opened:
            made.close()


async def recover_scenario(scenario: Scenario, open_store: Callable[[], Store], thread_ids: list[str],
                           world: World, *, owner: str = "model-worker") -> Outcome:
    """After the process ran ``scenario`` and died: a new process (same owner name, new connections) reopens
    the threads, drives them to their end as the operator, and the rules are checked."""
    world.crashed = True
    store, recovering, another = open_store(), open_store(), open_store()
    try:
        agent = make_agent(scenario, world)
        harness = Harness(agent, recovering, owner=owner, lease_ttl=5.0)
        threads = [await harness.open_thread(thread_id, resume=False) for thread_id in thread_ids]
        check(store, thread_ids, world)
        decisions = list(scenario.settle)
        await asyncio.gather(*(_drive(t, store, thread_ids, world, decisions) for t in threads))
        check(store, thread_ids, world)
        await _same_answer(threads, agent, another)
        return _outcome(world)
    finally:
        for made in {id(s): s for s in (store, recovering, another)}.values():
            made.close()


def _ignore_the_dead(loop: asyncio.AbstractEventLoop) -> None:
    """Leave unreported what the dead process's leftover tasks raised (its store refusing them)."""
    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        if not isinstance(context.get("exception"), Crashed):
            loop.default_exception_handler(context)

    loop.set_exception_handler(handler)


def _outcome(world: World) -> Outcome:
    return Outcome(steps=world.steps, crashed=world.crashed, calls=sum(world.invoked.values()),
                   unsafe_calls=sum(c for e, c in world.invoked.items() if world.semantics.get(e) == "unsafe"))


async def _same_answer(live: list[Thread], agent: Agent, another: Store) -> None:
    """Rule 4: the resolver's answer online (the live thread, caught up with the store), after a reopen on
    ``another`` connection and after a replay are the resolver's over every event."""
    fresh = Harness(agent, another)
    for thread in live:
        await thread.refresh()
        direct = RecoveryResolver.analyze(await thread.events()).to_dict()
        reopened = await fresh.open_thread(thread.thread_id, resume=False)
        replayed = await thread.replay()
        answers = {"online": thread.state().analysis.to_dict(), "reopened": reopened.state().analysis.to_dict(),
                   "replayed": replayed.analysis.to_dict()}
        differ = [name for name, answer in answers.items() if answer != direct]
        if differ:
            raise InvariantBroken(f"thread {thread.thread_id}: the {differ} answers differ from the resolver's")


__all__ = ["Crashed", "InvariantBroken", "Outcome", "Scenario", "World", "check", "draw", "run_scenario"]
