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
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from jixu.errors import (
    ConcurrencyError,
    EffectNotParked,
    EffectNotUnknown,
    InvalidInput,
    JixuError,
    MalformedEvent,
    ModelError,
    NotFound,
    ResolutionConflict,
    ThreadBusy,
    ThreadCorrupt,
)
from jixu.ledger import Event, NewEvent, content_hash, new_id
from jixu.ledger.encoding import canonical_text
from jixu.ledger.ids import is_valid_id
from jixu.ledger.projection import make_checkpoint
from jixu.recovery import RESOLUTIONS, Analysis, EffectDecision, RecoveryResolver
from jixu.threads.decide import CompleteTurn, Dispatch, FailTurn, RequestModel, RequestTools, Stop, decide
from jixu.threads.model import ModelRequest
from jixu.threads.projection import ThreadProjection, ThreadState, fork_state
from jixu.threads.tools import ToolContext, ToolError

if TYPE_CHECKING:
    from jixu.threads.harness import Harness

MAX_INPUT_CHARS = 200_000
MAX_NOTE_CHARS = 10_000


def stream_of(thread_id: str) -> str:
    """The ledger stream that holds a thread's events."""
    return f"thread/{thread_id}"


@dataclass(frozen=True)
class State:
    """A thread's state as users see it: a snapshot, derived from events only."""

    thread_id: str
    status: str
    """``idle``, ``running``, ``waiting``, ``failed`` or ``corrupt``."""
    reason: str
    messages: tuple[dict[str, Any], ...]
    turns: tuple[dict[str, Any], ...]
    effects: dict[str, EffectDecision]
    """The RecoveryResolver's decision for every effect, by effect id."""
    waiting_on: tuple[dict[str, Any], ...]
    last_reply: str | None
    usage: dict[str, Any]
    seq: int
    head_hash: str
    parent: dict[str, Any] | None
    agent: dict[str, Any]
    analysis: Analysis

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the analysis flags included, the decisions as dicts)."""
        return {
            "thread_id": self.thread_id,
            "status": self.status,
            "reason": self.reason,
            "messages": list(self.messages),
            "turns": list(self.turns),
            "effects": {k: d.to_dict() for k, d in self.effects.items()},
            "waiting_on": list(self.waiting_on),
            "last_reply": self.last_reply,
            "usage": self.usage,
            "seq": self.seq,
            "head_hash": self.head_hash,
            "parent": self.parent,
            "agent": self.agent,
            "safe_to_continue": self.analysis.safe_to_continue,
            "has_corruption": self.analysis.has_corruption,
        }


def build_state(thread_state: ThreadState, analysis: Analysis, *, max_steps: int, max_attempts: int,
                running: bool = False) -> State:
    """The public :class:`State` of a projected thread (pure)."""
    action = decide(thread_state, analysis, max_steps=max_steps, max_attempts=max_attempts)
    if isinstance(action, Stop) and not running:
        status, reason = action.status, action.reason
    else:
        status, reason = "running", ""
    waiting = []
    for effect_id in (*analysis.requires_resolution, *analysis.waiting_on_parked):
        decision = analysis.decisions[effect_id]
        waiting.append({"effect_id": effect_id, "kind": decision.kind, "name": decision.name,
                        "state": decision.state, "reason": decision.reason})
    replies = [t.reply for t in thread_state.turns if t.status == "completed"]
    return State(
        thread_id=thread_state.thread_id,
        status=status,
        reason=reason,
        messages=tuple(dict(m) for m in thread_state.messages),
        turns=tuple(t.to_dict() for t in thread_state.turns),
        effects=dict(analysis.decisions),
        waiting_on=tuple(waiting),
        last_reply=replies[-1] if replies else None,
        usage=dict(thread_state.usage),
        seq=thread_state.seq,
        head_hash=thread_state.head_hash,
        parent=thread_state.parent,
        agent=dict(thread_state.agent),
        analysis=analysis,
    )


class Thread:
    """One durable conversation with an agent. Get one from :class:`~jixu.Harness`."""

    def __init__(self, harness: Harness, state: ThreadState, *, chain_break_seq: int | None = None) -> None:
        self._harness = harness
        self._store = harness.store
        self._agent = harness.agent
        self._state = state
        self._projection = ThreadProjection()
        self._chain_break_seq = chain_break_seq
        self._task: asyncio.Task[None] | None = None
        self._checkpoint_seq = 0
        self.checkpoint_status = "none"
        """How the last open used its checkpoint (see :func:`jixu.ledger.project`)."""
        self.thread_id = state.thread_id
        self.stream = stream_of(state.thread_id)

    # --- reading ------------------------------------------------------------------------

    def analysis(self) -> Analysis:
        """The RecoveryResolver's answer for this thread as it stands."""
        if self._state.contradiction:
            return RecoveryResolver.analyze(self._store.read(self.stream))
        return self._state.analysis(self._chain_break_seq)

    def state(self) -> State:
        """The current state (no I/O unless the history contradicts itself)."""
        return build_state(self._state, self.analysis(), max_steps=self._agent.max_steps,
                           max_attempts=self._harness.max_attempts, running=self.running)

    @property
    def running(self) -> bool:
        """True while the agent loop is working in this process."""
        return self._task is not None and not self._task.done()

    async def events(self, from_seq: int = 1) -> list[Event]:
        """The thread's events, in order."""
        return self._store.read(self.stream, from_seq)

    async def refresh(self) -> State:
        """Pick up events other processes appended, and return the state."""
        self._sync()
        return self.state()

    # --- driving ------------------------------------------------------------------------

    async def send(self, text: str) -> str:
        """Start a turn with user input ``text``; returns the turn id. The loop runs in the background."""
        if not isinstance(text, str) or not text.strip():
            raise InvalidInput("input must be a non-empty string", field="input")
        if len(text) > MAX_INPUT_CHARS:
            raise InvalidInput(f"input has {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
                               field="input")
        self._sync()
        self._refuse_if_corrupt()
        if self.running or self._state.active_turn() is not None:
            raise ThreadBusy(f"thread {self.thread_id} is still working on a turn; wait() for it first",
                             thread_id=self.thread_id)
        state = self.state()
        if state.status == "waiting":
            raise ThreadBusy(f"thread {self.thread_id} is waiting: {state.reason}. Resolve or approve first "
                             f"(jixu threads resolve …)", thread_id=self.thread_id)
        turn_id = new_id()
        self._append([NewEvent("turn.started", {"turn_id": turn_id, "input": text}, self._meta())])
        self._start()
        return turn_id

    async def wait(self) -> State:
        """Run the agent loop until the thread is idle, waiting, failed or corrupt; return its state."""
        if self._task is None or self._task.done():
            self._start()
        assert self._task is not None
        task = self._task
        await asyncio.shield(task)
        return self.state()

    async def interrupt(self, reason: str = "interrupted by the caller") -> State:
        """Stop the running turn; calls in flight are recorded as having an unknown outcome."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._sync()
        turn = self._state.active_turn()
        if turn is not None:
            self._append([NewEvent("turn.ended", {"turn_id": turn.turn_id, "outcome": "interrupted",
                                                 "reason": str(reason)},
                                   self._meta())])
            self._checkpoint()
        return self.state()

    def wait_in_background(self) -> None:
        """Start the agent loop without waiting for it (``wait()`` collects it)."""
        if not self.running:
            self._start()

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"jixu-thread-{self.thread_id}")

    async def _run(self) -> None:
        agent, harness = self._agent, self._harness
        while True:
            analysis = self.analysis()
            action = decide(self._state, analysis, max_steps=agent.max_steps, max_attempts=harness.max_attempts)
            try:
                if isinstance(action, Stop):
                    self._checkpoint()
                    return
                if isinstance(action, Dispatch):
                    await asyncio.gather(*(self._dispatch(eid, analysis.decisions[eid])
                                           for eid in action.effect_ids))
                elif isinstance(action, RequestModel):
                    self._request_model(action.turn_id)
                elif isinstance(action, RequestTools):
                    self._request_tools(action.turn_id, action.calls)
                elif isinstance(action, CompleteTurn):
                    self._append([NewEvent("turn.ended", {"turn_id": action.turn_id, "outcome": "completed",
                                                      "reply": action.reply},
                                           self._meta())])
                elif isinstance(action, FailTurn):
                    self._append([NewEvent("turn.ended", {"turn_id": action.turn_id, "outcome": "failed",
                                                      "error": action.error},
                                           self._meta())])
            except ConcurrencyError:
                # Another writer appended: read what it wrote and decide again.
                self._sync()

    # --- effects ------------------------------------------------------------------------

    def _request_model(self, turn_id: str) -> None:
        effect_id = new_id()
        args = {"turn_id": turn_id, "context_seq": self._state.seq, "messages": len(self._state.messages)}
        self._append([NewEvent("model.requested", {
            "effect_id": effect_id, "name": self._agent.model.name, "args": args, "args_hash": content_hash(args),
            "semantics": "read_only", "idempotency_key": f"jixu:{effect_id}", "requires_approval": False,
            "turn_id": turn_id,
        }, self._meta())])

    def _request_tools(self, turn_id: str, calls: Sequence[dict[str, Any]]) -> None:
        batch = []
        for call in calls:
            effect_id = new_id()
            declared = self._agent.tool(str(call.get("name")))
            args = call.get("args") if isinstance(call.get("args"), dict) else {"__invalid__": call.get("args")}
            needs_approval = bool(declared and declared.requires_approval)
            batch.append(NewEvent("tool.requested", {
                "effect_id": effect_id, "name": str(call.get("name")), "args": args,
                "args_hash": content_hash(args), "semantics": declared.semantics if declared else "unsafe",
                "idempotency_key": f"jixu:{effect_id}", "requires_approval": needs_approval,
                "turn_id": turn_id, "call_id": str(call.get("id")),
            }, self._meta()))
            if needs_approval:
                batch.append(NewEvent("tool.parked", {"effect_id": effect_id, "reason": "requires_approval"},
                                      self._meta()))
        self._append(batch)

    async def _dispatch(self, effect_id: str, decision: EffectDecision) -> None:
        intent = self._state.intent(effect_id)
        if intent is None:  # pragma: no cover - the resolver only reports effects with an intent as dispatchable
            return
        attempt = decision.attempts + 1
        if decision.kind == "model":
            await self._call_model(effect_id, intent, attempt)
        elif decision.kind == "tool":
            await self._call_tool(effect_id, intent, attempt)

    async def _call_model(self, effect_id: str, intent: dict[str, Any], attempt: int) -> None:
        agent = self._agent
        request = ModelRequest(
            instructions=agent.instructions,
            messages=tuple(dict(m) for m in self._state.messages),
            tools=tuple(t.spec() for t in agent.tools),
            effect_id=effect_id,
            idempotency_key=str(intent["idempotency_key"]),
            attempt=attempt,
            thread_id=self.thread_id,
            turn_id=str(intent.get("turn_id")),
        )
        self._append([NewEvent("model.dispatched", {"effect_id": effect_id, "attempt": attempt,
                                                    "idempotency_key": intent["idempotency_key"],
                                                    "args_hash": intent["args_hash"]}, self._meta())])
        try:
            response = await agent.model.complete(request)
            result = response.to_result(effect_id)
        except ModelError as error:
            self._receipt("model", effect_id, attempt, error=error.to_dict(), indeterminate=error.indeterminate)
        except MalformedEvent as error:
            self._receipt("model", effect_id, attempt, error={"type": "invalid_response", "message": error.message},
                          indeterminate=False)
        except asyncio.CancelledError:
            self._receipt("model", effect_id, attempt, error={"type": "interrupted"}, indeterminate=True)
            raise
        except Exception as error:
            self._receipt("model", effect_id, attempt, error=_exception_dict(error), indeterminate=True)
        else:
            self._append([NewEvent("model.completed", {"effect_id": effect_id, "attempt": attempt,
                                                       "result": result}, self._meta())])

    async def _call_tool(self, effect_id: str, intent: dict[str, Any], attempt: int) -> None:
        name = str(intent.get("name"))
        declared = self._agent.tool(name)
        if declared is None:
            self._receipt("tool", effect_id, None, indeterminate=False, error={
                "type": "unknown_tool", "message": f"there is no tool named {name!r}; "
                f"available: {[t.name for t in self._agent.tools]}"})
            return
        try:
            args = declared.validate_args(intent.get("args"))
        except JixuError as error:
            self._receipt("tool", effect_id, None, indeterminate=False,
                          error={"type": "invalid_arguments", **error.to_dict()})
            return
        key = str(intent["idempotency_key"])
        self._append([NewEvent("tool.dispatched", {"effect_id": effect_id, "attempt": attempt, "name": name,
                                                   "args_hash": intent["args_hash"], "idempotency_key": key},
                               self._meta())])
        context = ToolContext(effect_id=effect_id, idempotency_key=key, attempt=attempt,
                              thread_id=self.thread_id, turn_id=str(intent.get("turn_id")))
        try:
            call = declared.invoke(args, context)
            result = await (asyncio.wait_for(call, declared.timeout) if declared.timeout else call)
        except ToolError as error:
            self._receipt("tool", effect_id, attempt, error=error.to_dict(), indeterminate=False)
        except TimeoutError:
            self._receipt("tool", effect_id, attempt, indeterminate=True,
                          error={"type": "timeout", "message": f"no answer within {declared.timeout}s"})
        except asyncio.CancelledError:
            self._receipt("tool", effect_id, attempt, error={"type": "interrupted"}, indeterminate=True)
            raise
        except JixuError as error:  # e.g. the tool returned something that is not JSON
            self._receipt("tool", effect_id, attempt, error=error.to_dict(), indeterminate=False)
        except Exception as error:
            self._receipt("tool", effect_id, attempt, error=_exception_dict(error), indeterminate=True)
        else:
            self._append([NewEvent("tool.completed", {"effect_id": effect_id, "attempt": attempt,
                                                      "result": result}, self._meta())])

    def _receipt(self, kind: str, effect_id: str, attempt: int | None, *, error: dict[str, Any],
                 indeterminate: bool) -> None:
        data: dict[str, Any] = {"effect_id": effect_id, "error": error, "indeterminate": indeterminate}
        if attempt is not None:
            data["attempt"] = attempt
        self._append([NewEvent(f"{kind}.failed", data, self._meta())])

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
        """Record an operator's decision about an effect whose outcome is unknown.

        ``resolution`` is ``occurred`` (optionally with the ``result`` observed),
        ``not_occurred`` or ``abandoned_unknown``. Idempotent on
        ``resolution_id``: the same id and body return the current state; a
        different body, or a second decision, raises
        :class:`~jixu.errors.ResolutionConflict`. The thread then continues.
        """
        if resolution not in RESOLUTIONS:
            raise InvalidInput(f"resolution {resolution!r} must be one of {list(RESOLUTIONS)}",
                               field="resolution")
        if resolution_id is None:
            resolution_id = new_id()
        _check_text(resolution_id, "resolution_id", 100, required=True)
        _check_text(note, "note", MAX_NOTE_CHARS)
        _check_text(actor, "actor", 200, required=True)
        if evidence is not None and not isinstance(evidence, dict):
            raise InvalidInput("evidence must be a JSON object", field="evidence")
        if result is not None and resolution != "occurred":
            raise InvalidInput("a result can only accompany resolution 'occurred'", field="result")
        body: dict[str, Any] = {"effect_id": effect_id, "resolution": resolution, "resolution_id": resolution_id,
                                "actor": actor, "note": note}
        if evidence is not None:
            body["evidence"] = evidence
        if result is not None:
            body["result"] = result
        canonical_text(body, path="resolution")  # refuse non-JSON evidence or results before reading
        self._sync()
        analysis = self.analysis()
        decision = analysis.decisions.get(effect_id)
        if decision is None:
            raise NotFound(f"thread {self.thread_id} has no effect {effect_id!r}", effect_id=effect_id)
        if decision.resolution is not None:
            recorded = decision.resolution
            same = (recorded.get("resolution_id") == resolution_id and recorded.get("resolution") == resolution
                    and recorded.get("note") == note and recorded.get("evidence") == evidence
                    and recorded.get("result") == result)
            if same:
                return self.state()
            raise ResolutionConflict(
                f"effect {effect_id} was already resolved as {recorded.get('resolution')!r} "
                f"(resolution id {recorded.get('resolution_id')}); a resolution cannot be changed",
                effect_id=effect_id)
        for other in analysis.decisions.values():
            if other.resolution and other.resolution.get("resolution_id") == resolution_id:
                raise ResolutionConflict(f"resolution id {resolution_id} was already used for effect "
                                         f"{other.effect_id}", effect_id=effect_id)
        if decision.state != "unknown":
            raise EffectNotUnknown(
                f"effect {effect_id} is {decision.state} ({decision.reason}), not unknown: only an unknown "
                "outcome can be resolved", effect_id=effect_id, state=decision.state)
        self._append([NewEvent(f"{decision.kind}.outcome_resolved", body, self._meta(actor))])
        self._after_operator_decision()
        return self.state()

    async def approve(self, effect_id: str, *, actor: str = "operator", note: str | None = None) -> State:
        """Approve a parked call; the thread continues and dispatches it."""
        return self._decide_parked(effect_id, "approved", actor, note)

    async def deny(self, effect_id: str, *, actor: str = "operator", note: str | None = None) -> State:
        """Deny a parked call; the model is told and the thread continues."""
        return self._decide_parked(effect_id, "denied", actor, note)

    def _decide_parked(self, effect_id: str, phase: str, actor: str, note: str | None) -> State:
        _check_text(actor, "actor", 200, required=True)
        _check_text(note, "note", MAX_NOTE_CHARS)
        self._sync()
        decision = self.analysis().decisions.get(effect_id)
        if decision is None:
            raise NotFound(f"thread {self.thread_id} has no effect {effect_id!r}", effect_id=effect_id)
        if decision.state != "parked":
            raise EffectNotParked(f"effect {effect_id} is {decision.state}, not parked", effect_id=effect_id)
        self._append([NewEvent(f"{decision.kind}.{phase}", {"effect_id": effect_id, "actor": actor, "note": note},
                               self._meta(actor))])
        self._after_operator_decision()
        return self.state()

    def _after_operator_decision(self) -> None:
        with contextlib.suppress(RuntimeError):  # no running event loop: the caller will wait() later
            if not self.running:
                self._start()

    # --- replay and fork ----------------------------------------------------------------

    async def replay(self, upto: int | str | None = None) -> State:
        """Rebuild the state from events alone, calling no model, tool or other driver.

        ``upto`` is a seq or an event id of this thread (inclusive); the default is the whole history.
        The decisions come from the resolver over the events read, not from any cache.
        """
        last = self._resolve_upto(upto)
        events = self._store.read(self.stream, 1, last)
        state = ThreadProjection().initial()
        for event in events:
            state = self._projection.apply(state, event)
        report = self._store.verify(self.stream)
        break_seq = None if report.valid else report.first_bad_seq
        analysis = RecoveryResolver.analyze(events, chain_break_seq=break_seq)
        return build_state(state, analysis, max_steps=self._agent.max_steps, max_attempts=self._harness.max_attempts)

    async def fork(self, at: str, input: str | None = None) -> Thread:
        """A new thread with this one's state at event ``at``; this thread does not change.

        Effects still open at that event are not inherited. With ``input``, the
        child starts a turn with it.
        """
        if not is_valid_id(at):
            raise InvalidInput(f"fork point {at!r} is not an event id", field="at")
        event = self._store.get_event(at)
        if event is None or event.stream != self.stream:
            raise NotFound(f"event {at} is not in thread {self.thread_id}; fork at one of its events",
                           event_id=at)
        if input is not None and (not isinstance(input, str) or not input.strip()):
            raise InvalidInput("input must be a non-empty string", field="input")
        events = self._store.read(self.stream, 1, event.seq)
        parent_state = ThreadProjection().initial()
        for item in events:
            parent_state = self._projection.apply(parent_state, item)
        if RecoveryResolver.analyze(events).has_corruption or parent_state.contradiction:
            raise ThreadCorrupt(f"thread {self.thread_id} is corrupt at or before event {at}; cannot fork there")
        child_state = fork_state(parent_state)
        child_id = new_id()
        parent = {"thread_id": self.thread_id, "event_id": event.id, "seq": event.seq, "hash": event.hash}
        child_state.thread_id = child_id
        child_state.parent = parent
        forked = NewEvent("thread.forked", {
            "thread_id": child_id, "parent": parent, "agent": self._agent.describe(),
            "metadata": parent_state.metadata, "state": self._projection.dump(child_state)}, self._meta())
        stored = self._store.append(stream_of(child_id), [forked], 0, genesis_hash=event.hash)
        state = self._projection.apply(ThreadProjection().initial(), stored[0])
        child = Thread(self._harness, state)
        if input is not None:
            await child.send(input)
        return child

    def _resolve_upto(self, upto: int | str | None) -> int | None:
        if upto is None:
            return None
        if isinstance(upto, bool):
            raise InvalidInput("upto must be a seq or an event id", field="upto")
        if isinstance(upto, int):
            if upto < 1:
                raise InvalidInput("upto must be >= 1", field="upto")
            return upto
        if not is_valid_id(upto):
            raise InvalidInput(f"upto {upto!r} is neither a seq nor an event id", field="upto")
        event = self._store.get_event(upto)
        if event is None or event.stream != self.stream:
            raise NotFound(f"event {upto} is not in thread {self.thread_id}", event_id=upto)
        return event.seq

    # --- plumbing -----------------------------------------------------------------------

    def _meta(self, actor: str | None = None) -> dict[str, Any]:
        return {"actor": actor or self._harness.actor, "thread_id": self.thread_id}

    def _append(self, events: list[NewEvent]) -> list[Event]:
        self._refuse_if_corrupt()
        stored = self._store.append(self.stream, events, self._state.seq)
        for event in stored:
            self._state = self._projection.apply(self._state, event)
        return stored

    def _sync(self) -> None:
        """Apply events appended by others since our head."""
        for event in self._store.read(self.stream, self._state.seq + 1):
            if event.prev_hash != self._state.head_hash:
                self._chain_break_seq = event.seq if self._chain_break_seq is None else self._chain_break_seq
                break
            self._state = self._projection.apply(self._state, event)

    def _refuse_if_corrupt(self) -> None:
        if self._chain_break_seq is not None or self._state.contradiction:
            raise ThreadCorrupt(f"thread {self.thread_id} has a broken or contradictory history; it will not "
                                f"run. Inspect it with `jixu threads verify {self.thread_id}`",
                                thread_id=self.thread_id)
        corrupt = self._state.analysis().corrupt
        if corrupt:
            raise ThreadCorrupt(f"thread {self.thread_id} has corrupt effects {list(corrupt)}; it will not run",
                                thread_id=self.thread_id)

    def _checkpoint(self) -> None:
        state = self._state
        if state.seq <= self._checkpoint_seq or state.contradiction or self._chain_break_seq is not None:
            return
        self._store.write_checkpoint(make_checkpoint(self.stream, self._projection, state, state.seq,
                                                     state.head_hash))
        self._checkpoint_seq = state.seq


def _exception_dict(error: BaseException) -> dict[str, Any]:
    return {"type": "exception", "exception": type(error).__name__, "message": str(error)[:2000]}


def _check_text(value: object, name: str, limit: int, *, required: bool = False) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or (required and not value.strip()) or len(value) > limit:
        raise InvalidInput(f"{name} must be a string of at most {limit} characters"
                           + (" (not empty)" if required else ""), field=name)


__all__ = ["State", "Thread", "build_state", "stream_of"]
