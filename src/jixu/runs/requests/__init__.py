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
  saw that no process holds the run's lease any more. Its effect is a write to
  the run's own journal, so a cancellation dispatched whose dispatcher stopped
  before ``run.finished`` is never in doubt for long: the journal shows the run
  never finished, and the request's worker or a reconciliation completes it (a
  run finishes once, so it never happens twice); a run that finished without it
  settles it as ``failed``. Until then ``execute``, ``resume`` and ``handoff``
  of the run refuse, and no operator resolution of it is accepted.

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

from jixu.runs.requests.log import RequestLog
from jixu.runs.requests.service import ExecutionRequests
from jixu.runs.requests.status import (
    DEFAULT_DRAIN_TIMEOUT,
    MAX_PUBLICATION_ATTEMPTS,
    RECONCILIATION_ID,
    REMOTE_REQUEST_KINDS,
    REQUEST_KINDS,
    REQUEST_PREFIX,
    REQUEST_STATUSES,
    SETTLED,
    ExecutionRequestView,
    RequestProjection,
    RequestRecord,
    request_id_of,
    request_status,
    request_stream,
    request_work_key,
)

__all__ = [
    "DEFAULT_DRAIN_TIMEOUT",
    "MAX_PUBLICATION_ATTEMPTS",
    "RECONCILIATION_ID",
    "REMOTE_REQUEST_KINDS",
    "REQUEST_KINDS",
    "REQUEST_PREFIX",
    "REQUEST_STATUSES",
    "SETTLED",
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
