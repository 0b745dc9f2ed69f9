"""Execution requests: publication and cancellation of a run, admitted, executed and reconciled on evidence.

A request (stream ``request/<id>``) keeps what was admitted — the run, the
kind, the admitted source (origin, commit, verified tree), the actor, the
attempt — and its own hash-chained lifecycle, classified by the
:class:`~jixu.recovery.RecoveryResolver` like any effect:

* ``request.admitted``; then the intent ``<kind>.requested`` (``publication``
  or ``cancellation``), the dispatch marker ``<kind>.dispatched`` recorded
  *before* the effect, and the receipt ``<kind>.completed`` / ``<kind>.failed``
  with what was observed *after* it. An interruption between dispatch and
  receipt leaves the request ``needs_reconciliation``; nothing ever dispatches
  it again (publication and cancellation are ``unsafe``).
* A publication is also a remote ``publish`` task in the run's journal: the
  run records its own immutable intent (branch, commit, tree) before the
  request's dispatch marker and its own receipt (branch, pushed commit, pull
  request) before the request's receipt. That second, independent record is
  what reconciliation may use as proof when the request's receipt is missing.
* A cancellation finishes the run (``run.finished`` naming the request) and is
  complete only with a ``run.drained`` receipt: written by the process that
  was executing the run when it stopped, or by the request's worker after it
  saw that no process holds the run's lease any more.

Rules (SPEC section 5):

* A rejection before dispatch (:class:`~jixu.runs.publication.PublicationRejected`)
  settles the request as ``failed``; a failure after dispatch keeps the
  outcome unknown whatever the error says.
* Publication is admitted only for a succeeded run under the project's current
  authority, while no earlier publication is unresolved or succeeded, at most
  :data:`MAX_PUBLICATION_ATTEMPTS` times.
* :meth:`ExecutionRequests.reconcile` takes a reconciliation id and nothing
  else: the caller cannot assert an outcome. It rechecks project authority and
  matches retained, immutable evidence to the admitted and current source; it
  calls no provider and repeats nothing. Without proof the finding is retained
  and :class:`~jixu.errors.ReconciliationNeedsProof` is raised (HTTP 409).
  The same id returns the retained result; a different id after a settling
  reconciliation is :class:`~jixu.errors.AlreadyReconciled`.
* An unknown publication is never settled by mutable state (the branch on the
  origin, the run's status): an operator runs :meth:`ExecutionRequests.inspect_remote`
  (read-only at the provider, the finding retained as ``request.inspected``)
  and then records an outcome resolution that cites it.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

from jixu.errors import (
    AlreadyReconciled,
    ConcurrencyError,
    GitError,
    InvalidInput,
    JixuError,
    ProjectNotFound,
    ReceiptConflict,
    ReconciliationNeedsProof,
    RequestCorrupt,
    RequestNotFound,
    RequestStateError,
    RunStateError,
    UnknownProvider,
)
from jixu.kernel import Outcome, StreamWriter, marker, perform, record
from jixu.ledger import Event, NewEvent, Store, new_id, project
from jixu.ledger.encoding import JSONObject, canonical_text, content_hash
from jixu.ledger.ids import is_valid_id
from jixu.ledger.store import Lease
from jixu.ledger.trust import record_break
from jixu.recovery import Analysis, EffectDecision, RecoveryResolver
from jixu.recovery.corruption import Corruption, corruption
from jixu.recovery.resolutions import admit_resolution, resolution_body
from jixu.runs.journal import RunLog
from jixu.runs.model import REQUEST_TASK_KINDS, check_text, get_project, run_lease_key
from jixu.runs.projection import derive_status
from jixu.runs.publication import PublicationContext, Publisher, RemoteRejected
from jixu.runs.remote import REMOTE_TASK_KINDS, RemoteContext, RemoteProvider
from jixu.runs.workspace import check_branch, commit_tree

REQUEST_PREFIX: Final = "request/"
REMOTE_REQUEST_KINDS: Final = ("publication", *REMOTE_TASK_KINDS)
"""Requests that are remote effects: each is also a remote task (``publish``, ``deploy``, …) in the run's journal."""
REQUEST_KINDS: Final = (*REMOTE_REQUEST_KINDS, "cancellation")
REQUEST_STATUSES: Final = ("pending", "in_progress", "succeeded", "failed", "needs_reconciliation", "abandoned",
                           "corrupt")
"""``pending``: admitted, not dispatched yet; ``in_progress``: a cancellation finished the run and waits for
the process executing it to stop; ``needs_reconciliation``: dispatched without a terminal receipt;
``abandoned``: an operator accepted the uncertainty (``abandoned_unknown``)."""
SETTLED: Final = frozenset({"succeeded", "failed", "abandoned"})
MAX_PUBLICATION_ATTEMPTS: Final = 3
RECONCILIATION_ID: Final = re.compile(r"^[0-9a-f]{32}$")
DEFAULT_DRAIN_TIMEOUT: Final = 60.0


def request_stream(request_id: str) -> str:
    """The stream of an execution request."""
    return f"{REQUEST_PREFIX}{request_id}"


def request_work_key(request_id: str) -> str:
    """The work-queue key of an execution request (the same text as its stream's name)."""
    return f"{REQUEST_PREFIX}{request_id}"


def request_id_of(key: str) -> str | None:
    """The request id a work key names, or ``None`` for another kind of work."""
    return key[len(REQUEST_PREFIX):] if key.startswith(REQUEST_PREFIX) and len(key) > len(REQUEST_PREFIX) else None


# --- projection ---------------------------------------------------------------------------------


@dataclass
class RequestRecord:
    """Everything the projection knows about one execution request."""

    request_id: str = ""
    admitted: JSONObject | None = None
    admitted_at: str = ""
    effect_id: str | None = None
    intent: JSONObject | None = None
    receipt: JSONObject | None = None
    lifecycle: list[Event] = field(default_factory=list)
    reconciliations: list[JSONObject] = field(default_factory=list)
    inspections: list[JSONObject] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    seq: int = 0
    head_hash: str = ""

    @property
    def kind(self) -> str:
        return str((self.admitted or {}).get("kind", ""))

    @property
    def run_id(self) -> str:
        return str((self.admitted or {}).get("run_id", ""))

    @property
    def settling_reconciliation(self) -> JSONObject | None:
        """The reconciliation that settled the request, if one did."""
        return next((r for r in self.reconciliations if r.get("settled")), None)


class RequestProjection:
    """The reducer from a request's events to a :class:`RequestRecord`."""

    name = "request"
    version = 1

    def initial(self) -> RequestRecord:
        """The record before any event."""
        return RequestRecord()

    def apply(self, record: RequestRecord, event: Event) -> RequestRecord:
        """Fold ``event`` into ``record``."""
        record.seq, record.head_hash = event.seq, event.hash
        kind, data, where = event.type, event.data, f"seq {event.seq} ({event.type})"
        if record.admitted is None and kind != "request.admitted":
            record.problems.append(f"{where}: recorded before request.admitted")
            return record
        prefix, _dot, phase = kind.rpartition(".")
        if prefix in REQUEST_KINDS:
            if prefix != record.kind:
                record.problems.append(f"{where}: a {prefix} event in a {record.kind} request")
                return record
            record.lifecycle.append(event)
            if phase == "requested":
                record.effect_id, record.intent = str(data.get("effect_id")), dict(data)
            elif phase in ("completed", "failed"):
                record.receipt = {**data, "phase": phase, "seq": event.seq, "event_id": event.id}
        elif kind == "request.admitted":
            if record.admitted is not None:
                record.problems.append(f"{where}: a second request.admitted")
            else:
                record.admitted, record.request_id = dict(data), str(data.get("request_id"))
                record.admitted_at = event.recorded_at
        elif kind == "request.reconciled":
            record.reconciliations.append({**data, "seq": event.seq, "event_id": event.id})
        elif kind == "request.inspected":
            record.inspections.append({**data, "seq": event.seq, "event_id": event.id})
        return record

    def dump(self, state: RequestRecord) -> JSONObject:
        """The record as JSON (requests are short: never checkpointed, but the protocol asks for it)."""
        return {"request_id": state.request_id, "admitted": state.admitted, "admitted_at": state.admitted_at,
                "effect_id": state.effect_id, "intent": state.intent, "receipt": state.receipt,
                "lifecycle": [e.to_dict() for e in state.lifecycle], "reconciliations": state.reconciliations,
                "inspections": state.inspections, "problems": state.problems, "seq": state.seq,
                "head_hash": state.head_hash}

    def load(self, data: JSONObject) -> RequestRecord:
        """The record back from :meth:`dump`."""
        return RequestRecord(**{**data, "lifecycle": [Event(**e) for e in data["lifecycle"]]})


def request_status(record: RequestRecord, analysis: Analysis) -> tuple[str, str]:
    """The request's status and why (pure): from the resolver's decision about its one effect."""
    if record.problems or analysis.has_corruption:
        return "corrupt", "; ".join(record.problems[:3]) or f"contradictory events {list(analysis.corrupt)}"
    settled = record.settling_reconciliation
    decision = analysis.decisions.get(record.effect_id or "")
    if decision is None:
        return "pending", "admitted; waiting for a worker"
    if decision.state == "not_dispatched":
        return "pending", "intent recorded; not dispatched yet"
    if decision.state == "completed":
        receipt = record.receipt or {}
        error = receipt.get("error") or {}
        if decision.reason == "succeeded":
            return "succeeded", "terminal receipt recorded by the worker"
        if decision.reason == "rejected_before_dispatch":
            return "failed", f"rejected before dispatch: {error.get('message', '')}"
        return "failed", f"failed: {error.get('message', '')}"
    if decision.state == "unknown":
        resolution = decision.resolution or {}
        outcome = resolution.get("resolution")
        if outcome == "occurred":
            how = "reconciliation " + str(settled.get("reconciliation_id")) if settled else "an operator"
            return "succeeded", f"proved by {how}"
        if outcome == "not_occurred":
            return "failed", f"an operator established it did not happen ({resolution.get('note') or 'no note'})"
        if outcome == "abandoned_unknown":
            return "abandoned", "an operator accepted that the outcome stays unknown"
        return "needs_reconciliation", (f"dispatched without a terminal receipt ({decision.reason}); reconcile it "
                                        "or inspect the provider")
    return "corrupt", f"unexpected effect state {decision.state}"


@dataclass(frozen=True)
class ExecutionRequestView:
    """An execution request as users see it: derived from its stream, never stored."""

    request_id: str
    run_id: str
    kind: str
    attempt: int
    status: str
    reason: str
    actor: str
    admitted_source: JSONObject
    target: JSONObject
    intent: JSONObject | None
    receipt: JSONObject | None
    reconciliations: tuple[JSONObject, ...]
    inspections: tuple[JSONObject, ...]
    decision: JSONObject | None
    seq: int
    head_hash: str
    chain_valid: bool
    corruption: JSONObject | None = None
    """Why the request is corrupt (first bad seq, reason), when it is."""

    def to_dict(self) -> JSONObject:
        """A JSON-ready dict."""
        return {"request_id": self.request_id, "run_id": self.run_id, "kind": self.kind, "attempt": self.attempt,
                "status": self.status, "reason": self.reason, "actor": self.actor,
                "admitted_source": self.admitted_source, "target": self.target, "intent": self.intent,
                "receipt": self.receipt, "reconciliations": list(self.reconciliations),
                "inspections": list(self.inspections), "decision": self.decision, "seq": self.seq,
                "head_hash": self.head_hash, "chain_valid": self.chain_valid, "corruption": self.corruption}


class RequestLog:
    """One request's stream in a store: load, sync, append, analyse."""

    def __init__(self, store: Store, request_id: str) -> None:
        if not isinstance(request_id, str) or not is_valid_id(request_id):
            raise InvalidInput(f"request id {request_id!r} is not a valid id", field="request_id")
        self.store, self.request_id, self.stream = store, request_id, request_stream(request_id)
        if store.stream_info(self.stream) is None:
            raise RequestNotFound(f"no execution request {request_id} in {store.url}", request_id=request_id)
        projected = project(store, self.stream, RequestProjection(), use_checkpoint=False)  # the whole chain
        if not projected.chain.valid:
            record_break(store, projected.chain)  # kept for every later opening
        self.chain = projected.chain
        """The ledger's verdict on the request's chain when it was loaded (it is read whole: no checkpoint)."""
        self.writer: StreamWriter[RequestRecord] = StreamWriter(
            store, self.stream, RequestProjection(), projected.state,
            chain_break=None if projected.chain.valid else projected.chain.first_bad_seq)
        """The kernel's writer of the request's stream."""

    @property
    def record(self) -> RequestRecord:
        """The projected record (durable events only)."""
        return self.writer.state

    @property
    def chain_break(self) -> int | None:
        """The first seq whose hash link is broken, once one was seen."""
        return self.writer.chain_break

    def sync(self) -> None:
        """Apply events appended since this record's head."""
        self.writer.sync()

    def append(self, events: list[NewEvent]) -> list[Event]:
        """Append after this record's head (receipts kept across another writer's events; anything else meets
        :class:`~jixu.errors.ConcurrencyError`). Nothing is appended to a corrupt request."""
        self.open_to_act()
        return self.writer.append(events)

    def corruption(self) -> Corruption | None:
        """The request's corruption verdict (:func:`jixu.recovery.corruption.corruption`), or ``None``."""
        analysis = self.analysis()
        if self.chain.valid and self.chain_break is None and not self.record.problems and not analysis.has_corruption:
            return None
        seqs = {event.id: event.seq for event in self.record.lifecycle}
        return corruption(self.stream, chain=self.chain, analysis=analysis, chain_break_seq=self.chain_break,
                          problems=self.record.problems, seq_of=seqs.get)

    def open_to_act(self) -> None:
        """The line every operation on the request crosses first (execute, inspect, resolve, reconcile):
        :class:`~jixu.errors.RequestCorrupt` (first bad seq, reason) when it is corrupt; nothing is appended."""
        found = self.corruption()
        if found is not None:
            raise RequestCorrupt(f"execution request {self.request_id} is corrupt: {found.summary()}. Nothing acts "
                                 "on it", request_id=self.request_id, stream=found.stream_name,
                                 first_bad_seq=found.first_bad_seq, reason=found.reason, detail=found.detail)

    def analysis(self) -> Analysis:
        """The resolver's answer for the request's effect."""
        return RecoveryResolver.analyze(self.record.lifecycle, check_links=False, chain_break_seq=self.chain_break)

    def decision(self) -> EffectDecision | None:
        return self.analysis().decisions.get(self.record.effect_id or "")

    def status(self) -> tuple[str, str]:
        found = self.corruption()
        if found is not None:
            return "corrupt", found.summary()
        return request_status(self.record, self.analysis())

    def view(self) -> ExecutionRequestView:
        """The request as users see it."""
        analysis = self.analysis()
        found = self.corruption()
        status, reason = ("corrupt", f"{found.summary()}; nothing acts on it") if found is not None else (
            request_status(self.record, analysis))
        admitted = self.record.admitted or {}
        decision = analysis.decisions.get(self.record.effect_id or "")
        return ExecutionRequestView(
            request_id=self.request_id, run_id=self.record.run_id, kind=self.record.kind,
            attempt=int(admitted.get("attempt") or 1), status=status, reason=reason,
            actor=str(admitted.get("actor", "")), admitted_source=dict(admitted.get("source") or {}),
            target=dict(admitted.get("target") or {}), intent=self.record.intent, receipt=self.record.receipt,
            reconciliations=tuple(self.record.reconciliations), inspections=tuple(self.record.inspections),
            decision=None if decision is None else decision.to_dict(), seq=self.record.seq,
            head_hash=self.record.head_hash, chain_valid=self.chain.valid and self.chain_break is None,
            corruption=None if found is None else found.to_dict())

    @staticmethod
    def meta(actor: str, run_id: str, request_id: str) -> JSONObject:
        return {"actor": actor, "run_id": run_id, "request_id": request_id}


def _intent(name: str, args: JSONObject, effect_id: str) -> JSONObject:
    """An unsafe intent's data: a retry could repeat the effect, so an unknown outcome waits for evidence."""
    return {"effect_id": effect_id, "name": name, "args": args, "args_hash": content_hash(args),
            "semantics": "unsafe", "idempotency_key": f"jixu:{effect_id}", "requires_approval": False}


def _git_time(recorded_at: str) -> str:
    """An event's ``recorded_at`` as a git date (seconds since the epoch, UTC)."""
    moment = datetime.fromisoformat(recorded_at.replace("Z", "+00:00"))
    return f"{int(moment.replace(tzinfo=moment.tzinfo or UTC).timestamp())} +0000"


class ExecutionRequests:
    """Admit, execute, list, inspect and reconcile a store's execution requests (used through :class:`Runs`)."""

    def __init__(self, store: Store, publishers: Mapping[str, Publisher], *, owner: str, actor: str,
                 remotes: Mapping[str, RemoteProvider] | None = None, drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
                 poll_interval: float = 0.2) -> None:
        self.store = store
        self.publishers = dict(publishers)
        self.remotes = dict(remotes or {})
        self.owner = owner
        self.actor = actor
        self.drain_timeout = float(drain_timeout)
        self.poll_interval = float(poll_interval)

    # --- reading -------------------------------------------------------------------------------

    def _acting(self, run_id: str, request_id: str) -> tuple[RunLog, RequestLog]:
        """:meth:`_request`, for an operation that writes: both streams must hold (RunCorrupt, RequestCorrupt)."""
        run, log = self._request(run_id, request_id)
        run.open_to_act()
        log.open_to_act()
        return run, log

    def _request(self, run_id: str, request_id: str) -> tuple[RunLog, RequestLog]:
        run = RunLog(self.store, run_id)
        if not isinstance(request_id, str) or request_id not in run.record.requests:
            if isinstance(request_id, str) and not is_valid_id(request_id):
                raise InvalidInput(f"request id {request_id!r} is not a valid id", field="request_id")
            raise RequestNotFound(f"run {run_id} has no execution request {request_id!r}", run_id=run_id,
                                  request_id=request_id)
        return run, RequestLog(self.store, request_id)

    def of_run(self, run_id: str) -> list[ExecutionRequestView]:
        """The run's execution requests, oldest first."""
        run = RunLog(self.store, run_id)
        return [self.view(RequestLog(self.store, request_id)) for request_id in run.record.requests]

    def get(self, run_id: str, request_id: str) -> ExecutionRequestView:
        """One request of the run."""
        return self.view(self._request(run_id, request_id)[1])

    # --- admission -----------------------------------------------------------------------------

    def _admit(self, run: RunLog, kind: str, actor: str, source: JSONObject, target: JSONObject,
               attempt: int, extra: JSONObject | None = None) -> str:
        request_id = new_id()
        task_id = new_id() if kind in REMOTE_REQUEST_KINDS else None
        meta = RequestLog.meta(actor, run.run_id, request_id)
        admitted: JSONObject = {"request_id": request_id, "run_id": run.run_id, "project": run.record.project,
                                "kind": kind, "attempt": attempt, "actor": actor, "source": source,
                                "target": target, **(extra or {})}
        # The request's own stream first: if the process stops before the journal names it, the orphan
        # stream is never executed or listed (everything starts from the run's journal).
        record(self.store, request_stream(request_id), [NewEvent("request.admitted", admitted, meta)], 0)
        run.append([NewEvent("run.request_admitted", {
            "request_id": request_id, "kind": kind, "attempt": attempt, "actor": actor, "task_id": task_id,
            "target": target}, meta)])
        self.store.enqueue(request_work_key(request_id), run.record.project)
        return request_id

    def _history(self, run: RunLog, kind: str) -> list[tuple[str, str]]:
        return [(request_id, RequestLog(self.store, request_id).status()[0])
                for request_id, data in run.record.requests.items() if data.get("kind") == kind]

    def _admission_guard(self, run: RunLog, kind: str) -> tuple[list[tuple[str, str]], JSONObject]:
        """The rules every remote request shares; the kind's history and the admitted source."""
        record, run_id = run.record, run.run_id
        finished = record.finished or {}
        if finished.get("outcome") != "succeeded" or record.problems:
            raise RequestStateError(f"run {run_id} has not succeeded ({finished.get('outcome') or 'unfinished'}); "
                                    f"only a succeeded run's verified source is used for a {kind}", run_id=run_id)
        authority = self._authority(run)
        if not authority["ok"]:
            raise RequestStateError(f"run {run_id} cannot be used for a {kind}: {authority['reason']}",
                                    run_id=run_id)
        history = self._history(run, kind)
        open_ = [rid for rid, status in history if status in ("pending", "needs_reconciliation", "corrupt")]
        if open_:
            raise RequestStateError(f"{kind} request {open_[0]} of run {run_id} is still unresolved; reconcile it "
                                    "before admitting another attempt", run_id=run_id, request_id=open_[0])
        done = [rid for rid, status in history if status == "succeeded"]
        if done:
            raise RequestStateError(f"run {run_id} already had a successful {kind} (request {done[0]}); it was "
                                    f"already {'published' if kind == 'publication' else 'done'}", run_id=run_id,
                                    request_id=done[0])
        if len(history) >= MAX_PUBLICATION_ATTEMPTS:
            raise RequestStateError(f"run {run_id} already had {len(history)} {kind} attempts (the limit is "
                                    f"{MAX_PUBLICATION_ATTEMPTS}); retry the run instead", run_id=run_id)
        evidence = finished.get("evidence") or {}
        verified = evidence.get("source") or {}
        source = {"origin": record.source.get("origin"), "commit": record.source.get("commit"),
                  "tree": verified.get("tree"), "verify_effect_id": evidence.get("verify_effect_id")}
        return history, source

    def admit_remote(self, run_id: str, kind: str, *, provider: str, parameters: JSONObject | None = None,
                     actor: str | None = None) -> str:
        """Admit a ``deploy``, ``rollback`` or ``knowledge_write`` of a succeeded run; the request id.

        The same rules as a publication: the project's current authority, no
        unresolved or successful earlier request of that kind, at most
        :data:`MAX_PUBLICATION_ATTEMPTS`. ``parameters`` (a JSON object, e.g.
        the environment or the version to roll back to) reach the provider.
        """
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        if kind not in REMOTE_TASK_KINDS:
            raise InvalidInput(f"kind {kind!r} must be one of {list(REMOTE_TASK_KINDS)}", field="kind")
        chosen = self.remotes.get(provider) if isinstance(provider, str) else None
        if chosen is None:
            raise UnknownProvider(f"no remote provider named {provider!r} is configured; configured: "
                                  f"{sorted(self.remotes)}", field="provider", provider=provider)
        if parameters is not None and not isinstance(parameters, dict):
            raise InvalidInput("parameters must be a JSON object", field="parameters")
        canonical_text(parameters or {}, path="parameters")
        run = RunLog(self.store, run_id)
        run.open_to_act()
        for _ in range(5):
            history, source = self._admission_guard(run, kind)
            target = {"provider": provider, "provider_kind": chosen.kind, "settings": chosen.settings(),
                      "parameters": parameters or {}}
            try:
                return self._admit(run, kind, actor, source, target, len(history) + 1,
                                   {"retry_of": history[-1][0] if history else None})
            except ConcurrencyError:
                run.sync()
        raise RequestStateError(f"run {run_id}'s journal kept moving while admitting a {kind}; try again",
                                run_id=run_id)

    def admit_publication(self, run_id: str, *, publisher: str, branch: str | None = None,
                          base_branch: str | None = None, title: str | None = None, body: str | None = None,
                          actor: str | None = None) -> str:
        """Admit publishing a succeeded run's verified source; the request id (a worker executes it).

        :class:`~jixu.errors.RequestStateError` when the run did not succeed,
        the project's authority changed, an earlier publication is unresolved
        or succeeded, or :data:`MAX_PUBLICATION_ATTEMPTS` were admitted.
        """
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        check_text(title, "title", 500)
        check_text(body, "body", 20_000)
        if publisher not in self.publishers:
            raise UnknownProvider(f"no publisher named {publisher!r} is configured; configured: "
                                  f"{sorted(self.publishers)}", field="publisher", publisher=publisher)
        run = RunLog(self.store, run_id)
        run.open_to_act()
        branch = check_branch(branch or f"jixu/{run_id}")
        for _ in range(5):
            record = run.record
            history, source = self._admission_guard(run, "publication")
            chosen = self.publishers[publisher]
            target = {"publisher": publisher, "publisher_kind": chosen.kind, "settings": chosen.settings(),
                      "branch": branch, "base_branch": base_branch or str(self._default_branch(run)),
                      "title": title or f"jixu run {run_id}: {record.brief[:200]}",
                      "body": body or f"Published by jixu from run {run_id}.\n\nBrief:\n{record.brief[:5000]}"}
            try:
                return self._admit(run, "publication", actor, source, target, len(history) + 1,
                                   {"retry_of": history[-1][0] if history else None})
            except ConcurrencyError:
                run.sync()  # another admission raced this one: look at the history again
        raise RequestStateError(f"run {run_id}'s journal kept moving while admitting a publication; try again",
                                run_id=run_id)

    def admit_cancellation(self, run_id: str, *, reason: str | None = None, actor: str | None = None) -> str:
        """Admit cancelling an unfinished run; the request id."""
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        check_text(reason, "reason", 10_000)
        run = RunLog(self.store, run_id)
        run.open_to_act()
        for _ in range(5):
            finished = run.record.finished
            if finished is not None:
                raise RunStateError(f"run {run_id} is already {finished.get('outcome')} "
                                    f"({finished.get('reason')})", run_id=run_id, status=finished.get("outcome"))
            for request_id, data in run.record.requests.items():
                if data.get("kind") == "cancellation" and RequestLog(self.store, request_id).status()[0] in (
                        "pending", "needs_reconciliation"):
                    raise RequestStateError(f"cancellation request {request_id} of run {run_id} is still open",
                                            run_id=run_id, request_id=request_id)
            try:
                return self._admit(run, "cancellation", actor, {"origin": run.record.source.get("origin"),
                                                                "commit": run.record.source.get("commit")},
                                   {"reason": reason or f"cancelled by {actor}"}, 1)
            except ConcurrencyError:
                run.sync()
        raise RequestStateError(f"run {run_id}'s journal kept moving while admitting a cancellation; try again",
                                run_id=run_id)

    def _default_branch(self, run: RunLog) -> str:
        try:
            return get_project(self.store, run.record.project).default_branch
        except ProjectNotFound:
            return "main"

    def _authority(self, run: RunLog) -> JSONObject:
        """Does the project still authorize the run's origin? (Read from the project's stream now.)"""
        try:
            found = get_project(self.store, run.record.project)
        except ProjectNotFound:
            return {"ok": False, "reason": f"project {run.record.project!r} no longer exists"}
        origin = run.record.source.get("origin")
        if found.origin != origin:
            return {"ok": False, "reason": f"project {found.name!r} now authorizes origin {found.origin!r}, not the "
                                           f"run's {origin!r}", "origin": found.origin}
        return {"ok": True, "origin": origin, "project": found.name}

    # --- execution -----------------------------------------------------------------------------

    async def execute(self, request_id: str, *, drain_timeout: float | None = None) -> ExecutionRequestView:
        """Carry a pending request out: intent, dispatch marker, effect, receipt. Anything else: its view.

        A cancellation whose effect is recorded (the run finished by it) but
        whose drain receipt is missing is *observed* again, never redone: it
        waits up to ``drain_timeout`` (default: the service's) for the run's
        executor to stop and then records the receipt.
        """
        log = RequestLog(self.store, request_id)
        run = RunLog(self.store, log.record.run_id)
        if log.corruption() is not None or run.corruption() is not None:
            return self.view(log)  # nothing acts on a history that does not hold
        if request_id not in run.record.requests:
            raise RequestNotFound(f"request {request_id} is not named by run {log.record.run_id}'s journal; it was "
                                  "never admitted completely and is not executed", request_id=request_id)
        timeout = self.drain_timeout if drain_timeout is None else float(drain_timeout)
        status = log.status()[0]
        try:
            if status == "pending" and log.record.kind in REMOTE_REQUEST_KINDS:
                await self._remote(run, log)
            elif status == "pending":
                await self._cancel(run, log, timeout)
            elif log.record.kind == "cancellation" and status == "needs_reconciliation" \
                    and self._finished_by(run, request_id):
                await self._finish_drain(run, log, timeout)
        except ConcurrencyError:
            pass  # another worker moved the request first: it owns the dispatch, we stop
        log.sync()
        return self.view(log)

    def view(self, log: RequestLog) -> ExecutionRequestView:
        """The request's view; a cancellation waiting for a live executor to drain is ``in_progress``."""
        view = log.view()
        if view.kind == "cancellation" and view.status == "needs_reconciliation" and view.decision \
                and view.decision.get("reason") == "dispatched_without_receipt" and self._executor_live(view.run_id):
            return replace(view, status="in_progress",
                           reason="the run is finished; waiting for the process executing it to stop")
        return view

    def _run_lease(self, run_id: str) -> tuple[Lease | None, float, bool]:
        """The run's lease, the store's clock, and whether a process holds the lease now (by that clock)."""
        lease = self.store.get_lease(run_lease_key(run_id))
        now = self.store.now()
        return lease, now, lease is not None and not lease.released and lease.expires_at > now

    def _ownership(self, run: RunLog) -> str:
        """Who holds the run's lease, in :data:`~jixu.runs.projection.OWNERSHIP` terms (as seen from outside)."""
        lease, _now, live = self._run_lease(run.run_id)
        if lease is None:
            return "stale" if run.record.claims else "none"
        if lease.released:
            return "released"
        return "live" if live else "stale"

    def _executor_live(self, run_id: str) -> bool:
        return self._run_lease(run_id)[2]

    def _context(self, run: RunLog, log: RequestLog, args: JSONObject) -> PublicationContext | RemoteContext:
        admitted = log.record.admitted or {}
        target = admitted.get("target") or {}
        if log.record.kind != "publication":
            return RemoteContext(
                run_id=run.run_id, request_id=log.request_id, kind=log.record.kind,
                workspace=Path(run.record.workspace), source_commit=str(args["source_commit"]),
                tree=str(args["tree"]), parameters=dict(args.get("parameters") or {}),
                idempotency_key=str((log.record.intent or {}).get("idempotency_key") or f"jixu:{log.request_id}"))
        return PublicationContext(
            run_id=run.run_id, request_id=log.request_id, workspace=Path(run.record.workspace),
            origin=str(args["origin"]), branch=str(args["branch"]), base_branch=str(args["base_branch"]),
            commit=str(args["commit"]), tree=str(args["tree"]), title=str(target.get("title", "")),
            body=str(target.get("body", "")))

    def _provider(self, log: RequestLog) -> Publisher | RemoteProvider:
        target = (log.record.admitted or {}).get("target") or {}
        provider: Publisher | RemoteProvider | None
        if log.record.kind == "publication":
            name, what = target.get("publisher"), "publisher"
            provider = self.publishers.get(str(name))
        else:
            name, what = target.get("provider"), "remote provider"
            provider = self.remotes.get(str(name))
        if provider is None:
            raise UnknownProvider(f"request {log.request_id} uses {what} {name!r}, which is not configured here",
                                  provider=name)
        return provider

    async def _preflight(self, provider: Publisher | RemoteProvider,
                         context: PublicationContext | RemoteContext) -> None:
        # A publication's context always goes to a publisher and a remote one to a remote provider (_provider).
        await provider.preflight(context)  # type: ignore[arg-type]

    async def _perform(self, provider: Publisher | RemoteProvider,
                       context: PublicationContext | RemoteContext) -> JSONObject:
        if isinstance(context, PublicationContext):
            return await provider.publish(context)  # type: ignore[union-attr]
        return await provider.perform(context)  # type: ignore[union-attr]

    def _journal_intent(self, run: RunLog, request_id: str) -> JSONObject | None:
        task_id = run.record.requests[request_id].get("task_id")
        effects = run.record.task_effects.get(str(task_id), [])
        return run.record.effects.get(effects[0]) if effects else None

    async def _intent_args(self, run: RunLog, log: RequestLog, provider_name: str) -> tuple[JSONObject, str | None]:
        """The intent's args for a new remote request, and a rejection reason if it cannot even be formed."""
        admitted = log.record.admitted or {}
        source, target = admitted.get("source") or {}, admitted.get("target") or {}
        if log.record.kind != "publication":
            return {"run_id": run.run_id, "request_id": log.request_id, "kind": log.record.kind,
                    "source_commit": source.get("commit"), "tree": source.get("tree"),
                    "parameters": target.get("parameters") or {}, "provider": provider_name}, None
        reject: str | None = None
        try:
            commit = await asyncio.to_thread(
                commit_tree, Path(run.record.workspace), str(source["tree"]), str(source["commit"]),
                str(target.get("title") or f"jixu run {run.run_id}"), _git_time(log.record.admitted_at))
        except (GitError, OSError, KeyError, TypeError) as error:
            commit, reject = "", f"the verified tree cannot be committed: {error}"
        return {"run_id": run.run_id, "request_id": log.request_id, "origin": source.get("origin"),
                "branch": target.get("branch"), "base_branch": target.get("base_branch"), "commit": commit,
                "tree": source.get("tree"), "publisher": provider_name}, reject

    async def _remote(self, run: RunLog, log: RequestLog) -> None:
        """A remote request: intents (run journal, then request), preflight, dispatch markers, effect, receipts."""
        provider = self._provider(log)
        kind = log.record.kind
        task_kind = REQUEST_TASK_KINDS[kind]
        meta = RequestLog.meta(self.owner, run.run_id, log.request_id)
        reject: str | None = None
        if log.record.intent is None:
            args, reject = await self._intent_args(run, log, provider.name)
            journal = self._journal_intent(run, log.request_id)
            if journal is None:
                task_id = str(run.record.requests[log.request_id]["task_id"])
                journal_effect = new_id()
                run.append([NewEvent("task.requested", {
                    **_intent(task_kind, {**args, "task_id": task_id}, journal_effect),
                    "task_id": task_id, "attempt": 1}, meta)])
                journal = run.record.effects[journal_effect]
            log.append([NewEvent(f"{kind}.requested", _intent(
                provider.name, {**args, "journal_effect_id": journal["effect_id"]}, new_id()), meta)])
        intent = log.record.intent or {}
        args = dict(intent.get("args") or {})
        journal_effect_id = str(args.get("journal_effect_id"))
        context = self._context(run, log, args)
        if reject is None:
            try:
                await self._preflight(provider, context)
            except RemoteRejected as error:
                reject = error.message
        if reject is not None:
            rejected = Outcome.failed({"type": "rejected", "message": reject}, indeterminate=False)
            log.append([rejected.receipt(kind, intent["effect_id"], None, meta)])
            run.append([rejected.receipt("task", journal_effect_id, None, meta)])
            return
        journal = run.record.effects[journal_effect_id]

        async def dispatch() -> None:
            # The dispatch marker of the request decides who performs it: appended after the head we read, it
            # fails with ConcurrencyError for every other worker. Then the run's own marker.
            log.append([marker(kind, intent["effect_id"], 1, intent, meta)])
            run.append([marker("task", journal_effect_id, 1, {**journal, "name": task_kind}, meta,
                               task_id=journal["task_id"])])

        async def call() -> Outcome:
            evidence = await self._perform(provider, context)
            return Outcome.completed({"result": {**evidence, "observed_at": time.time()}})

        def classify(error: Exception) -> Outcome:
            # After dispatch nothing the provider says proves absence: the outcome stays unknown.
            return Outcome.failed({"type": f"{task_kind}_failed", "exception": type(error).__name__,
                                   "message": (error.message if isinstance(error, JixuError) else str(error))[:2000]},
                                  indeterminate=True)

        async def receipts(outcome: Outcome) -> None:
            run.append([outcome.receipt("task", journal_effect_id, 1, meta)])  # the journal first, then the request
            log.append([outcome.receipt(kind, intent["effect_id"], 1, meta)])

        await perform(dispatch=dispatch, call=call, classify=classify, record=receipts)

    async def _cancel(self, run: RunLog, log: RequestLog, timeout: float) -> None:
        meta = RequestLog.meta(self.owner, run.run_id, log.request_id)
        admitted = log.record.admitted or {}
        if log.record.intent is None:
            log.append([NewEvent("cancellation.requested", _intent(
                "cancel_run", {"run_id": run.run_id, "request_id": log.request_id}, new_id()), meta)])
        intent = log.record.intent or {}
        if run.record.finished is not None and not self._finished_by(run, log.request_id):
            log.append([Outcome.failed({"type": "rejected", "message": "the run already finished as "
                                        f"{run.record.finished.get('outcome')}"}, indeterminate=False).receipt(
                "cancellation", intent["effect_id"], None, meta)])
            return
        log.append([marker("cancellation", intent["effect_id"], 1, intent, meta)])
        reason = str((admitted.get("target") or {}).get("reason") or "cancelled")
        actor = str(admitted.get("actor") or self.actor)
        for _ in range(20):
            if run.record.finished is not None:
                break
            before, why = derive_status(run.record, run.analysis(), self._ownership(run))
            try:
                run.append([NewEvent("run.finished", {
                    "outcome": "cancelled", "reason": reason, "actor": actor, "request_id": log.request_id,
                    "evidence": {"request_id": log.request_id, "status_before": before, "reason_before": why}},
                    RequestLog.meta(actor, run.run_id, log.request_id))])
            except ConcurrencyError:
                run.sync()
        await self._finish_drain(run, log, timeout)

    async def _finish_drain(self, run: RunLog, log: RequestLog, timeout: float) -> None:
        drained = await self._await_drain(run, log.request_id, timeout)
        if drained is not None:
            self.complete_cancellation(run, log)

    def complete_cancellation(self, run: RunLog, log: RequestLog | None = None) -> None:
        """Record the cancellation request's receipt once the run's journal holds its drain receipt."""
        request_id = (run.record.finished or {}).get("request_id")
        drained = None if not request_id else self._drained(run, str(request_id))
        if drained is None:
            return
        log = log or RequestLog(self.store, str(request_id))
        log.sync()
        intent = log.record.intent
        if intent is None or log.record.receipt is not None:
            return
        finished = run.record.finished or {}
        with contextlib.suppress(ConcurrencyError, ReceiptConflict):  # someone recorded its receipt meanwhile
            log.append([Outcome.completed({"result": {
                "drained": True, "drained_seq": drained["seq"], "drained_by": drained.get("by"),
                "run_outcome": finished.get("outcome"), "finished_by_request": finished.get("request_id")}}).receipt(
                "cancellation", intent["effect_id"], 1, RequestLog.meta(self.owner, run.run_id, log.request_id))])

    @staticmethod
    def _finished_by(run: RunLog, request_id: str) -> bool:
        return (run.record.finished or {}).get("request_id") == request_id

    @staticmethod
    def _drained(run: RunLog, request_id: str) -> JSONObject | None:
        return next((d for d in run.record.drained if d.get("request_id") == request_id), None)

    async def _await_drain(self, run: RunLog, request_id: str, timeout: float) -> JSONObject | None:
        """Wait until the run's executor recorded ``run.drained``, or no process holds its lease; the receipt."""
        deadline = time.monotonic() + timeout
        while True:
            run.sync()
            drained = self._drained(run, request_id)
            if drained is not None:
                return drained
            lease, now, live = self._run_lease(run.run_id)
            if not live:
                lease_info = None if lease is None else {"owner": lease.owner, "epoch": lease.epoch,
                                                         "released": lease.released, "expires_at": lease.expires_at,
                                                         "store_now": now}
                try:
                    run.append([NewEvent("run.drained", {"request_id": request_id, "by": self.owner,
                                                         "how": "no process holds the run's lease",
                                                         "lease": lease_info},
                                         RequestLog.meta(self.owner, run.run_id, request_id))])
                except ConcurrencyError:
                    continue  # the executor wrote meanwhile (perhaps its own drained receipt): look again
                return self._drained(run, request_id)
            if time.monotonic() >= deadline:
                return None
            await asyncio.sleep(self.poll_interval)

    # --- operator operations -------------------------------------------------------------------

    async def inspect_remote(self, run_id: str, request_id: str, *, actor: str | None = None) -> JSONObject:
        """Ask the provider, read-only, what it shows for the recorded remote effect; retain the finding."""
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        run, log = self._acting(run_id, request_id)
        if log.record.kind not in REMOTE_REQUEST_KINDS or log.record.intent is None:
            raise RequestStateError(f"request {request_id} has no remote intent to inspect", request_id=request_id)
        provider = self._provider(log)
        args = dict(log.record.intent.get("args") or {})
        context = self._context(run, log, args)
        found = await provider.inspect(context)  # type: ignore[arg-type]
        keys = ("branch", "commit", "tree") if log.record.kind == "publication" else ("kind", "source_commit",
                                                                                      "tree", "parameters")
        recorded = {"actor": actor, "provider": provider.name, "found": found,
                    "expected": {k: args.get(k) for k in keys}}
        log.append([NewEvent("request.inspected", recorded, RequestLog.meta(actor, run_id, request_id))])
        return {**recorded, "event_id": log.record.inspections[-1]["event_id"]}

    def resolve_outcome(self, run_id: str, request_id: str, resolution: str, *, resolution_id: str | None = None,
                        note: str | None = None, actor: str | None = None) -> ExecutionRequestView:
        """Record an operator's resolution of an unknown request, citing the latest retained inspection.

        A publication's outcome can only be resolved after
        :meth:`inspect_remote` retained what the provider shows (after the
        dispatch); the resolution cites that inspection as its evidence.
        """
        actor = actor or self.actor
        run, log = self._acting(run_id, request_id)
        inspection = log.record.inspections[-1] if log.record.inspections else None
        dispatched = next((e.seq for e in log.record.lifecycle if e.type.endswith(".dispatched")), None)
        if log.record.kind in REMOTE_REQUEST_KINDS and (inspection is None or dispatched is None
                                                        or int(inspection["seq"]) < dispatched):
            raise RequestStateError(f"request {request_id}: inspect the provider first (jixu runs inspect-remote); "
                                    "its finding is retained before any resolution", request_id=request_id)
        evidence = None if inspection is None else {"inspection_event_id": inspection["event_id"],
                                                    "found": inspection.get("found")}
        body = resolution_body(log.record.effect_id or "", resolution, new_id() if resolution_id is None else resolution_id, actor=actor,
                               note=note, evidence=evidence)
        decision = admit_resolution(log.analysis(), body, where=f"request {request_id}")
        if decision is not None:
            log.append([NewEvent(f"{decision.kind}.outcome_resolved", body,
                                 RequestLog.meta(actor, run.run_id, request_id))])
        return self.view(log)

    def reconcile(self, run_id: str, request_id: str, reconciliation_id: str, *,
                  actor: str | None = None) -> JSONObject:
        """Establish a request's outcome from retained evidence only; the retained result.

        Raises :class:`~jixu.errors.ReconciliationNeedsProof` (the finding is
        retained first) when there is no proof, and
        :class:`~jixu.errors.AlreadyReconciled` when another reconciliation id
        settled the request already.
        """
        actor = actor or self.actor
        check_text(actor, "actor", 200, required=True)
        if not isinstance(reconciliation_id, str) or not RECONCILIATION_ID.match(reconciliation_id):
            raise InvalidInput("reconciliation_id must be 32 lowercase hexadecimal characters",
                               field="reconciliation_id")
        run, log = self._acting(run_id, request_id)
        for _ in range(5):
            retained = next((r for r in log.record.reconciliations
                             if r.get("reconciliation_id") == reconciliation_id), None)
            if retained is not None:
                return self._answer(retained)
            settled = log.record.settling_reconciliation
            if settled is not None:
                raise AlreadyReconciled(f"request {request_id} was already reconciled by "
                                        f"{settled.get('reconciliation_id')}; a different reconciliation id is "
                                        "refused", request_id=request_id,
                                        reconciliation_id=settled.get("reconciliation_id"))
            status, _reason = log.status()
            if status == "pending":
                raise RequestStateError(f"request {request_id} was not dispatched yet: there is nothing to reconcile",
                                        request_id=request_id)
            finding, resolution = self._establish(run, log, status)
            result: JSONObject = {"reconciliation_id": reconciliation_id, "request_id": request_id,
                                  "run_id": run_id, "actor": actor, "status_before": status, **finding}
            meta = RequestLog.meta(actor, run_id, request_id)
            events = [NewEvent("request.reconciled", result, meta)]
            decision = log.decision() if resolution is not None else None
            if resolution is not None and decision is not None:
                body = resolution_body(log.record.effect_id or "", resolution, reconciliation_id, actor=actor,
                                       note=f"established by reconciliation {reconciliation_id}",
                                       evidence={"proof": finding["proof"]})
                events.insert(0, NewEvent(f"{decision.kind}.outcome_resolved", body, meta))
            try:
                log.append(events)
            except ConcurrencyError:
                log.sync()
                run.sync()
                continue
            return self._answer(log.record.reconciliations[-1])
        raise RequestStateError(f"request {request_id} kept changing while reconciling it; try again",
                                request_id=request_id)

    @staticmethod
    def _answer(retained: JSONObject) -> JSONObject:
        result = {k: v for k, v in retained.items() if k not in ("seq",)}
        if not retained.get("settled"):
            raise ReconciliationNeedsProof(
                f"request {retained.get('request_id')}: no proof of its outcome ({retained.get('reason')}); it stays "
                "unknown and nothing was called or repeated", result=result)
        return result

    def _establish(self, run: RunLog, log: RequestLog, status: str) -> tuple[JSONObject, str | None]:
        """What retained, immutable evidence proves (pure reading): the finding and the resolution it implies."""
        record = log.record
        receipt = record.receipt or {}
        proof: list[JSONObject] = []
        checked: JSONObject = {}
        if status in SETTLED:
            # Settled already by a terminal receipt or an operator resolution: reconciliation retains that.
            cited = receipt.get("event_id") or next(
                (e.id for e in reversed(record.lifecycle) if e.type.endswith(".outcome_resolved")), None)
            return {"settled": True, "outcome": status, "reason": f"already {status} by its own events",
                    "proof": [{"stream": log.stream, "event_id": cited}], "checked": checked}, None
        if status == "corrupt":
            return {"settled": False, "outcome": "unknown", "reason": "the request's events contradict each other",
                    "proof": [], "checked": checked}, None
        authority = self._authority(run)
        checked["project_authority"] = authority
        if not authority["ok"]:
            return {"settled": False, "outcome": "unknown", "reason": f"project authority: {authority['reason']}",
                    "proof": [], "checked": checked}, None
        if record.kind == "cancellation":
            drained = self._drained(run, log.request_id)
            finished_by = self._finished_by(run, log.request_id)
            checked.update({"run_finished_by_request": finished_by, "drained_receipt": drained is not None})
            if drained is not None and finished_by:
                proof.append({"stream": run.stream, "seq": drained["seq"], "type": "run.drained"})
                return {"settled": True, "outcome": "succeeded", "reason": "the run's journal holds the request's "
                        "run.finished and a run.drained receipt", "proof": proof, "checked": checked}, "occurred"
            return {"settled": False, "outcome": "unknown", "reason": "no terminal receipt proves the run's work "
                    "drained", "proof": [], "checked": checked}, None
        if record.kind == "publication":
            return self._establish_publication(run, log, checked)
        return self._establish_remote(run, log, checked)

    @staticmethod
    def _unknown(reason: str, checked: JSONObject) -> tuple[JSONObject, str | None]:
        return {"settled": False, "outcome": "unknown", "reason": reason, "proof": [], "checked": checked}, None

    def _journal_record(self, run: RunLog, log: RequestLog, checked: JSONObject
                        ) -> tuple[JSONObject, JSONObject, JSONObject, JSONObject] | str:
        """The run journal's intent, receipt, intent args and request args for a remote request, or why not."""
        record = log.record
        admitted = record.admitted or {}
        args = dict((record.intent or {}).get("args") or {})
        source = admitted.get("source") or {}
        evidence = (run.record.finished or {}).get("evidence") or {}
        current_tree = (evidence.get("source") or {}).get("tree")
        checked["admitted_tree"], checked["current_tree"], checked["intent_tree"] = (
            source.get("tree"), current_tree, args.get("tree"))
        if not (source.get("tree") and source.get("tree") == current_tree == args.get("tree")):
            return "the admitted source does not match the run's verified source and the intent"
        journal_id = str(args.get("journal_effect_id"))
        journal_intent = run.record.effects.get(journal_id)
        journal_receipt = run.record.receipts.get(journal_id)
        checked["journal_intent"], checked["journal_receipt"] = journal_intent is not None, journal_receipt is not None
        if journal_intent is None or journal_receipt is None or journal_receipt.get("phase") != "completed":
            return (f"no terminal receipt: neither the request nor the run's journal recorded the {record.kind}'s "
                    "observed result")
        journal_args = next((e.data.get("args") for e in run.record.lifecycle
                             if e.type == "task.requested" and e.data.get("effect_id") == journal_id), None) or {}
        return journal_intent, journal_receipt, dict(journal_args), args

    def _settled(self, run: RunLog, log: RequestLog, checked: JSONObject, matches: dict[str, bool],
                 journal_intent: JSONObject, journal_receipt: JSONObject,
                 keys: tuple[str, ...]) -> tuple[JSONObject, str | None]:
        checked["matches"] = matches
        if not all(matches.values()):
            failed = [k for k, ok in matches.items() if not ok]
            return self._unknown(f"the run's {log.record.kind} receipt does not match the intent: {failed}", checked)
        result = journal_receipt.get("result") or {}
        proof = [{"stream": run.stream, "seq": journal_intent["seq"], "type": "task.requested"},
                 {"stream": run.stream, "seq": journal_receipt["seq"], "type": "task.completed"}]
        return {"settled": True, "outcome": "succeeded", "reason": f"the run's journal holds the matching "
                f"{log.record.kind} intent and terminal receipt", "proof": proof, "checked": checked,
                "evidence": {k: result.get(k) for k in keys if k in result}}, "occurred"

    def _establish_publication(self, run: RunLog, log: RequestLog,
                               checked: JSONObject) -> tuple[JSONObject, str | None]:
        found = self._journal_record(run, log, checked)
        if isinstance(found, str):
            return self._unknown(found, checked)
        journal_intent, journal_receipt, journal_args, args = found
        result = journal_receipt.get("result") or {}
        wants_pr = (((log.record.admitted or {}).get("target") or {}).get("publisher_kind")) == "pull_request"
        matches = {
            "intent_branch": journal_args.get("branch") == args.get("branch"),
            "intent_commit": journal_args.get("commit") == args.get("commit"),
            "intent_tree": journal_args.get("tree") == args.get("tree"),
            "receipt_branch": result.get("branch") == args.get("branch"),
            "receipt_commit": result.get("pushed_commit") == args.get("commit"),
            "receipt_tree": result.get("tree") == args.get("tree"),
            "receipt_pull_request": (not wants_pr) or (isinstance(result.get("pr_number"), int)
                                                       and isinstance(result.get("pr_url"), str)),
        }
        return self._settled(run, log, checked, matches, journal_intent, journal_receipt,
                             ("branch", "pushed_commit", "tree", "pr_number", "pr_url"))

    def _establish_remote(self, run: RunLog, log: RequestLog, checked: JSONObject) -> tuple[JSONObject, str | None]:
        """A deploy / rollback / knowledge write: the provider-reported job id or version is the evidence."""
        found = self._journal_record(run, log, checked)
        if isinstance(found, str):
            return self._unknown(found, checked)
        journal_intent, journal_receipt, journal_args, args = found
        result = journal_receipt.get("result") or {}
        matches = {f"intent_{key}": journal_args.get(key) == args.get(key)
                   for key in ("kind", "source_commit", "tree", "parameters", "provider")}
        matches["receipt_kind"] = result.get("kind") == log.record.kind
        matches["receipt_job_or_version"] = any(isinstance(result.get(k), str) and bool(result.get(k))
                                                for k in ("job_id", "version"))
        return self._settled(run, log, checked, matches, journal_intent, journal_receipt,
                             ("kind", "job_id", "version"))


__all__ = [
    "MAX_PUBLICATION_ATTEMPTS",
    "REMOTE_REQUEST_KINDS",
    "RECONCILIATION_ID",
    "REQUEST_KINDS",
    "REQUEST_PREFIX",
    "REQUEST_STATUSES",
    "ExecutionRequestView",
    "ExecutionRequests",
    "RequestLog",
    "RequestProjection",
    "RequestRecord",
    "request_id_of",
    "request_status",
    "request_stream",
    "request_work_key",
]
