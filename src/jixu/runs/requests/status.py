"""Execution requests' vocabulary and pure status: stream names, the request projection, its status, its view.

Nothing here does I/O. A request's status is derived from the RecoveryResolver's
decision about its one effect (:func:`request_status`), never stored.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final

from jixu.ledger import Event
from jixu.ledger.encoding import JSONObject
from jixu.recovery import Analysis
from jixu.runs.remote import REMOTE_TASK_KINDS

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


def request_lease_key(request_id: str) -> str:
    """The lease held by the process carrying an execution request out (from its dispatch to its receipt)."""
    return f"{REQUEST_PREFIX}{request_id}/execution"


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


def _earlier(record: RequestRecord) -> str:
    """A succeeded attempt says nothing about earlier ones left unknown: its reason names them."""
    unknown = (record.admitted or {}).get("earlier_unknown") or []
    return f"; earlier attempt(s) {', '.join(map(str, unknown))} stay unknown (abandoned)" if unknown else ""


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
            return "succeeded", "terminal receipt recorded by the worker" + _earlier(record)
        if decision.reason == "rejected_before_dispatch":
            return "failed", f"rejected before dispatch: {error.get('message', '')}"
        return "failed", f"failed: {error.get('message', '')}"
    if decision.state == "unknown":
        resolution = decision.resolution or {}
        outcome = resolution.get("resolution")
        if outcome == "occurred":
            by = str(resolution.get("actor") or "")
            how = ("reconciliation " + str(settled.get("reconciliation_id")) if settled else
                   f"the provider's inspection ({by})" if by.startswith("probe:") else
                   f"an operator ({by}) citing the provider's inspection")
            return "succeeded", f"proved by {how}" + _earlier(record)
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

