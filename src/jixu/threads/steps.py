"""Durable steps: a loop you write yourself gets what a jixu agent's tool calls get (decision 0032).

::

    async with harness.durable(thread_id) as run:          # thread_id None: a new thread
        charge = await run.effect("charge", {"order": 7}, semantics="unsafe",
                                  call=lambda ctx: bank.charge(7, idempotency_key=ctx.idempotency_key),
                                  probe=find_charge)

A durable run is one turn of a thread (``turn.started`` with ``steps: true``),
owned and fenced like an agent's turn. Each :meth:`DurableRun.effect` is one
tool call of that turn, recorded with the same events (``tool.requested`` with
``step``, ``tool.parked``, ``tool.dispatched``, ``tool.completed`` /
``tool.failed``, ``tool.outcome_resolved``, ``probe.*``), carried out through
the thread's path through the effect kernel, and judged by the
RecoveryResolver alone. So ``jixu threads show``, replay, fork and the HTTP
API see a run like any thread.

Run the same code again after a crash (with the thread id): each step is
found by its key (its name and how many steps of that name came before it in
the run, or an explicit ``key``) and, by the resolver's state of its effect,
returns its recorded result without running again (``completed``), runs now
(``not_dispatched``), runs again under the same effect id and idempotency key
(a retry-safe ``unknown``), is asked about by its probe (an unsafe
``unknown``), or raises :class:`~jixu.errors.StepOutcomeUnknown` naming the
effect and the operator's command; a parked step waits for its approval. A
recorded step whose name, arguments, semantics or approval differ from the
code's raises :class:`~jixu.errors.StepMismatch`: never a silent rerun.

A run started with a ``run_key`` is named by it for good (decision 0051): once
that run has ended, entering with the key again replays its record
(:attr:`DurableRun.finished`): each step returns what it recorded and nothing
is carried out or appended, so code killed after its run ended, before it
learnt so, repeats nothing when it runs again.

What to do with a step is decided by the pure :func:`decide_step`; the run
only carries it out.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal, NoReturn, Self, TypeAlias

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    InvalidInput,
    JixuError,
    ModelError,
    StepFailed,
    StepMismatch,
    StepOutcomeUnknown,
    ThreadBusy,
    TurnOwned,
)
from jixu.kernel import Outcome, Session, unrecorded_receipts
from jixu.ledger import Event, Fence, NewEvent, Store, content_hash, new_id
from jixu.ledger.encoding import JSONObject, canonical_text
from jixu.recovery import EffectDecision
from jixu.threads.agent import Agent
from jixu.threads.decide import ResolveByProbe
from jixu.threads.model import ModelRequest, ModelResponse
from jixu.threads.projection import ThreadState, Turn
from jixu.threads.tools import (
    DEFINITE_ANSWERS,
    ProbeQuery,
    Tool,
    ToolContext,
    call_ended,
    call_running,
    call_user_function,
    stop_calls,
)

if TYPE_CHECKING:
    from jixu.threads.harness import Harness
    from jixu.threads.thread import State, Thread

Semantics: TypeAlias = Literal["read_only", "idempotent", "unsafe"]
STEP_KEY_CHARS = 200
DEFAULT_APPROVAL_POLL = 0.5
"""Seconds between two looks at the store while a parked step waits for its approval."""


# --- the pure decision ----------------------------------------------------------------------



OCCURRED_WITHOUT_RESULT = ("This call happened (its outcome was settled after the fact, by a probe or an operator); "
                           "its result was not recorded.")
"""What an agent framework's model is told of a step settled ``occurred`` without a result
(:meth:`DurableRun.settled_without_result`)."""


@dataclass(frozen=True, slots=True)
class Step:
    """What the code asks for: the step's key and the intent it would record."""

    key: str
    name: str
    args: JSONObject
    semantics: Semantics
    requires_approval: bool
    has_probe: bool

    @property
    def args_hash(self) -> str:
        return content_hash(self.args)


@dataclass(frozen=True, slots=True)
class Record:
    """No usable effect is recorded for the step: record a new intent (a new effect id)."""


@dataclass(frozen=True, slots=True)
class Call:
    """Dispatch attempt ``attempt`` of the step's effect (never dispatched, or retry-safe and unknown)."""

    effect_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class AwaitApproval:
    """The step is parked: wait for an operator's approval or denial."""

    effect_id: str


@dataclass(frozen=True, slots=True)
class Done:
    """The step settled: its receipt (a result, a determinate failure, a denial) or an ``occurred`` resolution."""

    effect_id: str
    decision: EffectDecision


@dataclass(frozen=True, slots=True)
class Fail:
    """The step ended without a result it can return (:class:`~jixu.errors.StepFailed`)."""

    effect_id: str
    reason: str
    message: str


@dataclass(frozen=True, slots=True)
class AskProbe:
    """Ask the step's probe about attempt ``attempt`` of its unknown effect (a new probe effect)."""

    effect_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class ProbeAgain:
    """A probe effect was cut off (it is read-only, so retry-safe): dispatch it again."""

    probe_effect_id: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Unknown:
    """The step's outcome is unknown and nothing here may settle it (:class:`~jixu.errors.StepOutcomeUnknown`)."""

    effect_id: str
    why: str
    probe: JSONObject | None = None


@dataclass(frozen=True, slots=True)
class Mismatch:
    """The recorded step is not the one the code asks for (:class:`~jixu.errors.StepMismatch`)."""

    effect_id: str
    message: str


StepAction: TypeAlias = (Record | Call | AwaitApproval | Done | Fail | AskProbe | ProbeAgain | ResolveByProbe
                         | Unknown | Mismatch)


def latest_probe(state: ThreadState, effect_id: str, attempt: int) -> JSONObject | None:
    """The latest probe asked about attempt ``attempt`` of ``effect_id`` (``ThreadState.probes``), or None."""
    asked = [r for r in state.probes.get(effect_id, ()) if r.get("attempt") == attempt]
    return asked[-1] if asked else None


def decide_step(step: Step, recorded: Sequence[JSONObject], decision_of: Callable[[str], EffectDecision | None],
                state: ThreadState, *, max_attempts: int) -> StepAction:
    """What to do next with ``step`` (pure).

    ``recorded``: the intents recorded under the step's key in this run, oldest first (a ``not_occurred``
    resolution lets the step be recorded again, under a new effect id); ``decision_of``: the resolver's decision
    of an effect. The latest intent must be the code's step exactly (name, arguments' hash, semantics,
    approval), else :class:`Mismatch`.
    """
    if not recorded:
        return Record()
    intent = recorded[-1]
    effect_id = str(intent.get("effect_id"))
    for field, mine in (("name", step.name), ("args_hash", step.args_hash), ("semantics", step.semantics),
                        ("requires_approval", step.requires_approval)):
        if intent.get(field) != mine:
            return Mismatch(effect_id, f"step {step.key!r} was recorded (effect {effect_id}) with {field} "
                                       f"{intent.get(field)!r}; the code now asks for {mine!r}")
    decision = decision_of(effect_id)
    if decision is None or decision.state == "corrupt":
        return Unknown(effect_id, "its events contradict themselves (the thread is corrupt)")
    if decision.state == "parked":
        return AwaitApproval(effect_id)
    if decision.state == "not_dispatched":
        return Call(effect_id, decision.attempts + 1)
    if decision.state == "completed":
        return Done(effect_id, decision)
    resolution = decision.resolution
    if resolution is not None:
        what = resolution.get("resolution")
        if what == "occurred":
            return Done(effect_id, decision)
        if what == "not_occurred":
            if len(recorded) >= max_attempts:
                return Fail(effect_id, "attempts_exhausted",
                            f"step {step.key!r} did not happen {len(recorded)} times (the last: effect {effect_id})")
            return Record()
        return Fail(effect_id, "abandoned_unknown", f"an operator abandoned the unknown outcome of step "
                                                    f"{step.key!r} (effect {effect_id}): it may or may not have "
                                                    "happened")
    if decision.retry_safe and decision.attempts < max_attempts:
        return Call(effect_id, decision.attempts + 1)
    if not step.has_probe:
        why = (f"it was tried {decision.attempts} times without a receipt" if decision.retry_safe
               else "it is unsafe to run again")
        return Unknown(effect_id, why)
    asked = latest_probe(state, effect_id, decision.attempts)
    if asked is None:
        return AskProbe(effect_id, decision.attempts)
    answer = asked.get("answer")
    if not isinstance(answer, dict):
        probe = decision_of(str(asked.get("effect_id")))
        if probe is not None and probe.state in ("unknown", "not_dispatched") and probe.attempts < max_attempts:
            return ProbeAgain(str(asked.get("effect_id")), probe.attempts + 1)
        return Unknown(effect_id, "its probe never answered", asked)
    if answer.get("answer") in DEFINITE_ANSWERS:
        evidence = answer.get("evidence")
        key = "found" if answer["answer"] == "occurred" else "searched"
        return ResolveByProbe(effect_id, str(asked.get("effect_id")), step.name, str(answer["answer"]),
                              {"probe_effect_id": asked.get("effect_id"),
                               key: evidence if isinstance(evidence, dict) else {}},
                              answer.get("result") if answer["answer"] == "occurred" else None)
    return Unknown(effect_id, f"its probe does not know: {answer.get('reason')}", asked)


# --- carrying it out ------------------------------------------------------------------------


class _NoModel:
    """The model of a harness that only runs durable steps: never called (a durable run makes no model call)."""

    name = "none"

    async def complete(self, request: ModelRequest) -> ModelResponse:
        raise ModelError("this harness runs durable steps only and has no model", kind="invalid_request",
                         indeterminate=False)


def steps_agent(name: str = "steps") -> Agent:
    """An agent with no model and no tools, for a harness that runs durable steps only."""
    return Agent(name, _NoModel())


def _holds_a_run(decision: EffectDecision) -> bool:
    """A call with an outside effect (``unsafe``, ``idempotent``) whose outcome is unknown and unresolved: its run
    does not end, and no new run starts on its thread (a new run would make it again, under a new key)."""
    return (decision.kind == "tool" and decision.state == "unknown" and decision.resolution is None
            and decision.semantics != "read_only")


class DurableRun:
    """One run of your own code on a thread (see the module docstring). Get one from
    :meth:`Harness.durable <jixu.threads.harness.Harness.durable>` or :func:`durable`; use it as ``async with``."""

    def __init__(self, harness: Harness, thread_id: str | None, *, name: str = "run",
                 metadata: dict[str, Any] | None = None, approval_poll: float = DEFAULT_APPROVAL_POLL,
                 owns_harness: bool = False, run_key: str | None = None) -> None:
        if not isinstance(name, str) or not name.strip() or len(name) > 200:
            raise InvalidInput("a durable run's name must be 1-200 characters", field="name")
        if run_key is not None and (not isinstance(run_key, str) or not run_key.strip()
                                    or len(run_key) > STEP_KEY_CHARS):
            raise InvalidInput(f"a durable run's key must be 1-{STEP_KEY_CHARS} characters", field="run_key")
        canonical_text({"name": name, "run_key": run_key}, path="run")  # text JSON can hold (no lone surrogate)
        if isinstance(approval_poll, bool) or not isinstance(approval_poll, int | float) or not 0 < approval_poll <= 60:
            raise InvalidInput("approval_poll must be between 0 and 60 seconds", field="approval_poll")
        self._harness = harness
        self._thread_id = thread_id
        self.name = name
        self._metadata = metadata
        self._poll = float(approval_poll)
        self._owns_harness = owns_harness
        self.run_key = run_key
        """The key naming the run for good (None: entering continues the thread's unfinished run or starts one)."""
        self._ended: Turn | None = None
        self._ended_here: str | None = None
        """The outcome this block's ``turn.ended`` recorded, once committed."""
        self._thread: Thread | None = None
        self._session: Session | None = None
        self._turn_id = ""
        self._steps: dict[str, list[JSONObject]] = {}
        """The intents recorded under each step key in this run, oldest first."""
        self._counts: Counter[str] = Counter()
        self._carrying_out: dict[str, asyncio.Lock] = {}
        """A lock per step key: steps of one run run at once, each key's one at a time."""
        self._left_unknown: list[str] = []
        """The steps whose unknown outcome kept the run from ending when the block ended (:meth:`_unknown_steps`)."""
        self._in_steps: Counter[asyncio.Task[Any]] = Counter()
        """The tasks carrying out a step of this run now (how many each)."""
        self._steps_changed = asyncio.Event()
        self._awaiting_approval: set[asyncio.Task[Any]] = set()
        """Tasks whose step waits for an operator's approval (nothing of it runs meanwhile)."""
        self._called: set[str] = set()
        """The effects this block called (a call in a worker thread may outlive its step; see _settle_steps)."""
        self._leaving = False
        """Set when the block ends: no step starts any more."""
        self.reply: str | None = None
        """What the run's ``turn.ended`` records as its reply when the block ends normally (default: a count)."""
        self.error: JSONObject | None = None
        """Set (plain JSON) when the run failed for good: a block that then ends normally records ``turn.ended``
        ``failed`` with this error instead of ``completed`` (running the code again starts the next run)."""

    # --- the run ---------------------------------------------------------------------------

    @property
    def thread_id(self) -> str:
        """The thread the run is recorded in (pass it to run the code again after a crash)."""
        return self._live().thread_id

    @property
    def turn_id(self) -> str:
        """The run's turn."""
        return self._turn_id

    @property
    def finished(self) -> bool:
        """True when the run with :attr:`run_key` had ended before this entry: the block replays its record
        (each step returns what it recorded, a step it did not record raises :class:`~jixu.errors.StepMismatch`)
        and nothing is carried out or recorded."""
        return self._ended is not None

    @property
    def outcome(self) -> str | None:
        """How the run ended (``completed``, ``failed``, ``interrupted``): a :attr:`finished` run's recorded end,
        or this block's once its ``turn.ended`` is committed; None while it runs or when it stopped unfinished."""
        return self._ended.status if self._ended is not None else self._ended_here

    def settled_without_result(self, key: str) -> bool:
        """True when step ``key`` was settled ``occurred`` by a probe or an operator who gave no result: its
        :meth:`effect` then returned ``None`` though the call did not (a framework tells its model
        :data:`OCCURRED_WITHOUT_RESULT` instead, never ``None``)."""
        intents = self._steps.get(key)
        if not intents:
            return False
        decision = self._decision(str(intents[-1].get("effect_id")))
        resolution = decision.resolution if decision is not None else None
        return resolution is not None and resolution.get("resolution") == "occurred" and "result" not in resolution

    def state(self) -> State:
        """The thread's state as every surface shows it (``running`` while the run is in progress here)."""
        thread = self._live()
        return thread.log.snapshot(max_attempts=self._harness.max_attempts, running=self._session is not None,
                                   owner=self._harness.owner)

    def _live(self) -> Thread:
        if self._thread is None:
            raise ThreadBusy("the durable run has not started: use it as `async with harness.durable(...) as run`")
        return self._thread

    async def __aenter__(self) -> Self:
        harness = self._harness
        if harness.closing:
            raise ThreadBusy("the harness is shutting down and admits no new runs")
        if self._thread_id is None:
            thread = await harness.create_thread(metadata=self._metadata)
        else:
            thread = await harness.open_thread(self._thread_id, resume=False)
        log = thread.log
        await log.writer.idle()
        log.sync()
        log.open_to_act()
        if self._replays_ended_run(thread):
            return self
        if thread.running or thread.steps_active or harness.working_on(thread) is not None:
            raise ThreadBusy(f"thread {thread.thread_id} is running in this process already",
                             thread_id=thread.thread_id)
        # Reserved before anything awaits: a second entry of this process (same owner, so the same lease epoch) is
        # refused above instead of sharing, then giving back, this run's claim.
        thread.steps_began()
        try:
            started = await self._start_or_continue(thread)
        except BaseException:
            thread.steps_stopped()
            if self._owns_harness:  # refused (a thread waiting on an operator, say): nothing stays open
                harness.close()
            raise
        if started is None:  # another process ended the keyed run meanwhile: this entry replays it
            thread.steps_stopped()
            return self
        fence, claimed = started
        self._thread = thread
        try:
            session = Session(log.store, fence, harness.lease_ttl, release_at_end=False)
            await session.__aenter__()
            self._session = session
            if claimed:
                await thread._revise()
            active = log.state.active_turn()
            self._read_steps(log.events(active.started_seq if active is not None else 1))
        except BaseException as error:
            # Not started, so not ended: the run stays unfinished for the next run of the code (ended here, its
            # next run would start afresh and carry its steps out again).
            await self._stop(type(error), error, error.__traceback__)
            raise
        return self

    async def _start_or_continue(self, thread: Thread) -> tuple[Fence, bool] | None:
        """Start the run (a new turn) or claim the thread's unfinished one: its fence and whether it was claimed
        (continued); None when the keyed run was ended by another process meanwhile (it is replayed)."""
        harness, log = self._harness, thread.log
        turn = log.state.active_turn()
        fence: Fence | None
        if turn is None:
            unsettled = [d.effect_id for d in log.open_analysis().decisions.values() if _holds_a_run(d)]
            if unsettled:  # as send() refuses: a new run could make an unknown call of an ended one again
                raise ThreadBusy(
                    f"thread {thread.thread_id} is waiting for an operator: call(s) {', '.join(unsettled)} of an "
                    "ended run have an unknown outcome, and a new run would carry its steps out afresh. Record "
                    f"what happened first: `jixu threads resolve {shlex.quote(log.store.url)} {thread.thread_id} "
                    f"{unsettled[0]} --resolution RESOLUTION --note ...` (RESOLUTION: occurred, not_occurred or "
                    "abandoned_unknown)",
                    thread_id=thread.thread_id, effect_id=unsettled[0])
            await thread._revise(fenced=False)  # a new definition of the agent applies from this run on
            try:
                self._turn_id, fence = await log.start_turn_async(
                    self.name, owner=harness.owner, ttl=harness.lease_ttl, steps=True, run_key=self.run_key)
            except ThreadBusy:  # another process started a run meanwhile: the keyed one, ended, is replayed
                await log.writer.idle()
                log.sync()
                if self._replays_ended_run(thread):
                    return None
                raise
            thread._fence = fence
            assert fence is not None
            return fence, False
        if not turn.steps:
            raise ThreadBusy(f"thread {thread.thread_id} has an agent turn in progress ({turn.turn_id}); a durable "
                             "run needs an idle thread or its own unfinished run", thread_id=thread.thread_id)
        if turn.input != self.name:
            raise StepMismatch(f"thread {thread.thread_id}'s unfinished durable run is named {turn.input!r}, not "
                               f"{self.name!r}", thread_id=thread.thread_id, turn_id=turn.turn_id)
        if self.run_key is not None and turn.run_key != self.run_key:
            raise ThreadBusy(f"thread {thread.thread_id}'s unfinished durable run {turn.turn_id} has key "
                             f"{turn.run_key!r}, not {self.run_key!r}: run the code that started it to finish it "
                             "first", thread_id=thread.thread_id, turn_id=turn.turn_id, run_key=self.run_key)
        self._turn_id = turn.turn_id
        fence = await thread._claim_turn()  # TurnOwned while another live process runs it
        if fence is None:
            raise TurnOwned(f"thread {thread.thread_id}'s run {turn.turn_id} changed while claiming it; try again",
                            thread_id=thread.thread_id, turn_id=turn.turn_id)
        return fence, True

    def _replays_ended_run(self, thread: Thread) -> bool:
        """Become the replay of the ended run with :attr:`run_key`, if the thread has one (nothing is claimed)."""
        ended = None if self.run_key is None else thread.log.state.keyed_run(self.run_key)
        if ended is not None and ended.inherited:
            parent = (thread.log.state.parent or {}).get("thread_id")
            raise StepMismatch(f"thread {thread.thread_id}'s durable run with key {self.run_key!r} was recorded in "
                               f"thread {parent}, which this one was forked from: its steps are in that thread's "
                               "history, so enter it there (a fork's own runs take other keys)",
                               thread_id=thread.thread_id, turn_id=ended.turn_id, run_key=self.run_key,
                               parent_thread_id=parent)
        if ended is None or ended.ended_seq is None:
            return False
        if ended.input != self.name:
            raise StepMismatch(f"thread {thread.thread_id}'s durable run with key {self.run_key!r} is named "
                               f"{ended.input!r}, not {self.name!r}", thread_id=thread.thread_id,
                               turn_id=ended.turn_id)
        self._thread, self._turn_id, self._ended = thread, ended.turn_id, ended
        self._read_steps(thread.log.store.read(thread.log.stream, ended.started_seq, ended.ended_seq))
        return True

    def recorded_args(self, key: str) -> JSONObject | None:
        """The args the latest intent this run recorded under step ``key`` carries, or None (none recorded)."""
        found = self._steps.get(key)
        args = found[-1].get("args") if found else None
        return args if isinstance(args, dict) else None

    def _read_steps(self, events: Sequence[Event]) -> None:
        """Gather the intents this run's ``tool.requested`` events recorded under each step key."""
        for event in events:
            data = event.data
            if event.type == "tool.requested" and data.get("turn_id") == self._turn_id \
                    and isinstance(data.get("step"), str):
                self._steps.setdefault(data["step"], []).append(dict(data))

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        """A block that ends normally ends the run (``turn.ended`` completed, or failed when :attr:`error` is
        set); an exception leaves it unfinished (the lease given back): run the code again with the thread id to
        continue it. A step with an outside effect whose outcome is unknown leaves it unfinished too, and a block
        that ended normally then raises :class:`~jixu.errors.StepOutcomeUnknown` ("stays unfinished"). A block
        cancelled because another owner took the run's lease (the heartbeat found it lost) raises
        :class:`~jixu.errors.OwnershipLost`, not a bare cancellation."""
        if self._ended is not None:  # a replay: nothing was claimed, nothing is recorded
            if self._owns_harness:
                self._harness.close()
            return
        thread, session, me = self._thread, self._session, asyncio.current_task()
        fence = thread._fence if thread is not None else None  # given back by _stop, before a loss is told
        self._leaving = True  # a step asked from now on is refused: the run is given back once its steps ended
        try:
            cut_off = await self._settle_steps()
        except BaseException:
            await self._stop(exc_type, exc, tb)
            raise
        try:
            await self._stop(exc_type, exc, tb)
        except (asyncio.CancelledError, FencingError) as error:  # the run's end refused or cut off by the loss
            await self._raise_if_lost(thread, session, fence, me, error)
            raise
        if exc is not None:
            await self._raise_if_lost(thread, session, fence, me, exc)
        if cut_off:
            raise asyncio.CancelledError  # the wait for its steps was cancelled: the block is, once they ended
        if self._left_unknown and thread is not None:
            # The block ended, the run did not: say so, rather than return as if it had (with the failure the run
            # was ending with, as a framework sets it).
            keys = {str(intents[-1].get("effect_id")): key for key, intents in self._steps.items() if intents}
            effects = ", ".join(f"{keys.get(effect_id, '?')!r} (effect {effect_id})" for effect_id in self._left_unknown)
            failed = "" if self.error is None else (
                f" (it was ending failed: {str(self.error.get('message') or self.error)[:300]})")
            raise StepOutcomeUnknown(
                f"durable run {self._turn_id} in thread {thread.thread_id} stays unfinished{failed}: step(s) "
                f"{effects} have an unknown outcome. Running the code again continues the run: a probe that has not "
                "answered yet is asked then, but a step without one, or whose attempts are used up, waits for an "
                f"operator: record what happened with `jixu threads resolve {shlex.quote(thread.log.store.url)} "
                f"{thread.thread_id} EFFECT_ID --resolution RESOLUTION --note ...` (RESOLUTION: occurred, "
                "not_occurred, or abandoned_unknown, which fails that step on every run of the code)",
                thread_id=thread.thread_id, effect_id=self._left_unknown[0], turn_id=self._turn_id)

    async def _settle_steps(self) -> bool:
        """Wait until no step of this run is in flight in another task (a sibling of an ``asyncio.gather`` that
        raised): given back while one still ran, the run's next owner would find it unknown and ask its probe while
        it acts. A step waiting for an approval is cancelled (nothing of it runs). If this wait is cancelled (a
        drain's timeout), the steps are cancelled too, each recording its call cut off, and waited for. Then the
        calls this block made that still run in a worker thread are waited for. True when the wait was cancelled.
        """
        me = asyncio.current_task()
        cut_off = False
        while others := [task for task in self._in_steps if task is not me]:
            for task in others:
                if cut_off or task in self._awaiting_approval:
                    task.cancel()
            self._steps_changed.clear()
            try:
                await self._steps_changed.wait()
            except asyncio.CancelledError:
                cut_off = True
        try:
            await stop_calls(self._harness, effect_ids=self._called)  # a call gone on past its timeout stops too
        except asyncio.CancelledError:
            cut_off = True
        for effect_id in list(self._called):
            while True:
                try:
                    await call_ended(effect_id)
                    break
                except asyncio.CancelledError:
                    cut_off = True
        return cut_off

    async def _raise_if_lost(self, thread: Thread | None, session: Session | None, fence: Fence | None,
                             me: asyncio.Task[Any] | None, error: BaseException) -> None:
        """Raise :class:`~jixu.errors.OwnershipLost` when ``error`` says the run's lease was lost: a fenced write
        refused, or the heartbeat's cancellation (taken back, so the task is not left cancelling). The receipts the
        lost claim could not record are held for this process's next claim of the run, as a turn's are (decision
        0070)."""
        if thread is None or session is None:
            return
        cause: FencingError | None
        if isinstance(error, FencingError):
            session.cancelled_by_loss(me)  # the heartbeat may have cancelled the task too
            cause = error
        elif isinstance(error, asyncio.CancelledError):
            cause = session.cancelled_by_loss(me)
        else:
            cause = None
        if cause is not None:
            raise await thread._lost(cause, "the durable run", fence, turn_id=self._turn_id) from cause

    async def _stop(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                    tb: TracebackType | None) -> None:
        thread, session = self._thread, self._session
        self._left_unknown = self._unknown_steps() if thread is not None and exc is None and session is not None else []
        try:
            if thread is not None and exc is None and session is not None and not self._left_unknown:
                steps = sum(len(v) for v in self._steps.values())
                reply = self.reply if self.reply is not None else f"{steps} steps"
                ended: JSONObject = {"turn_id": self._turn_id, "outcome": "completed", "reply": str(reply)}
                if self.error is not None:
                    ended = {"turn_id": self._turn_id, "outcome": "failed", "error": self.error}
                await thread._commit([NewEvent("turn.ended", ended, thread.log.meta())])
                self._ended_here = str(ended["outcome"])
                thread.log.checkpoint()
        finally:
            self._session = None
            try:
                if session is not None:
                    await session.__aexit__(exc_type, exc, tb)
            finally:
                if thread is not None:
                    thread._release()
                    thread.steps_stopped()
                if self._owns_harness:
                    self._harness.close()

    def _unknown_steps(self) -> list[str]:
        """The effects of this run's steps with an outside effect (``unsafe``, ``idempotent``) whose outcome is
        unknown: while one is, the run does not end (it stays unfinished, so running the code again continues it:
        an idempotent step is tried again under its own key, an unsafe one settled by its probe or an operator;
        ended, a new run would make the call again under a new key, and the record would hold both). A read-only
        step does not hold a run: making it again changes nothing."""
        unknown = []
        for intents in self._steps.values():
            decision = self._decision(str(intents[-1].get("effect_id"))) if intents else None
            if decision is not None and _holds_a_run(decision):
                unknown.append(decision.effect_id)
        return unknown

    # --- steps -----------------------------------------------------------------------------

    async def effect(self, name: str, args: JSONObject | None = None, *,
                     call: Callable[[ToolContext], Any], semantics: Semantics = "unsafe",
                     probe: Callable[[ProbeQuery], Any] | None = None, probe_timeout: float | None = None,
                     requires_approval: bool = False, timeout: float | None = None, key: str | None = None) -> Any:
        """Run one durable step and return its result (plain JSON), or its recorded result when it ran before.

        ``call(ctx)`` (sync, run in a worker thread, or async) does the work; ``ctx`` is a
        :class:`~jixu.ToolContext`: send ``ctx.idempotency_key`` to the outside system. ``args`` (plain JSON) are
        recorded, hashed and compared with the record when the code runs again. ``semantics`` as for tools;
        ``probe(query)`` as a tool's probe (:class:`~jixu.ProbeQuery` -> ``Occurred`` / ``NotOccurred`` /
        ``DontKnow``) settles an unknown unsafe step. ``key`` names the step (default ``<name>#<n>``: the
        ``n``-th step of that name in the run). Steps of one run run at once (each key's one at a time).

        Raises :class:`~jixu.errors.StepOutcomeUnknown`, :class:`~jixu.errors.StepMismatch`,
        :class:`~jixu.errors.StepFailed` (the call raised ``ToolError``, was denied, or its unknown outcome was
        abandoned), :class:`~jixu.errors.ToolDefinitionError` for a bad declaration.
        """
        thread = self._live()
        if (self._session is None or self._leaving) and self._ended is None:
            raise ThreadBusy(f"durable run {self._turn_id} has ended", thread_id=thread.thread_id)
        args = {} if args is None else args
        if not isinstance(args, dict):
            raise InvalidInput("a step's args must be a JSON object", field="args")
        canonical_text(args, path="args")
        if not callable(call):
            raise InvalidInput("call must be a function taking the step's ToolContext", field="call")
        tool = _step_tool(name, call, semantics=semantics, probe=probe, probe_timeout=probe_timeout,
                          requires_approval=requires_approval, timeout=timeout)
        if key is None:
            self._counts[name] += 1
            key = f"{name}#{self._counts[name]}"
        elif not isinstance(key, str) or not key.strip() or len(key) > STEP_KEY_CHARS:
            raise InvalidInput(f"a step key must be 1-{STEP_KEY_CHARS} characters", field="key")
        step = Step(key, name, args, semantics, requires_approval, probe is not None)
        if self._ended is not None:
            return self._replayed(thread, step)
        lock = self._carrying_out.setdefault(key, asyncio.Lock())
        task = asyncio.current_task()
        assert task is not None  # a coroutine of an event loop runs in a task
        self._in_steps[task] += 1
        try:
            async with lock:
                thread.refuse_if_draining()
                return await self._carry_out(thread, step, tool)
        except Exception:
            await self._thread_siblings_ended(key)
            raise
        finally:
            self._in_steps[task] -= 1
            if not self._in_steps[task]:
                del self._in_steps[task]
            self._steps_changed.set()

    async def _thread_siblings_ended(self, key: str) -> None:
        """Before step ``key``'s error reaches its caller, wait for the other steps of this run whose calls run in
        a worker thread to end.

        A framework running calls at once (pydantic-ai's, the Agents SDK's) cancels every sibling when one raises;
        a call in a thread cannot be stopped (the block's end waits for it anyway), and its step, cancelled, would
        record it ``interrupted`` (unknown) and drop the result it then returns: an operator would have to settle a
        call that completed. Waited for, it records what it returned. Coroutines are not waited for: a
        cancellation stops them, and their steps record that honestly.
        """
        waited: set[str] = set()
        while True:
            self._steps_changed.clear()
            for other, lock in self._carrying_out.items():
                intents = self._steps.get(other)
                if other != key and lock.locked() and intents and call_running(str(intents[-1].get("effect_id"))):
                    waited.add(other)
            waited = {other for other in waited if self._carrying_out[other].locked()}
            if not waited:
                return
            await self._steps_changed.wait()

    def _replayed(self, thread: Thread, step: Step) -> Any:
        """What ``step`` recorded in the ended run: its result, or the error it ends with; never a new call."""
        thread.refuse_if_draining()
        log = thread.log
        log.sync()
        log.writer.heed_recorded_break(fresh=False)
        log.refuse_if_corrupt()
        action = decide_step(step, self._steps.get(step.key, ()), self._decision, log.state,
                             max_attempts=self._harness.max_attempts)
        if isinstance(action, Done):
            return self._result(thread, step, action)
        if isinstance(action, Fail | Mismatch | Unknown):
            self._raise(thread, step, action, None)
        intents = self._steps.get(step.key, ())
        called = self._decision(action.effect_id) if isinstance(action, Call) else None
        if intents and (isinstance(action, AskProbe | ProbeAgain | ResolveByProbe)
                        or (called is not None and called.state == "unknown")):
            # It may have happened: an ended run asks no probe and records nothing, so an operator settles it.
            self._raise(thread, step, Unknown(str(intents[-1].get("effect_id")),
                                              f"the run ended ({self.outcome}) before it settled"), None)
        recorded = "did not settle" if intents else "was not recorded"
        raise StepMismatch(f"thread {thread.thread_id}: durable run {self._turn_id} with key {self.run_key!r} ended "
                           f"({self.outcome}) and step {step.key!r} {recorded} in it; an ended run carries nothing "
                           "out: start a new run with another key", thread_id=thread.thread_id, step=step.key,
                           turn_id=self._turn_id, run_key=self.run_key)

    async def _carry_out(self, thread: Thread, step: Step, tool: Tool) -> Any:
        log, harness = thread.log, self._harness
        cause: BaseException | None = None
        while True:
            await log.writer.idle()
            log.sync()
            log.writer.heed_recorded_break(fresh=False)  # a break another process recorded stops the next step
            log.refuse_if_corrupt()
            action = decide_step(step, self._steps.get(step.key, ()), self._decision, log.state,
                                 max_attempts=harness.max_attempts)
            if isinstance(action, Done):
                return self._result(thread, step, action, cause)
            if isinstance(action, Fail | Mismatch | Unknown):
                self._raise(thread, step, action, cause)
            try:
                cause = await self._act(thread, step, tool, action) or cause
            except ConcurrencyError as conflict:
                if unrecorded_receipts(conflict):
                    raise  # receipts it could not record are facts: they reach the caller, never dropped here
                # Another writer appended meanwhile (an operator approving a sibling step, say): what was refused
                # was decided on an old head and nothing of it ran. Read the new events and decide again.
                await log.writer.idle()
                log.sync()
                self._forget_unrecorded(step.key)

    async def _act(self, thread: Thread, step: Step, tool: Tool, action: StepAction) -> BaseException | None:
        """Carry out one action of ``step`` (not Done, Fail, Mismatch or Unknown); what a call raised, if any."""
        log = thread.log
        if isinstance(action, Record):
            await self._record(thread, step, tool)
        elif isinstance(action, Call):
            return await self._call(thread, tool, action.effect_id, action.attempt)
        elif isinstance(action, AwaitApproval):
            me = asyncio.current_task()
            assert me is not None
            self._awaiting_approval.add(me)
            try:
                await asyncio.sleep(self._poll)
            finally:
                self._awaiting_approval.discard(me)
        elif isinstance(action, AskProbe):
            await self._ask_probe(thread, tool, action)
        elif isinstance(action, ProbeAgain):
            intent = log.state.intent(action.probe_effect_id)
            if intent is None:  # pragma: no cover - the resolver reports only recorded effects
                raise StepOutcomeUnknown(f"probe {action.probe_effect_id} has no intent")
            await self._run_probe(thread, tool, action.probe_effect_id, intent, action.attempt)
        elif isinstance(action, ResolveByProbe):
            await thread._resolve_by_probe(action)
        return None

    def _forget_unrecorded(self, key: str) -> None:
        """Drop the latest intent kept under ``key`` when its append was refused (the store has no event of it)."""
        intents = self._steps.get(key)
        if intents and self._decision(str(intents[-1].get("effect_id"))) is None:
            intents.pop()
            if not intents:
                del self._steps[key]

    def _raise(self, thread: Thread, step: Step, action: Fail | Mismatch | Unknown, cause: BaseException | None) -> NoReturn:
        """Raise the error a step ends with: it failed, the code differs from the record, or its outcome is unknown."""
        if isinstance(action, Fail):
            raise StepFailed(f"step {step.key!r} of durable run {self._turn_id} in thread {thread.thread_id}: "
                             f"{action.message}", thread_id=thread.thread_id, effect_id=action.effect_id,
                             step=step.key, reason=action.reason) from cause
        if isinstance(action, Mismatch):
            raise StepMismatch(f"thread {thread.thread_id}, durable run {self._turn_id}: {action.message}. The "
                               "code changed under a recorded run; run the code that recorded it, or start "
                               "a new run", thread_id=thread.thread_id, effect_id=action.effect_id, step=step.key)
        answer = ""
        if action.probe is not None:
            found = action.probe.get("answer")
            answer = f" (probe {action.probe.get('effect_id')}: " + (
                f"{found.get('answer')}: {found.get('reason')})" if isinstance(found, dict) else "no answer)")
        said = f": {str(cause)[:500]}" if cause is not None and str(cause) else ""
        raised = f" (its call raised {type(cause).__name__}{said})" if cause is not None else ""
        raise StepOutcomeUnknown(
            f"step {step.key!r} of durable run {self._turn_id} in thread {thread.thread_id}: effect "
            f"{action.effect_id} was dispatched and its outcome is unknown; {action.why}{answer}{raised}. Find out "
            f"what happened, record it with `jixu threads resolve STORE {thread.thread_id} {action.effect_id} "
            "--resolution occurred|not_occurred|abandoned_unknown --note ...`, then run the code again",
            thread_id=thread.thread_id, effect_id=action.effect_id, step=step.key,
            probe=action.probe) from cause

    def _decision(self, effect_id: str) -> EffectDecision | None:
        """The resolver's decision of one effect: the open analysis, or the settled decision kept."""
        log = self._live().log
        found = log.open_analysis().decisions.get(effect_id)
        if found is None and effect_id in log.state.settled:
            found = log.state.settled[effect_id]
        return found

    async def _record(self, thread: Thread, step: Step, tool: Tool) -> None:
        """Record the step's intent; a retry-safe one without approval is committed with its dispatch marker."""
        log = thread.log
        effect_id = new_id()
        intent: JSONObject = {
            "effect_id": effect_id, "name": step.name, "args": step.args, "args_hash": step.args_hash,
            "semantics": step.semantics, "idempotency_key": f"jixu:{effect_id}",
            "requires_approval": step.requires_approval, "turn_id": self._turn_id, "call_id": step.key,
            "step": step.key,
        }
        if step.has_probe:
            intent["probe"] = True
        events = [NewEvent("tool.requested", intent, log.meta())]
        if step.requires_approval:
            events.append(NewEvent("tool.parked", {"effect_id": effect_id, "reason": "requires_approval"}, log.meta()))
        if step.semantics in ("read_only", "idempotent") and not step.requires_approval:
            self._steps.setdefault(step.key, []).append(intent)
            await self._call(thread, tool, effect_id, 1, intent, with_marker=events)  # decision 0010
            return
        await thread._commit(events)  # an unsafe intent is durable before its marker
        self._steps.setdefault(step.key, []).append(intent)

    async def _call(self, thread: Thread, tool: Tool, effect_id: str, attempt: int,
                    intent: JSONObject | None = None, *, with_marker: Sequence[NewEvent] = ()) -> BaseException | None:
        """One attempt through the thread's path through the kernel (marker, call, one receipt); the exception
        the call raised, if any (kept as the cause of an unknown outcome). ``with_marker``: the intent's events,
        committed with the marker (a retry-safe step's: a crash before that commit leaves no trace)."""
        intent = intent if intent is not None else thread.log.state.intent(effect_id)
        if intent is None:  # pragma: no cover - the resolver reports only recorded effects as dispatchable
            raise StepOutcomeUnknown(f"effect {effect_id} has no intent", effect_id=effect_id)
        raised: list[BaseException] = []
        self._called.add(effect_id)
        await thread._call_tool(effect_id, intent, attempt, checked=(tool, {}), dispatched=False, raised=raised,
                                read_only_fails_last=False, with_marker=with_marker)
        return raised[-1] if raised else None

    async def _ask_probe(self, thread: Thread, tool: Tool, action: AskProbe) -> None:
        log = thread.log
        effect_id = new_id()
        args = {"effect_id": action.effect_id, "attempt": action.attempt}
        intent: JSONObject = {"effect_id": effect_id, "name": tool.name, "args": args, "args_hash": content_hash(args),
                              "semantics": "read_only", "idempotency_key": f"jixu:{effect_id}",
                              "requires_approval": False, "turn_id": self._turn_id}
        await self._run_probe(thread, tool, effect_id, intent, 1,
                              with_marker=[NewEvent("probe.requested", intent, log.meta())])

    async def _run_probe(self, thread: Thread, tool: Tool, effect_id: str, intent: JSONObject, attempt: int, *,
                         with_marker: Sequence[NewEvent] = ()) -> None:
        """Ask the step's probe (a ``probe`` effect: marker, the probe, one receipt holding its answer;
        ``with_marker``: its intent, when it is the first attempt)."""
        log = thread.log
        args = intent.get("args") or {}
        target = str(args.get("effect_id"))
        asked = log.state.intent(target) or {}
        attempt_asked = args.get("attempt")
        query = ProbeQuery(effect_id=target, idempotency_key=str(asked.get("idempotency_key")),
                           args=dict(asked.get("args") or {}), tool=tool.name,
                           attempt=attempt_asked if isinstance(attempt_asked, int) else 1,
                           thread_id=thread.thread_id, turn_id=self._turn_id)

        async def call() -> Outcome:
            return Outcome.completed({"result": await tool.ask_probe(query)})

        def classify(error: Exception) -> Outcome:
            if isinstance(error, TimeoutError):
                return Outcome.failed({"type": "timeout", "message": f"no answer within {tool.probe_timeout}s"},
                                      indeterminate=False)
            return Outcome.failed({"type": "exception", "exception": type(error).__name__,
                                   "message": str(error)[:2000]}, indeterminate=False)  # read-only: nothing happened

        await thread._perform("probe", effect_id, intent, attempt, call, classify, with_marker=with_marker)

    def _result(self, thread: Thread, step: Step, done: Done, cause: BaseException | None = None) -> Any:
        """The recorded result of a settled step (read from its receipt), or :class:`StepFailed` (from ``cause``,
        what its call raised here, if it did)."""
        decision, log = done.decision, thread.log
        if decision.resolution is not None:  # occurred, by an operator or a probe
            return decision.resolution.get("result")
        [receipt] = log.store.read(log.stream, decision.last_seq, decision.last_seq)
        data = receipt.data
        if receipt.type == "tool.completed" and data.get("effect_id") == done.effect_id:
            ref = data.get("result_artifact")
            return json.loads(log.artifact_text(ref)) if isinstance(ref, dict) else data.get("result")
        reason = "denied" if receipt.type == "tool.denied" else "failed"
        detail = data.get("note") if reason == "denied" else data.get("error")
        raise StepFailed(f"step {step.key!r} of durable run {self._turn_id} in thread {thread.thread_id} "
                         f"{'was denied' if reason == 'denied' else 'failed'} (effect {done.effect_id}): {detail}",
                         thread_id=thread.thread_id, effect_id=done.effect_id, step=step.key, reason=reason,
                         error=detail) from cause


def _step_tool(name: str, call: Callable[[ToolContext], Any], **declared: Any) -> Tool:
    """The step as a :class:`~jixu.threads.tools.Tool` taking no arguments (its arguments are the closure's):
    its declaration is checked, its result and its probe's answers are validated, as a tool's are."""

    async def step(ctx: ToolContext) -> Any:
        return await call_user_function(call, ctx, effect_id=ctx.effect_id)

    return Tool(step, name=name, description=f"durable step {name}", **declared)


def durable(store: Store | str | os.PathLike[str] | None, thread_id: str | None = None, *, name: str = "run",
            agent: str = "steps", metadata: dict[str, Any] | None = None,
            approval_poll: float = DEFAULT_APPROVAL_POLL, run_key: str | None = None, **harness: Any) -> DurableRun:
    """A durable run on ``store`` without an agent of yours: ``async with jixu.durable(url, thread_id) as run``.

    ``agent`` names the (model-less) agent the thread is recorded under; ``run_key`` as for
    :meth:`Harness.durable <jixu.threads.harness.Harness.durable>`; ``harness`` goes to :class:`~jixu.Harness`
    (``owner``, ``lease_ttl``, ``max_attempts``, ...).
    """
    from jixu.threads.harness import Harness

    return DurableRun(Harness(steps_agent(agent), store, **harness), thread_id, name=name, metadata=metadata,
                      approval_poll=approval_poll, owns_harness=True, run_key=run_key)


def run_failure(error: Exception) -> JSONObject:
    """What :attr:`DurableRun.error` records of ``error``: its type, its message (at most 2,000 characters) and, for
    a jixu error, its ``to_dict()`` as plain JSON (a value that is not JSON is kept as its ``repr``)."""
    found: JSONObject = {"type": type(error).__name__, "message": str(error)[:2000]}
    if isinstance(error, JixuError):
        from pydantic_core import to_jsonable_python  # imported when a run fails, not with every thread

        found["jixu"] = to_jsonable_python(error.to_dict(), fallback=repr)
    return found


__all__ = ["OCCURRED_WITHOUT_RESULT", "AskProbe", "AwaitApproval", "Call", "Done", "DurableRun", "Fail", "Mismatch",
           "ProbeAgain", "Record",
           "Step", "StepAction", "Unknown", "decide_step", "durable", "latest_probe", "run_failure", "steps_agent"]
