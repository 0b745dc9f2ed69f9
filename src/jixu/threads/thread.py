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
import random
from collections.abc import AsyncIterator, Awaitable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any, cast

from jixu.errors import (
    ConcurrencyError,
    FencingError,
    InvalidInput,
    JixuError,
    LeaseHeld,
    MalformedEvent,
    ModelError,
    OwnershipLost,
    ThreadBusy,
    TurnOwned,
)
from jixu.ledger import Event, Fence, NewEvent, content_hash, new_id
from jixu.ledger.artifacts import ArtifactRef, put_text
from jixu.ledger.batching import CommitBatcher
from jixu.ledger.encoding import JSONObject, canonical_text
from jixu.ledger.event import utf8_size
from jixu.recovery import Analysis, EffectDecision
from jixu.threads.compaction import compaction_prompt, summary_problem
from jixu.threads.decide import (
    CompleteTurn,
    Dispatch,
    FailTurn,
    PauseTurn,
    RequestCompaction,
    RequestModel,
    RequestTools,
    Stop,
    decide,
)
from jixu.threads.log import MAX_INPUT_CHARS, State, ThreadLog, stream_of
from jixu.threads.model import ModelRequest
from jixu.threads.projection import tool_content
from jixu.threads.tools import ToolContext, ToolError

if TYPE_CHECKING:
    from jixu.threads.harness import Harness
    from jixu.threads.streaming import Signal

INLINE_RESULT_BYTES = 64 * 1024
"""A tool result whose canonical JSON is larger than this is stored as an artifact, not in its receipt."""
YIELD_EVERY_APPENDS = 4
"""The agent loop yields to the event loop after this many direct appends (two agent steps)."""

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
        self._starting = False  # send() is waiting for its turn.started to be committed
        self._draining = False
        self._pending: list[NewEvent] = []
        """Intents of retry-safe effects waiting to be committed with their dispatch marker (see _append)."""
        self._stage_receipts = False
        """True while one call runs alone: its receipt is staged and committed with the next step (0011)."""
        self._direct_appends = 0
        """Appends made at once (not batched) by this thread's agent loop: it yields every few (see _commit)."""
        self._tool_specs = tuple(t.spec() for t in self._agent.tools)
        """What every model request offers (the agent's tools never change under a thread)."""
        self._artifact_scan: tuple[list[JSONObject], int, Any, bool] | None = None
        """(conversation, messages scanned, the last of them, whether one refers to an artifact)."""
        self._batcher: CommitBatcher | None = None
        """The harness's commit batcher for this event loop while the loop runs with ``group_commits``."""
        self.thread_id = log.thread_id
        self.stream = log.stream

    @property
    def checkpoint_status(self) -> str:
        """How opening this thread used its checkpoint (``used``, ``none`` or why it was ignored)."""
        return self.log.checkpoint_status

    # --- reading ------------------------------------------------------------------------

    def analysis(self) -> Analysis:
        """The RecoveryResolver's answer for this thread as it stands."""
        return self.log.analysis()

    def state(self) -> State:
        """The current state (no I/O unless the history contradicts itself, or the last reply is a new artifact).

        ``last_reply`` is the whole text even when the reply was stored as an
        artifact (the turns keep the short placeholder and ``reply_artifact``).
        """
        return self.log.snapshot(max_steps=self._agent.max_steps, max_attempts=self._harness.max_attempts,
                                 running=self.running, context_budget=self._agent.context_budget)

    @property
    def running(self) -> bool:
        """True while the agent loop is working in this process."""
        return self._task is not None and not self._task.done()

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

    async def refresh(self) -> State:
        """Pick up events other processes appended, and return the state."""
        await self._quiet()
        self.log.sync()
        return self.state()

    # --- driving ------------------------------------------------------------------------

    async def send(self, text: str) -> str:
        """Start a turn with user input ``text``; returns the turn id once ``turn.started`` is durable. The loop
        runs in the background.

        With ``group_commits`` the commit is shared with the loop's other appends (decision 0020): sends made
        together (``asyncio.gather``) share one, and the loop runs other tasks while it is made.
        """
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("input must be a non-empty string", field="input")
        if len(text) > MAX_INPUT_CHARS:
            raise InvalidInput(f"input has {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
                               field="input")
        await self._quiet()
        self.log.sync()
        self.log.refuse_if_corrupt()
        state = self.state()
        if state.status == "paused":
            raise ThreadBusy(f"thread {self.thread_id} is {state.reason}", thread_id=self.thread_id)
        if state.status == "waiting":
            raise ThreadBusy(f"thread {self.thread_id} is waiting: {state.reason}. Resolve or approve first "
                             "(jixu threads resolve …)", thread_id=self.thread_id)
        if self.running or self._starting or self.log.state.active_turn() is not None:
            raise ThreadBusy(f"thread {self.thread_id} is still working on a turn; wait() for it first",
                             thread_id=self.thread_id)
        if self._harness.closing:
            raise ThreadBusy("the harness is shutting down and admits no new turns", thread_id=self.thread_id)
        batcher = self._harness.commit_batcher()
        if batcher is None:
            turn_id, self._fence = self.log.start_turn(text, owner=self._harness.owner,
                                                       ttl=self._harness.lease_ttl)
        else:
            # Turns started together share the commit of their turn.started (and the loop's other appends)
            # instead of holding the loop for one commit each.
            self._starting = True
            try:
                turn_id, self._fence = await self.log.start_turn_async(
                    text, batcher, owner=self._harness.owner, ttl=self._harness.lease_ttl)
            finally:
                self._starting = False
        self._start()
        return turn_id

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
        assert self._task is not None
        await asyncio.shield(self._task)
        return self.state()

    def wait_in_background(self) -> None:
        """Start the agent loop without waiting for it (``wait()`` collects it)."""
        if not self.running:
            self._start()

    async def interrupt(self, reason: str = "interrupted by the caller") -> State:
        """Stop the running turn; calls in flight are recorded as having an unknown outcome."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._quiet()
        self.log.sync()
        if self.log.state.active_turn() is not None:
            fence = self._claim()
            try:
                self.log.end_running_turn(reason, fence)
                self.log.checkpoint()
            finally:
                self._release()
        return self.state()

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"jixu-thread-{self.thread_id}")

    async def _run(self) -> None:
        log = self.log
        await self._quiet()  # a turn.started still waiting for its shared commit (see send)
        log.sync()
        self._batcher = self._harness.commit_batcher()
        fence = self._claim()
        heartbeat = asyncio.get_running_loop().create_task(self._heartbeat(fence)) if fence else None
        if self._batcher is not None:
            self._batcher.running += 1
        try:
            try:
                await self._loop()
            except BaseException:
                # A receipt staged just before an exception (a cancelled call's, say) is still a fact: commit
                # it, as its own append did before decision 0011 (a fenced-out owner gets FencingError here).
                log.flush()
                raise
        except FencingError as error:
            raise OwnershipLost(f"thread {self.thread_id}: this process no longer owns the turn ({error.message});"
                                " it stopped without writing anything more", thread_id=self.thread_id) from error
        finally:
            if self._batcher is not None:
                self._batcher.running -= 1
            if heartbeat is not None:
                heartbeat.cancel()
            self._release()

    async def _loop(self) -> None:
        """Decide and act until the thread must stop (see :func:`~jixu.threads.decide.decide`)."""
        agent, harness, log = self._agent, self._harness, self.log
        while True:
            self._pending = []  # an intent never committed (its call never started) is simply not there
            analysis = log.open_analysis()
            action = decide(log.state, analysis, max_steps=agent.max_steps, max_attempts=harness.max_attempts,
                            context_budget=agent.context_budget)
            paused = isinstance(action, Stop) and action.status == "paused" and not self._draining
            if paused:
                log.flush()  # nothing staged may wait out a pause uncommitted
            if paused and await self._automatic_resume():
                continue
            if isinstance(action, Stop) or self._draining:
                log.checkpoint()
                return
            head = log.state.seq
            try:
                if isinstance(action, Dispatch) and len(action.effect_ids) == 1:
                    [effect_id] = action.effect_ids
                    await self._alone(self._dispatch(effect_id, analysis.decisions[effect_id]))
                elif isinstance(action, Dispatch):
                    await asyncio.gather(*(self._dispatch(eid, analysis.decisions[eid])
                                           for eid in action.effect_ids))
                elif isinstance(action, RequestModel):
                    await self._request_model(action.turn_id)
                elif isinstance(action, RequestCompaction):
                    await self._request_compaction(action.turn_id, action.upto)
                elif isinstance(action, RequestTools):
                    await self._request_tools(action.turn_id, action.calls)
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
            except ConcurrencyError:
                # Another writer appended (e.g. an operator's decision): read it and decide again. A
                # staged receipt in the failed append was dropped with it (decision 0011).
                log.sync()
                continue
            if log.state.seq == head:
                # Every action records at least one event; a loop that records nothing would spin forever.
                raise JixuError(f"thread {self.thread_id}: {type(action).__name__} recorded nothing; "
                                "stopping instead of looping", thread_id=self.thread_id)

    # --- pauses -------------------------------------------------------------------------

    async def _pause(self, action: PauseTurn) -> None:
        """Record a pause; an automatic one carries its delay and when it ends by the store's clock."""
        harness = self._harness
        turn = self.log.state.active_turn()
        retries = turn.auto_retries if turn is not None else 0
        if action.automatic:
            delay = action.retry_after if action.retry_after is not None else min(
                harness.retry_backoff * (2 ** retries) * random.uniform(0.8, 1.2), harness.retry_backoff_cap)
        else:
            delay = None
        now = self.log.store.now()
        await self._commit([NewEvent("turn.paused", {
            "turn_id": action.turn_id, "reason": action.reason, "automatic": action.automatic,
            "retry_after": action.retry_after, "delay": delay,
            "resume_at": None if delay is None else now + delay, "model_effect_id": action.effect_id,
            "automatic_retries_used": retries}, self.log.meta())])

    async def _automatic_resume(self) -> bool:
        """Wait out an automatic pause and record the resume; False if the pause needs an operator."""
        turn = self.log.state.active_turn()
        pause = turn.pause if turn is not None else None
        if turn is None or pause is None or not pause.get("automatic"):
            return False
        resume_at = pause.get("resume_at")
        if isinstance(resume_at, int | float):
            remaining = resume_at - self.log.store.now()
            if remaining > 0:
                await asyncio.sleep(remaining)
        await self._commit([NewEvent("turn.resumed", {"turn_id": turn.turn_id, "reason": "automatic"},
                                     self.log.meta())])
        return True

    async def resume(self, *, actor: str = "operator", note: str | None = None) -> State:
        """Resume a turn paused for quota, authentication or exhausted automatic retries; it continues."""
        await self._quiet()
        self.log.resume_turn(actor=actor, note=note)
        self._continue()
        return self.state()

    # --- turn ownership -----------------------------------------------------------------

    def _append(self, events: list[NewEvent]) -> list[Event]:
        # A retry-safe effect's intent is committed together with whatever is appended next: its dispatch
        # marker (or a rejection before dispatch). Both are durable before the call leaves the process; a crash
        # before that commit leaves no trace (nothing was sent), one after it leaves the effect unknown, and
        # unknown retry-safe effects are retried under the same identity (decision 0010).
        batch, self._pending = [*self._pending, *events], []
        return self.log.append(batch, self._fence)

    async def _commit(self, events: list[NewEvent]) -> list[Event]:
        """Append for the agent loop: at once, or through the harness's commit batcher (``group_commits``).

        Batched, the loop waits for the commit (shared with the other threads of
        this event loop) before it goes on; a staged receipt rides in the same
        append, taken back out of the state while the commit runs (decision
        0019), so the state never holds an event that is not yet durable
        across that wait.

        Every few direct appends the loop yields to the event loop once
        (nothing is staged at that point): with a model and tools that never
        wait, the agent loop would otherwise hold the event loop for the whole
        turn, starving the lease heartbeat and every other task on it.
        """
        if not self._batching():
            stored = self._append(events)
            self._direct_appends += 1
            if self._direct_appends % YIELD_EVERY_APPENDS == 0:
                await asyncio.sleep(0)
            return stored
        assert self._batcher is not None
        batch, self._pending = [*self._pending, *events], []
        return await self.log.append_async(batch, self._fence, self._batcher, by_running_user=True)

    def _batching(self) -> bool:
        """Whether this append goes through the batcher: only while other threads of this loop run too.

        A thread running alone appends directly, as without ``group_commits``;
        events staged irreversibly (while it ran alone) are committed directly.
        """
        batcher = self._batcher
        log = self.log
        return batcher is not None and batcher.running > 1 and (not log.has_staged or log.staged_reversibly)

    async def _quiet(self) -> None:
        """Wait until no batched append of this thread waits for its commit (before touching the record)."""
        while self.log.appending:
            await asyncio.sleep(0.0005)

    def claim_problem(self) -> str | None:
        """Why this process cannot run the active turn now (another live owner, an unrecovered expired
        claim, a legacy turn), or ``None`` if it can. Reads the lease; writes nothing."""
        turn = self.log.state.active_turn()
        if turn is None:
            return None
        lease = self.log.store.get_lease(self.log.turn_key)
        if self._fence is not None and lease is not None and not lease.released \
                and (lease.owner, lease.epoch) == (self._fence.owner, self._fence.epoch):
            return None
        if lease is None:
            if turn.owner is None and not turn.queued:
                return (f"turn {turn.turn_id} was recorded before turn ownership existed; recover it with "
                        "legacy_confirmed_stopped once you know its process stopped")
            return None
        if lease.released or lease.owner == self._harness.owner:
            return None
        now = self.log.store.now()
        if lease.expires_at > now:
            return (f"turn {turn.turn_id} is owned by {lease.owner} (epoch {lease.epoch}) for another "
                    f"{lease.expires_at - now:.1f}s")
        if self._harness.takeover == "safe" and self._safe_to_take_over():
            return None
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

    def _claim(self) -> Fence | None:
        """Own the active turn before running it; returns the fence, or None when there is nothing to run."""
        log, harness = self.log, self._harness
        turn = log.state.active_turn()
        if turn is None:
            return None
        analysis = log.open_analysis()
        if turn.status == "needs_reconciliation":
            if analysis.requires_resolution or analysis.waiting_on_parked or analysis.has_corruption:
                return None  # decide() reports what must be reconciled first
        elif isinstance(decide(log.state, analysis, max_steps=self._agent.max_steps,
                               max_attempts=harness.max_attempts, context_budget=self._agent.context_budget),
                        Stop):
            return None
        problem = self.claim_problem()
        if problem is not None:
            raise TurnOwned(problem, thread_id=self.thread_id, turn_id=turn.turn_id)
        store, key = log.store, log.turn_key
        lease = store.get_lease(key)
        if self._fence is not None and lease is not None and not lease.released \
                and (lease.owner, lease.epoch) == (self._fence.owner, self._fence.epoch):
            return self._fence
        if lease is None:
            reason, previous_owner, previous_epoch, expired = "claimed", None, 0, False
        else:
            previous_owner, previous_epoch = lease.owner, lease.epoch
            expired = not lease.released and lease.owner != harness.owner
            reason = ("continued" if lease.released else
                      "reclaimed_by_same_owner" if lease.owner == harness.owner else "took_over_expired")
        try:
            fence = store.take_over_lease(key, harness.owner, harness.lease_ttl, expected_epoch=previous_epoch,
                                          require_expired=expired)
        except (FencingError, LeaseHeld) as error:
            raise TurnOwned(f"turn {turn.turn_id} changed hands while claiming it: {error.message}",
                            thread_id=self.thread_id, turn_id=turn.turn_id) from error
        self._fence = fence
        try:
            log.append([NewEvent("turn.claimed", {"turn_id": turn.turn_id, "owner": fence.owner,
                                                  "epoch": fence.epoch, "reason": reason,
                                                  "previous_owner": previous_owner,
                                                  "previous_epoch": previous_epoch}, log.meta())], fence)
        except ConcurrencyError:
            # Someone wrote meanwhile (the turn may even have ended): give the claim back and look again.
            self._release()
            log.sync()
            return self._claim()
        return fence

    async def _heartbeat(self, fence: Fence) -> None:
        """Renew the turn lease against the store's clock; stop the loop if the claim was lost."""
        interval = self._harness.lease_ttl / 3
        while True:
            await asyncio.sleep(interval)
            try:
                self.log.store.renew_lease(fence, self._harness.lease_ttl)
            except FencingError:
                if self._task is not None:
                    self._task.cancel()
                return

    def _release(self) -> None:
        if self._fence is not None:
            with contextlib.suppress(JixuError):
                self.log.store.release_lease(self._fence)
            self._fence = None

    async def drain(self, timeout: float) -> None:
        """Stop starting new work, let calls in flight finish for up to ``timeout`` seconds, then cancel.

        A turn stopped this way stays active: its lease is released, so another
        process can continue it; calls cancelled mid-flight are recorded as
        having an unknown outcome.
        """
        self._draining = True
        if self._task is None or self._task.done():
            return
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, JixuError):
                await self._task
        except (asyncio.CancelledError, JixuError):
            pass

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
        idempotent tool, no approval), make them at once: each intent commits with the first dispatch marker."""
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
            intents.append(intent)
            batch.append(NewEvent("tool.requested", intent, self.log.meta()))
            if needs_approval:
                batch.append(NewEvent("tool.parked", {"effect_id": effect_id, "reason": "requires_approval"},
                                      self.log.meta()))
        if intents and all(i["semantics"] in ("read_only", "idempotent") and not i["requires_approval"]
                           for i in intents):
            self._pending = batch
            if len(intents) == 1:
                await self._alone(self._call_tool(str(intents[0]["effect_id"]), intents[0], 1))
            else:
                await asyncio.gather(*(self._call_tool(str(i["effect_id"]), i, 1) for i in intents))
            return
        await self._commit(batch)

    async def _alone(self, call: Awaitable[None]) -> None:
        """Run one call with no other in flight: its receipt is staged, not committed on its own.

        The loop then decides the next step from the state with the receipt
        in it and commits the receipt together with that step's first events
        (decision 0011): two commits per agent step instead of four. Calls run
        side by side (``gather``) commit their receipts at once, because the
        loop yields to other tasks while it waits for the rest.
        """
        self._stage_receipts = True
        try:
            await call
        finally:
            self._stage_receipts = False

    async def _record_receipt(self, event: NewEvent) -> None:
        """Stage a call's receipt (see :meth:`_alone`) or append it now.

        While batching, the receipt is staged reversibly: the batched append
        that carries it takes it back out of the state until it is durable.
        """
        if self._stage_receipts and not self._pending:
            self.log.stage([event], self._fence, reversible=self._batching())
        else:
            await self._commit([event])

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
        else:
            raise JixuError(f"thread {self.thread_id}: effect {effect_id} has kind {decision.kind!r}, which "
                            "threads do not dispatch", effect_id=effect_id)

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
        await self._commit([NewEvent("model.dispatched", {"effect_id": effect_id, "attempt": attempt,
                                                        "idempotency_key": intent["idempotency_key"],
                                                        "args_hash": intent["args_hash"]}, log.meta())])
        try:
            response = await agent.model.complete(request)
            result = response.to_result(effect_id)
        except ModelError as error:
            await self._receipt("model", effect_id, attempt, error=error.to_dict(), indeterminate=error.indeterminate)
        except MalformedEvent as error:
            await self._receipt("model", effect_id, attempt, error={"type": "invalid_response", "message": error.message},
                          indeterminate=False)
        except asyncio.CancelledError:
            await self._receipt("model", effect_id, attempt, error={"type": "interrupted"}, indeterminate=True)
            raise
        except Exception as error:
            # An unexpected driver failure: the request may have been processed, and a retry may succeed.
            await self._receipt("model", effect_id, attempt, error={**_exception_dict(error), "kind": "transient"},
                          indeterminate=True)
        else:
            await self._record_receipt(NewEvent("model.completed", {"effect_id": effect_id, "attempt": attempt,
                                                            "result": self._model_result(result)}, log.meta()))

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
        dispatched = NewEvent("compaction.dispatched", {"effect_id": effect_id, "attempt": attempt,
                                                        "idempotency_key": key, "args_hash": intent["args_hash"]},
                              log.meta())
        if not (isinstance(upto, int) and isinstance(covers, list) and log.state.message_events[:upto] == covers):
            # Defensive: the messages before the turn changed since the intent. Nothing is sent.
            error = {"type": "stale_context", "message": "the conversation no longer starts with the messages "
                                                         "this compaction covers"}
            if attempt == 1:
                await self._receipt("compaction", effect_id, None, error=error, indeterminate=False)
            else:  # it was dispatched before: this attempt ends at once, with a determinate receipt
                await self._commit([dispatched, NewEvent("compaction.failed", {
                    "effect_id": effect_id, "attempt": attempt, "error": error, "indeterminate": False},
                    log.meta())])
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
        await self._commit([dispatched])
        try:
            response = await agent.model.complete(request)
            problem = summary_problem(response.text, response.tool_calls)
            usage = response.usage.to_dict()
        except ModelError as error:
            await self._receipt("compaction", effect_id, attempt, error=error.to_dict(), indeterminate=error.indeterminate)
        except asyncio.CancelledError:
            await self._receipt("compaction", effect_id, attempt, error={"type": "interrupted"}, indeterminate=True)
            raise
        except Exception as error:
            await self._receipt("compaction", effect_id, attempt, error={**_exception_dict(error), "kind": "transient"},
                          indeterminate=True)
        else:
            if problem is not None:
                await self._receipt("compaction", effect_id, attempt, indeterminate=False,
                              error={"type": "invalid_summary", "message": problem, "usage": usage})
                return
            await self._record_receipt(NewEvent("compaction.completed", {
                "effect_id": effect_id, "attempt": attempt, "result": {
                    "summary": response.text, "covers": covers, "upto_message": upto, "usage": usage,
                    "model": response.model}}, log.meta()))

    async def _call_tool(self, effect_id: str, intent: dict[str, Any], attempt: int) -> None:
        log = self.log
        name = str(intent.get("name"))
        declared = self._agent.tool(name)
        if declared is None:
            await self._receipt("tool", effect_id, None, indeterminate=False, error={
                "type": "unknown_tool", "message": f"there is no tool named {name!r}; "
                f"available: {[t.name for t in self._agent.tools]}"})
            return
        try:
            args = declared.validate_args(intent.get("args"))
        except JixuError as error:
            await self._receipt("tool", effect_id, None, indeterminate=False,
                          error={"type": "invalid_arguments", **error.to_dict()})
            return
        key = str(intent["idempotency_key"])
        await self._commit([NewEvent("tool.dispatched", {"effect_id": effect_id, "attempt": attempt, "name": name,
                                                       "args_hash": intent["args_hash"], "idempotency_key": key},
                                     log.meta())])
        context = ToolContext(effect_id=effect_id, idempotency_key=key, attempt=attempt,
                              thread_id=self.thread_id, turn_id=str(intent.get("turn_id")))
        try:
            call = declared.invoke(args, context)
            result = await (asyncio.wait_for(call, declared.timeout) if declared.timeout else call)
        except ToolError as error:
            await self._receipt("tool", effect_id, attempt, error=error.to_dict(), indeterminate=False)
        except TimeoutError:
            await self._receipt("tool", effect_id, attempt, indeterminate=True,
                          error={"type": "timeout", "message": f"no answer within {declared.timeout}s"})
        except asyncio.CancelledError:
            await self._receipt("tool", effect_id, attempt, error={"type": "interrupted"}, indeterminate=True)
            raise
        except JixuError as error:
            # The tool ran (its effect may have happened) but returned something unusable, e.g. not JSON:
            # that is no receipt of what it did, so the outcome stays unknown.
            await self._receipt("tool", effect_id, attempt, error=error.to_dict(), indeterminate=True)
        except Exception as error:
            await self._receipt("tool", effect_id, attempt, error=_exception_dict(error), indeterminate=True)
        else:
            await self._record_receipt(NewEvent("tool.completed", self._tool_result(effect_id, attempt, result),
                                          log.meta()))

    def _tool_result(self, effect_id: str, attempt: int, result: Any) -> dict[str, Any]:
        """A ``tool.completed`` payload: the result inline, or a reference to it stored as an artifact.

        A result larger than :data:`INLINE_RESULT_BYTES` is stored once, content-addressed, before its
        receipt (so the reference never points at nothing); the thread's state keeps only the reference.
        """
        data: dict[str, Any] = {"effect_id": effect_id, "attempt": attempt}
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

    async def _receipt(self, kind: str, effect_id: str, attempt: int | None, *, error: dict[str, Any],
                 indeterminate: bool) -> None:
        data: dict[str, Any] = {"effect_id": effect_id, "error": error, "indeterminate": indeterminate}
        if attempt is not None:
            data["attempt"] = attempt
        await self._record_receipt(NewEvent(f"{kind}.failed", data, self.log.meta()))

    # --- operator decisions -------------------------------------------------------------

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
        await self._quiet()
        self.log.resolve(effect_id, resolution, resolution_id=resolution_id, note=note, actor=actor,
                         evidence=evidence, result=result)
        self._continue()
        return self.state()

    async def approve(self, effect_id: str, *, actor: str = "operator", note: str | None = None) -> State:
        """Approve a parked call; the thread continues and dispatches it."""
        await self._quiet()
        self.log.decide_parked(effect_id, "approved", actor=actor, note=note)
        self._continue()
        return self.state()

    async def deny(self, effect_id: str, *, actor: str = "operator", note: str | None = None) -> State:
        """Deny a parked call; the model is told and the thread continues."""
        await self._quiet()
        self.log.decide_parked(effect_id, "denied", actor=actor, note=note)
        self._continue()
        return self.state()

    def _continue(self) -> None:
        if not self.running:
            self._start()

    # --- replay and fork ----------------------------------------------------------------

    async def replay(self, upto: int | str | None = None) -> State:
        """Rebuild the state from events alone, calling no model, tool or other driver.

        ``upto`` is a seq or an event id of this thread (inclusive); the default
        is the whole history. The decisions come from the resolver over the
        events read, not from any cache.
        """
        return self.log.replay(upto)

    async def fork(self, at: str, input: str | None = None) -> Thread:
        """A new thread with this one's state at event ``at``; this thread does not change.

        Effects still open at that event are not inherited (their calls are
        marked as not carried over). With ``input``, the child starts a turn.
        """
        await self._quiet()
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


__all__ = ["State", "Thread", "stream_of"]
