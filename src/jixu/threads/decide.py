"""The pure decision of what a thread does next, from its state and the resolver's analysis.

This is the only place the agent loop's policy lives; :mod:`jixu.threads.thread`
carries the decisions out and records every step as events.
"""

from __future__ import annotations

from dataclasses import dataclass

from jixu.kernel.loop import AUTOMATIC_PAUSES, MAX_AUTOMATIC_RETRIES, OPERATOR_PAUSES, asked_too_long
from jixu.ledger.encoding import JSONObject
from jixu.recovery import Analysis
from jixu.threads.compaction import MIN_COMPACTED_MESSAGES, over_budget
from jixu.threads.projection import ThreadState
from jixu.threads.tools import DEFINITE_ANSWERS


@dataclass(frozen=True, slots=True)
class Stop:
    """Nothing to do until something outside changes: ``idle``, ``waiting``, ``failed`` or ``corrupt``."""

    status: str
    reason: str = ""
    effect_ids: tuple[str, ...] = ()
    """For ``waiting``: the effects an operator must resolve, approve or deny."""


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Dispatch these recorded effects now (never dispatched, or retry-safe with an unknown outcome)."""

    effect_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RequestModel:
    """Record the intent of the turn's next model call."""

    turn_id: str


@dataclass(frozen=True, slots=True)
class RequestCompaction:
    """The conversation exceeds the context budget: record a compaction of its first ``upto`` messages."""

    turn_id: str
    upto: int
    """How many messages (all before the active turn's user message) the summary replaces."""


@dataclass(frozen=True, slots=True)
class RequestTools:
    """Record intents for tool calls the model made that have none yet."""

    turn_id: str
    calls: tuple[JSONObject, ...]


@dataclass(frozen=True, slots=True)
class PauseTurn:
    """The provider refused or failed: pause the turn, with an automatic retry when ``automatic``."""

    turn_id: str
    reason: str
    """``rate_limit``, ``transient``, ``quota`` or ``authentication``."""
    retry_after: float | None
    automatic: bool
    effect_id: str


@dataclass(frozen=True, slots=True)
class Probe:
    """Ask the tools' probes what happened to these calls, whose outcome is unknown, before an operator."""

    turn_id: str
    effect_ids: tuple[str, ...]
    """The calls to ask about (each once per attempt)."""


@dataclass(frozen=True, slots=True)
class ResolveByProbe:
    """A probe answered definitely: record its answer as the call's outcome resolution (actor ``probe:<tool>``)."""

    effect_id: str
    """The call whose outcome the probe established."""
    probe_effect_id: str
    """The probe effect whose receipt holds the answer (it is also the resolution's id)."""
    tool: str
    resolution: str
    """``occurred`` or ``not_occurred``."""
    evidence: JSONObject
    result: object = None
    """For ``occurred``: what the probe found the call to have returned."""


@dataclass(frozen=True, slots=True)
class CompleteTurn:
    """The model gave its final reply."""

    turn_id: str
    reply: str
    reply_artifact: JSONObject | None = None
    """The reference of a reply stored as an artifact (``reply`` is then a short placeholder)."""


@dataclass(frozen=True, slots=True)
class FailTurn:
    """The turn cannot continue."""

    turn_id: str
    error: JSONObject


@dataclass(frozen=True, slots=True)
class InterruptTurn:
    """Another process asked the turn to stop (``turn.interrupt_requested``): end it ``interrupted`` now, between
    steps (what was in flight has finished and is recorded)."""

    turn_id: str
    request: JSONObject


Action = (Stop | Dispatch | RequestModel | RequestCompaction | RequestTools | Probe | ResolveByProbe | CompleteTurn
          | FailTurn | PauseTurn | InterruptTurn)


def failure_reason(turn_id: str, error: JSONObject | None) -> str:
    """What a failed turn's ``State.reason`` says: its error's type and message, as the turn recorded them."""
    error = error or {}
    kind = str(error.get("type") or error.get("kind") or "error")
    message = str(error.get("message") or "").strip()
    return f"turn {turn_id} failed ({kind})" + (f": {message}" if message else "")


def decide(state: ThreadState, analysis: Analysis, *, max_steps: int, max_attempts: int,
           context_budget: int | None = None) -> Action:
    """The next action for a thread (pure: reads its arguments only).

    With a ``context_budget`` (estimated tokens), a model call over budget is
    preceded by a compaction of the messages before the active turn, at most
    once per turn if it fails.
    """
    if analysis.has_corruption or state.contradiction:
        corrupt = ", ".join(analysis.corrupt) or "the event stream"
        return Stop("corrupt", f"contradictory events ({corrupt}); an operator must inspect the ledger")
    turn = state.active_turn()
    exhausted: list[str] = []
    if turn is not None and turn.interrupt is not None and not turn.steps:
        return InterruptTurn(turn.turn_id, turn.interrupt)
    if turn is not None and turn.status == "needs_reconciliation":
        # An operator fenced out the turn's owner: nothing runs until the open outcomes are established
        # and someone continues the turn (which records a new claim).
        pending = (*analysis.requires_resolution, *analysis.waiting_on_parked)
        return Stop("waiting", f"turn {turn.turn_id} needs reconciliation after recovery"
                    + (f"; resolve {', '.join(pending)} first" if pending else "; continue it or end it"),
                    pending)
    if turn is not None and turn.pause is not None:
        automatic = bool(turn.pause.get("automatic"))
        return Stop("paused", f"paused ({turn.pause.get('reason')}{asked_too_long(turn.pause)}): "
                    + ("retrying automatically after the recorded delay" if automatic
                       else "resume it explicitly (`jixu threads resume`, the API's resume, thread.resume()) once "
                            "the cause is fixed"))
    if turn is not None and turn.steps:
        return _steps_stop(analysis, turn.turn_id)
    if turn is not None:
        ready: list[str] = []
        for effect_id in analysis.not_dispatched:
            if state.effect_turn.get(effect_id) == turn.turn_id:
                ready.append(effect_id)
        for effect_id in analysis.retry_safe_unknown:
            if state.effect_turn.get(effect_id) != turn.turn_id:
                continue
            decision = analysis.decisions[effect_id]
            if decision.kind == "compaction" and (decision.reason == "indeterminate_failure"
                                                  or decision.attempts >= max_attempts):
                continue  # the turn gave up on this summary and goes on with its full context
            if decision.kind == "probe" and decision.attempts >= max_attempts:
                continue  # a probe that never answered: its call goes to an operator
            if decision.kind == "model" and decision.reason == "indeterminate_failure":
                # A recorded provider failure: the pause below decides when (and whether) to call again.
                if turn.failure is None or turn.failure.get("effect_id") != effect_id:
                    ready.append(effect_id)
            elif decision.attempts < max_attempts:
                ready.append(effect_id)
            elif decision.kind == "model":
                return FailTurn(turn.turn_id, {"source": "model", "type": "retries_exhausted",
                                               "message": f"model call {effect_id} failed {decision.attempts} "
                                                          "times with an unknown outcome"})
            else:
                exhausted.append(effect_id)
        if ready:
            return Dispatch(tuple(ready))
    if analysis.requires_resolution or exhausted:
        pending = (*analysis.requires_resolution, *exhausted)
        if turn is not None:
            step = _probe_step(state, analysis, turn.turn_id, pending)
            if step is not None:
                return step
        return Stop("waiting", f"effects with an unknown outcome need an operator's resolution: "
                    f"{', '.join(_with_probe_answer(state, analysis, effect_id) for effect_id in pending)}", pending)
    if analysis.waiting_on_parked:
        return Stop("waiting", f"calls awaiting approval: {', '.join(analysis.waiting_on_parked)}",
                    analysis.waiting_on_parked)
    if turn is None:
        last = state.turns[-1] if state.turns else None
        if last is not None and last.status == "failed":
            return Stop("failed", failure_reason(last.turn_id, last.error))
        return Stop("idle")
    if turn.error is not None:
        return FailTurn(turn.turn_id, turn.error)
    if turn.failure is not None:
        error = turn.failure.get("error") or {}
        kind = str(error.get("kind") or "")
        if kind not in AUTOMATIC_PAUSES | OPERATOR_PAUSES and turn.failure.get("indeterminate"):
            kind = "transient"  # it may have been processed and a retry may succeed: treat as transient
        retry_after = error.get("retry_after")
        delay = float(retry_after) if isinstance(retry_after, int | float) else None
        if kind in AUTOMATIC_PAUSES:
            return PauseTurn(turn.turn_id, kind, delay, turn.auto_retries < MAX_AUTOMATIC_RETRIES,
                             str(turn.failure.get("effect_id")))
        if kind in OPERATOR_PAUSES:
            return PauseTurn(turn.turn_id, kind, delay, False, str(turn.failure.get("effect_id")))
        return FailTurn(turn.turn_id, {"source": "model", **error})
    messages = state.messages
    last_index = next((i for i in range(len(messages) - 1, turn.message_index - 1, -1)
                       if messages[i].get("role") == "assistant"), None)
    if last_index is not None:
        last_assistant = messages[last_index]
        calls = list(last_assistant.get("tool_calls") or [])
        if not calls:
            artifact = last_assistant.get("artifact")
            return CompleteTurn(turn.turn_id, str(last_assistant.get("content") or ""),
                                artifact if isinstance(artifact, dict) else None)
        # Only answers after this message count: a provider may reuse call ids across steps.
        answered = {m.get("tool_call_id") for m in messages[last_index + 1:] if m.get("role") == "tool"}
        unanswered = [c for c in calls if c.get("id") not in answered]
        if unanswered:
            without_intent = tuple(c for c in unanswered if c.get("id") not in state.step_calls)
            if without_intent:
                return RequestTools(turn.turn_id, without_intent)
            return Stop("waiting", "tool calls are still in flight")
    if turn.model_calls >= max_steps:
        return FailTurn(turn.turn_id, {"source": "agent", "type": "max_steps",
                                       "message": f"the turn used all {max_steps} model calls"})
    if (turn.message_index >= MIN_COMPACTED_MESSAGES and not turn.compaction_failed
            and over_budget(messages, context_budget)
            and not any(d.kind == "compaction" and state.effect_turn.get(effect_id) == turn.turn_id
                        for effect_id, d in analysis.decisions.items())):
        # The messages before this turn's input are summarized (its own messages stay whole); an open
        # compaction that may not run again counts as a failed one.
        return RequestCompaction(turn.turn_id, turn.message_index)
    return RequestModel(turn.turn_id)


def _steps_stop(analysis: Analysis, turn_id: str) -> Stop:
    """A durable run (``Harness.durable``): its own code dispatches, retries and probes its steps, so the agent
    loop never acts on it; it says what the run waits for."""
    if analysis.requires_resolution:
        return Stop("waiting", f"durable run {turn_id}: steps with an unknown outcome need an operator's resolution: "
                    f"{', '.join(analysis.requires_resolution)}", analysis.requires_resolution)
    if analysis.waiting_on_parked:
        return Stop("waiting", f"durable run {turn_id}: steps awaiting approval: {', '.join(analysis.waiting_on_parked)}",
                    analysis.waiting_on_parked)
    return Stop("waiting", f"durable run {turn_id} is unfinished: its own code continues it (run it again with "
                "harness.durable(thread_id))")


def probe_record(state: ThreadState, analysis: Analysis, effect_id: str) -> JSONObject | None:
    """The latest probe asked about the current attempt of ``effect_id`` (see ``ThreadState.probes``), or None."""
    decision = analysis.decisions.get(effect_id)
    if decision is None:
        return None
    asked = [r for r in state.probes.get(effect_id, ()) if r.get("attempt") == decision.attempts]
    return asked[-1] if asked else None


def _probe_step(state: ThreadState, analysis: Analysis, turn_id: str, pending: tuple[str, ...]) -> Action | None:
    """Before an operator is asked: record a definite probe answer, or ask the probes not asked yet.

    A call of the active turn whose intent says its tool has a probe, with an
    unknown outcome and no resolution, is asked about once per attempt; a
    definite answer (``occurred`` / ``not_occurred``) becomes its resolution;
    a ``dont_know`` (or a probe that raised, timed out or never answered)
    leaves it to an operator.
    """
    to_ask: list[str] = []
    for effect_id in pending:
        decision = analysis.decisions[effect_id]
        if (decision.kind != "tool" or decision.state != "unknown" or decision.resolution is not None
                or state.effect_turn.get(effect_id) != turn_id):
            continue
        intent = state.intent(effect_id)
        if intent is None or intent.get("probe") is not True:
            continue
        record = probe_record(state, analysis, effect_id)
        if record is None:
            to_ask.append(effect_id)
            continue
        answer = record.get("answer")
        if isinstance(answer, dict) and answer.get("answer") in DEFINITE_ANSWERS:
            evidence = answer.get("evidence")
            key = "found" if answer["answer"] == "occurred" else "searched"
            return ResolveByProbe(effect_id, str(record.get("effect_id")), str(decision.name), str(answer["answer"]),
                                  {"probe_effect_id": record.get("effect_id"),
                                   key: evidence if isinstance(evidence, dict) else {}},
                                  answer.get("result") if answer["answer"] == "occurred" else None)
    return Probe(turn_id, tuple(to_ask)) if to_ask else None


def _with_probe_answer(state: ThreadState, analysis: Analysis, effect_id: str) -> str:
    """``effect_id``, and what its probe answered when one was asked."""
    record = probe_record(state, analysis, effect_id)
    if record is None:
        return effect_id
    answer = record.get("answer")
    if not isinstance(answer, dict):
        return f"{effect_id} (its probe never answered)"
    return f"{effect_id} (its probe does not know: {answer.get('reason')})"


__all__ = ["AUTOMATIC_PAUSES", "MAX_AUTOMATIC_RETRIES", "OPERATOR_PAUSES", "Action", "CompleteTurn", "Dispatch",
           "FailTurn", "InterruptTurn", "PauseTurn", "Probe", "RequestCompaction", "RequestModel", "RequestTools", "ResolveByProbe", "Stop", "decide", "probe_record"]
