"""A durable agent thread: the agent loop, effect dispatch, resolution, replay and fork.

Every model and tool call is an effect: its intent is appended before
anything happens, its dispatch marker immediately before the call leaves the
process, its receipt before the result is used. What to do next is decided by
:func:`jixu.threads.decide.decide` from the projected state and the
RecoveryResolver's analysis; this module only carries decisions out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Sequence
from functools import partial
from itertools import repeat
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from jixu.errors import (
    FencingError,
    InvalidInput,
    JixuError,
    LeaseHeld,
    MalformedEvent,
    ModelError,
    OwnershipLost,
    ReceiptConflict,
    ThreadBusy,
    TurnOwned,
)
from jixu.kernel import (
    INTERRUPTED,
    LOOP_STOPPED,
    CallerTask,
    Claim,
    Commits,
    Outcome,
    Session,
    claim_stream,
    dead_holder,
    drive,
    holds,
    marker,
    own_lease,
    pause_delay,
    perform,
    release_later,
    tracing,
    unrecorded_receipts,
)
from jixu.kernel.writer import effect_and_attempt
from jixu.ledger import Event, Fence, NewEvent, content_hash, new_id
from jixu.ledger.artifacts import ArtifactRef, put_text
from jixu.ledger.encoding import JSONObject, canonical_text
from jixu.ledger.event import PreparedEvent, utf8_size
from jixu.recovery import Analysis, EffectDecision
from jixu.recovery.resolutions import resolution_body
from jixu.threads.compaction import compaction_prompt, summary_problem
from jixu.threads.decide import (
    CompleteTurn,
    Dispatch,
    FailTurn,
    InterruptTurn,
    PauseTurn,
    Probe,
    RequestCompaction,
    RequestModel,
    RequestTools,
    ResolveByProbe,
    Stop,
    decide,
)
from jixu.threads.home import on_home_loop
from jixu.threads.log import MAX_INPUT_CHARS, State, ThreadLog, interrupted_end, stream_of
from jixu.threads.model import ModelRequest
from jixu.threads.projection import PROBE_ACTOR_PREFIX, tool_content
from jixu.threads.revisions import revision
from jixu.threads.tools import (
    CALL_OWNER,
    ProbeQuery,
    Tool,
    ToolContext,
    ToolError,
    call_ended,
    call_running,
    claim_taken_again,
    hold_claim_while_calls_run,
    stop_calls,
)

if TYPE_CHECKING:
    from jixu.threads.harness import Harness
    from jixu.threads.streaming import Signal

INLINE_RESULT_BYTES = 64 * 1024
"""A tool result whose canonical JSON is larger than this is stored as an artifact, not in its receipt."""
YIELD_EVERY_APPENDS = 4
"""The agent loop yields to the event loop after this many appends (two agent steps)."""

Action: TypeAlias = (Dispatch | RequestModel | RequestCompaction | RequestTools | Probe | ResolveByProbe | CompleteTurn
                     | PauseTurn | FailTurn | InterruptTurn | Stop)
"""What the loop carries out: a decision of :func:`~jixu.threads.decide.decide` (a ``Stop`` only for an
automatic pause, whose resume it records)."""

HELD_RECEIPTS = 10_000
"""The most threads whose lost claim's receipts a harness keeps (see ``Harness.held_receipts``): the oldest go."""
PAUSE_LOOK_EVERY = 1.0
"""Seconds between two looks of a loop waiting out an automatic pause for a resume recorded elsewhere."""





class Thread:
    """One durable conversation with an agent. Get one from :class:`~jixu.Harness`."""

    def __init__(self, harness: Harness, log: ThreadLog) -> None:
        self._harness = harness
        self._agent = harness.agent
        self.log = log
        """The durable record (events, projected state, operator operations)."""
        self._task: asyncio.Task[None] | None = None
        self._fence: Fence | None = None
        """This process's claim on the active turn, while it runs it."""
        self._start_settled: asyncio.Event | None = None
        """Set when send()'s wait for its ``turn.started`` commit is over (what a drain waits for)."""
        self._draining = False
        self.following = False
        """True while this handle's loop waits for another handle's (see :meth:`_follow`)."""
        self._pending: list[NewEvent] = []
        """Intents of retry-safe effects waiting to be committed with their dispatch marker (see _commit)."""
        self._resumed = asyncio.Event()
        """Set by an explicit resume: the loop waiting out an automatic pause stops waiting."""
        self._stage_receipts = False
        """True while one call runs alone: its receipt may be staged and committed with the next step (0011)."""
        self._appends = 0
        """Appends made by this thread's agent loop: it yields every few (see _commit)."""
        self._analysis: Analysis | None = None
        """The analysis the loop's current action was decided on."""
        self._in_flight: set[str] = set()
        """Effects whose call this process is carrying out right now (they cannot be resolved meanwhile)."""
        self._tool_specs = tuple(t.spec() for t in self._agent.tools)
        """What every model request offers (the agent's tools never change under a thread)."""
        self._artifact_scan: tuple[list[JSONObject], int, Any, bool] | None = None
        """(conversation, messages scanned, the last of them, whether one refers to an artifact)."""
        self._steps_task: asyncio.Task[Any] | None = None
        self._steps_ended: asyncio.Event | None = None
        """While a durable run is on: the task running its block, and set when the run stops (see :meth:`drain`)."""
        self.thread_id = log.thread_id
        self.stream = log.stream

    @property
    def home_loop(self) -> asyncio.AbstractEventLoop | None:
        """The event loop this thread's coroutines run on (its harness's, see :attr:`Harness.home_loop`)."""
        return self._harness.home_loop

    @property
    def steps_active(self) -> bool:
        """True while a durable run (``Harness.durable``) carries this thread's turn out in this process."""
        return self._steps_ended is not None

    @property
    def busy(self) -> bool:
        """True while this process works on the thread: its loop runs, a turn starts or a durable run is on."""
        return self.running or self._starting or self.steps_active

    @property
    def checkpoint_status(self) -> str:
        """How opening this thread used its checkpoint (``used``, ``none`` or why it was ignored)."""
        return self.log.checkpoint_status

    # --- reading ------------------------------------------------------------------------

    def analysis(self) -> Analysis:
        """The RecoveryResolver's answer for this thread as it stands."""
        return self.log.analysis()

    def state(self) -> State:
        """The current state (no I/O unless the history contradicts itself, the last reply is a new artifact, the
        thread would wait on an operator, or its turn goes on but not in this process: then the turn's claim is
        read, since another process holding it has its calls in flight, and the reason says who continues it).

        ``last_reply`` is the whole text even when the reply was stored as an
        artifact (the turns keep the short placeholder and ``reply_artifact``).
        """
        return self.log.snapshot(max_steps=self._agent.max_steps, max_attempts=self._harness.max_attempts,
                                 running=self.running, context_budget=self._agent.context_budget,
                                 owner=self._harness.owner)

    @property
    def running(self) -> bool:
        """True while the agent loop is working in this process."""
        return self._task is not None and not self._task.done()

    @on_home_loop
    async def events(self, from_seq: int = 1) -> list[Event]:
        """The thread's events, in order."""
        return self.log.events(from_seq)

    def signals(self, *, maxsize: int = 1000) -> AsyncIterator[Signal]:
        """The transient progress of this thread's model calls, as the driver streams it::

            async for signal in thread.signals():
                if signal.kind == "text_delta":
                    print(signal.data["text"], end="", flush=True)

        Text deltas, tool-call deltas and one ``done`` per call (see
        :mod:`jixu.threads.streaming`), of every model call of this thread in
        this process (summary requests of a compaction included: their
        ``effect_id`` is the compaction's). Signals are never recorded: the
        events hold only each call's final response. The iterator subscribes
        when iteration starts (start it before ``send`` to see a whole call)
        and runs until you break out of it; a reader that falls more than
        ``maxsize`` signals behind loses the oldest. Raises
        :class:`~jixu.errors.InvalidInput` at once when the agent's driver
        publishes no signals (e.g. :class:`~jixu.ScriptedModel`).
        """
        source = getattr(self._agent.model, "signals", None)
        if not callable(source):
            raise InvalidInput(f"the model driver {self._agent.model.name!r} publishes no signals; streaming "
                               "needs a driver with signals(), such as OpenAIModel or AnthropicModel",
                               field="model")
        return cast("AsyncIterator[Signal]", source(thread_id=self.thread_id, maxsize=maxsize))

    @on_home_loop
    async def refresh(self) -> State:
        """Pick up events other processes appended, and return the state."""
        await self.log.writer.idle()
        self.log.sync()
        return self.state()

    # --- driving ------------------------------------------------------------------------

    @on_home_loop
    async def send(self, text: str) -> str:
        """Start a turn with user input ``text``; returns the turn id once ``turn.started`` is durable. The loop
        runs in the background.

        The commit is shared with the loop's other appends (decision 0020): sends made together
        (``asyncio.gather``) share one, and the loop runs other tasks while it is made.
        """
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("input must be a non-empty string", field="input")
        if len(text) > MAX_INPUT_CHARS:
            raise InvalidInput(f"input has {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
                               field="input")
        await self.log.writer.idle()
        self.log.sync()
        self.log.open_to_act()
        state = self.state()
        if state.status == "paused":
            raise ThreadBusy(f"thread {self.thread_id} is {state.reason}", thread_id=self.thread_id)
        if state.status == "waiting":
            raise ThreadBusy(f"thread {self.thread_id} is waiting: {state.reason}. Resolve or approve first "
                             "(jixu threads resolve …)", thread_id=self.thread_id)
        if (self.running or self._starting or self.log.state.active_turn() is not None
                or self._harness.working_on(self) is not None):
            raise ThreadBusy(f"thread {self.thread_id} is still working on a turn; wait() for it first",
                             thread_id=self.thread_id)
        if self._harness.closing:
            raise ThreadBusy("the harness is shutting down and admits no new turns", thread_id=self.thread_id)
        settled = self._start_settled = asyncio.Event()
        try:
            await self._revise(fenced=False)  # a new definition applies from this turn on
            turn_id, self._fence = await self.log.start_turn_async(text, owner=self._harness.owner,
                                                                   ttl=self._harness.lease_ttl)
        finally:
            settled.set()
        if self._draining:
            # The harness began shutting down while the turn was starting: it is recorded, and left as a drained
            # turn is (active, its lease released) for the next process to continue; no loop starts on a store
            # about to close.
            self._release()
            return turn_id
        self._start()
        return turn_id

    @on_home_loop
    async def wait(self) -> State:
        """Run the agent loop until the thread is idle, waiting, failed or corrupt; return its state.

        A loop started in the background (by :meth:`send` or :meth:`wait_in_background`) that already
        stopped with an error is collected here: that error is raised, once; the next call starts a new loop.
        """
        task = self._task
        if task is not None and task.done():
            self._task = None
            if not task.cancelled() and (error := task.exception()) is not None:
                raise error
        if self._task is None:
            self._start()
        task = self._task
        assert task is not None
        try:
            await asyncio.shield(task)
        except BaseException:
            if task.done() and self._task is task:
                self._task = None  # its error is raised here, once: the next wait() starts a new loop
            raise
        return self.state()

    def wait_in_background(self) -> None:
        """Start the agent loop without waiting for it (``wait()`` collects it)."""
        if not self.running:
            self._start()

    @on_home_loop
    async def interrupt(self, reason: str = "interrupted by the caller") -> State:
        """Stop the running turn; calls in flight are recorded as having an unknown outcome.

        Refused with :class:`~jixu.errors.TurnOwned` (nothing written) while another process holds a live claim
        on the turn: interrupt it there, or stop that process.
        """
        sibling = self._harness.working_on(self)
        if sibling is not None:  # the loop running the turn is another handle's (see _follow)
            await sibling.interrupt(reason)
        if self._task is not None and not self._task.done():
            self._task.cancel()
            # Stopped either way: by this cancellation, or by the claim it found lost as it ended (that error is the
            # loop's own, for whoever waits on it); the turn is then ended below, under a claim of this call.
            with contextlib.suppress(asyncio.CancelledError, OwnershipLost):
                await self._task
        await stop_calls(self._harness, thread_id=self.thread_id)  # a call gone on past its timeout stops too
        await self.log.writer.idle()
        self.log.sync()
        turn = self.log.state.active_turn()
        if turn is not None:
            # Another live process runs the turn: it is not ended under that process, which would go on with its
            # calls and find its turn gone (as a resolution is refused until that process stopped).
            claim = self.log.live_claim(self._harness.owner)
            if claim is not None:
                raise TurnOwned(f"turn {turn.turn_id} of thread {self.thread_id} is run by {claim.lease.owner} "
                                f"(epoch {claim.lease.epoch}; {claim.held_for()}): interrupt it in that process, "
                                "or stop that process (its drain ends the turn's calls; the turn then waits here)",
                                thread_id=self.thread_id, turn_id=turn.turn_id)
            fence = await self._claim()
            try:
                self.log.end_running_turn(reason, fence)
                self.log.checkpoint()
            finally:
                self._release()
        return self.state()

    @property
    def _starting(self) -> bool:
        """True while send() waits for its ``turn.started`` to be committed."""
        return self._start_settled is not None and not self._start_settled.is_set()

    def _start(self) -> None:
        sibling = self._harness.working_on(self)
        # Set at once, before the task's first step: no handle may pick a follower to follow (no cycle).
        self.following = sibling is not None
        loop = self._run() if sibling is None else self._follow(sibling)
        # A CallerTask: the end of the event loop (asyncio.run returning) waits for a call in flight (decision 0036).
        self._task = CallerTask(loop, name=f"jixu-thread-{self.thread_id}")
        self._task.add_done_callback(self._never_ran)

    async def _follow(self, first: Thread) -> None:
        """Let another handle of this thread in this harness finish its loop (or its turn's start, or its
        durable run), then run this one: two loops of one owner on one turn would take the claim from each other
        mid-call. Errors of the other loop are its own caller's."""
        sibling: Thread | None = first
        while sibling is not None:
            task = sibling._task
            if task is not None and not task.done():
                try:
                    await asyncio.shield(task)
                except asyncio.CancelledError:
                    if not task.done():
                        self.following = False
                        raise  # this loop was cancelled, not the other one
                except Exception:  # reported to whoever waits on the other handle
                    pass
            elif sibling.busy:
                await asyncio.sleep(0.01)  # a turn starting or a durable run: no task to wait on
            sibling = self._harness.working_on(self)
        self.following = False  # at once: a handle that follows now follows this one
        await self._run()

    def _never_ran(self, task: asyncio.Task[None]) -> None:
        """A loop cancelled before its first step (its event loop ended right after ``send``) never ran its
        ``finally``: give back the claim ``send`` took, so whoever continues the turn need not wait it out."""
        if task.cancelled() and self._task is task and not self._starting:
            self._release()

    async def _run(self) -> None:
        log = self.log
        await log.writer.idle()  # a turn.started still waiting for its shared commit (see send)
        log.sync()
        log.establish()  # opening to act: nothing runs on a history that does not verify (decide() stops it)
        fence = await self._claim()
        session: Session | None = None
        me = asyncio.current_task()
        try:
            async with contextlib.AsyncExitStack() as stack:
                if fence is not None:
                    # The heartbeat renews the claim, and counts this loop as a running user of the commits.
                    session = await stack.enter_async_context(Session(log.store, fence, self._harness.lease_ttl,
                                                                      release_at_end=False))
                else:
                    stack.enter_context(Commits.of(log.store).user())
                if fence is not None:
                    await self._revise()  # the rest of the turn runs under this harness's definition
                turn = log.state.active_turn()
                try:
                    with tracing.turn(agent=self._agent.name, thread_id=self.thread_id,
                                      turn_id=None if turn is None else turn.turn_id,
                                      attributes={"jixu.owner": self._harness.owner}):
                        await drive(log.writer, self._next_action, self._act, what=f"thread {self.thread_id}",
                                    thread_id=self.thread_id)
                except BaseException:
                    # A receipt staged just before an exception (a cancelled call's, say) is still a fact: commit
                    # it (a fenced-out owner gets FencingError here, the receipt kept in it).
                    log.flush()
                    raise
        except FencingError as error:
            raise await self._lost(error) from error
        except asyncio.CancelledError:
            # Cancelled by the heartbeat that found the claim lost, with nothing staged to commit (a call in
            # flight, a commit awaited): the turn stopped for the same reason as above, and says so.
            found = session.cancelled_by_loss(me) if session is not None else None
            if found is not None:
                raise await self._lost(found) from found
            raise
        finally:
            self._release()

    async def _lost(self, cause: FencingError, what: str = "the turn", lost_fence: Fence | None = None,
                    **details: Any) -> OwnershipLost:
        """What the loop (or a durable run, ``what``) raises when ``cause`` shows the turn's claim lost; it keeps
        the receipts that could not be recorded, in the error and for this process's next claim of the turn
        (:meth:`_due_receipts`). ``lost_fence``: the lost claim's fence, when it was given back already."""
        lost = OwnershipLost(f"thread {self.thread_id}: this process no longer owns {what} ({cause.message}); "
                             "it stopped without writing anything more", thread_id=self.thread_id, **details)
        writer, fence = self.log.writer, lost_fence or self._fence
        try:
            if writer.busy:  # a receipt's commit still queued is refused in a moment (the same lost fence): keep it
                with contextlib.suppress(TimeoutError):  # a cancellation (an interrupt, a drain) goes on as it came
                    await asyncio.wait_for(writer.idle(), self._harness.lease_ttl)
        finally:  # held even when that cancellation cut the wait short
            refused = [event for refused_by, event in writer.fenced_out if refused_by == fence]
            writer.fenced_out.clear()
            receipts = {event.id: event for event in (*unrecorded_receipts(cause), *refused)}
            if receipts and fence is not None:
                held = self._harness.held_receipts
                if len(held) >= HELD_RECEIPTS:
                    held.pop(next(iter(held)))
                held[self.thread_id] = (fence, tuple(receipts.values()))
        if receipts:
            lost.unrecorded_receipts = tuple(receipts.values())  # type: ignore[attr-defined]
            lost.details["unrecorded_receipts"] = list(receipts)
        return lost

    def _receipts_held(self) -> bool:
        """Whether this process holds receipts of the turn's lost claim that its next claim would record: the
        claim's lease is still at that claim's epoch, this owner's (nobody claimed the turn since)."""
        held = self._harness.held_receipts.get(self.thread_id)
        if held is None:
            return False
        lease = self.log.store.get_lease(held[0].key)
        return lease is not None and (lease.owner, lease.epoch) == (held[0].owner, held[0].epoch)

    def _due_receipts(self, fence: Fence) -> list[PreparedEvent]:
        """The receipts this process observed under the turn's previous claim, lost before they could be recorded
        (the store stalled past the lease, say), that the claim ``fence`` records with its ``turn.claimed``: only
        when nobody claimed the turn in between (``fence`` the very next epoch, this owner's), and only those whose
        effect still waits for exactly that attempt's receipt, unresolved (``dispatched_without_receipt``);
        otherwise none, and the effect stays what the resolver says (decision 0070). Asked again after a
        conflict, on the events that came meanwhile. An audit: a store stalled past the lease turned every call in
        flight into an operator's case, though the worker that claimed the turn again held each call's result."""
        held = self._harness.held_receipts.get(self.thread_id)
        if held is None:
            return []
        previous, receipts = held
        if (fence.key, fence.owner, fence.epoch) != (previous.key, previous.owner, previous.epoch + 1):
            return []
        decisions = self.log.open_analysis().decisions
        due = []
        for receipt in receipts:
            effect_id, attempt = effect_and_attempt(receipt)
            decision = decisions.get(effect_id) if effect_id is not None else None
            if decision is not None and decision.reason == "dispatched_without_receipt" \
                    and decision.resolution is None and attempt == decision.attempts:
                due.append(receipt)
        return due

    async def _next_action(self) -> Action | None:
        """The next thing to do (see :func:`~jixu.threads.decide.decide`), or ``None`` when the loop must stop.

        Before it stops (or waits out a pause) the loop commits a staged receipt; if other writers' events
        arrived with it, it decides again on them.
        """
        agent, harness, log = self._agent, self._harness, self.log
        while True:
            self._pending = []  # an intent never committed (its call never started) is simply not there
            log.writer.heed_recorded_break(fresh=False)  # every step: a break another process recorded stops it
            analysis = log.open_analysis()
            action = decide(log.state, analysis, max_steps=agent.max_steps, max_attempts=harness.max_attempts,
                            context_budget=agent.context_budget)
            if isinstance(action, Stop) or self._draining:
                head = log.state.seq
                log.flush()  # nothing staged may wait out a pause, or the loop's end, uncommitted
                if log.state.seq != head:
                    continue  # the commit brought other writers' events: decide on them
            if isinstance(action, Stop) and action.status == "paused" and not self._draining and self._automatic():
                return action
            if isinstance(action, Stop) or self._draining:
                log.checkpoint()
                return None
            self._analysis = analysis
            return action

    async def _act(self, action: Action) -> object:
        """Carry out one decision (each records at least one event, or ends the loop: ``LOOP_STOPPED``)."""
        log = self.log
        if isinstance(action, Stop):  # an automatic pause (see _next_action)
            if not await self._resume_automatically():
                return LOOP_STOPPED
        elif isinstance(action, Dispatch):
            analysis = self._analysis
            assert analysis is not None
            if len(action.effect_ids) == 1:
                [effect_id] = action.effect_ids
                await self._alone(self._dispatch(effect_id, analysis.decisions[effect_id]))
            else:
                await _together(self._dispatch(eid, analysis.decisions[eid]) for eid in action.effect_ids)
        elif isinstance(action, RequestModel):
            await self._request_model(action.turn_id)
        elif isinstance(action, RequestCompaction):
            await self._request_compaction(action.turn_id, action.upto)
        elif isinstance(action, RequestTools):
            await self._request_tools(action.turn_id, action.calls)
        elif isinstance(action, Probe):
            await self._probe(action)
        elif isinstance(action, ResolveByProbe):
            await self._resolve_by_probe(action)
        elif isinstance(action, CompleteTurn):
            ended: dict[str, Any] = {"turn_id": action.turn_id, "outcome": "completed", "reply": action.reply}
            if action.reply_artifact is not None:
                ended["reply_artifact"] = action.reply_artifact
            await self._commit([NewEvent("turn.ended", ended, log.meta())])
        elif isinstance(action, PauseTurn):
            await self._pause(action)
        elif isinstance(action, FailTurn):
            await self._commit([NewEvent("turn.ended", {
                "turn_id": action.turn_id, "outcome": "failed", "error": action.error}, log.meta())])
        elif isinstance(action, InterruptTurn):
            await self._commit([interrupted_end(action.turn_id, action.request, log.meta())])
        return None

    # --- agent revisions ------------------------------------------------------------------

    async def _revise(self, *, fenced: bool = True) -> None:
        """Record ``agent.revised`` when this harness's agent is another definition than the thread's latest
        revision (see :mod:`jixu.threads.revisions`; refused with IncompatibleAgent when it would alter an
        effect still open). ``fenced``: appended with the loop's claim on the active turn."""
        log = self.log
        data = revision(log.state, log.open_analysis(), self._agent, thread_id=self.thread_id)
        if data is None:
            return
        event = NewEvent("agent.revised", {**data, "actor": self._harness.actor}, log.meta())
        if fenced:
            await self._commit([event])
        else:
            await log.append_async([event], None)

    # --- pauses -------------------------------------------------------------------------

    async def _pause(self, action: PauseTurn) -> None:
        """Record a pause; an automatic one carries its delay and when it ends by the store's clock."""
        harness = self._harness
        turn = self.log.state.active_turn()
        retries = turn.auto_retries if turn is not None else 0
        delay = pause_delay(action.retry_after, retries, backoff=harness.retry_backoff,
                            cap=harness.retry_backoff_cap) if action.automatic else None
        now = self.log.store.now()
        await self._commit([NewEvent("turn.paused", {
            "turn_id": action.turn_id, "reason": action.reason, "automatic": delay is not None,
            "retry_after": action.retry_after, "delay": delay,
            "resume_at": None if delay is None else now + delay, "model_effect_id": action.effect_id,
            "automatic_retries_used": retries}, self.log.meta())])

    def _automatic(self) -> bool:
        """Whether the active turn's pause ends by itself (an operator resumes any other)."""
        turn = self.log.state.active_turn()
        return turn is not None and turn.pause is not None and bool(turn.pause.get("automatic"))

    async def _resume_automatically(self) -> bool:
        """Wait out the automatic pause (its ``resume_at`` on the store's clock) and record the resume; an explicit
        resume meanwhile (:meth:`resume`) ends the wait, and then it is the only resume recorded. False when a
        drain stopped the wait (nothing recorded: the loop ends)."""
        log = self.log
        turn = log.state.active_turn()
        assert turn is not None and turn.pause is not None
        resume_at = turn.pause.get("resume_at")
        deadline = float(resume_at) if isinstance(resume_at, int | float) else float("-inf")
        self._resumed.clear()
        while True:
            # Woken by resume() here, or looking every PAUSE_LOOK_EVERY seconds for a resume recorded elsewhere
            # (the HTTP API, the CLI, another process).
            remaining = deadline - log.store.now()
            if remaining > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._resumed.wait(), min(remaining, PAUSE_LOOK_EVERY))
            if self._draining:
                # Nothing is in flight while a pause is waited out: a drain stops the loop at once (the pause is
                # recorded; whoever continues the turn waits out the rest), as its timeout would have.
                return False
            await log.writer.idle()
            log.sync()
            current = log.state.active_turn()
            if current is None or current.turn_id != turn.turn_id or current.pause is None:
                return True  # resumed (or ended) by someone meanwhile: nothing to record
            if log.store.now() >= deadline:
                break
        await self._commit([NewEvent("turn.resumed", {"turn_id": turn.turn_id, "reason": "automatic"},
                                     log.meta())])
        return True

    @on_home_loop
    async def resume(self, *, actor: str = "operator", note: str | None = None) -> State:
        """Resume a turn paused for quota, authentication or exhausted automatic retries; it continues."""
        await self.log.writer.idle()
        self.log.resume_turn(actor=actor, note=note)
        self._resumed.set()  # a loop waiting out an automatic pause goes on now
        self._continue()
        return self.state()

    # --- turn ownership -----------------------------------------------------------------

    async def _commit(self, events: list[NewEvent]) -> list[Event]:
        """Append for the agent loop (through the kernel's writer and the loop's shared commits).

        A retry-safe effect's intent waits in ``_pending`` and is committed
        together with whatever is appended next: its dispatch marker (or a
        rejection before dispatch). Both are durable before the call leaves the
        process; a crash before that commit leaves no trace (nothing was sent),
        one after it leaves the effect unknown, and unknown retry-safe effects
        are retried under the same identity (decision 0010).

        Every few appends the loop yields to the event loop once (nothing is
        staged at that point): with a model and tools that never wait, and
        commits made at once, the agent loop would otherwise hold the event
        loop for the whole turn, starving the lease heartbeat and every other
        task on it.
        """
        batch, self._pending = [*self._pending, *events], []
        stored = await self.log.append_async(batch, self._fence, user=True)
        self._appends += 1
        if self._appends % YIELD_EVERY_APPENDS == 0:
            await asyncio.sleep(0)
        return stored

    def claim_problem(self) -> str | None:
        """Why this process cannot run the active turn now (another live owner, an unrecovered expired
        claim, a legacy turn), or ``None`` if it can. Reads the lease; writes nothing."""
        turn = self.log.state.active_turn()
        if turn is None:
            return None
        if holds(self.log.store, self._fence):
            return None
        lease = self.log.store.get_lease(self.log.turn_key)
        if lease is None:
            if turn.owner is None and not turn.queued:
                return (f"turn {turn.turn_id} was recorded before turn ownership existed; recover it with "
                        "legacy_confirmed_stopped once you know its process stopped")
            return None
        if lease.released or own_lease(lease, self._harness.owner, self.log.holder_process):
            return None
        if dead_holder(lease, self.log.holder_process) is not None:
            return None  # its process is proven gone: taken over at once, the proof recorded
        now = self.log.store.now()
        if lease.expires_at > now:
            return (f"turn {turn.turn_id} is owned by {lease.owner} (epoch {lease.epoch}) for another "
                    f"{lease.expires_at - now:.1f}s")
        if not self.log.claim_recorded(lease):
            return None  # killed between taking the lease and recording its claim: it did nothing under it
        if self._harness.takeover == "safe" and self._safe_to_take_over():
            return None
        live = self.log.live_claim(self._harness.owner)
        if live is not None:  # stopped (SIGSTOP, a paused VM) or left processes running: recovery is refused too
            return f"turn {turn.turn_id}'s owner {lease.owner} (epoch {lease.epoch}) may still act: {live.held_for()}"
        return (f"turn {turn.turn_id}'s owner {lease.owner} (epoch {lease.epoch}) stopped renewing its lease "
                f"{now - lease.expires_at:.1f}s ago; recover the turn explicitly: jixu turns recover STORE "
                f"{self.thread_id} {turn.turn_id} --request-id HEX --expected-epoch {lease.epoch}")

    def _safe_to_take_over(self) -> bool:
        """True when no open effect's outcome is in doubt (the resolver decides each effect's state)."""
        analysis = self.log.open_analysis()
        if analysis.has_corruption:
            return False
        return all(d.state in ("not_dispatched", "parked") or (d.state == "unknown" and d.retry_safe)
                   for d in analysis.decisions.values())

    async def _claim(self) -> Fence | None:
        """Own the active turn before running it; returns the fence, or None when there is nothing to run."""
        log, harness = self.log, self._harness
        turn = log.state.active_turn()
        if turn is None:
            return None
        log.establish()
        log.writer.heed_recorded_break(fresh=False)  # nothing is claimed on a history found broken elsewhere
        if log.corruption() is not None:
            return None  # nothing is claimed on a history that does not hold (decide() stops the loop)
        analysis = log.open_analysis()
        if self._receipts_held():
            pass  # claimed to record them first: the calls they answer may then be settled
        elif turn.status == "needs_reconciliation":
            if analysis.requires_resolution or analysis.waiting_on_parked or analysis.has_corruption:
                return None  # decide() reports what must be reconciled first
        elif isinstance(decide(log.state, analysis, max_steps=self._agent.max_steps,
                               max_attempts=harness.max_attempts, context_budget=self._agent.context_budget),
                        Stop):
            return None
        fence = await self._claim_turn()
        # None: someone wrote meanwhile and the turn is no longer the one claimed (it may even have ended): look again.
        return fence if fence is not None else await self._claim()

    async def _claim_turn(self) -> Fence | None:
        """Take the claim on the active turn (this process may already hold it): the fence, with ``turn.claimed``
        recorded; ``None`` when the turn changed meanwhile; :class:`~jixu.errors.TurnOwned` while another process
        may run it."""
        log, harness = self.log, self._harness
        turn = log.state.active_turn()
        assert turn is not None
        problem = self.claim_problem()
        if problem is not None:
            raise TurnOwned(problem, thread_id=self.thread_id, turn_id=turn.turn_id)
        if holds(log.store, self._fence):
            return self._fence

        def claimed(c: Claim) -> list[NewEvent | PreparedEvent]:
            return [NewEvent("turn.claimed", {"turn_id": turn.turn_id, **c.record()}, log.meta()),
                    *self._due_receipts(c.fence)]  # what the lost claim before it observed (decision 0070)

        try:
            claim = await claim_stream(log.writer, log.turn_key, harness.owner, harness.lease_ttl, claimed,
                                       still_wanted=lambda: log.state.active_turn() is turn,
                                       holder_process=log.holder_process)
        except ReceiptConflict:
            # An operator settled a held receipt's call meanwhile: the record stands (the claim was given back).
            harness.held_receipts.pop(self.thread_id, None)
            return None
        except (FencingError, LeaseHeld) as error:
            raise TurnOwned(f"turn {turn.turn_id} changed hands while claiming it: {error.message}",
                            thread_id=self.thread_id, turn_id=turn.turn_id) from error
        harness.held_receipts.pop(self.thread_id, None)  # recorded with the claim, or due no more
        if claim is None:
            return None
        self._fence = claim.fence
        claim_taken_again(claim.fence.key)  # a give-back waiting for earlier calls would take it from this loop
        return claim.fence

    def _release(self) -> None:
        """Give the turn's claim back, once no call of this thread runs in this process any more.

        A call in a worker thread cannot be stopped (decision 0058): while one still runs, the claim stays held,
        lapsed if the loop lost it but live (its holder runs, see :func:`~jixu.kernel.ownership.live_claim`), so
        no operator settles the call and no other process repeats it meanwhile; it is given back where the last
        of those calls ends (decision 0065). Given back at once, the claim was nobody's: an operator's
        ``not_occurred`` was accepted while the call went on, and it acted after (an audit: a worker stalled
        past its lease).
        """
        fence, self._fence = self._fence, None
        if fence is None:
            return
        give_back = partial(release_later, self.log.store, fence)
        if not hold_claim_while_calls_run(fence.key, self.log.state.open_events, give_back):
            give_back()

    async def drain(self, timeout: float) -> None:
        """Stop starting new work, let calls in flight finish for up to ``timeout`` seconds, then cancel.

        A turn stopped this way stays active: its lease is released, so another
        process can continue it; calls cancelled mid-flight are recorded as
        having an unknown outcome.
        """
        self._draining = True
        self._resumed.set()  # a loop waiting out an automatic pause looks now (and stops: see _resume_automatically)
        ended, steps = self._steps_ended, self._steps_task
        if ended is not None:  # a durable run: its next step is refused (it stops), a step in flight is waited for
            await self._cut_off(ended, steps, timeout)
        settled = self._start_settled
        if self._starting and settled is not None:  # a send() committing its turn's start: it stops after that
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(settled.wait(), timeout)
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, JixuError):
                    await self._task
            except (asyncio.CancelledError, JixuError):
                pass
        await stop_calls(self._harness, thread_id=self.thread_id)  # calls gone on past their timeout stop too

    @staticmethod
    async def _cut_off(ended: asyncio.Event, task: asyncio.Task[Any] | None, timeout: float) -> None:
        """Wait up to ``timeout`` for a durable run to stop, then cancel its block and wait for it to end: its
        steps record their calls cut off and the run gives its lease back, but only once no call of it still
        runs in a worker thread here (a thread cannot be stopped; decision 0061)."""
        if task is asyncio.current_task():
            return  # shut down from the run's own block: the run stops when the block ends
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ended.wait(), timeout)
            return
        if task is not None:
            task.cancel()
        await ended.wait()

    def steps_began(self) -> None:
        """A durable run's block (the current task) carries this thread's turn out from now on."""
        self._steps_task = asyncio.current_task()
        self._steps_ended = asyncio.Event()

    def steps_stopped(self) -> None:
        """The durable run stopped (ended, or left unfinished)."""
        ended = self._steps_ended
        self._steps_task = self._steps_ended = None
        if ended is not None:
            ended.set()

    def refuse_if_draining(self) -> None:
        """:class:`~jixu.errors.ThreadBusy` once the harness shuts down: a durable run starts no new step."""
        if self._draining:
            raise ThreadBusy("the harness is shutting down: the durable run starts no new step; run the code again "
                             f"with thread id {self.thread_id} to continue it", thread_id=self.thread_id)

    # --- effects ------------------------------------------------------------------------

    async def _request_model(self, turn_id: str) -> None:
        """Record a model call's intent and make the call: one commit for intent and dispatch marker."""
        log = self.log
        effect_id = new_id()
        args = {"turn_id": turn_id, "context_seq": log.state.seq, "messages": len(log.state.messages)}
        intent = {"effect_id": effect_id, "name": self._agent.model.name, "args": args,
                  "args_hash": content_hash(args), "semantics": "read_only", "idempotency_key": f"jixu:{effect_id}",
                  "requires_approval": False, "turn_id": turn_id}
        self._pending = [NewEvent("model.requested", intent, log.meta())]
        await self._alone(self._call_model(effect_id, intent, 1))

    async def _request_compaction(self, turn_id: str, upto: int) -> None:
        """Record the intent to summarize the first ``upto`` messages (citing their events) and ask for it."""
        log = self.log
        effect_id = new_id()
        args = {"turn_id": turn_id, "upto_message": upto, "covers": list(log.state.message_events[:upto])}
        intent = {"effect_id": effect_id, "name": self._agent.model.name, "args": args,
                  "args_hash": content_hash(args), "semantics": "read_only", "idempotency_key": f"jixu:{effect_id}",
                  "requires_approval": False, "turn_id": turn_id}
        self._pending = [NewEvent("compaction.requested", intent, log.meta())]
        await self._alone(self._call_compaction(effect_id, intent, 1))

    async def _request_tools(self, turn_id: str, calls: Sequence[dict[str, Any]]) -> None:
        """Record the intents of the model's tool calls. When every call is retry-safe (a declared read_only or
        idempotent tool, no approval), make them at once: one call alone commits its intent with its dispatch
        marker; several commit every intent, marker and rejection in one append first, then run side by side.
        Otherwise the intents are committed on their own (an unsafe call's intent is durable before its marker).
        """
        log = self.log
        batch = []
        intents: list[dict[str, Any]] = []
        for call in calls:
            effect_id = new_id()
            declared = self._agent.tool(str(call.get("name")))
            args = call.get("args") if isinstance(call.get("args"), dict) else {"__invalid__": call.get("args")}
            needs_approval = bool(declared and declared.requires_approval)
            intent = {
                "effect_id": effect_id, "name": str(call.get("name")), "args": args,
                "args_hash": content_hash(args), "semantics": declared.semantics if declared else "unsafe",
                "idempotency_key": f"jixu:{effect_id}", "requires_approval": needs_approval,
                "turn_id": turn_id, "call_id": str(call.get("id")),
            }
            if declared is not None and declared.probe is not None:
                intent["probe"] = True  # recovery asks the tool's probe before an operator (decide.py)
            intents.append(intent)
            batch.append(NewEvent("tool.requested", intent, log.meta()))
            if needs_approval:
                batch.append(NewEvent("tool.parked", {"effect_id": effect_id, "reason": "requires_approval"},
                                      log.meta()))
        if not intents or not all(i["semantics"] in ("read_only", "idempotent") and not i["requires_approval"]
                                  for i in intents):
            await self._commit(batch)
            return
        if len(intents) == 1:
            self._pending = batch
            await self._alone(self._call_tool(str(intents[0]["effect_id"]), intents[0], 1))
            return
        # Several retry-safe calls: every intent, every marker (or rejection before dispatch) in one append, so
        # no call's marker can be recorded without its intent, then the calls run side by side.
        ready: list[tuple[dict[str, Any], Tool, dict[str, Any]]] = []
        for intent in intents:
            checked = self._checked_call(intent)
            effect_id = str(intent["effect_id"])
            if isinstance(checked, Outcome):
                batch.append(checked.receipt("tool", effect_id, None, log.meta()))
            else:
                batch.append(marker("tool", effect_id, 1, intent, log.meta()))
                ready.append((intent, *checked))
        await self._commit(batch)
        await _together(self._call_tool(str(intent["effect_id"]), intent, 1, checked=(declared, args))
                        for intent, declared, args in ready)

    async def _alone(self, call: Awaitable[None]) -> None:
        """Run one call with no other in flight: its receipt may be staged, not committed on its own.

        The loop then decides the next step from the state with the receipt
        in it and commits the receipt together with that step's first events
        (decision 0011): two commits per agent step instead of four. Only when
        that commit is made at once (this loop is the only running user of the
        loop's commits, see :meth:`ThreadLog.stage`): otherwise the receipt is
        committed now, shared with the other threads' appends.
        """
        self._stage_receipts = True
        try:
            await call
        finally:
            self._stage_receipts = False

    async def _record_receipt(self, event: NewEvent) -> None:
        """Stage a call's receipt (see :meth:`_alone`) or append it now."""
        if self._stage_receipts and not self._pending and self.log.can_stage():
            self.log.stage([event], self._fence)
        else:
            await self._commit([event])

    async def _record(self, kind: str, effect_id: str, attempt: int | None, outcome: Outcome) -> None:
        await self._record_receipt(outcome.receipt(kind, effect_id, attempt, self.log.meta()))

    async def _dispatch(self, effect_id: str, decision: EffectDecision) -> None:
        intent = self.log.state.intent(effect_id)
        if intent is None:  # pragma: no cover - the resolver only reports effects with an intent as dispatchable
            return
        attempt = decision.attempts + 1
        if decision.kind == "model":
            await self._call_model(effect_id, intent, attempt)
        elif decision.kind == "tool":
            await self._call_tool(effect_id, intent, attempt)
        elif decision.kind == "compaction":
            await self._call_compaction(effect_id, intent, attempt)
        elif decision.kind == "probe":
            await self._call_probe(effect_id, intent, attempt)
        else:
            raise JixuError(f"thread {self.thread_id}: effect {effect_id} has kind {decision.kind!r}, which "
                            "threads do not dispatch", effect_id=effect_id)

    async def _perform(self, kind: str, effect_id: str, intent: dict[str, Any], attempt: int,
                       call: Callable[[], Awaitable[Outcome]], classify: Callable[[Exception], Outcome], *,
                       dispatched: bool = False, with_marker: Sequence[NewEvent] = ()) -> None:
        """One call through the kernel: its marker durable first (unless ``dispatched``), then one receipt.

        ``with_marker``: events committed in the marker's append, before it (a durable step's retry-safe intent:
        steps of one run run at once, so they cannot share the loop's ``_pending``)."""
        log = self.log
        open_spans: list[tracing.EffectSpan] = []  # the call's span while it is in flight

        def state() -> str | None:  # the resolver's state of the effect now (asked by an observer only)
            decision = log.open_analysis().decisions.get(effect_id)
            if decision is None and effect_id in log.state.settled:
                decision = log.state.settled[effect_id]
            return None if decision is None else decision.state

        async def dispatch() -> None:
            if not dispatched:
                await self._commit([*with_marker, marker(kind, effect_id, attempt, intent, log.meta())])
            if tracing.tracer().enabled:  # nothing is built for the no-op tracer: this is every call's path
                open_spans.append(tracing.start_effect(kind, effect_id=effect_id, attempt=attempt, intent=intent,
                                                       attributes={"jixu.thread.id": self.thread_id,
                                                                   "jixu.turn.id": intent.get("turn_id"),
                                                                   "jixu.model": self._agent.model.name}))

        async def record(outcome: Outcome) -> None:
            await self._record(kind, effect_id, attempt, outcome)
            while open_spans:
                open_spans.pop().finish(outcome, state)

        self._in_flight.add(effect_id)
        try:
            await perform(dispatch=dispatch, call=call, classify=classify, record=record, interrupted=INTERRUPTED,
                          effect_id=effect_id)
        finally:
            self._in_flight.discard(effect_id)
            while open_spans:  # left without a receipt (KeyboardInterrupt, a failed append): unknown
                open_spans.pop().finish(None, state)

    async def _call_model(self, effect_id: str, intent: dict[str, Any], attempt: int) -> None:
        agent, log = self._agent, self.log
        request = ModelRequest(
            instructions=agent.instructions,
            # drivers read, never mutate, the conversation
            messages=self._model_messages(log.state.messages, log.state.message_events),
            tools=self._tool_specs,
            effect_id=effect_id,
            idempotency_key=str(intent["idempotency_key"]),
            attempt=attempt,
            thread_id=self.thread_id,
            turn_id=str(intent.get("turn_id")),
        )

        async def call() -> Outcome:
            response = await agent.model.complete(request)
            return Outcome.completed({"result": self._model_result(response.to_result(effect_id))})

        await self._perform("model", effect_id, intent, attempt, call, _model_failure)

    async def _call_compaction(self, effect_id: str, intent: dict[str, Any], attempt: int) -> None:
        """Ask the model for a summary of the covered messages; its receipt carries the summary.

        The request is the covered messages plus a final user message asking
        for a faithful summary citing the covered event ids. It offers the
        agent's tools (a provider may refuse a conversation holding tool calls
        without tool definitions) and says not to call them; an answer with
        tool calls or no text is a failed compaction.
        """
        agent, log = self._agent, self.log
        args = intent.get("args") or {}
        upto, covers = args.get("upto_message"), args.get("covers")
        key = str(intent["idempotency_key"])
        if not (isinstance(upto, int) and isinstance(covers, list) and log.state.message_events[:upto] == covers):
            # Defensive: the messages before the turn changed since the intent. Nothing is sent.
            stale = Outcome.failed({"type": "stale_context", "message": "the conversation no longer starts with "
                                                                        "the messages this compaction covers"},
                                   indeterminate=False)
            if attempt == 1:
                await self._record("compaction", effect_id, None, stale)
            else:  # it was dispatched before: this attempt ends at once, with a determinate receipt
                await self._commit([marker("compaction", effect_id, attempt, intent, log.meta()),
                                    stale.receipt("compaction", effect_id, attempt, log.meta())])
            return
        request = ModelRequest(
            instructions=agent.instructions,
            messages=(*self._model_messages(log.state.messages[:upto]),
                      compaction_prompt([str(c) for c in covers])),
            tools=self._tool_specs,
            effect_id=effect_id,
            idempotency_key=key,
            attempt=attempt,
            thread_id=self.thread_id,
            turn_id=str(intent.get("turn_id")),
            purpose="compaction",
        )

        async def call() -> Outcome:
            response = await agent.model.complete(request)
            problem = summary_problem(response.text, response.tool_calls)
            usage = response.usage.to_dict()
            if problem is not None:
                return Outcome.failed({"type": "invalid_summary", "message": problem, "usage": usage},
                                      indeterminate=False)
            return Outcome.completed({"result": {"summary": response.text, "covers": covers, "upto_message": upto,
                                                 "usage": usage, "model": response.model}})

        await self._perform("compaction", effect_id, intent, attempt, call, _compaction_failure)

    async def _probe(self, action: Probe) -> None:
        """Record a probe effect per call asked about, and run the probes.

        A probe is read-only: its intent is committed with its dispatch
        marker (decision 0010), so a process killed while it runs leaves it
        ``unknown`` and it simply runs again, under the same effect id, on the
        next open. Several probes commit every intent and marker in one
        append, then run side by side.
        """
        log, analysis = self.log, self._analysis
        assert analysis is not None
        batch: list[NewEvent] = []
        intents: list[dict[str, Any]] = []
        for target in action.effect_ids:
            decision = analysis.decisions[target]
            effect_id = new_id()
            args = {"effect_id": target, "attempt": decision.attempts}
            intent = {"effect_id": effect_id, "name": str(decision.name), "args": args,
                      "args_hash": content_hash(args), "semantics": "read_only",
                      "idempotency_key": f"jixu:{effect_id}", "requires_approval": False, "turn_id": action.turn_id}
            intents.append(intent)
            batch.append(NewEvent("probe.requested", intent, log.meta()))
        if len(intents) == 1:
            self._pending = batch
            await self._alone(self._call_probe(str(intents[0]["effect_id"]), intents[0], 1))
            return
        batch.extend(marker("probe", str(intent["effect_id"]), 1, intent, log.meta()) for intent in intents)
        await self._commit(batch)
        await _together(self._call_probe(str(intent["effect_id"]), intent, 1, dispatched=True) for intent in intents)

    async def _call_probe(self, effect_id: str, intent: dict[str, Any], attempt: int, *,
                          dispatched: bool = False) -> None:
        """Ask a tool's probe about one call; the receipt records its answer.

        Whatever the probe returns is recorded as an answer (a bad value is a
        "don't know" naming why); a probe that raises or runs past its
        ``probe_timeout`` gets a determinate failure (it changed nothing),
        which the projection reads as "don't know". Only a cancellation
        leaves the probe unknown, to run again.
        """
        log = self.log
        args = intent.get("args") or {}
        target = str(args.get("effect_id"))
        declared = self._agent.tool(str(intent.get("name")))
        asked = log.state.intent(target)

        async def call() -> Outcome:
            if declared is None or declared.probe is None:
                return Outcome.failed({"type": "no_probe", "message": f"tool {intent.get('name')!r} declares no "
                                       "probe"}, indeterminate=False)
            if asked is None:
                return Outcome.failed({"type": "settled", "message": f"call {target} is no longer open"},
                                      indeterminate=False)
            try:
                checked = declared.validate_args(asked.get("args"))
            except JixuError as error:
                return Outcome.failed({"type": "invalid_arguments", **error.to_dict()}, indeterminate=False)
            attempt_asked = args.get("attempt")
            query = ProbeQuery(effect_id=target, idempotency_key=str(asked.get("idempotency_key")), args=checked,
                               tool=declared.name, attempt=attempt_asked if isinstance(attempt_asked, int) else 1,
                               thread_id=self.thread_id, turn_id=str(asked.get("turn_id")))
            return Outcome.completed({"result": await declared.ask_probe(query)})

        def classify(error: Exception) -> Outcome:
            if isinstance(error, TimeoutError) and declared is not None:
                return Outcome.failed({"type": "timeout", "message": f"no answer within {declared.probe_timeout}s"},
                                      indeterminate=False)
            return Outcome.failed(_exception_dict(error), indeterminate=False)  # read-only: nothing happened

        await self._perform("probe", effect_id, intent, attempt, call, classify, dispatched=dispatched)

    async def _resolve_by_probe(self, action: ResolveByProbe) -> None:
        """Record a probe's definite answer as the call's outcome resolution, under an operator's rules."""
        happened = "happened" if action.resolution == "occurred" else "did not happen"
        body = resolution_body(action.effect_id, action.resolution, action.probe_effect_id,
                               actor=f"{PROBE_ACTOR_PREFIX}{action.tool}",
                               note=f"the probe of {action.tool} (effect {action.probe_effect_id}) found that this "
                                    f"call {happened}",
                               evidence=action.evidence, result=action.result)
        event = self.log.resolution_event(body)
        if event is not None:
            await self._commit([event])
            tracing.note("jixu.resolution", {"jixu.thread.id": self.thread_id, "jixu.effect.id": action.effect_id,
                                             "jixu.resolution": action.resolution,
                                             "jixu.actor": f"{PROBE_ACTOR_PREFIX}{action.tool}",
                                             "jixu.probe.effect_id": action.probe_effect_id})

    def _checked_call(self, intent: dict[str, Any]) -> tuple[Tool, dict[str, Any]] | Outcome:
        """The declared tool and validated arguments of a call, or its rejection before dispatch."""
        name = str(intent.get("name"))
        declared = self._agent.tool(name)
        if declared is None:
            return Outcome.failed({"type": "unknown_tool", "message": f"there is no tool named {name!r}; "
                                   f"available: {[t.name for t in self._agent.tools]}"}, indeterminate=False)
        try:
            return declared, declared.validate_args(intent.get("args"))
        except JixuError as error:
            return Outcome.failed({"type": "invalid_arguments", **error.to_dict()}, indeterminate=False)

    async def _call_tool(self, effect_id: str, intent: dict[str, Any], attempt: int, *,
                         checked: tuple[Tool, dict[str, Any]] | None = None, dispatched: bool | None = None,
                         raised: list[BaseException] | None = None, with_marker: Sequence[NewEvent] = (),
                         read_only_fails_last: bool = True) -> None:
        """Call a tool (``checked``: its arguments were validated and, unless ``dispatched`` is False, its marker
        committed already; ``raised`` collects what the call raised; ``with_marker`` as for :meth:`_perform`,
        with ``checked``; ``read_only_fails_last``: a read-only call that raises at its last attempt failed, a
        determinate outcome the model is told; durable steps pass False: their code decides)."""
        found = checked if checked is not None else self._checked_call(intent)
        if isinstance(found, Outcome):
            await self._record("tool", effect_id, None, found)
            return
        declared, args = found
        # An earlier attempt still running in a worker thread here: this one starts (its marker, its timeout) only
        # once that one returned, never beside it (Tool.invoke waits too, for callers of its own).
        await call_ended(effect_id)
        context = ToolContext(effect_id=effect_id, idempotency_key=str(intent["idempotency_key"]), attempt=attempt,
                              thread_id=self.thread_id, turn_id=str(intent.get("turn_id")))

        async def call() -> Outcome:
            # Tool.invoke applies the timeout: past it an unsafe call with a probe goes on, in flight (the probe waits),
            # made by this harness (its stop_calls stops it, another harness's does not).
            owner = CALL_OWNER.set(self._harness)
            try:
                result = await declared.invoke(args, context, timeout=declared.timeout)
            finally:
                CALL_OWNER.reset(owner)
            return Outcome.completed(self._tool_result(result))

        def classify(error: Exception) -> Outcome:
            if raised is not None:
                raised.append(error)
            if isinstance(error, ToolError):
                return Outcome.failed(error.to_dict(), indeterminate=False)
            # A read-only call acted on nothing outside: past its last attempt what it raised is its outcome (the
            # model is told, as of a ToolError), not an unknown for an operator to settle (an audit: a lookup
            # that raised each time stopped its thread "waiting for an operator's resolution").
            last = read_only_fails_last and declared.semantics == "read_only" and attempt >= self._harness.max_attempts
            if isinstance(error, TimeoutError):
                return Outcome.failed({"type": "timeout", "message": f"no answer within {declared.timeout}s"},
                                      indeterminate=not last)
            if isinstance(error, JixuError):
                # The tool ran (its effect may have happened) but returned something unusable, e.g. not JSON:
                # that is no receipt of what it did, so the outcome stays unknown.
                return Outcome.failed(error.to_dict(), indeterminate=not last)
            return Outcome.failed(_exception_dict(error), indeterminate=not last)

        await self._perform("tool", effect_id, intent, attempt, call, classify,
                            dispatched=checked is not None if dispatched is None else dispatched,
                            with_marker=with_marker)

    def _tool_result(self, result: Any) -> dict[str, Any]:
        """A ``tool.completed`` body: the result inline, or a reference to it stored as an artifact.

        A result larger than :data:`INLINE_RESULT_BYTES` is stored once, content-addressed, before its
        receipt (so the reference never points at nothing); the thread's state keeps only the reference.
        """
        data: dict[str, Any] = {}
        ref = None if _small(result) else self._stored_if_large(canonical_text(result, path="result"))
        if ref is not None:
            data["result_artifact"] = ref.to_dict()
        else:
            data["result"] = result
        return data

    def _stored_if_large(self, encoded: str) -> ArtifactRef | None:
        """Store ``encoded`` (canonical JSON) as an artifact when it is over :data:`INLINE_RESULT_BYTES`.

        Returns its reference (``None`` when it stays inline); the text is kept at hand for the next model calls.
        """
        if utf8_size(encoded) <= INLINE_RESULT_BYTES:
            return None
        ref = put_text(self.log.store, encoded, meta=self.log.meta())
        self.log.remember_artifact(ref.sha256, encoded)
        return ref

    def _model_result(self, result: dict[str, Any]) -> dict[str, Any]:
        """A ``model.completed`` result: a text longer than :data:`INLINE_RESULT_BYTES` is stored once as an
        artifact (before its receipt) and the result keeps a short placeholder and ``text_artifact``."""
        text = result.get("text")
        if not isinstance(text, str) or _small(text):
            return result
        ref = self._stored_if_large(canonical_text(text, path="model text"))
        if ref is None:
            return result
        return {**result, "text": f"[model text stored as artifact sha256:{ref.sha256}, {ref.size} bytes]",
                "text_artifact": ref.to_dict()}

    def _model_messages(self, messages: list[JSONObject],
                        sources: list[str] | None = None) -> tuple[JSONObject, ...]:
        """The conversation as a model must see it: results and texts stored as artifacts put back in place."""
        if not self._refers_to_artifacts(messages, sources):
            return tuple(messages)
        resolved = []
        for message in messages:
            ref = message.get("artifact")
            if ref is None:
                resolved.append(message)
                continue
            value = json.loads(self.log.artifact_text(ref))
            content = value if message.get("role") == "assistant" else tool_content(value)
            resolved.append({**{k: v for k, v in message.items() if k != "artifact"}, "content": content})
        return tuple(resolved)

    def _refers_to_artifacts(self, messages: list[JSONObject], sources: list[str] | None = None) -> bool:
        """Whether a message of ``messages`` refers to an artifact.

        The conversation only grows between two model calls, except when a
        compaction splices a summary (no artifact) over its head: the same
        list whose last scanned message is still in place is scanned from
        there on, so a step costs O(new messages), not O(conversation).
        ``sources`` (the state's ``message_events``, one event id per message)
        says which message is in place by the event it came from: a receipt
        taken back and applied again (decision 0019) rebuilds its message as a
        new dict from the same event.
        """
        marks: list[Any] = sources if sources is not None and len(sources) == len(messages) else messages
        scanned = self._artifact_scan
        start, found = 0, False
        if scanned is not None and scanned[0] is messages and 0 < scanned[1] <= len(messages):
            mark = marks[scanned[1] - 1]
            if mark == scanned[2] if type(mark) is str else mark is scanned[2]:
                start, found = scanned[1], scanned[3]
        if not found:
            found = any(map(dict.__contains__, messages[start:], repeat("artifact")))  # at C speed
        self._artifact_scan = (messages, len(messages), marks[-1], found) if messages else None
        return found

    # --- operator decisions -------------------------------------------------------------

    @on_home_loop
    async def resolve_tool_outcome(
        self,
        effect_id: str,
        resolution: str,
        *,
        resolution_id: str | None = None,
        note: str | None = None,
        actor: str = "operator",
        evidence: dict[str, Any] | None = None,
        result: Any = None,
    ) -> State:
        """Record an operator's decision about an effect whose outcome is unknown, then continue.

        ``resolution`` is ``occurred`` (optionally with the ``result`` observed),
        ``not_occurred`` (the model may make a new call, under a new effect id)
        or ``abandoned_unknown``. Only an ``unknown`` effect can be resolved
        (:class:`~jixu.errors.EffectNotUnknown`). Idempotent on
        ``resolution_id``: the same id and body return the state; a different
        body, or a second decision, raises :class:`~jixu.errors.ResolutionConflict`.
        The original events stay untouched; the resolution is a new event.
        """
        await self.log.writer.idle()
        if effect_id in self._in_flight:
            raise ThreadBusy(f"effect {effect_id} is in flight in this process; its receipt settles it",
                             thread_id=self.thread_id, effect_id=effect_id)
        if call_running(effect_id):  # past its timeout, in a worker thread or a coroutine: it can still act
            raise ThreadBusy(f"a call of effect {effect_id} still runs in this process past its timeout; its probe "
                             "settles it once it ended", thread_id=self.thread_id, effect_id=effect_id)
        self.log.resolve(effect_id, resolution, resolution_id=resolution_id, note=note, actor=actor,
                         evidence=evidence, result=result, owner=self._harness.owner)
        self._continue()
        return self.state()

    @on_home_loop
    async def approve(self, effect_id: str, *, actor: str = "operator", note: str | None = None) -> State:
        """Approve a parked call; the thread continues and dispatches it."""
        await self.log.writer.idle()
        self.log.decide_parked(effect_id, "approved", actor=actor, note=note)
        self._continue()
        return self.state()

    @on_home_loop
    async def deny(self, effect_id: str, *, actor: str = "operator", note: str | None = None) -> State:
        """Deny a parked call; the model is told and the thread continues."""
        await self.log.writer.idle()
        self.log.decide_parked(effect_id, "denied", actor=actor, note=note)
        self._continue()
        return self.state()

    def _continue(self) -> None:
        if not self.running and not self.steps_active:  # a durable run's own code continues it
            self._start()

    # --- replay and fork ----------------------------------------------------------------

    @on_home_loop
    async def replay(self, upto: int | str | None = None) -> State:
        """Rebuild the state from events alone, calling no model, tool or other driver.

        ``upto`` is a seq or an event id of this thread (inclusive); the default
        is the whole history. The decisions come from the resolver over the
        events read, not from any cache.
        """
        return self.log.replay(upto)

    @on_home_loop
    async def fork(self, at: str, input: str | None = None) -> Thread:
        """A new thread with this one's state at event ``at``; this thread does not change.

        Effects still open at that event are not inherited (their calls are
        marked as not carried over). With ``input``, the child starts a turn.
        """
        await self.log.writer.idle()
        child = Thread(self._harness, self.log.fork(at, agent_record=self._agent.describe(), input=input))
        if input is not None:
            child.wait_in_background()
        return child


def _small(result: Any) -> bool:
    """True for results certainly under :data:`INLINE_RESULT_BYTES` (so no encoding is needed to know)."""
    return result is None or type(result) in (bool, int, float) or (
        type(result) is str and len(result) * 6 < INLINE_RESULT_BYTES)


def _exception_dict(error: BaseException) -> dict[str, Any]:
    return {"type": "exception", "exception": type(error).__name__, "message": str(error)[:2000]}


def _model_failure(error: Exception) -> Outcome:
    """A model call's receipt for what its driver raised."""
    if isinstance(error, ModelError):
        return Outcome.failed(error.to_dict(), indeterminate=error.indeterminate)
    if isinstance(error, MalformedEvent):
        return Outcome.failed({"type": "invalid_response", "message": error.message}, indeterminate=False)
    # An unexpected driver failure: the request may have been processed, and a retry may succeed.
    return Outcome.failed({**_exception_dict(error), "kind": "transient"}, indeterminate=True)


def _compaction_failure(error: Exception) -> Outcome:
    """A summary request's receipt for what the driver raised."""
    if isinstance(error, ModelError):
        return Outcome.failed(error.to_dict(), indeterminate=error.indeterminate)
    return Outcome.failed({**_exception_dict(error), "kind": "transient"}, indeterminate=True)


async def _together(calls: Iterable[Coroutine[Any, Any, None]]) -> None:
    """Run ``calls`` side by side and return only once every one of them ended, then raise the first error.

    A call that fails never leaves a sibling running behind the loop's back: the loop decides again only
    when no call of this step is still in flight (otherwise it could dispatch one that still runs).
    """
    # CallerTasks, as the loop's own: a loop's shutdown lets each call in flight finish (decision 0036).
    results = await asyncio.gather(*(CallerTask(call) for call in calls), return_exceptions=True)
    for result in results:
        if isinstance(result, FencingError):
            raise result
    for result in results:
        if isinstance(result, BaseException):
            raise result


__all__ = ["State", "Thread", "stream_of"]
