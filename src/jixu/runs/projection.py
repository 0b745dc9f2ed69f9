"""The pure side of runs: the projection of a journal, its derived status, and what happens next.

Nothing here does I/O. :class:`RunProjection` folds a run's events into a
:class:`RunRecord`; effect state is never derived here but taken from the
:class:`~jixu.recovery.RecoveryResolver`'s :class:`~jixu.recovery.Analysis` of
the ``task.*`` lifecycle events. From record + analysis (+ who holds the run's
lease, for ``running``/``interrupted``):

* :func:`derive_status` gives the status (:data:`~jixu.runs.model.RUN_STATUSES`)
  and why; it is never stored.
* :func:`decide` gives the engine's next action: record a task intent,
  dispatch one, pause, resume automatically, revise the plan for a repair,
  finish, or stop.
* :func:`expected_workspace` and :func:`compare` say what the workspace must
  look like according to the journal, and whether an observation matches.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from jixu.kernel.loop import asked_too_long
from jixu.ledger.encoding import JSONObject
from jixu.ledger.event import Event
from jixu.recovery import PHASES, Analysis, EffectDecision
from jixu.recovery.corruption import Corruption
from jixu.runs.model import (
    AUTOMATIC_PAUSES,
    MAX_AUTOMATIC_RETRIES,
    MAX_DISPATCHES,
    REQUEST_TASK_KINDS,
    TASK_SEMANTICS,
    PlanView,
    RunState,
    TaskView,
    policy_digest,
)
from jixu.runs.providers import PAUSE_KINDS

REDUCER_VERSION = 4
_RECEIPT_TYPES = frozenset({"task.completed", "task.failed", "task.outcome_resolved"})
_AFTER_FINISH = frozenset({"run.request_admitted", "run.drained", "run.process_stopped", "run.retried"})
"""Besides receipts, what a finished run's journal still records: execution requests (publication of a
succeeded run, say), their remote tasks' lifecycle, the proof that a cancelled run drained, the stopping
of processes it had started, and the one retry of a failed or cancelled run. A process is never started for a
finished run (``run.process_started`` after ``run.finished`` contradicts the record)."""
ENDED: frozenset[str] = frozenset({"gone", "terminated", "killed"})
"""``run.process_stopped`` outcomes after which no process of the group remains."""
_PHASES = frozenset(PHASES)


@dataclass
class RunRecord:
    """Everything the projection knows about one run (mutable; owned by the reducer)."""

    run_id: str = ""
    created: JSONObject | None = None
    providers: list[JSONObject] = field(default_factory=list)
    """Provider snapshots, revision 1, 2, … (``run.created``, then each ``run.handed_off``)."""
    revisions: list[JSONObject] = field(default_factory=list)
    """``plan.revised`` data (plus ``seq``), revision 1, 2, …; never changed once recorded."""
    tasks: dict[str, JSONObject] = field(default_factory=dict)
    """Every task ever planned: ``{task_id, kind, params, revision}`` (the revision that introduced it)."""
    effects: dict[str, JSONObject] = field(default_factory=dict)
    """Task intents by effect id: ``{effect_id, task_id, kind, attempt, revision, args_hash, idempotency_key,
    seq}``."""
    task_effects: dict[str, list[str]] = field(default_factory=dict)
    """Effect ids of each task's attempts, in order."""
    receipts: dict[str, JSONObject] = field(default_factory=dict)
    """The latest ``task.completed``/``task.failed`` data by effect id (plus ``phase`` and ``seq``)."""
    lifecycle: list[Event] = field(default_factory=list)
    """Every ``task.*`` lifecycle event, for the resolver."""
    claims: list[JSONObject] = field(default_factory=list)
    pauses: list[JSONObject] = field(default_factory=list)
    """``run.paused`` data plus ``seq`` and ``closed`` (``None`` while open, else how it ended)."""
    resumes: list[JSONObject] = field(default_factory=list)
    reconciliations: list[JSONObject] = field(default_factory=list)
    handoffs: list[JSONObject] = field(default_factory=list)
    finished: JSONObject | None = None
    requests: dict[str, JSONObject] = field(default_factory=dict)
    """Execution requests admitted against the run (``run.request_admitted`` data plus ``seq``), by request id."""
    drained: list[JSONObject] = field(default_factory=list)
    """``run.drained`` receipts: proof that no worker still executes the run after a cancellation."""
    processes: list[JSONObject] = field(default_factory=list)
    """``run.process_started`` data plus ``seq``: every process group started for a task (an agent CLI, a
    check), recorded before its program ran."""
    stopped: list[JSONObject] = field(default_factory=list)
    """``run.process_stopped`` data plus ``seq``: a drain, a cancellation or a resume stopped (or found gone)
    a recorded group."""
    auto_retries: int = 0
    """Automatic resumes since the last completed implementation, explicit resume or handoff."""
    acknowledged_seq: int = 0
    """Seq of the latest explicit resume or handoff: an operator looked at the run after that point."""
    retried: JSONObject | None = None
    """``run.retried`` data plus ``seq``: the one fresh run (``child_run_id``) retrying this failed or cancelled
    run, named before that run's journal is created."""
    problems: list[str] = field(default_factory=list)
    """Contradictions in the journal (the run then needs reconciliation and never runs)."""
    seq: int = 0
    head_hash: str = ""

    # --- views ---------------------------------------------------------------------------------

    def _created(self, key: str, default: Any = None) -> Any:
        return default if self.created is None else self.created.get(key, default)

    @property
    def project(self) -> str:
        return str(self._created("project", ""))

    @property
    def brief(self) -> str:
        return str(self._created("brief", ""))

    @property
    def source(self) -> JSONObject:
        return dict(self._created("source", {}))

    @property
    def policy(self) -> JSONObject:
        return dict(self._created("policy", {}))

    @property
    def workspace(self) -> str:
        return str(self._created("workspace", ""))

    @property
    def knowledge(self) -> JSONObject:
        """Retrieved context frozen into the run (``{content, digest}``), handed to every provider call."""
        value = self._created("knowledge")
        return dict(value) if isinstance(value, dict) else {}

    @property
    def provider(self) -> JSONObject:
        """The current provider snapshot."""
        return self.providers[-1] if self.providers else {}

    @property
    def plan(self) -> JSONObject | None:
        """The current plan revision."""
        return self.revisions[-1] if self.revisions else None

    @property
    def open_pause(self) -> JSONObject | None:
        if self.pauses and self.pauses[-1]["closed"] is None:
            return self.pauses[-1]
        return None

    @property
    def last_claim_seq(self) -> int:
        return int(self.claims[-1]["seq"]) if self.claims else 0

    @property
    def repairs_used(self) -> int:
        return sum(1 for r in self.revisions if r.get("reason") == "repair")

    @property
    def max_repairs(self) -> int:
        limits = self.policy.get("limits") or {}
        value = limits.get("max_repair_attempts", 1)
        return value if isinstance(value, int) else 1

    @property
    def reconciliation_mismatch(self) -> JSONObject | None:
        """The latest reconciliation when it found a mismatch (no later one found the workspace consistent)."""
        if self.reconciliations and self.reconciliations[-1].get("outcome") == "mismatch":
            return self.reconciliations[-1]
        return None

    def pause_for(self, effect_id: str) -> JSONObject | None:
        """The latest pause recorded for a failed attempt."""
        for pause in reversed(self.pauses):
            if pause.get("effect_id") == effect_id:
                return pause
        return None

    def kind_of(self, effect_id: str) -> str:
        effect = self.effects.get(effect_id)
        return str(effect["kind"]) if effect else ""


def _request_task_event(record: RunRecord, event: Event) -> bool:
    """True for a ``task.*`` event of a task that an execution request admitted (allowed after the finish)."""
    if not event.type.startswith("task."):
        return False
    task_id = event.data.get("task_id")
    if not isinstance(task_id, str):
        effect = record.effects.get(str(event.data.get("effect_id")))
        task_id = None if effect is None else effect.get("task_id")
    task = record.tasks.get(task_id) if isinstance(task_id, str) else None
    return task is not None and "request_id" in task["params"]


def _close_pause(record: RunRecord, by: str, event: Event) -> None:
    pause = record.open_pause
    if pause is not None:
        pause["closed"] = {"by": by, "seq": event.seq, "reason": event.data.get("reason"),
                           "actor": event.data.get("actor")}


class RunProjection:
    """The reducer from a run's events to a :class:`RunRecord` (a :class:`~jixu.ledger.Projection`)."""

    name = "run"
    version = REDUCER_VERSION

    def initial(self) -> RunRecord:
        """The record before any event."""
        return RunRecord()

    def apply(self, record: RunRecord, event: Event) -> RunRecord:
        """Fold ``event`` into ``record`` (mutates and returns it)."""
        record.seq, record.head_hash = event.seq, event.hash
        kind, data = event.type, event.data
        where = f"seq {event.seq} ({kind})"
        if record.created is None and kind != "run.created":
            record.problems.append(f"{where}: recorded before run.created")
            return record
        if record.finished is not None and kind not in _RECEIPT_TYPES and kind not in _AFTER_FINISH \
                and not _request_task_event(record, event):
            record.problems.append(f"{where}: recorded after run.finished")
            return record
        prefix, _dot, phase = kind.rpartition(".")
        if prefix == "task" and phase in _PHASES:
            self._task(record, event, phase, where)
        elif kind == "run.created":
            if record.created is not None:
                record.problems.append(f"{where}: a second run.created")
            elif not isinstance(data.get("policy"), dict) or policy_digest(data["policy"]) != data.get("policy_digest"):
                # The frozen policy is what every check runs: it must be the one its recorded digest names.
                record.problems.append(f"{where}: the frozen policy does not match its policy_digest")
            else:
                record.created = dict(data)
                record.run_id = str(data.get("run_id", ""))
                record.providers = [dict(data.get("provider") or {})]
        elif kind == "plan.revised":
            self._revised(record, event, where)
        elif kind == "run.claimed":
            record.claims.append({**data, "seq": event.seq})
        elif kind == "run.paused":
            if record.open_pause is not None:
                record.problems.append(f"{where}: paused while a pause is open")
            record.pauses.append({**data, "seq": event.seq, "closed": None})
        elif kind == "run.resumed":
            pause = record.open_pause
            if data.get("reason") == "automatic":
                if pause is None or not pause.get("automatic"):
                    record.problems.append(f"{where}: an automatic resume without an open automatic pause")
                record.auto_retries += 1
            else:
                record.auto_retries = 0
                record.acknowledged_seq = event.seq
            _close_pause(record, "resumed", event)
            record.resumes.append({**data, "seq": event.seq})
        elif kind == "run.reconciled":
            record.reconciliations.append({**data, "seq": event.seq})
        elif kind == "run.handed_off":
            snapshot = dict(data.get("provider") or {})
            if snapshot.get("revision") != len(record.providers) + 1:
                record.problems.append(f"{where}: provider revision {snapshot.get('revision')} does not follow "
                                       f"{len(record.providers)}")
            record.providers.append(snapshot)
            record.auto_retries = 0
            record.acknowledged_seq = event.seq
            _close_pause(record, "handed_off", event)
            record.handoffs.append({**data, "seq": event.seq})
        elif kind == "run.finished":
            record.finished = {**data, "seq": event.seq}
        elif kind == "run.request_admitted":
            self._request_admitted(record, event, where)
        elif kind == "run.drained":
            record.drained.append({**data, "seq": event.seq})
        elif kind == "run.process_started":
            if str(data.get("effect_id")) not in record.effects or not isinstance(data.get("process"), dict):
                record.problems.append(f"{where}: a process for unknown task effect {data.get('effect_id')!r}")
            else:
                record.processes.append({**data, "seq": event.seq})
        elif kind == "run.process_stopped":
            record.stopped.append({**data, "seq": event.seq})
        elif kind == "run.retried":
            outcome = (record.finished or {}).get("outcome")
            if record.retried is not None:
                record.problems.append(f"{where}: a second retry (retried as {record.retried.get('child_run_id')})")
            elif outcome not in ("failed", "cancelled"):
                record.problems.append(f"{where}: a retry of a run that is not failed or cancelled "
                                       f"({outcome or 'unfinished'})")
            elif not isinstance(data.get("child_run_id"), str):
                record.problems.append(f"{where}: a retry naming no run")
            else:
                record.retried = {**data, "seq": event.seq}
        return record

    @staticmethod
    def _request_admitted(record: RunRecord, event: Event, where: str) -> None:
        data = event.data
        request_id = data.get("request_id")
        if not isinstance(request_id, str) or request_id in record.requests:
            record.problems.append(f"{where}: a missing or repeated request id {request_id!r}")
            return
        record.requests[request_id] = {**data, "seq": event.seq}
        task_id = data.get("task_id")
        task_kind = REQUEST_TASK_KINDS.get(str(data.get("kind")))
        if task_kind is not None:
            if not isinstance(task_id, str) or task_id in record.tasks:
                record.problems.append(f"{where}: {data.get('kind')} request {request_id} names task {task_id!r}")
                return
            # A remote task outside the plan: executed by its execution request, never by decide().
            record.tasks[task_id] = {"task_id": task_id, "kind": task_kind, "params": {"request_id": request_id},
                                     "revision": None}

    @staticmethod
    def _revised(record: RunRecord, event: Event, where: str) -> None:
        data = event.data
        revision = data.get("revision")
        if revision != len(record.revisions) + 1:
            record.problems.append(f"{where}: plan revision {revision} does not follow {len(record.revisions)}")
        if data.get("provider_revision") != len(record.providers):
            record.problems.append(f"{where}: names provider revision {data.get('provider_revision')}, "
                                   f"the current one is {len(record.providers)}")
        tasks = data.get("tasks")
        if not isinstance(tasks, list) or not tasks:
            record.problems.append(f"{where}: a plan revision without tasks")
            tasks = []
        for task in tasks:
            if not isinstance(task, dict) or task.get("kind") not in TASK_SEMANTICS or not task.get("task_id"):
                record.problems.append(f"{where}: malformed task {task!r}")
                continue
            known = record.tasks.get(str(task["task_id"]))
            if known is None:
                record.tasks[str(task["task_id"])] = {"task_id": task["task_id"], "kind": task["kind"],
                                                      "params": dict(task.get("params") or {}),
                                                      "revision": revision}
            elif known["kind"] != task["kind"]:
                record.problems.append(f"{where}: task {task['task_id']} changed kind")
        record.revisions.append({**data, "seq": event.seq})

    @staticmethod
    def _task(record: RunRecord, event: Event, phase: str, where: str) -> None:
        record.lifecycle.append(event)
        data = event.data
        effect_id = data.get("effect_id")
        if not isinstance(effect_id, str):
            return  # the resolver reports it (unattributed)
        if phase == "requested":
            task_id = data.get("task_id")
            task = record.tasks.get(task_id) if isinstance(task_id, str) else None
            if task is None:
                record.problems.append(f"{where}: an intent for unknown task {task_id!r}")
                return
            attempts = record.task_effects.setdefault(str(task_id), [])
            if data.get("attempt") != len(attempts) + 1 or data.get("name") != task["kind"]:
                record.problems.append(f"{where}: intent {effect_id} is not attempt {len(attempts) + 1} of "
                                       f"{task['kind']} task {task_id}")
            args = data.get("args") or {}
            record.effects[effect_id] = {"effect_id": effect_id, "task_id": task_id, "kind": task["kind"],
                                         "attempt": data.get("attempt"), "revision": args.get("revision"),
                                         "args_hash": data.get("args_hash"),
                                         "idempotency_key": data.get("idempotency_key"), "seq": event.seq}
            attempts.append(effect_id)
        elif phase == "outcome_resolved":
            record.acknowledged_seq = event.seq  # an operator looked at the run after that point
        elif phase in ("completed", "failed"):
            record.receipts[effect_id] = {**data, "phase": phase, "seq": event.seq}
            if phase == "completed" and record.kind_of(effect_id) == "implement":
                record.auto_retries = 0

    def dump(self, state: RunRecord) -> JSONObject:
        """The record as JSON (for a checkpoint)."""
        return {"run_id": state.run_id, "created": state.created, "providers": state.providers,
                "revisions": state.revisions, "tasks": state.tasks, "effects": state.effects,
                "task_effects": state.task_effects, "receipts": state.receipts,
                "lifecycle": [e.to_dict() for e in state.lifecycle], "claims": state.claims,
                "pauses": state.pauses, "resumes": state.resumes, "reconciliations": state.reconciliations,
                "handoffs": state.handoffs, "finished": state.finished, "requests": state.requests,
                "drained": state.drained, "processes": state.processes, "stopped": state.stopped,
                "auto_retries": state.auto_retries,
                "acknowledged_seq": state.acknowledged_seq, "retried": state.retried, "problems": state.problems,
                "seq": state.seq, "head_hash": state.head_hash}

    def load(self, data: JSONObject) -> RunRecord:
        """The record back from :meth:`dump`."""
        return RunRecord(**{**data, "lifecycle": [Event(**e) for e in data["lifecycle"]]})


# --- actions ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Stop:
    """Nothing to do until something outside changes."""

    status: str
    reason: str


@dataclass(frozen=True, slots=True)
class RequestTask:
    """Record the intent of a task's next attempt."""

    task_id: str
    kind: str
    attempt: int


@dataclass(frozen=True, slots=True)
class Dispatch:
    """Dispatch a recorded intent (never dispatched, or retry-safe with an unknown outcome)."""

    effect_id: str
    task_id: str
    kind: str
    attempt: int
    """The dispatch attempt (1, 2, …) of this intent."""


@dataclass(frozen=True, slots=True)
class Pause:
    """A provider refused: pause the run (automatically retried when ``automatic``)."""

    reason: str
    retry_after: float | None
    automatic: bool
    task_id: str
    effect_id: str
    retries_used: int


@dataclass(frozen=True, slots=True)
class AutoResume:
    """An automatic pause is open: wait until ``resume_at`` (store clock) and record the resume."""

    resume_at: float | None


@dataclass(frozen=True, slots=True)
class Revise:
    """Record a new plan revision (a repair: one more implementation and verification)."""

    reason: str
    repair_of: JSONObject


@dataclass(frozen=True, slots=True)
class Finish:
    """Record the run's outcome (for ``succeeded`` the engine first checks the workspace still matches)."""

    outcome: str
    reason: str
    evidence: JSONObject


Action = Stop | RequestTask | Dispatch | Pause | AutoResume | Revise | Finish


def _journal_stop(record: RunRecord, analysis: Analysis) -> Stop | None:
    """Stops that hold whoever owns the run: broken history, finished, a workspace mismatch, unsafe unknowns."""
    if record.created is None:
        return Stop("needs_reconciliation", "the journal has no run.created")
    if record.problems or analysis.has_corruption:
        what = "; ".join(record.problems[:3]) or f"contradictory task events {list(analysis.corrupt)}" + (
            f", chain broken at seq {analysis.chain_break_seq}" if analysis.chain_break_seq else "")
        return Stop("corrupt", f"the journal is broken or contradicts itself: {what}")
    if record.finished is not None:
        return Stop(str(record.finished.get("outcome")), str(record.finished.get("reason") or ""))
    mismatch = record.reconciliation_mismatch
    if mismatch is not None:
        details = "; ".join(str(d) for d in mismatch.get("details") or [])
        return Stop("needs_reconciliation", f"the workspace does not match the journal ({details}); restore it "
                                            "and resume, or cancel and retry")
    if analysis.requires_resolution:
        return Stop("needs_reconciliation", "remote task outcomes are unknown: "
                    f"{', '.join(analysis.requires_resolution)}; establish them from the provider first")
    return None


def _unknown(record: RunRecord, analysis: Analysis) -> list[EffectDecision]:
    return [d for eid, d in analysis.decisions.items() if d.state == "unknown" and d.resolution is None
            and eid in record.effects]


def _failure_message(error: JSONObject) -> str:
    return str(error.get("message") or error.get("type") or "failed")


def _operator_pause(pause: JSONObject) -> str:
    """The reason of a pause an operator ends (what :func:`decide` stops on and :func:`derive_status` shows)."""
    return f"{pause.get('reason')}{asked_too_long(pause)}: waiting for an explicit resume or a handoff"


def decide(record: RunRecord, analysis: Analysis) -> Action:
    """The next action for a run (pure: reads its arguments only)."""
    stop = _journal_stop(record, analysis)
    if stop is not None:
        return stop
    pause = record.open_pause
    if pause is not None:
        if pause.get("automatic"):
            resume_at = pause.get("resume_at")
            return AutoResume(float(resume_at) if isinstance(resume_at, int | float) else None)
        return Stop("paused", _operator_pause(pause))
    plan = record.plan
    if plan is None:
        return Stop("needs_reconciliation", "the journal has no plan")
    tasks = [record.tasks[str(t["task_id"])] for t in plan["tasks"] if str(t.get("task_id")) in record.tasks]
    for index, task in enumerate(tasks):
        task_id, kind = str(task["task_id"]), str(task["kind"])
        effects = record.task_effects.get(task_id, [])
        if not effects:
            return RequestTask(task_id, kind, 1)
        effect_id = effects[-1]
        decision = analysis.decisions.get(effect_id)
        if decision is None:
            return Stop("needs_reconciliation", f"no resolver decision for task {task_id}'s intent {effect_id}")
        if decision.state == "not_dispatched":
            return Dispatch(effect_id, task_id, kind, decision.attempts + 1)
        if decision.state == "unknown":
            resolved = (decision.resolution or {}).get("resolution")
            if resolved == "not_occurred":
                return RequestTask(task_id, kind, len(effects) + 1)  # a new attempt under a new effect id
            if resolved == "abandoned_unknown":
                return Finish("failed", f"the outcome of {kind} task {task_id} ({effect_id}) was abandoned as "
                              "unknown by an operator", {"task_id": task_id, "effect_id": effect_id,
                                                          "resolution": decision.resolution})
            if resolved is not None:
                return Stop("needs_reconciliation", f"{kind} task {task_id} ({effect_id}) was resolved as "
                            f"{resolved!r}, which a {kind} task cannot continue from")
            if decision.retry_safe and decision.attempts < MAX_DISPATCHES:
                return Dispatch(effect_id, task_id, kind, decision.attempts + 1)
            return Stop("needs_reconciliation", f"{kind} task {task_id} ({effect_id}) was dispatched "
                        f"{decision.attempts} time(s) without a receipt ({decision.reason}); establish what "
                        "happened in the workspace first")
        if decision.state != "completed":
            return Stop("needs_reconciliation", f"{kind} task {task_id} is {decision.state} ({decision.reason})")
        receipt = record.receipts.get(effect_id) or {}
        if decision.reason == "succeeded":
            result = receipt.get("result") or {}
            if kind == "implement" and result.get("disallowed_paths"):
                return Finish("failed", "the implementation changed paths outside the policy's allowed_paths: "
                              f"{result['disallowed_paths']}", {"task_id": task_id, "effect_id": effect_id,
                                                                "disallowed_paths": result["disallowed_paths"]})
            if kind == "verify" and not result.get("passed") and index == len(tasks) - 1:
                failing = [c.get("name") for c in result.get("checks") or [] if not c.get("passed")]
                if record.repairs_used < record.max_repairs:
                    return Revise("repair", {"task_id": task_id, "effect_id": effect_id, "failing": failing,
                                             "tree": result.get("tree"), "checks": result.get("checks")})
                return Finish("failed", f"checks {failing} failed after {record.repairs_used} repair attempt(s)",
                              {"task_id": task_id, "effect_id": effect_id, "checks": result.get("checks"),
                               "tree": result.get("tree")})
            continue
        error = receipt.get("error") or {}
        provider_kind = error.get("kind") if error.get("type") == "provider_error" else None
        if provider_kind in PAUSE_KINDS:
            recorded = record.pause_for(effect_id)
            if recorded is None:
                retry_after = error.get("retry_after")
                automatic = provider_kind in AUTOMATIC_PAUSES and record.auto_retries < MAX_AUTOMATIC_RETRIES
                return Pause(str(provider_kind), float(retry_after) if isinstance(retry_after, int | float)
                             else None, automatic, task_id, effect_id, record.auto_retries)
            return RequestTask(task_id, kind, len(effects) + 1)  # the pause ended: the next attempt
        return Finish("failed", f"{kind} task {task_id} failed: {_failure_message(error)}",
                      {"task_id": task_id, "effect_id": effect_id, "error": error})
    return _final(record, tasks)


def _latest_result(record: RunRecord, tasks: list[JSONObject], kind: str) -> tuple[str, str, JSONObject] | None:
    for task in reversed(tasks):
        if task["kind"] == kind and record.task_effects.get(str(task["task_id"])):
            effect_id = record.task_effects[str(task["task_id"])][-1]
            receipt = record.receipts.get(effect_id) or {}
            if receipt.get("phase") == "completed":
                return str(task["task_id"]), effect_id, dict(receipt.get("result") or {})
    return None


def _final(record: RunRecord, tasks: list[JSONObject]) -> Action:
    """Every task of the plan has a receipt: did the final checks pass on the implemented snapshot?"""
    verified = _latest_result(record, tasks, "verify")
    if verified is None or tasks[-1]["kind"] != "verify":
        return Finish("failed", "the plan ended without a verification", {})
    verify_task, verify_effect, result = verified
    implemented = _latest_result(record, tasks, "implement")
    checks = [{k: c.get(k) for k in ("name", "exit_status", "timed_out", "duration_s", "output_digest")}
              for c in result.get("checks") or []]
    evidence: JSONObject = {"verify_task_id": verify_task, "verify_effect_id": verify_effect, "checks": checks,
                            "source": {**record.source, "head": result.get("head"), "tree": result.get("tree")}}
    if implemented is not None:
        evidence["implement"] = {"task_id": implemented[0], "effect_id": implemented[1],
                                 "tree": implemented[2].get("tree"),
                                 "changed_paths": implemented[2].get("changed_paths"),
                                 "diff_digest": implemented[2].get("diff_digest")}
    if not result.get("passed"):
        return Finish("failed", "the final checks did not pass", evidence)
    if result.get("tree_after") != result.get("tree"):
        return Finish("failed", f"the checks changed the workspace (tree {result.get('tree')} became "
                      f"{result.get('tree_after')}): the verified snapshot is not the final one", evidence)
    if implemented is not None and implemented[2].get("tree") != result.get("tree"):
        return Finish("failed", f"the checks ran on tree {result.get('tree')}, not on the implemented tree "
                      f"{implemented[2].get('tree')}", evidence)
    return Finish("succeeded", f"all {len(checks)} checks passed on tree {result.get('tree')}", evidence)


# --- status -------------------------------------------------------------------------------------

OWNERSHIP = ("live", "stale", "released", "none")
"""Who holds the run's lease, as the caller observed it: ``live`` (a process is executing the run),
``stale`` (the holder stopped renewing it: expired, or this very owner name restarted), ``released``
(given back), ``none`` (never claimed)."""


def derive_status(record: RunRecord, analysis: Analysis, ownership: str) -> tuple[str, str]:
    """The run's status and why (pure): the journal's stops first, then the lease, then :func:`decide`."""
    stop = _journal_stop(record, analysis)
    if stop is not None:
        return stop.status, stop.reason
    pause = record.open_pause
    if pause is not None:
        if pause.get("automatic"):
            return "paused", (f"{pause.get('reason')}: automatic retry {record.auto_retries + 1} of "
                              f"{MAX_AUTOMATIC_RETRIES} after {pause.get('delay')}s")
        return "paused", _operator_pause(pause)
    if ownership == "live":
        return "running", ""
    unknown = _unknown(record, analysis)
    if record.claims and record.acknowledged_seq < record.last_claim_seq and (ownership == "stale" or unknown):
        what = ", ".join(f"{record.kind_of(d.effect_id)} ({d.effect_id})" for d in unknown)
        return "interrupted", ("the worker stopped before completion" + (f" with {what} in flight" if what else "")
                               + "; inspect the workspace and journal, then resume")
    action = decide(record, analysis)
    if isinstance(action, Stop):
        return action.status, action.reason
    if not record.effects:
        return "queued", "created; waiting for a worker"
    return "queued", "ready to continue; waiting for a worker"


# --- the processes a run started ----------------------------------------------------------------


def _same_process(a: object, b: object) -> bool:
    keys = ("boot_id", "pid_namespace", "pid", "start_time")
    return isinstance(a, dict) and isinstance(b, dict) and all(a.get(k) == b.get(k) for k in keys)


def open_processes(record: RunRecord) -> list[JSONObject]:
    """The recorded process groups that may still run (pure): those of a task attempt without a receipt (the
    executor records a receipt only once its processes ended) that no ``run.process_stopped`` found ended."""
    return [started for started in record.processes
            if str(started.get("effect_id")) not in record.receipts
            and not any(stop.get("outcome") in ENDED and _same_process(stop.get("process"), started.get("process"))
                        for stop in record.stopped)]


# --- the workspace according to the journal ---------------------------------------------------


def _workspace_evidence(receipt: JSONObject, kind: str) -> JSONObject | None:
    if receipt.get("phase") == "completed":
        result = receipt.get("result") or {}
        tree = result.get("tree_after", result.get("tree")) if kind == "verify" else result.get("tree")
        head = result.get("head")
    else:
        workspace = receipt.get("workspace") or {}
        tree, head = workspace.get("tree"), workspace.get("head")
    if isinstance(tree, str) and isinstance(head, str):
        return {"head": head, "tree": tree}
    return None


def expected_workspace(record: RunRecord, analysis: Analysis) -> JSONObject:
    """What the workspace must look like according to the journal (pure).

    Before a completed prepare: absent, or the source commit checked out
    cleanly from the authorized origin. After: the authorized origin, and the
    HEAD and tree of the latest receipt that observed them; while an
    implementation's outcome is unknown its partial files are expected, so the
    tree may differ (HEAD may not).
    """
    source = record.source
    expected: JSONObject = {"workspace": record.workspace, "origin": source.get("origin"),
                            "head": source.get("commit"), "tree": None, "prepared": False, "may_be_absent": True,
                            "clean": True, "basis": None, "tree_may_differ": False}
    basis: tuple[int, str, JSONObject] | None = None
    prepared = False
    for effect_id, receipt in record.receipts.items():
        kind = record.kind_of(effect_id)
        if kind == "prepare" and receipt.get("phase") == "completed":
            prepared = True
        seen = _workspace_evidence(receipt, kind)
        if seen is not None and (basis is None or int(receipt["seq"]) > basis[0]):
            basis = (int(receipt["seq"]), effect_id, seen)
    if not prepared or basis is None:
        return expected
    in_flight = any(record.kind_of(d.effect_id) == "implement" for d in _unknown(record, analysis))
    expected.update({"prepared": True, "may_be_absent": False, "clean": False, "head": basis[2]["head"],
                     "tree": None if in_flight else basis[2]["tree"], "basis": basis[1],
                     "tree_may_differ": in_flight})
    return expected


def compare(evidence: JSONObject, expected: JSONObject) -> tuple[str, list[str]]:
    """``("consistent" | "mismatch", details)``: does an observation of the workspace match the journal?"""
    if not evidence.get("exists"):
        if expected.get("may_be_absent"):
            return "consistent", ["the workspace does not exist yet"]
        return "mismatch", [f"the workspace {expected.get('workspace')} is missing"]
    details: list[str] = []
    if evidence.get("git_root") != expected.get("workspace"):
        details.append(f"git root is {evidence.get('git_root')!r}, expected {expected.get('workspace')!r}")
    if evidence.get("origin") != expected.get("origin"):
        details.append(f"origin is {evidence.get('origin')!r}, not the authorized {expected.get('origin')!r}")
    if evidence.get("head") != expected.get("head"):
        details.append(f"HEAD is {evidence.get('head')}, the journal says {expected.get('head')}")
    if expected.get("tree") is not None and evidence.get("tree") != expected.get("tree"):
        details.append(f"the source tree is {evidence.get('tree')}, the journal says {expected.get('tree')}")
    if expected.get("clean") and evidence.get("dirty"):
        details.append("changes in a workspace whose preparation never completed")
    return ("mismatch" if details else "consistent"), details


# --- the public view -----------------------------------------------------------------------------


def _task_status(record: RunRecord, analysis: Analysis, task_id: str) -> str:
    effects = record.task_effects.get(task_id)
    if not effects:
        return "pending"
    decision = analysis.decisions.get(effects[-1])
    if decision is None:
        return "blocked"
    if decision.state == "not_dispatched":
        return "ready"
    if decision.state == "unknown":
        return "unknown"
    if decision.state == "completed":
        return "done" if decision.reason == "succeeded" else "failed"
    return "blocked"


def task_views(record: RunRecord, analysis: Analysis, task_ids: list[str]) -> tuple[TaskView, ...]:
    """The views of ``task_ids`` with every attempt and its resolver decision."""
    views: list[TaskView] = []
    for task_id in task_ids:
        task = record.tasks.get(task_id)
        if task is None:
            continue
        attempts: list[JSONObject] = []
        evidence: JSONObject | None = None
        for effect_id in record.task_effects.get(task_id, []):
            effect = record.effects[effect_id]
            decision = analysis.decisions.get(effect_id)
            receipt = record.receipts.get(effect_id)
            attempts.append({"effect_id": effect_id, "attempt": effect["attempt"], "revision": effect["revision"],
                             "decision": decision.to_dict() if decision else None, "receipt": receipt})
            if receipt is not None and receipt.get("phase") == "completed":
                evidence = receipt.get("result")
        views.append(TaskView(task_id, str(task["kind"]), dict(task["params"]), int(task["revision"] or 0),
                              _task_status(record, analysis, task_id), tuple(attempts), evidence))
    return tuple(views)


def plan_view(record: RunRecord, analysis: Analysis) -> PlanView:
    """The current plan revision with its tasks' states; earlier revisions as recorded."""
    plan = record.plan or {"revision": 0, "provider_revision": 0, "reason": "", "tasks": []}
    ids = [str(t.get("task_id")) for t in plan["tasks"]]
    return PlanView(int(plan["revision"]), int(plan["provider_revision"]), str(plan["reason"]),
                    task_views(record, analysis, ids), tuple(dict(r) for r in record.revisions))


def lineage(record: RunRecord) -> JSONObject:
    """``parent_run_id`` (what this run retries) and, once it was retried, ``retried_as`` (the run retrying it)."""
    created = record.created or {}
    found: JSONObject = {"parent_run_id": created.get("parent_run_id")}
    if record.retried is not None:
        found["retried_as"] = record.retried.get("child_run_id")
    return found


def build_state(record: RunRecord, analysis: Analysis, status: str, reason: str,
                owner: JSONObject | None, corrupt: Corruption | None = None) -> RunState:
    """The public :class:`~jixu.runs.model.RunState` (pure); ``corrupt``: the journal's corruption verdict."""
    created = record.created or {}
    return RunState(
        run_id=record.run_id, project=record.project, brief=record.brief, status=status, reason=reason,
        source=record.source, provider=dict(record.provider), providers=tuple(dict(p) for p in record.providers),
        policy=record.policy, policy_digest=str(created.get("policy_digest", "")), workspace=record.workspace,
        plan=plan_view(record, analysis), pauses=tuple(dict(p) for p in record.pauses),
        automatic_retries_used=record.auto_retries, repairs_used=record.repairs_used,
        reconciliations=tuple(dict(r) for r in record.reconciliations), finished=record.finished,
        lineage=lineage(record), owner=owner, seq=record.seq,
        head_hash=record.head_hash, problems=tuple(record.problems), analysis=analysis, corruption=corrupt)


__all__ = [
    "ENDED",
    "OWNERSHIP",
    "Action",
    "AutoResume",
    "Dispatch",
    "Finish",
    "Pause",
    "RequestTask",
    "Revise",
    "RunProjection",
    "RunRecord",
    "Stop",
    "build_state",
    "compare",
    "decide",
    "derive_status",
    "expected_workspace",
    "lineage",
    "open_processes",
    "plan_view",
    "task_views",
]
